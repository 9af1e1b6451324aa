"""An agent that reads its outbox and sends one e-mail through a (fake) e-mail API.

Under examples/breakpoint/policy.toml the send is a breakpoint: the POST waits in the gate
until a human answers it; the agent sees either the API's answer (approved, perhaps edited)
or a 403 with the human's reason (rejected, or expired). Standard library only.
"""

import json
import os
import sys
import urllib.error
import urllib.request

API = os.environ.get("MAIL_API", "http://mail.test")


def call(method: str, path: str, doc: dict | None = None) -> tuple[int, str]:
    data = None if doc is None else json.dumps(doc).encode()
    req = urllib.request.Request(API + path, data=data, method=method,
                                 headers={"Content-Type": "application/json",
                                          "Authorization": "Bearer sk-example-not-a-real-key"})
    try:
        with urllib.request.urlopen(req, timeout=900) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def main() -> int:
    status, body = call("GET", "/v3/mail/outbox")
    print(f"agent: outbox: {status} {body.strip()}", flush=True)
    mail = {"to": "all-customers@example.com", "subject": "Our prices change on Monday",
            "text": "Dear customer,\nfrom Monday every plan costs 20% more.\n"}
    print(f"agent: sending to {mail['to']} ...", flush=True)
    status, body = call("POST", "/v3/mail/send", mail)
    print(f"agent: send: {status} {body.strip()}", flush=True)
    return 0 if status == 202 else 1


if __name__ == "__main__":
    sys.exit(main())
