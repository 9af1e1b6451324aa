"""The fake internet: a network namespace with DNS, HTTP(S) and echo servers.

Topology (all addresses from documentation ranges, reachable only through the
veth pair this module creates; nothing is routed anywhere else)::

    host netns                                   netns gwt-inet-XXXXXX
    gwtiXXXXXX  198.51.100.1/25  <---- veth ---->  veth0 198.51.100.2/25
                2001:db8:1::1/64                         2001:db8:1::2/64
    routes: 198.51.100.128/25   via 198.51.100.2      lo: 198.51.100.138/.148/.158 (/32)
            2001:db8:100::/48 via 2001:db8:1::2         2001:db8:100::10/::20/::30 (/128)
                                                   default via 198.51.100.1 / 2001:db8:1::1
                                                   (so replies reach any client the host forwards)

Servers in the inet netns:

* DNS, UDP and TCP port 53 on 198.51.100.2 and 2001:db8:1::2 (``dns_server.py``).
* HTTP port 80, HTTPS port 443, TCP echo port 7 on every address (v4 and v6),
  UDP echo port 7 on each server address and on 198.51.100.2 / 2001:db8:1::2
  (``servers.py``, whose docstring lists the HTTP routes).
* WebSocket echo: ws on port 8080, wss on port 8443, every address (``ws_server.py``).

Only one FakeInternet can exist at a time on a host (the addresses and routes
are fixed); a second one raises. After a crash (SIGKILL) call
:func:`cleanup_leftovers` to remove stale namespaces, links and routes.
"""

from __future__ import annotations

import atexit
import ipaddress
import json
import os
import secrets
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from typing import Callable, Iterable, Mapping, Sequence

from .ca import TestPKI, make_pki

HERE = os.path.dirname(os.path.abspath(__file__))

NETNS_PREFIX = "gwt-inet-"
HOST_IF_PREFIX = "gwti"  # + 6 hex = 10 chars < IFNAMSIZ (16 incl. NUL)
INET_IF = "veth0"  # name of the veth end inside the inet netns

HOST_V4 = "198.51.100.1"  # host end of the veth (/25)
INET_V4 = "198.51.100.2"  # inet end; the DNS server's v4 address
HOST_V6 = "2001:db8:1::1"  # host end (/64)
INET_V6 = "2001:db8:1::2"  # inet end; the DNS server's v6 address
LINK_V4_PREFIX = 25
LINK_V6_PREFIX = 64
SERVER_NET_V4 = "198.51.100.128/25"  # routed to the inet netns
SERVER_NET_V6 = "2001:db8:100::/48"  # routed to the inet netns
SERVER_V4 = ("198.51.100.138", "198.51.100.148", "198.51.100.158")
SERVER_V6 = ("2001:db8:100::10", "2001:db8:100::20", "2001:db8:100::30")

DNS_PORT = 53
HTTP_PORT = 80
HTTPS_PORT = 443
ECHO_PORT = 7
WS_PORT = 8080
WSS_PORT = 8443

#: Default name table: name -> addresses (v4 and/or v6). A key "*.x.test" answers
#: every name under x.test that has no entry of its own.
DEFAULT_NAMES: dict[str, list[str]] = {
    "allowed.test": ["198.51.100.138", "2001:db8:100::10"],
    "other.allowed.test": ["198.51.100.138", "2001:db8:100::10"],
    "denied.test": ["198.51.100.148", "2001:db8:100::20"],
    "evil.test": ["198.51.100.158"],
}

STARTUP_TIMEOUT = 5.0  # seconds, for all servers to answer from the host netns
PROBE_TIMEOUT = 0.25  # seconds, one readiness probe


def _host_prefix(addr: str) -> int:
    """32 for an IPv4 address, 128 for IPv6: the prefix that names one host."""
    return ipaddress.ip_address(addr).max_prefixlen


class FakeInternetError(RuntimeError):
    """Set-up of the fake internet failed (message carries the servers' stderr)."""


class AddressConflict(FakeInternetError):
    """An address or route the fake internet needs is already on this host. The message is
    one line: the address, who holds it (an interface, a route, another fake internet) and
    what to do."""


#: Every network the fake internet puts on the host side: the veth link and the server ranges.
HOST_NETS = (f"{HOST_V4}/{LINK_V4_PREFIX}", f"{HOST_V6}/{LINK_V6_PREFIX}", SERVER_NET_V4, SERVER_NET_V6)


def _ip_json(*args: str) -> list[dict]:
    """``ip -json ARGS`` parsed (iproute2's own JSON output)."""
    return json.loads(_run(["ip", "-json", *args]).stdout or "[]")


def conflicts(extra: Iterable[str] = ()) -> list[str]:
    """What on this host overlaps the fake internet's networks (:data:`HOST_NETS` and
    ``extra`` addresses): one sentence per address or route, naming its interface, and the
    live fake internet that owns it when it is one. Empty when the host is free."""
    ours = [ipaddress.ip_network(n, strict=False) for n in (*HOST_NETS, *extra)]

    def clash(text: str) -> ipaddress.IPv4Network | ipaddress.IPv6Network | None:
        # A clash: an address inside one of ours, or a route (an address's own network among
        # them) at least as specific as ours that overlaps it. A wider one (a /8, a default
        # route) is fine: ours, more specific, wins.
        try:
            iface = ipaddress.ip_interface(text)
        except ValueError:
            return None
        net = iface.network
        return next((o for o in ours if o.version == net.version
                     and (iface.ip in o or (net.prefixlen >= o.prefixlen and o.overlaps(net)))), None)

    def holder(dev: str) -> str:
        if dev.startswith(HOST_IF_PREFIX):
            live = [n for n in _netns_list() if n.startswith(NETNS_PREFIX) and _owner_alive(n)]
            return (f"{dev} (another fake internet's link: a test run or demo in progress, {', '.join(live)}; "
                    "wait for it to end)" if live else f"{dev} (a leaked fake internet's link; a new "
                    "test run or demo removes it)")
        return f"{dev} (this host's own network: stop using that range here, or run on another machine)"

    out = []
    for link in _ip_json("addr", "show"):
        for a in link.get("addr_info", []):
            o = clash(f"{a.get('local')}/{a.get('prefixlen')}")
            if o is not None:
                out.append(f"{a['local']}/{a['prefixlen']} on {holder(link.get('ifname', '?'))} overlaps the fake internet's {o}")
    for fam in ("-4", "-6"):
        for r in _ip_json(fam, "route", "show"):
            o = clash(r.get("dst", ""))
            if o is not None and r.get("dst") != "default":
                out.append(f"route {r['dst']} via {holder(r.get('dev', '?'))} overlaps the fake internet's {o}")
    return sorted(set(out))


def _run(argv: Sequence[str], check: bool = True, timeout: float = 10) -> subprocess.CompletedProcess:
    p = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout)
    if check and p.returncode != 0:
        raise FakeInternetError(f"{' '.join(argv)} failed ({p.returncode}): {p.stderr.strip()}")
    return p


def in_netns(ns: str) -> list[str]:
    """The argv prefix that runs a command in the named netns ``ns`` (``/run/netns/NS``):
    ``nsenter --net`` enters the network namespace only. (``ip netns exec`` and ``ip -n`` also
    remount /sys, which fails with EINVAL where / is not a mount point, as in a chroot.)"""
    return ["nsenter", f"--net=/run/netns/{ns}", "--"]


def _netns_list() -> list[str]:
    try:
        return sorted(n for n in os.listdir("/run/netns"))
    except FileNotFoundError:
        return []


def leftovers() -> dict[str, list[str]]:
    """What any FakeInternet may have left behind in the host netns: netns named
    ``gwt-inet-*``, links named ``gwti*``, and routes/addresses of the fake internet."""
    links = [
        line.split()[1].split("@")[0].rstrip(":")
        for line in _run(["ip", "-o", "link", "show"]).stdout.splitlines()
        if line.split()[1].startswith(HOST_IF_PREFIX)
    ]
    routes = _run(["ip", "route", "show", SERVER_NET_V4]).stdout.strip().splitlines()
    routes += _run(["ip", "-6", "route", "show", SERVER_NET_V6]).stdout.strip().splitlines()
    addrs = [
        line
        for line in _run(["ip", "-o", "addr", "show"]).stdout.splitlines()
        if f" {HOST_V4}/" in line or f" {HOST_V6}/" in line
    ]
    return {
        "netns": [n for n in _netns_list() if n.startswith(NETNS_PREFIX)],
        "links": links,
        "routes": routes,
        "addrs": addrs,
    }


#: Where each FakeInternet records its owner's pid (``<netns>.pid``), so that a clean-up by
#: another process (a second pytest on the host) leaves a live one alone.
OWNERS_DIR = "/run/gwt-inet"


def _owner_alive(ns: str) -> bool:
    try:
        with open(os.path.join(OWNERS_DIR, ns + ".pid")) as f:
            pid = int(f.read().strip())
        os.kill(pid, 0)
    except (OSError, ValueError):
        return False
    return True


def cleanup_leftovers() -> None:
    """Remove what a dead FakeInternet left: ``gwt-inet-*`` netns whose owner process is
    gone (their processes killed first), their ``$TMPDIR/gwt-inet-*`` directories, and, when
    no live FakeInternet remains, the fixed links, routes and addresses. A live one (its
    owner's pid in :data:`OWNERS_DIR` still runs) is left alone, whoever calls this."""
    live = {n for n in _netns_list() if n.startswith(NETNS_PREFIX) and _owner_alive(n)}
    for ns in [n for n in _netns_list() if n.startswith(NETNS_PREFIX) and n not in live]:
        _kill_netns_pids(ns)
        _run(["ip", "netns", "del", ns], check=False)
        _forget_owner(ns)
    tmp = tempfile.gettempdir()
    for d in os.listdir(tmp):
        if (d.startswith(NETNS_PREFIX) and os.path.isdir(os.path.join(tmp, d))
                and not any(d.startswith(ns + "-") for ns in live)):
            shutil.rmtree(os.path.join(tmp, d), ignore_errors=True)
    if live:
        return
    for link in leftovers()["links"]:
        _run(["ip", "link", "del", link], check=False)
    _run(["ip", "route", "del", SERVER_NET_V4], check=False)
    _run(["ip", "-6", "route", "del", SERVER_NET_V6], check=False)


def _record_owner(ns: str) -> None:
    os.makedirs(OWNERS_DIR, exist_ok=True)
    with open(os.path.join(OWNERS_DIR, ns + ".pid"), "w") as f:
        f.write(str(os.getpid()))


def _forget_owner(ns: str) -> None:
    try:
        os.unlink(os.path.join(OWNERS_DIR, ns + ".pid"))
    except FileNotFoundError:
        pass


def _kill_netns_pids(ns: str) -> None:
    p = _run(["ip", "netns", "pids", ns], check=False)
    for tok in p.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def _norm_addrs(addrs: str | Iterable[str]) -> list[str]:
    addrs = [addrs] if isinstance(addrs, str) else list(addrs)
    for a in addrs:
        ipaddress.ip_address(a)  # validate early
    return addrs


def _norm_names(extra: Mapping[str, str | Iterable[str]] | None) -> dict[str, list[str]]:
    names = {k: list(v) for k, v in DEFAULT_NAMES.items()}
    for name, addrs in (extra or {}).items():
        names[name.lower().rstrip(".")] = _norm_addrs(addrs)
    return names


class FakeInternet:
    """Context manager running the fake internet; see the module docstring for the map.

    ``extra_names``: more (or overriding) DNS names, ``{"x.test": "198.51.100.158"}`` or
    ``{"x.test": ["198.51.100.158", "2001:db8:100::30"]}``. Only the addresses in
    SERVER_V4/SERVER_V6 have servers behind them.
    ``ttl``: TTL in seconds of every DNS answer (default 0: clients must not cache).
    ``sequences``: names whose answers change from query to query (DNS rebinding),
    ``{"rebind.test": ["198.51.100.138", "10.20.30.40"]}``: the n-th A (or AAAA) query gets
    the n-th entry (a string or a list), the last one from then on (see ``dns_server.py``).
    ``private_addrs``: non-public addresses (e.g. ``"10.20.30.40"``) added to the inet
    netns's servers and routed there from the host (a /32 or /128 via the veth), so that a
    connection to one lands in the access log instead of leaving by the host's default route.

    Attributes once entered: ``netns`` (name), ``host_ifname``, ``tmpdir``,
    ``dns_server`` ("198.51.100.2:53"), ``dns_server6`` ("[2001:db8:1::2]:53"),
    ``dns_ip`` ("198.51.100.2"), ``ca_path`` (CA PEM, mode 0644), ``pki`` (all PEM
    paths), ``dns_log`` and ``access_log`` (JSON-lines files, empty at start: the
    readiness probes are wiped), ``names`` (the name table in force).
    """

    def __init__(
        self,
        extra_names: Mapping[str, str | Iterable[str]] | None = None,
        ttl: int = 0,
        startup_timeout: float = STARTUP_TIMEOUT,
        sequences: Mapping[str, Sequence[str | Iterable[str]]] | None = None,
        private_addrs: Iterable[str] = (),
    ):
        self.sequences = {
            name.lower().rstrip("."): [_norm_addrs(step) for step in steps] for name, steps in (sequences or {}).items()
        }
        # The first answer of a sequence is its entry in the name table (certificates name it too).
        self.names = _norm_names({**{n: steps[0] for n, steps in self.sequences.items()}, **(extra_names or {})})
        self.private_addrs = [str(ipaddress.ip_address(a)) for a in private_addrs]
        self.ttl = int(ttl)
        self.startup_timeout = startup_timeout
        suffix = secrets.token_hex(3)
        self.netns = NETNS_PREFIX + suffix
        self.host_ifname = HOST_IF_PREFIX + suffix
        self.dns_ip = INET_V4
        self.dns_ip6 = INET_V6
        self.dns_server = f"{INET_V4}:{DNS_PORT}"
        self.dns_server6 = f"[{INET_V6}]:{DNS_PORT}"
        self.tmpdir: str | None = None
        self.pki: TestPKI | None = None
        self._procs: dict[str, subprocess.Popen] = {}
        self._made_netns = False
        self._made_link = False
        self._active = False

    # ------------------------------------------------------------------ paths
    @property
    def ca_path(self) -> str:
        """PEM of the self-signed test CA that signed the HTTPS server's certificate."""
        assert self.pki, "FakeInternet not started"
        return self.pki.ca_cert

    @property
    def dns_log(self) -> str:
        """JSON-lines file, one line per DNS query received (fields in dns_server.py)."""
        return os.path.join(self._dir(), "dns.jsonl")

    @property
    def access_log(self) -> str:
        """JSON-lines file, one line per connection/request/datagram (fields in servers.py)."""
        return os.path.join(self._dir(), "access.jsonl")

    @property
    def sites_dir(self) -> str:
        """Folder of the sites tests fill in: ``<sites_dir>/<host>/...`` (see ``sites.py``)."""
        return os.path.join(self._dir(), "sites")

    @property
    def ws_log(self) -> str:
        """JSON-lines file, one line per WebSocket handshake (fields in ws_server.py)."""
        return os.path.join(self._dir(), "ws.jsonl")

    def _dir(self) -> str:
        assert self.tmpdir, "FakeInternet not started"
        return self.tmpdir

    # ---------------------------------------------------------------- lookups
    def addr(self, name: str) -> str:
        """First IPv4 address of ``name`` in the name table (KeyError if none)."""
        return self._addr(name, 4)

    def addr6(self, name: str) -> str:
        """First IPv6 address of ``name`` in the name table (KeyError if none)."""
        return self._addr(name, 6)

    def _addr(self, name: str, version: int) -> str:
        for a in self.names[name.lower().rstrip(".")]:
            if ipaddress.ip_address(a).version == version:
                return a
        raise KeyError(f"{name} has no IPv{version} address")

    # ------------------------------------------------------------------- logs
    @staticmethod
    def _read_jsonl(path: str, filters: dict) -> list[dict]:
        out = []
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                if all(rec.get(k) == v for k, v in filters.items()):
                    out.append(rec)
        return out

    def dns_queries(self, **filters) -> list[dict]:
        """Parsed DNS log lines whose fields equal ``filters``, e.g. ``dns_queries(qname="evil.test")``."""
        return self._read_jsonl(self.dns_log, filters)

    def access_entries(self, **filters) -> list[dict]:
        """Parsed access log lines matching ``filters``, e.g. ``access_entries(local="198.51.100.148")``."""
        return self._read_jsonl(self.access_log, filters)

    def clear_logs(self) -> None:
        """Empty both logs (servers append with O_APPEND, so this is safe while they run)."""
        for p in (self.dns_log, self.access_log):
            with open(p, "w"):
                pass

    # ------------------------------------------------------------------- exec
    def exec(self, argv: Sequence[str], timeout: float = 30, check: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the inet netns (:func:`in_netns`); output captured as text."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return subprocess.run([*in_netns(self.netns), *argv], timeout=timeout, check=check, **kw)

    # -------------------------------------------------------------- lifecycle
    def __enter__(self) -> "FakeInternet":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        """Build the netns, start the servers, wait until all answer (< startup_timeout s)."""
        if self._active:
            raise FakeInternetError("already started")
        clash = conflicts(self.private_addrs)
        if clash:
            raise AddressConflict(
                f"the fake internet's addresses are taken on this host: {clash[0]}"
                + (f" (and {len(clash) - 1} more)" if len(clash) > 1 else ""))
        self._active = True
        atexit.register(self.close)
        try:
            self._setup()
        except BaseException:
            self.close()
            raise

    def _setup(self) -> None:
        self.tmpdir = tempfile.mkdtemp(prefix=self.netns + "-")
        os.chmod(self.tmpdir, 0o755)  # sandboxed clients (other uids) may need the CA
        for p in (self.dns_log, self.access_log):
            open(p, "w").close()
            os.chmod(p, 0o644)
        os.mkdir(self.sites_dir, 0o755)
        san_names = sorted({"allowed.test", "*.allowed.test", "denied.test", "evil.test", *self.names})
        self.pki = make_pki(self.tmpdir, san_names, [*SERVER_V4, *SERVER_V6, INET_V4, INET_V6])
        self._build_network()
        self._start_servers()
        self._wait_ready()
        self.clear_logs()

    def _build_network(self) -> None:
        ns, hif = self.netns, self.host_ifname
        _record_owner(ns)
        _run(["ip", "netns", "add", ns])
        self._made_netns = True
        _run(["ip", "link", "add", hif, "type", "veth", "peer", "name", INET_IF, "netns", ns])
        self._made_link = True
        for knob, val in (("accept_dad", "0"), ("accept_ra", "0"), ("disable_ipv6", "0")):
            with open(f"/proc/sys/net/ipv6/conf/{hif}/{knob}", "w") as f:
                f.write(val)
        _run(
            [*in_netns(ns), "sysctl", "-qw",
             "net.ipv6.conf.all.accept_dad=0", "net.ipv6.conf.default.accept_dad=0",
             f"net.ipv6.conf.{INET_IF}.accept_dad=0", f"net.ipv6.conf.{INET_IF}.accept_ra=0",
             "net.ipv6.conf.all.disable_ipv6=0", f"net.ipv6.conf.{INET_IF}.disable_ipv6=0"]
        )
        batch = [
            "link set lo up",
            f"addr add {INET_V4}/{LINK_V4_PREFIX} dev {INET_IF}",
            f"addr add {INET_V6}/{LINK_V6_PREFIX} dev {INET_IF} nodad",
            *[f"addr add {a}/32 dev lo" for a in SERVER_V4],
            *[f"addr add {a}/128 dev lo nodad" for a in SERVER_V6],
            *[f"addr add {a}/{_host_prefix(a)} dev lo" for a in self.private_addrs],
            f"link set {INET_IF} up",
            f"route add default via {HOST_V4} dev {INET_IF}",
            f"route add ::/0 via {HOST_V6} dev {INET_IF}",
        ]
        p = subprocess.run([*in_netns(ns), "ip", "-batch", "-"], input="\n".join(batch) + "\n",
                           capture_output=True, text=True, timeout=10)
        if p.returncode != 0:
            raise FakeInternetError(f"ip -batch in netns {ns} failed: {p.stderr.strip()}")
        host_batch = [
            f"addr add {HOST_V4}/{LINK_V4_PREFIX} dev {hif}",
            f"addr add {HOST_V6}/{LINK_V6_PREFIX} dev {hif} nodad",
            f"link set {hif} up",
            f"route add {SERVER_NET_V4} via {INET_V4} dev {hif}",
            f"route add {SERVER_NET_V6} via {INET_V6} dev {hif}",
            *[f"route add {a}/{_host_prefix(a)} via {INET_V4 if ':' not in a else INET_V6} dev {hif}"
              for a in self.private_addrs],
        ]
        p = subprocess.run(["ip", "-batch", "-"], input="\n".join(host_batch) + "\n",
                           capture_output=True, text=True, timeout=10)
        if p.returncode != 0:
            raise FakeInternetError(f"ip -batch (host side) failed: {p.stderr.strip()}")
        # Never probe before the routes are proven to point at our veth: otherwise
        # probes for documentation addresses would leave by the host's default route.
        for dst in (SERVER_V4[0], SERVER_V6[0], INET_V4, INET_V6, *self.private_addrs):
            out = _run(["ip", "route", "get", dst]).stdout
            if f"dev {hif}" not in out:
                raise FakeInternetError(f"route to {dst} does not use {hif}: {out.strip()}")

    def _start_servers(self) -> None:
        assert self.tmpdir and self.pki
        dns_cfg = {
            "names": self.names,
            "ttl": self.ttl,
            "log": self.dns_log,
            "listen": [[INET_V4, DNS_PORT], [INET_V6, DNS_PORT]],
            "sequences": self.sequences,
        }
        srv_cfg = {
            "log": self.access_log,
            "cert": self.pki.server_cert,
            "key": self.pki.server_key,
            "http_port": HTTP_PORT,
            "https_port": HTTPS_PORT,
            "echo_port": ECHO_PORT,
            "udp_addrs": [*SERVER_V4, *SERVER_V6, INET_V4, INET_V6],
            "sites_root": self.sites_dir,
        }
        ws_cfg = {"log": self.ws_log, "cert": self.pki.server_cert, "key": self.pki.server_key,
                  "ws_port": WS_PORT, "wss_port": WSS_PORT}
        env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
        for name, script, cfg in (("dns", "dns_server.py", dns_cfg), ("servers", "servers.py", srv_cfg),
                                  ("ws", "ws_server.py", ws_cfg)):
            cfg_path = os.path.join(self.tmpdir, f"{name}.json")
            with open(cfg_path, "w") as f:
                json.dump(cfg, f)
            out = open(os.path.join(self.tmpdir, f"{name}.out"), "wb")
            err = open(os.path.join(self.tmpdir, f"{name}.err"), "wb")
            try:
                self._procs[name] = subprocess.Popen(
                    [*in_netns(self.netns), sys.executable, os.path.join(HERE, script), cfg_path],
                    stdin=subprocess.PIPE, stdout=out, stderr=err, cwd=self.tmpdir, env=env,
                    start_new_session=True,  # Ctrl-C in the terminal goes to pytest, not to them
                )
            finally:
                out.close()
                err.close()

    def server_stderr(self) -> str:
        """Concatenated stderr of the server processes (for failure messages)."""
        parts = []
        for name in self._procs:
            try:
                with open(os.path.join(self._dir(), f"{name}.err"), errors="replace") as f:
                    parts.append(f"--- {name} stderr ---\n{f.read()}")
            except OSError:
                pass
        return "\n".join(parts)

    # --------------------------------------------------------------- probing
    def _probes(self) -> dict[str, Callable[[], bool]]:
        ctx = ssl.create_default_context(cafile=self.ca_path)

        def dns(tcp: bool, server: str):
            from dnslib import DNSRecord, QTYPE  # local: keep import cost off module load

            r = DNSRecord.parse(
                DNSRecord.question("allowed.test", "A").send(server, DNS_PORT, tcp=tcp, timeout=PROBE_TIMEOUT, ipv6=":" in server)
            )
            return any(str(rr.rdata) == self.addr("allowed.test") for rr in r.rr if rr.rtype == QTYPE.A)

        def http(ip: str):
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            with socket.socket(fam, socket.SOCK_STREAM) as s:
                s.settimeout(PROBE_TIMEOUT)
                s.connect((ip, HTTP_PORT))
                s.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
                return s.recv(64).startswith(b"HTTP/1.1 200")

        def https(ip: str):
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            with socket.socket(fam, socket.SOCK_STREAM) as raw:
                raw.settimeout(PROBE_TIMEOUT)
                raw.connect((ip, HTTPS_PORT))
                with ctx.wrap_socket(raw, server_hostname="allowed.test") as s:
                    s.sendall(b"GET / HTTP/1.1\r\nHost: allowed.test\r\nConnection: close\r\n\r\n")
                    return s.recv(64).startswith(b"HTTP/1.1 200")

        def tcp_echo(ip: str):
            with socket.create_connection((ip, ECHO_PORT), timeout=PROBE_TIMEOUT) as s:
                s.sendall(b"ping")
                return s.recv(16) == b"ping"

        def udp_echo(ip: str):
            fam = socket.AF_INET6 if ":" in ip else socket.AF_INET
            with socket.socket(fam, socket.SOCK_DGRAM) as s:
                s.settimeout(PROBE_TIMEOUT)
                s.connect((ip, ECHO_PORT))
                s.send(b"ping")
                return s.recv(16) == b"ping"

        v4, v6 = SERVER_V4[0], SERVER_V6[0]
        return {
            "dns udp v4": lambda: dns(False, INET_V4),
            "dns tcp v4": lambda: dns(True, INET_V4),
            "dns udp v6": lambda: dns(False, INET_V6),
            "http v4": lambda: http(v4),
            "http v6": lambda: http(v6),
            "https v4": lambda: https(v4),
            "https v6": lambda: https(v6),
            "tcp echo v4": lambda: tcp_echo(v4),
            "udp echo v4": lambda: udp_echo(v4),
            "udp echo v6": lambda: udp_echo(v6),
            "ws v4": lambda: socket.create_connection((v4, WS_PORT), timeout=PROBE_TIMEOUT).close() is None,
            "wss v4": lambda: socket.create_connection((v4, WSS_PORT), timeout=PROBE_TIMEOUT).close() is None,
        }

    def _wait_ready(self) -> None:
        pending = self._probes()
        deadline = time.monotonic() + self.startup_timeout
        last_err: dict[str, str] = {}
        while pending:
            for name, proc in self._procs.items():
                if proc.poll() is not None:
                    raise FakeInternetError(
                        f"fake internet server {name!r} exited with {proc.returncode}\n{self.server_stderr()}"
                    )
            for name, probe in list(pending.items()):
                try:
                    if probe():
                        del pending[name]
                    else:
                        last_err[name] = "wrong answer"
                except (OSError, ssl.SSLError, EOFError, ValueError) as e:
                    last_err[name] = repr(e)
            if not pending:
                return
            if time.monotonic() > deadline:
                why = "; ".join(f"{n}: {last_err.get(n, '?')}" for n in pending)
                raise FakeInternetError(
                    f"fake internet not ready after {self.startup_timeout} s: {why}\n{self.server_stderr()}"
                )
            time.sleep(0.02)

    def close(self) -> None:
        """Tear everything down; idempotent; SIGINT is held off until done."""
        if not self._active:
            return
        old = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
        try:
            self._teardown()
        finally:
            self._active = False
            atexit.unregister(self.close)
            signal.pthread_sigmask(signal.SIG_SETMASK, old)

    def _teardown(self) -> None:
        for proc in self._procs.values():
            if proc.poll() is None:
                proc.kill()
        for proc in self._procs.values():
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
            if proc.stdin:
                try:
                    proc.stdin.close()
                except OSError:
                    pass
        self._procs.clear()
        if self._made_netns:
            _kill_netns_pids(self.netns)  # e.g. background things started via exec()
        if self._made_link:
            _run(["ip", "link", "del", self.host_ifname], check=False)  # both ends + routes go
            self._made_link = False
        _run(["ip", "route", "del", SERVER_NET_V4, "dev", self.host_ifname], check=False)
        _run(["ip", "-6", "route", "del", SERVER_NET_V6, "dev", self.host_ifname], check=False)
        if self._made_netns:
            _run(["ip", "netns", "del", self.netns], check=False)
            self._made_netns = False
        _forget_owner(self.netns)
        if self.tmpdir:
            shutil.rmtree(self.tmpdir, ignore_errors=True)
