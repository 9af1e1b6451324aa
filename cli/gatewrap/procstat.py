"""Fields of /proc/PID/stat (proc(5)), read without psutil (whose import costs more than the
read): the registry's start times and the attribution's parents use this one reader; and
which pid namespace the pids read here belong to."""

from __future__ import annotations

import os


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


def pid_view() -> list[int] | None:
    """This process's pid namespace as ``[st_dev, st_ino]`` of /proc/self/ns/pid (namespaces(7):
    two processes are in one namespace when both numbers are equal), if the /proc mounted here
    numbers processes in that namespace: /proc/self names this process by its own pid
    (getpid(2)). None otherwise (a /proc of another pid namespace, as ``unshare --pid`` without
    ``--mount-proc`` leaves; or none): then no pid read here can be checked."""
    try:
        if int(os.readlink("/proc/self")) != os.getpid():
            return None
        st = os.stat("/proc/self/ns/pid")
    except (OSError, ValueError):
        return None
    return [st.st_dev, st.st_ino]
