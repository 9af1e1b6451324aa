"""The upstream of the proxy benchmarks: nginx on loopback only (127.0.0.1), plain HTTP and
TLS, serving a 100-byte body at ``/`` and a 1 GiB file (sparse) at ``/big``.

The TLS certificate is for the IP address 127.0.0.1 (subjectAltName=IP:127.0.0.1, not a CA:
webpki refuses a CA certificate as a server's), signed by a CA made here that the gate's
inspecting side trusts as its ``upstream_ca``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time

from .common import need
from .ports import listening, wait_listening

HTTP_PORT = 18080
# 443, not a high port: hey names the TLS server (SNI) by the URL's host[:port]; "127.0.0.1:18443" is
# no valid server name (RFC 6066 3) and rustls (the inspecting gate) refuses it, while for
# "127.0.0.1" Go sends no SNI, as for any IP address.
TLS_PORT = 443
BODY = "x" * 99 + "\n"
BIG_BYTES = 1 << 30

CONF = """
daemon off;
worker_processes 1;
pid {d}/nginx.pid;
error_log {d}/nginx-error.log crit;
events {{ worker_connections 8192; }}
http {{
    access_log off;
    sendfile on;
    tcp_nopush on;
    keepalive_requests 10000000;
    keepalive_timeout 60s;
    client_body_temp_path {d}/nginx-body;
    proxy_temp_path {d}/nginx-proxy;
    fastcgi_temp_path {d}/nginx-fastcgi;
    uwsgi_temp_path {d}/nginx-uwsgi;
    scgi_temp_path {d}/nginx-scgi;
    server {{
        listen 127.0.0.1:{http} backlog=4096;
        listen 127.0.0.1:{tls} ssl backlog=4096;
        ssl_certificate {d}/upstream.crt;
        ssl_certificate_key {d}/upstream.key;
        location = / {{ default_type text/plain; return 200 "{body}"; }}
        location = /big {{ alias {d}/big; }}
    }}
}}
"""


class Nginx:
    """``with Nginx(tmp) as n``: nginx serving on 127.0.0.1:18080 and :443 (TLS);
    ``n.ca`` is the CA certificate to trust. Raises Missing when nginx is not installed."""

    def __init__(self, tmp: str) -> None:
        self.tmp, self.ca = tmp, os.path.join(tmp, "ca.crt")
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> "Nginx":
        nginx = need("nginx")
        busy = [p for p in (HTTP_PORT, TLS_PORT) if listening(p)]
        if busy:
            raise RuntimeError(f"127.0.0.1 port {busy} is in use by another program; stop it (ss -ltnp)")
        d = self.tmp
        openssl = need("openssl")
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes"]
        run = lambda *a: subprocess.run([openssl, *a], check=True, capture_output=True)
        run("req", "-x509", *ec, "-days", "2", "-subj", "/CN=gatewrap bench CA", "-keyout", f"{d}/ca.key",
            "-out", self.ca)
        run("req", "-new", *ec, "-subj", "/CN=127.0.0.1", "-keyout", f"{d}/upstream.key", "-out", f"{d}/upstream.csr")
        with open(f"{d}/upstream.ext", "w") as f:
            f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=critical,CA:FALSE\nextendedKeyUsage=serverAuth\n")
        run("x509", "-req", "-in", f"{d}/upstream.csr", "-CA", self.ca, "-CAkey", f"{d}/ca.key", "-CAcreateserial",
            "-days", "2", "-extfile", f"{d}/upstream.ext", "-out", f"{d}/upstream.crt")
        with open(f"{d}/big", "wb") as f:
            f.truncate(BIG_BYTES)
        with open(f"{d}/nginx.conf", "w") as f:
            f.write(CONF.format(d=d, http=HTTP_PORT, tls=TLS_PORT, body=BODY.replace("\n", "\\n")))
        self.proc = subprocess.Popen([nginx, "-c", f"{d}/nginx.conf", "-p", d, "-e", f"{d}/nginx-error.log"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_listening(self.proc, [HTTP_PORT, TLS_PORT], "nginx")
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)  # fast shutdown: kept-alive clients are not waited for
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.1)
