"""The notifier: the stderr line, the Slack-compatible body, and the Standard Webhooks
signature, checked by the reference library (standardwebhooks from PyPI) on what a loopback
server received."""

from __future__ import annotations

import base64
import io
import json
import os
import time

import pytest
from standardwebhooks import Webhook

from gatewrap.approvals import notify

SECRET = "whsec_" + base64.b64encode(b"k" * 32).decode()


def approval(**over):
    """An approval as ApprovalStore.get returns it (APPROVALS.md), for the formatting tests."""
    a = {"id": "ap-abcdefghijklmnopqrst", "run_id": "gw-0123456789", "created": 1_800_000_000.0,
         "deadline": 1_800_000_600.0, "rule": "policy.toml:rule[2]", "method": "POST",
         "url": "https://mail.test/v3/send", "headers": [["Content-Type", "application/json"],
                                                          ["Authorization", "[redacted]"]],
         "body": b'{"to": "customer@example.com", "subject": "hello"}', "body_len": 50,
         "body_digest": "0" * 64, "digest": "1" * 64, "version": 1, "status": "pending", "hold": "wait",
         "grants_allowed": 1, "token": "T" * 43, "review_path": "/a/" + "T" * 43, "body_truncated": False,
         "edited": 0, "waiters": 1}
    a.update(over)
    return a


class Audit:
    """Collects the records the notifier writes (an AuditLog stand-in for the formatting tests)."""

    def __init__(self):
        self.records = []

    def write(self, rec):
        self.records.append(rec)


def test_the_stderr_line_names_the_request_the_deadline_and_the_commands():
    line = notify.stderr_line(approval())
    assert line == ("gatewrap: approval ap-abcdefghijklmnopqrst (digest 111111111111): POST https://mail.test/v3/send (rule "
                    "policy.toml:rule[2]) waits until 2027-01-15T08:10:00Z; answer with: sudo gatewrap approvals "
                    "approve ap-abcdefghijklmnopqrst | reject ap-abcdefghijklmnopqrst --reason TEXT | show "
                    "ap-abcdefghijklmnopqrst")
    root = notify.stderr_line(approval(), ("gatewrap approvals", " --state sqlite:/srv/s.db"))
    assert root.endswith("answer with: gatewrap approvals approve ap-abcdefghijklmnopqrst --state sqlite:/srv/s.db "
                         "| reject ap-abcdefghijklmnopqrst --reason TEXT --state sqlite:/srv/s.db | show "
                         "ap-abcdefghijklmnopqrst --state sqlite:/srv/s.db")


def test_the_body_has_text_and_blocks_with_the_request_rule_expiry_excerpt_and_a_review_button():
    body = notify.slack_body(approval(), "http://127.0.0.1:8377")
    assert body["text"].startswith("gatewrap: run gw-0123456789 asks to send POST https://mail.test/v3/send")
    kinds = [b["type"] for b in body["blocks"]]
    assert kinds == ["header", "section", "section", "actions", "context"]
    section = body["blocks"][1]
    assert section["text"]["text"] == "*POST https://mail.test/v3/send*"
    fields = [f["text"] for f in section["fields"]]
    assert fields[0] == "*Rule*\npolicy.toml:rule[2]" and fields[2].startswith("*Expires*\n2027-01-15T08:10:00Z")
    assert '"to": "customer@example.com"' in body["blocks"][2]["text"]["text"]
    (button,) = body["blocks"][3]["elements"]
    assert (button["type"], button["url"]) == ("button", "http://127.0.0.1:8377/a/" + "T" * 43)


def test_hostile_values_cannot_mention_link_or_close_the_code_block():
    a = approval(url="https://mail.test/<!channel>", body=b"```\n<https://evil.test|click> &amp; \x1b[2J")
    body = notify.slack_body(a, "http://127.0.0.1:8377")
    text = json.dumps(body)
    assert "<!channel>" not in text and "<https://evil.test" not in text and "\x1b" not in text
    assert "&lt;!channel&gt;" in body["text"]
    excerpt = body["blocks"][2]["text"]["text"]
    assert excerpt.count("```") == 2 and "&lt;https://evil.test|click&gt; &amp;amp;" in excerpt


def test_escaping_never_takes_a_block_past_slacks_limits():
    """Block Kit refuses a section text over 3000 characters (a field's over 2000): the agent
    must not be able to keep the human from being told by a URL or body of ``&``s."""
    a = approval(url="https://mail.test/?" + "a&" * 1500, body=b"&" * 5000, body_len=5000)
    body = notify.slack_body(a, "http://127.0.0.1:8377")
    section, excerpt = body["blocks"][1], body["blocks"][2]
    assert len(section["text"]["text"]) <= 3000 and len(excerpt["text"]["text"]) <= 3000
    assert all(len(f["text"]) <= 2000 for f in section["fields"])
    assert "&amp;" in section["text"]["text"] and not section["text"]["text"].rstrip("*…").endswith(("&", "&a", "&am"))


def test_credentials_in_the_query_do_not_leave_the_host():
    a = approval(url="https://api.test/v1/send?key=AIzaSECRET1&to=x&access_token=SECRET2&X-Amz-Signature=SECRET3")
    text = json.dumps(notify.slack_body(a, "http://127.0.0.1:8377"))
    assert "SECRET" not in text
    assert "to=x" in text and "key=[redacted]" in text


def test_a_long_body_is_cut_and_says_how_long_it_was():
    a = approval(body=b"x" * 5000, body_len=200_000, body_truncated=True)
    excerpt = notify.slack_body(a, "http://127.0.0.1:8377")["blocks"][2]["text"]["text"]
    assert len(excerpt) < 3000 and excerpt.endswith("… (200000 bytes in all)```")


def test_the_webhook_is_signed_as_standard_webhooks_verify_it(receiver):
    audit, err = Audit(), io.StringIO()
    n = notify.Notifier(audit, "gw-0123456789", webhook=receiver.url, secret=SECRET, stderr=True, err=err)
    n(approval())
    (got,) = receiver.wait(1)
    assert got.path == "/hook" and got.headers["content-type"] == "application/json"
    assert got.headers["webhook-id"] == "ap-abcdefghijklmnopqrst.v1"
    assert abs(int(got.headers["webhook-timestamp"]) - time.time()) < 300
    verified = Webhook(SECRET).verify(got.body, {k: got.headers[k] for k in
                                                ("webhook-id", "webhook-timestamp", "webhook-signature")})
    assert verified == got.json() == notify.slack_body(approval(), notify.DEFAULT_REVIEW_URL)
    with pytest.raises(Exception):
        Webhook("whsec_" + base64.b64encode(b"x" * 32).decode()).verify(got.body, dict(got.headers))
    assert [(r["event"], r["channel"], r["ok"]) for r in audit.records] == [
        ("approval_notified", "stderr", True), ("approval_notified", "webhook", True)]
    assert audit.records[1]["approval"] == "ap-abcdefghijklmnopqrst" and audit.records[1]["version"] == 1
    assert err.getvalue().startswith("gatewrap: approval ap-abcdefghijklmnopqrst (digest 111111111111): POST")


def test_a_refused_webhook_is_recorded_as_not_ok_and_said_once(receiver):
    receiver.status = 400
    audit, err = Audit(), io.StringIO()
    notify.Notifier(audit, "gw-0123456789", webhook=receiver.url, secret=SECRET, stderr=False, err=err)(approval())
    assert len(receiver.got) == 1  # a 4xx is not tried again
    (rec,) = audit.records
    assert (rec["channel"], rec["ok"], rec["error"]) == ("webhook", False, "HTTP 400")
    assert "the webhook for ap-abcdefghijklmnopqrst failed: HTTP 400 (the approval still waits" in err.getvalue()


@pytest.mark.parametrize("url", ["file:///etc/shadow", "ftp://a.test/", "http://", "mail.test/hook"])
def test_a_webhook_url_is_http_or_https(url):
    with pytest.raises(ValueError, match="give an http:// or https:// URL"):
        notify.check_webhook_url(url)


def test_a_missing_secret_is_made_0600_and_read_back_the_same(tmp_path):
    path = tmp_path / "etc" / "webhook-secret"
    s = notify.load_secret(str(path))
    assert s.startswith("whsec_") and len(base64.b64decode(s[6:])) == 32
    assert (os.stat(path).st_mode & 0o777) == 0o600
    assert notify.load_secret(str(path)) == s


def test_a_secret_file_with_something_else_is_refused(tmp_path):
    path = tmp_path / "webhook-secret"
    path.write_text("hunter2\n")
    with pytest.raises(Exception, match="whsec_ followed by base64"):
        notify.load_secret(str(path))
