"""The review server's refusals that come before the store is read (so they hold whatever the
store holds): a form without the CSRF token, with a wrong one, from another site, of another
content type; a wrong list key. The server runs with no store at all: reaching it would fail."""

from __future__ import annotations

import threading

import pytest
import requests

from gatewrap.approvals.web import ReviewServer, is_loopback, parse_listen

from .held import cli


@pytest.fixture
def server():
    s = ReviewServer(None, ("127.0.0.1", 0))
    t = threading.Thread(target=s.serve_forever, daemon=True)
    t.start()
    yield s
    s.shutdown()
    s.server_close()


TOKEN = "t" * 43


@pytest.mark.parametrize("case, data, headers, status", [
    ("no CSRF token", {"name": "m", "version": "1", "digest": "d"}, {}, 403),
    ("a wrong CSRF token", {"csrf": "0" * 64, "name": "m"}, {}, 403),
    ("a form from another origin", "OK", {"Origin": "http://evil.test"}, 403),
    ("a cross-site fetch", "OK", {"Sec-Fetch-Site": "cross-site"}, 403),
    ("Origin: null without Sec-Fetch-Site", "OK", {"Origin": "null"}, 403),
    ("Origin: null from a sandboxed frame of another site", "OK", {"Origin": "null", "Sec-Fetch-Site": "cross-site"},
     403),
    ("Origin: null from a page the user opened", "OK", {"Origin": "null", "Sec-Fetch-Site": "none"}, 403),
    ("plain text, not a form", "OK", {"Content-Type": "text/plain"}, 403),
])
def test_a_form_that_is_not_this_pages_is_refused_before_the_store_is_read(server, case, data, headers, status):
    if data == "OK":
        data = {"csrf": server.csrf(TOKEN), "name": "m", "version": "1", "digest": "d"}
    if headers.get("Content-Type") == "text/plain":
        data = "&".join(f"{k}={v}" for k, v in data.items())
    r = requests.post(f"{server.base}/a/{TOKEN}/approve", data=data, headers=headers, allow_redirects=False,
                      timeout=30)
    assert r.status_code == status, case
    assert r.headers["Cache-Control"] == "no-store"
    assert r.headers["Referrer-Policy"] == "no-referrer"


def test_every_page_is_sent_with_referrer_policy_no_referrer(server):
    """The URL holds a secret (the list key, an approval's token): no Referer may carry it,
    not even to this origin (a logging proxy in front of --allow-remote would keep it)."""
    for path in ("/", "/l/wrong", "/static/x"):
        r = requests.get(server.base + path, timeout=30)
        assert r.headers["Referrer-Policy"] == "no-referrer", path


def test_the_list_needs_its_key_and_nothing_else_is_served(server):
    for path in ("/l/wrong", "/l/", "/a", "/static/x", "/.." + "/etc/passwd"):
        assert requests.get(server.base + path, timeout=30).status_code == 404, path
    assert requests.post(server.base + "/l/" + server.list_key, timeout=30).status_code == 404


def test_the_landing_page_says_where_to_go_in_chromium(server, chromium, artifacts):
    chromium.get(server.base + "/")
    assert "gatewrap approvals serve" in chromium.find_element("tag name", "body").text


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:8377", ("127.0.0.1", 8377)), ("[::1]:9000", ("::1", 9000)), ("localhost:1", ("localhost", 1)),
])
def test_listen_addresses(text, expected):
    assert parse_listen(text) == expected


def test_a_non_loopback_address_is_refused_without_allow_remote():
    assert not is_loopback("0.0.0.0") and not is_loopback("192.0.2.1") and is_loopback("127.0.0.2")
    r = cli("serve", "--listen", "0.0.0.0:8377")
    assert r.returncode == 125 and "not a loopback address" in r.stderr and "--allow-remote" in r.stderr
