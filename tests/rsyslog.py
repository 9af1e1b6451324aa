"""A real rsyslogd (Debian's package) for the shipping tests: imtcp on a free loopback port,
plain or TLS (the gtls driver, rsyslog-gnutls), writing what it received, as it parsed it,
to a JSON-lines file (one object a message: RFC 5424's fields by rsyslog's property names)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

#: The fields written per message: our name -> rsyslog's property (rsyslog's property docs).
FIELDS = {"version": "protocol-version", "facility": "syslogfacility", "severity": "syslogseverity",
          "hostname": "hostname", "app": "app-name", "procid": "procid", "msgid": "msgid",
          "sd": "structured-data", "msg": "msg"}


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (the kernel's pick for port 0)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def config(folder: Path, port: int, out: Path, tls: tuple[str, str, str] | None = None) -> str:
    """An rsyslog configuration (RainerScript): imtcp on 127.0.0.1:``port`` (with ``tls`` =
    (CA, certificate, key) PEM paths: gtls, anonymous client authentication), messages of
    up to 64 KiB, every message written to ``out`` by the template of :data:`FIELDS`."""
    fields = ' constant(value=",")\n'.join(
        f'  property(outname="{k}" name="{v}" format="jsonf")' for k, v in FIELDS.items())
    glob = f'global(workDirectory="{folder}" maxMessageSize="64k"'
    mod = 'module(load="imtcp"'
    if tls:
        ca, cert, key = tls
        glob += (f' defaultNetstreamDriver="gtls" defaultNetstreamDriverCAFile="{ca}"'
                 f' defaultNetstreamDriverCertFile="{cert}" defaultNetstreamDriverKeyFile="{key}"')
        mod += ' streamDriver.name="gtls" streamDriver.mode="1" streamDriver.authMode="anon"'
    return (f'{glob})\n{mod})\ninput(type="imtcp" address="127.0.0.1" port="{port}")\n'
            f'template(name="fields" type="list") {{\n  constant(value="{{")\n{fields}\n'
            f'  constant(value="}}\\n")\n}}\n'
            f'action(type="omfile" file="{out}" template="fields")\n')


class Rsyslog:
    """rsyslogd in the foreground (``-n -f CONFIG -i PIDFILE``) on its own port; ``received()``
    parses what it wrote. Start again after :meth:`kill` on the same port and file."""

    def __init__(self, folder: Path, tls: tuple[str, str, str] | None = None, text: str | None = None) -> None:
        """``text``: a configuration of one's own instead of :func:`config`'s, its port
        written ``{port}`` and its work directory ``{folder}``."""
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.out = folder / "received.jsonl"
        self.conf = folder / "rsyslog.conf"
        self.conf.write_text(config(folder, self.port, self.out, tls) if text is None
                             else text.replace("{port}", str(self.port)).replace("{folder}", str(folder)))
        self.proc: subprocess.Popen | None = None
        self.log = open(folder / "rsyslogd.stderr", "ab")

    @staticmethod
    def binary() -> str | None:
        return shutil.which("rsyslogd") or ("/usr/sbin/rsyslogd" if os.path.exists("/usr/sbin/rsyslogd") else None)

    def check(self) -> subprocess.CompletedProcess:
        """rsyslog's own check of the configuration (``-N1``)."""
        return subprocess.run([self.binary(), "-N1", "-f", str(self.conf)], capture_output=True, text=True)

    def start(self, wait: float = 30.0) -> None:
        """Start rsyslogd and wait until its port accepts connections."""
        self.proc = subprocess.Popen([self.binary(), "-n", "-f", str(self.conf), "-i", str(self.folder / "pid")],
                                     stdout=self.log, stderr=self.log)
        deadline = time.monotonic() + wait
        while True:
            assert self.proc.poll() is None, f"rsyslogd exited: {(self.folder / 'rsyslogd.stderr').read_text()}"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def kill(self) -> None:
        """SIGKILL rsyslogd (a collector that dies, not one that stops cleanly)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        self.proc = None
        self.log.close()

    def received(self) -> list[dict]:
        """Every message rsyslog wrote, as parsed by it (complete lines only)."""
        if not self.out.exists():
            return []
        return [json.loads(line) for line in self.out.read_bytes().split(b"\n")[:-1]]

    def wait_for(self, msgs: set[str], wait: float = 60.0) -> list[dict]:
        """:meth:`received` once every MSG in ``msgs`` is there (fails after ``wait`` seconds)."""
        deadline = time.monotonic() + wait
        while True:
            got = self.received()
            missing = msgs - {m["msg"] for m in got}
            if not missing:
                return got
            assert time.monotonic() < deadline, f"rsyslog did not receive {len(missing)} lines, e.g. {min(missing)}"
            time.sleep(0.1)
