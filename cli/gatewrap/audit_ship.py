"""Ship the audit log to a syslog collector: ``gatewrap audit ship``.

The shipper is a reader of the local JSONL file, never in the gate's write path: the file is
the truth, and a collector that is gone only delays shipping. It tails the log
(:func:`gatewrap.audit_reader.tail`) from a persisted :class:`~gatewrap.audit_reader.Position`,
sends each line as one RFC 5424 message (:func:`rfc5424`) framed by octet counting (RFC 6587
§3.4.1; RFC 5425 §4.3 over TLS) and saves the position after the collector's TCP has
acknowledged every byte sent (:meth:`Connection.wait_acked`). Delivery is at least once: a batch
whose acknowledgement did not come is sent again on the next connection, so a collector may
hold a line twice (the ``ino``/``off`` parameters of the structured data tell duplicates).
"""

from __future__ import annotations

import datetime as dt
import errno
import fcntl
import hashlib
import json
import os
import socket
import ssl
import struct
import sys
import termios
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TextIO
from urllib.parse import urlsplit

from . import audit_reader as ar
from .errors import GatewrapError
from .syslog_facility import FACILITIES

#: Our SD-ID (RFC 5424 §7.2.2, NAME@<private enterprise number>). 32473 is the example
#: enterprise number RFC 5612 reserves for documentation: a placeholder until gatewrap has one
#: of its own from IANA.
SD_ID = "gatewrap@32473"
APP_NAME = "gatewrap"
#: Severities (RFC 5424 §6.2.1, table 2): a denial is a warning, a failure a notice, the rest info.
WARNING, NOTICE, INFO = 4, 5, 6
#: A batch is sent, acknowledged and saved whole: at most this many lines or bytes.
BATCH_LINES = 2000
BATCH_BYTES = 1 << 20
#: Reconnection waits double from the first to the last (seconds).
BACKOFF_FIRST = 0.5
#: Seconds to wait for a connection, and for the collector's TCP to acknowledge a batch.
CONNECT_TIMEOUT = 10.0
ACK_TIMEOUT = 30.0
_TCP_ESTABLISHED = 1  # include/net/tcp_states.h


def _printusascii(text: str, limit: int) -> str:
    """``text`` if it is 1..limit PRINTUSASCII characters (RFC 5424 §6: %d33-126), else the
    NILVALUE ``-``."""
    return text if 0 < len(text) <= limit and all(33 <= ord(c) <= 126 for c in text) else "-"


def severity(rec: Any) -> int:
    """The severity of a record: warning for a denial (``decision`` in denied, rejected,
    expired), notice for a failure (``failed``), info for everything else (allowed, run
    start and end, checkpoints, lines that are not records)."""
    decision = rec.get("decision") if isinstance(rec, dict) else None
    return WARNING if decision in ar.DENIED else NOTICE if decision == "failed" else INFO


def rfc5424(line: bytes, rec: Any, pos: ar.Position, hostname: str, facility: int) -> bytes:
    """One SYSLOG-MSG (RFC 5424 §6) carrying one line of the audit log, its LF removed.

    - PRI (§6.2.1): ``facility`` * 8 + :func:`severity`.
    - VERSION (§6.2.2): 1. TIMESTAMP (§6.2.3): the record's ``time`` (UTC, microseconds),
      or now when it has none. HOSTNAME (§6.2.4): ``hostname``. APP-NAME (§6.2.5):
      ``gatewrap``. PROCID (§6.2.6): ``-``. MSGID (§6.2.7): the record's ``event``.
    - STRUCTURED-DATA (§6.3): ``[gatewrap@32473 run=".." event=".." decision=".." ino=".."
      off=".."]``: the record's run, event and decision where it has them, and the line's file
      (inode) and byte offset in it, which identify a line sent twice. In PARAM-VALUE, ``"``,
      ``\\`` and ``]`` are escaped with a backslash (§6.3.3).
    - MSG (§6.4): the line's exact bytes, as MSG-ANY (no BOM): the collector holds the bytes
      the hash chain covers.
    """
    rec = rec if isinstance(rec, dict) else {}
    stamp = ar.record_time(rec) or ar.stamp(dt.datetime.now(dt.timezone.utc))
    event = rec.get("event")
    params = [(k, rec[k]) for k in ("run", "event", "decision") if isinstance(rec.get(k), str)]
    params += [("ino", str(pos.ino)), ("off", str(pos.offset - len(line)))]
    sd = "[" + SD_ID + "".join(
        ' {}="{}"'.format(k, v.replace("\\", "\\\\").replace('"', '\\"').replace("]", "\\]"))
        for k, v in params) + "]"
    head = "<{}>1 {} {} {} - {} {}".format(
        facility * 8 + severity(rec), stamp, _printusascii(hostname, 255), APP_NAME,
        _printusascii(event, 32) if isinstance(event, str) else "-", sd)
    return head.encode("utf-8", "backslashreplace") + b" " + line.removesuffix(b"\n")


def frame(msg: bytes) -> bytes:
    """``msg`` framed by octet counting: MSG-LEN SP SYSLOG-MSG (RFC 6587 §3.4.1, RFC 5425 §4.3)."""
    return b"%d " % len(msg) + msg


@dataclass(frozen=True)
class Destination:
    """A collector: ``scheme`` ``tcp`` or ``tls``, ``host`` (a name or an IP literal), ``port``."""

    scheme: str
    host: str
    port: int

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


def parse_destination(text: str) -> Destination:
    """``tcp://HOST:PORT`` or ``tls://HOST:PORT`` (an IPv6 literal in brackets) as a
    :class:`Destination`.

    Raises:
        ValueError: another form; the message names the value and the forms.
    """
    try:
        u = urlsplit(text)
        port = u.port
    except ValueError:
        port = None
        u = None
    if u is None or u.scheme not in ("tcp", "tls") or not u.hostname or port is None \
            or u.path not in ("", "/") or u.query or u.username:
        raise ValueError(f"{text!r} is not a collector: use tcp://HOST:PORT or tls://HOST:PORT")
    return Destination(u.scheme, u.hostname, port)


class Unacknowledged(OSError):
    """The collector did not acknowledge what was sent: it closed the connection, the
    connection failed, or ``ACK_TIMEOUT`` passed."""


class Connection:
    """One connection to a collector: plain TCP, or TLS (RFC 5425) verified against ``ca``
    (a PEM file; the system's trust store without it) and the destination's host name."""

    def __init__(self, dest: Destination, ca: str | None) -> None:
        """Connect. Raises OSError (ssl.SSLError is one): unreachable, refused, a TLS failure."""
        raw = socket.create_connection((dest.host, dest.port), timeout=CONNECT_TIMEOUT)
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.sock: socket.socket = raw
            if dest.scheme == "tls":
                ctx = ssl.create_default_context(cafile=ca)
                ctx.minimum_version = ssl.TLSVersion.TLSv1_2  # RFC 9662 updates RFC 5425 to TLS 1.2+
                self.sock = ctx.wrap_socket(raw, server_hostname=dest.host)
            self.sock.settimeout(ACK_TIMEOUT)
        except BaseException:
            raw.close()
            raise

    def alive(self) -> bool:
        """Whether the connection is still established (TCP_INFO's ``tcpi_state``, tcp(7)):
        a collector that closed or reset it is seen while there is nothing to send."""
        info = self.sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 8)
        return info[0] == _TCP_ESTABLISHED and not self.sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)

    def _unacked(self) -> int:
        """Bytes in the send queue not yet acknowledged by the peer: ``SIOCOUTQ`` (tcp(7);
        for TCP the kernel reports write_seq - snd_una, net/ipv4/tcp.c, tcp_ioctl)."""
        buf = fcntl.ioctl(self.sock.fileno(), termios.TIOCOUTQ, struct.pack("i", 0))  # SIOCOUTQ == TIOCOUTQ
        return int(struct.unpack("i", buf)[0])

    def send(self, data: bytes) -> None:
        """Send ``data`` and wait until the collector's TCP has acknowledged all of it.

        This is an acknowledgement by the collector's kernel, not by the collector: a collector
        killed with lines in its receive buffer or its queue loses them (TCP syslog has no
        application-level acknowledgement; RELP has, and is not implemented).

        Raises:
            OSError: the send failed; :class:`Unacknowledged`: see there.
        """
        self.sock.sendall(data)
        deadline, wait = time.monotonic() + ACK_TIMEOUT, 0.0005
        while self._unacked():
            if not self.alive():
                raise Unacknowledged(errno.ECONNRESET, "the collector closed the connection")
            if time.monotonic() > deadline:
                raise Unacknowledged(errno.ETIMEDOUT, f"no acknowledgement in {ACK_TIMEOUT:.0f} s")
            time.sleep(wait)
            wait = min(wait * 2, 0.05)
        if not self.alive():
            raise Unacknowledged(errno.ECONNRESET, "the collector closed the connection")

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class State:
    """The shipper's persisted :class:`~gatewrap.audit_reader.Position`: a JSON file
    ``{"log", "to", "dev", "ino", "offset", "seq", "segment", "last_sha256"}`` (``seq``: of the
    line shipped last; ``segment``: the rotated segment that follows it, where shipping goes on
    once the file is done, as :func:`gatewrap.audit_reader.segment_path` names it), replaced atomically (write, fsync, rename), and
    held with an exclusive ``flock(2)`` on ``PATH.lock`` so that two shippers never share it."""

    def __init__(self, path: str) -> None:
        """Raises GatewrapError: the lock is taken (another shipper) or the file unusable."""
        self.path = path
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            self._lock = os.open(path + ".lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        except OSError as e:
            raise GatewrapError(f"cannot use the state file {path} ({e.strerror}): pass --state PATH in a "
                                "folder you can write") from e
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock)
            raise GatewrapError(f"another `gatewrap audit ship` uses the state file {path}: stop it, or give this "
                                "one its own --state PATH") from None

    def load(self) -> tuple[ar.Position, bytes] | None:
        """The saved position and the SHA-256 of the line that ends there, or None when
        there is none yet. Raises GatewrapError: the file is not a state file."""
        try:
            with open(self.path, "rb") as f:
                d = json.load(f)
            seq = d.get("seq")
            return (ar.Position(int(d["dev"]), int(d["ino"]), int(d["offset"]), int(seq) if seq is not None else None),
                    bytes.fromhex(d["last_sha256"]))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError) as e:
            raise GatewrapError(f"{self.path} is not a state file of `gatewrap audit ship` ({e}): remove it to "
                                "ship the log from its start, or pass another --state") from e

    def save(self, pos: ar.Position, last_line: bytes, log: str, dest: Destination) -> None:
        """Replace the saved position with ``pos``, where ``last_line`` ends. Raises OSError (the disk)."""
        tmp = self.path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"log": log, "to": str(dest), "dev": pos.dev, "ino": pos.ino, "offset": pos.offset,
                       "seq": pos.seq, "segment": None if pos.seq is None else ar.segment_path(log, pos.seq + 1),
                       "last_sha256": hashlib.sha256(last_line).hexdigest()}, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)

    def close(self) -> None:
        os.close(self._lock)


@dataclass
class Shipped:
    """What one ``ship`` did: lines acknowledged, lines sent again after a failure, connections made."""

    lines: int = 0
    resent: int = 0
    connections: int = 0


class Shipper:
    """Sends batches to ``dest``, reconnecting with a doubling wait up to ``retry_max`` seconds
    while the collector is gone, and says each outage and recovery once on ``err``."""

    def __init__(self, dest: Destination, ca: str | None, retry_max: float, err: TextIO,
                 sleep: Callable[[float], None] = time.sleep) -> None:
        self.dest, self.ca, self.retry_max, self.err, self.sleep = dest, ca, retry_max, err, sleep
        self.conn: Connection | None = None
        self.stats = Shipped()
        self._down = False

    def idle(self) -> None:
        """Nothing to send: drop a connection the collector closed (the next send reconnects)."""
        if self.conn is not None and not self.conn.alive():
            self._fail("the collector closed the connection")

    def _fail(self, why: str) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None
        if not self._down:
            print(f"gatewrap: collector {self.dest}: {why}; retrying (the local log keeps every record, "
                  "shipping resumes where the collector last acknowledged)", file=self.err, flush=True)
            self._down = True

    def deliver(self, data: bytes, lines: int) -> None:
        """Send ``data`` (``lines`` framed messages) until the collector acknowledges it."""
        wait, tries = BACKOFF_FIRST, 0
        while True:
            try:
                if self.conn is None:
                    self.conn = Connection(self.dest, self.ca)
                    self.stats.connections += 1
                self.conn.send(data)
                if tries:
                    self.stats.resent += lines
                if self._down:
                    print(f"gatewrap: collector {self.dest}: connected again; lines sent since the last "
                          "acknowledgement were sent again (the collector may hold some twice)", file=self.err,
                          flush=True)
                    self._down = False
                self.stats.lines += lines
                return
            except ssl.SSLCertVerificationError as e:
                self._fail(f"its certificate is not trusted ({e.verify_message}; pass --ca FILE)")
            except OSError as e:
                self._fail(e.strerror or str(e) or type(e).__name__)
            tries += 1
            self.sleep(wait)
            wait = min(wait * 2, self.retry_max)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None


def _deliver(shipper: Shipper, state: State, batch: list[bytes], last: ar.Position, last_line: bytes,
             log: str, dest: Destination) -> None:
    """Deliver one batch, then save the position after its last line.
    Raises GatewrapError: the position cannot be saved."""
    shipper.deliver(b"".join(batch), len(batch))
    try:
        state.save(last, last_line, log, dest)
    except OSError as e:
        raise GatewrapError(f"cannot save the shipper's position to {state.path} ({e.strerror}): free space "
                            "there or pass another --state; a shipper started again resends what it could not "
                            "save") from e


def _resume(log: str, saved: tuple[ar.Position, bytes] | None, err: TextIO) -> ar.Position | None:
    """Where to start: the saved position, unless the log is still the same file (device and
    inode) but the line before that position is not the line shipped last (the file was
    rewritten in place, or truncated and written past the position): then its start."""
    if saved is None:
        return None
    pos, digest = saved
    try:
        with open(log, "rb") as f:
            st = os.fstat(f.fileno())
            if (st.st_dev, st.st_ino) != (pos.dev, pos.ino) or st.st_size < pos.offset or pos.offset == 0:
                return pos  # rotated or shorter: tail() says and handles it
            f.seek(max(0, pos.offset - BATCH_BYTES))
            before = f.read(pos.offset - f.tell())
    except OSError:
        return pos  # no log (yet), or unreadable: tail() waits or says so
    start = before.rfind(b"\n", 0, len(before) - 1) + 1
    if hashlib.sha256(before[start:]).digest() == digest:
        return pos
    print(f"gatewrap: {log} no longer holds the line shipped last before byte {pos.offset} (rewritten in place?); "
          "shipping it from its start", file=err, flush=True)
    return None


def _oldest(log: str) -> ar.Position | None:
    """The start of the log's oldest rotated segment (None: it has none), where a shipper
    without a position begins."""
    segs = ar.segments(log)
    if not segs:
        return None
    st = os.stat(segs[0][1])
    return ar.Position(st.st_dev, st.st_ino, 0)


def ship(log: str, dest: Destination, state_path: str, *, ca: str | None = None, follow: bool = False,
         hostname: str | None = None, facility: int = FACILITIES["authpriv"], retry_max: float = 30.0,
         err: TextIO | None = None) -> Shipped:
    """Ship ``log`` to ``dest`` from the position saved in ``state_path`` (without one, from
    the start of its oldest rotated segment, else of the file): every complete line, records of every event and lines that are not JSON
    alike. Without ``follow``, ends once the end of the log is acknowledged; with it, ships
    what is appended, following rotation and truncation, until interrupted (KeyboardInterrupt,
    which ends it with what it did).

    Raises:
        FileNotFoundError: no log (without ``follow``).
        GatewrapError: the log or the state file cannot be used (exit 125).
    """
    err = err or sys.stderr
    hostname = hostname or socket.gethostname()
    state = State(state_path)
    shipper = Shipper(dest, ca, retry_max, err)
    try:
        batch: list[bytes] = []
        size, last = 0, None
        line = b""
        saved = state.load()
        start = _resume(log, saved, err) if saved is not None else _oldest(log)
        for item in ar.tail(log, err, start=start, follow=follow, idle=True):
            if item is not None:
                _, last, line = item
                try:
                    rec = ar.parse(line)
                except ValueError:
                    rec = None
                batch.append(frame(rfc5424(line, rec, last, hostname, facility)))
                size += len(batch[-1])
                if len(batch) < BATCH_LINES and size < BATCH_BYTES:
                    continue
            if batch:
                assert last is not None
                _deliver(shipper, state, batch, last, line, log, dest)
                batch, size = [], 0
            else:
                shipper.idle()
        if batch:
            assert last is not None
            _deliver(shipper, state, batch, last, line, log, dest)
        return shipper.stats
    except KeyboardInterrupt:
        return shipper.stats  # what was not acknowledged is sent by the next shipper
    finally:
        shipper.close()
        state.close()
