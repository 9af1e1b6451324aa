"""``gatewrap audit`` on written logs: every filter alone and combined, the three formats,
escaping of hostile bytes, --follow through appends, truncation and rotation, and stats."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import pty
import select
import signal
import subprocess
import time
from pathlib import Path

import pytest

from conftest import gatewrap_cmd
from gatewrap import audit_reader as ar
from gatewrap.audit_format import CSV_FIELDS


def _gw(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(gatewrap_cmd(*args), capture_output=True, timeout=60, **kw)


def _rec(n: int, **fields) -> dict:
    """A record with a marker ``n`` (which test expectations name)."""
    return {"v": 1, "time": f"2026-12-01T09:00:{n:02d}.000000Z", "run": "gw-aaaaaaaaaa", "n": n, **fields}


#: The log the filter cases read: gate records, kernel denials, run records of two runs.
LOG = [
    _rec(0, event="run_start", argv=["/usr/bin/python3", "agent.py"], uid=1000),
    _rec(1, event="connect", decision="allowed", dst_host="api.github.com", dst_port=443, proto="connect"),
    _rec(2, event="request", decision="denied", dst_host="evil.example", dst_port=80, proto="http",
         reason="policy: default deny"),
    _rec(3, event="dns", decision="denied", dst_host="Paste.Example.NET", proto="dns"),
    _rec(4, event="direct_egress", decision="denied", pid=1234, comm="python3", dst_ip="198.51.100.148",
         dst_port=80, proto="tcp", hook="connect4"),
    _rec(5, run="gw-bbbbbbbbbb", event="direct_egress", decision="denied", pid=77, comm="curl",
         dst_ip="2001:db8::5", dst_port=443, proto="tcp", hook="connect6"),
    _rec(6, run="gw-bbbbbbbbbb", event="request", decision="failed", dst_host="github.com", dst_port=80,
         proto="http", error="upstream: connection refused"),
    _rec(7, event="connect", decision="allowed", dst_host="github.com", dst_port=443, proto="connect",
         inspected=True),
    _rec(8, event="request", decision="allowed", dst_host="github.com", dst_port=443, proto="https",
         method="GET"),
    _rec(9, event="run_end", exit_code=0, allowed=2, denied=2, failed=0, direct_egress=1),
]

FILTER_CASES = [
    ("no filter shows every record", [], list(range(10))),
    ("--run keeps that run's records", ["--run", "gw-bbbbbbbbbb"], [5, 6]),
    ("--event keeps that event", ["--event", "direct_egress"], [4, 5]),
    ("--event repeated is a choice", ["--event", "run_start", "--event", "run_end"], [0, 9]),
    ("--decision keeps that decision", ["--decision", "failed"], [6]),
    ("--denied keeps the denials of gate and kernel", ["--denied"], [2, 3, 4, 5]),
    ("--host exact", ["--host", "github.com"], [6, 7, 8]),
    ("--host glob of subdomains only", ["--host", "*.github.com"], [1]),
    ("--host matches case-insensitively", ["--host", "paste.example.net"], [3]),
    ("--host glob on a kernel denial's IP", ["--host", "198.51.100.1??"], [4]),
    ("--host with a bracketed IPv6 address", ["--host", "[2001:db8::5]"], [5]),
    ("--since includes its own second", ["--since", "2026-12-01T09:00:07Z"], [7, 8, 9]),
    ("--until includes its own second", ["--until", "2026-12-01T09:00:01Z"], [0, 1]),
    ("--since with an offset is converted to UTC", ["--since", "2026-12-01T10:00:08+01:00"], [8, 9]),
    ("--pid keeps that process's records", ["--pid", "1234"], [4]),
    ("--pid of no record shows nothing", ["--pid", "12"], []),
    ("--run and --denied combine", ["--run", "gw-aaaaaaaaaa", "--denied"], [2, 3, 4]),
    ("--denied and --host combine", ["--denied", "--host", "*.example"], [2]),
    ("--event, --decision and --host combine", ["--event", "request", "--decision", "allowed", "--host", "github.com"], [8]),
    ("--since and --until make a window", ["--since", "2026-12-01T09:00:03Z", "--until", "2026-12-01T09:00:05Z"], [3, 4, 5]),
    ("--decision outside --denied's set combines to nothing", ["--denied", "--decision", "allowed"], []),
    ("every filter at once", ["--run", "gw-aaaaaaaaaa", "--event", "direct_egress", "--denied", "--host", "198.51.100.148",
                              "--since", "2026-12-01T09:00:04Z", "--until", "2026-12-01T09:00:04Z", "--pid", "1234"], [4]),
]


@pytest.fixture
def log(tmp_path):
    path = tmp_path / "audit.jsonl"
    # half compact as the gate writes, half as Python's json.dumps spaces it: the prefilter
    # must find values in both
    path.write_text("".join((json.dumps(r, separators=(",", ":")) if r["n"] % 2 else json.dumps(r)) + "\n"
                            for r in LOG))
    return path


@pytest.mark.parametrize("args,expected", [c[1:] for c in FILTER_CASES], ids=[c[0] for c in FILTER_CASES])
def test_filters_alone_and_combined(log, args, expected):
    p = _gw("audit", *args, "--json", "--log", str(log))
    assert p.returncode == 0, p.stderr
    assert [json.loads(line)["n"] for line in p.stdout.splitlines()] == expected
    if not expected:
        assert b"no matching records" in p.stderr


def test_event_takes_the_schemas_events_and_refuses_others(log):
    """--event's choices are the schema's event enum (schema/audit.schema.json), approval_* too:
    a misspelt event is a usage error naming the choices, not a filter that matches nothing."""
    schema = json.loads((Path(__file__).resolve().parents[1] / "schema" / "audit.schema.json").read_text())
    events = schema["properties"]["event"]["enum"]
    assert "approval_asked" in events
    helped = _gw("audit", "--help", text=True).stdout
    assert all(e in " ".join(helped.split()) for e in events)
    p = _gw("audit", "--event", "approval_asked", "--json", "--log", str(log))
    assert p.returncode == 0 and p.stdout == b""
    bad = _gw("audit", "--event", "direct-egress", "--log", str(log), text=True)
    assert bad.returncode == 125 and "'direct-egress' is not one of" in bad.stderr and "approval_sent" in bad.stderr


def test_relative_since_counts_back_from_now(tmp_path):
    now = dt.datetime.now(dt.timezone.utc)
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps({"v": 1, "time": ar.stamp(now - dt.timedelta(minutes=m)), "run": "gw-a",
                                       "event": "request", "decision": "denied", "n": m}) + "\n" for m in (150, 90, 20, 5)))
    got = {a: [json.loads(x)["n"] for x in _gw("audit", "--since", a, "--log", str(log)).stdout.splitlines()]
           for a in ("10m", "2h", "1.5h", "1d")}
    assert got == {"10m": [5], "2h": [90, 20, 5], "1.5h": [20, 5], "1d": [150, 90, 20, 5]}


@pytest.mark.parametrize("text,expected", [
    ("2026-12-01T09:30:00Z", "2026-12-01T09:30:00.000000Z"),
    ("2026-12-01T09:30:00.5+02:00", "2026-12-01T07:30:00.500000Z"),
    ("2026-12-01", None),  # local midnight: checked against the local zone below
], ids=["UTC with Z", "an offset becomes UTC", "a date is local midnight"])
def test_iso_times_become_log_stamps(text, expected):
    got = ar.parse_time(text)
    want = expected or ar.stamp(dt.datetime(2026, 12, 1).astimezone())
    assert got == want


def test_a_bad_time_exits_125_and_shows_both_forms(log):
    p = _gw("audit", "--since", "yesterday", "--log", str(log))
    assert p.returncode == 125
    assert b"'yesterday' is not a time" in p.stderr and b"10m" in p.stderr and b"Traceback" not in p.stderr


HOSTILE = (b'{"v":1,"time":"2026-12-01T09:00:00.000000Z","run":"gw-evil","event":"direct_egress",'
           b'"decision":"denied","pid":9,"comm":"x\\u001b[2Jy del\x7f csi\xc2\x9b31m bad\xff\xfe end",'
           b'"cmdline":"del\x7f csi\xc2\x9b31m bad\xff\xfe end",'
           b'"dst_ip":"198.51.100.137","dst_port":80,"proto":"tcp","hook":"connect4"}\n')


def _no_raw_controls(out: bytes) -> None:
    text = out.decode("utf-8", "surrogateescape")
    bad = [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f or 0xdc80 <= ord(c) <= 0xdcff)]
    assert not bad, bad


def test_the_table_escapes_c0_del_c1_and_bytes_that_are_not_utf8(tmp_path):
    log = tmp_path / "audit.jsonl"
    log.write_bytes(HOSTILE)
    p = _gw("audit", "--format", "table", "--log", str(log))
    assert p.returncode == 0, p.stderr
    _no_raw_controls(p.stdout)
    for shown in (rb"x\x1b[2Jy", rb"del\x7f", rb"csi\x9b31m", rb"bad\xff\xfe end"):
        assert shown in p.stdout, p.stdout


def test_csv_has_a_header_and_escapes_cells_and_formulas(tmp_path, log):
    p = _gw("audit", "--format", "csv", "--run", "gw-bbbbbbbbbb", "--log", str(log))
    rows = list(csv.reader(io.StringIO(p.stdout.decode())))
    assert rows[0] == list(CSV_FIELDS)
    assert [dict(zip(rows[0], r))["dst_ip"] for r in rows[1:]] == ["2001:db8::5", ""]
    assert dict(zip(rows[0], rows[2]))["error"] == "upstream: connection refused"
    hostile = tmp_path / "hostile.jsonl"
    hostile.write_bytes(HOSTILE + json.dumps({"v": 1, "run": "gw-f", "event": "direct_egress", "decision": "denied",
                                              "cmdline": "=HYPERLINK(\"http://x\")"}).encode() + b"\n")
    p = _gw("audit", "--format", "csv", "--log", str(hostile))
    _no_raw_controls(p.stdout)
    rows = [dict(zip(CSV_FIELDS, r)) for r in list(csv.reader(io.StringIO(p.stdout.decode())))[1:]]
    assert rows[0]["cmdline"] == r"del\x7f csi\x9b31m bad\xff\xfe end" and rows[0]["pid"] == "9"
    assert rows[1]["cmdline"] == "'=HYPERLINK(\"http://x\")"


def test_json_lines_pass_ascii_lines_as_written_and_reencode_the_rest(tmp_path, log):
    p = _gw("audit", "--json", "--log", str(log))
    assert p.stdout == log.read_bytes()
    hostile = tmp_path / "hostile.jsonl"
    hostile.write_bytes(HOSTILE)
    p = _gw("audit", "--format", "json", "--log", str(hostile))
    assert p.stdout.isascii() and b"\x7f" not in p.stdout
    rec = json.loads(p.stdout)
    assert rec["cmdline"] == "del\x7f csi\x9b31m bad\udcff\udcfe end"
    assert rec["comm"] == "x\x1b[2Jy del\x7f csi\x9b31m bad\udcff\udcfe end"


def test_the_default_format_is_a_table_on_a_terminal_and_json_lines_otherwise(log):
    piped = _gw("audit", "--run", "gw-bbbbbbbbbb", "--log", str(log))
    assert [json.loads(line)["n"] for line in piped.stdout.splitlines()] == [5, 6]
    main, child = pty.openpty()
    p = subprocess.Popen(gatewrap_cmd("audit", "--run", "gw-bbbbbbbbbb", "--log", str(log)), stdout=child,
                         stderr=subprocess.PIPE)
    os.close(child)
    out = b""
    while True:
        try:
            chunk = os.read(main, 4096)
        except OSError:  # EIO: the writer closed the terminal
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert p.wait(timeout=60) == 0
    lines = out.decode().splitlines()
    assert lines[0].startswith("TIME") and len(lines) == 3 and "[2001:db8::5]:443" in lines[1]


def test_a_torn_line_is_reported_even_when_filters_rule_it_out(tmp_path, log):
    log.write_bytes(log.read_bytes() + b'{"v":1,"run":"gw-zz","eve\n' + b'{"v":1,"run":"gw-zz"}\n')
    p = _gw("audit", "--run", "gw-bbbbbbbbbb", "--log", str(log))
    assert [json.loads(line)["n"] for line in p.stdout.splitlines()] == [5, 6]
    assert f"{log}:11: not a JSON record".encode() in p.stderr and b":12:" not in p.stderr


class Follower:
    """``gatewrap audit --follow --json`` on a log, read line by line; its stderr goes to a file."""

    def __init__(self, log, *args: str) -> None:
        self.err_path = f"{log}.follow-err"
        with open(self.err_path, "wb") as err:
            self.p = subprocess.Popen(gatewrap_cmd("audit", "--follow", "--json", *args, "--log", str(log)),
                                      stdout=subprocess.PIPE, stderr=err)
        self._buf = b""

    def next_n(self, wait: float = 30.0) -> int:
        """The marker of the next record printed (fails after ``wait`` seconds without one)."""
        deadline = time.monotonic() + wait
        while b"\n" not in self._buf:
            left = deadline - time.monotonic()
            assert left > 0, f"no record within {wait} s; stderr: {self.stderr()}"
            if select.select([self.p.stdout], [], [], left)[0]:
                chunk = os.read(self.p.stdout.fileno(), 65536)
                assert chunk, f"--follow ended: {self.stderr()}"
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        return json.loads(line)["n"]

    def stderr(self) -> bytes:
        with open(self.err_path, "rb") as f:
            return f.read()

    def wait_stderr(self, needle: bytes, wait: float = 30.0) -> None:
        """Wait until stderr says ``needle`` (fails after ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        while needle not in self.stderr():
            assert time.monotonic() < deadline, f"stderr never said {needle!r}: {self.stderr()!r}"
            time.sleep(0.05)

    def interrupt(self) -> tuple[int, bytes]:
        self.p.send_signal(signal.SIGINT)
        code = self.p.wait(timeout=30)
        return code, self.stderr()

    def close(self) -> None:
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
        self.p.stdout.close()


def _append(path, *recs: dict) -> None:
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in recs))


@pytest.fixture
def follower(log):
    started = []

    def start(*args: str) -> Follower:
        started.append(Follower(log, *args))
        return started[-1]

    yield start
    for f in started:
        f.close()


def test_follow_prints_appended_lines_and_a_line_written_in_two_parts(log, follower):
    f = follower("--denied")
    assert [f.next_n() for _ in range(4)] == [2, 3, 4, 5]
    _append(log, _rec(20, event="request", decision="allowed"), _rec(21, event="request", decision="denied"))
    assert f.next_n() == 21
    line = json.dumps(_rec(22, event="dns", decision="denied")).encode() + b"\n"
    with open(log, "ab") as out:
        out.write(line[:30])
        out.flush()
        time.sleep(ar.POLL * 3)  # the reader meets the half line at its end first
        out.write(line[30:])
    assert f.next_n() == 22


def test_follow_survives_truncation_and_rotation(log, follower):
    f = follower("--run", "gw-aaaaaaaaaa")
    assert [f.next_n() for _ in range(8)] == [0, 1, 2, 3, 4, 7, 8, 9]
    with open(log, "w"):
        pass  # truncated, as logrotate's copytruncate does
    f.wait_stderr(b"was truncated")
    _append(log, _rec(30, event="run_start"))
    assert f.next_n() == 30
    os.rename(log, f"{log}.1")  # rotated: what the old file still gets is read, then the new file
    _append(f"{log}.1", _rec(31, event="run_end"))
    _append(log, _rec(32, event="run_start"))
    assert [f.next_n(), f.next_n()] == [31, 32]
    code, err = f.interrupt()
    assert code == 0 and b"Traceback" not in err, err
    assert f"{log} was truncated".encode() in err and f"{log} was rotated".encode() in err, err


def test_follow_ends_cleanly_on_ctrl_c(log, follower):
    f = follower()
    assert f.next_n() == 0
    code, err = f.interrupt()
    assert code == 0 and b"Traceback" not in err, err


def test_stats_counts_each_run_and_the_most_denied_destinations(log):
    _append(log, _rec(40, event="request", decision="denied", dst_host="evil.example", dst_port=80, proto="http"))
    p = _gw("audit", "stats", "--json", "--log", str(log))
    assert p.returncode == 0, p.stderr
    s = json.loads(p.stdout)
    runs = {r["run"]: r for r in s["runs"]}
    assert {k: runs["gw-aaaaaaaaaa"][k] for k in ("allowed", "denied", "direct_egress", "failed", "exit_code")} == {
        "allowed": 2, "denied": 3, "direct_egress": 1, "failed": 0, "exit_code": 0}
    assert {k: runs["gw-bbbbbbbbbb"][k] for k in ("allowed", "denied", "direct_egress", "failed", "exit_code")} == {
        "allowed": 0, "denied": 0, "direct_egress": 1, "failed": 1, "exit_code": None}
    assert s["top_denied"][0] == {"destination": "http evil.example:80", "count": 2}
    assert {d["destination"]: d["count"] for d in s["top_denied"][1:]} == {
        "dns Paste.Example.NET": 1, "tcp 198.51.100.148:80": 1, "tcp [2001:db8::5]:443": 1}
    p = _gw("audit", "stats", "--run", "gw-bbbbbbbbbb", "--top", "1", "--log", str(log))
    lines = p.stdout.decode().splitlines()
    assert lines[0].split()[:7] == ["RUN", "ALLOWED", "DENIED", "DIRECT", "FAILED", "UNSENT", "HELD"]
    assert lines[1].split() == ["gw-bbbbbbbbbb", "0", "0", "1", "1", "0", "0", "running", "or", "died"]
    assert lines[-1].split() == ["1", "tcp", "[2001:db8::5]:443"]


def test_stats_sum_the_gates_folded_denials_and_count_unsent_requests_apart(log):
    run = {"run": "gw-cccccccccc", "event": "request", "dst_host": "flood.example", "dst_port": 80, "proto": "http"}
    _append(log, _rec(41, **run, decision="denied", reason="policy: default deny"),
            _rec(42, **run, decision="denied", reason="policy: default deny", count=4999,
                 first_seen="2026-12-01T09:00:41.000000Z", last_seen="2026-12-01T09:00:42.000000Z"),
            _rec(43, **run, decision="failed", error="internal: cannot write audit log /l: No space left on device"))
    s = json.loads(_gw("audit", "stats", "--json", "--run", "gw-cccccccccc", "--log", str(log)).stdout)
    (c,) = s["runs"]
    assert (c["denied"], c["failed"], c["unsent"]) == (5000, 0, 1), c
    assert s["top_denied"] == [{"destination": "http flood.example:80", "count": 5000}]
    table = _gw("audit", "--format", "table", "--run", "gw-cccccccccc", "--log", str(log)).stdout.decode()
    assert "×4999 attempts" in table, table


def test_the_reader_streams_a_log_from_an_offset(log):
    offset = sum(len(line) for line in log.read_bytes().splitlines(keepends=True)[:6])
    assert [r["n"] for _, r in ar.entries(str(log), offset=offset)] == [6, 7, 8, 9]


def test_options_of_audit_before_stats_are_refused_not_ignored(log):
    p = _gw("audit", "--run", "gw-aaaaaaaaaa", "stats", "--log", str(log))
    assert p.returncode == 125 and b"--run: options of `gatewrap audit stats` go after it" in p.stderr, p.stderr


@pytest.mark.parametrize("glob,expected", [
    ("[ae]vil.example", [2]),
    ("*[.]github.com", [1]),
    ("g?thub.com", [6, 7, 8]),
], ids=["a character class", "a class next to a star", "a question mark"])
def test_host_globs_with_classes_are_matched_not_prefiltered_away(log, glob, expected):
    p = _gw("audit", "--host", glob, "--log", str(log))
    assert [json.loads(line)["n"] for line in p.stdout.splitlines()] == expected


def test_stats_count_denials_beyond_the_destination_bound_together(monkeypatch):
    from gatewrap import audit_stats

    monkeypatch.setattr(audit_stats, "MAX_DESTINATIONS", 2)
    s = audit_stats.stats({"run": "gw-a", "event": "dns", "decision": "denied", "proto": "dns", "dst_host": h}
                          for h in ("a.test", "b.test", "c.test", "a.test", "d.test"))
    rec = s.as_record(10)
    assert rec["top_denied"] == [{"destination": "dns a.test", "count": 2}, {"destination": "dns b.test", "count": 1}]
    assert rec["other_denied"] == 2 and rec["runs"][0]["denied"] == 5


def test_a_closed_pipe_ends_the_reader_quietly(log):
    data = log.read_bytes()
    log.write_bytes(data * 2000)
    p = subprocess.run(" ".join(gatewrap_cmd("audit", "--json", "--log", str(log))) + " | head -n 1",
                       shell=True, capture_output=True, timeout=60)
    assert p.stdout.count(b"\n") == 1 and b"Traceback" not in p.stderr and b"BrokenPipe" not in p.stderr, p.stderr


def test_stats_count_a_folded_kernel_denial_as_its_attempts():
    from gatewrap import audit_stats

    folded = {"run": "gw-a", "event": "direct_egress", "decision": "denied", "proto": "tcp",
              "dst_ip": "198.51.100.148", "dst_port": 80, "count": 50000}
    s = audit_stats.stats([folded, {**folded, "count": 1}, {**folded, "count": "junk"}])
    rec = s.as_record(10)
    assert rec["runs"][0]["direct_egress"] == 50002
    assert rec["top_denied"] == [{"destination": "tcp 198.51.100.148:80", "count": 50002}]


def test_stats_give_checkpoints_no_row_of_their_own():
    from gatewrap import audit_stats

    s = audit_stats.stats([{"run": "gw-a", "event": "run_start", "time": "2026-12-02T07:01:55Z"},
                           {"event": "checkpoint", "size": 1, "note": "host/gatewrap-audit\n1\n..."},
                           {"run": "gw-a", "event": "run_end", "exit_code": 0}])
    assert [r["run"] for r in s.as_record(10)["runs"]] == ["gw-a"]
    assert not any("running or died" in line for line in s.lines(10))


#: What the gate writes for a plain-http denial (its client found in the run's cgroup) and
#: for a request answered 409 while its approval waits (hold = "return").
GATE_DENIAL = {"run": "gw-dddddddddd", "event": "request", "decision": "denied", "reason": "policy: default deny",
               "client": "127.0.0.1:43346", "client_pid": 4242, "client_comm": "curl", "method": "POST",
               "target": "http://evil.example/v1/upload?token=sk-1", "dst_host": "evil.example", "dst_port": 80,
               "proto": "http", "status": 403}
HELD_409 = {"run": "gw-dddddddddd", "event": "request", "decision": "denied",
            "reason": "ask: held for approval ap-eo3rba5qnzc2mfdbakhc (hold = return)", "client_pid": 4243,
            "client_comm": "curl", "method": "POST", "target": "http://api.example/v1/send",
            "dst_host": "api.example", "dst_port": 80, "proto": "http", "status": 409,
            "approval": "ap-eo3rba5qnzc2mfdbakhc"}


def test_the_table_shows_a_requests_path_and_the_gates_client_process(log):
    _append(log, _rec(50, **GATE_DENIAL))
    table = _gw("audit", "--format", "table", "--run", "gw-dddddddddd", "--log", str(log)).stdout.decode()
    (row,) = table.splitlines()[1:]
    assert "http evil.example:80/v1/upload?…" in row and "sk-1" not in row, row
    assert "POST -> 403; pid 4242 curl; policy: default deny" in row, row
    inspected = _gw("audit", "--format", "table", "--run", "gw-aaaaaaaaaa", "--event", "request", "--log", str(log))
    assert "https github.com:443" in inspected.stdout.decode()  # no target: no path, nothing made up


def test_csv_names_the_gates_client_process_in_pid_and_comm(log):
    _append(log, _rec(51, **GATE_DENIAL))
    p = _gw("audit", "--format", "csv", "--run", "gw-dddddddddd", "--log", str(log))
    (row,) = [dict(zip(CSV_FIELDS, r)) for r in list(csv.reader(io.StringIO(p.stdout.decode())))[1:]]
    assert (row["pid"], row["comm"], row["target"]) == ("4242", "curl", "http://evil.example/v1/upload?token=sk-1")


def test_pid_matches_the_kernels_pid_and_the_gates_client_pid(log):
    _append(log, _rec(52, **GATE_DENIAL))
    for pid, expected in (("4242", [52]), ("1234", [4]), ("42", [])):
        p = _gw("audit", "--pid", pid, "--json", "--log", str(log))
        assert [json.loads(line)["n"] for line in p.stdout.splitlines()] == expected, pid


def test_stats_count_a_request_held_with_hold_return_as_held_not_denied(log):
    # The 409 of a retry after the approved request was sent once waits for nothing: denied,
    # as the gate's own counts say (run_end).
    sent_once = {**HELD_409, "reason": "ask: approval ap-eo3rba5qnzc2mfdbakhc already sent once (at most once)"}
    _append(log, _rec(53, **GATE_DENIAL), _rec(54, **HELD_409), _rec(55, **HELD_409), _rec(56, **sent_once))
    s = json.loads(_gw("audit", "stats", "--json", "--run", "gw-dddddddddd", "--log", str(log)).stdout)
    (c,) = s["runs"]
    assert (c["denied"], c["held"]) == (2, 2), c
    assert s["top_denied"] == [{"destination": "http evil.example:80/v1/upload?…", "count": 1},
                               {"destination": "http api.example:80/v1/send", "count": 1}]


#: Two container runs whose ids share the 12 characters docker ps shows, and two of gatewrap run's.
CONTAINER_A, CONTAINER_B = "gw-9a109c573f51" + "a" * 52, "gw-9a109c573f51" + "b" * 52
#: (run, markers): the first run's records are in a rotated segment, the others in the live file.
RUNS_LOG = [("gw-aaaaaaaaaa", [0, 1]), (CONTAINER_A, [2, 3]), ("gw-bbbbbbbbbb", [4]), (CONTAINER_B, [5, 6])]


@pytest.fixture
def runs_log(tmp_path):
    path = tmp_path / "audit.jsonl"
    lines = [(json.dumps(r, separators=(",", ":")) if n % 2 else json.dumps(r)) + "\n"
             for run, ns in RUNS_LOG for n in ns for r in [_rec(n, run=run, event="request", decision="allowed")]]
    Path(ar.segment_path(str(path), 1)).write_text("".join(lines[:2]))
    path.write_text("".join(lines[2:]))
    return path


RUN_START_CASES = [
    ("a whole run id", "gw-aaaaaaaaaa", [0, 1], "gw-aaaaaaaaaa"),
    ("a whole container's run id", CONTAINER_B, [5, 6], CONTAINER_B),
    ("a start of one run's id, in a rotated segment", "gw-aaaa", [0, 1], "gw-aaaaaaaaaa"),
    ("a start of one run's id", "gw-bbb", [4], "gw-bbbbbbbbbb"),
    ("the container's id as far as it is one run's, without gw-", "9a109c573f51a", [2, 3], CONTAINER_A),
    ("the same with gw-", "gw-9a109c573f51b", [5, 6], CONTAINER_B),
    ("a start of no run's id: no records", "gw-ffff", [], None),
    ("too short to be a start: a whole id, of no run", "gw-", [], None),
]


@pytest.mark.parametrize("given,expected,run", [c[1:] for c in RUN_START_CASES], ids=[c[0] for c in RUN_START_CASES])
def test_run_takes_a_unique_start_of_a_run_id_as_gatewrap_stop_does(runs_log, given, expected, run):
    p = _gw("audit", "--run", given, "--json", "--log", str(runs_log))
    assert p.returncode == 0, p.stderr
    assert [json.loads(line)["n"] for line in p.stdout.splitlines()] == expected
    stats = json.loads(_gw("audit", "stats", "--json", "--run", given, "--log", str(runs_log)).stdout)
    assert [r["run"] for r in stats["runs"]] == ([run] if run else [])


@pytest.mark.parametrize("given", ["9a109c573f51", "gw-9a109c573f51"], ids=["without gw-", "with gw-"])
def test_a_start_of_two_runs_ids_is_a_usage_error_that_lists_them(runs_log, given):
    for cmd in (["audit"], ["audit", "stats"]):
        p = _gw(*cmd, "--run", given, "--json", "--log", str(runs_log), text=True)
        assert p.returncode == 125 and p.stdout == "", p.stderr
        said = " ".join(p.stderr.split())
        assert f"{given} starts the id of more than one run in {runs_log} ({CONTAINER_A}, {CONTAINER_B}): give more of it" in said


@pytest.mark.parametrize("block", [2, 5, 13, 64, 1 << 20])
def test_the_search_for_a_start_finds_ids_and_keys_across_block_ends(runs_log, monkeypatch, block):
    monkeypatch.setattr(ar, "BUFFER", block)
    assert ar.runs_starting(str(runs_log), "gw-") == sorted(run for run, _ in RUNS_LOG)
    assert ar.runs_starting(str(runs_log), "gw-9a109c573f51") == [CONTAINER_A, CONTAINER_B]
    assert ar.runs_starting(str(runs_log), "gw-9a109c573f51", most=1) in ([CONTAINER_A], [CONTAINER_B])
    assert ar.runs_starting(str(runs_log), "gw-aaaa") == ["gw-aaaaaaaaaa"]  # in the rotated segment
    assert ar.runs_starting(str(runs_log), "n") == []  # a key of another name


CONTAINER_RUN = "gw-9a109c573f51" + "c" * 52


def test_a_containers_run_id_keeps_the_table_columns_under_their_heads_shortened_as_ps_does(tmp_path):
    """A container's run id (gw- and 64 characters, gatewrap-oci) beside a gatewrap run's:
    both tables show it as gatewrap ps does (gw- and 12 characters; --no-trunc whole) and
    every column stays under its head."""
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(_rec(n, run=run, event="direct_egress", decision="denied", pid=7, comm="curl",
                                           dst_ip="198.51.100.148", dst_port=80, proto="tcp", hook="connect4")) + "\n"
                           for n, run in enumerate(["gw-aaaaaaaaaa", CONTAINER_RUN])))
    for cmd, flags, shown, heads in [
            (["audit", "--format", "table"], [], "gw-9a109c573f51", ["EVENT", "DECISION", "DESTINATION"]),
            (["audit", "--format", "table"], ["--no-trunc"], CONTAINER_RUN, ["EVENT", "DECISION", "DESTINATION"]),
            (["audit", "stats"], [], "gw-9a109c573f51", ["ALLOWED", "HELD"]),
            (["audit", "stats"], ["--no-trunc"], CONTAINER_RUN, ["ALLOWED", "HELD"])]:
        p = _gw(*cmd, *flags, "--log", str(log))
        assert p.returncode == 0, p.stderr
        header, *rows = p.stdout.decode().splitlines()[:3]
        assert [r.split()[0 if cmd[-1] == "stats" else 1] for r in rows] == ["gw-aaaaaaaaaa", shown], (flags, rows)
        for head in heads:
            at = header.index(head)
            for r in rows:  # each column starts (left-aligned) or ends (right-aligned) where its head does
                if head in ("ALLOWED", "HELD"):
                    end = at + len(head)
                    assert r[end - 1] != " " and r[end:end + 1] in (" ", ""), (cmd, flags, header, r)
                else:
                    assert r[at - 1] == " " and r[at] != " ", (cmd, flags, header, r)


def test_the_tables_columns_hold_the_longest_event_and_decision_the_schema_names(tmp_path):
    """A unix socket's ``attempted`` (9 characters) and an ``approval_cancelled`` (18) beside
    short ones: every row's columns start under their heads, so DECISION and EVENT are as
    wide as the longest the schema names, and the --decision choices are the schema's."""
    log = tmp_path / "audit.jsonl"
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        _rec(0, event="unix_socket", decision="attempted", pid=7, comm="curl", path="/run/x\x1b[2J.sock",
             hook="unix_connect"),
        _rec(1, event="dns", decision="denied", dst_host="a.test", proto="dns"),
        _rec(2, event="approval_cancelled", approval="ap-" + "a" * 20, rule="r", reason="the run ended"),
        _rec(3, event="request", decision="failed", dst_host="b.test", dst_port=80, proto="http", error="upstream")]))
    p = _gw("audit", "--format", "table", "--log", str(log))
    assert p.returncode == 0, p.stderr
    header, *rows = p.stdout.decode().splitlines()
    assert len(rows) == 4 and "\\x1b[2J" in rows[0], rows  # still escaped
    for head in ("EVENT", "DECISION", "DESTINATION"):
        at = header.index(head)
        for r in rows:
            assert r[at - 1] == " " and r[at] != " ", (head, header, r)
    assert [r.split()[2:4] for r in rows] == [["unix_socket", "attempted"], ["dns", "denied"],
                                              ["approval_cancelled", "-"], ["request", "failed"]], rows
    from gatewrap import audit_schema

    assert audit_schema.decisions() == ("allowed", "denied", "failed", "attempted")


def test_the_tables_admit_row_says_it_precedes_the_dial_whose_row_run_end_counts(tmp_path):
    """One https fetch is two rows, admit (before the dial) and connect (its outcome), beside a
    run_end saying "1 allowed": the admit row says it is not the one counted."""
    log = tmp_path / "audit.jsonl"
    fetch = {"decision": "allowed", "dst_host": "allowed.test", "dst_port": 443, "proto": "connect",
             "reason": "policy: rule --allow allowed.test"}
    log.write_text("".join(json.dumps(r) + "\n" for r in [
        _rec(0, event="admit", **fetch), _rec(1, event="connect", **fetch, status=200),
        _rec(2, event="admit", **{**fetch, "proto": "http", "dst_port": 80}),
        _rec(3, event="request", **{**fetch, "proto": "http", "dst_port": 80}, method="GET", status=200),
        _rec(4, event="run_end", exit_code=0, allowed=2, denied=0, failed=0, direct_egress=0)]))
    rows = _gw("audit", "--format", "table", "--log", str(log)).stdout.decode().splitlines()[1:]
    why = [r.split(None, 6)[6] for r in rows[:4]]  # time, run, event, decision, proto, host:port, who / why
    assert why[0] == "before the dial (counted in its connect row); policy: rule --allow allowed.test", why
    assert why[1] == "policy: rule --allow allowed.test", why
    assert why[2] == "before the dial (counted in its request row); policy: rule --allow allowed.test", why
    assert rows[4].endswith("exit 0: 2 allowed, 0 denied, 0 failed, 0 direct egress blocked"), rows[4]
