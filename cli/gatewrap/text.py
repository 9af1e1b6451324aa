"""Text that reaches a terminal: values from the agent or the network are escaped first."""

from __future__ import annotations


def _escape(c: str) -> str:
    if "\udc80" <= c <= "\udcff":  # a byte that was not UTF-8, kept by the surrogateescape handler (PEP 383)
        return f"\\x{ord(c) - 0xDC00:02x}"
    return c.encode("unicode_escape").decode("ascii")


def printable(s: str) -> str:
    """Escape control characters (C0, DEL, C1, line/paragraph separators, format characters
    such as bidi overrides) as ``\\xNN``/``\\uNNNN``, so a hostile value (a process name, a
    host name) cannot move the cursor, recolour or clear the screen, or forge a line. A byte
    that was not UTF-8 (read with ``errors="surrogateescape"``) is shown as ``\\xNN``."""
    if s.isprintable():  # the common case, checked in C (space counts as printable)
        return s
    return "".join(c if (c.isprintable() or c == " ") else _escape(c) for c in s)


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the noun for it: ``1 fork``, ``2 forks`` (``many`` when the plural is not
    ``one`` + "s", e.g. ``counted(n, "process", "processes")``)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
