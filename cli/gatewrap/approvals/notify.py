"""Telling a human that a run asks: a line on gatewrap's stderr and a signed webhook.

The webhook's body is Slack-compatible (an incoming webhook takes it as it is): ``text``
always (the fallback of notifications), and Block Kit ``blocks``
(https://api.slack.com/reference/block-kit/blocks): the method and URL, the rule, the run, the
expiry, a body excerpt, a button linking to the review page and the command to answer.
Every value from the agent is escaped for Slack's mrkdwn (``&``, ``<``, ``>``: no mentions,
no links of the agent's making) and cut to Block Kit's limits.

The request is signed as Standard Webhooks specify (https://www.standardwebhooks.com/,
spec ``spec/standard-webhooks.md``): headers ``webhook-id`` (the same on a retry: the
approval id and version), ``webhook-timestamp`` (Unix seconds) and ``webhook-signature``
``v1,<base64 HMAC-SHA256(key, "<id>.<timestamp>.<body>")>``, where the key is the base64
after ``whsec_`` of the secret.

A notification never decides: a failed one is recorded (``approval_notified`` with
``ok: false``) and the approval waits as before.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from typing import Any, TextIO

from ..text import printable
from .render import body_text, when

DEFAULT_SECRET_FILE = "/etc/gatewrap/webhook-secret"
DEFAULT_REVIEW_URL = "http://127.0.0.1:8377"
#: Seconds one webhook attempt may take; attempts at most (waits 1 s, 2 s between).
WEBHOOK_TIMEOUT = 5.0
WEBHOOK_ATTEMPTS = 3
#: Block Kit limits: section text 3000 characters, header 150, button url 3000.
EXCERPT = 600


#: Characters of the digest the live line shows (gate_core hold.rs ``NOTICE_DIGEST_CHARS``).
NOTICE_DIGEST_CHARS = 12


def stderr_line(a: dict[str, Any], hint: tuple[str, str] = ("sudo gatewrap approvals", "")) -> str:
    """The live line (APPROVALS.md): id, the first :data:`NOTICE_DIGEST_CHARS` of the digest
    (``approve`` shows it whole before it asks: a line the agent forged on the stderr it
    shares cannot name another request's), request, rule, deadline, the commands to answer
    (``hint``: :func:`gatewrap.approvals.state.answer_hint`). The same text as gate_core
    hold.rs ``notice_line``."""
    p, s = hint
    return printable(
        f"gatewrap: approval {a['id']} (digest {a['digest'][:NOTICE_DIGEST_CHARS]}): {a['method']} {a['url']} "
        f"(rule {a['rule']}) waits until "
        f"{when(a['deadline'])}; answer with: {p} approve {a['id']}{s} | "
        f"reject {a['id']} --reason TEXT{s} | show {a['id']}{s}")


def review_link(review_url: str, a: dict[str, Any]) -> str:
    """The approval's review page: ``review_url`` + ``/a/<token>``."""
    return review_url.rstrip("/") + a.get("review_path", f"/a/{a['token']}")


def _mrkdwn(s: str, limit: int) -> str:
    """``s`` escaped for Slack's mrkdwn (``&amp;``, ``&lt;``, ``&gt;``: the three it
    reserves), controls escaped, then cut to ``limit`` characters (never inside an entity):
    cut after escaping, so a value of ``&``s cannot take a block past Block Kit's limits."""
    s = printable(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    if len(s) > limit:
        s = s[: limit - 1]
        amp = s.rfind("&", len(s) - 4)
        if amp >= 0 and ";" not in s[amp:]:
            s = s[:amp]
        s += "…"
    return s


#: Query parameters whose value is a credential (API keys, OAuth tokens and codes, presigned
#: URL signatures): a name containing one of these words, or one of the short names.
_QUERY_SECRET_WORDS = ("key", "token", "secret", "passw", "auth", "session", "signature", "credential", "jwt")
_QUERY_SECRET_NAMES = ("sig", "code", "pwd", "pass")


def shown_url(url: str) -> str:
    """``url`` as the webhook shows it (it leaves the host): the values of query parameters
    that carry credentials replaced with ``[redacted]``, a userinfo password dropped; the
    rest as it is (the human must see what is sent)."""
    u = urllib.parse.urlsplit(url)
    netloc = u.netloc
    if u.password is not None:
        netloc = netloc.replace(":" + u.password + "@", ":[redacted]@", 1)
    parts = []
    for part in u.query.split("&") if u.query else []:
        name, eq, _ = part.partition("=")
        low = urllib.parse.unquote_plus(name).lower()
        secret = low in _QUERY_SECRET_NAMES or any(w in low for w in _QUERY_SECRET_WORDS)
        parts.append(f"{name}=[redacted]" if eq and secret else part)
    return urllib.parse.urlunsplit((u.scheme, netloc, u.path, "&".join(parts), u.fragment))


def _excerpt(a: dict[str, Any]) -> str:
    """The first :data:`EXCERPT` characters of the body, escaped, in a form that cannot close
    the code block it is shown in."""
    body = bytes(a["body"])
    if not body:
        return "(no body)"
    text = body_text(body[: EXCERPT * 4])
    cut = len(text) > EXCERPT or a.get("body_truncated") or len(body) > EXCERPT * 4
    text = text[:EXCERPT].replace("```", "'''")
    return _mrkdwn(text, EXCERPT + 1) + (f"\n… ({a['body_len']} bytes in all)" if cut else "")


def check_webhook_url(url: str) -> str:
    """``url`` if it is an absolute http(s) URL with a host.

    Raises:
        ValueError: another scheme (``file:``, ...) or no host.
    """
    u = urllib.parse.urlsplit(url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise ValueError(f"webhook {url!r}: give an http:// or https:// URL")
    return url


def slack_body(a: dict[str, Any], review_url: str) -> dict[str, Any]:
    """The webhook's JSON body for approval ``a`` (Slack incoming-webhook format)."""
    link = review_link(review_url, a)
    url = shown_url(a["url"])
    request = _mrkdwn(f"{a['method']} {url}", 2000)
    return {
        "text": _mrkdwn(f"gatewrap: run {a['run_id']} asks to send {a['method']} {url} (rule {a['rule']}); "
                        f"approval {a['id']} waits until {when(a['deadline'])}", 2900),
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": "gatewrap: an agent asks for approval"}},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*{request}*"},
             "fields": [
                 {"type": "mrkdwn", "text": f"*Rule*\n{_mrkdwn(str(a['rule']), 500)}"},
                 {"type": "mrkdwn", "text": f"*Run*\n{_mrkdwn(a['run_id'], 100)}"},
                 {"type": "mrkdwn", "text": f"*Expires*\n{when(a['deadline'])} (then denied)"},
                 {"type": "mrkdwn", "text": f"*Approval*\n{a['id']} (version {a['version']})"},
             ]},
            {"type": "section", "text": {"type": "mrkdwn", "text": f"*Body*\n```{_excerpt(a)}```"}},
            {"type": "actions", "elements": [
                {"type": "button", "action_id": "review", "style": "primary",
                 "text": {"type": "plain_text", "text": "Review"}, "url": link},
            ]},
            {"type": "context", "elements": [
                {"type": "mrkdwn", "text": f"Or on the host: `sudo gatewrap approvals show {a['id']}`"},
            ]},
        ],
    }


def sign(secret: str, msg_id: str, timestamp: int, body: bytes) -> str:
    """The ``webhook-signature`` value: ``v1,`` + base64 HMAC-SHA256 over
    ``msg_id.timestamp.body`` keyed with the secret's bytes (base64 after ``whsec_``).

    Raises:
        ValueError: the secret is not ``whsec_<base64>``.
    """
    if not secret.startswith("whsec_"):
        raise ValueError("a webhook secret is whsec_ followed by base64")
    key = base64.b64decode(secret.removeprefix("whsec_"), validate=True)
    mac = hmac.new(key, f"{msg_id}.{timestamp}.".encode("ascii") + body, hashlib.sha256).digest()
    return "v1," + base64.b64encode(mac).decode("ascii")


def load_secret(path: str = DEFAULT_SECRET_FILE) -> str:
    """The webhook secret in ``path``; made (32 random bytes, ``whsec_<base64>``, mode 0600,
    owner root) when the file does not exist.

    Raises:
        GatewrapError: it cannot be read or made, or holds something else than a secret.
    """
    from ..errors import GatewrapError

    try:
        with open(path, encoding="ascii") as f:
            secret = f.read().strip()
    except FileNotFoundError:
        secret = "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode("ascii")
        try:
            os.makedirs(os.path.dirname(path) or ".", mode=0o755, exist_ok=True)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
            with os.fdopen(fd, "w") as f:
                f.write(secret + "\n")
        except FileExistsError:
            return load_secret(path)
        except OSError as e:
            raise GatewrapError(f"cannot make the webhook secret {path}: {e.strerror}") from e
    except (OSError, UnicodeDecodeError) as e:
        raise GatewrapError(f"cannot read the webhook secret {path}: {e}") from e
    try:
        sign(secret, "check", 0, b"")
    except ValueError as e:
        raise GatewrapError(f"{path}: {e} (delete it to have a new one made)") from None
    return secret


@dataclass
class Notifier:
    """What ``on_asked`` does for one run: the stderr line (when the gate does not print it
    itself) and the webhook (when configured), each followed by an ``approval_notified``
    audit record (``channel``, ``ok``)."""

    audit: Any
    run_id: str
    webhook: str | None = None
    secret: str | None = None
    review_url: str = DEFAULT_REVIEW_URL
    stderr: bool = True
    err: TextIO = sys.stderr

    def __call__(self, a: dict[str, Any]) -> None:
        """Notify about approval ``a``. Never raises: a notification never decides."""
        if self.stderr:
            try:
                print(stderr_line(a), file=self.err, flush=True)
                self._record(a, "stderr", True)
            except Exception:  # noqa: BLE001 — a closed stderr is still not a decision
                pass
        if self.webhook:
            ok, detail = self.post(a)
            self._record(a, "webhook", ok, detail)
            if not ok:
                print(printable(f"gatewrap: the webhook for {a['id']} failed: {detail} (the approval still "
                                "waits; see gatewrap approvals list)"), file=self.err, flush=True)

    def post(self, a: dict[str, Any]) -> tuple[bool, str]:
        """POST the signed body to the webhook; ``(ok, what happened)``. Tries
        :data:`WEBHOOK_ATTEMPTS` times on a connection failure or a 5xx/429 answer."""
        body = json.dumps(slack_body(a, self.review_url), ensure_ascii=False).encode("utf-8")
        msg_id = f"{a['id']}.v{a['version']}"
        detail = ""
        for attempt in range(WEBHOOK_ATTEMPTS):
            if attempt:
                time.sleep(2 ** (attempt - 1))
            ts = int(time.time())
            req = urllib.request.Request(self.webhook or "", data=body, method="POST", headers={
                "Content-Type": "application/json", "User-Agent": "gatewrap",
                "webhook-id": msg_id, "webhook-timestamp": str(ts),
                "webhook-signature": sign(self.secret or "", msg_id, ts, body)})
            try:
                with urllib.request.urlopen(req, timeout=WEBHOOK_TIMEOUT) as resp:
                    return True, f"HTTP {resp.status}"
            except urllib.error.HTTPError as e:
                detail = f"HTTP {e.code}"
                if e.code != 429 and e.code < 500:
                    return False, detail
            except (urllib.error.URLError, OSError, ValueError) as e:
                detail = str(getattr(e, "reason", e))
        return False, detail

    def _record(self, a: dict[str, Any], channel: str, ok: bool, detail: str | None = None) -> None:
        rec = {"run": self.run_id, "event": "approval_notified", "approval": a["id"], "rule": a["rule"],
               "method": a["method"], "url": a["url"], "digest": a["digest"], "version": a["version"],
               "deadline": when(a["deadline"]), "channel": channel, "ok": ok}
        if detail and not ok:
            rec["error"] = detail
        try:
            self.audit.write(rec)
        except OSError as e:
            print(f"gatewrap: the approval_notified record of {a['id']} could not be written: {e.strerror}",
                  file=self.err, flush=True)
