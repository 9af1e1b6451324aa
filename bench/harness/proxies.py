"""The gate against Squid and tinyproxy, one upstream (nginx on 127.0.0.1), hey as the client.

- ``matrix``: requests/s and p50/p99 of 100-byte GETs at 1, 64 and 256 connections, with
  keep-alive and without, plain HTTP (absolute-form) and CONNECT + TLS (hey's https through
  the proxy); the gate plain and, for CONNECT + TLS, with TLS inspection. Each cell is the
  median of ``reps`` rounds of ``secs`` seconds, proxies alternating within a repetition.
- ``sustained``: one long round (default 60 s) at 64 connections without keep-alive against
  the one upstream address, Squid then the gate, sampling the host's TIME_WAIT sockets to or from
  the upstream port (ss(8)) every 2 s.
- ``bulk``: a 1 GiB download direct, through a CONNECT tunnel of each proxy, and through the
  gate in absolute form (curl; median of 3, MB/s).

The gate runs in a netns of its own and hey/curl for it inside that netns (the gate listens
there); Squid and tinyproxy listen on the host's loopback. Nothing leaves the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from contextlib import ExitStack

from .common import Missing, median, ratio, versus_squid
from .gate import Gate, Netns
from .load import curl_bulk, hey
from .peers_proxy import Squid, Tinyproxy
from .upstream import HTTP_PORT, Nginx

CONNS = (1, 64, 256)
URLS = {"http": f"http://127.0.0.1:{HTTP_PORT}/", "connect_tls": "https://127.0.0.1/"}  # port 443: see upstream.TLS_PORT
BIG = f"http://127.0.0.1:{HTTP_PORT}/big"


def _time_wait() -> int:
    """TIME_WAIT TCP sockets of the host netns to or from the upstream's HTTP port."""
    p = subprocess.run(["ss", "-Htan", "state", "time-wait", f"( sport = :{HTTP_PORT} or dport = :{HTTP_PORT} )"],
                       capture_output=True, text=True, check=True)
    return len(p.stdout.splitlines())


def _cell(rounds: list[dict]) -> dict:
    rps = [r["rps"] for r in rounds if r["rps"] is not None]
    return {"rps": round(median(rps)) if rps else None,
            "p50_ms": median([r["p50_ms"] for r in rounds if r["p50_ms"] is not None] or [0]),
            "p99_ms": median([r["p99_ms"] for r in rounds if r["p99_ms"] is not None] or [0]),
            "max_ms": max([r["max_ms"] for r in rounds if r.get("max_ms") is not None] or [0]),
            "errors": sum(r["errors"] for r in rounds),
            "error_sample": next((r["error_sample"] for r in rounds if r.get("error_sample")), None)}


def matrix(proxies: dict[str, tuple[int, list[str]]], reps: int, secs: float) -> dict:
    """``{proto: {"keepalive"|"close": {str(conns): {proxy: cell}}}}``; each cell
    ``{"rps", "p50_ms", "p99_ms", "max_ms", "errors"}`` (``max_ms``: the slowest request of
    all rounds, the others medians) plus ``gate_vs_squid`` ratios."""
    out: dict = {}
    for proto, url in URLS.items():
        for ka in (True, False):
            for conns in CONNS:
                rounds: dict[str, list[dict]] = {}
                for _ in range(reps):
                    for name, (port, wrap) in proxies.items():
                        if proto == "http" and name == "gate (inspect)":
                            continue
                        rounds.setdefault(name, []).append(hey(url, port, conns, secs, ka, wrap))
                cells = {name: _cell(rs) for name, rs in rounds.items()}
                versus_squid(cells)
                out.setdefault(proto, {}).setdefault("keepalive" if ka else "close", {})[str(conns)] = cells
    return out


def sustained(proxies: dict[str, tuple[int, list[str]]], secs: float) -> dict:
    """``{proxy: {"rps", "p50_ms", "p99_ms", "errors", "time_wait_max", "time_wait_end"}}``
    for Squid, then the gate (each starts once the TIME_WAIT count is under 1000, or after
    65 s: they last 60 s)."""
    out = {}
    for name in ("squid", "gate"):
        if name not in proxies:
            continue
        _drain()
        port, wrap = proxies[name]
        samples: list[int] = []
        done = threading.Event()

        def sample() -> None:
            while not done.wait(2):
                samples.append(_time_wait())

        t = threading.Thread(target=sample)
        t.start()
        try:
            r = hey(URLS["http"], port, 64, secs, False, wrap)
        finally:
            done.set()
            t.join()
        out[name] = {**r, "time_wait_max": max(samples, default=0), "time_wait_end": samples[-1] if samples else 0}
    if "gate" in out and "squid" in out:
        out["gate_rps_vs_squid"] = ratio(out["gate"]["rps"], out["squid"]["rps"])
    return out


def bulk(proxies: dict[str, tuple[int, list[str]]], reps: int = 3) -> dict:
    """MB/s medians: ``direct``, ``<proxy> tunnel``, ``gate absolute-form``; and the gate
    tunnel's ratio to direct."""
    runs: dict[str, list[float]] = {}
    for _ in range(reps):
        runs.setdefault("direct", []).append(curl_bulk(BIG, None, False))
        for name, (port, wrap) in proxies.items():
            if name == "gate (inspect)":
                continue
            runs.setdefault(f"{name} tunnel", []).append(curl_bulk(BIG, port, True, wrap))
            if name == "gate":
                runs.setdefault("gate absolute-form", []).append(curl_bulk(BIG, port, False, wrap))
    out: dict = {k: median(v) for k, v in runs.items()}
    out["gate_tunnel_vs_direct"] = ratio(out.get("gate tunnel"), out["direct"])
    return out


def measure(reps: int, secs: float, sustain_secs: float) -> dict:
    """Every part above against one nginx; peers that are missing or do not start are listed
    in ``missing``."""
    tmp = tempfile.mkdtemp(prefix="gw-bench-proxy-")
    os.chmod(tmp, 0o755)
    res: dict = {"reps": reps, "round_s": secs, "missing": []}
    with ExitStack() as stack:
        nginx = stack.enter_context(Nginx(tmp))
        ns = stack.enter_context(Netns(f"gwb-{os.getpid()}"))
        proxies: dict[str, tuple[int, list[str]]] = {}
        for name, inspect in (("gate", False), ("gate (inspect)", True)):
            g = stack.enter_context(Gate(ns, tmp, inspect, nginx.ca))
            proxies[name] = (g.port, ns.exec([]))
        for cls in (Squid, Tinyproxy):
            try:
                p = stack.enter_context(cls(tmp))
                proxies[cls.name] = (p.port, [])
            except (Missing, RuntimeError, OSError) as e:
                res["missing"].append(f"{cls.name}: {e}")
        # Squid's sustained round before the gate's, the matrix last: the gate's TIME_WAIT
        # sockets (it reuses no upstream connection) would otherwise slow what follows.
        for part, run in (("bulk", lambda: bulk(proxies)), ("sustained", lambda: sustained(proxies, sustain_secs)),
                          ("matrix", lambda: matrix(proxies, reps, secs))):
            _drain()
            try:
                res[part] = run()
            except (subprocess.SubprocessError, RuntimeError, OSError, ValueError) as e:
                res[part] = {"error": f"{type(e).__name__}: {e}"}
    shutil.rmtree(tmp, ignore_errors=True)
    return res


def _drain(limit: int = 1000, timeout: float = 65) -> None:
    """Wait until the TIME_WAIT sockets of the upstream port are under ``limit`` (they last
    60 s, tcp(7)), so one part's leftovers do not slow the next part's connects."""
    t0 = time.monotonic()
    while _time_wait() > limit and time.monotonic() - t0 < timeout:
        time.sleep(2)
