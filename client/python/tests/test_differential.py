"""The fuzz harness's oracle against the formats' reference readers, in short: damaged
inputs the SDK reads whole (fuzz-bench --accepted) read again through a real hub and by
numpy, megatron-core, MosaicML Streaming, webdataset and pyarrow
(tests/fuzz/differential.py). A sample that differs from what the reference reader
returns is silently wrong data: the worst outcome a reader has."""

import subprocess
import sys

from conftest import REPO, binary, start

sys.path.insert(0, str(REPO / "tests" / "fuzz"))
import differential  # noqa: E402

TARGETS = sorted(differential.OPTIONS)


def test_accepted_damaged_inputs_read_as_the_reference_readers_read_them(tmp_path):
    subprocess.run(
        [binary("fuzz-bench"), "--inputs", "1500", "--accepted", str(tmp_path), "--keep", "10",
         "--target", ",".join(TARGETS), "--seeds", str(REPO / "tests" / "fuzz" / "seeds")],
        check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    proc, addr = start([binary("hub-server"), "--root", str(tmp_path), "--listen", "127.0.0.1:0"],
                       "hub-server listening on ")
    try:
        tally, notes = differential.compare(str(tmp_path), f"http://{addr}")
    finally:
        proc.kill()
        proc.wait()
    wrong = [note for note in notes if note[1] in ("differ", "ours refused")]
    assert not wrong, wrong
    # Every format was compared on inputs both read (else the check proved nothing).
    assert sorted(tally) == TARGETS and all(counts["same"] > 0 for counts in tally.values()), tally
