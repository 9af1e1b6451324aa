"""The audit record: schema/audit.schema.json says what a record may hold (every record a
test's gatewrap run writes is checked against it, see conftest.py); these tests check the
schema itself, who a record names, and what a record says about a request that half left."""

from __future__ import annotations

import json
import os

import pytest

from conftest import invalid_audit_records
from rawproxy import READ_ANSWER

T = "2026-11-29T09:16:42.123456Z"
HEAD = {"v": 1, "time": T, "run": "gw-0123456789"}
PREV = "ab" * 32  # the chain writer's: 64 hex digits (gate_core/src/audit/chain.rs)

SCHEMA_CASES = [
    # (case, record, valid)
    ("a run_start", {"event": "run_start", "argv": ["true"], "uid": 0, "cgroup_id": 7, "gate": "http://127.0.0.1:3128"}, True),
    ("gc's run_end", {"event": "run_end", "reason": "gatewrap died", "direct_egress": 0, "lost_events": 2}, True),
    ("an admit", {"event": "admit", "decision": "allowed", "proto": "http", "dst_host": "a.test", "dst_port": 80}, True),
    ("an admit with an outcome", {"event": "admit", "decision": "allowed", "proto": "http", "status": 200}, False),
    ("a request with a client pid", {"event": "request", "decision": "allowed", "proto": "http", "client_pid": 5, "client_comm": "curl"}, True),
    ("a request whose client was not found", {"event": "request", "decision": "denied", "proto": "http", "client_pid": None}, True),
    ("a request whose response had the secret masked", {"event": "request", "decision": "allowed", "proto": "http",
                                                         "secret": "github", "redacted": 2}, True),
    ("a request with no mask counted as 0", {"event": "request", "decision": "allowed", "proto": "http", "redacted": 0}, False),
    ("a request with a port out of range", {"event": "request", "decision": "denied", "proto": "http", "dst_port": 70000}, False),
    ("a request with a field nobody writes", {"event": "request", "decision": "denied", "proto": "http", "colour": "red"}, False),
    ("a connect with proto http", {"event": "connect", "decision": "denied", "proto": "http"}, False),
    ("a folded direct_egress", {"event": "direct_egress", "decision": "denied", "reason": "kernel: not the gate", "count": 3,
                                "first_seen": T, "last_seen": T, "pid": 9, "tid": 9, "uid": 0, "comm": "sh", "exe": "/bin/sh",
                                "parents": [{"pid": 8, "comm": "nsjail"}], "dst_ip": "192.0.2.1", "dst_port": 7,
                                "proto": "tcp", "family": "ipv4", "hook": "connect4", "cgroup_id": 7}, True),
    ("a direct_egress whose process was gone", {"event": "direct_egress", "decision": "denied", "reason": "kernel: x", "count": 1,
                                                "attribution": "partial"}, True),
    ("a direct_egress with a seconds count as text", {"event": "direct_egress", "decision": "denied", "reason": "kernel: x", "count": "1"}, False),
    ("a direct_egress with a local time", {"event": "direct_egress", "decision": "denied", "reason": "kernel: x", "count": 2,
                                           "first_seen": "2026-11-29 09:16:42"}, False),
    ("a unix_socket", {"event": "unix_socket", "decision": "allowed", "reason": "kernel: unix", "count": 1, "path": "@x",
                       "sock_type": "stream", "hook": "connect_unix", "cgroup_id": 7}, True),
    ("a chained record", {"event": "run_end", "direct_egress": 0, "lost_events": 0, "prev": PREV}, True),
    ("a chained record with a short hash", {"event": "run_end", "direct_egress": 0, "lost_events": 0, "prev": "abc"}, False),
    ("a checkpoint", {"event": "checkpoint", "seq": 4, "prev": PREV, "size": 3,
                      "note": "host/gatewrap-audit\n3\nabc=\n\n— host/gatewrap-audit sig\n"}, True),
    ("a checkpoint without its size", {"event": "checkpoint", "seq": 4, "prev": PREV, "note": "x"}, False),
    ("an approval (reserved, not defined yet)", {"event": "approval_asked", "decision": "ask"}, False),
    ("a run_start whose argv was cut to fit", {"event": "run_start", "argv": None, "uid": 0, "truncated": ["argv"]}, True),
    ("a record cut to fit", {"event": "request", "decision": "allowed", "target": None, "truncated": ["target"]}, True),
    ("a kernel record whose cmdline was cut keeps its types", {"event": "direct_egress", "decision": "denied", "reason": "k",
                                                               "count": 0, "truncated": ["cmdline"]}, False),
]


@pytest.mark.parametrize("case,record,valid", SCHEMA_CASES, ids=[c[0] for c in SCHEMA_CASES])
def test_the_schema_accepts_what_is_written_and_nothing_else(tmp_path, case, record, valid):
    log = tmp_path / "audit.jsonl"
    first = {**HEAD, "event": "run_end", "direct_egress": 0, "lost_events": 0}
    log.write_text(json.dumps(first) + "\n" + json.dumps({**HEAD, **record}) + "\n")
    errors, end = invalid_audit_records(log)
    assert end == log.stat().st_size
    if valid:
        assert errors == [], errors
    else:
        assert len(errors) == 1 and errors[0].startswith(f"{log}:2: "), errors


# the inner python stays 2 s after its denial: its record is made from /proc while it lives
# (one that has exited by then is "attribution: partial", tests/test_attribution.py)
FORK_AND_CONNECT = """
import subprocess, sys
subprocess.run([sys.executable, "-c", "import socket, time\\ntry:\\n    socket.create_connection(('198.51.100.138', 7), timeout=2)\\nexcept OSError as e:\\n    print(e.errno, flush=True)\\ntime.sleep(2)"])
"""


@pytest.mark.kernel
def test_a_kernel_denial_names_the_executable_and_the_parents_up_to_the_agent(gatewrap):
    # "; true": the shell stays the python's parent (else it would exec it)
    r = gatewrap(["/bin/sh", "-c", '/usr/bin/python3 -c "$0"; true', FORK_AND_CONNECT])
    assert r.stdout.strip() == "1", r.stderr  # EPERM
    (rec,) = r.records(event="direct_egress")
    assert "attribution" not in rec, rec
    # /proc/PID/exe of a jailed process, read from a chroot (tools/fresh-debian), names the
    # file from the real root: /var/tmp/fresh-debian-12.X/usr/bin/python3.11
    assert rec["exe"].endswith(os.path.realpath("/usr/bin/python3")), rec
    comms = [p["comm"] for p in rec["parents"]]
    # the inner python's parent is the outer python, its parent the agent's shell; the chain
    # ends with the run's first process, the jail's init (gatewrap-wait --init; nsjail execs
    # it in its own place and does not stay)
    assert comms[:2] == ["python3", "sh"], rec["parents"]
    assert comms[-1] == "gatewrap-wait" and len(comms) <= 3, rec["parents"]
    assert rec["parents"][0]["pid"] != rec["pid"]


BROKEN_CHUNKS = READ_ANSWER + r'''
import json, socket, time
s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
s.sendall(b"POST http://allowed.test/echo HTTP/1.1\r\nHost: allowed.test\r\nTransfer-Encoding: chunked\r\n\r\n"
          b"4\r\nmail\r\n")
time.sleep(0.5)
s.sendall(b"zz\r\nnot a chunk\r\n")
line, body = answer(s)
print(json.dumps({"client": "%s:%d" % s.getsockname()[:2], "head": line}))
'''


@pytest.mark.kernel
def test_a_request_whose_body_breaks_after_it_left_is_allowed_and_says_the_body_was_malformed(gatewrap, net):
    net.clear_logs()
    r = gatewrap(["/usr/bin/python3", "-c", BROKEN_CHUNKS], allow=["allowed.test"])
    out = json.loads(r.stdout)
    assert out["head"].startswith("HTTP/1.1 400"), (out, r.stderr)
    (rec,) = [x for x in r.records(event="request") if x["client"] == out["client"]]
    assert net.access_entries(server="http", event="connect"), "the gate had dialled the server"
    assert rec["decision"] == "allowed", rec
    assert rec["error"].startswith("downstream: malformed request body ("), rec
    assert "disconnected" not in rec["error"], rec
    assert rec["status"] == 400, rec



WAYS_IN = READ_ANSWER + r"""
import json, socket, struct
def name(text):
    return b"".join(bytes([len(p)]) + p for p in text.encode().split(b".")) + b"\0"
def query(host):
    return struct.pack(">HHHHHH", 7, 0x0100, 1, 0, 0, 0) + name(host) + struct.pack(">HH", 1, 1)
def shown(sock):  # as the gate writes an address (Rust's SocketAddr)
    ip, port = sock.getsockname()[:2]
    return ("[%s]:%d" if ":" in ip else "%s:%d") % (ip, port)
out = []
for family, gate, tag in ((socket.AF_INET, "127.0.0.1", "v4"), (socket.AF_INET6, "::1", "v6")):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect((gate, 3128))
    s.sendall(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
    answer(s)
    out.append({"way": "proxy " + tag, "client": shown(s)})
    u = socket.socket(family, socket.SOCK_DGRAM)
    u.settimeout(5)
    u.connect((gate, 53))  # so that its own address is the one it sends from
    u.send(query(f"udp-{tag}.ways.test"))
    u.recv(512)
    out.append({"way": "dns udp " + tag, "host": f"udp-{tag}.ways.test", "client": shown(u)})
    t = socket.socket(family, socket.SOCK_STREAM)
    t.settimeout(10)
    t.connect((gate, 53))
    q = query(f"tcp-{tag}.ways.test")
    t.sendall(struct.pack(">H", len(q)) + q)
    t.recv(2)
    out.append({"way": "dns tcp " + tag, "host": f"tcp-{tag}.ways.test", "client": shown(t)})
print(json.dumps(out))
"""


@pytest.mark.kernel
def test_each_way_into_the_gate_is_recorded_with_the_address_its_client_used(gatewrap):
    # One socket per service serves 127.0.0.1 and ::1 (IPv4 peers reach it v4-mapped):
    # records name an IPv4 client as it connected, 127.0.0.1, and the proxy finds its process.
    r = gatewrap(["/usr/bin/python3", "-c", WAYS_IN], allow=["allowed.test"])
    ways = json.loads(r.stdout)
    assert [w["way"] for w in ways] == ["proxy v4", "dns udp v4", "dns tcp v4", "proxy v6", "dns udp v6", "dns tcp v6"], r.stderr
    for w in ways:
        assert w["client"].startswith("127.0.0.1:" if w["way"].endswith("v4") else "[::1]:"), w
        if w["way"].startswith("proxy"):
            (rec,) = [x for x in r.records(event="request") if x["client"] == w["client"]]
            assert rec["decision"] == "allowed" and isinstance(rec["client_pid"], int), (w, rec)
        else:
            (rec,) = [x for x in r.records(event="dns") if x["dst_host"] == w["host"]]
            assert rec["client"] == w["client"] and rec["decision"] == "denied", (w, rec)

TWO_CLIENTS = READ_ANSWER + r'''
import json, os, socket, subprocess, sys
def ask():
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"GET http://allowed.test/ HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
    answer(s)
    try:  # a direct attempt too: its kernel record names this process by its host pid
        socket.create_connection(("198.51.100.138", 7), timeout=2)
    except OSError:
        pass
    return {"pid": os.getpid(), "client": "%s:%d" % s.getsockname()[:2]}
if len(sys.argv) > 1:
    print(json.dumps(ask()), flush=True)
else:
    print(json.dumps(ask()), flush=True)
    subprocess.run([sys.executable, "-c", open("/proc/self/cmdline").read().split("\0")[2], "child"])
'''


@pytest.mark.kernel
def test_two_clients_in_one_sandbox_each_get_their_own_pid_in_their_records(gatewrap):
    r = gatewrap(["/usr/bin/python3", "-c", TWO_CLIENTS], allow=["allowed.test"])
    clients = [json.loads(line) for line in r.stdout.splitlines()]
    assert len(clients) == 2 and clients[0]["pid"] != clients[1]["pid"], (r.stdout, r.stderr)
    # the agent sees its jail's pid namespace; records name host pids, as the kernel's do
    pids = []
    for c in clients:
        recs = [x for x in r.audit() if x.get("client") == c["client"]]
        assert [x["event"] for x in recs] == ["admit", "request"], recs
        assert recs[0]["client_pid"] == recs[1]["client_pid"] and isinstance(recs[0]["client_pid"], int), recs
        assert all(x["client_comm"] == "python3" for x in recs), recs
        pids.append(recs[0]["client_pid"])
    assert pids[0] != pids[1], pids
    assert sorted(x["pid"] for x in r.records(event="direct_egress")) == sorted(pids)
