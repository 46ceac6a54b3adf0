#!/usr/bin/env bash
# versitygw's own S3 test command (`versitygw test`, v1.8.0) against the spoke's S3 door
# (issue 60), on a secured spoke (token file and S3 keys) in front of a hub on loopback.
# Not in `make test`: it installs versitygw (~3 minutes) and records a compatibility
# figure, it does not decide one (BENCHMARKS.md, "versitygw's S3 tests against the door").
#
# Which tests: the SigV4 ones (Authentication_*, PresignedAuth_*) and the read groups
# (GetObject_, HeadObject_, ListObjectsV2_, ListObjects_, HeadBucket_, GetBucketLocation_,
# ListBuckets_). Every versitygw test makes its own bucket and puts its own objects
# through the endpoint under test (tests/integration/utils.go, `setup`), which a read-only
# door answers NotImplemented: such a test is counted "needs writes", apart from the
# tests that ran and failed. Then versitygw's download bench reads a dataset's objects.
#
#   cargo build --release --workspace --bins && scripts/versitygw-tests.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN="${BIN:-target/release}"
source scripts/servers.sh
ensure_versitygw
VGW="$(go env GOPATH)/bin/versitygw"
# versitygw's tests give the AWS SDK an http.Client of their own, to which the SDK
# cannot add a CA bundle: with AWS_CA_BUNDLE set every test exits at its start.
unset AWS_CA_BUNDLE

# The dataset the download bench reads: objects obj0 .. obj7 of 1 MiB.
mkdir -p "$work/data/vgwbench"
for i in $(seq 0 7); do head -c 1048576 /dev/urandom > "$work/data/vgwbench/obj$i"; done
"$BIN/shardcache" token new --name vgw --datasets vgwbench --file "$work/tokens" > /dev/null
keys=$("$BIN/shardcache" token s3-key --name vgw --file "$work/s3-keys" 2>/dev/null)
access=$(sed -n 's/^AWS_ACCESS_KEY_ID=//p' <<< "$keys")
secret=$(sed -n 's/^AWS_SECRET_ACCESS_KEY=//p' <<< "$keys")

hub=$(start "$work/hub.out" "$BIN/hub-server" --root "$work/data" --listen 127.0.0.1:0)
pids+=("$(cat "$work/hub.out.pid")")
start "$work/spoke.out" "$BIN/spoke-cache" --hub "http://$hub" --cache-dir "$work/cache" --listen 127.0.0.1:0 \
  --token-file "$work/tokens" --s3-listen 127.0.0.1:0 --s3-keys "$work/s3-keys" > /dev/null
pids+=("$(cat "$work/spoke.out.pid")")
# The spoke's line: "spoke-cache listening on ADDR ... s3 on DOOR".
door=$(sed -n 's/.* s3 on \([0-9.:]*\).*/\1/p' "$work/spoke.out" | head -1)

tests=$("$VGW" test --help 2>&1 | awk '{print $1}' |
  grep -E '^(Authentication_|PresignedAuth_|GetObject_|HeadObject_|ListObjectsV2_|ListObjects_|HeadBucket_|GetBucketLocation_|ListBuckets_)' | sort -u)
results="$work/results"
: > "$results"
for t in $tests; do
  out=$(timeout 60 "$VGW" test -a "$access" -s "$secret" -e "http://$door" "$t" 2>&1 || true)
  line=$(sed 's/\x1b\[[0-9;]*m//g' <<< "$out" | grep -m1 -E "^(PASS|FAIL|SKIP) " || echo "FAIL $t: no result ($(tail -c 200 <<< "$out" | tr '\n' ' '))")
  echo "$line" >> "$results"
done

echo "versitygw v1.8.0 test command against the spoke's S3 door (secured: tokens and S3 keys)"
echo
echo "| group | tests | pass | needs writes (its setup's CreateBucket or PutObject: NotImplemented) | failed otherwise | skipped |"
echo "|---|---|---|---|---|---|"
python3 - "$results" <<'EOF'
import collections, re, sys
groups = collections.OrderedDict()
failed = []
for line in open(sys.argv[1]):
    verdict, rest = line.split(" ", 1)
    name = rest.split(":", 1)[0].strip()
    group = name.split("_", 1)[0]
    row = groups.setdefault(group, collections.Counter())
    row["tests"] += 1
    if verdict == "PASS":
        row["pass"] += 1
    elif verdict == "SKIP":
        row["skip"] += 1
    elif re.search(r"CreateBucket|PutObject|CreateMultipartUpload|UploadPart|CopyObject|PutBucket|failed to create a bucket|NotImplemented", rest):
        row["writes"] += 1
    else:
        row["failed"] += 1
        failed.append(line.strip()[:240])
total = collections.Counter()
for group, row in groups.items():
    total.update(row)
    print(f"| {group} | {row['tests']} | {row['pass']} | {row['writes']} | {row['failed']} | {row['skip']} |")
print(f"| all | {total['tests']} | {total['pass']} | {total['writes']} | {total['failed']} | {total['skip']} |")
print("\nPassed:", ", ".join(l.split()[1].rstrip(":") for l in open(sys.argv[1]) if l.startswith("PASS")) or "none")
print("\nFailed otherwise:")
for f in failed:
    print("-", f)
EOF

echo
echo "versitygw's download bench (8 objects of 1 MiB, a dataset the key's principal may read):"
"$VGW" test -a "$access" -s "$secret" -e "http://$door" bench --download --bucket vgwbench --prefix obj \
  --files 8 --objsize 1048576 2>&1 | sed 's/\x1b\[[0-9;]*m//g' | tail -5
