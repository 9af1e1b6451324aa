"""Attacks on the papercuts of 2a6eb46 (ps command line, daemon installs): each a strict xfail
that says what is wrong; it passes (XPASS, strict: fails) once the product is fixed."""

from __future__ import annotations

import os
import stat
import subprocess

import pytest

from gatewrap.text import command_line


def _ran(tmp_path, line: str) -> str:
    """What bash runs for ``line``: the stubs in ``tmp_path/bin`` print their name and args."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("A=1", "x", "time"):
        stub = bin_dir / name
        stub.write_text('#!/bin/sh\nprintf "%s|" "${0##*/}" "$@"\n')
        stub.chmod(stub.stat().st_mode | stat.S_IXUSR)
    out = subprocess.run(["/bin/bash", "-c", line], capture_output=True, text=True, timeout=10,
                         env={"PATH": str(bin_dir), "LC_ALL": "C.UTF-8"})
    return out.stdout


@pytest.mark.xfail(strict=True, reason="command_line leaves a first word with '=' bare: bash reads it as an "
                                       "assignment and runs the next word (argv A=1 x shows as `A=1 x`, which runs x)")
def test_a_first_word_with_an_equals_sign_reads_back_as_the_same_command(tmp_path):
    line = command_line(["A=1", "x"])
    assert _ran(tmp_path, line) == "A=1|x|", line


@pytest.mark.xfail(strict=True, reason="command_line leaves a reserved word first bare: `time x` runs bash's "
                                       "time keyword on x, not the program time with argument x")
def test_a_first_word_that_is_a_reserved_word_reads_back_as_the_same_command(tmp_path):
    line = command_line(["time", "x"])
    assert _ran(tmp_path, line) == "time|x|", line


@pytest.mark.xfail(strict=True, raises=OverflowError,
                   reason="shown_install raises OverflowError for an `installed` past time_t: the daemon then "
                          "answers 'the daemon failed: ...' instead of the refusal, and the client's closed_early "
                          "or `daemon --status` die with a traceback")
def test_an_install_of_an_out_of_range_time_is_shown_not_raised():
    from gatewrap.shared import protocol

    for installed in (10**30, -(10**30), 2**1100):
        shown = protocol.shown_install({"version": "0.1.0", "path": "/x", "installed": installed})
        assert "gatewrap 0.1.0 in /x" in shown
    text = protocol.mismatch("/run/x.sock", 1, {"version": "0", "path": "/a", "installed": 10**30},
                             protocol.install())
    assert "another" in text
