#!/usr/bin/env python3
"""The gate's throughput against Squid's, on one machine, against one local upstream.

nginx (Debian's) serves a 100-byte file and a 1 GiB one on 127.0.0.1:18080 of the host.
The gate (this interpreter's ``gatewrap._gate_core``, started alone: no jail, no hooks)
listens on 127.0.0.1:3128 in a netns of its own and dials from the host, as in a run;
Squid listens on the host's 127.0.0.1:13128 with no cache. ``ab -X`` (apache2-utils) sends
100-byte GETs through each, HTTP/1.0 without keep-alive as ab does by default, at 1, 64
and 256 connections for ROUND seconds each, alternating gate and Squid; then each is
loaded for SUSTAIN seconds at 64 connections, and the TIME_WAIT sockets to or from the
upstream's port are counted at the end (``ss``). Bulk: curl downloads the 1 GiB file
directly, through a CONNECT tunnel of each proxy (``-p``) and through the gate in absolute
form, N times each in turn (medians). Prints and writes one JSON object (bench/results/gate_throughput.json, or OUT).

Only loopback and a netns this script makes are used; root is needed (netns, setns).
The gate writes its audit log (two records a request, hash-chained) as in a run.

Usage: sudo .venv/bin/python bench/gate_throughput.py [--round S] [--sustain S] [--bulk-reps N] [--out PATH]
       (--round 0 / --sustain 0 skip those parts)
       (run it with another build's interpreter, e.g. /work/main/.venv/bin/python, for before/after)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
UP_PORT, GATE_PORT, SQUID_PORT = 18080, 3128, 13128
BIG = 1 << 30

NGINX_CONF = """
daemon off; worker_processes 1; pid {tmp}/nginx.pid; error_log {tmp}/nginx.err;
events {{ worker_connections 4096; }}
http {{
  access_log off; sendfile on; tcp_nopush on;
  keepalive_timeout 75s; keepalive_requests 10000000;
  client_body_temp_path {tmp}/nginx; proxy_temp_path {tmp}/nginx; fastcgi_temp_path {tmp}/nginx;
  uwsgi_temp_path {tmp}/nginx; scgi_temp_path {tmp}/nginx;
  server {{ listen 127.0.0.1:{port}; root {tmp}/www; }}
}}
"""

SQUID_CONF = """
http_port 127.0.0.1:{port}
http_access allow all
cache deny all
access_log none
cache_log {tmp}/squid/cache.log
pid_filename {tmp}/squid/squid.pid
coredump_dir {tmp}/squid
shutdown_lifetime 0 seconds
workers 1
"""

POLICY = f'default = "deny"\n\n[[rule]]\nhost = "127.0.0.1"\nport = {UP_PORT}\naction = "allow"\n'


def wait_port(port: int, ns: list[str] | None = None) -> None:
    for _ in range(200):
        p = subprocess.run([*(ns or []), "bash", "-c", f"exec 3<>/dev/tcp/127.0.0.1/{port}"], capture_output=True)
        if p.returncode == 0:
            return
        time.sleep(0.05)
    raise SystemExit(f"nothing listens on 127.0.0.1:{port}")


def ab(ns: list[str], proxy_port: int, conns: int, seconds: float) -> dict:
    cmd = [*ns, "ab", "-q", "-r", "-s", "30", "-t", str(seconds), "-n", "100000000", "-c", str(conns),
           "-X", f"127.0.0.1:{proxy_port}", f"http://127.0.0.1:{UP_PORT}/small"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=seconds + 120).stdout
    field = lambda rx: float(m.group(1)) if (m := re.search(rx, out)) else None  # noqa: E731
    return {"conns": conns, "rps": field(r"Requests per second:\s+([\d.]+)"),
            "p50_ms": field(r"\n\s+50%\s+(\d+)"), "p99_ms": field(r"\n\s+99%\s+(\d+)"),
            "failed": field(r"Failed requests:\s+(\d+)"), "non_2xx": field(r"Non-2xx responses:\s+(\d+)") or 0}


def time_wait() -> int:
    p = subprocess.run(["ss", "-Htan", "state", "time-wait", f"( sport = :{UP_PORT} or dport = :{UP_PORT} )"],
                       capture_output=True, text=True)
    return len(p.stdout.splitlines())


def ss_summary() -> str:
    return next((ln.strip() for ln in subprocess.run(["ss", "-s"], capture_output=True, text=True).stdout.splitlines()
                 if ln.startswith("TCP:")), "")


def wait_time_wait_gone(limit: float = 70) -> None:
    """TIME_WAIT lasts 60 s on Linux: start each sustained run from (nearly) none."""
    end = time.time() + limit
    while time_wait() > 100 and time.time() < end:
        time.sleep(2)


def download(ns: list[str], extra: list[str]) -> float:
    cmd = [*ns, "curl", "-sS", "-o", "/dev/null", "-w", "%{speed_download}", *extra, f"http://127.0.0.1:{UP_PORT}/big"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        raise SystemExit(f"{cmd}: {p.stderr}")
    return round(float(p.stdout) / 1e6, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--round", type=float, default=10)
    ap.add_argument("--sustain", type=float, default=60)
    ap.add_argument("--bulk-reps", type=int, default=5)
    ap.add_argument("--out", default=os.path.join(ROOT, "bench", "results", "gate_throughput.json"))
    args = ap.parse_args()
    for tool in ("nginx", "squid", "ab", "curl", "ss"):
        if not shutil.which(tool) and not os.path.exists(f"/usr/sbin/{tool}"):
            raise SystemExit(f"{tool} is missing: apt-get install nginx-light squid apache2-utils curl iproute2")
    from gatewrap import _gate_core as core

    ns_name = f"gwb-gate-{os.getpid()}"
    ns = ["ip", "netns", "exec", ns_name]
    procs: list[subprocess.Popen] = []
    gate = None
    with tempfile.TemporaryDirectory(prefix="gwb-") as tmp:
        try:
            os.chmod(tmp, 0o755)  # nginx's workers read www/ as their own user
            os.makedirs(f"{tmp}/www")
            os.makedirs(f"{tmp}/nginx")  # nginx gives its temp paths to its workers' user
            with open(f"{tmp}/www/small", "wb") as f:
                f.write(b"x" * 99 + b"\n")
            with open(f"{tmp}/www/big", "wb") as f:
                f.truncate(BIG)
            with open(f"{tmp}/nginx.conf", "w") as f:
                f.write(NGINX_CONF.format(tmp=tmp, port=UP_PORT))
            with open(f"{tmp}/squid.conf", "w") as f:
                f.write(SQUID_CONF.format(tmp=tmp, port=SQUID_PORT))
            procs.append(subprocess.Popen(["nginx", "-c", f"{tmp}/nginx.conf"]))
            os.makedirs(f"{tmp}/squid")
            os.chmod(f"{tmp}/squid", 0o777)  # squid drops to its own user and writes its log here
            procs.append(subprocess.Popen(["squid", "-N", "-f", f"{tmp}/squid.conf"]))
            subprocess.run(["ip", "netns", "add", ns_name], check=True)
            subprocess.run(["ip", "-n", ns_name, "link", "set", "lo", "up"], check=True)
            audit = core.AuditLog(f"{tmp}/audit.jsonl", key=None)
            gate = core.Gate(run_id="bench", netns_path=f"/run/netns/{ns_name}", policy=core.Policy.from_toml(POLICY, "bench.toml"),
                             audit=audit, listen_port=GATE_PORT)
            wait_port(UP_PORT)
            wait_port(SQUID_PORT)
            wait_port(GATE_PORT, ns)
            subprocess.run(["cat", f"{tmp}/www/big"], stdout=subprocess.DEVNULL)  # page cache warm
            out: dict = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "python": sys.executable,
                         "machine": f"{os.cpu_count()} cores, {os.uname().release}", "round_s": args.round,
                         "rounds": {"gate": [], "squid": []}}
            for conns in (1, 64, 256) if args.round else ():
                out["rounds"]["gate"].append(ab(ns, GATE_PORT, conns, args.round))
                out["rounds"]["squid"].append(ab([], SQUID_PORT, conns, args.round))
                print(conns, out["rounds"]["gate"][-1], out["rounds"]["squid"][-1], file=sys.stderr)
            out["sustained"] = {}
            for who, n, port in (("gate", ns, GATE_PORT), ("squid", [], SQUID_PORT)) if args.sustain else ():
                wait_time_wait_gone()
                before = time_wait()
                r = ab(n, port, 64, args.sustain)
                r.update(time_wait_before=before, time_wait_after=time_wait(), ss_s=ss_summary(), seconds=args.sustain)
                out["sustained"][who] = r
                print("sustained", who, r, file=sys.stderr)
            ways = {"direct": ([], []),
                    "gate_tunnel": (ns, ["-p", "-x", f"http://127.0.0.1:{GATE_PORT}"]),
                    "squid_tunnel": ([], ["-p", "-x", f"http://127.0.0.1:{SQUID_PORT}"]),
                    "gate_absolute_form": (ns, ["-x", f"http://127.0.0.1:{GATE_PORT}"])}
            runs: dict[str, list[float]] = {k: [] for k in ways}
            for _ in range(args.bulk_reps):  # alternating, so a busy moment costs each way alike
                for k, (n, extra) in ways.items():
                    runs[k].append(download(n, extra))
            out["bulk_MBps"] = {k: {"median": statistics.median(v), "runs": v} for k, v in runs.items()}
            print("bulk", out["bulk_MBps"], file=sys.stderr)
            out["gate_counts"] = gate.counts()
        finally:
            if gate is not None:
                gate.stop()
            for p in procs:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
            subprocess.run(["ip", "netns", "del", ns_name], capture_output=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
