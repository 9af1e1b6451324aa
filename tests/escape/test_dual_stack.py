"""Escape suite, the gate's dual-stack listeners: one ``[::]`` socket per service (IPV6_V6ONLY
off) serves 127.0.0.1 and ::1 in the sandbox's netns. The agent reaches it only on those two
(and ``::ffff:127.0.0.1``, the same IPv4 connection); an IPv4 connection made from an IPv6
socket is recorded as 127.0.0.1, its process found, and judged by the same policy."""

from __future__ import annotations

import json

import pytest

from .helpers import attempts, python_argv

pytestmark = pytest.mark.kernel

OTHER_LOOPBACK = """
for step, family, kind, addr in (
        ("tcp 127.0.0.2 proxy", V4, TCP, ("127.0.0.2", 3128)),
        ("tcp 127.255.255.254 proxy", V4, TCP, ("127.255.255.254", 3128)),
        ("tcp ::ffff:127.0.0.2 proxy", V6, TCP, ("::ffff:127.0.0.2", 3128)),
        ("tcp 0.0.0.0 proxy", V4, TCP, ("0.0.0.0", 3128)),
        ("tcp :: proxy", V6, TCP, ("::", 3128)),
        ("udp 127.0.0.2 dns", V4, UDP, ("127.0.0.2", 53)),
        ("tcp 127.0.0.2 dns", V4, TCP, ("127.0.0.2", 53)),
        ("udp ::ffff:127.0.0.2 dns", V6, UDP, ("::ffff:127.0.0.2", 53))):
    s = sock(family, kind)
    if kind == UDP:
        attempt(step, s.sendto, b"\\0" * 12, addr)
    else:
        attempt(step, s.connect, addr)
for step, family, kind, addr in (
        ("bind 127.0.0.2 proxy port", V4, TCP, ("127.0.0.2", 3128)),
        ("bind 127.0.0.1 proxy port", V4, TCP, ("127.0.0.1", 3128)),
        ("bind udp 127.0.0.2 dns port", V4, UDP, ("127.0.0.2", 53))):
    s = sock(family, kind)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    attempt(step, s.bind, addr)
"""


def test_the_gates_wildcard_socket_is_reached_on_no_other_loopback_address(gatewrap, outcome):
    """the gate's [::] socket on 127/8's other addresses, 0.0.0.0, ::, or taken over by a bind."""
    r = gatewrap(python_argv(OTHER_LOOPBACK), allow=["allowed.test"])
    got = {a["step"]: a["errno"] for a in attempts(r.stdout)}
    refused = {s: e for s, e in got.items() if not s.startswith("bind")}
    binds = {s: e for s, e in got.items() if s.startswith("bind")}
    opened = [s for s, e in got.items() if e is None]
    outcome("connect/sendmsg hooks; bind conflicts with the gate's socket",
            f"connects: {', '.join(sorted(map(str, set(refused.values()))))} ({len(refused)} ways); "
            f"binds: {', '.join(sorted(map(str, set(binds.values()))))}",
            "OPEN" if opened else "held")
    assert len(got) == 11, r.stdout + r.stderr
    assert set(refused.values()) == {"EPERM"}, refused
    assert all(e in ("EADDRINUSE", "EACCES", "EPERM") for e in binds.values()), binds
    assert len(r.records(event="direct_egress")) >= len(refused), r.records(event="direct_egress")


MAPPED = r"""
import json, socket
out = []
for host in ("allowed.test", "denied.test"):
    s = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
    s.settimeout(10)
    s.connect(("::ffff:127.0.0.1", 3128))
    s.sendall(("GET http://%s/ HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n" % (host, host)).encode())
    head = s.recv(64)
    out.append({"host": host, "status": head.split(b" ")[1].decode(), "sock": s.getsockname()[:2]})
    s.close()
print(json.dumps(out))
"""


def test_an_ipv4_connection_from_an_ipv6_socket_is_recorded_with_its_process_and_judged(gatewrap, outcome):
    """the gate through ::ffff:127.0.0.1 from an AF_INET6 socket (to hide the client's process)."""
    r = gatewrap(["/usr/bin/python3", "-c", MAPPED], allow=["allowed.test"])
    (line,) = [x for x in r.stdout.splitlines() if x.startswith("[")]
    ways = json.loads(line)
    recs = {x["dst_host"]: x for x in r.records(event="request")}
    pids = {h: recs[h].get("client_pid") for h in recs}
    outcome("gate (dual-stack socket, peer canonicalised; attribution from the TCP tables)",
            f"{'/'.join(w['status'] for w in ways)} (allowed/denied host), recorded from 127.0.0.1, "
            f"client_pid {'found' if all(isinstance(p, int) for p in pids.values()) else 'null'}",
            "held" if all(isinstance(p, int) for p in pids.values()) else "OPEN")
    assert [w["status"] for w in ways] == ["200", "403"], ways
    for w in ways:
        rec = recs[w["host"]]
        assert rec["client"] == "127.0.0.1:%d" % w["sock"][1], (w, rec)
        assert rec["decision"] == ("allowed" if w["host"] == "allowed.test" else "denied"), rec
    assert all(isinstance(p, int) for p in pids.values()), recs
