#!/usr/bin/env python3
"""The gate's throughput against Squid's, on one machine, against one local upstream address.

The pieces are the harness's (bench/harness/): nginx on 127.0.0.1 serves a 100-byte body
at ``/`` on :18080 (plain) and :443 (TLS), and a 1 GiB file at ``/big``; the gate (this
interpreter's ``gatewrap._gate_core``, alone: no jail, no hooks) listens on 127.0.0.1:3128
in a netns of its own and dials from the host, as in a run, writing its audit log; with
``--inspect``, a second gate on :3129 TLS-inspects :443; Squid listens on the host's
127.0.0.1:13128 with no cache. Two parts (``--parts``):

- ``load``: hey (Go's client: absolute-form for http://, a CONNECT tunnel and TLS for
  https://) sends 100-byte GETs through each proxy for SECONDS seconds at each of CONNS
  connections, for each protocol (``http``, ``connect_tls``) and keep-alive mode, the
  proxies one after another (each round starts once the upstream ports' TIME_WAIT sockets
  are under 100; they last 60 s, tcp(7)). Each round samples, every 2 s, the host's
  TIME_WAIT sockets to or from the upstream ports and all of the host's
  (``ss -tan state time-wait``), and reports the maxima; requests/s and p99 as ratios
  gate/Squid.
- ``bulk``: curl downloads the 1 GiB file directly, through a CONNECT tunnel of each
  proxy (``-p``) and through the gate in absolute form, BULK_REPS times each in turn
  (medians, MB/s = 10^6 bytes/s); the gate's clients run in its netns, the others on the
  host's loopback.

Only loopback and a netns this script makes are used; root is needed (netns, setns). Run it
with another build's interpreter (e.g. /work/main/.venv/bin/python) for a before figure.
Prints and writes one JSON object (bench/results/gate_throughput.json, or OUT).
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

from harness.common import median, ratio, versus_squid  # noqa: E402
from harness.gate import Gate, Netns  # noqa: E402
from harness.load import curl_bulk, hey  # noqa: E402
from harness.peers_proxy import Squid  # noqa: E402
from harness.upstream import HTTP_PORT, TLS_PORT, Nginx  # noqa: E402

URLS = {"http": f"http://127.0.0.1:{HTTP_PORT}/", "connect_tls": "https://127.0.0.1/"}
BIG = f"http://127.0.0.1:{HTTP_PORT}/big"


def time_wait(upstream_only: bool) -> int:
    """TIME_WAIT TCP sockets of the host netns (ss(8)): to or from the upstream's ports, or all."""
    filt = [f"( sport = :{HTTP_PORT} or dport = :{HTTP_PORT} or sport = :{TLS_PORT} or dport = :{TLS_PORT} )"]
    p = subprocess.run(["ss", "-Htan", "state", "time-wait", *(filt if upstream_only else [])],
                       capture_output=True, text=True, check=True)
    return len(p.stdout.splitlines())


def drain(limit: int = 100, timeout: float = 65) -> None:
    t0 = time.monotonic()
    while time_wait(True) > limit and time.monotonic() - t0 < timeout:
        time.sleep(2)


def round_(url: str, port: int, wrap: list[str], conns: int, secs: float, keepalive: bool) -> dict:
    """One hey round with the TIME_WAIT maxima sampled every 2 s while it runs."""
    drain()
    samples: list[tuple[int, int]] = []
    done = threading.Event()

    def sample() -> None:
        while not done.wait(2):
            samples.append((time_wait(True), time_wait(False)))

    t = threading.Thread(target=sample)
    t.start()
    try:
        r = hey(url, port, conns, secs, keepalive, wrap)
    finally:
        done.set()
        t.join()
    r.update(time_wait_upstream_max=max((s[0] for s in samples), default=0),
             time_wait_host_max=max((s[1] for s in samples), default=0))
    return r


def load(proxies: dict, protos: list[str], conns_list: list[int], modes: list[bool], secs: float) -> dict:
    out: dict = {}
    for proto in protos:
        for ka in modes:
            for conns in conns_list:
                cells = {}
                for name, (port, wrap) in proxies.items():
                    if proto == "http" and name == "gate (inspect)":
                        continue
                    cells[name] = round_(URLS[proto], port, wrap, conns, secs, ka)
                    print(proto, "keepalive" if ka else "close", conns, name, cells[name], file=sys.stderr, flush=True)
                versus_squid(cells)
                out.setdefault(proto, {}).setdefault("keepalive" if ka else "close", {})[str(conns)] = cells
    return out


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of the processes ``pids`` (all their threads), proc(5)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)
    return total / tick


def nginx_pids() -> list[int]:
    return [int(p) for p in subprocess.run(["pgrep", "-x", "nginx"], capture_output=True, text=True).stdout.split()]


def timed_bulk(port: int | None, tunnel: bool, wrap: list[str] | None, squid: list[int]) -> dict:
    """One download (curl_bulk) with the CPU seconds it cost each process on the way:
    curl's (a waited-for child), nginx's, this process's (the gate's threads) and Squid's.
    Softirq work is charged to whichever of them ran it (loopback delivers in the sender)."""
    others = {"nginx": nginx_pids(), "squid": squid}
    before = {k: cpu_s(v) for k, v in others.items()}
    me0, kids0 = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
    mbps = curl_bulk(BIG, port, tunnel, wrap)
    me1, kids1 = os.times(), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = {k: round(cpu_s(v) - before[k], 2) for k, v in others.items()}
    cpu["curl"] = round(kids1.ru_utime + kids1.ru_stime - kids0.ru_utime - kids0.ru_stime, 2)
    cpu["gate"] = round(me1.user + me1.system - me0.user - me0.system, 2)
    return {"MBps": mbps, "cpu_s": cpu}


BULK_WAYS = ("direct", "gate tunnel", "gate absolute-form", "squid tunnel")


def bulk(proxies: dict, reps: int, squid: list[int], ways: list[str]) -> dict:
    """``ways`` of BULK_WAYS, each downloaded ``reps`` times in turn."""
    how = {"direct": (None, False, None), "gate tunnel": (proxies["gate"][0], True, proxies["gate"][1]),
           "gate absolute-form": (proxies["gate"][0], False, proxies["gate"][1]),
           "squid tunnel": (proxies["squid"][0], True, [])}
    runs: dict[str, list[dict]] = {}
    for _ in range(reps):  # alternating, so a busy moment costs each way alike
        for way in ways:
            runs.setdefault(way, []).append(timed_bulk(*how[way], squid))
        print("bulk", {k: v[-1] for k, v in runs.items()}, file=sys.stderr, flush=True)
    out: dict = {k: {"median": median([r["MBps"] for r in v]), "runs": v} for k, v in runs.items()}
    if "gate tunnel" in out and "direct" in out:
        out["gate_tunnel_vs_direct"] = ratio(out["gate tunnel"]["median"], out["direct"]["median"])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parts", default="bulk,load", help="comma-separated: bulk, load (default both)")
    ap.add_argument("--seconds", type=float, default=60, help="length of each load round, s (default 60)")
    ap.add_argument("--conns", default="1,64,256", help="connections of the load rounds (default 1,64,256)")
    ap.add_argument("--protos", default="http,connect_tls", help="http, connect_tls (default both)")
    ap.add_argument("--keepalive", choices=("on", "off", "both"), default="both", help="hey's keep-alive (default both)")
    ap.add_argument("--inspect", action="store_true", help="also a TLS-inspecting gate in the connect_tls rounds")
    ap.add_argument("--ways", default=",".join(BULK_WAYS), help=f"bulk downloads, of: {', '.join(BULK_WAYS)}")
    ap.add_argument("--bulk-reps", type=int, default=5, help="downloads of each way (default 5)")
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "gate_throughput.json"))
    args = ap.parse_args()
    parts = args.parts.split(",")
    for tool in ("nginx", "squid", "hey", "curl", "ss", "openssl"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is missing: bench/install_peers.sh installs the peers")
    tmp = tempfile.mkdtemp(prefix="gwb-throughput-")
    os.chmod(tmp, 0o755)  # nginx's workers read the files as their own user
    out: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": sys.executable,
                 "machine": f"{os.cpu_count()} cores, {os.uname().release}", "load_s": args.seconds,
                 "loadavg_start": os.getloadavg()}
    try:
        with ExitStack() as stack:
            nginx = stack.enter_context(Nginx(tmp))
            ns = stack.enter_context(Netns(f"gwb-{os.getpid()}"))
            proxies: dict[str, tuple[int, list[str]]] = {}
            gates = {}
            for name, inspect in (("gate", False), ("gate (inspect)", True)) if args.inspect else (("gate", False),):
                gates[name] = stack.enter_context(Gate(ns, tmp, inspect, nginx.ca))
                proxies[name] = (gates[name].port, ns.exec([]))
            squid = stack.enter_context(Squid(tmp))
            proxies["squid"] = (squid.port, [])
            assert squid.proc is not None
            squid_pids = [int(p) for p in subprocess.run(["pgrep", "-s", str(squid.proc.pid)], capture_output=True,
                                                         text=True).stdout.split()]
            subprocess.run(["cat", f"{tmp}/big"], stdout=subprocess.DEVNULL, check=True)  # page cache warm
            if "bulk" in parts:
                out["bulk_MBps"] = bulk(proxies, args.bulk_reps, squid_pids, args.ways.split(","))
            if "load" in parts:
                modes = {"on": [True], "off": [False], "both": [True, False]}[args.keepalive]
                out["load"] = load(proxies, args.protos.split(","), [int(c) for c in args.conns.split(",")], modes,
                                   args.seconds)
            out["gate_counts"] = {name: g.counts() for name, g in gates.items()}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["loadavg_end"] = os.getloadavg()
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
