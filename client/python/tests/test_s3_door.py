"""The spoke's S3 door (``spoke-cache --s3-listen``) read by the S3 clients trainers
already use, unmodified: boto3 (ranged gets, a paginated listing of more than 1,000 keys,
``head_object``, a presigned URL) and MosaicML Streaming's ``StreamingDataset`` with its
``remote`` at the door (``S3_ENDPOINT_URL``), every sample identical to the same dataset
read locally. Real hub and spoke processes; the datasets written by the reference tools."""

import urllib.request

import pytest

from conftest import binary, start

KEYS = 1050


@pytest.fixture(scope="module")
def s3_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("s3data")
    many = root / "many" / "train"
    many.mkdir(parents=True)
    for i in range(KEYS):
        (many / f"part-{i:05}.bin").write_bytes(f"sample {i}".encode() * 7)
    (root / "many" / "README").write_bytes(b"top")
    from streaming import MDSWriter

    with MDSWriter(out=str(root / "mds" / "train"), columns={"id": "int", "text": "str", "blob": "bytes"},
                   size_limit=1 << 13, compression="zstd") as writer:
        for sample in mds_samples():
            writer.write(sample)
    return root


def mds_samples():
    return [{"id": i, "text": f"sample {i} " * (i % 13), "blob": bytes([i % 251]) * (i % 97)} for i in range(300)]


@pytest.fixture(scope="module")
def s3_door(s3_root, tmp_path_factory):
    hub, addr = start([binary("hub-server"), "--root", str(s3_root), "--listen", "127.0.0.1:0"],
                      "hub-server listening on ")
    cache = tmp_path_factory.mktemp("s3cache")
    spoke, rest = start([binary("spoke-cache"), "--hub", f"http://{addr}", "--cache-dir", str(cache),
                         "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                         "--s3-listen", "127.0.0.1:0"], "spoke-cache listening on ")
    yield "http://" + rest.split(" s3 on ")[1].strip()
    for proc in (spoke, hub):
        proc.kill()
        proc.wait()


@pytest.fixture()
def s3(s3_door):
    import boto3

    # An open spoke: any key signs (boto3 always signs).
    return boto3.client("s3", endpoint_url=s3_door, region_name="us-east-1",
                        aws_access_key_id="anykey", aws_secret_access_key="anysecret")


def test_boto3_lists_pages_and_reads_ranges_through_the_door(s3, s3_root):
    paginator = s3.get_paginator("list_objects_v2")
    keys = [o["Key"] for page in paginator.paginate(Bucket="many") for o in page.get("Contents", [])]
    expected = sorted([f"train/part-{i:05}.bin" for i in range(KEYS)] + ["README"])
    assert keys == expected
    folders = s3.list_objects_v2(Bucket="many", Delimiter="/")
    assert [p["Prefix"] for p in folders["CommonPrefixes"]] == ["train/"]
    assert [o["Key"] for o in folders["Contents"]] == ["README"]

    data = (s3_root / "many" / "train" / "part-00042.bin").read_bytes()
    whole = s3.get_object(Bucket="many", Key="train/part-00042.bin")
    assert whole["Body"].read() == data
    ranged = s3.get_object(Bucket="many", Key="train/part-00042.bin", Range="bytes=3-20")
    assert ranged["Body"].read() == data[3:21]
    assert ranged["ContentRange"] == f"bytes 3-20/{len(data)}"
    head = s3.head_object(Bucket="many", Key="train/part-00042.bin")
    assert head["ContentLength"] == len(data)
    assert head["ETag"] == whole["ETag"]

    url = s3.generate_presigned_url("get_object", Params={"Bucket": "many", "Key": "README"}, ExpiresIn=60)
    with urllib.request.urlopen(url) as answer:
        assert answer.read() == b"top"

    from botocore.exceptions import ClientError

    with pytest.raises(ClientError) as missing:
        s3.get_object(Bucket="many", Key="train/nothing.bin")
    assert missing.value.response["Error"]["Code"] == "NoSuchKey"
    with pytest.raises(ClientError) as past:
        s3.get_object(Bucket="many", Key="README", Range="bytes=100-200")
    assert past.value.response["Error"]["Code"] == "InvalidRange"


def test_mosaicml_streaming_reads_its_remote_through_the_door(s3_door, s3_root, tmp_path, monkeypatch):
    from streaming import StreamingDataset

    monkeypatch.setenv("S3_ENDPOINT_URL", s3_door)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "anykey")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "anysecret")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    # The samples MDSWriter wrote (zstd-compressed shards: Streaming downloads and
    # decompresses them itself).
    written = mds_samples()
    dataset = StreamingDataset(remote="s3://mds/train", local=str(tmp_path / "local"), shuffle=False,
                               batch_size=1)
    assert len(dataset) == len(written)
    for i, want in enumerate(written):
        got = dataset[i]
        assert (got["id"], got["text"], got["blob"]) == (want["id"], want["text"], want["blob"]), i


def test_the_secure_setup_serves_s3_over_tls_to_signed_requests_only(s3_root, tmp_path):
    """The README's secure setup, from the CLI: certificates, a token per reader, an S3
    key per reader; boto3 over TLS (the dev CA), signed with the reader's key."""
    import subprocess

    import boto3
    from botocore.exceptions import ClientError

    cli = binary("shardcache")
    certs, tokens, keys = tmp_path / "certs", tmp_path / "tokens", tmp_path / "s3-keys"
    subprocess.run([cli, "certs", "--out", str(certs)], check=True, capture_output=True)
    for name, datasets in [("trainer", "mds"), ("other", "many")]:
        subprocess.run([cli, "token", "new", "--name", name, "--datasets", datasets, "--file", str(tokens)],
                       check=True, capture_output=True)
    made = subprocess.run([cli, "token", "s3-key", "--name", "trainer", "--file", str(keys)],
                          check=True, capture_output=True, text=True).stdout
    pair = dict(line.split("=", 1) for line in made.split())
    assert (keys.stat().st_mode & 0o777) == 0o600

    hub, addr = start([binary("hub-server"), "--root", str(s3_root), "--listen", "127.0.0.1:0"],
                      "hub-server listening on ")
    spoke, rest = start([binary("spoke-cache"), "--hub", f"http://{addr}", "--cache-dir", str(tmp_path / "cache"),
                         "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0",
                         "--tls-cert", str(certs / "spoke.pem"), "--tls-key", str(certs / "spoke.key"),
                         "--token-file", str(tokens), "--s3-listen", "127.0.0.1:0", "--s3-keys", str(keys)],
                        "spoke-cache listening on ")
    try:
        endpoint = "https://" + rest.split(" s3 on ")[1].strip()

        def client(key, secret):
            return boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", verify=str(certs / "ca.pem"),
                                aws_access_key_id=key, aws_secret_access_key=secret)

        s3 = client(pair["AWS_ACCESS_KEY_ID"], pair["AWS_SECRET_ACCESS_KEY"])
        index = (s3_root / "mds" / "train" / "index.json").read_bytes()
        assert s3.get_object(Bucket="mds", Key="train/index.json")["Body"].read() == index
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["mds"]
        with pytest.raises(ClientError) as other:
            s3.list_objects_v2(Bucket="many")
        assert other.value.response["Error"]["Code"] == "AccessDenied"
        with pytest.raises(ClientError) as forged:
            client(pair["AWS_ACCESS_KEY_ID"], "x" * 40).get_object(Bucket="mds", Key="train/index.json")
        assert forged.value.response["Error"]["Code"] == "SignatureDoesNotMatch"
        from botocore import UNSIGNED
        from botocore.config import Config

        unsigned = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", verify=str(certs / "ca.pem"),
                                config=Config(signature_version=UNSIGNED))
        with pytest.raises(ClientError) as anonymous:
            unsigned.get_object(Bucket="mds", Key="train/index.json")
        assert anonymous.value.response["Error"]["Code"] == "AccessDenied"
    finally:
        for proc in (spoke, hub):
            proc.kill()
            proc.wait()


def s3_clients_venv():
    """The virtual environment of the S3 clients that pin their own botocore (the aws CLI,
    s3fs), installed by ``make test`` apart from the SDK's (scripts/ensure-test-deps.sh)."""
    import os
    import pathlib

    venv = pathlib.Path(os.environ.get("SHARDCACHE_S3_CLIENTS_VENV", pathlib.Path.home() / ".cache/shardcache/s3clients"))
    if not (venv / "bin" / "aws").exists():
        pytest.fail(f"{venv} has no aws CLI: `make test` installs it (scripts/ensure-test-deps.sh)")
    return venv


def client_env(s3_door):
    import os

    return dict(os.environ, AWS_ACCESS_KEY_ID="anykey", AWS_SECRET_ACCESS_KEY="anysecret",
                AWS_DEFAULT_REGION="us-east-1", AWS_ENDPOINT_URL=s3_door)


def test_the_aws_cli_lists_and_copies_through_the_door(s3_door, s3_root, tmp_path):
    import subprocess

    aws = str(s3_clients_venv() / "bin" / "aws")
    env = client_env(s3_door)
    listed = subprocess.run([aws, "s3", "ls", "s3://many/", "--endpoint-url", s3_door], env=env,
                            check=True, capture_output=True, text=True).stdout
    assert "PRE train/" in listed and "README" in listed, listed
    recursive = subprocess.run([aws, "s3", "ls", "--recursive", "s3://many/train/", "--endpoint-url", s3_door],
                               env=env, check=True, capture_output=True, text=True).stdout
    assert len(recursive.splitlines()) == KEYS
    out = tmp_path / "copied.bin"
    subprocess.run([aws, "s3", "cp", "s3://many/train/part-00999.bin", str(out), "--endpoint-url", s3_door],
                   env=env, check=True, capture_output=True)
    assert out.read_bytes() == (s3_root / "many" / "train" / "part-00999.bin").read_bytes()
    folder = tmp_path / "folder"
    subprocess.run([aws, "s3", "cp", "--recursive", "s3://mds/train/", str(folder), "--endpoint-url", s3_door],
                   env=env, check=True, capture_output=True)
    written = sorted(p.relative_to(s3_root / "mds" / "train") for p in (s3_root / "mds" / "train").rglob("*") if p.is_file())
    copied = sorted(p.relative_to(folder) for p in folder.rglob("*") if p.is_file())
    assert copied == written
    for name in written:
        assert (folder / name).read_bytes() == (s3_root / "mds" / "train" / name).read_bytes()


S3FS_SCRIPT = """
import json, sys, s3fs
fs = s3fs.S3FileSystem(endpoint_url=sys.argv[1], key="anykey", secret="anysecret")
out = {"glob": sorted(fs.glob("many/train/part-0000*.bin")), "ls": sorted(fs.ls("many"))}
with fs.open("many/train/part-00042.bin", "rb") as f:
    f.seek(5)
    out["read"] = f.read(20).hex()
    out["size"] = f.size
out["info"] = fs.info("many/README")["size"]
print(json.dumps(out))
"""


def test_s3fs_globs_opens_seeks_and_reads_through_the_door(s3_door, s3_root):
    import json
    import subprocess

    python = str(s3_clients_venv() / "bin" / "python")
    run = subprocess.run([python, "-c", S3FS_SCRIPT, s3_door], env=client_env(s3_door), check=True,
                         capture_output=True, text=True)
    out = json.loads(run.stdout)
    assert out["glob"] == [f"many/train/part-{i:05}.bin" for i in range(10)]
    assert out["ls"] == ["many/README", "many/train"]
    data = (s3_root / "many" / "train" / "part-00042.bin").read_bytes()
    assert bytes.fromhex(out["read"]) == data[5:25]
    assert out["size"] == len(data)
    assert out["info"] == 3
