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
