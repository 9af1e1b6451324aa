"""What a human reads and writes: the request as `show` prints it, the edit file, grant
specs, durations, the store URL's resolution. Tables of (case, input, expected)."""

from __future__ import annotations

import pytest

from gatewrap.approvals import decide, editor, render, state
from gatewrap.errors import GatewrapError

from .test_notify import approval


def test_show_prints_the_exact_request_with_credentials_redacted():
    out = render.show(approval())
    assert "  POST /v3/send HTTP/1.1\n  Host: mail.test\n  Content-Type: application/json\n" \
           "  Authorization: [redacted]\n  \n  {\"to\": \"customer@example.com\"" in out
    assert "version:   1" in out and "digest:    " + "1" * 64 in out


def test_show_escapes_what_could_drive_the_terminal():
    out = render.show(approval(body=b"ok\x1b[2J\xff\n" + "next\u202eline".encode(), url="https://mail.test/\x07"))
    assert "\x1b" not in out and "\x07" not in out and "\u202e" not in out
    assert "ok\\x1b[2J\\xff" in out and "next\\u202eline" in out


def test_show_after_an_edit_prints_the_diff_from_the_agents_request():
    a = approval(edited=1, body=b'{"to": "me@example.com"}', orig_body=b'{"to": "all@example.com"}',
                 orig_headers=[["Content-Type", "application/json"], ["Authorization", "[redacted]"]],
                 headers=[["Content-Type", "application/json"], ["Authorization", "[redacted]"], ["X-Note", "1"]])
    out = render.show(a)
    assert "edited: the diff from the agent's request:" in out
    d = render.diff(a)
    assert d[:2] == ["--- agent", "+++ edited"]
    assert '-{"to": "all@example.com"}' in d and '+{"to": "me@example.com"}' in d and "+X-Note: 1" in d


def test_the_edit_file_shows_fixed_headers_as_comments_and_gives_them_back_unchanged():
    a = approval(headers=[["Content-Type", "application/json"], ["Authorization", "[redacted]"],
                          ["X-Session-Id", "[redacted]"], ["Idempotency-Key", "k1"]])
    text = editor.to_text(a)
    assert "# fixed: Authorization: [redacted]" in text and "# fixed: Idempotency-Key: k1" in text
    assert "\nContent-Type: application/json\n\n" in text
    edited = text.replace("customer@example.com", "me@example.com") + "\n"  # the editor's own newline
    headers, body = editor.from_text(edited.replace("Content-Type: application/json",
                                                    "Content-Type: application/json\nX-Reviewed: yes"), a)
    assert headers == [("Content-Type", "application/json"), ("X-Reviewed", "yes"), ("Authorization", "[redacted]"),
                       ("X-Session-Id", "[redacted]"), ("Idempotency-Key", "k1")]
    assert body == b'{"to": "me@example.com", "subject": "hello"}'


def test_an_edit_of_the_body_alone_gives_the_headers_back_in_their_order():
    """Fixed and editable headers interleaved (as urllib sends them): an unchanged head comes
    back as it was, so the diff shows the body's change and nothing else."""
    a = approval(headers=[["accept-encoding", "identity"], ["content-length", "52"], ["host", "mail.test"],
                          ["user-agent", "Python-urllib/3.11"], ["content-type", "application/json"],
                          ["authorization", "[redacted]"], ["connection", "close"]])
    text = editor.to_text(a).replace("customer@example.com", "me@example.com")
    headers, _ = editor.from_text(text, a)
    assert headers == [tuple(h) for h in a["headers"]]
    headers, _ = editor.from_text(text.replace("user-agent: Python-urllib/3.11\n", ""), a)
    assert headers == [("accept-encoding", "identity"), ("content-length", "52"), ("host", "mail.test"),
                       ("content-type", "application/json"), ("authorization", "[redacted]"), ("connection", "close")]


@pytest.mark.parametrize("case, head, error", [
    ("a credential cannot be added", "Authorization: Bearer x", "Authorization cannot be edited"),
    ("Host cannot be changed", "Host: evil.test", "Host cannot be edited"),
    ("a line without a colon is not a header", "not a header", "is not a header"),
    ("a name with a space is not a token", "Bad Name: 1", "is not a header"),
])
def test_an_edit_file_with_a_bad_header_is_refused(case, head, error):
    with pytest.raises(ValueError, match=error):
        editor.from_text(f"{head}\n\nbody", approval())


def test_an_emptied_edit_file_changes_nothing():
    assert editor.from_text("  \n", approval()) is None


def test_a_body_that_cannot_be_edited_says_so():
    with pytest.raises(GatewrapError, match="cannot be edited"):
        editor.to_text(approval(body_truncated=True, body_len=10**6))


def test_a_binary_body_is_shown_escaped_and_comes_back_as_it_was():
    text = editor.to_text(approval(body=b"\xff\xfe"))
    assert text.endswith("\n\n\\xff\\xfe") and editor.from_text(text, approval(body=b"\xff\xfe"))[1] == b"\xff\xfe"


@pytest.mark.parametrize("case, spec, duration, expected", [
    ("a method, host and prefix", "POST mail.test/v3/", "30m",
     {"method": "POST", "host": "mail.test", "path_prefix": "/v3/", "seconds": 1800}),
    ("no path means the whole host", "POST mail.test", "2h",
     {"method": "POST", "host": "mail.test", "path_prefix": "/", "seconds": 7200}),
])
def test_a_grant_spec_becomes_the_stores_grant(case, spec, duration, expected):
    assert decide.parse_grant(spec, duration, approval()) == expected


@pytest.mark.parametrize("case, spec, duration, error", [
    ("another host is wider than the request", "POST evil.test/", "30m", "own host only"),
    ("a suffix of the host is another host", "POST test/", "30m", "own host only"),
    ("a lower-case method is not a method", "post mail.test/", "30m", "give 'METHOD"),
    ("a duration needs a unit", "POST mail.test/", "30", "not a duration"),
    ("a zero duration is none", "POST mail.test/", "0m", "not a duration"),
])
def test_a_bad_grant_is_refused_with_the_why(case, spec, duration, error):
    with pytest.raises(ValueError, match=error):
        decide.parse_grant(spec, duration, approval())


def test_a_grant_on_a_port_names_the_port():
    a = approval(url="http://mail.test:8025/send")
    assert decide.parse_grant("POST mail.test:8025/", "1h", a)["host"] == "mail.test:8025"
    with pytest.raises(ValueError, match=r"own host only \(mail.test:8025\)"):
        decide.parse_grant("POST mail.test/", "1h", a)


def test_a_grant_on_a_rule_with_grants_false_is_forbidden_whatever_its_spec():
    for spec in ("POST mail.test/v3/send", "POST evil.test/"):
        with pytest.raises(decide.GrantForbidden, match=r"forbids grants \(grants = false\)"):
            decide.parse_grant(spec, "30m", approval(grants_allowed=0))


@pytest.mark.parametrize("case, over, expected", [
    ("the request's own method, host and path", {}, "POST mail.test/v3/send"),
    ("without the query", {"url": "https://mail.test/v3/send?to=all"}, "POST mail.test/v3/send"),
    ("a port off the default is named", {"url": "http://mail.test:8025/send"}, "POST mail.test:8025/send"),
    ("a tunnel is its host and port", {"method": "CONNECT", "url": "mail.test:443"}, "CONNECT mail.test:443"),
])
def test_the_suggested_grant_is_the_narrowest_that_covers_the_request_and_parses(case, over, expected):
    a = approval(**over)
    assert decide.suggested_grant(a) == expected
    decide.parse_grant(expected, "30m", a)  # what the page starts with is a grant the check takes


@pytest.mark.parametrize("case, flag, env, config, expected", [
    ("the flag wins", "sqlite:/a.db", "sqlite:/b.db", {"state": {"url": "sqlite:/c.db"}}, "sqlite:/a.db"),
    ("then the environment", None, "sqlite:/b.db", {"state": {"url": "sqlite:/c.db"}}, "sqlite:/b.db"),
    ("then the config file", None, None, {"state": {"url": "sqlite:/c.db"}}, "sqlite:/c.db"),
    ("then the default", None, None, {}, "sqlite:/var/lib/gatewrap/state.db"),
])
def test_the_store_url_is_resolved_in_order(monkeypatch, case, flag, env, config, expected):
    if env:
        monkeypatch.setenv("GATEWRAP_STATE", env)
    else:
        monkeypatch.delenv("GATEWRAP_STATE", raising=False)
    assert state.resolve_url(flag, config) == expected
    assert state.explicit_url(flag, config) == (None if case == "then the default" else expected)


@pytest.mark.parametrize("case, text, error", [
    ("an unknown table", "[stat]\nurl = 'x'\n", r"unknown table \[stat\]"),
    ("an unknown key", "[state]\nuri = 'x'\n", "unknown key 'uri'"),
    ("not TOML", "[state\n", "not valid TOML"),
])
def test_a_bad_config_file_is_refused_naming_what(tmp_path, case, text, error):
    p = tmp_path / "config.toml"
    p.write_text(text)
    with pytest.raises(GatewrapError, match=error):
        state.load_config(str(p))


def test_a_password_in_a_store_url_is_not_shown():
    assert state._redact("postgresql://gw:s3cret@db:5432/x") == "postgresql://gw:***@db:5432/x"
    assert state._redact("sqlite:/var/lib/gatewrap/state.db") == "sqlite:/var/lib/gatewrap/state.db"


ANSWER_HINT_CASES = [
    # (case, SUDO_UID, store URL, expected prefix, expected suffix)
    ("a user through sudo, the default store", "1000", "sqlite:/var/lib/gatewrap/state.db",
     "sudo gatewrap approvals", ""),
    ("root at a root shell, the default store", None, "sqlite:/var/lib/gatewrap/state.db", "gatewrap approvals", ""),
    ("sudo from root is still root", "0", "/var/lib/gatewrap/state.db", "gatewrap approvals", ""),
    ("a store of its own is named, quoted for a shell", "1000", "sqlite:/srv/gw dir/state.db",
     "sudo gatewrap approvals", " --state 'sqlite:/srv/gw dir/state.db'"),
    ("a PostgreSQL store is named with its password redacted", "1000", "postgresql://gw:hunter2@db:5432/gw",
     "sudo gatewrap approvals", " --state 'postgresql://gw:***@db:5432/gw'"),
]


@pytest.mark.parametrize("case,sudo_uid,url,prefix,suffix", ANSWER_HINT_CASES, ids=[c[0] for c in ANSWER_HINT_CASES])
def test_the_answer_hint_says_sudo_to_a_user_and_names_a_store_the_command_would_not_find(
        case, sudo_uid, url, prefix, suffix, monkeypatch, tmp_path):
    monkeypatch.setattr(state, "DEFAULT_CONFIG", str(tmp_path / "none.toml"))
    environ = {"GATEWRAP_STATE": url} if sudo_uid is None else {"SUDO_UID": sudo_uid, "GATEWRAP_STATE": url}
    assert state.answer_hint(url, environ) == (prefix, suffix), case


def test_the_answer_hint_leaves_out_a_store_the_config_file_names(monkeypatch, tmp_path):
    config = tmp_path / "config.toml"
    config.write_text('[state]\nurl = "sqlite:/srv/gw/state.db"\n')
    monkeypatch.setattr(state, "DEFAULT_CONFIG", str(config))
    assert state.answer_hint("/srv/gw/state.db", {"SUDO_UID": "1000"}) == ("sudo gatewrap approvals", "")
