"""Small helpers shared by the server scripts (imported by path, no package needed)."""

from __future__ import annotations

import json
import os
import sys
import threading
import time


class JsonLog:
    """Append-only JSON-lines log. Each record is one ``write(2)`` on an O_APPEND fd,
    so lines from many threads never interleave and the file may be truncated
    by the host at any time (the next line then starts at offset 0)."""

    def __init__(self, path: str):
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, **record) -> None:
        record.setdefault("ts", time.time())
        os.write(self.fd, (json.dumps(record, sort_keys=True) + "\n").encode())


def exit_when_parent_goes() -> None:
    """The host keeps our stdin pipe open; EOF means it died: exit at once so
    no server outlives the test process (even on SIGKILL of pytest)."""

    def watch() -> None:
        try:
            while sys.stdin.buffer.read(4096):
                pass
        finally:
            os._exit(0)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def norm_ip(ip: str) -> str:
    """'::ffff:1.2.3.4' (v4 peer on a dual-stack socket) -> '1.2.3.4'; strip any %scope."""
    ip = ip.split("%", 1)[0]
    if ip.startswith("::ffff:") and "." in ip:
        return ip[7:]
    return ip
