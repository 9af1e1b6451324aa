"""HTTP, HTTPS and echo servers of the fake internet (run inside the inet netns).

Usage: ``python3 servers.py CONFIG.json``; config keys::

    {"log": "/tmp/.../access.jsonl",
     "cert": "server.pem", "key": "server.key",
     "http_port": 80, "https_port": 443, "echo_port": 7,
     "udp_addrs": ["198.51.100.138", "2001:db8:100::10", ...]}

Listeners (threads in this one process):

* HTTP on ``[::]:http_port`` and HTTPS on ``[::]:https_port``, dual stack, so every
  v4 and v6 address of the netns. HTTP/1.1 with keep-alive (idle timeout 30 s).
  Routes (any method; query string ignored for routing):

  - ``/``            200 ``hello from <Host name without port> over <http|https>\\n``
  - ``/echo``        200 JSON ``{"method", "path" (with query), "headers" {name: value},
    "body" (text), "scheme", "host", "peer", "sni", "hex"}``; ``hex``: the hex of the JSON
    ``{"path", "headers"}``, what upstream received in a form the gate's response mask of
    secrets (gate/secrets/mask.rs) does not look for, so that a test sees the injected value
  - ``/status/NNN``  status NNN (200..599), body ``status NNN\\n`` (none for 204/304)
  - ``/bytes/N``     200, N bytes of ``x`` (application/octet-stream)
  - ``/delay/MS``    200 ``delayed MS ms\\n`` after sleeping MS milliseconds
  - ``/reason``      400 whose reason phrase is the request's ``Authorization``, no body
  - ``/redirect?to=URL``  302 with ``Location: URL`` (e.g. to a private address)
  - anything else    404 ``not found\\n``
  - a Host with a folder under ``sites_root`` (config key): that site (``sites.py``)

* TCP echo on ``[::]:echo_port`` (dual stack): sends back every byte until EOF.
* UDP echo on ``<addr>:echo_port`` for each of ``udp_addrs`` (one socket per address
  so the reply leaves from the address the client sent to).

Access log: one JSON line per event, written before the client is answered:
``{"ts", "server": "http"|"https"|"tcp-echo"|"udp-echo", "event": "connect"|"request"|
"tls_error"|"datagram", "peer", "peer_port", "local", "local_port", ...}``; requests add
``host``, ``method``, ``path``, (https) ``sni``; datagrams add ``bytes``.
"""

from __future__ import annotations

import json
import os
import socket
import socketserver
import ssl
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from urllib.parse import parse_qs, urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import JsonLog, exit_when_parent_goes, norm_ip  # noqa: E402
import sites  # noqa: E402  (hosts with a folder under the sites root: sites.py)

LOG: JsonLog


def _ends(sock: socket.socket) -> dict:
    peer = sock.getpeername()
    local = sock.getsockname()
    return {
        "peer": norm_ip(peer[0]),
        "peer_port": peer[1],
        "local": norm_ip(local[0]),
        "local_port": local[1],
    }


def host_name(host_header: str | None, fallback: str) -> str:
    """'allowed.test:8080' -> 'allowed.test'; '[2001:db8::1]:80' -> '2001:db8::1'."""
    if not host_header:
        return fallback
    h = host_header.strip()
    if h.startswith("["):
        return h[1 : h.find("]")] if "]" in h else h
    if h.count(":") == 1:
        return h.split(":", 1)[0]
    return h


class DualStackMixin:
    address_family = socket.AF_INET6
    allow_reuse_address = True
    daemon_threads = True
    request_queue_size = 128

    def server_bind(self):
        self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        socketserver.TCPServer.server_bind(self)  # HTTPServer's would call getfqdn (DNS!)
        self.server_name = "fakenet"
        self.server_port = self.server_address[1]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "fakenet/1"
    timeout = 30

    def log_message(self, format, *args):  # noqa: A002 - quiet; we keep a JSON log
        pass

    def _read_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = b""
            while True:
                line = self.rfile.readline(1024)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                        pass
                    return out
                out += self.rfile.read(size)
                self.rfile.readline(8)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def _send(self, status: int, body: bytes, ctype: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def handle_any(self) -> None:
        scheme = self.server.scheme
        ends = _ends(self.connection)
        host = host_name(self.headers.get("Host"), ends["local"])
        sni = getattr(self.connection, "fakenet_sni", None)
        body = self._read_body()
        rec = dict(server=scheme, event="request", host=host, method=self.command, path=self.path, **ends)
        if scheme == "https":
            rec["sni"] = sni
        LOG.write(**rec)
        site = sites.site_of(host)
        if site:
            return sites.serve(self, site, body, LOG)
        route = self.path.split("?", 1)[0]
        parts = route.strip("/").split("/")
        if route == "/":
            self._send(200, f"hello from {host} over {scheme}\n".encode())
        elif route == "/echo":
            headers: dict[str, str] = {}
            for k, v in self.headers.items():
                headers[k] = f"{headers[k]}, {v}" if k in headers else v
            doc = {
                "method": self.command,
                "path": self.path,
                "headers": headers,
                "body": body.decode("utf-8", "replace"),
                "scheme": scheme,
                "host": host,
                "peer": ends["peer"],
                "sni": sni,
                "hex": json.dumps({"path": self.path, "headers": headers}).encode().hex(),
            }
            self._send(200, (json.dumps(doc) + "\n").encode(), "application/json")
        elif len(parts) == 2 and parts[0] == "status" and parts[1].isdigit() and 200 <= int(parts[1]) <= 599:
            code = int(parts[1])
            if code in (204, 304):  # no body allowed
                self.send_response(code)
                self.end_headers()
            else:
                self._send(code, f"status {code}\n".encode())
        elif len(parts) == 2 and parts[0] == "bytes" and parts[1].isdigit():
            self._send(200, b"x" * int(parts[1]), "application/octet-stream")
        elif len(parts) == 2 and parts[0] == "delay" and parts[1].isdigit():
            time.sleep(int(parts[1]) / 1000)
            self._send(200, f"delayed {parts[1]} ms\n".encode())
        elif route == "/drip":  # ?data=HEX&pause=MS: those bytes, a pause, then a newline (one response)
            q = parse_qs(urlsplit(self.path).query)
            data = bytes.fromhex(q.get("data", [""])[0])
            self.send_response(200)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(len(data) + 1))
            self.end_headers()
            self.wfile.write(data)
            self.wfile.flush()
            time.sleep(min(int(q.get("pause", ["0"])[0]), 10_000) / 1000)
            self.wfile.write(b"\n")
            self.wfile.flush()
        elif route == "/reason":  # an error whose reason phrase quotes the request's Authorization
            self.send_response(400, self.headers.get("Authorization") or "no authorization")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif route == "/redirect":
            self.send_response(302)
            self.send_header("Location", parse_qs(urlsplit(self.path).query).get("to", ["/"])[0])
            self.send_header("Content-Length", "0")
            self.end_headers()
        else:
            self._send(404, b"not found\n")

    do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = do_OPTIONS = handle_any


def nodelay(sock: socket.socket) -> None:
    """TCP_NODELAY on an accepted connection, as real servers (nginx's tcp_nodelay) set it: a
    response goes out in two writes (the head at end_headers(), then the body), and with Nagle
    the body waits for the peer's ACK of the head, which a peer with nothing to send delays by
    up to 40 ms (Linux's delayed ACK, tcp(7)): every kept-alive request took ~44 ms (issue 20's
    bench)."""
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:
        pass


class HTTPDualServer(DualStackMixin, socketserver.ThreadingMixIn, HTTPServer):
    scheme = "http"

    def finish_request(self, request, client_address):  # runs in the per-connection thread
        nodelay(request)
        try:
            LOG.write(server=self.scheme, event="connect", **_ends(request))
        except OSError:
            return
        self.RequestHandlerClass(request, client_address, self)


class HTTPSDualServer(HTTPDualServer):
    scheme = "https"

    def __init__(self, addr, handler, ctx: ssl.SSLContext):
        super().__init__(addr, handler)
        self.ctx = ctx

    def finish_request(self, request, client_address):
        try:
            ends = _ends(request)
        except OSError:
            return
        LOG.write(server="https", event="connect", **ends)
        nodelay(request)
        request.settimeout(30)
        try:
            tls = self.ctx.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as e:
            LOG.write(server="https", event="tls_error", error=str(e), **ends)
            return
        try:
            self.RequestHandlerClass(tls, client_address, self)
        finally:
            tls.close()


def make_tls_context(cert: str, key: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["http/1.1"])

    def on_sni(sslsock, name, _ctx):
        sslsock.fakenet_sni = name
        return None

    ctx.sni_callback = on_sni
    return ctx


class EchoHandler(socketserver.BaseRequestHandler):
    def handle(self):
        LOG.write(server="tcp-echo", event="connect", **_ends(self.request))
        self.request.settimeout(30)
        while True:
            data = self.request.recv(65536)
            if not data:
                return
            self.request.sendall(data)


class EchoServer(DualStackMixin, socketserver.ThreadingTCPServer):
    pass


def udp_echo(sock: socket.socket) -> None:
    local = sock.getsockname()
    while True:
        data, peer = sock.recvfrom(65536)
        LOG.write(
            server="udp-echo",
            event="datagram",
            peer=norm_ip(peer[0]),
            peer_port=peer[1],
            local=local[0],
            local_port=local[1],
            bytes=len(data),
        )
        sock.sendto(data, peer)


def main() -> None:
    global LOG
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    exit_when_parent_goes()
    LOG = JsonLog(cfg["log"])
    sites.ROOT = cfg.get("sites_root")
    ctx = make_tls_context(cfg["cert"], cfg["key"])
    servers = [
        HTTPDualServer(("::", int(cfg.get("http_port", 80))), Handler),
        HTTPSDualServer(("::", int(cfg.get("https_port", 443))), Handler, ctx),
        EchoServer(("::", int(cfg.get("echo_port", 7))), EchoHandler),
    ]
    udp = []
    for addr in cfg.get("udp_addrs", []):
        fam = socket.AF_INET6 if ":" in addr else socket.AF_INET
        s = socket.socket(fam, socket.SOCK_DGRAM)
        s.bind((addr, int(cfg.get("echo_port", 7))))
        udp.append(s)
    for srv in servers:
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    for s in udp:
        threading.Thread(target=udp_echo, args=(s,), daemon=True).start()
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
