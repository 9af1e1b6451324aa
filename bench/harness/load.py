"""One load round with hey (Debian's ``hey``: Go's HTTP/1.1 client; through a proxy it sends
absolute-form requests for http:// and opens a CONNECT tunnel for https://, not verifying
the upstream's certificate), and one bulk download with curl."""

from __future__ import annotations

import re
import subprocess

from .common import need


def hey(url: str, proxy_port: int, conns: int, secs: float, keepalive: bool,
        wrap: list[str] | None = None) -> dict:
    """Run hey for ``secs`` seconds with ``conns`` workers through the proxy on
    127.0.0.1:``proxy_port`` (``wrap``: a prefix such as ``ip netns exec NS``).

    Returns ``{"rps", "p50_ms", "p99_ms", "max_ms", "ok", "errors", "error_sample"}``:
    requests/s of hey's summary, latency percentiles, the slowest request (hey's ``Slowest``;
    hey's summary has no p99.9: bench/gate_tail.sh gives it, with wrk), 200 responses, every
    other outcome (other statuses, errors), and the first line of hey's error distribution
    (None without errors).
    """
    argv = [need("hey"), "-z", f"{secs}s", "-c", str(conns), "-t", "10", "-x", f"http://127.0.0.1:{proxy_port}"]
    if not keepalive:
        argv.append("-disable-keepalive")
    p = subprocess.run([*(wrap or []), *argv, url], capture_output=True, text=True, timeout=secs + 60)
    out = p.stdout

    def num(pattern: str) -> float | None:
        m = re.search(pattern, out)
        return float(m.group(1)) if m else None

    p50, p99 = num(r"50% in ([\d.]+) secs"), num(r"99% in ([\d.]+) secs")
    slowest = num(r"Slowest:\s+([\d.]+) secs")
    ok = int(num(r"\[200\]\s+(\d+) responses") or 0)
    statuses = sum(int(n) for code, n in re.findall(r"\[(\d+)\]\s+(\d+) responses", out) if code != "200")
    errors = sum(int(n) for n in re.findall(r"\[(\d+)\]\s+Get ", out))
    sample = re.search(r"Error distribution:\s*\n\s*(\[\d+\]\s+.*)", out)
    return {"rps": num(r"Requests/sec:\s+([\d.]+)"), "p50_ms": None if p50 is None else round(p50 * 1000, 2),
            "p99_ms": None if p99 is None else round(p99 * 1000, 2),
            "max_ms": None if slowest is None else round(slowest * 1000, 1), "ok": ok, "errors": statuses + errors,
            "error_sample": sample.group(1)[:300] if sample else None}


def curl_bulk(url: str, proxy_port: int | None, tunnel: bool, wrap: list[str] | None = None) -> float:
    """MB/s (10^6 bytes) of one download of ``url`` to /dev/null, direct or through the proxy
    on 127.0.0.1:``proxy_port`` (``tunnel``: a CONNECT tunnel, curl -p; else absolute-form)."""
    argv = [need("curl"), "-sS", "-f", "-o", "/dev/null", "-w", "%{speed_download} %{size_download}"]
    if proxy_port is not None:
        argv += ["-x", f"http://127.0.0.1:{proxy_port}"] + (["-p"] if tunnel else [])
    p = subprocess.run([*(wrap or []), *argv, url], capture_output=True, text=True, timeout=300, check=True)
    speed, size = p.stdout.split()
    if int(size) != 1 << 30:
        raise RuntimeError(f"download of {url} stopped at {size} bytes")
    return round(float(speed) / 1e6, 1)
