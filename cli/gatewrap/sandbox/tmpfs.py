"""The jail's in-memory file systems, each sized out of one budget (``gatewrap run --tmpfs``).

A tmpfs without ``size=`` may grow to half of RAM, and its pages are in no process's RSS: the
OOM killer cannot see who filled it. Each of the jail's tmpfs mounts therefore gets a part of
the run's budget, ``size=`` and ``nr_inodes=`` (tmpfs(5)); the parts add up to the budget:

- ``/run`` and ``/dev``: :data:`FIXED` bytes each, read-only for the agent (they hold only
  mount points and the profile's links; ``_nsjail/agent.cfg`` sizes them, a test checks it);
- of the rest, ``/tmp`` half, the agent's home (``$HOME``, when it is a tmpfs) and ``/dev/shm``
  a quarter each.

A write past a part fails with ENOSPC. The pages are also charged to the memory cgroup of the
task that writes them (Documentation/admin-guide/cgroup-v1/memory.rst, "shmem"), so they
count against the run's ``--memory`` too. Light on imports: the CLI checks ``--tmpfs`` with it.
"""

from __future__ import annotations

#: Bytes of each of the read-only ``/run`` and ``/dev`` (as ``_nsjail/agent.cfg`` says).
FIXED = 1 << 20
#: One inode per this many bytes of a part (an empty file costs ~1 KiB of kernel memory and no
#: page, so ``size=`` alone would not bound a flood of empty files).
BYTES_PER_INODE = 8 << 10
#: The least budget ``--tmpfs`` takes: the fixed parts and 4 MiB or more for each other.
MIN_BUDGET = 18 << 20
#: Page size the parts are rounded down to (tmpfs rounds ``size=`` up to whole pages).
PAGE = 4096


def split(budget: int) -> dict[str, int]:
    """The parts of ``budget`` bytes: ``{"/tmp", "home", "/dev/shm", "/run", "/dev"}`` -> bytes,
    whole pages, together at most ``budget``.

    Raises:
        ValueError: ``budget`` is below :data:`MIN_BUDGET`.
    """
    if budget < MIN_BUDGET:
        raise ValueError(f"a tmpfs budget of {budget} bytes is below {MIN_BUDGET}")
    rest = budget - 2 * FIXED
    quarter = rest // 4 // PAGE * PAGE
    return {"/tmp": (rest - 2 * quarter) // PAGE * PAGE, "home": quarter, "/dev/shm": quarter,
            "/run": FIXED, "/dev": FIXED}


def options(size: int, mode: str) -> str:
    """tmpfs mount options for a part of ``size`` bytes with folder ``mode`` (octal text)."""
    return f"mode={mode},size={size},nr_inodes={max(64, size // BYTES_PER_INODE)}"


def nsjail_args(budget: int) -> list[str]:
    """nsjail's flags for the jail's ``/tmp`` and ``/dev/shm`` (``-m``, after the profile's
    ``/dev``); the home's part is :func:`home_options`."""
    parts = split(budget)
    return ["-m", f"none:/tmp:tmpfs:{options(parts['/tmp'], '1777')}",
            "-m", f"none:/dev/shm:tmpfs:{options(parts['/dev/shm'], '1777')}"]


def home_options(budget: int) -> str:
    """The mount options of the agent's home, a private tmpfs (mode 0700)."""
    return options(split(budget)["home"], "0700")
