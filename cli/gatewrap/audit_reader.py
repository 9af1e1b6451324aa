"""Read the audit log (JSON lines) for ``gatewrap audit``: stream, filter, follow.

A log is its rotated segments, oldest first (``<log>.<seq of their first record, 12
digits>``, gate_core/src/audit/rotate.rs), then the live file at its path: :func:`log_files`.

The log is read as bytes, one line at a time (never whole), and a line is parsed only when
a cheap substring test says it can match the filters (:meth:`Filters.quick`); the parsed
record then decides (:meth:`Filters.match`). Bytes that are not UTF-8 are kept as
surrogate escapes (PEP 383), which :func:`gatewrap.text.printable` shows as ``\\xNN``.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import json
import os
import re
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TextIO

import orjson

from .errors import GatewrapError

#: Decisions that count as a denial for ``--denied``.
DENIED = frozenset({"denied", "rejected", "expired"})
#: How often ``--follow`` looks for new lines, rotation and truncation (seconds).
POLL = 0.2
#: Read buffer (bytes).
BUFFER = 1 << 20
#: How a line of the gate's starts, and the length of its time stamp (:func:`stamp`).
_GATE_PREFIX = b'{"v":1,"time":"'
_STAMP_LEN = 27
_STAMP_AT = len(_GATE_PREFIX)
_AGO = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
#: A rotated segment's name: the log's, a dot and at least this many digits (rotate.rs).
SEGMENT_DIGITS = 12
#: The ``seq`` of a gate line, near its start (after ``v`` and ``time``, mod.rs ``line()``).
_SEQ = re.compile(rb',"seq":(\d+),')
#: Printable ASCII but ``"`` and ``\\``: JSON writers (serde_json, Python's json) write these
#: verbatim, so a value made of them appears as is in any line that holds it.
_VERBATIM = re.compile(r'[ !#-\[\]-~]*')


def stamp(t: dt.datetime) -> str:
    """``t`` in the log's time form, UTC with microseconds: ``2026-12-01T09:00:00.000000Z``
    (gate_core/src/audit/mod.rs, ``format_time``); fixed width, so stamps compare as strings."""
    return t.astimezone(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def parse_time(text: str, now: dt.datetime | None = None) -> str:
    """A ``--since``/``--until`` value as a :func:`stamp`.

    Accepts ISO 8601 (``2026-12-01``, ``2026-12-01T09:30``, ``...Z`` or ``...+01:00``; without
    an offset, local time, as date(1) reads it) or a time ago: a number and s, m, h, d or w
    (``90s``, ``10m``, ``2h``, ``1.5d``).

    Raises:
        ValueError: neither form; the message names the value.
    """
    m = _AGO.fullmatch(text.strip())
    if m:
        now = now or dt.datetime.now(dt.timezone.utc)
        return stamp(now - dt.timedelta(seconds=float(m[1]) * _UNITS[m[2]]))
    try:
        t = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise ValueError(f"{text!r} is not a time: use ISO 8601 (2026-12-01T09:30, UTC with Z) "
                         "or a time ago (10m, 2h, 1d)") from None
    return stamp(t if t.tzinfo else t.astimezone())


def record_time(rec: dict[str, Any]) -> str | None:
    """The record's ``time`` as a :func:`stamp`, or None when it has none or it is not a time."""
    t = rec.get("time")
    if not isinstance(t, str):
        return None
    if len(t) == 27 and t[10] == "T" and t[-1] == "Z":
        return t
    try:
        parsed = dt.datetime.fromisoformat(t)
    except ValueError:
        return None
    return stamp(parsed if parsed.tzinfo else parsed.replace(tzinfo=dt.timezone.utc))


def host_of(rec: dict[str, Any]) -> str | None:
    """The destination a ``--host`` glob is matched on, lower-case: ``dst_host`` (the gate's
    canonical host; a DNS query's name), else ``dst_ip`` (kernel denials); None if neither."""
    h = rec.get("dst_host") or rec.get("dst_ip")
    return str(h).lower() if h else None


def _needle(value: str) -> bytes | None:
    """``"value"`` as every JSON writer spells it, or None when a writer might escape it."""
    return f'"{value}"'.encode() if _VERBATIM.fullmatch(value) else None


def _literal(glob: str) -> str:
    """The longest run of plain characters in ``glob`` (what any match must contain, as
    every JSON writer spells it); "" when there is none or it cannot be known (a ``[...]``
    class, a character a writer might escape)."""
    if "[" in glob:
        return ""
    best = max(re.split(r"[*?]", glob), key=len)
    return best if _VERBATIM.fullmatch(best) else ""


@dataclass
class Filters:
    """What ``gatewrap audit`` shows: a record passes when it passes every filter set.

    ``events``/``decisions``/``hosts`` are alternatives (any one); ``denied`` keeps the
    decisions in :data:`DENIED`; ``hosts`` are fnmatch globs on :func:`host_of`, matched
    without regard to case (IPv6 as written in the log, ``2001:db8::1``, brackets dropped);
    ``since``/``until`` are :func:`stamp` strings, both ends included.
    """

    run: str | None = None
    events: tuple[str, ...] = ()
    decisions: tuple[str, ...] = ()
    denied: bool = False
    hosts: tuple[str, ...] = ()
    since: str | None = None
    until: str | None = None
    pid: int | None = None
    _globs: tuple[str, ...] = field(init=False, repr=False, default=())
    _decisions: set[str] | None = field(init=False, repr=False, default=None)
    _groups: list[tuple[bytes, ...]] = field(init=False, repr=False, default_factory=list)
    _host_re: re.Pattern[bytes] | None = field(init=False, repr=False, default=None)
    _since: bytes | None = field(init=False, repr=False, default=None)
    _until: bytes | None = field(init=False, repr=False, default=None)

    def __post_init__(self) -> None:
        globs = tuple(h.lower()[1:-1] if h.startswith("[") and h.endswith("]") and ":" in h else h.lower()
                      for h in self.hosts)
        self._globs = globs
        decisions = set(self.decisions) if self.decisions else None
        if self.denied:
            decisions = set(DENIED) if decisions is None else decisions & DENIED
        self._decisions = decisions
        # Each group: one of its needles must be in the line (a necessary condition only).
        groups: list[tuple[bytes, ...]] = []
        for values in ([self.run] if self.run is not None else None, self.events or None, decisions):
            if values is None:
                continue
            needles = [_needle(v) for v in values]
            if all(n is not None for n in needles):
                groups.append(tuple(n for n in needles if n is not None))
        if self.pid is not None:
            # the kernel's pid, the gate's client_pid; serde_json's and json.dumps's spellings
            groups.append(tuple(f'"{k}":{sp}{self.pid}'.encode() for k in ("pid", "client_pid") for sp in ("", " ")))
        self._groups = groups
        literals = [_literal(g) for g in globs]
        host_re = None
        if globs and all(literals):
            host_re = re.compile(b"|".join(re.escape(x.encode()) for x in literals), re.IGNORECASE)
        self._host_re = host_re
        self._since = self.since.encode() if self.since is not None and len(self.since) == _STAMP_LEN else None
        self._until = self.until.encode() if self.until is not None and len(self.until) == _STAMP_LEN else None

    def quick(self, line: bytes) -> bool:
        """Whether ``line`` can hold a matching record (False means it cannot; True, maybe)."""
        if self._since is not None or self._until is not None:
            # The gate's lines start with v and time, compact (gate_core/src/audit/mod.rs, line()).
            t = line[_STAMP_AT:_STAMP_AT + _STAMP_LEN]
            if line.startswith(_GATE_PREFIX) and line[_STAMP_AT + _STAMP_LEN:_STAMP_AT + _STAMP_LEN + 1] == b'"' \
                    and b"\\" not in t:
                if (self._since is not None and t < self._since) or (self._until is not None and t > self._until):
                    return False
        for group in self._groups:
            for needle in group:
                if needle in line:
                    break
            else:
                return False
        return self._host_re is None or self._host_re.search(line) is not None

    def match(self, rec: dict[str, Any]) -> bool:
        """Whether the parsed record ``rec`` passes every filter."""
        if self.run is not None and rec.get("run") != self.run:
            return False
        if self.events and rec.get("event") not in self.events:
            return False
        decisions = self._decisions
        if decisions is not None and rec.get("decision") not in decisions:
            return False
        if self.pid is not None and self.pid not in (rec.get("pid"), rec.get("client_pid")):
            return False
        if self._globs:
            host = host_of(rec)
            if host is None or not any(fnmatch.fnmatchcase(host, g) for g in self._globs):
                return False
        if self.since is not None or self.until is not None:
            t = record_time(rec)
            if t is None or (self.since is not None and t < self.since) or (self.until is not None and t > self.until):
                return False
        return True


def _open(path: str) -> Any:
    """``path`` opened for reading bytes.

    Raises:
        FileNotFoundError: no such log.
        GatewrapError: not readable by this user (exit 125; the log is root's, 0640).
    """
    try:
        return open(path, "rb", buffering=BUFFER)
    except PermissionError as e:
        raise GatewrapError(f"cannot read the audit log {path} ({e.strerror}): it is root's; run gatewrap "
                            "with sudo, or pass --log PATH") from e


def segment_path(path: str, seq: int) -> str:
    """The rotated segment of ``path`` whose first record has ``seq``: ``<path>.<seq, 12 digits>``."""
    return f"{path}.{seq:0{SEGMENT_DIGITS}d}"


def segment_seq(base: str, name: str) -> int | None:
    """The first ``seq`` a file name says, when it is a rotated segment of the log named
    ``base`` (``audit.jsonl.000000005001`` -> 5001); None otherwise (``audit.jsonl.1``, as
    logrotate names it, is not)."""
    digits = name[len(base) + 1:] if name.startswith(base + ".") else ""
    return int(digits) if len(digits) >= SEGMENT_DIGITS and digits.isascii() and digits.isdigit() else None


def segments(path: str) -> list[tuple[int, str]]:
    """The rotated segments beside ``path``, oldest first: (first seq, path); none when
    its folder cannot be listed."""
    folder, base = os.path.split(path)
    out = []
    try:
        with os.scandir(folder or ".") as it:
            for e in it:
                seq = segment_seq(base, e.name)
                if seq is not None and e.is_file(follow_symlinks=False):
                    out.append((seq, os.path.join(folder, e.name)))
    except OSError:
        return []
    return sorted(out)


def log_files(path: str) -> list[str]:
    """The files of the log at ``path`` in chain order: its segments, then ``path``."""
    return [p for _, p in segments(path)] + [path]


def line_seq(line: bytes) -> int | None:
    """The ``seq`` of a line the gate wrote (found near its start), or None."""
    m = _SEQ.search(line, 0, 160)
    return int(m[1]) if m else None


def first_seq(f: Any) -> int | None:
    """The ``seq`` of the first line of the open file ``f`` (read with pread, the position
    untouched), or None (empty, or a line without one)."""
    head = os.pread(f.fileno(), 160, 0)
    line, nl, _ = head.partition(b"\n")
    return line_seq(line + nl) if nl or len(head) == 160 else None


def lines(path: str, offset: int = 0) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of ``path`` from byte ``offset`` (a line start) to its end.
    Line numbers count from ``offset``. Raises as :func:`_open`."""
    with _open(path) as f:
        if offset:
            f.seek(offset)
        yield from enumerate(f, 1)


@dataclass(frozen=True)
class Position:
    """Where a reader of the log stands: the file, by device and inode (``stat(2)``: a file
    renamed by rotation keeps both; its successor at the path has another inode), and
    ``offset``, the byte after the last complete line read; ``seq``, that line's ``seq``
    (None: not a gate line), which names the segment that follows (:func:`segment_path`)."""

    dev: int
    ino: int
    offset: int
    seq: int | None = None


def _rotated_to(path: str, start: Position) -> str | None:
    """The sibling of ``path`` that is the file ``start`` names (``audit.jsonl.1``, as
    logrotate names it, or any other name beginning with the log's), or None when it is gone."""
    folder, base = os.path.split(os.path.abspath(path))
    try:
        with os.scandir(folder) as it:
            for e in it:
                if e.name.startswith(base) and e.name != base and e.is_file(follow_symlinks=False):
                    st = e.stat(follow_symlinks=False)
                    if (st.st_dev, st.st_ino) == (start.dev, start.ino):
                        return e.path
    except OSError:
        return None
    return None


def _open_after(path: str, seq: int | None, err: TextIO) -> Any:
    """The file that follows the record ``seq``: the rotated segment that starts at
    ``seq + 1`` (when it is gone, the oldest after it, saying which records are in no file),
    else the file at ``path``; ``path``'s when ``seq`` is None (not a gate line). When
    ``path``'s file starts after ``seq + 1``, a rotation came in between: look again."""
    if seq is None:
        return _open(path)
    for _ in range(100):
        later = [(s, p) for s, p in segments(path) if s > seq]
        if later:
            if later[0][0] != seq + 1:
                print(f"gatewrap: records {seq + 1} to {later[0][0] - 1} of {path} are in no file (deleted, "
                      f"--audit-keep); reading on from {later[0][1]}", file=err, flush=True)
            return _open(later[0][1])
        f = _open(path)
        first = first_seq(f)
        if first is None or first <= seq + 1:
            return f
        if not any(s > seq for s, _ in segments(path)):
            print(f"gatewrap: records {seq + 1} to {first - 1} of {path} are in no file (deleted, --audit-keep); "
                  f"reading on from {path}", file=err, flush=True)
            return f
        f.close()
    return _open(path)


def tail(path: str, err: TextIO, start: Position | None = None, follow: bool = True,
         poll: float = POLL, idle: bool = False) -> Iterator[tuple[int, Position, bytes] | None]:
    """(line number, position after the line, line) of ``path``; with ``follow``, then of
    every line appended, like ``tail -F``.

    A line is yielded once complete (a writer may be mid-line). When the path names a new
    file (rotated), what the old one still holds is read first, then the file that follows
    it (:func:`_open_after`: the segment that starts after the old file's last ``seq``, when
    gatewrap rotated it several times meanwhile; else the path's); when the file shrinks
    (truncated), reading restarts at its start. Both are said on ``err``; line numbers count
    from where reading of each file began.

    ``start``: resume there (a :class:`Position` an earlier reader yielded). When the path
    is still that file, at its offset (from the start if the file is now shorter: truncated);
    when it was rotated, the rest of the old file first if a sibling of the path is still that
    file (:func:`_rotated_to`), then the files after it; when no file is, the file after
    ``start.seq``; what cannot be found is said.

    Without ``follow``: ends at the end of the path's file (and raises FileNotFoundError when
    there is none). With it: waits for the path to exist, ends only when the consumer stops;
    ``idle``: yields None each time it has read all there is, before it waits ``poll`` seconds.
    Raises as :func:`_open`.
    """
    while follow and not os.path.exists(path):
        if idle:
            yield None
        time.sleep(poll)
    f = _open(path)
    seq = start.seq if start is not None else None
    try:
        mine = os.fstat(f.fileno())
        offset = 0
        if start is not None and (start.dev, start.ino) == (mine.st_dev, mine.st_ino):
            if mine.st_size >= start.offset:
                offset = start.offset
            else:
                print(f"gatewrap: {path} was truncated (it is shorter than byte {start.offset}, where reading "
                      "stopped); reading it from its start", file=err, flush=True)
        elif start is not None:
            old = _rotated_to(path, start)
            f.close()
            if old is not None:
                if start.offset:
                    print(f"gatewrap: {path} was rotated; reading the rest of {old} first", file=err, flush=True)
                f = _open(old)
                offset = min(start.offset, os.fstat(f.fileno()).st_size)
            else:
                f = _open_after(path, start.seq, err)
                if start.seq is None:
                    print(f"gatewrap: {path} is no longer the file that was being read (device {start.dev}, inode "
                          f"{start.ino}) and no file beside it is: lines it held after byte {start.offset} were not "
                          "read; reading the current file from its start", file=err, flush=True)
            mine = os.fstat(f.fileno())
        f.seek(offset)
        n, partial, rotated = 0, b"", False
        while True:
            for line in f:
                if not line.endswith(b"\n"):
                    partial += line
                    continue
                n += 1
                line, partial = partial + line, b""
                offset += len(line)
                seq = line_seq(line)
                yield n, Position(mine.st_dev, mine.st_ino, offset, seq), line
            try:
                now = os.stat(path)
            except FileNotFoundError:
                now = None  # rotated away, the new file not there yet: keep reading the old one
            if now is not None and (now.st_dev, now.st_ino) != (mine.st_dev, mine.st_ino):
                if not rotated:
                    rotated = True  # one more pass over the old file, then switch
                    continue
                f.close()
                f = _open_after(path, seq, err)
                mine = os.fstat(f.fileno())
                print(f"gatewrap: {path} was rotated; reading on from "
                      f"{path if (now.st_dev, now.st_ino) == (mine.st_dev, mine.st_ino) else 'its next segment'}",
                      file=err, flush=True)
                n, partial, offset, rotated = 0, b"", 0, False
                continue
            if not follow:
                return
            if idle:
                yield None
            time.sleep(poll)
            if os.fstat(f.fileno()).st_size < f.tell():
                print(f"gatewrap: {path} was truncated; reading it from its start", file=err, flush=True)
                f.seek(0)
                n, partial, offset = 0, b"", 0
    finally:
        f.close()


def follow_lines(path: str, err: TextIO, poll: float = POLL) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of the log at ``path``: its rotated segments, then its file and
    every line appended to it (:func:`tail` from the oldest segment)."""
    segs = segments(path)
    start = None
    if segs:
        st = os.stat(segs[0][1])
        start = Position(st.st_dev, st.st_ino, 0)
    for item in tail(path, err, start=start, poll=poll):
        if item is not None:
            yield item[0], item[2]


#: The key before a run id, as the gate writes it and as Python's json spaces it.
_RUN_KEYS = (b'"run":', b'"run": ')
#: The bytes before a run id's opening quote that tell its key (the longer spelling's).
_KEY_AT = len(_RUN_KEYS[1])
#: The longest run id looked at (``gw-`` and a runc container id, at most 128 characters).
_ID_MAX = 256


def runs_starting(path: str, start: str, most: int = 0) -> list[str]:
    """The ids of the runs in the log at ``path`` (its rotated segments, then the live file:
    :func:`log_files`) that start with ``start``, sorted; with ``most``, the search stops
    once it found that many.

    No line is split nor parsed: each file is read in :data:`BUFFER` blocks searched for
    ``"<start>`` (as every JSON writer writes a string that starts so: :data:`_VERBATIM`)
    right after the key ``"run":`` (in a string the key's quotes would be escaped), a byte
    search at memory speed where few lines hold it (bench/audit_read.py). A ``start``
    outside :data:`_VERBATIM` finds nothing.

    Raises:
        FileNotFoundError: the log does not exist.
        GatewrapError: it cannot be read by this user (exit 125).
    """
    if not _VERBATIM.fullmatch(start):
        return []
    needle = b'"' + start.encode()
    _open(path).close()
    found: set[str] = set()
    for name in log_files(path):
        try:
            with open(name, "rb", buffering=0) as f:
                buf = b" " * _KEY_AT  # what comes before the file: no key
                while block := f.read(BUFFER):
                    buf += block
                    # a needle is searched for from here on: a hit's key is before it, in buf
                    cut = len(buf) - len(needle) + 1
                    at = buf.find(needle, _KEY_AT)
                    while at >= 0:
                        end = buf.find(b'"', at + 1, at + 1 + _ID_MAX)
                        if end < 0:
                            if len(buf) - at <= _ID_MAX:
                                cut = at  # the value goes on in the next block
                                break
                            at = buf.find(needle, at + 1)  # no run id
                            continue
                        value = buf[at + 1:end]
                        keyed = buf[at - _KEY_AT + 1:at] == _RUN_KEYS[0] or buf[at - _KEY_AT:at] == _RUN_KEYS[1]
                        if keyed and _VERBATIM.fullmatch(value.decode("latin-1")):
                            found.add(value.decode())
                            if most and len(found) >= most:
                                return sorted(found)
                        at = buf.find(needle, end)
                    buf = buf[max(cut, _KEY_AT) - _KEY_AT:]
        except FileNotFoundError:
            if name == path:
                raise  # a segment deleted meanwhile (--audit-keep) is skipped
    return sorted(found)


def parse(line: bytes) -> Any:
    """The JSON value of one line, as Python's json reads it; bytes that are not UTF-8
    become surrogate escapes.

    orjson parses (about four times as fast, bench/audit_read.py); what it refuses (bytes
    that are not UTF-8, a lone surrogate escape, an integer beyond 64 bits, NaN) goes to
    Python's json, which decides.

    Raises:
        ValueError: not JSON (``json.JSONDecodeError``).
    """
    try:
        return orjson.loads(line)
    except orjson.JSONDecodeError:
        return json.loads(line.decode("utf-8", "surrogateescape"))


def _all_lines(path: str) -> Iterator[tuple[int, bytes]]:
    """(line number, line) of every file of the log (:func:`log_files`); numbers count on
    across the files. Raises as :func:`_open` for ``path``."""
    _open(path).close()  # no log, or one this user cannot read: said before any segment is read
    files = log_files(path)
    n = 0
    for name in files:
        try:
            for _, line in lines(name):
                n += 1
                yield n, line
        except FileNotFoundError:
            if name == path:
                raise  # a segment deleted meanwhile (--audit-keep) is skipped


def entries(path: str, filters: Filters | None = None, follow: bool = False, offset: int = 0,
            err: TextIO | None = None) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """(line, record) for every record of ``path`` that passes ``filters`` (all without).

    Lines that are not JSON are reported on ``err`` with their line number and skipped
    (with filters, those not shaped ``{...}``: a line that is and that the prefilter rules
    out is not parsed). The log's rotated segments are read first (:func:`log_files`), unless
    ``offset``: start at this byte of ``path``'s file alone (not with ``follow``).

    Raises:
        FileNotFoundError: the log does not exist (and not following).
        GatewrapError: the log cannot be read by this user (exit 125).
    """
    err = err or sys.stderr
    source = follow_lines(path, err) if follow else lines(path, offset) if offset else _all_lines(path)
    quick = filters.quick if filters is not None else None
    match = filters.match if filters is not None else None
    for n, line in source:
        # A line the prefilter rules out is skipped unparsed when it is shaped like a record;
        # one that is not (torn, garbage) is parsed, so that it is reported.
        if quick is not None and not quick(line) and line.startswith(b"{") and line.endswith(b"}\n"):
            continue
        try:
            rec = parse(line)
        except ValueError as e:
            if line.strip():
                what = "an incomplete last line" if not line.endswith(b"\n") else "not a JSON record"
                print(f"gatewrap: {path}:{n}: {what} ({getattr(e, 'msg', e)}); skipped", file=err)
            continue
        if isinstance(rec, dict) and (match is None or match(rec)):
            yield line, rec


def records(path: str, follow: bool = False, err: TextIO | None = None,
            filters: Filters | None = None) -> Iterator[dict[str, Any]]:
    """The records of :func:`entries`, without their lines."""
    for _, rec in entries(path, filters, follow=follow, err=err):
        yield rec
