"""The README's quickstart and the docs' Python examples, run as written, so the docs
cannot drift: the blocks marked ``<!-- readme-test: NAME -->`` are taken from README.md
and the pages of docs/ and run
in a fresh directory with the built binaries first on PATH (the quickstart's install
steps are what ``make test`` itself did: the build, and the wheel built as ``make dist``
builds it, pip-installed into a fresh venv by scripts/test-python.sh). Shell blocks run
in bash, their background servers in one process group that is stopped at the end;
Python blocks in this interpreter, in a subprocess."""

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from conftest import BIN, REPO

README = REPO / "README.md"
# The README and the manual it links to, where the marked blocks live.
PAGES = [README, *sorted((REPO / "docs").glob("*.md"))]
MARKED = re.compile(r"<!-- readme-test: ([a-z-]+) -->\n```(sh|python)\n(.*?)```", re.S)
# The quickstart's ports (the servers' defaults, as the README gives them).
PORTS = (7070, 7071)
MOUNTPOINT = pathlib.Path("/mnt/shardcache")  # the mount section's


def blocks():
    text = "\n".join(page.read_text() for page in PAGES)
    return {name: (lang, code) for name, lang, code in MARKED.findall(text)}


def test_every_python_example_of_the_readme_is_run():
    python_blocks = sum(page.read_text().count("```python") for page in PAGES)
    assert python_blocks == sum(1 for lang, _ in blocks().values() if lang == "python")
    assert {"quickstart-servers", "quickstart-python", "python-sdk", "mount", "mount-python"} <= set(blocks())


def port_taken(port):
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Shell:
    """A README shell block running in bash, in a process group of its own (the servers
    it starts with `&` stay in it after the block ends); its output in a file."""

    def __init__(self, code, cwd, env, name):
        self.log = cwd / f"{name}.log"
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(["bash", "-euo", "pipefail", "-c", code], cwd=cwd, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            status = self.proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            status = "timeout"
        if status != 0:
            self.stop()
            pytest.fail(f"README block {name} failed ({status}):\n{self.log.read_text()}")

    def output(self):
        return self.log.read_text()

    def stop(self):
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def run_python(code, cwd, env, name):
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, f"README block {name} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def test_the_quickstart_and_the_python_examples_run_as_written(tmp_path):
    taken = [p for p in PORTS if port_taken(p)]
    if taken:
        pytest.fail(f"the quickstart listens on 127.0.0.1:{PORTS}; something already listens on {taken}")
    code = blocks()
    env = dict(os.environ, PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}", RUST_LOG="warn")
    servers = Shell(code["quickstart-servers"][1], tmp_path, env, "quickstart-servers")
    mount = None
    try:
        listing = servers.output()
        assert "shard-00007.bin" in listing and "4MiB" in listing, listing
        out = run_python(code["quickstart-python"][1], tmp_path, env, "quickstart-python")
        assert "epoch 1: 2048 samples, last batch (8, 4096) torch.int64" in out, out
        run_python(code["python-sdk"][1], tmp_path, env, "python-sdk")
        # The mount section: the README's mount point, read with numpy and open() (where
        # FUSE can mount, as test_mount.py).
        if not os.path.exists("/dev/fuse") or shutil.which("fusermount3") is None:
            return
        mount = Shell(code["mount"][1], tmp_path, env, "mount")
        assert "shard-00000.bin" in mount.output(), mount.output()
        run_python(code["mount-python"][1], tmp_path, env, "mount-python")
    finally:
        if mount is not None:
            subprocess.run(["fusermount3", "-u", str(MOUNTPOINT)], check=False)
            mount.stop()
        servers.stop()
