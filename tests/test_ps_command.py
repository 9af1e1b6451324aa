"""How ``gatewrap ps`` (and the audit table's run_start row, the review page) shows an agent's
command: on one line, as a shell user reads a command line and as bash reads it back
(``printf %q``, ``set -x``), every control character escaped as ``gatewrap.text.printable``
shows it. The same table runs on a real run in tests/test_ps_stop.py."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from conftest import gatewrap_cmd
from gatewrap.live_runs import LiveRun, ps_lines

CASES = [
    ("plain words stay bare", ["/bin/sleep", "300"], "/bin/sleep 300"),
    ("a word with a space is single-quoted: its bounds show", ["echo", "a b", "c"], "echo 'a b' c"),
    ("a quote inside a quoted word", ["echo", "it's"], "echo 'it'\"'\"'s'"),
    ("an empty argument shows as ''", ["printf", ""], "printf ''"),
    ("a -c script's newlines are $'\\n' on one line", ["python3", "-c", "import os\nprint(1)\n"],
     "python3 -c $'import os\\nprint(1)\\n'"),
    ("a typed backslash-n differs from a newline", ["printf", "a\\nb", "a\\n\nb"], "printf 'a\\nb' $'a\\\\n\\nb'"),
    ("tab and carriage return as printable shows them", ["x", "a\tb\r"], "x $'a\\tb\\r'"),
    ("ESC and the C1 CSI cannot reach the terminal", ["echo", "\x1b[2J\x9b31m\x7f"], "echo $'\\x1b[2J\\u009b31m\\x7f'"),
    ("a bidi override is escaped", ["cat", "\u202egnp.exe"], "cat $'\\u202egnp.exe'"),
    ("a line separator is escaped", ["echo", "a\u2028b"], "echo $'a\\u2028b'"),
    ("a byte that was not UTF-8 is that byte", ["cat", "bad\udcff.txt"], "cat $'bad\\xff.txt'"),
    ("letters beyond ASCII are shown as they are", ["echo", "münchen"], "echo 'münchen'"),
    ("a quote beside a control character", ["sh", "-c", "echo 'x'\n"], "sh -c $'echo \\'x\\'\\n'"),
    ("a word with = after the first stays bare", ["env", "A=1", "x"], "env A=1 x"),
]


@pytest.mark.parametrize("argv, shown", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_a_command_is_one_line_a_shell_reads_back_to_the_same_argv(argv, shown):
    from gatewrap.text import command_line

    assert command_line(argv) == shown
    assert shown.isprintable()  # nothing raw: no newline, ESC, CSI, bidi override
    # bash reads the line back to the very same arguments, bytes that were not UTF-8 included
    out = subprocess.run(["bash", "-c", "printf '%s\\0' " + shown], capture_output=True, check=True,
                         env={"LC_ALL": "C.UTF-8", "PATH": os.environ["PATH"]}).stdout
    assert out.split(b"\0")[:-1] == [os.fsencode(a) for a in argv]


@pytest.mark.parametrize("argv, shown", [(["A=1", "x"], "'A=1' x"), (["time", "x"], "'time' x"), (["if", "x"], "'if' x")],
                         ids=["a first word with = (bash: an assignment, then runs x)",
                              "a reserved word first (bash: its time keyword on x)", "if first"])
def test_a_first_word_bash_would_read_as_its_own_is_quoted_and_runs_as_that_program(tmp_path, argv, shown):
    """Found by an attacker: ``A=1 x`` shown bare runs x in bash, ``time x`` bash's keyword."""
    from gatewrap.text import command_line

    assert command_line(argv) == shown
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in (argv[0], "x"):
        stub = bin_dir / name
        stub.write_text('#!/bin/sh\nprintf "%s|" "${0##*/}" "$@"\n')
        stub.chmod(0o755)
    ran = subprocess.run(["/bin/bash", "-c", shown], capture_output=True, text=True, timeout=10,
                         env={"PATH": str(bin_dir), "LC_ALL": "C.UTF-8"}).stdout
    assert ran == "|".join(argv) + "|", ran


def test_the_ps_row_shows_a_multi_line_command_on_one_line():
    run = LiveRun(run="gw-0123456789", pid=42, argv=["python3", "-c", "import time\ntime.sleep(9)\x1b[2J"],
                  user="nobody", uid=65534, started=0.0, uptime_s=3, audit_log=None)
    header, row = ps_lines([run])
    assert row.endswith("  python3 -c $'import time\\ntime.sleep(9)\\x1b[2J'"), row
    assert row.isprintable()


def test_the_audit_tables_run_start_row_shows_the_command_as_ps_does(tmp_path):
    log = tmp_path / "audit.jsonl"
    argv = ["python3", "-c", "import os\nos.system('id')", "a b"]
    log.write_text(json.dumps({"v": 1, "time": "2026-12-01T09:00:00.000000Z", "run": "gw-0123456789",
                               "event": "run_start", "argv": argv, "uid": 1000}) + "\n")
    p = subprocess.run(gatewrap_cmd("audit", "--format", "table", "--log", str(log)), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 0, p.stderr
    assert p.stdout.splitlines()[1].endswith("python3 -c $'import os\\nos.system(\\'id\\')' 'a b'"), p.stdout
