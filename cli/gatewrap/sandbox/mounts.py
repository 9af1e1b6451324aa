"""The mount table of gatewrap's mount namespace, from ``/proc/self/mounts``."""

from __future__ import annotations

import re

MOUNTS = "/proc/self/mounts"


def _unescape(field: str) -> str:
    """A field of the mount table with its octal escapes (``\\040`` for a space, ``\\011``,
    ``\\012``, ``\\134``: proc_pid_mounts(5), the kernel's seq_file mangling) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def mount_table(mounts_file: str = MOUNTS) -> list[tuple[str, str]]:
    """Every mount as (mount point, file system type), in the table's order (fstab(5)
    fields 2 and 3 of each line of ``mounts_file``)."""
    out = []
    with open(mounts_file) as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3:
                out.append((_unescape(parts[1]), _unescape(parts[2])))
    return out
