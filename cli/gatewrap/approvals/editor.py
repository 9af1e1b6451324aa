"""``approvals edit``: the request's body and editable headers in a file for ``$EDITOR``.

The file holds the editable headers (``Name: value``), an empty line, then the body as it is.
Headers the gate keeps fixed (credentials, Host, hop-by-hop, Content-Length: the store
refuses to change them) are shown as ``#`` comments at the top and come back unchanged.
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


def to_text(a: dict[str, Any]) -> str:
    """The file ``$EDITOR`` opens for approval ``a``.

    Raises:
        GatewrapError: (exit 1) the body is truncated in the store or not UTF-8 text; such a
            request can only be approved or rejected.
    """
    if a.get("body_truncated"):
        raise GatewrapError(f"the body of {a['id']} is {a['body_len']} bytes, more than the store keeps: it "
                            "cannot be edited, only approved or rejected", exit_code=1)
    try:
        body = bytes(a["body"]).decode("utf-8")
    except UnicodeDecodeError:
        raise GatewrapError(f"the body of {a['id']} is not UTF-8 text: it cannot be edited here, only approved "
                            "or rejected", exit_code=1) from None
    head = [f"# gatewrap approvals edit {a['id']} (version {a['version']})",
            f"# {a['method']} {a['url']}: the method and URL cannot be changed.",
            "# Edit the headers (Name: value) above the empty line and the body below it; save and quit.",
            "# Unchanged, or emptied: nothing is changed. Lines starting with # here at the top are ignored."]
    head += [f"# fixed: {n}: {v}" for n, v in a["headers"] if is_fixed(n)]
    head += [f"{n}: {v}" for n, v in a["headers"] if not is_fixed(n)]
    return "\n".join(head) + "\n\n" + body


def from_text(text: str, a: dict[str, Any]) -> tuple[list[tuple[str, str]], bytes] | None:
    """Parse an edited file back: ``(headers, body)`` (the fixed headers in their places, the
    edited ones in the editable ones' places, in order, any added after the last of them), or
    None if it was emptied.

    Raises:
        ValueError: a header line that is not ``Name: value`` (names the line).
    """
    if not text.strip():
        return None
    head, sep, body = text.partition("\n\n")
    if not sep:
        head, body = text, ""
    edited: list[tuple[str, str]] = []
    for n, line in enumerate(head.split("\n"), start=1):
        if not line or line.startswith("#"):
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name):
            raise ValueError(f"line {n}: {line[:80]!r} is not a header (Name: value)")
        if is_fixed(name):
            raise ValueError(f"line {n}: {name} cannot be edited (credentials, Host and hop-by-hop headers "
                             "stay as the agent sent them)")
        if any(c in value for c in "\r\0"):
            raise ValueError(f"line {n}: the value of {name} holds a control character")
        edited.append((name, value.strip()))
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
    raw = body.encode("utf-8")
    if raw.endswith(b"\n") and not original.endswith(b"\n"):
        raw = raw[:-1]  # the editor's own final newline (vi, nano add one)
    return headers, raw


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
