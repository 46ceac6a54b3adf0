"""Checks that what users install runs on glibc GLIBC or newer (manylinux's rule).

    python scripts/check_portable.py --glibc 2.17 [--wheel WHEEL] [BINARY ...]

A wheel: `auditwheel show` (run from this Python's venv) must find it consistent with
manylinux_GLIBC_ARCH, as its file name's tags say, and needing no external library.
A binary: the highest GLIBC_ symbol version it asks of the loader (its .gnu.version_r
section, read with pyelftools, which auditwheel brings) must be GLIBC or lower, and it
may ask only for the libraries every glibc system has (manylinux's list, libgcc_s
included: no libstdc++, no OpenSSL). Prints a table of what each file needs;
exits 1 saying which file asks too much.
"""

import argparse
import json
import os
import platform
import subprocess
import sys

from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerNeedSection

# The libraries manylinux2014 lets a wheel link without bundling them (PEP 599), which
# every glibc distribution ships. libgcc_s is among them; libstdc++ is not listed because
# its symbol versions follow GCC, not glibc, and our binaries link C++ statically.
SYSTEM_LIBRARIES = {
    "libc.so.6", "libm.so.6", "libdl.so.2", "libpthread.so.0", "librt.so.1",
    "libgcc_s.so.1", "ld-linux-x86-64.so.2", "ld-linux-aarch64.so.1",
}


def version_key(v):
    return tuple(int(p) for p in v.split("."))


def glibc_needs(path):
    """The libraries a binary names (DT_NEEDED) and the highest GLIBC_ version it asks."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        dynamic = elf.get_section_by_name(".dynamic")
        if dynamic is None:
            return [], None  # static: asks the loader for nothing
        needed = [t.needed for t in dynamic.iter_tags() if t.entry.d_tag == "DT_NEEDED"]
        highest = None
        for section in elf.iter_sections():
            if not isinstance(section, GNUVerNeedSection):
                continue
            for _, auxiliaries in section.iter_versions():
                for aux in auxiliaries:
                    if aux.name.startswith("GLIBC_") and aux.name[6:7].isdigit():
                        v = aux.name[6:]
                        if highest is None or version_key(v) > version_key(highest):
                            highest = v
        return needed, highest


def check_wheel(wheel, glibc, arch):
    auditwheel = os.path.join(os.path.dirname(sys.executable), "auditwheel")
    shown = subprocess.run([auditwheel, "show", "--json", wheel], capture_output=True, text=True)
    if shown.returncode != 0:
        return [f"{wheel}: auditwheel show failed: {shown.stderr.strip()}"]
    report = json.loads(shown.stdout)
    want = f"manylinux_{glibc.replace('.', '_')}_{arch}"
    problems = []
    if report["overall_tag"] != want:
        problems.append(f"{wheel}: auditwheel finds it {report['overall_tag']}, not {want}")
    if report["external_libs"]:
        problems.append(f"{wheel}: needs libraries outside the wheel: {sorted(report['external_libs'])}")
    if want not in os.path.basename(wheel):
        problems.append(f"{wheel}: its name does not carry the tag {want}")
    highest = max((v[6:] for vs in report["versioned_symbols"].values() for v in vs
                   if v.startswith("GLIBC_")), key=version_key, default="-")
    print(f"{os.path.basename(wheel)}: auditwheel: {report['overall_tag']}, highest GLIBC_{highest}, "
          f"external libraries: {len(report['external_libs'])}")
    return problems


def check_binary(path, glibc):
    needed, highest = glibc_needs(path)
    problems = []
    if highest is not None and version_key(highest) > version_key(glibc):
        problems.append(f"{path}: asks for GLIBC_{highest}, newer than {glibc}: build it with "
                        f"`cargo zigbuild --target {platform.machine()}-unknown-linux-gnu.{glibc}` (scripts/dist.sh)")
    others = [n for n in needed if n not in SYSTEM_LIBRARIES]
    if others:
        problems.append(f"{path}: links {others}, which a glibc {glibc} system may not have")
    print(f"{os.path.basename(path)}: highest GLIBC_{highest or '-'}, libraries: {' '.join(needed) or 'none'}")
    return problems


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--glibc", required=True, help="the oldest glibc to run on, e.g. 2.17")
    parser.add_argument("--wheel", action="append", default=[])
    parser.add_argument("binaries", nargs="*")
    args = parser.parse_args()
    arch = platform.machine()
    problems = []
    for wheel in args.wheel:
        problems += check_wheel(wheel, args.glibc, arch)
    for binary in args.binaries:
        problems += check_binary(binary, args.glibc)
    for p in problems:
        print(f"check_portable: {p}", file=sys.stderr)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
