"""``gatewrap audit verify``: check an audit log's hash chain and its signed checkpoints.

The formats are the writer's (gate_core/src/audit/chain.rs and note.rs; README "Tamper
evidence"): every line carries ``seq`` (1-based position in the chain) and ``prev``
(SHA-256, lowercase hex, of the previous line's bytes with its newline; the first record's
is :data:`GENESIS`). A ``checkpoint`` record carries a C2SP signed note
(https://c2sp.org/signed-note) of a C2SP checkpoint (https://c2sp.org/tlog-checkpoint):
origin, size (the records before it), root (base64 of the chain head, its own ``prev``),
signed with Ed25519.

A rotated log is several files (README "Rotation"): ``<log>.<first seq, 12 digits>``
segments, then the live file. A segment's first record is a checkpoint with ``rotated_from``
whose signature vouches for where it starts (``seq``, ``prev``) and, in its signed text,
for the segment it continues, so each file's chain checks alone; :func:`check_joins` then
checks that each continues the one before it, and that a file starting mid-chain has it
(unless a partial log is asked for: ``--partial``).
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

#: What the genesis value hashes (chain.rs GENESIS_TEXT).
GENESIS_TEXT = b"gatewrap audit log v1\n"
GENESIS = hashlib.sha256(GENESIS_TEXT).hexdigest()
#: The signed-note signature type of Ed25519.
_ALG_ED25519 = 0x01


class KeyFormatError(ValueError):
    """A verifier key is not ``<name>+<8 hex key id>+<base64(0x01 || 32-byte key)>``."""


@dataclass(frozen=True)
class VerifierKey:
    """A signed-note Ed25519 verifier key."""

    name: str
    key_id: bytes
    key: Ed25519PublicKey

    @classmethod
    def parse(cls, text: str) -> VerifierKey:
        """Parse ``<name>+<key id>+<base64>`` (signed-note "verifier key"). Raises
        :class:`KeyFormatError` if malformed, not Ed25519, or the id does not match."""
        parts = text.strip().split("+", 2)
        if len(parts) != 3 or not parts[0] or any(c.isspace() for c in parts[0]):
            raise KeyFormatError(f"{text!r} is not a verifier key (<name>+<key id>+<base64 key>)")
        name, hex_id, b64 = parts
        try:
            raw = base64.b64decode(b64, validate=True)
            key_id = bytes.fromhex(hex_id)
        except ValueError as e:
            raise KeyFormatError(f"verifier key {text!r}: {e}") from e
        if len(raw) != 33 or raw[0] != _ALG_ED25519:
            raise KeyFormatError(f"verifier key {text!r} is not an Ed25519 key")
        if hashlib.sha256(name.encode() + b"\n" + raw).digest()[:4] != key_id:
            raise KeyFormatError(f"verifier key {text!r}: its key id does not match its name and key")
        return cls(name, key_id, Ed25519PublicKey.from_public_bytes(raw[1:]))


#: The first word of a checkpoint's extension line that names the segment a rotated file
#: continues (note.rs ROTATED_FROM_LINE): ``rotated_from audit.jsonl.000000005001``.
ROTATED_FROM_LINE = "rotated_from"


@dataclass(frozen=True)
class Checkpoint:
    """A C2SP checkpoint: origin, size, root, and its extension lines (tlog-checkpoint)."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def rotated_from(self) -> str | None:
        """The segment name a rotated file's opening checkpoint signed, if it has one."""
        for line in self.extensions:
            word, _, name = line.partition(" ")
            if word == ROTATED_FROM_LINE and name:
                return name
        return None


def open_note(note: str, keys: Sequence[VerifierKey]) -> Checkpoint:
    """The checkpoint a signed note holds, if one of ``keys`` signed it.

    Raises ValueError naming what is wrong (no signature of a known key verifies, or the
    body is not a checkpoint)."""
    text, sep, sigs = note.rpartition("\n\n")
    if not sep or not note.endswith("\n"):
        raise ValueError("the note has no signature block")
    body = (text + "\n").encode()
    names = []
    for line in sigs[:-1].split("\n"):
        name, _, b64 = line.removeprefix("\u2014 ").partition(" ")
        if not line.startswith("\u2014 ") or not b64:
            raise ValueError(f"malformed signature line {line!r}")
        names.append(name)
        raw = base64.b64decode(b64)
        for k in keys:
            if k.name == name and raw[:4] == k.key_id:
                try:
                    k.key.verify(raw[4:], body)
                except InvalidSignature:
                    raise ValueError(f"the signature of {name} does not verify: the checkpoint was altered") from None
                break
        else:
            continue
        break
    else:
        raise ValueError(f"no signature by a known key (signed by {', '.join(names) or 'nobody'}; pass --key)")
    lines = text.split("\n")
    try:
        origin, size, root = lines[0], int(lines[1]), base64.b64decode(lines[2], validate=True)
    except (IndexError, ValueError):
        raise ValueError("the signed text is not a checkpoint (origin, size, root hash)") from None
    if not origin or size < 0 or len(root) != 32 or any(not x for x in lines[3:]):
        raise ValueError("the signed text is not a checkpoint (origin, size, 32-byte root hash, extension lines)")
    return Checkpoint(origin, size, root, tuple(lines[3:]))


@dataclass
class FileReport:
    """What :func:`verify_file` found in one file. ``broken`` is ``(line, message)`` of the
    first broken line; everything before it was checked."""

    path: str
    lines: int = 0
    unchained: int = 0
    records: int = 0
    checkpoints: int = 0
    last_checkpoint_line: int | None = None
    last_checkpoint_size: int | None = None
    tail: int = 0
    broken: tuple[int, str] | None = None
    origins: set[str] = field(default_factory=set)
    #: seq -> line hash, for the sizes asked for (off-host checkpoints).
    heads: dict[int, bytes] = field(default_factory=dict)
    #: The first and last ``seq`` checked, the first record's ``prev`` and the last line's
    #: hash (hex); ``continues``: the segment a rotated file's opening checkpoint names.
    first_seq: int | None = None
    last_seq: int = 0
    first_prev: str | None = None
    last_hash: str | None = None
    continues: str | None = None
    #: Where the file starts: ``genesis`` (record 1, or after lines older than the chain),
    #: else mid-chain at a checkpoint: ``rotation`` (its signed text names the segment it
    #: continues), ``unsigned_rotation`` (``rotated_from`` only outside the signed text: a
    #: log of the previous format, or a cut front with the key added), ``cut`` (a checkpoint
    #: that opened no file: the lines before it were removed). See :data:`STARTS`.
    start: str = "genesis"

    def as_record(self) -> dict[str, Any]:
        return {"file": self.path, "ok": self.broken is None, "lines": self.lines, "records": self.records,
                "unchained": self.unchained, "checkpoints": self.checkpoints,
                "last_checkpoint_line": self.last_checkpoint_line, "unverified_tail": self.tail,
                "broken_line": self.broken[0] if self.broken else None,
                "error": self.broken[1] if self.broken else None, "origins": sorted(self.origins),
                "first_seq": self.first_seq, "last_seq": self.last_seq, "continues": self.continues,
                "start": self.start}

    def mid_chain(self) -> bool:
        """The file starts after record 1 of its chain (its predecessor is needed to verify
        that nothing before it was removed)."""
        return self.start != "genesis"


#: What each mid-chain start of a file is, for ``gatewrap audit verify``'s lines.
STARTS = {
    "rotation": "continues {name}: a rotation, signed",
    "unsigned_rotation": ("claims to continue {name}, outside its signed text: a log written before the link "
                          "was signed, or a front cut and rotated_from added"),
    "cut": "at a checkpoint that opened no file: the lines before it were removed",
}


def verify_file(path: str, keys: Sequence[VerifierKey], want_sizes: Iterable[int] = ()) -> FileReport:
    """Check ``path``'s chain from its first line and every checkpoint in it, stopping at
    the first broken line. Leading lines without ``seq``/``prev`` (written before the chain
    existed) are counted in ``unchained`` and the chain then starts from the last of them.
    A file whose first line is a checkpoint with ``seq`` > 1 starts the chain there, once
    its signature verifies; :attr:`FileReport.start` says what kind of start it is (a
    rotated file's opening checkpoint signs the segment it continues), and
    :func:`check_joins` whether the file before it is there.

    Raises OSError if the file cannot be read."""
    r = FileReport(path)
    want = set(want_sizes)
    prev, seq = GENESIS, 1
    with open(path, "rb") as f:
        for n, line in enumerate(f, 1):
            r.lines = n
            if not line.endswith(b"\n"):
                r.broken = (n, "the last line is cut (no newline): a write was interrupted, or the file was cut here")
                break
            try:
                rec = orjson.loads(line)
            except orjson.JSONDecodeError:
                r.broken = (n, "not a JSON record: the line was changed after it was written")
                break
            if not isinstance(rec, dict):
                r.broken = (n, "not a JSON object: the line was changed after it was written")
                break
            if r.records == 0 and "seq" not in rec and "prev" not in rec:
                r.unchained += 1
                prev = hashlib.sha256(line).hexdigest()
                continue
            rseq = rec.get("seq")
            if r.records == 0 and not r.unchained and rec.get("event") == "checkpoint" \
                    and isinstance(rseq, int) and rseq > 1 and isinstance(rec.get("prev"), str):
                seq, prev = rseq, rec["prev"]
                claimed = rec.get("rotated_from")
                r.continues = claimed if isinstance(claimed, str) else None
                r.start = "unsigned_rotation" if r.continues else "cut"
            if r.first_seq is None:
                r.first_seq, r.first_prev = rec.get("seq") if isinstance(rec.get("seq"), int) else seq, rec.get("prev")
            if rec.get("seq") != seq:
                r.broken = (n, f"seq is {rec.get('seq')!r}, expected {seq}: records were removed or inserted before this line")
                break
            if rec.get("prev") != prev:
                if n == 1:
                    r.broken = (n, "prev is not the genesis value: the log's beginning was removed, or this line was changed")
                else:
                    r.broken = (n - 1, f"this line was changed after it was written (its SHA-256 is not line {n}'s prev)")
                break
            digest = hashlib.sha256(line).digest()
            if seq in want:
                r.heads[seq] = digest
            if rec.get("event") == "checkpoint":
                problem = _check_checkpoint(rec, seq, bytes.fromhex(prev), keys)
                if isinstance(problem, str):
                    r.broken = (n, problem)
                    break
                if r.records == 0 and r.start != "genesis":
                    signed = problem.rotated_from()
                    if signed is not None and signed != r.continues:
                        r.broken = (n, f"rotated_from is {r.continues!r}, but its signed text says {signed!r}: "
                                       "the record was changed")
                        break
                    if signed is not None:
                        r.start = "rotation"
                r.origins.add(problem.origin)
                r.checkpoints += 1
                r.last_checkpoint_line, r.last_checkpoint_size = n, problem.size
                r.tail = 0
            else:
                r.tail += 1
            r.records += 1
            r.last_seq, r.last_hash = seq, digest.hex()
            prev, seq = digest.hex(), seq + 1
    return r


def _check_checkpoint(rec: dict[str, Any], seq: int, head: bytes, keys: Sequence[VerifierKey]) -> Checkpoint | str:
    """The checkpoint of record ``seq`` (whose ``prev`` is ``head``), or what is wrong with it."""
    note = rec.get("note")
    if not isinstance(note, str):
        return "a checkpoint record without a note"
    try:
        cp = open_note(note, keys)
    except ValueError as e:
        return f"checkpoint: {e}"
    if cp.size != seq - 1 or rec.get("size") != cp.size:
        return f"checkpoint of {cp.size} records at position {seq}: it was moved, or records were removed"
    if cp.root != head:
        return "checkpoint: its root hash is not the chain head before it"
    return cp


@dataclass
class OffHostResult:
    """One off-host checkpoint checked against the files: ``found`` (file, seq), or ``problem``."""

    size: int
    origin: str
    found: str | None = None
    problem: str | None = None

    def as_record(self) -> dict[str, Any]:
        return {"size": self.size, "origin": self.origin, "found_in": self.found, "error": self.problem}


def check_off_host(cp: Checkpoint, reports: Sequence[FileReport]) -> OffHostResult:
    """Whether one of the files' chains holds checkpoint ``cp`` (known from off the host):
    the record of seq ``cp.size`` hashes to ``cp.root``."""
    res = OffHostResult(cp.size, cp.origin)
    for r in reports:
        head = r.heads.get(cp.size)
        if head == cp.root:
            res.found = r.path
            return res
        if head is not None:
            res.problem = (f"{r.path}: record {cp.size} is not the one a checkpoint off the host signed: "
                           "the log was rewritten from there on")
            return res
    longest = max((r.last_seq for r in reports), default=0)
    res.problem = (f"truncated: a checkpoint off the host covers {cp.size} records, the log holds "
                   f"{longest} (or it is broken before)")
    return res


def log_base(path: str) -> str:
    """The live log a file belongs to: ``audit.jsonl.000000005001`` -> ``audit.jsonl``; a
    file that is no segment is its own."""
    from .audit_reader import SEGMENT_DIGITS

    head, dot, digits = path.rpartition(".")
    return head if dot and len(digits) >= SEGMENT_DIGITS and digits.isascii() and digits.isdigit() else path


def check_joins(reports: Sequence[FileReport], partial: bool = False) -> list[tuple[str, str]]:
    """(file, problem) for each file that starts mid-chain (:meth:`FileReport.mid_chain`)
    but does not continue a file given: the file it names (or, when it names none or the
    name is not here, a file of the same log ending just before it) must end with the record
    just before it (its ``seq``, and the hash its ``prev`` holds). A mid-chain file whose
    predecessor is not given is a problem unless ``partial``: from the files alone, a log
    whose oldest segments were deleted (``--audit-keep``) and one whose front was cut look
    alike (only a checkpoint kept off the host tells them apart); with ``partial`` the
    caller says where each file starts instead. When an older file of the same log is
    given but not the one before, a segment is missing from the middle: always a problem."""
    import os

    problems = []
    by_name = {(os.path.dirname(r.path), os.path.basename(r.path)): r for r in reports}
    for r in reports:
        if not r.mid_chain() or r.first_seq is None:
            continue
        pred = by_name.get((os.path.dirname(r.path), r.continues)) if r.continues else None
        if pred is None:
            pred = next((o for o in reports if o is not r and log_base(o.path) == log_base(r.path)
                         and o.last_seq == r.first_seq - 1 and o.broken is None), None)
        if pred is None:
            older = [o for o in reports if o is not r and log_base(o.path) == log_base(r.path)
                     and o.first_seq is not None and o.first_seq < r.first_seq]
            if older:
                problems.append((r.path, (f"continues {r.continues}, which is missing" if r.continues else "follows a file which is missing")
                                         + f": records before "
                                         f"{r.first_seq} back to {max(o.last_seq for o in older) + 1} are in no file"))
            elif not partial:
                problems.append((r.path, f"starts mid-chain at record {r.first_seq} without the file before it "
                                         f"({r.continues or 'unnamed'}): older segments deleted (--audit-keep), or "
                                         "the log's front cut; pass --partial to verify what is here"))
        elif pred.broken is not None:
            continue  # named at its own line already
        elif pred.last_seq != r.first_seq - 1:
            problems.append((r.path, f"starts at record {r.first_seq} but {pred.path} ends at {pred.last_seq}: "
                                     "records were removed or added at the end of that file"))
        elif pred.last_hash != r.first_prev:
            problems.append((r.path, f"does not continue {pred.path}: its first record's prev is not the hash of "
                                     "that file's last line (that line was changed)"))
    return problems
