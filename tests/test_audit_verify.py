"""The audit log's hash chain and signed checkpoints, checked by ``gatewrap audit verify``:
logs written by the real writer (the extension's AuditLog, and real runs), then tampered
with as an attacker would (a flipped byte, a removed line, a cut tail)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest

from conftest import AGENT_UID, ROOT, gatewrap_cmd
from gatewrap import _gate_core as core
from gatewrap import audit_verify as av

HOST_KEY = "/var/lib/gatewrap/audit/signing-key"


def _verify(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd("audit", "verify", *args), capture_output=True, text=True, timeout=300, cwd=ROOT)


@pytest.fixture
def signed(tmp_path):
    """A log at tmp_path/audit.jsonl signed by a key of its own; returns (log, path, key)."""
    key_path = tmp_path / "keys" / "signing-key"
    path = tmp_path / "audit.jsonl"
    log = core.AuditLog(str(path), key=str(key_path), checkpoint_every=10)
    return log, path, core.audit_verifier_key(str(key_path))


def _write(log, n: int, start: int = 0) -> None:
    for i in range(start, start + n):
        log.write({"run": "gw-test", "event": "request", "i": i, "target": f"http://x.test/{i}"})


def _lines(path) -> list[bytes]:
    return path.read_bytes().splitlines(keepends=True)


def test_a_checkpointed_log_verifies(signed):
    log, path, key = signed
    _write(log, 25)
    log.checkpoint()
    p = _verify("--key", key, "--json", str(path))
    assert p.returncode == 0, p.stdout + p.stderr
    rep = json.loads(p.stdout)
    f = rep["files"][0]
    assert (rep["ok"], f["records"], f["checkpoints"], f["unverified_tail"]) == (True, 28, 3, 0), f
    text = _verify("--key", key, str(path))
    assert text.returncode == 0 and "chain verified: 28 records, 3 checkpoints (the last at line 28, size 27)" in text.stdout, text.stdout


def test_one_checkpoint_is_said_in_the_singular(signed):
    log, path, key = signed
    _write(log, 3)
    log.checkpoint()
    text = _verify("--key", key, str(path))
    assert text.returncode == 0 and "chain verified: 4 records, 1 checkpoint (the last at line 4, size 3)" in text.stdout, text.stdout


def test_a_flipped_byte_names_its_line(signed):
    log, path, key = signed
    _write(log, 8)
    log.checkpoint()
    lines = _lines(path)
    lines[4] = lines[4].replace(b"x.test/4", b"y.test/4")  # still valid JSON: only the chain shows it
    path.write_bytes(b"".join(lines))
    p = _verify("--key", key, str(path))
    assert p.returncode == 1, p.stdout + p.stderr
    assert p.stdout.startswith(f"{path}:5: this line was changed"), p.stdout
    lines[4] = lines[4].replace(b'"i":4', b'"i"!4')  # and a byte that breaks the JSON
    path.write_bytes(b"".join(lines))
    p = _verify("--key", key, str(path))
    assert (p.returncode, p.stdout.split(": ")[0]) == (1, f"{path}:5"), p.stdout


def test_a_removed_line_names_where(signed):
    log, path, key = signed
    _write(log, 8)
    log.checkpoint()
    lines = _lines(path)
    del lines[6]
    path.write_bytes(b"".join(lines))
    p = _verify("--key", key, str(path))
    assert p.returncode == 1 and p.stdout.startswith(f"{path}:7: seq is 8, expected 7: records were removed"), p.stdout


def test_an_altered_checkpoint_or_another_key_is_refused(signed, tmp_path):
    log, path, key = signed
    _write(log, 3)
    log.checkpoint()
    other = core.audit_verifier_key(str(tmp_path / "other" / "signing-key"))
    p = _verify("--key", other, str(path))
    assert p.returncode == 1 and f"{path}:4: checkpoint: no signature by a known key" in p.stdout, p.stdout
    lines = _lines(path)
    rec = json.loads(lines[3])
    origin, size, root = rec["note"].split("\n")[:3]
    rec["note"] = rec["note"].replace(f"\n{size}\n", f"\n{int(size) + 1}\n", 1)
    lines[3] = json.dumps(rec, separators=(",", ":")).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    p = _verify("--key", key, str(path))
    assert p.returncode == 1 and f"{path}:4: checkpoint: the signature of" in p.stdout, p.stdout


def test_a_tail_after_the_last_checkpoint_is_reported_and_a_cut_one_caught_by_a_kept_checkpoint(signed, tmp_path):
    log, path, key = signed
    _write(log, 5)
    log.checkpoint()
    kept = tmp_path / "kept.note"
    kept.write_text(json.loads(_lines(path)[-1])["note"])  # as shipped off the host
    _write(log, 3, start=5)
    p = _verify("--key", key, "--checkpoint", str(kept), str(path))
    assert p.returncode == 0, p.stdout + p.stderr
    assert f"{path}: 3 records after the last checkpoint (unverified tail" in p.stdout, p.stdout
    assert "checkpoint of 5 records: found in" in p.stdout, p.stdout
    # Cut back to before the checkpoint: the file alone is a shorter, valid chain...
    path.write_bytes(b"".join(_lines(path)[:4]))
    p = _verify("--key", key, str(path))
    assert p.returncode == 0 and "4 records after the last checkpoint" in p.stdout, p.stdout
    # ...which the checkpoint kept off the host shows to be truncated.
    p = _verify("--key", key, "--checkpoint", str(kept), str(path))
    assert p.returncode == 1 and "truncated: a checkpoint off the host covers 5 records, the log holds 4" in p.stdout, p.stdout
    # A cut mid-line is named.
    path.write_bytes(path.read_bytes()[:-7])
    p = _verify("--key", key, str(path))
    assert p.returncode == 1 and f"{path}:4: the last line is cut" in p.stdout, p.stdout


def _forge_front(path, keep_from: int, rotated_from: str | None) -> int:
    """Cut the log at ``path`` so that it starts at its line ``keep_from`` (0-based, a
    checkpoint), adding ``rotated_from`` to that line when given; returns its seq."""
    lines = _lines(path)[keep_from:]
    rec = json.loads(lines[0])
    assert rec["event"] == "checkpoint", rec
    if rotated_from is not None:
        rec["rotated_from"] = rotated_from
        lines[0] = json.dumps(rec, separators=(",", ":")).encode() + b"\n"
    path.write_bytes(b"".join(lines))
    return rec["seq"]


def test_a_log_cut_back_to_its_last_checkpoint_does_not_pass_for_a_rotated_segment(signed):
    log, path, key = signed
    _write(log, 25)
    log.checkpoint()
    seq = _forge_front(path, len(_lines(path)) - 1, "audit.jsonl.000000000001")
    p = _verify("--key", key, str(path))
    assert p.returncode == 1, p.stdout + p.stderr
    assert (f"{path}: starts mid-chain at record {seq} without the file before it (audit.jsonl.000000000001): "
            "older segments deleted (--audit-keep), or the log's front cut; pass --partial") in p.stdout, p.stdout
    # A partial log is verified as one, and says that the link it claims is not signed.
    p = _verify("--key", key, "--partial", "--json", str(path))
    f = json.loads(p.stdout)["files"][0]
    assert p.returncode == 0 and (f["start"], f["first_seq"]) == ("unsigned_rotation", seq), f
    p = _verify("--key", key, "--partial", str(path))
    assert p.returncode == 0 and (f"from record {seq} (claims to continue audit.jsonl.000000000001, outside its "
                                  "signed text") in p.stdout, p.stdout


def test_a_log_cut_back_to_a_checkpoint_inside_it_is_named_as_cut(signed):
    log, path, key = signed
    _write(log, 25)
    log.checkpoint()
    seq = _forge_front(path, 10, None)  # line 11: the checkpoint after record 10
    p = _verify("--key", key, str(path))
    assert p.returncode == 1 and f"starts mid-chain at record {seq} without the file before it" in p.stdout, p.stdout
    p = _verify("--key", key, "--partial", str(path))
    assert p.returncode == 0 and f"from record {seq} (at a checkpoint that opened no file: the lines before it " \
        "were removed)" in p.stdout, p.stdout


def test_a_rotated_from_that_is_not_the_signed_one_is_a_changed_record(tmp_path):
    key_path = tmp_path / "keys" / "signing-key"
    path = tmp_path / "audit.jsonl"
    log = core.AuditLog(str(path), key=str(key_path), checkpoint_every=0, max_size=4096)
    _write(log, 40)
    seg = path.read_bytes().splitlines(keepends=True)
    rec = json.loads(seg[0])
    assert rec["rotated_from"].startswith("audit.jsonl.0"), rec
    rec["rotated_from"] = "audit.jsonl.000000000002"
    seg[0] = json.dumps(rec, separators=(",", ":")).encode() + b"\n"
    path.write_bytes(b"".join(seg))
    p = _verify("--key", core.audit_verifier_key(str(key_path)), "--partial", str(path))
    assert p.returncode == 1 and f"{path}:1: rotated_from is 'audit.jsonl.000000000002', but its signed text says" \
        in p.stdout, p.stdout


def test_own_failures_exit_125(signed, tmp_path):
    _, path, key = signed
    p = _verify("--key", key, str(tmp_path / "missing.jsonl"))
    assert p.returncode == 125 and "cannot read audit log" in p.stderr, p.stderr
    p = _verify("--key", "not-a-key", str(path))
    assert p.returncode == 125, p.stderr


C0 = "".join(map(chr, range(0x20)))
DEL_C1 = "\x7f" + "".join(map(chr, range(0x80, 0xa0)))


@pytest.mark.parametrize(("value", "read_back"), [
    (C0, C0),
    (DEL_C1, DEL_C1),
    ("\x9b2J\x1b]0;owned\x07", "\x9b2J\x1b]0;owned\x07"),
    # Invalid UTF-8 (a C1 byte alone is not a character): kept as \xNN text.
    (b"\xff\xfe\x9b[31m\xc3", "\\xff\\xfe\\x9b[31m\\xc3"),
    # A file name decoded with surrogateescape (PEP 383): its bytes, as \xNN text.
    (os.fsdecode(b"name-\xff\x9b"), "name-\\xff\\x9b"),
    ("n" * 65536, None),  # a 64 KB name: cut to the record cap
], ids=["c0", "del-c1", "csi-osc", "invalid-utf8-bytes", "surrogateescape", "64k"])
def test_hostile_strings_give_one_escaped_record(signed, value, read_back):
    log, path, key = signed
    log.write({"run": "gw-test", "event": "direct_egress", "comm": value, "cmdline": value})
    data = path.read_bytes()
    assert data.count(b"\n") == 1, "one record, one line"
    text = data.decode("utf-8")
    assert not any(c < " " or "\x7f" <= c <= "\x9f" for c in text[:-1]), "no raw control character"
    rec = json.loads(text)
    if read_back is None:
        assert rec["truncated"] == ["comm", "cmdline"] and rec["comm"].endswith("…"), rec.keys()
    else:
        assert rec["comm"] == read_back
    assert _verify("--key", key, str(path)).returncode == 0


# Real runs: the default log of each run, signed by the host's key.

@pytest.mark.kernel
def test_a_real_runs_log_verifies_and_ends_in_a_checkpoint(gatewrap):
    r = gatewrap(["/bin/true"])
    assert r.returncode == 0, r.stderr
    recs = r.audit()
    assert [x["event"] for x in recs[-2:]] == ["run_end", "checkpoint"], recs
    p = _verify("--json", str(r.audit_path))
    assert p.returncode == 0, p.stdout + p.stderr
    f = json.loads(p.stdout)["files"][0]
    assert (f["unverified_tail"], f["checkpoints"]) == (0, 1), f
    key = subprocess.run(gatewrap_cmd("audit", "key"), capture_output=True, text=True, cwd=ROOT)
    assert key.returncode == 0 and av.VerifierKey.parse(key.stdout).name.endswith("/gatewrap-audit"), key
    assert os.stat(HOST_KEY).st_mode & 0o777 == 0o600
    assert os.stat(os.path.dirname(HOST_KEY)).st_mode & 0o777 == 0o700


@pytest.mark.kernel
def test_the_agent_cannot_see_the_signing_key(gatewrap):
    r = gatewrap(["/bin/sh", "-c", f"ls -a {os.path.dirname(HOST_KEY)}; cat {HOST_KEY}"], user_env=False)
    assert "PRIVATE+KEY" not in r.stdout + r.stderr, r.stdout


def _start(audit, *argv: str) -> subprocess.Popen:
    env = dict(os.environ, SUDO_UID=str(AGENT_UID), SUDO_GID=str(AGENT_UID))
    return subprocess.Popen(gatewrap_cmd("run", "--audit-log", str(audit), "--workdir", "/tmp", "--", *argv),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)


@pytest.mark.kernel
@pytest.mark.own_process
def test_sigkill_mid_run_leaves_a_verifiable_log_with_its_tail_reported(tmp_path):
    audit = tmp_path / "audit.jsonl"
    p = _start(audit, "/bin/sleep", "300")
    try:
        deadline = time.monotonic() + 60
        while not (audit.exists() and b'"run_start"' in audit.read_bytes()):
            assert p.poll() is None and time.monotonic() < deadline, p.stderr.read() if p.poll() is not None else "no run_start"
            time.sleep(0.1)
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=30)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    v = _verify(str(audit))
    assert v.returncode == 0, v.stdout + v.stderr
    assert "records after the last checkpoint (unverified tail" in v.stdout, v.stdout
    gc = subprocess.run(gatewrap_cmd("gc"), capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert gc.returncode == 0, gc.stderr
    v = _verify("--json", str(audit))
    f = json.loads(v.stdout)["files"][0]
    assert v.returncode == 0 and f["unverified_tail"] == 0, f  # gc's run_end, then a checkpoint


@pytest.mark.kernel
def test_twenty_concurrent_runs_keep_one_chain(tmp_path):
    audit = tmp_path / "audit.jsonl"
    runs = [_start(audit, "/bin/true") for _ in range(20)]
    for r in runs:
        _, err = r.communicate(timeout=300)
        assert r.returncode == 0, err
    v = _verify("--json", str(audit))
    assert v.returncode == 0, v.stdout + v.stderr
    f = json.loads(v.stdout)["files"][0]
    ends = [json.loads(x) for x in audit.read_bytes().splitlines()]
    assert sum(1 for x in ends if x["event"] == "run_end") == 20
    assert f["checkpoints"] >= 1 and f["unverified_tail"] == 0, f
