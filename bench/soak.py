#!/usr/bin/env python3
"""Soak: one agent under ``gatewrap run`` for ``--minutes`` (default 15), fetching, denied and
refused at the kernel every second; what an hours-long run needs and no test covers.

The agent (uid 65534, Debian's /usr/bin/python3, urllib and socket only) does, once a second:

- **fetch**: ``GET http://allowed.soak.test/`` through the gate (HTTP_PROXY): must be 200;
- **deny**: ``GET http://denied.soak.test/`` through the gate: must be 403 (policy);
- **direct**: a TCP connect straight to the upstream's address: must fail with EPERM (the
  kernel hooks);

and prints its own tally at the end. Meanwhile this script samples every ``--interval``
seconds (default 10), from /proc (proc(5)): VmRSS, open fds (/proc/PID/fd) and threads of
gatewrap's process (a run of its own: the ``gatewrap run`` process, which holds the gate; a
shared run, ``--shared``: the ``gatewrap daemon``), and the audit log's size and records.

At the end, per mode:

- **nothing lost**: the agent's 200s against the log's allowed request records with status
  200 for allowed.soak.test (and the requests the upstream server received), its 403s
  against the denied request records for denied.soak.test, its EPERMs against the
  direct_egress records to the upstream's address (kernel denials are folded: their
  ``count`` fields are summed; a gate record with a ``count`` is summed the same way). Each
  pair must be equal, and nothing else may have happened (no other outcome in the tally).
- **alive past 600 s**: nsjail's default ``time_limit`` (600 s) killed every jailed agent
  until the profile set ``time_limit: 0``; a run of ``--minutes`` above 10 shows it holds.
- **growth**: the least-squares slope of RSS, fds and threads over the second half of the
  samples (the first half is warm-up: caches, pools). "Flat" when the fitted line's rise over
  that half is within ``--rss-tolerance`` KiB (default 512) and ``--count-tolerance`` fds or
  threads (default 1); the slope per hour is printed too. Samples begin with the agent's first
  request. Below ~5 minutes the second half is still warm-up (the gate runtime's blocking
  pool, threads gate-2 and up, grows to what the load needs in the first minute or two):
  short runs are for trying the soak out.

The hooks are the host's (/sys/fs/bpf/gatewrap): when they are loaded again during the soak
(another gatewrap build's run, a test's unload) every live run's sockets are refused from
then on, unrecorded; the soak samples the pin folders and says when that happened.

The fake internet is this script's own (the test suite's host lock is not taken): a netns
``gwsoak-<pid>`` behind a veth ``gwsk<pid>``, with an HTTP server (Python's http.server) and
the test suite's DNS server (tests/fakenet/dns_server.py) on one address of 198.18.0.0/24
(RFC 2544's range for benchmarks, 198.18.0.0/15; not TEST-NET-3, 203.0.113.0/24, which a
workplace may route to real hosts: here the package registries answer at 203.0.113.80, and a
soak on 203.0.113.64/26 cut them off; the tests use 198.51.100.0/24 and 2001:db8::/32): a run
of its own uses 198.18.0.0/26, a shared run 198.18.0.64/26, so one soak of each mode can run
at the same time. A slot that overlaps a route this host already has is refused. The gate is told the range is public with ``--public-range`` (the documented
setting the tests use). Nothing is sent anywhere else; the netns, the veth and the servers
are removed on exit (Ctrl-C and SIGTERM included; a netns left by a killed soak is removed by
the next one).

A shared run uses a daemon of this script's own on /run/gatewrap/soak.sock, not the host's.
Writes bench/results/soak-<mode>.json (``--json PATH`` for another place) and keeps the audit
log in bench/results/soak-<mode>/. Exit status: 0 when every verdict holds, 1 when one does
not, 2 when the soak could not be set up.

Usage: sudo .venv/bin/python bench/soak.py [--minutes 15] [--shared] [--interval 10] [--json PATH]
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from harness.common import AGENT_UID, RESULTS, VENV_PY, SharedDaemon, agent_env  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests"))
from fakenet.internet import in_netns  # noqa: E402
from gatewrap.bpf.loader import PIN_ROOT  # noqa: E402

#: The agent's interpreter: Debian's, readable by uid 65534 (as in the tests).
AGENT_PYTHON = "/usr/bin/python3"
#: The daemon of a shared soak: its own, never the host's (nor another bench's or test's).
SOCKET = "/run/gatewrap/soak.sock"
NETNS_PREFIX = "gwsoak-"
IF_PREFIX = "gwsk"  # + pid: at most 11 characters, below IFNAMSIZ (16 with the NUL)
INET_IF = "veth0"
#: Each mode's slice of RFC 2544's benchmarking range (198.18.0.0/15): the host's end of the
#: veth is the first address, the upstream's (HTTP :80, DNS :53) the second.
SLOTS = {"own": "198.18.0.0/26", "shared": "198.18.0.64/26"}
ALLOWED = "allowed.soak.test"
DENIED = "denied.soak.test"
DNS_SERVER = os.path.join(ROOT, "tests", "fakenet", "dns_server.py")
#: Where nsjail's old default would have killed the agent (seconds; nsjail's config.proto).
NSJAIL_DEFAULT_TIME_LIMIT = 600

#: The agent: argv is SECONDS ALLOWED_URL DENIED_URL DIRECT_IP DIRECT_PORT. Prints a progress
#: line (JSON) every minute and its tally (JSON, "final": true) at the end.
AGENT = r"""
import errno, json, socket, sys, time, urllib.error, urllib.request
seconds, allowed, denied, ip, port = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])
opener = urllib.request.build_opener(urllib.request.ProxyHandler())  # HTTP_PROXY: the gate
tally = {"fetch_200": 0, "deny_403": 0, "direct_eperm": 0, "other": {}, "other_s": {}}
def other(what):  # an unexpected outcome: counted, with when it was first and last seen
    tally["other"][what] = tally["other"].get(what, 0) + 1
    t = round(time.monotonic() - start, 1)
    tally["other_s"][what] = [tally["other_s"].get(what, [t])[0], t]
def failure(e):
    return f"{type(e).__name__} {errno.errorcode.get(getattr(e, 'errno', None), '')}".strip()
def status(url):
    try:
        with opener.open(url, timeout=10) as r:
            r.read()
            return r.status
    except urllib.error.HTTPError as e:
        e.read()
        return e.code
    except Exception as e:
        reason = getattr(e, "reason", None)  # URLError wraps the OSError
        return failure(reason if isinstance(reason, OSError) else e)
start = time.monotonic()
tick = start
n = 0
while True:
    now = time.monotonic()
    if tick > now:
        time.sleep(tick - now)
    if time.monotonic() - start >= seconds:
        break
    s = status(allowed)
    if s == 200: tally["fetch_200"] += 1
    else: other(f"fetch: {s}")
    s = status(denied)
    if s == 403: tally["deny_403"] += 1
    else: other(f"deny: {s}")
    try:
        with socket.socket() as sock:
            sock.settimeout(5)
            try:
                sock.connect((ip, port))
                other("direct: connected")
            except OSError as e:
                if e.errno == errno.EPERM: tally["direct_eperm"] += 1
                else: other(f"direct: {failure(e)}")
    except OSError as e:  # socket() itself refused (the hooks' fail-closed state)
        other(f"direct: socket() {failure(e)}")
    tick = max(tick + 1, time.monotonic())  # a late tick is skipped, never made up in a burst
    n += 1
    if n % 60 == 0:
        print(json.dumps({"elapsed_s": round(time.monotonic() - start, 1), **tally}), flush=True)
print(json.dumps({"final": True, "elapsed_s": round(time.monotonic() - start, 1), **tally}), flush=True)
"""

#: The upstream's HTTP server (in the netns; argv: ADDRESS): 200 and a short body for every
#: GET, one line on stdout per request (Host and path); exits when its stdin closes (the soak
#: died), as the fake internet's servers do.
UPSTREAM = r"""
import http.server, os, sys, threading
class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def do_GET(self):
        body = b"soak ok\n"
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        print(self.headers.get("Host", ""), self.path, flush=True)
    def log_message(self, *a):
        pass
def watch():
    while sys.stdin.buffer.read(4096):
        pass
    os._exit(0)
threading.Thread(target=watch, daemon=True).start()
http.server.ThreadingHTTPServer((sys.argv[1], 80), Handler).serve_forever()
"""


class SoakError(Exception):
    """The soak could not be set up; the message says what to do."""


def _ip(*args: str, input: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    p = subprocess.run(["ip", *args], input=input, capture_output=True, text=True, timeout=20)
    if check and p.returncode != 0:
        raise SoakError(f"ip {' '.join(args)}: {p.stderr.strip()}")
    return p


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def remove_leftovers() -> list[str]:
    """Delete every ``gwsoak-<pid>`` netns whose soak (``pid``) is gone, its processes killed
    first (its veth goes with it); returns their names."""
    gone = []
    for ns in sorted(os.listdir("/run/netns")) if os.path.isdir("/run/netns") else []:
        pid = ns.removeprefix(NETNS_PREFIX)
        if ns.startswith(NETNS_PREFIX) and pid.isdigit() and not _alive(int(pid)):
            for tok in _ip("netns", "pids", ns, check=False).stdout.split():
                try:
                    os.kill(int(tok), signal.SIGKILL)
                except (ValueError, ProcessLookupError):
                    pass
            _ip("netns", "del", ns, check=False)
            gone.append(ns)
    return gone


class Upstream:
    """The soak's fake internet (see the module docstring): entered, ``address`` serves HTTP
    on :80 and DNS on :53 (``ALLOWED`` and ``DENIED`` both name it), reachable from the host
    through the veth only; left, all of it is gone. ``slot``: an IPv4 network of
    :data:`SLOTS`. Raises :class:`SoakError` when an address of the slot is already on this
    host (another soak of the same mode)."""

    def __init__(self, slot: str) -> None:
        net = ipaddress.ip_network(slot)
        self.net = str(net)
        self.host_addr, self.address = str(net[1]), str(net[2])
        self.netns = f"{NETNS_PREFIX}{os.getpid()}"
        self.ifname = f"{IF_PREFIX}{os.getpid()}"
        self.procs: list[subprocess.Popen] = []
        self.dir = ""

    def __enter__(self) -> "Upstream":
        taken = [a["local"] for link in json.loads(_ip("-json", "addr", "show").stdout or "[]")
                 for a in link.get("addr_info", []) if a.get("family") == "inet"
                 and ipaddress.ip_address(a["local"]) in ipaddress.ip_network(self.net)]
        if taken:
            raise SoakError(f"{', '.join(taken)} (this mode's {self.net}) is already on this host: another soak "
                            "of this mode is running; wait for it, or run the other mode")
        routed = [r["dst"] for r in json.loads(_ip("-json", "route", "show").stdout or "[]")
                  if r.get("dst", "default") != "default"
                  and ipaddress.ip_network(r["dst"], strict=False).overlaps(ipaddress.ip_network(self.net))]
        if routed:
            raise SoakError(f"this host already routes {', '.join(routed)}, which overlaps this mode's {self.net}: "
                            "the soak would take that traffic; free it first")
        try:
            self._build()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _build(self) -> None:
        self.dir = tempfile.mkdtemp(prefix=self.netns + "-")
        _ip("netns", "add", self.netns)
        _ip("link", "add", self.ifname, "type", "veth", "peer", "name", INET_IF, "netns", self.netns)
        prefix = ipaddress.ip_network(self.net).prefixlen
        inner = subprocess.run([*in_netns(self.netns), "ip", "-batch", "-"], capture_output=True, text=True,
                               input=f"link set lo up\naddr add {self.address}/{prefix} dev {INET_IF}\n"
                                     f"link set {INET_IF} up\n", timeout=20)
        if inner.returncode != 0:
            raise SoakError(f"ip -batch in {self.netns}: {inner.stderr.strip()}")
        _ip("-batch", "-", input=f"addr add {self.host_addr}/{prefix} dev {self.ifname}\nlink set {self.ifname} up\n")
        # No packet before the route to the upstream is proven to be our veth.
        route = _ip("route", "get", self.address).stdout
        if f"dev {self.ifname}" not in route:
            raise SoakError(f"the route to {self.address} does not use {self.ifname}: {route.strip()}")
        cfg = os.path.join(self.dir, "dns.json")
        with open(cfg, "w") as f:
            json.dump({"names": {ALLOWED: [self.address], DENIED: [self.address]}, "ttl": 0,
                       "log": os.path.join(self.dir, "dns.jsonl"), "listen": [[self.address, 53]]}, f)
        self.access_log = os.path.join(self.dir, "access.log")
        for argv, out in (([VENV_PY, DNS_SERVER, cfg], "dns.out"),
                          ([AGENT_PYTHON, "-I", "-c", UPSTREAM, self.address], "access.log")):
            with open(os.path.join(self.dir, out), "wb") as o, open(os.path.join(self.dir, out + ".err"), "wb") as e:
                self.procs.append(subprocess.Popen([*in_netns(self.netns), *argv], stdin=subprocess.PIPE,
                                                   stdout=o, stderr=e, start_new_session=True))
        deadline = time.monotonic() + 10
        while not self._ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.procs):
                errs = ""
                for name in ("dns.out.err", "access.log.err"):
                    with open(os.path.join(self.dir, name), errors="replace") as f:
                        errs += f"\n--- {name}:\n{f.read()[-1500:]}"
                raise SoakError(f"the upstream's servers did not answer within 10 s{errs}")
            time.sleep(0.1)

    def _ready(self) -> bool:
        probe = ("import socket,sys\nfrom dnslib import DNSRecord\n"
                 f"DNSRecord.parse(DNSRecord.question('{ALLOWED}').send('{self.address}', 53, timeout=0.5))\n"
                 f"s = socket.create_connection(('{self.address}', 80), timeout=0.5)\n"
                 "s.sendall(b'GET /ready HTTP/1.0\\r\\n\\r\\n'); sys.exit(0 if s.recv(12)[8:12] == b' 200' else 1)\n")
        return subprocess.run([*in_netns(self.netns), VENV_PY, "-c", probe], capture_output=True, timeout=20).returncode == 0

    def requests(self) -> dict[str, int]:
        """Requests the upstream received, by ``Host path`` (the readiness probes' left out)."""
        out: dict[str, int] = {}
        with open(self.access_log) as f:
            for line in f:
                if not line.rstrip("\n").endswith(" /ready"):
                    out[line.strip()] = out.get(line.strip(), 0) + 1
        return out

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        _ip("netns", "del", self.netns, check=False)  # the veth's two ends go with it
        if self.dir:
            shutil.rmtree(self.dir, ignore_errors=True)


def hooks_loaded() -> str:
    """Which hooks are loaded: the pin folders under /sys/fs/bpf/gatewrap (``HASH@INODE``; a
    hash per build of the hooks' sources, a new inode each time they are loaded again)."""
    try:
        return " ".join(sorted(f"{d}@{os.stat(os.path.join(PIN_ROOT, d)).st_ino}" for d in os.listdir(PIN_ROOT)))
    except OSError:
        return ""


def proc_sample(pid: int, reads: int = 5, gap: float = 0.1) -> dict[str, int] | None:
    """``{"rss_kib", "fds", "threads"}`` of ``pid`` (VmRSS and Threads of /proc/PID/status,
    the entries of /proc/PID/fd; proc(5)), or None once it is gone. fds and threads are the
    least of ``reads`` reads ``gap`` seconds apart: what is left open between the agent's
    attempts (a leak stays; a connection in flight at one read does not)."""
    out: dict[str, int] = {}
    try:
        for i in range(reads):
            if i:
                time.sleep(gap)
            with open(f"/proc/{pid}/status") as f:
                fields = dict(line.split(":", 1) for line in f if ":" in line)
            now = {"rss_kib": int(fields["VmRSS"].split()[0]), "fds": len(os.listdir(f"/proc/{pid}/fd")),
                   "threads": int(fields["Threads"])}
            out = {"rss_kib": now["rss_kib"], **{k: min(out.get(k, now[k]), now[k]) for k in ("fds", "threads")}}
    except (OSError, KeyError):
        return out or None
    return out


class AuditLog:
    """The run's audit log, its rotated segments (``PATH.<seq>``) included: size in bytes and
    records so far (:meth:`sample`, read incrementally), and every record (:meth:`records`)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.seen: dict[str, tuple[int, int]] = {}  # file -> (bytes read, lines in them)

    def files(self) -> list[str]:
        d, base = os.path.split(self.path)
        return sorted(os.path.join(d, n) for n in os.listdir(d) if n == base or n.startswith(base + "."))

    def sample(self) -> dict[str, int]:
        size = records = 0
        for path in self.files():
            done, lines = self.seen.get(path, (0, 0))
            with open(path, "rb") as f:
                f.seek(done)
                data = f.read()
            end = data.rfind(b"\n") + 1
            self.seen[path] = (done + end, lines + data[:end].count(b"\n"))
            size += done + len(data)
            records += self.seen[path][1]
        return {"log_bytes": size, "log_records": records}

    def holds(self, text: bytes) -> bool:
        """Whether the current file holds ``text`` (for the first records: it reads it all)."""
        try:
            with open(self.path, "rb") as f:
                return text in f.read()
        except FileNotFoundError:
            return False

    def records(self) -> list[dict]:
        out = []
        for path in self.files():
            with open(path) as f:
                out += [json.loads(line) for line in f if line.strip()]
        return out


def slope(points: list[tuple[float, float]]) -> float:
    """The least-squares slope of ``points`` (x, y); 0 with fewer than two distinct x."""
    n = len(points)
    if n < 2:
        return 0.0
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    sxx = sum((x - mx) ** 2 for x, _ in points)
    return sum((x - mx) * (y - my) for x, y in points) / sxx if sxx else 0.0


def growth(samples: list[dict], key: str, tolerance: float) -> dict:
    """Start, end, min, max of ``key`` over ``samples`` and the least-squares slope over the
    second half (per hour, and the fitted rise over that half), flat when that rise is within
    ``tolerance``."""
    half = [s for s in samples if s["t"] >= samples[-1]["t"] / 2]
    per_s = slope([(s["t"], s[key]) for s in half])
    rise = per_s * (half[-1]["t"] - half[0]["t"]) if half else 0.0
    vals = [s[key] for s in samples]
    return {"start": vals[0], "end": vals[-1], "min": min(vals), "max": max(vals),
            "slope_per_hour": round(per_s * 3600, 1), "rise_second_half": round(rise, 1),
            "tolerance": tolerance, "flat": abs(rise) <= tolerance}


def count(records: list[dict], **eq: object) -> int:
    """Attempts the records whose fields equal ``eq`` stand for (a folded record's ``count``)."""
    return sum(int(r.get("count", 1)) for r in records if all(r.get(k) == v for k, v in eq.items()))


def prepare(mode: str) -> tuple[str, str, str]:
    """The soak's files: an empty bench/results/soak-MODE/ for the audit log and gatewrap's
    stderr, and the agent's working directory with the agent in it (a file, as a real agent
    is: its command line is in every kernel record). Returns (results folder, audit log,
    agent file)."""
    out_dir = os.path.join(RESULTS, f"soak-{mode}")
    os.makedirs(out_dir, mode=0o755, exist_ok=True)
    for old in os.listdir(out_dir):
        os.unlink(os.path.join(out_dir, old))
    workdir = "/var/lib/gatewrap-bench/soak-work"  # the agent's own folder, as its project folder would be
    os.makedirs(workdir, mode=0o755, exist_ok=True)
    os.chown(workdir, AGENT_UID, AGENT_UID)
    agent_file = os.path.join(workdir, "soak_agent.py")
    tmp = f"{agent_file}.{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(AGENT)
    os.chmod(tmp, 0o644)
    os.replace(tmp, agent_file)  # the other mode's soak may be starting it
    return out_dir, os.path.join(out_dir, "audit.jsonl"), agent_file


def run_and_sample(args: argparse.Namespace, mode: str, up: Upstream, out_dir: str, audit: AuditLog,
                   agent_file: str) -> dict:
    """Run the agent under ``gatewrap run`` (``--shared``: through a daemon of the soak's own,
    started and stopped here) and sample gatewrap's process and the audit log every
    ``args.interval`` seconds until it ends. Returns ``exit_code``, ``wall_s``, ``samples``
    (``t`` in seconds from the start; a shared run's last one, ``after_run``, is the daemon's
    once the run is over), ``agent`` (its final tally, or None) and ``stderr`` (gatewrap's).
    Raises :class:`SoakError` when the run outlives its minutes by 180 s."""
    seconds = args.minutes * 60
    daemon = SharedDaemon(socket_path=SOCKET) if args.shared else None
    try:
        env = daemon.__enter__().env if daemon is not None else agent_env()
    except RuntimeError as e:  # SharedDaemon's: it did not start
        raise SoakError(f"{e} on {SOCKET}: try `gatewrap daemon --socket {SOCKET}` by hand to see why") from None
    env = {k: v for k, v in env.items() if k != "GATEWRAP_SHARED"}
    argv = [os.environ.get("GATEWRAP_PYTHON", VENV_PY), "-m", "gatewrap", "run", *(["--shared"] if args.shared else ["--own"]),
            "--json", "--audit-log", audit.path, "--workdir", os.path.dirname(agent_file),
            "--resolver", f"{up.address}:53", "--public-range", up.net, "--allow", ALLOWED, "--",
            AGENT_PYTHON, "-I", agent_file, str(seconds), f"http://{ALLOWED}/", f"http://{DENIED}/", up.address, "80"]
    err_path = os.path.join(out_dir, "gatewrap.stderr")
    lines: list[dict] = []
    samples: list[dict] = []
    run = None
    try:
        with open(err_path, "wb") as err:
            run = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=err,
                                   env=env, start_new_session=True)

        def read(stdout) -> None:
            for raw in stdout:
                try:
                    lines.append(json.loads(raw))
                except ValueError:
                    print(f"soak[{mode}]: agent: {raw.decode(errors='replace').rstrip()}", file=sys.stderr)
                    continue
                if not lines[-1].get("final"):
                    print(f"soak[{mode}]: {lines[-1]}", file=sys.stderr, flush=True)

        reader = threading.Thread(target=read, args=(run.stdout,), daemon=True)
        reader.start()
        watched = daemon.proc.pid if daemon is not None else run.pid
        t0 = time.monotonic()
        while run.poll() is None:
            # From the agent's first request on: the set-up's own fds and threads are no figure.
            if samples or audit.holds(b'"event":"request"'):
                s = proc_sample(watched)
                if s is not None:
                    samples.append({"t": round(time.monotonic() - t0, 1), **s, **audit.sample(),
                                    "hooks": hooks_loaded()})
            if time.monotonic() - t0 > seconds + 180:
                raise SoakError(f"the run did not end {seconds + 180} s after it started")
            deadline = time.monotonic() + args.interval
            while run.poll() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        wall = round(time.monotonic() - t0, 1)
        reader.join(10)
        if daemon is not None and (s := proc_sample(watched)) is not None:
            samples.append({"t": round(time.monotonic() - t0, 1), **s, **audit.sample(), "after_run": True})
    finally:
        if run is not None and run.poll() is None:
            run.send_signal(signal.SIGTERM)  # gatewrap tears its run down
            try:
                run.wait(60)
            except subprocess.TimeoutExpired:
                run.kill()
        if daemon is not None:
            daemon.__exit__()
    with open(err_path, errors="replace") as f:
        stderr = f.read()
    return {"exit_code": run.returncode, "wall_s": wall, "samples": samples,
            "agent": next((l for l in lines if l.get("final")), None), "stderr": stderr}


def judge(args: argparse.Namespace, up: Upstream, ran: dict, records: list[dict], upstream: dict[str, int]) -> dict:
    """The soak's figures and verdicts (see the module docstring) from what ran
    (:func:`run_and_sample`), the audit log's ``records`` and the requests the ``upstream``
    received."""
    seconds = args.minutes * 60
    summary = next((json.loads(l) for l in reversed(ran["stderr"].splitlines()) if l.startswith("{")), None)
    tally = ran["agent"] or {"fetch_200": 0, "deny_403": 0, "direct_eperm": 0, "other": {"no tally": 1}}
    attempts = {  # agent, audit log, the run's closing summary, upstream
        "fetch 200": (tally["fetch_200"], count(records, event="request", dst_host=ALLOWED, decision="allowed", status=200),
                      (summary or {}).get("allowed"), upstream.get(f"{ALLOWED} /", 0)),
        "deny 403": (tally["deny_403"], count(records, event="request", dst_host=DENIED, decision="denied", status=403),
                     (summary or {}).get("denied"), upstream.get(f"{DENIED} /", 0)),
        "direct EPERM": (tally["direct_eperm"], count(records, event="direct_egress", dst_ip=up.address, dst_port=80),
                         (summary or {}).get("direct_egress"), None),
    }
    during = [s for s in ran["samples"] if not s.get("after_run")]
    grown = {k: growth(during, k, tol) for k, tol in (("rss_kib", args.rss_tolerance), ("fds", args.count_tolerance),
                                                       ("threads", args.count_tolerance))} if len(during) >= 2 else {}
    reached = tally.get("elapsed_s", 0)
    # The hooks are the host's: another build's run or a test's unload loads them again, and
    # a live run then fails closed (its sockets refused); said, since it explains a FAIL.
    reloads = [{"t": b["t"], "hooks": b["hooks"]} for a, b in zip(during, during[1:]) if a["hooks"] != b["hooks"]]
    verdicts = {
        "ran its minutes, exit 0": ran["exit_code"] == 0 and reached >= seconds,
        "nothing lost": all(a == b == c for a, b, c, _ in attempts.values())
        and attempts["fetch 200"][0] == attempts["fetch 200"][3] and attempts["deny 403"][3] == 0
        and not tally["other"] and min(a for a, *_ in attempts.values()) > 0,
        "growth flat": bool(grown) and all(g["flat"] for g in grown.values()),
    }
    if seconds > NSJAIL_DEFAULT_TIME_LIMIT:
        verdicts[f"alive past {NSJAIL_DEFAULT_TIME_LIMIT} s"] = ran["exit_code"] == 0 and reached > NSJAIL_DEFAULT_TIME_LIMIT
    return {"mode": "shared" if args.shared else "own", "minutes": args.minutes, "interval_s": args.interval,
            "exit_code": ran["exit_code"], "wall_s": ran["wall_s"], "agent": ran["agent"], "summary": summary,
            "attempts": {k: dict(zip(("agent", "audit", "summary", "upstream"), v)) for k, v in attempts.items()},
            "growth": grown, "hooks_loaded_again": reloads, "verdicts": verdicts, "ok": all(verdicts.values()), "samples": ran["samples"],
            "upstream_requests": upstream, "stderr_tail": ran["stderr"][-2000:]}


def soak(args: argparse.Namespace) -> dict:
    """One soak (see the module docstring): the upstream built, the agent run and sampled, the
    upstream removed; returns :func:`judge`'s figures."""
    mode = "shared" if args.shared else "own"
    out_dir, audit_path, agent_file = prepare(mode)
    audit = AuditLog(audit_path)
    with Upstream(SLOTS[mode]) as up:
        ran = run_and_sample(args, mode, up, out_dir, audit, agent_file)
        upstream = up.requests()
    return judge(args, up, ran, audit.records(), upstream)


def report(r: dict) -> str:
    """The soak's table and verdicts, as text."""
    who = "gatewrap daemon" if r["mode"] == "shared" else "gatewrap run"
    agent = r["agent"] or {}
    out = [f"soak, {'a shared run (daemon ' + SOCKET + ')' if r['mode'] == 'shared' else 'a run of its own'}: "
           f"{r['minutes']} min asked, the agent ran {agent.get('elapsed_s', '?')} s, exit {r['exit_code']}, "
           f"{len(r['samples'])} samples",
           "", f"{'attempt':<14}{'agent':>8}{'audit log':>11}{'summary':>9}{'upstream':>10}"]
    for k, v in r["attempts"].items():
        out.append(f"{k:<14}{v['agent']:>8}{v['audit']:>11}{v['summary'] if v['summary'] is not None else '-':>9}"
                   f"{'-' if v['upstream'] is None else v['upstream']:>10}")
    out.append("(audit log: its records' counts summed; summary: the run's closing --json summary, whole run)")
    for what, n in (agent.get("other") or {}).items():
        first, last = agent.get("other_s", {}).get(what, ["?", "?"])
        out.append(f"other outcome: {what} ×{n} (at {first}-{last} s)")
    for again in r.get("hooks_loaded_again", []):
        out.append(f"the hooks were loaded again by t = {again['t']} s (now {again['hooks'] or 'none'}): another "
                   "gatewrap build's run or a test's unload; a live run's sockets are refused from then on")
    out += ["", f"{who + ' (pid)':<22}{'start':>9}{'end':>9}{'min':>9}{'max':>9}{'slope/h':>10}{'rise 2nd half':>15}  flat (within)"]
    units = {"rss_kib": "RSS KiB", "fds": "open fds", "threads": "threads"}
    for k, g in r["growth"].items():
        out.append(f"{units[k]:<22}{g['start']:>9}{g['end']:>9}{g['min']:>9}{g['max']:>9}{g['slope_per_hour']:>10}"
                   f"{g['rise_second_half']:>15}  {'yes' if g['flat'] else 'NO'} (±{g['tolerance']:g})")
    if r["samples"]:
        first, last = r["samples"][0], r["samples"][-1]
        out.append(f"{'audit log':<22}{first['log_bytes']:>9}{last['log_bytes']:>9} bytes, records {first['log_records']} → "
                   f"{last['log_records']}")
        if last.get("after_run"):
            out.append(f"daemon after the run: RSS {last['rss_kib']} KiB, {last['fds']} fds, {last['threads']} threads")
    out.append("")
    out += [f"{'PASS' if ok else 'FAIL'}  {name}" for name, ok in r["verdicts"].items()]
    out.append(f"verdict ({r['mode']}): {'PASS' if r['ok'] else 'FAIL'}")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n\n".join(__doc__.split("\n\n")[1:-1]))
    ap.add_argument("--minutes", type=float, default=15,
                    help="how long the agent runs (default 15; above 10 it also proves no 600 s limit applies)")
    ap.add_argument("--shared", action="store_true",
                    help=f"a shared run, through a gatewrap daemon of the soak's own on {SOCKET} (default: a run of its own)")
    ap.add_argument("--interval", type=float, default=10, help="seconds between samples (default 10)")
    ap.add_argument("--rss-tolerance", type=float, default=512, metavar="KIB",
                    help="RSS is flat when its fitted rise over the second half is within this (KiB, default 512)")
    ap.add_argument("--count-tolerance", type=float, default=1, metavar="N",
                    help="fds and threads are flat when their fitted rise over the second half is within this (default 1)")
    ap.add_argument("--json", metavar="PATH", help="write every figure and sample here (default bench/results/soak-<mode>.json)")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("soak.py: needs root (it makes a netns, a veth, and runs gatewrap): run it with sudo", file=sys.stderr)
        return 2

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, stop)
    for ns in remove_leftovers():
        print(f"soak.py: removed {ns}, left by a soak that died", file=sys.stderr)
    try:
        result = soak(args)
    except SoakError as e:
        print(f"soak.py: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("soak.py: interrupted; the netns, veth, servers and runs are gone", file=sys.stderr)
        return 130
    print(report(result))
    path = args.json or os.path.join(RESULTS, f"soak-{result['mode']}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(result, f, indent=1)
    print(f"figures and samples: {path}; audit log: {os.path.join(RESULTS, 'soak-' + result['mode'], 'audit.jsonl')}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
