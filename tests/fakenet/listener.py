"""A TCP listener in the test's own network namespace that counts who connects to it.

The gate dials from the host, so a destination it must never reach on the host (its
loopback, ``127.0.0.1:80``) is watched by listening there: ``connections`` must stay
empty. Each connection is recorded and closed at once, unanswered.
"""

from __future__ import annotations

import socket
import threading
import time


class CountingListener:
    """Context manager listening on ``(host, port)``; ``connections`` lists the peers
    (``(ip, port)`` tuples) accepted so far. Raises ``OSError`` if the port is taken."""

    def __init__(self, host: str = "127.0.0.1", port: int = 80):
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self.sock = socket.socket(family, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.addr = (host, port)
        self.connections: list[tuple] = []
        self._thread = threading.Thread(target=self._accept, name=f"listener-{host}-{port}", daemon=True)

    def __enter__(self) -> "CountingListener":
        self.sock.bind(self.addr)
        self.sock.listen(16)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes accept() (Linux), which then fails
        except OSError:
            pass
        self.sock.close()
        self._thread.join(timeout=5)

    def self_check(self) -> None:
        """Connect once and see it counted (an empty list then means something), then forget it."""
        with socket.create_connection(self.addr, timeout=2):
            pass
        deadline = time.monotonic() + 2
        while not self.connections and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.connections) == 1, f"listener on {self.addr} did not see its own test connection"
        self.connections.clear()

    def _accept(self) -> None:
        while True:
            try:
                conn, peer = self.sock.accept()
            except OSError:
                return
            self.connections.append(peer)
            conn.close()
