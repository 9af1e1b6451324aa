"""The review server answers only to its own name (issue 21, item 9): a ``Host`` that is not its
listen address (``host:port``; IPv4 and IPv6 literals, any spelling of the same address) nor a
name it was given (``--name``, ``[review] names``) is refused with 421 Misdirected Request
(RFC 9110 §15.5.20) before anything else, so a page of another site whose name was rebound to
127.0.0.1 (DNS rebinding) reaches nothing. The server runs with no store: reaching it would fail."""

from __future__ import annotations

import socket
import threading

import pytest
import requests

from gatewrap.approvals.web import ReviewServer


def _serve(listen, names=()):
    s = ReviewServer(None, listen, names=names)
    threading.Thread(target=s.serve_forever, daemon=True).start()
    return s


@pytest.fixture
def v4():
    s = _serve(("127.0.0.1", 0), names=("review.example",))
    yield s
    s.shutdown()
    s.server_close()


@pytest.fixture
def v6():
    s = _serve(("::1", 0))
    yield s
    s.shutdown()
    s.server_close()


def _raw(server, head: bytes) -> bytes:
    host, port = server.server_address[:2]
    with socket.create_connection((host, port), timeout=30) as c:
        c.sendall(head)
        out = b""
        while chunk := c.recv(65536):
            out += chunk
    return out


def _status(server, host_header, path="/", method="GET"):
    r = requests.request(method, server.base + path, headers={"Host": host_header}, allow_redirects=False, timeout=30,
                         data={"csrf": "x"} if method == "POST" else None)
    return r.status_code, r.text


@pytest.mark.parametrize("case, host, expected", [
    ("its listen address", "127.0.0.1:{port}", 200),
    ("its configured name with the port", "review.example:{port}", 200),
    ("its configured name in capitals", "REVIEW.Example:{port}", 200),
    ("its configured name without a port (behind a proxy)", "review.example", 200),
    ("a rebound name", "evil.test:{port}", 421),
    ("localhost, not configured", "localhost:{port}", 421),
    ("the address without the port", "127.0.0.1", 421),
    ("the address with another port", "127.0.0.1:1", 421),
    ("another loopback address", "127.0.0.2:{port}", 421),
    ("a shortened IPv4 literal", "127.1:{port}", 421),
    ("the configured name as a prefix", "review.example.evil.test:{port}", 421),
    ("a name with a trailing junk", "127.0.0.1:{port}@evil.test", 421),
])
def test_a_host_that_is_not_the_server_s_is_421(v4, case, host, expected):
    port = v4.server_address[1]
    status, text = _status(v4, host.format(port=port))
    assert status == expected, case
    if expected == 421:
        assert "Misdirected" in text or "not this server" in text, case


def test_a_form_to_a_foreign_host_is_421_before_the_csrf_check(v4):
    status, _ = _status(v4, "evil.test:80", path="/a/" + "t" * 43 + "/approve", method="POST")
    assert status == 421


@pytest.mark.parametrize("case, host, expected", [
    ("the bracketed IPv6 literal", "[::1]:{port}", 200),
    ("another spelling of the same address", "[0:0:0:0:0:0:0:1]:{port}", 200),
    ("no brackets", "::1:{port}", 421),
    ("another address", "[::2]:{port}", 421),
    ("the IPv4 loopback", "127.0.0.1:{port}", 421),
])
def test_an_ipv6_server_takes_its_address_in_any_spelling(v6, case, host, expected):
    status, _ = _status(v6, host.format(port=v6.server_address[1]))
    assert status == expected, case


def test_no_host_or_two_hosts_is_421(v4):
    port = v4.server_address[1]
    assert _raw(v4, b"GET / HTTP/1.0\r\n\r\n").startswith(b"HTTP/1.0 421")
    two = f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nHost: evil.test\r\nConnection: close\r\n\r\n".encode()
    assert _raw(v4, two).startswith(b"HTTP/1.0 421") or _raw(v4, two).startswith(b"HTTP/1.1 421")
