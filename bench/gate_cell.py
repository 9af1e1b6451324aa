#!/usr/bin/env python3
"""One cell of the proxies bench (bench/harness/proxies.py), the gate and Squid in turn, with
the CPU each process spent per request and, with ``--perf``, a profile of each proxy.

Same pieces as the harness: nginx on 127.0.0.1 (100-byte body, :18080 plain, :443 TLS), the
gate (this interpreter's ``gatewrap._gate_core``, its listener in a netns of its own, audit
log written) and Squid on the host's loopback; hey as the client (inside the gate's netns
for the gate). For each of ``--reps`` rounds of ``--secs`` seconds, each proxy in turn:
requests/s, p50/p99 ms, errors, and CPU microseconds per request (user + system, proc(5)) of
the proxy, of nginx and of hey; with ``--sockets``, the maxima of the proxy's open sockets
(ss(8) every 0.1 s). ``--perf DIR``: ``perf record -g`` of the proxy's process
during its last round, and ``perf report --stdio`` text (``--no-children``, by symbol, and
with callers) in DIR.

Usage (root; takes no lock itself: run it under ``flock /tmp/gatewrap-kernel.lock``):
  .venv/bin/python bench/gate_cell.py --proto connect_tls --conns 64 [--close] [--secs 5]
      [--reps 3] [--proxies gate,squid] [--perf DIR] [--url http://denied.test/] [--squid-log none] [--sockets]
Prints one JSON object. Only loopback and a netns this script makes are used.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))

from harness.gate import Gate, Netns  # noqa: E402
from harness.load import hey  # noqa: E402
from harness.peers_proxy import Squid  # noqa: E402
from harness.proxies import URLS  # noqa: E402
from harness.upstream import Nginx  # noqa: E402


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` (all their threads), proc(5)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except FileNotFoundError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / tick


def pids_of(name: str) -> list[int]:
    return [int(p) for p in subprocess.run(["pgrep", "-x", name], capture_output=True, text=True).stdout.split()]


def perf_report(data: str, out: str) -> None:
    """``perf report`` of ``data`` as text: by symbol without children, then with callers."""
    with open(out, "w") as f:
        for extra in (["--no-children", "--sort", "dso,sym", "-g", "none", "--percent-limit", "0.3"],
                      ["--no-children", "--sort", "sym", "-g", "caller,0.5,callee,function,percent", "--percent-limit", "2"]):
            p = subprocess.run(["perf", "report", "-i", data, "--stdio", *extra], capture_output=True, text=True)
            f.write(p.stdout)
            f.write("\n" + "=" * 100 + "\n")


def passive_opens() -> int:
    """TCP passive opens of the host netns so far (/proc/net/snmp): nginx's accepts, and
    Squid's (the gate accepts in its own netns)."""
    with open("/proc/self/net/snmp") as f:
        rows = [line.split() for line in f if line.startswith("Tcp:")]
    return int(rows[1][rows[0].index("PassiveOpens")])


def sockets(wrap: list[str], port: int) -> dict[str, int]:
    """The TCP sockets of the proxy's listener on ``port`` (ss(8) in the netns ``wrap`` runs
    in): ``held`` the proxy's accepted ones that are still open (an owner, ``ino`` not 0; a
    closed socket lingers as an orphan), ``close_wait`` those whose client has sent its FIN
    and the proxy has not closed, ``client_estab`` the clients' established ones."""
    out = subprocess.run([*wrap, "ss", "-Htane"], capture_output=True, text=True).stdout
    n = {"held": 0, "close_wait": 0, "client_estab": 0}
    for line in out.splitlines():
        f = line.split()
        if len(f) < 5 or f[0] == "LISTEN":
            continue
        if f[3].endswith(f":{port}") and "ino:0 " not in line + " ":
            n["held"] += 1
            n["close_wait"] += f[0] == "CLOSE-WAIT"
        elif f[4].endswith(f":{port}") and f[0] == "ESTAB":
            n["client_estab"] += 1
    return n


def one_round(name: str, port: int, wrap: list[str], proxy_pids: list[int], args, perf: str | None) -> dict:
    url = args.url or URLS[args.proto]
    nginx = pids_of("nginx")
    opens0 = passive_opens()
    before = {"proxy": cpu_s(proxy_pids), "nginx": cpu_s(nginx)}
    kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    rec = None
    if perf:
        rec = subprocess.Popen(["perf", "record", "-F", "1999", "-g", "-o", perf, "-p", ",".join(map(str, proxy_pids)),
                                "--", "sleep", str(args.secs)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    peaks: dict[str, int] = {}
    done = threading.Event()

    def sample() -> None:
        while not done.wait(0.1):
            for k, v in sockets(wrap, port).items():
                peaks[k] = max(peaks.get(k, 0), v)

    sampler = threading.Thread(target=sample) if args.sockets else None
    if sampler:
        sampler.start()
    r = hey(url, port, args.conns, args.secs, not args.close, wrap)
    if sampler:
        done.set()
        sampler.join()
        r["sockets_max"] = peaks
    if rec:
        rec.wait()
    kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = {"proxy": cpu_s(proxy_pids) - before["proxy"], "nginx": cpu_s(nginx) - before["nginx"]}
    cpu["hey"] = kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime
    if rec:  # perf's own CPU is in the children's too
        cpu["hey"] = None
    reqs = (r["rps"] or 0) * args.secs
    # Upstream connections nginx accepted (Squid's own accepts are counted there too).
    r["upstream_conns"] = (passive_opens() - opens0) // (2 if name == "squid" else 1)
    r["cpu_us_per_req"] = {k: (round(v / reqs * 1e6, 1) if reqs and v is not None else None) for k, v in cpu.items()}
    r["loadavg"] = os.getloadavg()[0]
    return r


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--proto", choices=sorted(URLS), default="connect_tls")
    ap.add_argument("--conns", type=int, default=64)
    ap.add_argument("--url", help="ask this URL instead of --proto's; e.g. http://denied.test/, which the gate's "
                                  "policy denies (403, nothing dialled or resolved): the cost of its denials")
    ap.add_argument("--close", action="store_true", help="hey -disable-keepalive")
    ap.add_argument("--secs", type=float, default=5)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--proxies", default="gate,squid")
    ap.add_argument("--perf", help="directory for perf data and reports (last round of each proxy)")
    ap.add_argument("--tag", default="", help="prefix of the perf files")
    ap.add_argument("--sockets", action="store_true",
                    help="sample ss(8) every 0.1 s during each round: the maxima of the proxy's open accepted "
                         "sockets (held), of those in CLOSE-WAIT (the client sent its FIN, the proxy has not "
                         "closed: a tunnel waiting for upstream's end) and of the clients' established ones")
    ap.add_argument("--squid-log", choices=("stdio", "none"), default="stdio",
                    help="Squid's access log: stdio (buffered, as the harness runs it) or none; the difference "
                         "in its CPU per request is what its access-log line costs")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="gwb-cell-")
    os.chmod(tmp, 0o755)
    names = args.proxies.split(",")
    out: dict = {"python": sys.executable, "proto": args.proto, "url": args.url, "conns": args.conns, "keepalive": not args.close,
                 "secs": args.secs, "rounds": {n: [] for n in names}}
    try:
        with ExitStack() as stack:
            nginx = stack.enter_context(Nginx(tmp))
            proxies = {}
            if "gate" in names:
                ns = stack.enter_context(Netns(f"gwc-{os.getpid()}"))
                g = stack.enter_context(Gate(ns, tmp, False, nginx.ca))
                proxies["gate"] = (g.port, ns.exec([]), [os.getpid()])
            if "squid" in names:
                if args.squid_log == "none":
                    Squid.access_log = "none"
                sq = stack.enter_context(Squid(tmp))
                spids = [int(p) for p in subprocess.run(["pgrep", "-s", str(sq.proc.pid)], capture_output=True,
                                                        text=True).stdout.split()]
                proxies["squid"] = (sq.port, [], spids)
            for rep in range(args.reps):
                for name in names:
                    port, wrap, pids = proxies[name]
                    perf = None
                    if args.perf and rep == args.reps - 1:
                        os.makedirs(args.perf, exist_ok=True)
                        perf = os.path.join(args.perf, f"{args.tag}{name}-{args.proto}-{'close' if args.close else 'ka'}{args.conns}.data")
                    r = one_round(name, port, wrap, pids, args, perf)
                    out["rounds"][name].append(r)
                    print(name, json.dumps(r), file=sys.stderr, flush=True)
                    if perf:
                        perf_report(perf, perf[:-5] + ".txt")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
