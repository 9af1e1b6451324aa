#!/usr/bin/env python3
"""Shipping the audit log to a local rsyslogd: records per second of ``gatewrap audit ship``.

Writes a log of N records (default 200,000) shaped as the gate writes them (compact JSON,
``v`` and ``time`` first; a mix of allowed, denied and failed requests, ~250 bytes each),
starts rsyslogd (tests/rsyslog.py: imtcp on a loopback port, each message written to a file
as parsed, one JSON object a line), then runs ``gatewrap audit ship`` without --follow (it
ends when the collector's TCP has acknowledged the log's end) over TCP and over TLS, and
reports, for each: the shipper's wall time and records/s, its CPU time, and the time until
rsyslog had written the last record. Needs Debian's rsyslog and rsyslog-gnutls.

Usage: .venv/bin/python bench/audit_ship.py [N]   (writes bench/results/audit_ship.json)
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from fakenet.ca import make_pki  # noqa: E402
from rsyslog import Rsyslog  # noqa: E402


def write_log(path: Path, n: int) -> None:
    with open(path, "w") as f:
        for i in range(n):
            decision = ("allowed", "allowed", "denied", "failed")[i % 4]
            f.write(json.dumps({"v": 1, "time": f"2026-12-01T09:{i // 600000 % 60:02d}:{i // 10000 % 60:02d}.{i % 10000:06d}Z",
                                "run": "gw-0123456789", "event": "request", "decision": decision,
                                "reason": "policy: rule policy.toml:rule[1]", "client": "127.0.0.1:40312",
                                "method": "GET", "target": f"http://api.example.test/v1/items/{i}",
                                "dst_host": "api.example.test", "dst_ip": "198.51.100.138", "dst_port": 80,
                                "proto": "http", "status": 200}, separators=(",", ":")) + "\n")


def case(folder: Path, log: Path, n: int, tls: bool) -> dict:
    pki = make_pki(str(folder), ["localhost"], ["127.0.0.1"]) if tls else None
    r = Rsyslog(folder / "rsyslog", (pki.ca_cert, pki.server_cert, pki.server_key) if pki else None)
    r.start()
    try:
        to = f"tls://localhost:{r.port}" if tls else f"tcp://127.0.0.1:{r.port}"
        cmd = [sys.executable, "-m", "gatewrap", "audit", "ship", "--to", to, "--log", str(log),
               "--state", str(folder / "state")] + (["--ca", pki.ca_cert] if pki else [])
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.monotonic()
        p = subprocess.run(cmd, capture_output=True, text=True)
        shipped = time.monotonic() - t0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        assert p.returncode == 0, p.stderr
        while True:
            with open(r.out, "rb") as f:
                got = sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
            if got >= n:
                break
            time.sleep(0.05)
        written = time.monotonic() - t0
    finally:
        r.stop()
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"to": "tls" if tls else "tcp", "records": n, "ship_s": round(shipped, 3),
            "records_per_s": round(n / shipped), "shipper_cpu_s": round(cpu, 3),
            "received_by_rsyslog_s": round(written, 3), "shipper_said": p.stderr.strip()}


def main() -> None:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 200_000
    with tempfile.TemporaryDirectory(prefix="gw-bench-ship-") as d:
        log = Path(d) / "audit.jsonl"
        write_log(log, n)
        size = os.path.getsize(log)
        results = []
        for tls in (False, True):
            folder = Path(d) / ("tls" if tls else "tcp")
            folder.mkdir()
            results.append(case(folder, log, n, tls))
            print(json.dumps(results[-1]))
    out = ROOT / "bench" / "results"
    out.mkdir(exist_ok=True)
    (out / "audit_ship.json").write_text(json.dumps({"log_bytes": size, "cases": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
