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


#: What a shell word may hold unquoted (as :func:`shlex.quote` leaves it).
_BARE = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_@%+=:,./-")
#: Words bash reads as its own when first (bash(1), RESERVED WORDS: ``time x`` times x) and
#: any first word with ``=`` (an assignment: ``A=1 x`` runs x): quoted there.
_RESERVED = frozenset("case coproc do done elif else esac fi for function if in select then time until while".split())
#: How ``$'...'`` writes the controls bash names and C escapes share (the names printable shows).
_NAMED = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}


def _ansi_c(c: str) -> str:
    """One character inside bash's ``$'...'``, exactly (bash(1), QUOTING): what
    :func:`printable` leaves as is stays; a control as printable shows it where that is also
    bash's meaning (``\\n``, ``\\x1b``), else ``\\uNNNN``/``\\UNNNNNNNN`` (bash's ``\\x9b`` would be
    the byte 0x9b, not U+009B); a byte that was not UTF-8 as ``\\xNN``, that byte."""
    if c in _NAMED:
        return _NAMED[c]
    if c.isprintable() or c == " ":
        return c
    if "\udc80" <= c <= "\udcff":
        return f"\\x{ord(c) - 0xDC00:02x}"
    n = ord(c)
    return f"\\x{n:02x}" if n < 0x80 else f"\\u{n:04x}" if n < 0x10000 else f"\\U{n:08x}"


def command_line(argv: list[str]) -> str:
    """``argv`` on one line as a shell user reads (and bash reads back) a command line, as
    bash's ``printf %q`` and ``set -x`` show one: a word of letters, digits and ``_@%+=:,./-``
    as is (but first: one with ``=`` or a reserved word, :data:`_RESERVED`); one with other
    printable characters (a space, a quote) in ``'...'``
    (:func:`shlex.quote`); one with a character :func:`printable` escapes (a newline of a
    ``-c`` script, a tab, ESC, a bidi override, a byte that was not UTF-8) in ``$'...'``, each
    such character escaped as printable shows it (``\\n``, ``\\t``, ``\\x1b``; :func:`_ansi_c`),
    so nothing reaches the terminal raw, arguments keep their bounds, and a typed ``\\n`` (in
    ``'...'``) differs from a newline (``$'\\n'``)."""
    words = []
    for i, a in enumerate(argv):
        if a and _BARE.issuperset(a) and not (i == 0 and ("=" in a or a in _RESERVED)):
            words.append(a)
        elif a.isprintable():
            words.append("'" + a.replace("'", "'\"'\"'") + "'")
        else:
            words.append("$'" + "".join(map(_ansi_c, a)) + "'")
    return " ".join(words)


def counted(n: int, one: str, many: str | None = None) -> str:
    """``n`` and the noun for it: ``1 fork``, ``2 forks`` (``many`` when the plural is not
    ``one`` + "s", e.g. ``counted(n, "process", "processes")``)."""
    return f"{n} {one if n == 1 else (many or one + 's')}"
