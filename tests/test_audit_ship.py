"""``gatewrap audit ship``: the RFC 5424 message of a line, and shipping to a real rsyslogd
(Debian's package, started by the test on a loopback port): every line received and parsed by
rsyslog with its JSON intact, over TCP and TLS, resumed from the saved position, across a
rotation, and caught up after the collector was killed while a real ``gatewrap run`` wrote on."""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import time

import pytest

from conftest import ROOT, gatewrap_cmd, run_gatewrap
from fakenet.ca import make_pki
from gatewrap import audit_reader as ar
from gatewrap.audit_ship import FACILITIES, frame, parse_destination, rfc5424
from rsyslog import Rsyslog

POS = ar.Position(dev=1, ino=42, offset=100)
needs_rsyslog = pytest.mark.skipif(Rsyslog.binary() is None, reason="rsyslogd not installed (scripts/setup.sh test-deps)")


def _line(**rec) -> bytes:
    return json.dumps({"v": 1, "time": "2026-12-01T09:00:00.000000Z", **rec}, separators=(",", ":")).encode() + b"\n"


# (case, record fields, expected PRI, MSGID, STRUCTURED-DATA)
MESSAGE_CASES = [
    ("an allowed request is info", dict(run="gw-1", event="request", decision="allowed"),
     "<86>", "request", '[gatewrap@32473 run="gw-1" event="request" decision="allowed" ino="42" off="{off}"]'),
    ("a denial is a warning", dict(run="gw-1", event="request", decision="denied"),
     "<84>", "request", '[gatewrap@32473 run="gw-1" event="request" decision="denied" ino="42" off="{off}"]'),
    ("a kernel denial is a warning", dict(run="gw-1", event="direct_egress", decision="denied"),
     "<84>", "direct_egress", '[gatewrap@32473 run="gw-1" event="direct_egress" decision="denied" ino="42" off="{off}"]'),
    ("a failure is a notice", dict(run="gw-1", event="request", decision="failed"),
     "<85>", "request", '[gatewrap@32473 run="gw-1" event="request" decision="failed" ino="42" off="{off}"]'),
    ("a checkpoint is info and has no decision", dict(event="checkpoint", note="x"),
     "<86>", "checkpoint", '[gatewrap@32473 event="checkpoint" ino="42" off="{off}"]'),
    ("quote, backslash and bracket are escaped in a PARAM-VALUE (6.3.3)", dict(run='a"b\\c]d', event="run_start"),
     "<86>", "run_start", '[gatewrap@32473 run="a\\"b\\\\c\\]d" event="run_start" ino="42" off="{off}"]'),
    ("an event that is no MSGID is the NILVALUE", dict(event="a b"),
     "<86>", "-", '[gatewrap@32473 event="a b" ino="42" off="{off}"]'),
]


@pytest.mark.parametrize("fields,pri,msgid,sd", [c[1:] for c in MESSAGE_CASES], ids=[c[0] for c in MESSAGE_CASES])
def test_a_record_becomes_one_rfc5424_message(fields, pri, msgid, sd):
    line = _line(**fields)
    msg = rfc5424(line, json.loads(line), POS, "host1", FACILITIES["authpriv"])
    head = f"{pri}1 2026-12-01T09:00:00.000000Z host1 gatewrap - {msgid} {sd.format(off=100 - len(line))} "
    assert msg == head.encode() + line[:-1]


def test_a_line_that_is_not_json_is_shipped_as_it_is():
    msg = rfc5424(b"torn {\n", None, POS, "host1", FACILITIES["local3"])
    assert re.fullmatch(rb'<158>1 \S+Z host1 gatewrap - - \[gatewrap@32473 ino="42" off="93"\] torn \{', msg)


def test_frames_are_octet_counted():
    assert frame(b"<86>1 - - - - - - \xc3\xa9") == b"20 <86>1 - - - - - - \xc3\xa9"  # octets, not characters


@pytest.mark.parametrize("text,ok", [
    ("tcp://127.0.0.1:514", "tcp://127.0.0.1:514"), ("tls://logs.example.net:6514", "tls://logs.example.net:6514"),
    ("tcp://[::1]:514", "tcp://[::1]:514"), ("udp://127.0.0.1:514", None), ("tcp://127.0.0.1", None),
    ("127.0.0.1:514", None), ("tcp://127.0.0.1:99999", None), ("tcp://u@h:514", None),
])
def test_destinations(text, ok):
    if ok is None:
        with pytest.raises(ValueError, match="tcp://HOST:PORT or tls://HOST:PORT"):
            parse_destination(text)
    else:
        assert str(parse_destination(text)) == ok


def _ship(log, state, to, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd("audit", "ship", "--to", to, "--log", str(log), "--state", str(state),
                                       *args), capture_output=True, text=True, timeout=timeout)


def _first_line(p: subprocess.Popen, wait: float = 30) -> str:
    """The first line ``p`` writes to its stderr (a text pipe), waiting at most ``wait`` s
    (then killed: a test fails rather than hangs)."""
    if not select.select([p.stderr], [], [], wait)[0]:
        p.kill()
        pytest.fail(f"no line on stderr within {wait} s")
    return p.stderr.readline()


def _interrupt(p: subprocess.Popen, wait: float = 30) -> None:
    """Ctrl-C ``p`` and wait for it to end; killed (and the test failed) after ``wait`` s."""
    p.send_signal(signal.SIGINT)
    try:
        p.communicate(timeout=wait)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        pytest.fail(f"{p.args[2:5]} did not end within {wait} s of SIGINT")


def _local(log) -> list[str]:
    """The log's lines as rsyslog's MSG holds them (LF removed)."""
    return [ln.decode() for ln in log.read_bytes().split(b"\n")[:-1]]


def _assert_rfc5424(got: list[dict], lines: list[str]) -> None:
    """Every line arrived as an RFC 5424 message rsyslog parsed, with the JSON intact."""
    ours = [m for m in got if m["app"] == "gatewrap"]
    assert len(ours) == len(got), [m for m in got if m["app"] != "gatewrap"]
    for m in ours:
        assert (m["version"], m["facility"], m["procid"]) == ("1", "10", "-")
        assert m["sd"].startswith("[gatewrap@32473 ")
    by_msg = {m["msg"]: m for m in ours}
    for line in lines:
        m = by_msg[line]
        rec = json.loads(m["msg"])
        assert m["msgid"] == rec.get("event", "-")
        assert m["severity"] == ("4" if rec.get("decision") in ("denied", "rejected", "expired") else
                                 "5" if rec.get("decision") == "failed" else "6")
        if "run" in rec:
            assert f'run="{rec["run"]}"' in m["sd"]


@pytest.fixture
def rsyslog(tmp_path):
    servers: list[Rsyslog] = []

    def start(tls=None, text=None) -> Rsyslog:
        r = Rsyslog(tmp_path / f"rsyslog{len(servers)}", tls, text)
        servers.append(r)
        check = r.check()
        assert check.returncode == 0, check.stderr
        r.start()
        return r

    yield start
    for r in servers:
        r.stop()


def _synthetic(log, n: int, start: int = 0) -> None:
    with open(log, "ab") as f:
        for i in range(start, start + n):
            f.write(_line(run="gw-aaaaaaaaaa", event="request", decision=("allowed", "denied", "failed")[i % 3],
                          dst_host=f"h{i}.example", n=i))


@needs_rsyslog
def test_every_line_is_received_and_the_position_is_kept(tmp_path, rsyslog):
    r = rsyslog()
    log, state = tmp_path / "audit.jsonl", tmp_path / "ship.state"
    _synthetic(log, 50)
    with open(log, "ab") as f:  # a checkpoint ships like any record; so does a line that is not one
        f.write(_line(event="checkpoint", note="gatewrap.example/audit\n50\nAAAA=\n\n\u2014 key sig\n"))
        f.write(b"not a record ]\n")
        f.write(_line(run="gw-aaaaaaaaaa", event="request", decision="allowed", target="x" * 15000))
    p = _ship(log, state, f"tcp://127.0.0.1:{r.port}")
    assert p.returncode == 0, p.stderr
    assert "shipped 53 lines" in p.stderr
    _assert_rfc5424(r.wait_for(set(_local(log))), [x for x in _local(log) if x.startswith("{")])
    saved = json.loads(state.read_text())
    st = os.stat(log)
    assert (saved["dev"], saved["ino"], saved["offset"]) == (st.st_dev, st.st_ino, st.st_size)

    p = _ship(log, state, f"tcp://127.0.0.1:{r.port}")
    assert "shipped 0 lines" in p.stderr
    _synthetic(log, 5, start=100)
    p = _ship(log, state, f"tcp://127.0.0.1:{r.port}")
    assert "shipped 5 lines" in p.stderr
    got = r.wait_for(set(_local(log)))
    assert len(got) == len(_local(log)), "a line was sent twice without a failure"


@needs_rsyslog
def test_a_rotated_log_is_finished_before_the_new_one(tmp_path, rsyslog):
    r = rsyslog()
    log, state = tmp_path / "audit.jsonl", tmp_path / "ship.state"
    _synthetic(log, 10)
    assert _ship(log, state, f"tcp://127.0.0.1:{r.port}").returncode == 0
    _synthetic(log, 10, start=10)
    os.rename(log, tmp_path / "audit.jsonl.1")
    _synthetic(log, 10, start=20)
    p = _ship(log, state, f"tcp://127.0.0.1:{r.port}")
    assert "shipped 20 lines" in p.stderr and "was rotated" in p.stderr, p.stderr
    got = r.wait_for(set(_local(tmp_path / "audit.jsonl.1")) | set(_local(log)))
    assert len(got) == 30


@needs_rsyslog
def test_a_truncated_log_is_shipped_from_its_start(tmp_path, rsyslog):
    r = rsyslog()
    log, state = tmp_path / "audit.jsonl", tmp_path / "ship.state"
    _synthetic(log, 10)
    assert _ship(log, state, f"tcp://127.0.0.1:{r.port}").returncode == 0
    os.truncate(log, 0)
    _synthetic(log, 3, start=10)
    p = _ship(log, state, f"tcp://127.0.0.1:{r.port}")
    assert "shipped 3 lines" in p.stderr and "was truncated" in p.stderr, p.stderr
    assert len(r.wait_for(set(_local(log)))) == 13


@needs_rsyslog
def test_a_log_rewritten_in_place_past_the_position_is_shipped_from_its_start(tmp_path, rsyslog):
    r = rsyslog()
    log, state = tmp_path / "audit.jsonl", tmp_path / "ship.state"
    _synthetic(log, 10)
    assert _ship(log, state, f"tcp://127.0.0.1:{r.port}").returncode == 0
    ino = os.stat(log).st_ino
    os.truncate(log, 0)
    _synthetic(log, 20, start=100)  # the same file, longer than where shipping stopped
    assert os.stat(log).st_ino == ino
    p = _ship(log, state, f"tcp://127.0.0.1:{r.port}")
    assert "shipped 20 lines" in p.stderr and "no longer holds the line shipped last" in p.stderr, p.stderr
    assert len(r.wait_for(set(_local(log)))) == 30


@needs_rsyslog
def test_tls_to_rsyslog_with_a_trusted_ca(tmp_path, rsyslog):
    pki = make_pki(str(tmp_path), ["localhost"], ["127.0.0.1"])
    r = rsyslog(tls=(pki.ca_cert, pki.server_cert, pki.server_key))
    log, state = tmp_path / "audit.jsonl", tmp_path / "ship.state"
    _synthetic(log, 20)
    p = _ship(log, state, f"tls://127.0.0.1:{r.port}", "--ca", pki.ca_cert)
    assert p.returncode == 0 and "shipped 20 lines" in p.stderr, p.stderr
    _assert_rfc5424(r.wait_for(set(_local(log))), _local(log))


@needs_rsyslog
def test_tls_refuses_a_collector_it_does_not_trust_and_keeps_the_position(tmp_path, rsyslog):
    pki = make_pki(str(tmp_path), ["localhost"], ["127.0.0.1"])
    r = rsyslog(tls=(pki.ca_cert, pki.server_cert, pki.server_key))
    log, state = tmp_path / "audit.jsonl", tmp_path / "ship.state"
    _synthetic(log, 3)
    p = subprocess.Popen(gatewrap_cmd("audit", "ship", "--to", f"tls://127.0.0.1:{r.port}", "--log", str(log),
                                      "--state", str(state), "--retry-max", "0.5"),
                         stderr=subprocess.PIPE, text=True)
    line = _first_line(p)
    _interrupt(p)
    assert "certificate is not trusted" in line and "--ca FILE" in line, line
    assert not state.exists() and r.received() == []


@needs_rsyslog
def test_two_shippers_cannot_share_a_state_file(tmp_path, rsyslog):
    r = rsyslog()
    log, state = tmp_path / "audit.jsonl", tmp_path / "ship.state"
    _synthetic(log, 1)
    first = subprocess.Popen(gatewrap_cmd("audit", "ship", "--follow", "--to", f"tcp://127.0.0.1:{r.port}",
                                          "--log", str(log), "--state", str(state)), stderr=subprocess.DEVNULL)
    try:
        r.wait_for(set(_local(log)))
        p = _ship(log, state, f"tcp://127.0.0.1:{r.port}")
        assert p.returncode == 125 and "another `gatewrap audit ship` uses the state file" in p.stderr
    finally:
        _interrupt(first)


CONTRIB = ROOT / "contrib" / "collectors"


@needs_rsyslog
def test_the_imfile_config_passes_rsyslogs_check(tmp_path):
    p = subprocess.run([Rsyslog.binary(), "-N1", "-f", str(CONTRIB / "rsyslog-imfile.conf")],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr


@needs_rsyslog
def test_the_receiving_config_writes_each_hosts_log_back_byte_for_byte(tmp_path, rsyslog):
    """contrib/collectors/rsyslog-receive.conf, with this test's port, certificate and folder."""
    pki = make_pki(str(tmp_path), ["localhost"], ["127.0.0.1"])
    fleet = tmp_path / "fleet"
    text = (CONTRIB / "rsyslog-receive.conf").read_text()
    for old, new in [('port="6514"', 'port="{port}"'), ("/etc/rsyslog.d/tls/ca.pem", pki.ca_cert),
                     ("/etc/rsyslog.d/tls/collector.pem", pki.server_cert),
                     ("/etc/rsyslog.d/tls/collector.key", pki.server_key), ("/var/log/gatewrap-fleet", str(fleet)),
                     ('global(maxMessageSize="64k"', 'global(maxMessageSize="64k" workDirectory="{folder}"')]:
        assert old in text
        text = text.replace(old, new)
    r = rsyslog(text=text)
    log, state = tmp_path / "audit.jsonl", tmp_path / "ship.state"
    _synthetic(log, 30)
    with open(log, "ab") as f:
        f.write(_line(event="checkpoint", note="o\n30\nAAAA=\n\n\u2014 k s\n"))
        f.write(_line(run="gw-aaaaaaaaaa", event="direct_egress", decision="denied", comm="caf\u00e9 \\x1b[31m",
                      cmdline="y" * 12000))
        f.write('{"v":1,"event":"dns","dst_host":"b\u00fccher.test \\u001b"}\n'.encode())  # raw UTF-8
    p = _ship(log, state, f"tls://127.0.0.1:{r.port}", "--ca", pki.ca_cert, "--hostname", "host-a")
    assert p.returncode == 0, p.stderr
    copy = fleet / "host-a" / "audit.jsonl"
    deadline = time.monotonic() + 60
    while not (copy.exists() and copy.stat().st_size >= log.stat().st_size):
        assert time.monotonic() < deadline, "rsyslog did not write the host's log"
        time.sleep(0.1)
    assert copy.read_bytes() == log.read_bytes()


CURLS = ["/bin/sh", "-c", "curl -sS --max-time 10 -o /dev/null http://allowed.test/status/200; "
         "curl -sS --max-time 10 -o /dev/null http://denied.test/; "
         "curl -sS --max-time 10 -o /dev/null http://allowed.test/status/204"]


@pytest.mark.kernel
@needs_rsyslog
def test_the_shipper_catches_up_after_the_collector_was_killed(net, tmp_path, rsyslog):
    """Real runs write allowed and denied records; rsyslog gets them all; it is killed; more
    runs write on (the agent is not held up); rsyslog comes back on its port; every line
    arrives (duplicates allowed and counted)."""
    r = rsyslog()
    log, state, err = tmp_path / "audit.jsonl", tmp_path / "ship.state", tmp_path / "ship.stderr"
    for _ in range(2):
        run = run_gatewrap(net, log, CURLS, allow=["allowed.test"])
        assert run.returncode == 0, run.stderr
    events = {(x["event"], x.get("decision")) for x in run.audit()}
    assert {("request", "allowed"), ("request", "denied"), ("run_start", None), ("run_end", None)} <= events
    with open(err, "w") as e:
        shipper = subprocess.Popen(gatewrap_cmd("audit", "ship", "--follow", "--to", f"tcp://127.0.0.1:{r.port}",
                                                "--log", str(log), "--state", str(state), "--retry-max", "0.5"),
                                   stderr=e)
    try:
        _assert_rfc5424(r.wait_for(set(_local(log))), _local(log))
        before = len(_local(log))
        r.kill()
        for _ in range(2):
            run = run_gatewrap(net, log, CURLS, allow=["allowed.test"])
            assert run.returncode == 0, run.stderr
        assert len(_local(log)) > before
        deadline = time.monotonic() + 60
        while "retrying" not in err.read_text():
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
        r.start()
        got = r.wait_for(set(_local(log)))
        _assert_rfc5424(got, _local(log))
        msgs = [m["msg"] for m in got]
        duplicates = len(msgs) - len(set(msgs))
        print(f"{len(_local(log))} lines, {len(msgs)} received, {duplicates} duplicates")
        assert set(msgs) == set(_local(log))
        deadline = time.monotonic() + 30
        while "connected again" not in err.read_text():
            assert time.monotonic() < deadline, err.read_text()
            time.sleep(0.1)
    finally:
        _interrupt(shipper)
    assert shipper.returncode == 0, err.read_text()
    assert f"shipped {len(_local(log))} lines" in err.read_text(), err.read_text()
