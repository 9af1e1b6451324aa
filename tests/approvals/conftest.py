"""Fixtures of the approval tests (owned by the CLI side; the gate_core side's Python tests use
them too): a real PostgreSQL server, the store URL parametrised over SQLite and PostgreSQL,
a loopback HTTP server that records what it receives (the webhook's receiver), and headless
Chromium through Selenium.
"""

from __future__ import annotations

import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from .pg import PostgresServer

ROOT = Path(__file__).resolve().parents[2]
#: Screenshots of the review page (untracked: tests/artifacts/ is in .gitignore).
ARTIFACTS = ROOT / "tests" / "artifacts"
BACKENDS = ("sqlite", "postgresql")


@pytest.fixture(scope="session")
def postgres():
    """One PostgreSQL server for the session (initdb + pg_ctl in a temporary folder, as the
    ``postgres`` user, 127.0.0.1 on a random port); each test takes a database of its own."""
    with PostgresServer() as server:
        yield server


@pytest.fixture(params=BACKENDS)
def store_url(request, tmp_path):
    """The URL of a fresh, empty store: ``sqlite:<tmp>/state.db``, then a new PostgreSQL
    database (the same test runs on both)."""
    if request.param == "sqlite":
        return f"sqlite:{tmp_path}/state.db"
    return request.getfixturevalue("postgres").create_database()


@pytest.fixture
def store(store_url):
    """The ``ApprovalStore`` at :func:`store_url`."""
    from gatewrap import _gate_core as core

    return core.ApprovalStore(store_url)


@dataclass
class Received:
    """One request the :func:`receiver` got."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self):
        return json.loads(self.body)


@dataclass
class Receiver:
    """A loopback HTTP server answering ``status`` to everything and keeping each request."""

    url: str
    got: list[Received] = field(default_factory=list)
    status: int = 200
    arrived: threading.Condition = field(default_factory=threading.Condition)

    def wait(self, n: int = 1, timeout: float = 30.0) -> list[Received]:
        """Wait until ``n`` requests arrived (a bound, not a timing assertion)."""
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.got) >= n, timeout)
        return list(self.got)


@pytest.fixture
def receiver():
    """A :class:`Receiver` on 127.0.0.1 (a random port)."""
    rec: Receiver

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
            with rec.arrived:
                rec.got.append(Received("POST", self.path, {k.lower(): v for k, v in self.headers.items()}, body))
                rec.arrived.notify_all()
            self.send_response(rec.status)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    rec = Receiver(f"http://127.0.0.1:{server.server_address[1]}/hook")
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield rec
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="session")
def chromium():
    """Headless Chromium (Debian's ``chromium`` + ``chromium-driver``) through Selenium."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    driver_path = shutil.which("chromedriver") or "/usr/bin/chromedriver"
    if not os.path.exists(driver_path):
        pytest.fail("chromedriver not found: install Debian's chromium-driver (scripts/setup.sh test-deps)")
    opts = webdriver.ChromeOptions()
    opts.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1100,1400", "--no-proxy-server"):
        opts.add_argument(arg)
    driver = webdriver.Chrome(service=Service(driver_path), options=opts)
    yield driver
    driver.quit()


@pytest.fixture
def artifacts():
    """tests/artifacts/ (made if missing; untracked)."""
    ARTIFACTS.mkdir(exist_ok=True)
    return ARTIFACTS
