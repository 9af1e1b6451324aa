"""Direct egress from the sandbox fails at the syscall with EPERM and leaves one audit record."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.kernel

PROBE = """
import errno, socket, sys
fam, kind, host, port = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
s = socket.socket(socket.AF_INET6 if fam == "6" else socket.AF_INET,
                  socket.SOCK_STREAM if kind == "tcp" else socket.SOCK_DGRAM)
s.settimeout(2)
try:
    if kind == "tcp":
        s.connect((host, port))
    else:
        s.sendto(b"x", (host, port))
except OSError as e:
    print(errno.errorcode.get(e.errno, e.errno))
else:
    print("SENT")
"""

CASES = [
    # (case, family, kind, host, port, audited dst_ip, hook)
    ("TCP connect to an IPv4 literal", "4", "tcp", "198.51.100.138", 7, "198.51.100.138", "connect4"),
    ("TCP connect to an IPv6 literal", "6", "tcp", "2001:db8:100::10", 7, "2001:db8:100::10", "connect6"),
    ("TCP connect to a v4-mapped IPv6 address", "6", "tcp", "::ffff:198.51.100.138", 7, "::ffff:198.51.100.138", "connect6"),
    ("UDP sendto port 53", "4", "udp", "198.51.100.2", 53, "198.51.100.2", "sendmsg4"),
    ("UDP sendto a v4-mapped address reaches sendmsg4", "6", "udp", "::ffff:198.51.100.2", 53, "198.51.100.2", "sendmsg4"),
    ("UDP sendto an IPv6 address", "6", "udp", "2001:db8:1::2", 53, "2001:db8:1::2", "sendmsg6"),
    ("TCP connect to the gate's address on another port", "4", "tcp", "127.0.0.1", 8080, "127.0.0.1", "connect4"),
]


@pytest.mark.parametrize("case,fam,kind,host,port,dst_ip,hook", CASES, ids=[c[0] for c in CASES])
def test_direct_egress_is_refused_with_eperm_and_audited(gatewrap, net, case, fam, kind, host, port, dst_ip, hook):
    net.clear_logs()
    r = gatewrap(["/usr/bin/python3", "-c", PROBE, fam, kind, host, str(port)])
    assert r.stdout.strip() == "EPERM", r.stderr
    assert r.returncode == 0
    (rec,) = r.records(event="direct_egress")
    assert rec["decision"] == "denied"
    assert (rec["dst_ip"], rec["dst_port"], rec["hook"]) == (dst_ip, port, hook)
    assert rec["proto"] == kind
    assert rec["comm"] == "python3" and "python3" in rec.get("cmdline", "python3")
    assert rec["uid"] == 65534
    assert f"blocked direct egress: python3 (pid {rec['pid']})" in r.stderr
    assert net.access_entries() == [] and net.dns_queries() == []


def test_a_child_process_and_a_thread_are_refused_too(gatewrap):
    r = gatewrap(python="""
        import subprocess, threading, socket, errno
        def attempt(tag):
            try:
                socket.create_connection(("198.51.100.138", 7), timeout=2)
                print(tag, "SENT", flush=True)
            except OSError as e:
                print(tag, errno.errorcode[e.errno], flush=True)  # before the child's, unbuffered or not
        t = threading.Thread(target=attempt, args=("thread",)); t.start(); t.join()
        subprocess.run(["/usr/bin/python3", "-c",
            "import socket, errno\\ntry:\\n socket.create_connection(('198.51.100.138', 7), timeout=2); print('child SENT')\\n"
            "except OSError as e:\\n print('child', errno.errorcode[e.errno])"], check=True)
    """)
    assert r.stdout.splitlines() == ["thread EPERM", "child EPERM"], r.stderr
    recs = r.records(event="direct_egress")
    assert len(recs) == 2
    assert recs[0]["tid"] != recs[0]["pid"]          # the thread
    assert recs[1]["pid"] != recs[0]["pid"]          # the child process


#: The hint a direct attempt at loopback gets (NO_PROXY names loopback: docs/reference/environment.md).
LOOPBACK_HINT = ("clients skip it for loopback (NO_PROXY): to send this through it, to the host's 127.0.0.1:{port} "
                 "if the policy allows that address, use curl --noproxy '' or unset NO_PROXY")


@pytest.fixture
def host_loopback_server():
    """An HTTP server on the host's 127.0.0.1 (a port of its own), answering 200 "host-loopback"."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Length", "13")
            self.end_headers()
            self.wfile.write(b"host-loopback")

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_curl_to_a_loopback_upstream_the_policy_allows_is_told_how_to_send_it_through_the_gate(
        gatewrap, host_loopback_server):
    """NO_PROXY names loopback, so curl dials 127.0.0.1 itself (EPERM: the sandbox's loopback
    holds only the gate); the notice says how to send it through the gate, which then
    reaches the host's loopback, as the rule naming 127.0.0.1 allows."""
    port = host_loopback_server
    url = f"http://127.0.0.1:{port}/"
    curl = "curl -sS --max-time 10 -w ' %{http_code}\\n'"
    r = gatewrap(["/bin/sh", "-c", f"{curl} {url}; {curl} --noproxy '' {url}"], allow=[f"127.0.0.1:{port}"])
    assert r.stdout.split() == ["000", "host-loopback", "200"], r.stdout + r.stderr
    (rec,) = r.records(event="direct_egress")
    assert (rec["dst_ip"], rec["dst_port"], rec["comm"]) == ("127.0.0.1", port, "curl")
    notice = (f"gatewrap: blocked direct egress: curl (pid {rec['pid']}) -> tcp 127.0.0.1:{port} [connect4]: only the "
              f"gate (http://127.0.0.1:3128) is reachable; " + LOOPBACK_HINT.format(port=port))
    assert notice in r.stderr, r.stderr
    (req,) = r.records(event="request")
    assert (req["decision"], req["dst_ip"], req["rule"]) == ("allowed", "127.0.0.1", f"--allow 127.0.0.1:{port}")


def test_pythons_error_for_a_direct_loopback_attempt_says_how_to_send_it_through_the_gate(gatewrap):
    r = gatewrap(python="""
        import urllib.request
        try:
            urllib.request.urlopen("http://127.0.0.1:8000/", timeout=5)
        except OSError as e:
            print(e)
    """)
    assert "egress to 127.0.0.1:8000 was blocked by gatewrap: only the gate (http://127.0.0.1:3128) is reachable; " \
        "clients skip it for loopback (NO_PROXY): to send this through it, to the host's 127.0.0.1:8000 if the " \
        "policy allows that address, unset NO_PROXY (curl: --noproxy ''); the audit record: " in r.stdout, r.stdout + r.stderr
