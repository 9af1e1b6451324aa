"""``approvals edit`` and the review page's edit form: the request's body and editable headers
as text for ``$EDITOR`` or a ``<textarea>``.

The text holds the editable headers (``Name: value``), an empty line, then the body. Headers
the gate keeps fixed (credentials, Host, hop-by-hop, Content-Length: the store refuses to
change them) are shown as ``#`` comments at the top and come back unchanged.

What neither an editor nor a browser carries as it is (a ``<textarea>`` turns CR LF and a lone
CR into LF and NUL into U+FFFD, HTML "textarea" and "form submission"; an editor may do the
same, and ESC or a bidi override would act on the terminal or the page) is shown escaped:
``\\r`` for CR, ``\\xNN`` for another ASCII control character and for a byte that is not
UTF-8 (NN 80-ff), ``\\uNNNN``/``\\UNNNNNNNN`` for any other character that is not printable (C1
controls, bidi and other format characters, line and paragraph separators). Tabs and line
feeds stay as they are. A backslash is doubled only where it would otherwise start one of these
escapes, so ``\\n`` in a JSON string reads as it is. The mapping is one-to-one: every byte comes
back as it was, and a part that comes back as it was shown keeps the agent's bytes unparsed.
A malformed escape in an edit is refused with the reason.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import tempfile
from typing import Any

from ..errors import GatewrapError

#: Headers the store keeps as the agent sent them: the same lists as gate_core's
#: approvals/redact.rs (``is_editable``), which checks every edit; here they only decide what
#: the file shows as fixed. Credential names, and names holding a credential word:
CREDENTIALS = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie", "x-api-key", "api-key",
                         "x-auth-token", "x-amz-security-token", "x-goog-api-key", "ocp-apim-subscription-key"})
CREDENTIAL_WORDS = ("auth", "token", "secret", "password", "apikey", "api-key", "session", "cookie")
#: The hop, the framing and the destination (RFC 9110 7.6.1, RFC 9112 6), the retry key.
FIXED = frozenset({"host", "content-length", "transfer-encoding", "connection", "proxy-connection", "keep-alive",
                   "te", "trailer", "upgrade", "proxy-authenticate", "expect", "idempotency-key"})
#: RFC 9110 5.1: a field name is a token.
_TOKEN = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")


def is_fixed(name: str) -> bool:
    """True if the header ``name`` cannot be edited (a credential, Host, hop-by-hop...)."""
    n = name.lower()
    return n in FIXED or n in CREDENTIALS or any(w in n for w in CREDENTIAL_WORDS)


#: Letters that follow a backslash in an escape (and the backslash itself).
_ESCAPES = "xuUr\\"


def _char(c: str) -> str:
    """One character of the text as shown (a backslash is decided by :func:`shown`)."""
    if c in "\n\t" or (c.isprintable() and not "\udc80" <= c <= "\udcff"):
        return c
    o = ord(c)
    if "\udc80" <= c <= "\udcff":  # a byte that was not UTF-8 (surrogateescape, PEP 383)
        return f"\\x{o - 0xDC00:02x}"
    if c == "\r":
        return "\\r"
    if o < 0x80:
        return f"\\x{o:02x}"
    return f"\\u{o:04x}" if o <= 0xFFFF else f"\\U{o:08x}"


def shown(value: bytes | str) -> str:
    """``value`` (bytes: UTF-8, other bytes kept as such) as the edit text shows it (this
    module's docstring): printable, tabs and line feeds as they are, the rest escaped."""
    text = value.decode("utf-8", errors="surrogateescape") if isinstance(value, bytes) else value
    pieces = [_char(c) if c != "\\" else "\\" for c in text]
    for i, c in enumerate(text):
        if c == "\\" and (i + 1 == len(text) or pieces[i + 1][0] in _ESCAPES):
            pieces[i] = "\\\\"
    return "".join(pieces)


def parsed(text: str, what: str) -> str:
    """The inverse of :func:`shown`: ``text`` with its escapes replaced (a byte 80-ff as a
    surrogate, for ``encode("utf-8", "surrogateescape")``). ``what`` names the part in errors.

    Raises:
        ValueError: a malformed escape, one that is not a character (a surrogate, past
            U+10FFFF), or a backslash at the end (each named, with what to write instead).
    """
    out: list[str] = []
    i = 0
    while i < len(text):
        c = text[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 == len(text):
            raise ValueError(f"{what}: a lone backslash at the end; write \\\\ for a backslash")
        kind = text[i + 1]
        if kind == "\\":
            out.append("\\")
            i += 2
        elif kind == "r":
            out.append("\r")
            i += 2
        elif kind in "xuU":
            n = {"x": 2, "u": 4, "U": 8}[kind]
            digits = text[i + 2:i + 2 + n]
            if len(digits) != n or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"{what}: {text[i:i + 2 + n]} is not an escape (\\xNN, \\uNNNN, \\UNNNNNNNN, \\r; "
                                 "write \\\\ for a backslash)")
            o = int(digits, 16)
            if kind == "x":
                out.append(chr(o) if o < 0x80 else chr(0xDC00 + o))
            elif 0xD800 <= o <= 0xDFFF or o > 0x10FFFF:
                raise ValueError(f"{what}: {text[i:i + 2 + n]} is not a character (a surrogate or past U+10FFFF)")
            else:
                out.append(chr(o))
            i += 2 + n
        else:
            out.append("\\")
            i += 1
    return "".join(out)


def to_text(a: dict[str, Any]) -> str:
    """The text ``$EDITOR`` or the edit form opens for approval ``a``.

    Raises:
        GatewrapError: (exit 1) the body is truncated in the store: such a request can only
            be approved or rejected.
    """
    if a.get("body_truncated"):
        raise GatewrapError(f"the body of {a['id']} is {a['body_len']} bytes, more than the store keeps: it "
                            "cannot be edited, only approved or rejected", exit_code=1)
    head = [f"# gatewrap approvals edit {a['id']} (version {a['version']})",
            shown(f"# {a['method']} {a['url']}: the method and URL cannot be changed."),
            "# Edit the headers (Name: value) above the empty line and the body below it; save and quit.",
            "# Unchanged, or emptied: nothing is changed. Lines starting with # here at the top are ignored.",
            "# Characters that are not printable are shown as \\r, \\xNN, \\uNNNN (a byte that is not UTF-8: "
            "\\xNN, 80-ff);",
            "# a backslash that would start such an escape is shown as \\\\."]
    head += [f"# fixed: {shown(n)}: {shown(v)}" for n, v in a["headers"] if is_fixed(n)]
    head += [f"{shown(n)}: {shown(v)}" for n, v in a["headers"] if not is_fixed(n)]
    return "\n".join(head) + "\n\n" + shown(bytes(a["body"]))


def from_text(text: str, a: dict[str, Any]) -> tuple[list[tuple[str, str]], bytes] | None:
    """Parse an edited text back: ``(headers, body)`` (the fixed headers in their places, the
    edited ones in the editable ones' places, in order, any added after the last of them), or
    None if it was emptied. Line breaks may come as CR LF (a browser's form). A header line
    or the body that comes back as it was shown keeps the original value or bytes as they
    were (nothing re-parsed); an editor's added final newline is not an edit.

    Raises:
        ValueError: a header line that is not ``Name: value``, a header that cannot be
            edited, a control character or a byte that is not UTF-8 in a header value, a
            malformed escape (each names the line or the part).
    """
    if not text.strip():
        return None
    text = text.replace("\r\n", "\n").replace("\r", "\n")  # raw CRs were escaped: these are line breaks
    head, sep, body = text.partition("\n\n")
    if not sep:
        head, body = text, ""
    was = {f"{shown(n)}: {shown(v)}": (str(n), str(v)) for n, v in a["headers"] if not is_fixed(n)}
    edited: list[tuple[str, str]] = []
    for n, line in enumerate(head.split("\n"), start=1):
        if not line or line.startswith("#"):
            continue
        if line in was:  # as shown: the original, byte for byte
            edited.append(was[line])
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise ValueError(f"line {n}: {line[:80]!r} is not a header (Name: value)")
        if is_fixed(name):
            raise ValueError(f"line {n}: {name} cannot be edited (credentials, Host and hop-by-hop headers "
                             "stay as the agent sent them)")
        value = parsed(value.strip(), f"line {n}")
        if any(ch in value for ch in "\r\n\0"):
            raise ValueError(f"line {n}: the value of {name} holds a control character (CR, LF or NUL)")
        if any("\udc80" <= ch <= "\udcff" for ch in value):
            raise ValueError(f"line {n}: the value of {name} holds a byte that is not UTF-8 (\\x80-\\xff); "
                             "write a character as \\uNNNN")
        edited.append((name, value))
    # the fixed headers keep their places; the edited ones fill the editable ones' places in
    # order (an edit of values only changes no order), and any more follow the last such place
    headers: list[tuple[str, str]] = []
    slots = sum(1 for n, _ in a["headers"] if not is_fixed(n))
    for n, v in a["headers"]:
        if is_fixed(n):
            headers.append((str(n), str(v)))
            continue
        slots -= 1
        if edited:
            headers.append(edited.pop(0))
        if slots == 0:
            headers += edited
            edited = []
    headers += edited
    original = bytes(a["body"])
    if body.endswith("\n") and not original.endswith(b"\n"):
        body = body[:-1]  # the editor's own final newline (vi, nano add one)
    if body == shown(original):
        return headers, original
    return headers, parsed(body, "the body").encode("utf-8", errors="surrogateescape")


def run_editor(text: str) -> str:
    """Open ``text`` in ``$VISUAL``/``$EDITOR`` (default ``vi``) and return what was saved.

    Raises:
        GatewrapError: the editor could not be started or exited non-zero (nothing changed).
    """
    editor = os.environ.get("VISUAL") or os.environ.get("EDITOR") or "vi"
    fd, path = tempfile.mkstemp(prefix="gatewrap-approval-", suffix=".http")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        try:
            code = subprocess.call([*shlex.split(editor), path])
        except OSError as e:
            raise GatewrapError(f"cannot start the editor {editor!r}: {e.strerror}; set $EDITOR") from e
        if code != 0:
            raise GatewrapError(f"the editor {editor!r} exited {code}: nothing was changed", exit_code=1)
        with open(path, encoding="utf-8") as f:
            return f.read()
    finally:
        os.unlink(path)
