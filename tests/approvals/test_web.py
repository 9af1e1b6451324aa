"""The review pages (`gatewrap approvals serve`) in headless Chromium, on approvals made through
the store's API as the gate makes them (tests/approvals/test_cli.py has the run end to end):
approve, edit then approve, reject, a stale decision told why, hostile bodies escaped; and
requests a browser of another site could make (no CSRF token, a wrong one, a foreign Origin,
a wrong approval token) refused. SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
import requests
from selenium.webdriver.common.by import By
from selenium.webdriver.support.expected_conditions import staleness_of
from selenium.webdriver.support.ui import WebDriverWait

from gatewrap.approvals.web import ReviewServer

from . import held
from .held import cli

RUN = "gw-00000000b1"


class Asked:
    """One pending approval made with ``ApprovalStore.ask``."""

    def __init__(self, store, body: str):
        store.start_run(RUN)
        self.store = store
        self.a, _ = store.ask(RUN, rule="policy.toml:rule[1]", method="POST", url="http://allowed.test/echo",
                              headers=[("Content-Type", "application/json"), ("Authorization", "Bearer sk-secret-1")],
                              body=body.encode())

    def pending(self):
        return self.a


@pytest.fixture
def run(store, request):
    return Asked(store, getattr(request, "param", held.BODY))


@pytest.fixture
def server(store_url):
    from gatewrap import _gate_core as core

    s = ReviewServer(core.ApprovalStore(store_url), ("127.0.0.1", 0))
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


def _decide(browser, form: str, name: str = "bob", **fields) -> None:
    f = browser.find_element(By.ID, form)
    f.find_element(By.NAME, "name").send_keys(name)
    for k, v in fields.items():
        el = f.find_element(By.NAME, k)
        el.clear()
        el.send_keys(v)
    page = browser.find_element(By.TAG_NAME, "html")
    f.find_element(By.CSS_SELECTOR, "button[type=submit]").click()
    WebDriverWait(browser, 30).until(staleness_of(page))  # the answer's page has replaced this one


def test_approve_on_the_page_sends_the_request_and_records_the_name(run, server, chromium, artifacts, store_url, request):
    a = run.pending()
    chromium.get(f"{server.base}/l/{server.list_key}")
    page = chromium.find_element(By.TAG_NAME, "html")
    chromium.find_element(By.LINK_TEXT, a["id"]).click()
    WebDriverWait(chromium, 30).until(staleness_of(page))
    assert chromium.current_url == server.base + a["review_path"]
    assert chromium.find_element(By.ID, "status").text == "pending"
    pre = chromium.find_element(By.TAG_NAME, "pre").text
    assert pre.startswith("POST /echo HTTP/1.1\nHost: allowed.test") and "Authorization: [redacted]" in pre
    backend = request.node.callspec.params["store_url"]
    chromium.save_screenshot(str(artifacts / f"review-page-{backend}.png"))
    _decide(chromium, "approve")
    assert chromium.find_element(By.ID, "message").text.startswith("Approved")
    after = run.store.get(a["id"])
    assert (after["status"], after["decided_by"], after["version"]) == ("approved", "bob (web)", a["version"] + 1)


def test_edit_on_the_page_shows_the_diff_and_the_edit_is_what_is_approved(run, server, chromium):
    a = run.pending()
    chromium.get(server.base + a["review_path"])
    area = chromium.find_element(By.NAME, "request")
    text = area.get_property("value").replace("all-customers@", "pricing-team@")
    area.clear()
    area.send_keys(text)
    _decide(chromium, "edit")
    assert chromium.find_element(By.ID, "message").text.startswith("Edited")
    diff = chromium.find_element(By.ID, "diff").text
    assert '+{"to": "pricing-team@example.com", "subject": "prices"}' in diff
    assert chromium.find_element(By.ID, "version").text == str(a["version"] + 1)
    _decide(chromium, "approve")
    after = run.store.get(a["id"])
    assert after["status"] == "approved" and after["body"] == b'{"to": "pricing-team@example.com", "subject": "prices"}'
    assert ["Authorization", "[redacted]"] in [list(h) for h in after["headers"]]


def test_reject_on_the_page_keeps_the_reason(run, server, chromium):
    a = run.pending()
    chromium.get(server.base + a["review_path"])
    _decide(chromium, "reject", reason="not today")
    assert chromium.find_element(By.ID, "message").text.startswith("Rejected")
    after = run.store.get(a["id"])
    assert (after["status"], after["reason"], after["decided_by"]) == ("rejected", "not today", "bob (web)")


def test_a_page_answered_elsewhere_meanwhile_is_refused_as_stale_with_the_why(run, server, chromium, store_url):
    a = run.pending()
    chromium.get(server.base + a["review_path"])
    assert cli("reject", a["id"], "--reason", "from the CLI", "--state", store_url).returncode == 0
    _decide(chromium, "approve")
    msg = chromium.find_element(By.ID, "message").text
    assert msg.startswith("refused as stale (decided)") and "rejected by alice" in msg, msg
    assert chromium.find_element(By.ID, "status").text == "rejected"
    assert chromium.find_elements(By.ID, "approve") == []  # a decided approval has no forms


HOSTILE = '{"to": "</pre><script>document.title=\\"owned\\"</script><img src=x onerror=alert(1)>"}'


@pytest.mark.parametrize("run", [HOSTILE], indirect=True)
def test_a_hostile_body_is_shown_as_text_and_runs_nothing(run, server, chromium):
    a = run.pending()
    chromium.get(server.base + a["review_path"])
    assert chromium.title == f"gatewrap approval {a['id']}"
    assert chromium.find_elements(By.TAG_NAME, "script") == [] and chromium.find_elements(By.TAG_NAME, "img") == []
    assert "<script>document.title" in chromium.find_element(By.TAG_NAME, "pre").text
    assert "&lt;script&gt;" in chromium.page_source


def _post(server, path, data, headers=None):
    return requests.post(server.base + path, data=data, headers=headers or {}, allow_redirects=False, timeout=30)


def test_forms_without_the_csrf_token_or_from_another_site_are_refused(run, server):
    a = run.pending()
    page = requests.get(server.base + a["review_path"], timeout=30)
    assert page.status_code == 200 and page.headers["Referrer-Policy"] == "same-origin"
    assert "script-src" not in page.headers["Content-Security-Policy"]  # default-src 'none': no script at all
    good = {"csrf": server.csrf(a["token"]), "version": str(a["version"]), "digest": a["digest"], "name": "mallory"}
    path = a["review_path"] + "/approve"
    cases = [
        ("no CSRF token", {k: v for k, v in good.items() if k != "csrf"}, {}),
        ("a wrong CSRF token", {**good, "csrf": "0" * 64}, {}),
        ("another approval's CSRF token", {**good, "csrf": server.csrf("x" * 43)}, {}),
        ("a form from another origin", good, {"Origin": "http://evil.test"}),
        ("a cross-site fetch", good, {"Sec-Fetch-Site": "cross-site"}),
    ]
    for case, data, headers in cases:
        r = _post(server, path, data, headers)
        assert r.status_code == 403, case
    r = requests.post(server.base + path, json=good, allow_redirects=False, timeout=30)
    assert r.status_code == 403, "a JSON body is not a form of this page"
    assert run.store.get(a["id"])["status"] == "pending"
    # a wrong approval token, a wrong list key: no such page
    assert _post(server, "/a/" + "A" * 43 + "/approve", {**good, "csrf": server.csrf("A" * 43)}).status_code == 404
    assert requests.get(server.base + "/a/" + a["token"][:-1] + "B", timeout=30).status_code == 404
    assert requests.get(server.base + "/l/wrong", timeout=30).status_code == 404
    # and the right form goes through
    assert _post(server, path, good).status_code == 303
    assert run.store.get(a["id"])["decided_by"] == "mallory (web)"
