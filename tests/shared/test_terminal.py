"""The daemon's view of a run's terminal (gatewrap.shared.daemon.Terminal): each of gatewrap's
lines reaches it in one write(2), so the agent, which writes to the same terminal, cannot land
inside one (seen in CI: a `refused:` notice and the agent's own error merged on one line)."""

from __future__ import annotations

import socket

from gatewrap.shared.daemon import Terminal


def _writes(chunks: list[str], flush: bool = False) -> list[bytes]:
    """The write(2)s a terminal gets after ``chunks`` are written: a SOCK_SEQPACKET pair
    keeps each write a message of its own (unix(7)), where a pipe would join them."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    term = Terminal(ours.detach())
    for c in chunks:
        term.write(c)
    if flush:
        term.flush()
    assert term.wait_written(5.0)
    term.close()
    got = []
    while message := theirs.recv(65536):
        got.append(message)
    theirs.close()
    return got


def test_a_printed_line_is_one_write():
    # print() writes its text, then its newline: two calls, one line.
    assert _writes(["gatewrap: refused: sh (pid 7) tried ...", "\n"]) == [b"gatewrap: refused: sh (pid 7) tried ...\n"]


def test_text_without_its_newline_waits_for_it_or_for_flush():
    assert _writes(["one\ntw", "o\n"]) == [b"one\n", b"two\n"]
    assert _writes(["a", "b"], flush=True) == [b"ab"]
    assert _writes(["a", "b"]) == [b"ab"]  # close() writes what is left
