"""The review pages (`gatewrap approvals serve`) in headless Chromium, on approvals made through
the store's API as the gate makes them (tests/approvals/test_cli.py has the run end to end):
approve, edit then approve, reject, a stale decision told why, hostile bodies escaped; a grant
made on the page, through a real run (the next matching request passes, another path is asked),
and refused when stale, too wide or forbidden by the rule; and requests a browser of another
site could make (no CSRF token, a wrong one, a foreign Origin, a wrong approval token) refused.
SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import pytest
import requests
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

from gatewrap.approvals.web import ReviewServer

from . import held
from .held import cli

RUN = "gw-00000000b1"


class Asked:
    """One pending approval made with ``ApprovalStore.ask``."""

    def __init__(self, store, body: str, grants_allowed: bool = True):
        store.start_run(RUN)
        self.store = store
        self.a, _ = store.ask(RUN, rule="policy.toml:rule[1]", method="POST", url="http://allowed.test/echo",
                              headers=[("Content-Type", "application/json"), ("Authorization", "Bearer sk-secret-1")],
                              body=body.encode(), grants_allowed=grants_allowed)

    def pending(self):
        return self.a


@pytest.fixture
def run(store, request):
    return Asked(store, getattr(request, "param", held.BODY))


@pytest.fixture
def audit_log(tmp_path):
    """The path of an audit log (written by the tests that need records in it)."""
    return str(tmp_path / "log" / "audit.jsonl")


@pytest.fixture
def server(store_url, audit_log):
    from gatewrap import _gate_core as core

    s = ReviewServer(core.ApprovalStore(store_url), ("127.0.0.1", 0), audit_log=audit_log)
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


def staleness_of(element):
    """A wait condition: ``element``'s page has been replaced. As selenium's own, but a
    chromedriver that answers for a replaced node with "Node with given id does not belong
    to the document" (an unknown error, not a stale element: seen with chromium 156) counts
    as replaced too."""
    def replaced(_driver) -> bool:
        try:
            element.is_enabled()
            return False
        except StaleElementReferenceException:
            return True
        except WebDriverException as e:
            if "does not belong to the document" in (e.msg or ""):
                return True
            raise
    return replaced


def _decide(browser, form: str, name: str = "bob", **fields) -> None:
    """Type ``name`` in the page's one name field, fill ``fields`` of the ``form`` part
    (approve, grant, reject, edit) and press its button."""
    f = browser.find_element(By.ID, form)
    browser.find_element(By.ID, "name").send_keys(name)
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
    assert cli("reject", a["id"], "--reason", "from the CLI", "--yes", "--state", store_url).returncode == 0
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


#: The grant test's agent: a POST to each path given, in turn; then {path: status} as one line
#: (a path twice: its second status under the same key with a "#2").
GRANT_AGENT = """\
import json, sys, urllib.error, urllib.request
out = {}
for path in sys.argv[1:]:
    req = urllib.request.Request("http://allowed.test" + path, data=b'{"n": 1}', method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=600) as r:
            status = r.status
    except urllib.error.HTTPError as e:
        status = e.code
    out[path if path not in out else path + "#2"] = status
print(json.dumps(out), flush=True)
"""


@pytest.mark.kernel
def test_a_grant_on_the_page_lets_the_next_matching_request_through_and_not_another_path(
        net, tmp_path, store_url, server, chromium):
    net.clear_logs()
    run = held.start(net, tmp_path, store_url, agent=GRANT_AGENT, agent_args=("/echo/a", "/echo/a", "/echo/b"))
    try:
        a = run.pending()
        chromium.get(server.base + a["review_path"])
        form = chromium.find_element(By.ID, "grant")
        assert form.find_element(By.NAME, "grant").get_property("value") == "POST allowed.test/echo/a"
        assert form.find_element(By.NAME, "for").get_property("value") == "30m"
        _decide(chromium, "grant", **{"for": "10m"})
        assert chromium.find_element(By.ID, "message").text.startswith("Approved with a grant")
        (g,) = run.store.grants(run_id=a["run_id"])
        assert (g["method"], g["host"], g["path_prefix"], g["created_by"]) == \
            ("POST", "allowed.test", "/echo/a", "bob (web)")
        assert 590 <= g["expires"] - g["created"] <= 610
        assert g["id"] in chromium.find_element(By.ID, "granted").text  # the page's facts name it now
        # the same request again passes by the grant; /echo/b (under the same ask rule) is asked
        other = run.pending(other_than=a["id"])
        assert other["url"] == "http://allowed.test/echo/b"
        assert len(net.access_entries(method="POST", path="/echo/a")) == 2
        assert net.access_entries(method="POST", path="/echo/b") == []
        run.store.decide(other["id"], version=other["version"], digest=other["digest"], verdict="reject",
                         by="tester", reason="not granted")
        out = run.finish()
        # 404: the fake internet's own answer (it serves /echo, not /echo/a), so both went upstream;
        # 403: the gate's, with the human's reason
        assert out["agent"] == {"/echo/a": 404, "/echo/a#2": 404, "/echo/b": 403}, out
        assert run.store.grants(run_id=a["run_id"], active=False)[0]["uses"] == 1
        assert "2 approvals asked (1 approved, 1 rejected, 1 granted for later), 1 answered by grants" in out["stderr"], out["stderr"]
    finally:
        run.stop()


def _grant_page(chromium, server, a, spec: str | None = None) -> None:
    chromium.get(server.base + a["review_path"])
    fields = {"grant": spec} if spec else {}
    _decide(chromium, "grant", **fields)


def test_a_grant_wider_than_the_requests_host_is_refused_on_the_page(run, server, chromium):
    a = run.pending()
    _grant_page(chromium, server, a, "POST evil.test/")
    msg = chromium.find_element(By.ID, "message").text
    assert "own host only (allowed.test)" in msg, msg
    assert chromium.find_element(By.ID, "status").text == "pending"
    assert run.store.get(a["id"])["status"] == "pending" and run.store.grants(active=False) == []


def test_a_grant_on_a_page_answered_elsewhere_meanwhile_is_refused_as_stale(run, server, chromium, store_url):
    a = run.pending()
    chromium.get(server.base + a["review_path"])
    assert cli("reject", a["id"], "--reason", "from the CLI", "--yes", "--state", store_url).returncode == 0
    _decide(chromium, "grant")
    msg = chromium.find_element(By.ID, "message").text
    assert msg.startswith("refused as stale (decided)") and "rejected by alice" in msg, msg
    assert chromium.find_elements(By.ID, "grant") == [] and run.store.grants(active=False) == []


@pytest.fixture
def no_grants(store):
    return Asked(store, held.BODY, grants_allowed=False)


def test_a_rule_with_grants_false_has_no_grant_form_and_a_grant_posted_anyway_is_refused(no_grants, server,
                                                                                         chromium):
    a = no_grants.pending()
    chromium.get(server.base + a["review_path"])
    assert chromium.find_elements(By.ID, "grant") == []
    assert "forbids grants" in chromium.find_element(By.ID, "no-grant").text
    assert chromium.find_elements(By.ID, "approve") != []  # approving it alone still works
    good = {"csrf": server.csrf(a["token"]), "version": str(a["version"]), "digest": a["digest"], "name": "mallory",
            "grant": "POST allowed.test/echo", "for": "30m"}
    r = _post(server, a["review_path"] + "/grant", good)
    assert r.status_code == 403 and "forbids grants (grants = false)" in r.text
    assert no_grants.store.get(a["id"])["status"] == "pending" and no_grants.store.grants(active=False) == []


def _post(server, path, data, headers=None):
    return requests.post(server.base + path, data=data, headers=headers or {}, allow_redirects=False, timeout=30)


def test_forms_without_the_csrf_token_or_from_another_site_are_refused(run, server):
    a = run.pending()
    page = requests.get(server.base + a["review_path"], timeout=30)
    assert page.status_code == 200 and page.headers["Referrer-Policy"] == "no-referrer"
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
    # and the right form goes through, also with the Origin: null that browsers send under
    # Referrer-Policy: no-referrer, if Sec-Fetch-Site says it came from this origin
    r = _post(server, path, good, {"Origin": "null", "Sec-Fetch-Site": "same-origin"})
    assert r.status_code == 303 and r.headers["Referrer-Policy"] == "no-referrer"
    assert run.store.get(a["id"])["decided_by"] == "mallory (web)"
    assert requests.get(f"{server.base}/l/{server.list_key}", timeout=30).headers["Referrer-Policy"] == "no-referrer"


def _write_run(audit_log: str, a: dict, before: int, after: int = 2) -> list[str]:
    """Records of run ``RUN`` as gatewrap and its gate write them: its ``run_start`` (a user's
    command), ``before`` requests, the approval's ``approval_asked``, ``after`` requests more;
    returns the targets of the requests before, in order."""
    from gatewrap import _gate_core as core

    log = core.AuditLog(audit_log, key=None)
    log.write({"run": RUN, "event": "run_start", "argv": ["python3", "agent.py", "--task", "send prices"],
               "uid": 65534, "cgroup_id": 1})
    targets = [f"http://allowed.test/step/{i}" for i in range(before)]
    for t in targets:
        log.write({"run": RUN, "event": "request", "decision": "allowed", "method": "GET", "target": t,
                   "dst_host": "allowed.test", "dst_port": 80, "proto": "http", "status": 200,
                   "client_pid": 42, "client_comm": "python3"})
    log.write({"run": RUN, "event": "approval_asked", "approval": a["id"], "rule": a["rule"], "method": a["method"],
               "url": a["url"], "digest": a["digest"], "version": 1, "deadline": "2030-01-01T00:00:00Z"})
    for i in range(after):
        log.write({"run": RUN, "event": "request", "decision": "allowed", "method": "GET",
                   "target": f"http://allowed.test/later/{i}", "dst_host": "allowed.test", "dst_port": 80,
                   "proto": "http", "status": 200})
    return targets


def test_the_page_heads_with_the_runs_user_and_command_the_full_url_and_the_time_left(run, server, audit_log):
    a = run.pending()
    _write_run(audit_log, a, before=1)
    page = requests.get(server.base + a["review_path"], timeout=30).text
    assert "Run gw-00000000b1: nobody's <code id=\"command\">python3 agent.py --task &#x27;send prices&#x27;</code> " \
           "asks to send" in page
    assert '<h1 id="headline">POST http://allowed.test/echo</h1>' in page
    left = page.split('id="time-left">')[1].split("</p>")[0]
    assert left.startswith("Time left: <b>") and (" min " in left or " h " in left) and "then it is denied" in left


def test_a_json_body_is_shown_indented_and_the_raw_request_is_one_click_away(run, server, chromium):
    a = run.pending()
    chromium.get(server.base + a["review_path"])
    shown = chromium.find_element(By.ID, "request").text
    assert shown.endswith('{\n  "to": "all-customers@example.com",\n  "subject": "prices"\n}'), shown
    raw = chromium.find_element(By.ID, "raw")
    assert not chromium.find_element(By.ID, "raw-request").is_displayed()
    raw.find_element(By.TAG_NAME, "summary").click()
    assert chromium.find_element(By.ID, "raw-request").text.endswith(held.BODY)


def test_the_page_shows_the_runs_last_20_records_before_it_asked(run, server, audit_log):
    a = run.pending()
    targets = _write_run(audit_log, a, before=25)
    page = requests.get(server.base + a["review_path"], timeout=30).text
    history = page.split('<pre id="history">')[1].split("</pre>")[0]
    rows = history.split("\n")
    assert len(rows) == 20 and "/later/" not in history and "run_start" not in history
    paths = [t.removeprefix("http://allowed.test") for t in targets]
    assert [f"allowed.test:80{p} " in history for p in paths] == [False] * 5 + [True] * 20
    assert rows[-1].endswith(f"request       allowed   http allowed.test:80{paths[-1]:<14} GET -&gt; 200; pid 42 python3")


def test_the_page_says_when_the_audit_log_has_no_records_of_the_run(run, server):
    a = run.pending()
    page = requests.get(server.base + a["review_path"], timeout=30).text
    assert "does not exist (serve --log PATH names the run&#x27;s)" in page
    assert 'Run gw-00000000b1: the agent asks to send' in page


def test_the_page_asks_the_name_once_and_enter_in_it_decides_nothing(run, server, chromium):
    a = run.pending()
    chromium.get(server.base + a["review_path"])
    assert len(chromium.find_elements(By.NAME, "name")) == 1
    chromium.find_element(By.ID, "name").send_keys("bob\n")
    assert run.store.get(a["id"])["status"] == "pending"
    assert chromium.current_url == server.base + a["review_path"]
