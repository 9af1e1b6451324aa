"""Fields of /proc/PID/stat (proc(5)), read without psutil (whose import costs more than the
read): the registry's start times and the attribution's parents use this one reader."""

from __future__ import annotations


def ppid_and_start(pid: int) -> tuple[int, int] | None:
    """(ppid, starttime) of process ``pid``: fields 4 and 22 of /proc/PID/stat, starttime in
    clock ticks since boot; None if there is no such process (or its entry cannot be read).
    The command name (field 2) is in parentheses and may hold any byte: the fields after it
    are read from its last ')'."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2:].split()
    try:
        return int(fields[1]), int(fields[19])
    except (IndexError, ValueError):
        return None
