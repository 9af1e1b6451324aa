"""WebSocket echo servers of the fake internet (run inside the inet netns).

Usage: ``python3 ws_server.py CONFIG.json``; config keys::

    {"log": "/tmp/.../ws.jsonl", "cert": "server.pem", "key": "server.key",
     "ws_port": 8080, "wss_port": 8443}

Listeners, dual stack on every address: ``ws`` (plain) on ``ws_port`` and ``wss`` (TLS,
the fake internet's server certificate) on ``wss_port``. Any path: the opening handshake
of RFC 6455 §4.2 (``Sec-WebSocket-Accept`` from the key), then every text or binary
message is sent back as it came (unmasked, §5.1), a ping gets its pong, a close is
answered with a close; on path ``/headers`` the first message is the handshake's headers
(JSON, names in lower case), an echo of the request; on ``/headers-fragmented`` the same
message cut in fragments of 8 bytes (§5.4: a text frame without FIN, then continuation frames),
as a server that fragments its messages sends it. A request without ``Upgrade: websocket`` gets 426.

Log: one JSON line per handshake: ``{"ts", "server": "ws"|"wss", "event": "upgrade",
"path", "host", "peer", "headers"}``.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import socketserver
import struct
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import JsonLog, exit_when_parent_goes, norm_ip  # noqa: E402
from servers import DualStackMixin, make_tls_context  # noqa: E402

#: RFC 6455 §1.3: appended to the client's key before hashing.
GUID = "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"
LOG: JsonLog


def accept_key(key: str) -> str:
    """``Sec-WebSocket-Accept`` for ``Sec-WebSocket-Key`` ``key`` (RFC 6455 §4.2.2)."""
    return base64.b64encode(hashlib.sha1((key + GUID).encode()).digest()).decode()


def _read_exact(f, n: int) -> bytes:
    data = f.read(n)
    if len(data) != n:
        raise EOFError
    return data


def read_frame(f) -> tuple[int, bytes]:
    """One frame (RFC 6455 §5.2): (opcode, unmasked payload)."""
    b0, b1 = _read_exact(f, 2)
    n = b1 & 0x7F
    if n == 126:
        n = struct.unpack("!H", _read_exact(f, 2))[0]
    elif n == 127:
        n = struct.unpack("!Q", _read_exact(f, 8))[0]
    mask = _read_exact(f, 4) if b1 & 0x80 else b"\0\0\0\0"
    payload = bytes(b ^ mask[i % 4] for i, b in enumerate(_read_exact(f, n)))
    return b0 & 0x0F, payload


def frame(opcode: int, payload: bytes) -> bytes:
    """An unmasked final frame (servers never mask, §5.1)."""
    n = len(payload)
    head = bytes([0x80 | opcode])
    if n < 126:
        head += bytes([n])
    elif n < 1 << 16:
        head += bytes([126]) + struct.pack("!H", n)
    else:
        head += bytes([127]) + struct.pack("!Q", n)
    return head + payload


class WsHandler(socketserver.StreamRequestHandler):
    scheme = "ws"

    def handle(self) -> None:
        lines = []
        while True:
            line = self.rfile.readline(65536)
            if line in (b"\r\n", b"\n", b""):
                break
            lines.append(line.decode("latin-1").rstrip("\r\n"))
        if not lines:
            return
        path = lines[0].split(" ")[1] if " " in lines[0] else "/"
        headers = {k.strip().lower(): v.strip() for k, v in (x.split(":", 1) for x in lines[1:] if ":" in x)}
        LOG.write(server=self.scheme, event="upgrade", path=path, host=headers.get("host"),
                  peer=norm_ip(self.client_address[0]), headers=headers)
        if headers.get("upgrade", "").lower() != "websocket" or "sec-websocket-key" not in headers:
            body = b"websocket only\n"
            self.wfile.write(b"HTTP/1.1 426 Upgrade Required\r\nUpgrade: websocket\r\nConnection: close\r\n"
                             b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            return
        self.wfile.write(("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                          f"Sec-WebSocket-Accept: {accept_key(headers['sec-websocket-key'])}\r\n\r\n").encode())
        if path == "/headers":  # an echo of the handshake: its headers as one text message
            self.wfile.write(frame(1, json.dumps(headers).encode()))
        elif path == "/headers-fragmented":  # the same message in fragments of 8 bytes
            text = json.dumps(headers).encode()
            parts = [text[i:i + 8] for i in range(0, len(text), 8)]
            for k, part in enumerate(parts):
                fin = 0x80 if k == len(parts) - 1 else 0
                self.wfile.write(bytes([fin | (1 if k == 0 else 0), len(part)]) + part)
        self.wfile.flush()
        try:
            while True:
                op, data = read_frame(self.rfile)
                if op == 8:
                    self.wfile.write(frame(8, data[:2]))
                    return
                self.wfile.write(frame(10 if op == 9 else op, data))
                self.wfile.flush()
        except (EOFError, OSError, ValueError):
            return


class WsServer(DualStackMixin, socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class WssServer(WsServer):
    def __init__(self, addr, handler, ctx):
        super().__init__(addr, handler)
        self.ctx = ctx

    def get_request(self):
        sock, addr = super().get_request()
        return self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False), addr

    def finish_request(self, request, client_address):
        try:
            request.do_handshake()
        except OSError:
            return
        super().finish_request(request, client_address)


class WssHandler(WsHandler):
    scheme = "wss"


def main() -> None:
    global LOG
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    exit_when_parent_goes()
    LOG = JsonLog(cfg["log"])
    ctx = make_tls_context(cfg["cert"], cfg["key"])
    servers = [WsServer(("::", int(cfg["ws_port"])), WsHandler),
               WssServer(("::", int(cfg["wss_port"])), WssHandler, ctx)]
    for srv in servers:
        threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.2}, daemon=True).start()
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
