"""Authoritative DNS server of the fake internet (runs inside the inet netns).

Usage: ``python3 dns_server.py CONFIG.json``. The config holds::

    {"names": {"allowed.test": ["198.51.100.138", "2001:db8:100::10"], ...},
     "ttl": 0,                       # seconds, on every answer
     "log": "/tmp/.../dns.jsonl",    # every query received -> one JSON line
     "listen": [["198.51.100.2", 53], ["2001:db8:1::2", 53]],   # UDP and TCP each
     "sequences": {"rebind.test": [["198.51.100.138"], ["10.20.30.40"]]}}   # optional

A name in ``sequences`` answers its n-th query of a type (A, AAAA) from the n-th list,
the last list once they run out (DNS rebinding: public first, private afterwards; the
TTL is the config's, 0 by default, so no well-behaved cache keeps the first answer).

Answers: A/AAAA from the table (a key ``*.x.test`` matches any name under
x.test not listed itself); a known name with no address of the asked type, or
another query type, gets NOERROR with no answer; an unknown ``.test`` name
gets NXDOMAIN; any name outside ``.test`` gets REFUSED. Log line fields:
ts (unix seconds), proto (udp|tcp), peer, peer_port, local, qname (lower
case, no trailing dot), qtype (e.g. "A"), rcode (e.g. "NOERROR"), answers.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
import threading

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import JsonLog, exit_when_parent_goes, norm_ip  # noqa: E402

from dnslib import AAAA, QTYPE, RCODE, RR, A  # noqa: E402
from dnslib.server import DNSLogger, DNSServer  # noqa: E402


def lookup(names: dict[str, list[str]], qname: str) -> list[str] | None:
    """Addresses for ``qname`` or None when unknown (exact name, then wildcards)."""
    if qname in names:
        return names[qname]
    labels = qname.split(".")
    for i in range(1, len(labels)):
        wild = "*." + ".".join(labels[i:])
        if wild in names:
            return names[wild]
    return None


class Resolver:
    def __init__(self, names: dict[str, list[str]], ttl: int, log: JsonLog,
                 sequences: dict[str, list[list[str]]] | None = None):
        self.names = {k.lower().rstrip("."): v for k, v in names.items()}
        self.sequences = {k.lower().rstrip("."): v for k, v in (sequences or {}).items()}
        self.asked: dict[tuple[str, int], int] = {}  # (name, qtype) -> queries answered so far
        self.lock = threading.Lock()
        self.ttl = ttl
        self.log = log

    def addresses(self, qname: str, qtype: int) -> list[str] | None:
        """The table's addresses for ``qname``; for a name in ``sequences``, the list for
        this query's rank among the queries of its type (counted from 0)."""
        seq = self.sequences.get(qname)
        if seq is None:
            return lookup(self.names, qname)
        with self.lock:
            n = self.asked.get((qname, qtype), 0)
            self.asked[(qname, qtype)] = n + 1
        return seq[min(n, len(seq) - 1)]

    def resolve(self, request, handler):
        reply = request.reply()  # sets qr, aa, ra
        q = request.q
        qname = str(q.qname).lower().rstrip(".")
        qtype = QTYPE.get(q.qtype, str(q.qtype))
        answers: list[str] = []
        if not (qname == "test" or qname.endswith(".test")):
            reply.header.rcode = RCODE.REFUSED
            reply.header.aa = 0
        else:
            addrs = self.addresses(qname, q.qtype)
            if addrs is None:
                reply.header.rcode = RCODE.NXDOMAIN
            else:
                for a in addrs:
                    ip = ipaddress.ip_address(a)
                    if ip.version == 4 and q.qtype in (QTYPE.A, QTYPE.ANY):
                        reply.add_answer(RR(q.qname, QTYPE.A, ttl=self.ttl, rdata=A(a)))
                        answers.append(a)
                    elif ip.version == 6 and q.qtype in (QTYPE.AAAA, QTYPE.ANY):
                        reply.add_answer(RR(q.qname, QTYPE.AAAA, ttl=self.ttl, rdata=AAAA(tuple(ip.packed))))  # 16 bytes, not text: dnslib cannot parse "::ffff:1.2.3.4", a form Python 3.13 writes for v4-mapped addresses (the failure was a DNS answer never sent: the gate saw 504)
                        answers.append(a)
        # Logged before dnslib sends the reply: once a client has its answer, the line is there.
        peer = handler.client_address
        local = handler.server.server_address
        self.log.write(
            proto=handler.protocol,
            peer=norm_ip(peer[0]),
            peer_port=peer[1],
            local=local[0],
            qname=qname,
            qtype=qtype,
            rcode=RCODE.get(reply.header.rcode),
            answers=answers,
        )
        return reply


def main() -> None:
    with open(sys.argv[1]) as f:
        cfg = json.load(f)
    exit_when_parent_goes()
    log = JsonLog(cfg["log"])
    resolver = Resolver(cfg["names"], int(cfg.get("ttl", 0)), log, cfg.get("sequences"))
    logger = DNSLogger(log="error", prefix=False, logf=lambda s: print(s, file=sys.stderr, flush=True))
    servers = []
    for addr, port in cfg["listen"]:
        for tcp in (False, True):
            s = DNSServer(resolver, address=addr, port=int(port), tcp=tcp, logger=logger)
            s.server.daemon_threads = True
            servers.append(s)
    for s in servers:
        s.start_thread()
    print("READY", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main()
