"""``gatewrap approvals serve``: the review pages, served on the host (127.0.0.1 by default).

Every request whose ``Host`` is not this server's (its listen address as ``host:port``, the IP
literal in any spelling, IPv6 in brackets; or a name given with ``--name`` / ``[review] names``,
with any port) is answered 421 Misdirected Request (RFC 9110 §15.5.20) before anything else: a
page of another site whose name an attacker rebound to 127.0.0.1 (DNS rebinding) sends its own
name, so the same-origin rule, which only compares names, does not protect the pages then.

Routes (everything else is 404):

- ``GET /l/<list key>``: the list of approvals. The key is random per server start and printed
  by ``serve``: every local user can reach a loopback port, so the list is not open to them.
- ``GET /a/<token>``: one approval (its token is its own secret, 32 random bytes, compared in
  constant time by the store). Shows who asks (the run's user and command, from its
  ``run_start`` audit record) for what (method and full URL), the time left, the exact
  request (a JSON body re-indented, the raw request in a ``details``), the diff after an
  edit, the run's last audit records before it asked, and one form (one name field) with
  Approve / Grant / Edit / Reject buttons (no Grant if the rule says ``grants = false``).
- ``POST /a/<token>/approve|grant|reject|edit``: a decision. Each form carries a CSRF token
  (an HMAC of the approval's token under this server's random key, compared with
  ``hmac.compare_digest``), the version and digest the page showed, and the decider's name.
  A request with a missing or wrong CSRF token, a foreign ``Origin`` or ``Sec-Fetch-Site``,
  or another content type is refused (403) before anything is read from the store. A stale
  decision answers 409 with the why; a malformed one (a grant wider than the request's host,
  checked by :func:`decide.parse_grant` as for ``approve --grant``) 400; a grant the rule
  forbids 403.

Every value shown is HTML-escaped (approval bodies are the agent's, i.e. hostile). Pages are
sent with a Content-Security-Policy that allows no script at all, ``Referrer-Policy:
no-referrer`` (the URL holds the token or the list key: not even this origin's own pages, nor
a logging proxy in front of ``--allow-remote``, get it in a ``Referer``) and ``Cache-Control:
no-store``. Under ``no-referrer`` a browser sends ``Origin: null`` on a form (Fetch standard,
"append a request Origin header"), so a form with ``Origin: null`` passes only with
``Sec-Fetch-Site: same-origin`` (W3C Fetch Metadata), which browsers set whatever the
referrer policy; the CSRF token is checked either way.
"""

from __future__ import annotations

import hashlib
import hmac
import html
import ipaddress
import re
import secrets
import sys
import time
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from .. import audit_format
from ..run_types import DEFAULT_AUDIT_LOG
from ..text import command_line, printable
from . import decide as dec
from . import editor, history, render

#: Most bytes of a form (the edit form holds the body: the store keeps up to 64 KiB of it).
MAX_FORM = 1 << 20
#: Longest decider name.
MAX_NAME = 64

STYLE = """
body{font:15px/1.4 system-ui,sans-serif;margin:2em auto;max-width:60em;padding:0 1em;color:#222}
pre{background:#f4f4f4;padding:.8em;overflow-x:auto;white-space:pre-wrap;overflow-wrap:anywhere}
table{border-collapse:collapse}td,th{padding:.2em .8em;text-align:left;vertical-align:top}td{overflow-wrap:anywhere}
.st{font-weight:bold}.pending{color:#a60}.approved,.sent{color:#070}.rejected,.expired,.cancelled{color:#a00}
.msg{padding:.6em;border:2px solid #070;background:#efe}.stale{border-color:#a00;background:#fee}
.asks{margin:0;color:#555}h1{font-size:1.5em;margin:.2em 0;overflow-wrap:anywhere}
.left{font-size:1.1em}.left b{color:#a60}
form{margin:1em 0}fieldset{margin:.8em 0;border:1px solid #ccc}textarea{width:100%;font-family:monospace}
.who{padding:.6em;background:#f4f4f4}summary{cursor:pointer;color:#036}
.del{color:#a00}.add{color:#070}
"""


def parse_listen(text: str) -> tuple[str, int]:
    """``HOST:PORT`` or ``[IPv6]:PORT`` -> (host, port). Raises ValueError naming the value."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text!r}: give HOST:PORT, e.g. 127.0.0.1:8377 or [::1]:8377")
    return host.strip("[]"), int(port)


def is_loopback(host: str) -> bool:
    """True for 127.0.0.0/8, ::1 and ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


#: A host name as ``Host`` may carry it (RFC 3986 reg-name, restricted to LDH labels and dots).
_NAME = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9.-]*[A-Za-z0-9])?\.?")


class ReviewServer(ThreadingHTTPServer):
    """The review server over ``store`` (an ``ApprovalStore``); ``list_key`` opens the list.
    ``names``: host names it may be reached by besides its listen address (a listen host
    given as a name counts as one). ``audit_log``: where the pages read who started a run,
    with what command, and what it did before it asked."""

    daemon_threads = True

    def __init__(self, store: Any, listen: tuple[str, int], names: tuple[str, ...] | list[str] = (),
                 audit_log: str = DEFAULT_AUDIT_LOG) -> None:
        import socket

        if ":" in listen[0]:
            self.address_family = socket.AF_INET6
        super().__init__(listen, Handler)
        self.store = store
        self.audit_log = audit_log
        self.list_key = secrets.token_urlsafe(24)
        self._key = secrets.token_bytes(32)
        self.names = {n.lower().rstrip(".") for n in names}
        if not _ip(listen[0]):
            self.names.add(listen[0].lower().rstrip("."))

    def is_own_host(self, value: str) -> bool:
        """Whether a ``Host`` value names this server: its listen address and port (an IP
        literal compared as an address: ``[0:0::1]:P`` is ``[::1]:P``; no port means 80, RFC
        9110 §7.2), or one of :attr:`names` (case-insensitive, a final dot ignored, any
        port: a TLS proxy in front sends its own)."""
        v = value.strip()
        if v.startswith("["):
            m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::([0-9]{1,5}))?", v)
            if not m:
                return False
            host, port = m.group(1), m.group(2)
            if _ip(host) is None or _ip(host).version != 6:
                return False
        else:
            host, colon, port = v.partition(":")
            if colon and not re.fullmatch(r"[0-9]{1,5}", port):
                return False
        ip = _ip(host)
        if ip is None:
            return bool(_NAME.fullmatch(host)) and host.lower().rstrip(".") in self.names
        listen_ip = _ip(str(self.server_address[0]))
        same = listen_ip is not None and (listen_ip.is_unspecified or ip == listen_ip)
        return same and int(port or 80) == self.server_address[1]

    def csrf(self, token: str) -> str:
        """The CSRF token of the forms of approval ``token``'s page."""
        return hmac.new(self._key, b"csrf\0" + token.encode(), hashlib.sha256).hexdigest()

    @property
    def base(self) -> str:
        """``http://host:port`` of this server."""
        host, port = self.server_address[:2]
        return f"http://[{host}]:{port}" if ":" in str(host) else f"http://{host}:{port}"


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """``text`` as an IP address (ipaddress's strict forms: ``127.1`` is not one), or None."""
    try:
        return ipaddress.ip_address(text)
    except ValueError:
        return None


def e(v: Any) -> str:
    """Escape ``v`` for HTML text and attribute values (quotes included), controls escaped."""
    return html.escape(printable(str(v)), quote=True)


def _pre(lines: list[str], id_: str) -> str:
    """``lines`` (escaped already for a terminal) in a ``pre`` with id ``id_``, HTML-escaped."""
    return f"<pre id=\"{id_}\">" + "\n".join(html.escape(ln, quote=True) for ln in lines) + "</pre>"


class Handler(BaseHTTPRequestHandler):
    """One request of the review server."""

    server: ReviewServer
    server_version = "gatewrap-review"
    sys_version = ""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 — the stdlib's name
        """Access log on stderr, tokens cut out of the path."""
        path = self.path.split("?")[0]
        if path.startswith(("/a/", "/l/")):
            path = path[:3] + "…"
        print(printable(f"gatewrap: review {self.command} {path} {args[1] if len(args) > 1 else ''}"),
              file=sys.stderr, flush=True)

    def parse_request(self) -> bool:
        """http.server's parse, then the ``Host`` check (module docstring): one ``Host``
        naming this server, else 421 and nothing else is done."""
        if not super().parse_request():
            return False
        hosts = self.headers.get_all("Host") or []
        if len(hosts) != 1 or not self.server.is_own_host(hosts[0]):
            self.close_connection = True
            self._send(HTTPStatus.MISDIRECTED_REQUEST, "misdirected request",
                       "<p>421 Misdirected Request: this is not this server's name. Open the address that "
                       "<code>gatewrap approvals serve</code> printed (or start it with <code>--name</code>).</p>")
            return False
        return True

    # --- routing

    def do_GET(self) -> None:  # noqa: N802 — http.server's name
        path = urllib.parse.urlsplit(self.path).path
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        parts = path.strip("/").split("/")
        if len(parts) == 2 and parts[0] == "l" and hmac.compare_digest(parts[1], self.server.list_key):
            return self._list()
        if len(parts) == 2 and parts[0] == "a":
            a = self._approval(parts[1])
            if a is not None:
                done = (query.get("done") or [""])[0]
                return self._page(a, HTTPStatus.OK, done_message(done))
            return None
        if path == "/":
            return self._send(HTTPStatus.OK, "gatewrap review", "<p>Open the address that <code>gatewrap approvals "
                              "serve</code> printed, or an approval's own link.</p>")
        return self._not_found()

    def do_POST(self) -> None:  # noqa: N802
        parts = urllib.parse.urlsplit(self.path).path.strip("/").split("/")
        if len(parts) != 3 or parts[0] != "a" or parts[2] not in ("approve", "grant", "reject", "edit"):
            return self._not_found()
        token, action = parts[1], parts[2]
        form = self._form()
        if form is None:
            return None
        sent = form.get("csrf", "")
        if not sent or not hmac.compare_digest(sent, self.server.csrf(token)):
            return self._send(HTTPStatus.FORBIDDEN, "refused", "<p>Refused: this form's CSRF token is missing or "
                              "wrong. Reload the approval's page and decide there.</p>")
        a = self._approval(token)
        if a is None:
            return None
        name = form.get("name", "").strip()
        if not name or len(name) > MAX_NAME or not name.isprintable():
            return self._page(a, HTTPStatus.BAD_REQUEST, ("Give your name (up to 64 printable characters): "
                                                          "it is recorded with the decision.", True))
        try:
            version, digest = int(form.get("version", "")), form.get("digest", "")
        except ValueError:
            return self._page(a, HTTPStatus.BAD_REQUEST, ("The form lacks the version it showed: reload.", True))
        by = f"{name} (web)"
        try:
            if action == "edit":
                parsed = editor.from_text(form.get("request", "").replace("\r\n", "\n"), a)
                if parsed is None or (parsed[1] == bytes(a["body"])
                                      and parsed[0] == [(str(n), str(v)) for n, v in a["headers"]]):
                    return self._page(a, HTTPStatus.OK, ("Nothing was changed.", False))
                dec.edit(self.server.store, a["id"], by=by, version=version, digest=digest,
                                 headers=parsed[0], body=parsed[1])
            elif action == "grant":
                dec.decide(self.server.store, a["id"], "approve", by=by, version=version, digest=digest,
                           grant=(form.get("grant", ""), form.get("for", "")))
            else:
                reason = form.get("reason", "").strip() or None
                if action == "reject" and not reason:
                    return self._page(a, HTTPStatus.BAD_REQUEST, ("Give a reason: the agent is told it.", True))
                dec.decide(self.server.store, a["id"], action, by=by, version=version, digest=digest,
                                   reason=reason)
        except ValueError as err:
            return self._page(a, HTTPStatus.BAD_REQUEST, (f"Not changed: {err}", True))
        except dec.Refused as err:
            if err.why in ("invalid", "forbidden"):  # refused before the store: the page as it was
                code = HTTPStatus.FORBIDDEN if err.why == "forbidden" else HTTPStatus.BAD_REQUEST
                return self._page(a, code, (str(err), True))
            fresh = self.server.store.get(a["id"]) or a
            return self._page(fresh, HTTPStatus.CONFLICT, (str(err), True))
        done = {"approve": "approved", "grant": "granted", "reject": "rejected"}.get(action, "edited")
        self.send_response(HTTPStatus.SEE_OTHER)
        self.send_header("Location", f"/a/{token}?done={done}")
        self.send_header("Content-Length", "0")
        self._security_headers()
        self.end_headers()
        return None

    # --- reading

    def _approval(self, token: str) -> dict[str, Any] | None:
        a = self.server.store.get_by_token(token) if token else None
        if a is None:
            self._not_found()
        return a

    def _form(self) -> dict[str, str] | None:
        """The urlencoded form of a POST, or None after answering 403/413."""
        origin, site = self.headers.get("Origin"), self.headers.get("Sec-Fetch-Site")
        if site not in (None, "same-origin", "none"):
            self._send(HTTPStatus.FORBIDDEN, "refused", "<p>Refused: a form from another site.</p>")
            return None
        # Origin: null is what our own pages' forms send under Referrer-Policy: no-referrer;
        # it is also what a sandboxed frame of any site sends: only Sec-Fetch-Site tells them apart.
        if origin is not None and not self._own_origin(origin) and not (origin == "null" and site == "same-origin"):
            self._send(HTTPStatus.FORBIDDEN, "refused", "<p>Refused: a form from another site (or from a browser "
                       "that sends <code>Origin: null</code> without <code>Sec-Fetch-Site</code>).</p>")
            return None
        ctype = (self.headers.get("Content-Type") or "").split(";")[0].strip().lower()
        if ctype != "application/x-www-form-urlencoded":
            self._send(HTTPStatus.FORBIDDEN, "refused", "<p>Refused: not a form of this page.</p>")
            return None
        try:
            length = int(self.headers.get("Content-Length") or "")
        except ValueError:
            self._send(HTTPStatus.LENGTH_REQUIRED, "refused", "<p>A form needs a Content-Length.</p>")
            return None
        if not 0 <= length <= MAX_FORM:
            self._send(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, "refused", "<p>The form is too big.</p>")
            return None
        raw = self.rfile.read(length).decode("utf-8", errors="replace")
        fields = urllib.parse.parse_qs(raw, keep_blank_values=True, max_num_fields=16)
        return {k: v[0] for k, v in fields.items()}

    def _own_origin(self, origin: str) -> bool:
        """An ``Origin`` of this server: its base, or http(s) with a host it answers to."""
        scheme, sep, host = origin.partition("://")
        return origin == self.server.base or (sep != "" and scheme in ("http", "https")
                                              and self.server.is_own_host(host))

    # --- pages

    def _list(self) -> None:
        store = self.server.store
        rows = []
        for a in [*store.list(status="pending"), *[x for x in store.list(limit=50) if x["status"] != "pending"]]:
            rows.append(f"<tr><td><a href=\"{e(a['review_path'])}\">{e(a['id'])}</a></td>"
                        f"<td class=\"st {e(a['status'])}\">{e(a['status'])}</td><td>{e(a['run_id'])}</td>"
                        f"<td>{e(render.when(a['deadline']))}</td><td>{e(a['method'])} {e(a['url'])}</td>"
                        f"<td>{e(a['rule'])}</td></tr>")
        table = ("<table><tr><th>approval</th><th>status</th><th>run</th><th>expires</th><th>request</th>"
                 "<th>rule</th></tr>" + "".join(rows) + "</table>") if rows else "<p>No approvals yet.</p>"
        self._send(HTTPStatus.OK, "gatewrap approvals", f"<h1>Approvals</h1><p>Store {e(store.url)}</p>{table}")

    def _page(self, a: dict[str, Any], status: HTTPStatus, message: tuple[str, bool] | None) -> None:
        token = a["token"]
        run = history.run_history(self.server.audit_log, a["run_id"], a["id"])
        facts = [("status", a["status"]), ("run", a["run_id"]), ("rule", a["rule"]),
                 ("asked", render.when(a["created"])), ("expires", render.when(a["deadline"]) + " (then denied)"),
                 ("version", a["version"]), ("digest", a["digest"])]
        if a.get("decided_by"):
            when = f" at {render.when(a['decided_at'])}" if a.get("decided_at") else ""
            facts.append(("edited by" if a["status"] == "pending" else "decided by", f"{a['decided_by']}{when}"))
        if a.get("grant_id"):
            facts.append(("granted", self._grant_fact(a)))
        if a.get("reason"):
            facts.append(("reason", a["reason"]))
        if a.get("waiters", 0) > 1:
            facts.append(("waiting", f"{a['waiters']} identical requests share this approval"))
        out = [_headline(a, run)]
        if message:
            out.append(f"<p class=\"msg{' stale' if message[1] else ''}\" id=\"message\">{e(message[0])}</p>")
        rows = []
        for k, v in facts:
            cls = f' class="st {e(v)}"' if k == "status" else ""
            rows.append(f"<tr><th>{e(k)}</th><td id=\"{e(k.replace(' ', '-'))}\"{cls}>{e(v)}</td></tr>")
        out.append("<table>" + "".join(rows) + "</table>")
        out.append("<h2>The request (credentials redacted)</h2>")
        out.append(_request(a))
        if a.get("body_truncated"):
            out.append(f"<p>Body truncated: {e(a['body_len'])} bytes in all, sha256 {e(a['body_digest'])}.</p>")
        if a.get("edited"):
            out.append("<h2>Edited: the diff from the agent's request</h2>")
            spans = []
            for ln in render.diff(a):
                cls = "del" if ln.startswith("-") else "add" if ln.startswith("+") else "same"
                spans.append(f'<span class="{cls}">{html.escape(ln, quote=True)}</span>')
            out.append('<pre id="diff">' + "\n".join(spans) + "</pre>")
        out.append(_before(run))  # before the forms: read what it did, then decide
        if a["status"] == "pending":
            out.append(self._forms(a, token))
        self._send(status, f"gatewrap approval {a['id']}", "".join(out))

    def _grant_fact(self, a: dict[str, Any]) -> str:
        """The approval's grant in one line: what it lets through, until when, its use."""
        g = next((g for g in self.server.store.grants(run_id=a["run_id"], active=False) if g["id"] == a["grant_id"]),
                 None)
        if g is None:
            return str(a["grant_id"])
        state = (f"revoked {render.when(g['revoked'])} by {g.get('revoked_by')}" if g.get("revoked")
                 else f"until {render.when(g['expires'])}")
        return (f"{g['id']}: {g['method']} {g['host']}{g['path_prefix']} of run {g['run_id']}, {state}, "
                f"used {g.get('uses', 0)}x (gatewrap approvals revoke {g['id']} ends it)")

    def _grant_form(self, a: dict[str, Any]) -> str:
        """Approve with a grant: the spec starts as the narrowest one covering this request
        (:func:`decide.suggested_grant`); the server checks what comes back as ``approve
        --grant`` does. If the rule forbids grants, a line that says so instead."""
        if not a.get("grants_allowed"):
            return (f"<p id=\"no-grant\">Rule {e(a['rule'])} forbids grants (<code>grants = false</code>): each "
                    "of its requests is asked for.</p>")
        return (f"<fieldset id=\"grant\"><legend>Approve and grant</legend>"
                f"<p>Approve, and let run {e(a['run_id'])} send later requests like this one without asking: "
                "this method, this host (never another, never another run) and a path prefix, for a while.</p>"
                f"<label>Grant <input name=\"grant\" maxlength=\"500\" size=\"50\" "
                f"value=\"{e(dec.suggested_grant(a))}\"></label> "
                "<label>for <input name=\"for\" maxlength=\"12\" size=\"5\" value=\"30m\" "
                "title=\"N and a unit: 90s, 30m, 2h, 1d\"></label> "
                f"<button type=\"submit\" formaction=\"/a/{e(a['token'])}/grant\">Approve and grant</button>"
                "</fieldset>")

    def _forms(self, a: dict[str, Any], token: str) -> str:
        """One form, one name field, a button per decision (``formaction``): the name is typed
        once whatever is decided. Its first button is disabled, so Enter in a field submits
        nothing (HTML, "implicit submission": a disabled default button does nothing)."""
        act = f"/a/{e(token)}/"
        parts = [
            f"<form method=\"post\" action=\"{act}approve\" id=\"decide\">",
            "<button type=\"submit\" disabled hidden aria-hidden=\"true\"></button>",
            f"<input type=\"hidden\" name=\"csrf\" value=\"{e(self.server.csrf(token))}\">"
            f"<input type=\"hidden\" name=\"version\" value=\"{e(a['version'])}\">"
            f"<input type=\"hidden\" name=\"digest\" value=\"{e(a['digest'])}\">",
            "<p class=\"who\"><label>Your name (recorded with the decision) <input id=\"name\" name=\"name\" "
            "required maxlength=\"64\" autocomplete=\"name\"></label></p>",
            f"<fieldset id=\"approve\"><legend>Approve</legend><button type=\"submit\" formaction=\"{act}approve\">"
            "Approve and send</button></fieldset>",
            self._grant_form(a),
            "<fieldset id=\"reject\"><legend>Reject</legend>"
            "<label>Reason (the agent is told) <input name=\"reason\" maxlength=\"500\" size=\"50\"></label> "
            f"<button type=\"submit\" formaction=\"{act}reject\">Reject</button></fieldset>",
        ]
        try:
            text = editor.to_text(a)
        except Exception as err:  # noqa: BLE001 — a body that cannot be edited here
            parts.append(f"<p>{e(err)}</p>")
        else:
            parts.append(
                "<fieldset id=\"edit\"><legend>Edit</legend>"
                "<p>Edit the headers and the body (then approve the edited request):</p>"
                f"<textarea name=\"request\" rows=\"16\">{html.escape(text, quote=True)}</textarea>"
                f"<button type=\"submit\" formaction=\"{act}edit\">Save the edit</button></fieldset>")
        parts.append("</form>")
        return "".join(parts)

    # --- writing

    def _security_headers(self) -> None:
        self.send_header("Content-Security-Policy", "default-src 'none'; style-src 'sha256-"
                         + _style_hash() + "'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
        self.send_header("Referrer-Policy", "no-referrer")
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("X-Frame-Options", "DENY")

    def _send(self, status: HTTPStatus, title: str, body_html: str) -> None:
        page = (f"<!doctype html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>{e(title)}</title>"
                f"<meta name=\"viewport\" content=\"width=device-width\"><style>{STYLE}</style></head>"
                f"<body>{body_html}</body></html>").encode("utf-8")
        self.send_response(status)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(page)))
        self._security_headers()
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(page)

    def _not_found(self) -> None:
        self._send(HTTPStatus.NOT_FOUND, "not found", "<p>No such page. An approval's page is reached by its own "
                   "link (gatewrap approvals show ID prints it).</p>")


def _headline(a: dict[str, Any], run: history.RunHistory) -> str:
    """Who asks what: the run's user and command (from its ``run_start`` record, written by
    gatewrap), the full method and URL, the time left until the hold's deadline."""
    argv = run.command()
    who = (f"{e(run.user() or 'an unknown user')}'s <code id=\"command\">{e(command_line(argv))}</code>"
           if argv else "the agent")
    out = [f"<p class=\"asks\">Run {e(a['run_id'])}: {who} asks to send</p>",
           f"<h1 id=\"headline\">{e(a['method'])} {e(a['url'])}</h1>"]
    if a["status"] == "pending":
        out.append(f"<p class=\"left\" id=\"time-left\">Time left: <b>{e(render.time_left(a['deadline'], time.time()))}"
                   f"</b> (until {e(render.when(a['deadline']))}; then it is denied). Approval {e(a['id'])}.</p>")
    else:
        out.append(f"<p class=\"left\">Approval {e(a['id'])}: {e(a['status'])}.</p>")
    return "".join(out)


def _request(a: dict[str, Any]) -> str:
    """The request as it goes upstream: headers and, for a JSON body, the body re-indented
    (the raw request one click away, in a ``details``)."""
    raw = render.request_lines(a["method"], a["url"], a["headers"], a["body"])
    pretty = render.pretty_body(bytes(a["body"]))
    if pretty is None:
        return _pre(raw, "request")
    head = render.request_lines(a["method"], a["url"], a["headers"], b"")
    return (_pre(head + pretty.split("\n"), "request")
            + "<details id=\"raw\"><summary>The raw request, byte for byte as it is sent</summary>"
            + _pre(raw, "raw-request") + "</details>")


def _before(run: history.RunHistory) -> str:
    """The run's last records before it asked (time, event, decision, destination, who/why)."""
    title = f"<h2>What the run did before asking (its last {history.LAST_RECORDS} audit records)</h2>"
    if run.problem:
        return title + f"<p id=\"history\">{e(run.problem)}.</p>"
    if not run.before:
        return title + "<p id=\"history\">No records of this run before it asked.</p>"
    lines = [" ".join((str(r.get("time", "-"))[11:19], f"{r.get('event', '-'):13}", f"{r.get('decision') or '-':9}",
                       f"{audit_format.destination(r):34}", audit_format.who_why(r))).rstrip()
             for r in run.before]
    return title + _pre([printable(ln) for ln in lines], "history")


def _style_hash() -> str:
    import base64

    return base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()


def done_message(done: str) -> tuple[str, bool] | None:
    """The line shown after a decision went through (the redirect's ``?done=``)."""
    return {"approved": ("Approved: the request is sent to upstream once.", False),
            "granted": ("Approved with a grant: the request is sent to upstream once, and the run's later "
                        "requests the grant covers go through without asking until it expires or is revoked.",
                        False),
            "rejected": ("Rejected: the agent gets 403 with your reason.", False),
            "edited": ("Edited: look at the diff, then approve or reject the edited request.", False),
            }.get(done)
