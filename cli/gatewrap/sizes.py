"""Sizes as users write them (``512M``, ``2G``): a module of its own, without the sandbox's
dataclasses, so that the CLI parses ``--memory`` and ``--audit-max-size`` of a shared run
without importing what only the daemon needs."""

from __future__ import annotations

import re

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``1048576`` -> bytes (binary units, K = 1024).

    Raises:
        ValueError: not a size.
    """
    m = re.fullmatch(r"\s*(\d+)\s*([KMGT]?)(?:I?B)?\s*", text.upper())
    if not m or int(m.group(1)) == 0:
        raise ValueError(f"{text!r} is not a size such as 512M or 2G")
    return int(m.group(1)) * _UNITS[m.group(2)]


def ram_bytes(meminfo: str = "/proc/meminfo") -> int:
    """The host's RAM in bytes: ``MemTotal`` of /proc/meminfo (proc(5), in KiB there)."""
    with open(meminfo) as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) << 10
    raise OSError(f"{meminfo} has no MemTotal")


def parse_memory(text: str) -> int | None:
    """A memory bound as users write it: a size (``512M``, ``2G``), a share of the host's RAM
    (``50%``: of :func:`ram_bytes`, rounded down to whole pages), or ``max`` (None: no bound).

    Raises:
        ValueError: none of these, or a share outside 1..100%.
    """
    text = text.strip()
    if text.lower() == "max":
        return None
    if text.endswith("%"):
        share = text[:-1].strip()
        if not share.isdigit() or not 1 <= int(share) <= 100:
            raise ValueError(f"{text!r} is not a share of the host's RAM from 1% to 100%")
        return ram_bytes() * int(share) // 100 // 4096 * 4096
    return parse_size(text)


def parse_count(text: str) -> int | None:
    """A count bound (``--pids``): a whole number of at least 1, or ``max`` (None: no bound).

    Raises:
        ValueError: neither.
    """
    text = text.strip()
    if text.lower() == "max":
        return None
    if not text.isdigit() or int(text) < 1:
        raise ValueError(f"{text!r} is not a whole number of at least 1, or max")
    return int(text)
