"""Squid and tinyproxy as forward proxies on loopback, configured for the benchmark only:
everything allowed (CONNECT to any port too), no cache, ``MaxClients``/file descriptors
raised above the largest concurrency measured. Squid keeps its access log (buffered);
tinyproxy logs only critical messages: at its default level it writes several lines per
request, each costing ~4 ms here, which would measure its log rather than its proxying."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

from .common import need
from .ports import listening, wait_listening

SQUID_PORT, TINYPROXY_PORT = 13128, 18888

SQUID_CONF = """
http_port 127.0.0.1:{port}
acl all_src src all
http_access allow all
cache deny all
cache_mem 8 MB
access_log {access_log}
cache_log {d}/squid-cache.log
pid_filename {d}/squid.pid
coredump_dir {d}
max_filedescriptors 16384
shutdown_lifetime 0 seconds
dns_v4_first on
"""

TINYPROXY_CONF = """
Port {port}
Listen 127.0.0.1
User nobody
Group nogroup
Timeout 60
MaxClients 2048
LogFile "{d}/tinyproxy.log"
LogLevel Critical
PidFile "{d}/tinyproxy.pid"
DisableViaHeader Yes
"""


class Proxy:
    """A peer proxy process; ``with Squid(tmp) as p: p.port``. Raises Missing when the
    program is not installed, RuntimeError when it does not come up."""

    name = ""
    port = 0

    def __init__(self, tmp: str) -> None:
        self.d = os.path.join(tmp, self.name)
        os.makedirs(self.d, exist_ok=True)
        shutil.chown(self.d, "nobody", "nogroup")
        os.chmod(self.d, 0o777)
        self.proc: subprocess.Popen | None = None

    def argv(self) -> list[str]:
        raise NotImplementedError

    def __enter__(self) -> "Proxy":
        if listening(self.port):
            raise RuntimeError(f"127.0.0.1:{self.port} is in use by another program (ss -ltnp)")
        argv = self.argv()
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        try:
            wait_listening(self.proc, [self.port], self.name, timeout=60)
        except RuntimeError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Squid(Proxy):
    name, port = "squid", SQUID_PORT
    #: Squid's ``access_log`` (``{d}``: its directory); ``none`` measures it without one
    #: (``bench/gate_cell.py --squid-log none``: what its access-log line costs).
    access_log = "stdio:{d}/squid-access.log"

    def argv(self) -> list[str]:
        exe = need("squid")
        conf = os.path.join(self.d, "squid.conf")
        with open(conf, "w") as f:
            f.write(SQUID_CONF.format(port=self.port, d=self.d, access_log=self.access_log.format(d=self.d)))
        return [exe, "-N", "-f", conf]


class Tinyproxy(Proxy):
    name, port = "tinyproxy", TINYPROXY_PORT

    def argv(self) -> list[str]:
        exe = need("tinyproxy")
        conf = os.path.join(self.d, "tinyproxy.conf")
        with open(conf, "w") as f:
            f.write(TINYPROXY_CONF.format(port=self.port, d=self.d))
        return [exe, "-d", "-c", conf]
