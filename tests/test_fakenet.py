"""Self-test of the fake internet (tests/fakenet), from the host netns, no gatewrap.

Needs root, iproute2 and curl. Every packet stays on the veth pair the fixture
creates (documentation addresses, routes only via that veth).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

import pytest
from dnslib import RCODE, DNSRecord

try:
    from fakenet import AddressConflict, FakeInternet, FakeInternetError, in_netns, leftovers
except ImportError:  # run from the repo root with tests/ not on sys.path
    from tests.fakenet import AddressConflict, FakeInternet, FakeInternetError, in_netns, leftovers

pytestmark = pytest.mark.kernel


def dns(server: str, name: str, qtype: str = "A", tcp: bool = False):
    """Ask ``server`` (an IP; port 53) and return (rcode name, [answer strings])."""
    raw = DNSRecord.question(name, qtype).send(server, 53, tcp=tcp, timeout=2, ipv6=":" in server)
    r = DNSRecord.parse(raw)
    return RCODE.get(r.header.rcode), [str(rr.rdata) for rr in r.rr]


def curl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(["curl", "-sS", "--max-time", "5", *args], capture_output=True, text=True, timeout=10)


@pytest.fixture(scope="class")
def net():
    with FakeInternet() as n:
        yield n


class TestRunning:

    def test_addresses(self, net):
        assert net.dns_server == "198.51.100.2:53"
        assert net.addr("allowed.test") == "198.51.100.138"
        assert net.addr6("allowed.test") == "2001:db8:100::10"
        assert net.addr("denied.test") == "198.51.100.148"
        with pytest.raises(KeyError):
            net.addr6("evil.test")
        assert net.netns.startswith("gwt-inet-") and len(net.host_ifname) < 16
        with open(net.ca_path) as f:
            assert "BEGIN CERTIFICATE" in f.read()

    @pytest.mark.parametrize("server", ["198.51.100.2", "2001:db8:1::2"])
    @pytest.mark.parametrize("tcp", [False, True])
    def test_dns_answers(self, net, server, tcp):
        assert dns(server, "allowed.test", "A", tcp) == ("NOERROR", ["198.51.100.138"])
        assert dns(server, "allowed.test", "AAAA", tcp) == ("NOERROR", ["2001:db8:100::10"])
        assert dns(server, "other.allowed.test", "A", tcp) == ("NOERROR", ["198.51.100.138"])
        assert dns(server, "denied.test", "AAAA", tcp) == ("NOERROR", ["2001:db8:100::20"])
        assert dns(server, "evil.test", "A", tcp) == ("NOERROR", ["198.51.100.158"])
        assert dns(server, "evil.test", "AAAA", tcp) == ("NOERROR", [])
        assert dns(server, "nope.test", "A", tcp) == ("NXDOMAIN", [])
        assert dns(server, "example.com", "A", tcp) == ("REFUSED", [])

    def test_dns_log_counts_queries(self, net):
        net.clear_logs()
        dns("198.51.100.2", "allowed.test")
        dns("198.51.100.2", "Evil.Test.", "AAAA", tcp=True)
        q = net.dns_queries()
        assert [(x["qname"], x["qtype"], x["proto"], x["peer"]) for x in q] == [
            ("allowed.test", "A", "udp", "198.51.100.1"),
            ("evil.test", "AAAA", "tcp", "198.51.100.1"),
        ]
        assert len(net.dns_queries(qname="evil.test")) == 1

    def test_dig(self, net):
        out = subprocess.run(["dig", "+short", "+time=2", "+tries=1", "@198.51.100.2", "allowed.test"],
                             capture_output=True, text=True, timeout=10)
        assert out.stdout.split() == ["198.51.100.138"], out

    def test_https_v4(self, net):
        net.clear_logs()
        r = curl("--cacert", net.ca_path, "--resolve", "allowed.test:443:198.51.100.138", "https://allowed.test/")
        assert r.returncode == 0, r.stderr
        assert r.stdout == "hello from allowed.test over https\n"
        reqs = net.access_entries(event="request")
        assert [(e["server"], e["host"], e["path"], e["sni"], e["local"]) for e in reqs] == [
            ("https", "allowed.test", "/", "allowed.test", "198.51.100.138")
        ]

    def test_https_v6_and_wildcard_name(self, net):
        r = curl("--cacert", net.ca_path, "--resolve", "other.allowed.test:443:[2001:db8:100::10]",
                 "https://other.allowed.test/")
        assert (r.returncode, r.stdout) == (0, "hello from other.allowed.test over https\n"), r.stderr

    def test_https_by_ip(self, net):
        r = curl("--cacert", net.ca_path, "https://198.51.100.148/")
        assert r.returncode == 0, r.stderr

    def test_https_untrusted_without_test_ca(self, net):
        r = curl("--resolve", "allowed.test:443:198.51.100.138", "https://allowed.test/")
        assert r.returncode == 60, (r.returncode, r.stderr)  # peer certificate not trusted

    def test_http_v4_v6(self, net):
        r = curl("--resolve", "denied.test:80:198.51.100.148", "http://denied.test/")
        assert (r.returncode, r.stdout) == (0, "hello from denied.test over http\n"), r.stderr
        r = curl("-g", "http://[2001:db8:100::30]/")
        assert (r.returncode, r.stdout) == (0, "hello from 2001:db8:100::30 over http\n"), r.stderr

    def test_echo_and_status(self, net):
        r = curl("--resolve", "allowed.test:80:198.51.100.138", "-H", "X-Probe: 1", "-d", "abc",
                 "http://allowed.test/echo?q=1")
        doc = json.loads(r.stdout)
        assert doc["method"] == "POST" and doc["path"] == "/echo?q=1" and doc["body"] == "abc"
        assert doc["headers"]["X-Probe"] == "1" and doc["headers"]["Host"] == "allowed.test"
        r = curl("-o", "/dev/null", "-w", "%{http_code}", "http://198.51.100.138/status/503")
        assert r.stdout == "503"
        r = curl("-o", "/dev/null", "-w", "%{size_download}", "http://198.51.100.138/bytes/12345")
        assert r.stdout == "12345"

    @pytest.mark.parametrize("ip", ["198.51.100.138", "2001:db8:100::10"])
    def test_tcp_echo(self, net, ip):
        net.clear_logs()
        with socket.create_connection((ip, 7), timeout=2) as s:
            s.sendall(b"hello tcp")
            assert s.recv(100) == b"hello tcp"
        assert [e["local"] for e in net.access_entries(server="tcp-echo")] == [ip]

    @pytest.mark.parametrize("ip", ["198.51.100.138", "2001:db8:100::10"])
    def test_udp_echo(self, net, ip):
        net.clear_logs()
        with socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.settimeout(2)
            s.connect((ip, 7))
            s.send(b"hello udp")
            assert s.recv(100) == b"hello udp"
        assert [(e["local"], e["bytes"]) for e in net.access_entries(server="udp-echo")] == [(ip, 9)]

    def test_exec_in_netns(self, net):
        r = net.exec(["ip", "-o", "addr", "show", "dev", "lo"])
        assert "198.51.100.138/32" in r.stdout and "2001:db8:100::30/128" in r.stdout

    def test_second_instance_refused(self, net):
        with pytest.raises(AddressConflict, match=f"on {net.host_ifname} .another fake internet's link: "
                           f"a test run or demo in progress, {net.netns}; wait for it to end"):
            FakeInternet().start()

    def test_a_clean_up_by_another_process_leaves_a_live_one_alone(self, net):
        # a second pytest on the host calls cleanup_leftovers() at its start
        code = "import sys; sys.path.insert(0, sys.argv[1]); import fakenet; fakenet.cleanup_leftovers()"
        subprocess.run([sys.executable, "-c", code, os.path.dirname(os.path.abspath(__file__))], check=True)
        assert os.path.isdir(net.tmpdir)
        assert net.netns in leftovers()["netns"]
        r = net.exec(["ip", "-o", "addr", "show", "dev", "lo"])
        assert "198.51.100.138/32" in r.stdout


def _assert_gone(netns: str, ifname: str, pids: list[int], tmpdir: str) -> None:
    assert leftovers() == {"netns": [], "links": [], "routes": [], "addrs": []}
    assert not os.path.exists(f"/run/netns/{netns}")
    assert subprocess.run(["ip", "link", "show", ifname], capture_output=True).returncode != 0
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert not os.path.exists(tmpdir)


def test_extra_names_and_clean_exit():
    with FakeInternet(extra_names={"x.test": "198.51.100.158", "*.wild.test": ["2001:db8:100::20"]}) as net:
        assert dns("198.51.100.2", "x.test") == ("NOERROR", ["198.51.100.158"])
        assert dns("198.51.100.2", "a.b.wild.test", "AAAA") == ("NOERROR", ["2001:db8:100::20"])
        r = curl("--cacert", net.ca_path, "--resolve", "x.test:443:198.51.100.158", "https://x.test/")
        assert r.stdout == "hello from x.test over https\n", r.stderr
        bg = subprocess.Popen([*in_netns(net.netns), "sleep", "60"])  # a stray process
        for _ in range(200):  # until it has entered the netns (teardown kills what is inside)
            pids = subprocess.run(["ip", "netns", "pids", net.netns], capture_output=True, text=True).stdout
            if str(bg.pid) in pids.split():
                break
            time.sleep(0.01)
        seen = (net.netns, net.host_ifname, [p.pid for p in net._procs.values()] + [bg.pid], net.tmpdir)
    bg.wait(timeout=5)
    _assert_gone(*seen)


@pytest.mark.parametrize("exc", [ZeroDivisionError, KeyboardInterrupt])
def test_clean_exit_on_exception(exc):
    with pytest.raises(exc):
        with FakeInternet() as net:
            seen = (net.netns, net.host_ifname, [p.pid for p in net._procs.values()], net.tmpdir)
            raise exc()
    _assert_gone(*seen)


@pytest.mark.kernel
@pytest.mark.parametrize("addr", ["198.51.100.205/24", "198.51.100.9/32", "2001:db8:100:5::1/64"])
def test_an_address_of_the_host_in_its_ranges_is_named_in_one_line(addr):
    """A host network inside the fake internet's ranges: one line that names the address and
    its interface, and nothing of the fake internet is left behind."""
    dev = "gwtclash0"  # a veth pair of the test's own (this kernel has no dummy driver)
    subprocess.run(["ip", "link", "add", dev, "type", "veth", "peer", "name", "gwtclash1"], check=True)
    try:
        subprocess.run(["ip", "addr", "add", addr, "dev", dev, "nodad"] if ":" in addr
                       else ["ip", "addr", "add", addr, "dev", dev], check=True)
        with pytest.raises(AddressConflict) as e:
            FakeInternet().start()
        assert f"{addr} on {dev} (this host's own network" in str(e.value) and "\n" not in str(e.value)
        assert not leftovers()["netns"] and not leftovers()["links"]
    finally:
        subprocess.run(["ip", "link", "del", dev], check=True)

