"""Sites of the fake internet that tests fill in: static files per host name, and a tiny
OpenAI-compatible chat API (imported by ``servers.py``, which hands it a request whose Host
has a folder under the sites root).

Layout: ``<sites root>/<host>/<path>`` is served for ``GET``/``HEAD https://<host>/<path>``
(and http): a folder answers with its ``index.json`` (an npm registry's package document,
``/<name>``) or else its ``index.html``; a file with the type of its extension. This is enough
for a PEP 503 simple index (pip), a dumb-HTTP git repository (``git update-server-info``;
gitprotocol-http(5)) and a static npm registry.

A host folder holding a file ``.openai`` is an OpenAI-compatible API instead:
``POST /v1/chat/completions`` (https://platform.openai.com/docs/api-reference/chat/create)
answers a conversation without tool results with one ``fetch_url`` tool call per URL in the
last user message, and one with tool results with a final message that quotes each result's
first line. Each request to it is logged (``server``, ``event`` = ``chat``, ``tools``).

A host folder holding a file ``.git-http`` is a smart-HTTP git server (gitprotocol-http(5)):
every request goes to ``git http-backend`` (git-http-backend(1), as CGI, RFC 3875) over the
bare repositories in the folder, clone and push, once its ``Authorization`` is Basic
credentials (RFC 7617) whose password is the file's content (any user, as GitHub takes a
token); else ``401`` with ``WWW-Authenticate: Basic``. Each request is logged (``event`` =
``git``, ``user``, ``authorized``, ``path``).

A host folder holding a file ``.mail`` is a fake e-mail API (examples/breakpoint):
``POST /v3/mail/send`` with a JSON body answers ``202`` and ``{"id": "msg-N", "to",
"subject"}``, and logs each message (``event`` = ``mail``, ``to``, ``subject``, ``body``);
``GET /v3/mail/outbox`` lists the messages sent so far.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
import re
import subprocess
import time

#: Folder of every host's site (set by servers.py from its config's ``sites_root``).
ROOT: str | None = None


def site_of(host: str) -> str | None:
    """The folder of ``host``'s site, or None if it has none (then servers.py answers)."""
    if not ROOT or not host or "/" in host or host.startswith("."):
        return None
    d = os.path.join(ROOT, host)
    return d if os.path.isdir(d) else None


def serve(handler, site: str, body: bytes, log) -> None:
    """Answer ``handler``'s request (a BaseHTTPRequestHandler) from ``site``."""
    route = handler.path.split("?", 1)[0]
    if os.path.exists(os.path.join(site, ".openai")):
        return _chat(handler, route, body, log)
    if os.path.exists(os.path.join(site, ".mail")):
        return _mail(handler, route, body, log)
    if os.path.exists(os.path.join(site, ".git-http")):
        return _git(handler, site, body, log)
    if handler.command not in ("GET", "HEAD"):
        return handler._send(405, b"method not allowed\n")
    rel = os.path.normpath(route.lstrip("/")) if route.strip("/") else "."
    if rel.startswith(".."):
        return handler._send(404, b"not found\n")
    path = os.path.join(site, rel)
    if os.path.isdir(path):
        index = os.path.join(path, "index.json")
        path = index if os.path.isfile(index) else os.path.join(path, "index.html")
    if not os.path.isfile(path):
        return handler._send(404, b"not found\n")
    ctype = mimetypes.guess_type(path)[0] or "application/octet-stream"
    with open(path, "rb") as f:
        handler._send(200, f.read(), ctype)


def _basic(header: str | None) -> tuple[str, str] | None:
    """``(user, password)`` of Basic credentials (RFC 7617), or None."""
    scheme, _, b64 = (header or "").partition(" ")
    if scheme.lower() != "basic":
        return None
    try:
        user, sep, password = base64.b64decode(b64.strip(), validate=True).decode().partition(":")
    except (ValueError, UnicodeDecodeError):
        return None
    return (user, password) if sep else None


def _git(handler, site: str, body: bytes, log) -> None:
    with open(os.path.join(site, ".git-http")) as f:
        password = f.read().strip()
    creds = _basic(handler.headers.get("Authorization"))
    authorized = creds is not None and creds[1] == password
    path, _, query = handler.path.partition("?")
    log.write(server=handler.server.scheme, event="git", path=path, authorized=authorized,
              user=creds[0] if creds else None)
    if not authorized:
        handler.send_response(401)
        handler.send_header("WWW-Authenticate", 'Basic realm="git"')
        handler.send_header("Content-Length", "0")
        handler.end_headers()
        return
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "GIT_PROJECT_ROOT": site, "GIT_HTTP_EXPORT_ALL": "1",
           "REQUEST_METHOD": handler.command, "PATH_INFO": path, "QUERY_STRING": query,
           "CONTENT_TYPE": handler.headers.get("Content-Type", ""), "CONTENT_LENGTH": str(len(body)),
           "REMOTE_USER": creds[0] or "agent", "REMOTE_ADDR": "198.51.100.1", "GATEWAY_INTERFACE": "CGI/1.1",
           "HTTP_CONTENT_ENCODING": handler.headers.get("Content-Encoding", ""),
           "GIT_CONFIG_COUNT": "1", "GIT_CONFIG_KEY_0": "safe.directory", "GIT_CONFIG_VALUE_0": "*"}
    p = subprocess.run(["git", "http-backend"], input=body, capture_output=True, env=env, timeout=60)
    head, _, out = p.stdout.partition(b"\r\n\r\n")
    status, headers = 200, []
    for line in head.decode("latin-1").split("\r\n"):
        name, _, value = line.partition(":")
        if name.lower() == "status":
            status = int(value.split()[0])
        elif name:
            headers.append((name, value.strip()))
    handler.send_response(status)
    for name, value in headers:
        handler.send_header(name, value)
    handler.send_header("Content-Length", str(len(out)))
    handler.end_headers()
    handler.wfile.write(out)


#: Messages the fake e-mail API accepted, per host.
_OUTBOX: dict[str, list[dict]] = {}


def _mail(handler, route: str, body: bytes, log) -> None:
    host = (handler.headers.get("Host") or "").split(":")[0]
    box = _OUTBOX.setdefault(host, [])
    if handler.command == "GET" and route == "/v3/mail/outbox":
        return handler._send(200, json.dumps({"messages": box}).encode(), "application/json")
    if handler.command != "POST" or route != "/v3/mail/send":
        return handler._send(404, b'{"error": "not found"}', "application/json")
    try:
        doc = json.loads(body or b"{}")
        to, subject = str(doc["to"]), str(doc.get("subject", ""))
    except (ValueError, KeyError, TypeError):
        return handler._send(400, b'{"error": "give a JSON body with to and subject"}', "application/json")
    msg = {"id": f"msg-{len(box) + 1}", "to": to, "subject": subject}
    box.append({**msg, "body": str(doc.get("text", ""))})
    log.write(server=handler.server.scheme, event="mail", host=host, to=to, subject=subject,
              body=body.decode("utf-8", "replace"))
    handler._send(202, json.dumps(msg).encode(), "application/json")


def _chat(handler, route: str, body: bytes, log) -> None:
    if handler.command != "POST" or route != "/v1/chat/completions":
        return handler._send(404, b'{"error": {"message": "not found"}}', "application/json")
    req = json.loads(body or b"{}")
    messages = req.get("messages", [])
    results = [m for m in messages if m.get("role") == "tool"]
    if results:
        lines = [str(m.get("content", "")).strip().splitlines()[0] if m.get("content") else "" for m in results]
        message = {"role": "assistant", "content": "The pages said: " + " | ".join(lines)}
        finish = "stop"
    else:
        user = next((m for m in reversed(messages) if m.get("role") == "user"), {})
        urls = re.findall(r"https?://[^\s,]+", str(user.get("content", "")))
        calls = [{"id": f"call_{i}", "type": "function",
                  "function": {"name": "fetch_url", "arguments": json.dumps({"url": u})}} for i, u in enumerate(urls)]
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    log.write(server="https", event="chat", tools=len(results), model=req.get("model"))
    doc = {"id": "chatcmpl-fake", "object": "chat.completion", "created": int(time.time()),
           "model": req.get("model", "fake"), "choices": [{"index": 0, "message": message, "finish_reason": finish}],
           "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}}
    handler._send(200, json.dumps(doc).encode(), "application/json")
