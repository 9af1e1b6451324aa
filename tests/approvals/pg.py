"""A real PostgreSQL server for the approval tests: Debian's ``postgresql`` binaries, a
cluster made with ``initdb`` in a temporary directory, run with ``pg_ctl`` as the
unprivileged ``postgres`` user (postgres(1) refuses to run as root), listening on a random
port of 127.0.0.1 only, password (SCRAM) authentication, removed when done.

Used by ``tests/approvals/conftest.py`` (fixtures ``postgres`` and ``store_url``) and, for
``cargo test`` of gate_core, as a program: ``python3 tests/approvals/pg.py`` prints one
line ``postgresql://gatewrap:PASSWORD@127.0.0.1:PORT/gatewrap`` and keeps the server until
its standard input closes (or it gets SIGTERM/SIGINT).
"""

from __future__ import annotations

import glob
import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile

#: The superuser of the test cluster and its first database.
USER = "gatewrap"


def _bin(name: str) -> str:
    """``name`` from the newest /usr/lib/postgresql/*/bin (Debian keeps them off PATH)."""
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path is None:
        raise FileNotFoundError(f"{name} not found: install Debian's postgresql (scripts/setup.sh test-deps)")
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PostgresServer:
    """One test cluster. ``start()`` then ``url(db)``, ``create_database()``; ``stop()``."""

    def __init__(self, owner: str = "postgres") -> None:
        self.owner = pwd.getpwnam(owner)
        self.password = secrets.token_urlsafe(12)
        self.dir = tempfile.mkdtemp(prefix="gwt-pg-")
        self.data = os.path.join(self.dir, "data")
        self.port = 0

    def _as_owner(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        return subprocess.run(argv, user=self.owner.pw_uid, group=self.owner.pw_gid, extra_groups=[],
                              cwd=self.dir, capture_output=True, text=True, check=True, **kw)

    def start(self) -> "PostgresServer":
        """initdb + pg_ctl start (waits until it accepts connections); on a failure
        everything made is removed again.

        Raises:
            subprocess.CalledProcessError: initdb or pg_ctl failed (its output in ``stderr``).
        """
        try:
            return self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> "PostgresServer":
        os.chown(self.dir, self.owner.pw_uid, self.owner.pw_gid)
        os.chmod(self.dir, 0o700)
        pwfile = os.path.join(self.dir, "pw")
        with open(pwfile, "w") as f:
            f.write(self.password + "\n")
        os.chown(pwfile, self.owner.pw_uid, self.owner.pw_gid)
        self._as_owner([_bin("initdb"), "-D", self.data, "-U", USER, f"--pwfile={pwfile}", "-A", "scram-sha-256",
                        "-E", "UTF8", "--no-sync"])
        os.unlink(pwfile)
        for attempt in range(5):  # noqa: B007  # the port was free a moment ago; another process may take it
            self.port = _free_port()
            try:
                self._as_owner([_bin("pg_ctl"), "-D", self.data, "-w", "-t", "60", "-l",
                                os.path.join(self.dir, "log"), "-o",
                                f"-h 127.0.0.1 -p {self.port} -k {self.dir} -c fsync=off", "start"])
                break
            except subprocess.CalledProcessError:
                if attempt == 4:
                    raise
        self._psql(f"create database {USER}", db="postgres")
        return self

    def _psql(self, sql: str, db: str = USER) -> str:
        env = {**os.environ, "PGPASSWORD": self.password}
        return subprocess.run([_bin("psql"), "-X", "-q", "-A", "-t", "-h", "127.0.0.1", "-p", str(self.port),
                               "-U", USER, "-d", db, "-c", sql], env=env, capture_output=True, text=True,
                              check=True).stdout

    def url(self, db: str = USER) -> str:
        """``postgresql://gatewrap:PASSWORD@127.0.0.1:PORT/DB``."""
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/{db}"

    def create_database(self) -> str:
        """A new empty database; returns its URL."""
        name = "t_" + secrets.token_hex(6)
        self._psql(f"create database {name}")
        return self.url(name)

    def stop(self) -> None:
        """Stop the server (fast shutdown) and remove its directory."""
        if self.port:
            subprocess.run([_bin("pg_ctl"), "-D", self.data, "-m", "fast", "-w", "stop"], user=self.owner.pw_uid,
                           group=self.owner.pw_gid, extra_groups=[], cwd=self.dir, capture_output=True)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "PostgresServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with PostgresServer() as server:
        print(server.url(), flush=True)
        try:
            sys.stdin.read()
        except KeyboardInterrupt:
            pass
