#!/usr/bin/env python3
"""Issue 23, target 5: one agent cannot slow another. A victim run fetches through its gate
every 50 ms while a neighbour run attacks with only its own connections to its own gate; the
victim's p50/p99 (ms) and requests/s at rest and under each attack, in both modes:

- ``shared``: both gates in one process on the shared runtime (``Gate(shared_runtime=True)``),
  as the daemon serves every run;
- ``own``: each gate in a process of its own with a runtime of its own (runs of their own).

Each gate listens in a netns of its own (ip-netns(8)) and attributes connections to the
processes of a cgroup of its own (``run_cgroup``, as a run's gate does); the victim's and the
attacker's processes are in those netns and cgroups. The upstream is a Python HTTP server on
127.0.0.1 (host netns); names under ``fail.test`` resolve at a nameserver of this bench that
never answers (the gate's lookups time out). No hooks, no nsjail: the gate is what is measured.

Attacks (each ``--secs`` seconds after a 2 s start):
  hold          5,000 sockets opened and held (the gate keeps 1,024 per run)
  slow-heads    1,000 connections sending a request head one byte a second
  tls-halfopen  1,000 CONNECTs to an inspected rule, then no TLS handshake
  dns-fail      1,000 CONNECTs in flight to names whose lookup never answers
  malformed     raw bytes, bad HTTP, an h2 preface, TLS garbage, a WebSocket upgrade abused
  churn         1,500 idle processes + 600 held connections + connect-and-drop churn

Usage (root; under ``flock /tmp/gatewrap-kernel.lock``):
  .venv/bin/python bench/neighbour.py [--modes shared,own] [--attacks hold,...] [--secs 10]
``GATEWRAP_PYTHON=/path/to/python`` runs another build's gate (e.g. main's, for "before").
Prints one JSON object per cell as it goes, then the table; writes bench/results/neighbour.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "bench", "results")
PY = os.environ.get("GATEWRAP_PYTHON", os.path.join(ROOT, ".venv", "bin", "python"))
UPSTREAM_PORT, TLS_PORT, DNS_PORT = 18091, 18443, 18053
GATE_PORT = 3128
CGROUP_ROOT = "/sys/fs/cgroup/unified"
ATTACKS = ("hold", "slow-heads", "tls-halfopen", "dns-fail", "malformed", "churn")
POLICY = f"""version = 1
[[rule]]
host = "127.0.0.1"
ports = [{UPSTREAM_PORT}]
action = "allow"
[[rule]]
host = "127.0.0.1"
ports = [{TLS_PORT}]
action = "allow"
inspect = true
[[rule]]
host = "*.fail.test"
action = "allow"
"""

# --- the gates' process -------------------------------------------------------------------


def serve_gates(spec: list[dict], shared: bool) -> None:
    """Start one gate per entry of ``spec`` (run_id, netns, cgroup, tmp), print "ready" and
    this process's thread count every second on stdout until stdin closes."""
    from gatewrap import _gate_core as core

    gates = []
    for s in spec:
        audit = core.AuditLog(os.path.join(s["tmp"], f"{s['run_id']}.jsonl"), key=None)
        gates.append(core.Gate(run_id=s["run_id"], netns_path=s["netns"], policy=core.Policy.from_toml(POLICY, "nb.toml"),
                               audit=audit, listen_port=GATE_PORT, nameservers=[f"127.0.0.1:{DNS_PORT}"],
                               connect_timeout=5.0, ca_dir=os.path.join(s["tmp"], "ca-" + s["run_id"]),
                               run_cgroup=s["cgroup"], shared_runtime=shared))
    print("ready", flush=True)
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
    while not stop.wait(0.5):
        print(f"threads {len(os.listdir('/proc/self/task'))}", flush=True)
    for g in gates:
        g.stop()


# --- processes inside a run --------------------------------------------------------------


def join(cgroup: str) -> None:
    """Put this process in ``cgroup`` (its children follow)."""
    with open(os.path.join(cgroup, "cgroup.procs"), "w") as f:
        f.write(str(os.getpid()))


def victim(secs: float) -> None:
    """A new connection and one GET every 50 ms for ``secs``; prints the latencies (ms)."""
    lat, errors = [], 0
    req = f"GET http://127.0.0.1:{UPSTREAM_PORT}/ HTTP/1.1\r\nHost: 127.0.0.1:{UPSTREAM_PORT}\r\nConnection: close\r\n\r\n".encode()
    end = time.monotonic() + secs
    while time.monotonic() < end:
        t0 = time.monotonic()
        try:
            with socket.create_connection(("127.0.0.1", GATE_PORT), timeout=10) as s:
                s.sendall(req)
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            if data.split(b"\r\n", 1)[0].split(b" ")[1:2] != [b"200"]:
                errors += 1
            else:
                lat.append((time.monotonic() - t0) * 1000)
        except OSError:
            errors += 1
        time.sleep(max(0.0, 0.05 - (time.monotonic() - t0)))
    print(json.dumps({"lat": lat, "errors": errors, "secs": secs}), flush=True)


def _conns(n: int, end: float) -> list[socket.socket]:
    """Up to ``n`` connections to the gate, opened until the time ``end`` (monotonic)."""
    out = []
    for _ in range(n):
        if time.monotonic() > end:
            break
        try:
            out.append(socket.create_connection(("127.0.0.1", GATE_PORT), timeout=5))
        except OSError:
            pass
    return out


def attack(kind: str, secs: float) -> None:
    """The neighbour's attack ``kind`` for ``secs`` (see the module's docstring)."""
    import resource
    resource.setrlimit(resource.RLIMIT_NOFILE, (20000, 20000))
    end = time.monotonic() + secs
    held: list[socket.socket] = []
    if kind == "hold":
        held = _conns(5000, end)
        time.sleep(max(0.0, end - time.monotonic()))
    elif kind == "slow-heads":
        held = _conns(1000, end)
        head = b"GET http://127.0.0.1/ HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"a" * 200
        i = 0
        while time.monotonic() < end:
            for s in held:
                try:
                    s.send(head[i % len(head):i % len(head) + 1])
                except OSError:
                    pass
            i += 1
            time.sleep(1)
    elif kind == "tls-halfopen":
        held = _conns(1000, end)
        for s in held:
            try:
                s.sendall(f"CONNECT 127.0.0.1:{TLS_PORT} HTTP/1.1\r\nHost: 127.0.0.1:{TLS_PORT}\r\n\r\n".encode())
            except OSError:
                pass
        time.sleep(max(0.0, end - time.monotonic()))
    elif kind == "dns-fail":
        import selectors
        sel = selectors.DefaultSelector()
        n = 0

        def one() -> None:
            nonlocal n
            n += 1
            try:
                s = socket.create_connection(("127.0.0.1", GATE_PORT), timeout=5)
                s.sendall(f"CONNECT x{n}.fail.test:443 HTTP/1.1\r\nHost: x{n}.fail.test:443\r\n\r\n".encode())
                s.setblocking(False)
                sel.register(s, selectors.EVENT_READ)
            except OSError:
                pass

        for _ in range(1000):
            one()
        while time.monotonic() < end:
            for key, _ in sel.select(0.2):
                sel.unregister(key.fileobj)
                key.fileobj.close()
                one()
    elif kind == "malformed":
        payloads = [os.urandom(512), b"GET / HTTP/9.9\r\n\r\n", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
                    b"\x16\x03\x01\x02\x00" + os.urandom(300), b"GET\x00 http://a/ HTTP/1.1\r\n\r\n",
                    (f"GET http://127.0.0.1:{UPSTREAM_PORT}/ HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
                     "Connection: Upgrade\r\nSec-WebSocket-Key: x\r\nSec-WebSocket-Version: 13\r\n\r\n").encode() + os.urandom(4096)]

        def loop() -> None:
            i = 0
            while time.monotonic() < end:
                try:
                    with socket.create_connection(("127.0.0.1", GATE_PORT), timeout=2) as s:
                        s.sendall(payloads[i % len(payloads)])
                        s.recv(4096)
                except OSError:
                    pass
                i += 1

        ts = [threading.Thread(target=loop) for _ in range(16)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    elif kind == "churn":
        kids = []
        for _ in range(1500):
            pid = os.fork()
            if pid == 0:
                time.sleep(secs + 30)
                os._exit(0)
            kids.append(pid)
        held = _conns(600, end)
        while time.monotonic() < end:
            try:
                socket.create_connection(("127.0.0.1", GATE_PORT), timeout=2).close()
            except OSError:
                pass
        for pid in kids:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
    else:
        raise SystemExit(f"unknown attack {kind}")
    for s in held:
        s.close()


# --- the orchestration --------------------------------------------------------------------


class Upstream(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        body = b"x" * 99 + b"\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *a: object) -> None:
        pass


def black_hole() -> socket.socket:
    """A nameserver that reads queries and never answers."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", DNS_PORT))
    threading.Thread(target=lambda: [s.recv(4096) for _ in iter(int, 1)], daemon=True).start()
    t = socket.socket()
    t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    t.bind(("127.0.0.1", DNS_PORT))
    t.listen(1024)  # TCP queries: accepted by the kernel's backlog, never answered
    return s


class Run:
    """A netns and a cgroup of one run; ``cmd(argv)`` runs argv in both."""

    def __init__(self, name: str) -> None:
        self.name = f"nbench-{name}-{os.getpid()}"
        self.netns = f"/run/netns/{self.name}"
        self.cgroup = os.path.join(CGROUP_ROOT, self.name)

    def __enter__(self) -> "Run":
        subprocess.run(["ip", "netns", "add", self.name], check=True)
        subprocess.run(["ip", "-n", self.name, "link", "set", "lo", "up"], check=True)
        os.mkdir(self.cgroup)
        return self

    def cmd(self, *args: str) -> list[str]:
        return ["nsenter", f"--net={self.netns}", sys.executable, os.path.abspath(__file__), "--in-cgroup", self.cgroup, *args]

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "netns", "delete", self.name], check=False)
        for _ in range(50):
            try:
                os.rmdir(self.cgroup)
                break
            except OSError:
                with open(os.path.join(self.cgroup, "cgroup.procs")) as f:
                    for pid in f.read().split():
                        try:
                            os.kill(int(pid), 9)
                        except ProcessLookupError:
                            pass
                time.sleep(0.1)


def summary(out: dict) -> dict:
    lat = sorted(out["lat"])
    q = statistics.quantiles(lat, n=100) if len(lat) >= 2 else [float("nan")] * 99
    return {"p50": round(q[49], 1), "p99": round(q[98], 1), "rps": round(len(lat) / out["secs"], 1),
            "errors": out["errors"], "n": len(lat)}


def cell(victim_run: Run, attacker: Run, kind: str | None, secs: float) -> dict:
    """The victim's figures for ``secs`` while the attacker runs ``kind`` (None: at rest)."""
    atk = None
    if kind:
        atk = subprocess.Popen(attacker.cmd("--attack", kind, "--secs", str(secs + 4)))
        time.sleep(2)
    v = subprocess.run(victim_run.cmd("--victim", "--secs", str(secs)), capture_output=True, text=True, check=True)
    if atk:
        try:
            atk.wait(secs + 10)
        except subprocess.TimeoutExpired:
            atk.kill()
            atk.wait()
    time.sleep(1)
    return summary(json.loads(v.stdout.strip().splitlines()[-1]))


def mode(name: str, attacks: list[str], secs: float, tmp: str) -> dict:
    res: dict = {}
    with Run("victim") as vr, Run("attacker") as ar:
        spec = [{"run_id": r.name, "netns": r.netns, "cgroup": r.cgroup, "tmp": tmp} for r in (vr, ar)]
        groups = [spec] if name == "shared" else [[s] for s in spec]
        hosts = [subprocess.Popen([PY, os.path.abspath(__file__), "--gates", json.dumps(g)] + (["--shared"] if name == "shared" else []),
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True) for g in groups]
        peaks = [0] * len(hosts)

        def watch(i: int, p: subprocess.Popen) -> None:
            for line in p.stdout:
                if line.startswith("threads "):
                    peaks[i] = max(peaks[i], int(line.split()[1]))
        try:
            for p in hosts:
                assert p.stdout.readline().strip() == "ready"
            for i, p in enumerate(hosts):
                threading.Thread(target=watch, args=(i, p), daemon=True).start()
            for kind in [None, *attacks]:
                r = cell(vr, ar, kind, secs)
                r["gate_threads_peak"] = list(peaks)
                res[kind or "rest"] = r
                print(json.dumps({"mode": name, "attack": kind or "rest", **r}), flush=True)
        finally:
            for p in hosts:
                p.stdin.close()
                p.wait(30)
    return res


def table(results: dict) -> str:
    lines = ["| mode | attack | victim p50 / p99 (ms) | req/s | p99 × rest | req/s × rest | gate threads (peak) |",
             "|---|---|---|---|---|---|---|"]
    for m, cells in results.items():
        rest = cells["rest"]
        for k, c in cells.items():
            lines.append(f"| {m} | {k} | {c['p50']} / {c['p99']} | {c['rps']} | {c['p99'] / rest['p99']:.2f} | "
                         f"{c['rps'] / max(rest['rps'], 0.1):.2f} | {c['gate_threads_peak']} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modes", default="shared,own")
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--secs", type=float, default=10)
    ap.add_argument("--in-cgroup", help=argparse.SUPPRESS)
    ap.add_argument("--victim", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--attack", help=argparse.SUPPRESS)
    ap.add_argument("--gates", help=argparse.SUPPRESS)
    ap.add_argument("--shared", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.in_cgroup:
        join(a.in_cgroup)
    if a.gates:
        serve_gates(json.loads(a.gates), a.shared)
        return 0
    if a.victim:
        victim(a.secs)
        return 0
    if a.attack:
        attack(a.attack, a.secs)
        return 0
    if os.geteuid() != 0:
        sys.exit("root needed (netns, cgroups)")
    server = ThreadingHTTPServer(("127.0.0.1", UPSTREAM_PORT), Upstream)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    black_hole()
    tmp = tempfile.mkdtemp(prefix="gw-neighbour-")
    results = {}
    try:
        for m in a.modes.split(","):
            results[m] = mode(m, [k for k in a.attacks.split(",") if k], a.secs, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(RESULTS, exist_ok=True)
    with open(os.path.join(RESULTS, "neighbour.json"), "w") as f:
        json.dump({"python": PY, "load": os.getloadavg(), "results": results}, f, indent=1)
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
