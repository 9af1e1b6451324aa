"""An edit keeps the bytes of every part the human did not edit (issue 21, item 9): the request
is shown with its non-printable characters escaped (``\\x1b``, ``\\r``, ``\\u202e``; a byte that is
not UTF-8 as ``\\xNN``), so it survives an editor and a browser's <textarea> (which turns CR LF
into LF, drops NUL...); a part that comes back as it was shown keeps the agent's bytes as they
were; an escape that is malformed is refused with the reason. The same through $EDITOR, the
parser itself, and the review page in headless Chromium. SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
from selenium.webdriver.common.by import By

from gatewrap.approvals import editor
from gatewrap.approvals.web import ReviewServer

from .held import cli
from .test_web import _decide

RUN = "gw-00000000f1"
#: NUL, ESC, CR LF, a bidi override, a right-to-left mark, a byte that is not UTF-8, a tab, a
#: backslash before letters that name escapes, and text that looks like one.
BODY = (b'{"to": "all@example.com", "subject": "prices"}\r\n\x00\x1b[2J\xe2\x80\xae\xe2\x80\x8f\xff\tend'
        b' \\x41 \\\\ \\u0041 C:\\new\\x')


@pytest.fixture
def asked(store):
    store.start_run(RUN)
    a, _ = store.ask(RUN, rule="r", method="POST", url="http://allowed.test/echo",
                     headers=[("Content-Type", "application/json"), ("X-Trace", "t1"), ("X-Odd", "a\x1bb\u202ec")],
                     body=BODY)
    return a


def test_the_text_round_trips_every_byte_and_shows_no_control(asked):
    text = editor.to_text(asked)
    assert all(c.isprintable() or c in "\n\t" for c in text), "nothing raw for an editor or a textarea"
    headers, body = editor.from_text(text, asked)
    assert body == BODY and headers == [tuple(h) for h in asked["headers"]]
    # a browser sends a textarea's line breaks as CR LF
    headers, body = editor.from_text(text.replace("\n", "\r\n"), asked)
    assert body == BODY


def test_a_headers_only_edit_keeps_the_body_s_bytes(asked):
    text = editor.to_text(asked).replace("X-Trace: t1", "X-Trace: reviewed")
    headers, body = editor.from_text(text, asked)
    assert body == BODY
    assert ("X-Trace", "reviewed") in headers and ("X-Odd", "a\x1bb\u202ec") in headers


def test_a_body_edit_changes_only_what_was_edited(asked):
    text = editor.to_text(asked).replace('"prices"', '"costs"')
    _, body = editor.from_text(text, asked)
    assert body == BODY.replace(b'"prices"', b'"costs"')


@pytest.mark.parametrize("case, typed, why", [
    ("a malformed \\x escape", "\\xZZ", "\\xZZ"),
    ("a surrogate", "\\udc80", "not a character"),
    ("past the last code point", "\\U00110000", "not a character"),
    ("a lone backslash at the end", "\\", "backslash"),
])
def test_a_malformed_escape_is_refused_with_the_reason(asked, case, typed, why):
    text = editor.to_text(asked) + typed
    with pytest.raises(ValueError) as e:
        editor.from_text(text, asked)
    assert why in str(e.value), case


def test_a_headers_only_edit_in_the_editor_keeps_the_body_s_bytes(asked, store, store_url):
    r = cli("edit", asked["id"], "--state", store_url, env={"EDITOR": "sed -i s/^X-Trace:.*/X-Trace:\\ reviewed/"})
    assert r.returncode == 0, r.stderr
    after = store.get(asked["id"])
    assert after["body"] == BODY and ["X-Trace", "reviewed"] in [list(h) for h in after["headers"]]
    assert ["X-Odd", "a\x1bb\u202ec"] in [list(h) for h in after["headers"]]


@pytest.fixture
def server(store_url):
    from gatewrap import _gate_core as core

    s = ReviewServer(core.ApprovalStore(store_url), ("127.0.0.1", 0))
    threading.Thread(target=s.serve_forever, daemon=True).start()
    yield s
    s.shutdown()
    s.server_close()


def _type(browser, area, text: str) -> None:
    """Set the textarea's text as a paste would (send_keys would take the body's tab for a
    move to the next field)."""
    browser.execute_script("arguments[0].value = arguments[1];", area, text)


def test_a_headers_only_edit_on_the_page_keeps_the_body_s_bytes(asked, store, server, chromium):
    chromium.get(server.base + asked["review_path"])
    area = chromium.find_element(By.NAME, "request")
    shown = area.get_property("value")
    assert "\\x00\\x1b[2J\\u202e\\u200f\\xff" in shown and "\\r\n" in shown
    _type(chromium, area, shown.replace("X-Trace: t1", "X-Trace: reviewed"))
    _decide(chromium, "edit")
    assert chromium.find_element(By.ID, "message").text.startswith("Edited")
    after = store.get(asked["id"])
    assert after["body"] == BODY, "no body byte rewritten"
    assert ["X-Trace", "reviewed"] in [list(h) for h in after["headers"]]


def test_a_malformed_escape_on_the_page_is_refused_and_changes_nothing(asked, store, server, chromium):
    chromium.get(server.base + asked["review_path"])
    area = chromium.find_element(By.NAME, "request")
    text = area.get_property("value") + "\\xZZ"
    _type(chromium, area, text)
    _decide(chromium, "edit")
    assert "\\xZZ" in chromium.find_element(By.ID, "message").text
    assert store.get(asked["id"])["version"] == asked["version"]
