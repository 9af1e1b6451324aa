"""Text that reaches a terminal: values from the agent or the network are escaped first."""

from __future__ import annotations


def printable(s: str) -> str:
    """Escape control characters (C0, DEL, C1, line/paragraph separators) as ``\\xNN``/``\\uNNNN``,
    so a hostile value (a process name, a host name) cannot move the cursor, recolour or
    clear the screen, or forge a line."""
    return "".join(c if (c.isprintable() or c == " ") else c.encode("unicode_escape").decode("ascii") for c in s)
