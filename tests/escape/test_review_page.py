"""Escape suite, what the human sees: the review page shows an approval's JSON body
re-indented (the raw request one click away). The body is the agent's: its pretty form must
never say something the raw bytes do not, or the human approves what is not sent."""

from __future__ import annotations

import html

import pytest

from gatewrap.approvals import web

# (vector, the raw body, what the re-indented view must not hide)
CASES = [
    ("a JSON key given twice (the view kept the last, a server may take the first)",
     b'{"to": "attacker@evil.example", "subject": "prices", "to": "team@example.com"}', "attacker@evil.example"),
    ("a number written so that it reads back as another (1e2 shown as 100.0)",
     b'{"amount": 1e2, "currency": "EUR"}', "1e2"),
    ("a number beyond a double's precision (rounded in the view)",
     b'{"amount": 100.0000000000000000001}', "100.0000000000000000001"),
    ("NaN, which JSON does not have", b'{"limit": NaN}', "NaN"),
]


@pytest.mark.parametrize("raw, hidden", [(r, h) for _, r, h in CASES], ids=[v for v, _, _ in CASES])
def test_the_pretty_body_never_hides_what_the_raw_body_says(raw, hidden, outcome):
    a = {"method": "POST", "url": "http://allowed.test/send", "headers": [["content-type", "application/json"]],
         "body": raw}
    page = web._request(a)
    shown = html.unescape(page.split('<pre id="request">')[1].split("</pre>")[0])
    ok = hidden in shown
    outcome("review page", "the first view shows the body as sent" if ok else "the first view hid part of the body",
            "held" if ok else "OPEN")
    assert ok, shown
