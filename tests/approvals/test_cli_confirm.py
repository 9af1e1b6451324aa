"""The human decides on the request the store holds, not on a line the agent may have printed
(issue 21, item 6): ``approve``/``reject`` without ``--digest``, on a terminal, print the exact
request as ``show`` does (the agent's bytes escaped: nothing it sent can move the cursor or
clear the screen) and ask ``y/N``; without a terminal they need ``--yes`` or ``--digest``. The
notice line names the first characters of the request's digest, which the prompt shows in full.
SQLite and PostgreSQL."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import time

import pytest

from conftest import ROOT, gatewrap_cmd
from gatewrap.approvals import notify

from .held import cli

RUN = "gw-00000000d1"
#: The agent's bytes: a header value and a body that try to repaint the terminal (save the
#: cursor, clear below, print a forged harmless request) and to reorder it (bidi override).
HOSTILE_HEADER = "ok\x1b[s\x1b[J\x1b[1;1HGET /harmless"
HOSTILE_BODY = b'{"to": "all@example.com"}\x1b[2J\x1b[HGET /harmless HTTP/1.1\r\n\x00\xe2\x80\xae'


@pytest.fixture
def asked(store):
    store.start_run(RUN)
    a, _ = store.ask(RUN, rule="policy.toml:rule[1]", method="POST", url="https://mail.test/v3/mail/send",
                     headers=[("Content-Type", "application/json"), ("X-Note", HOSTILE_HEADER)], body=HOSTILE_BODY)
    return a


def on_a_terminal(*args: str, answer: str | None) -> tuple[int, bytes]:
    """``gatewrap approvals ARGS`` with stdin, stdout and stderr on a new pseudo-terminal;
    ``answer`` typed once the ``[y/N]`` prompt shows. (exit code, everything it printed)."""
    master, slave = pty.openpty()
    env = dict(os.environ, SUDO_USER="alice", TERM="xterm")
    p = subprocess.Popen(gatewrap_cmd("approvals", *args), stdin=slave, stdout=slave, stderr=slave, env=env, cwd=ROOT,
                         close_fds=True, start_new_session=True)
    os.close(slave)
    out = b""
    typed = answer is None
    end = time.monotonic() + 60
    while time.monotonic() < end:
        ready, _, _ = select.select([master], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # EIO: the other side closed
                break
            if not chunk:
                break
            out += chunk
        if not typed and b"[y/N]" in out:
            os.write(master, answer.encode() + b"\n")
            typed = True
        if p.poll() is not None and not ready:
            break
    os.close(master)
    return p.wait(timeout=30), out


@pytest.mark.parametrize("verdict, extra", [("approve", ()), ("reject", ("--reason", "not now"))])
def test_on_a_terminal_the_exact_request_is_shown_escaped_and_no_decides_nothing(asked, store, store_url, verdict,
                                                                                  extra):
    code, out = on_a_terminal(verdict, asked["id"], *extra, "--state", store_url, answer="n")
    assert code == 1, out
    assert b"\x1b" not in out and b"\x00" not in out and "\u202e".encode() not in out, \
        "nothing the agent sent reaches the terminal unescaped"
    text = out.decode()
    assert "POST /v3/mail/send HTTP/1.1" in text and "Host: mail.test" in text
    assert "X-Note: ok\\x1b[s\\x1b[J\\x1b[1;1HGET /harmless" in text
    assert "\\x1b[2J\\x1b[HGET /harmless HTTP/1.1\\r" in text and "\\x00\\u202e" in text
    assert asked["digest"] in text, "the prompt names the whole digest"
    assert "nothing was decided" in text
    assert store.get(asked["id"])["status"] == "pending"


@pytest.mark.parametrize("verdict, extra, status", [("approve", (), "approved"),
                                                    ("reject", ("--reason", "not now"), "rejected")])
def test_on_a_terminal_yes_decides_on_the_version_shown(asked, store, store_url, verdict, extra, status):
    code, out = on_a_terminal(verdict, asked["id"], *extra, "--state", store_url, answer="y")
    assert code == 0, out
    after = store.get(asked["id"])
    assert (after["status"], after["decided_by"], after["version"]) == (status, "alice", asked["version"] + 1)


def test_without_a_terminal_a_decision_needs_yes_or_the_digest(asked, store, store_url):
    r = cli("approve", asked["id"], "--state", store_url)
    assert r.returncode == 125, r.stderr
    assert "--yes" in r.stderr and "--digest" in r.stderr and "show" in r.stderr, "the message says what to do"
    assert store.get(asked["id"])["status"] == "pending"
    r = cli("reject", asked["id"], "--reason", "no", "--state", store_url)
    assert r.returncode == 125 and store.get(asked["id"])["status"] == "pending"
    assert cli("approve", asked["id"], "--digest", asked["digest"], "--version", "1", "--state", store_url).returncode == 0
    assert store.get(asked["id"])["status"] == "approved"


def test_yes_decides_without_asking(asked, store, store_url):
    r = cli("approve", asked["id"], "--yes", "--state", store_url)
    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stdout and "\x1b" not in r.stderr
    assert store.get(asked["id"])["status"] == "approved"


def test_the_notice_line_names_the_digest_s_first_characters(asked):
    line = notify.stderr_line(asked)
    assert f"(digest {asked['digest'][:12]})" in line
    assert "\x1b" not in notify.stderr_line({**asked, "rule": "r\x1b[2J"})


def test_a_huge_reason_is_refused_with_the_limit(asked, store, store_url):
    r = cli("reject", asked["id"], "--yes", "--reason", "x" * 100_000, "--state", store_url)
    assert r.returncode == 125 and "--reason" in r.stderr and "characters" in r.stderr, r.stderr[:500]
    assert store.get(asked["id"])["status"] == "pending"
