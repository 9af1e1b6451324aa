"""Trust in the gate's CA for Java and wget (gatewrap.client_trust): Java's PKCS#12 trust
store is made once per (CA, cacerts) in the CA folder and holds both; wget gets a staged
wgetrc unless the user has one of their own. The kernel side is tests/clients/test_matrix_inspected.py."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from gatewrap import client_trust, shims


def _make_ca(folder, name="ca.crt"):
    """A self-signed CA certificate (openssl req(1)) at ``folder/name``."""
    folder.mkdir(exist_ok=True)
    cert = folder / name
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                    "-keyout", str(folder / "key.pem"), "-out", str(cert), "-days", "1", "-subj", "/CN=gw test CA"],
                   check=True, capture_output=True, timeout=30)
    return cert


def _aliases(store: str) -> str:
    p = subprocess.run(["keytool", "-list", "-keystore", store, "-storetype", "PKCS12",
                        "-storepass", client_trust.STORE_PASSWORD], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_javas_trust_store_holds_the_jdks_roots_and_the_ca_and_is_made_once_per_ca(tmp_path):
    assert client_trust.find_keytool(), "no keytool: run sudo scripts/setup.sh test-deps"
    ca = _make_ca(tmp_path / "ca")
    store, note = client_trust.java_truststore(str(ca))
    assert note is None and os.path.dirname(store) == str(tmp_path / "ca"), note
    assert oct(os.stat(store).st_mode & 0o777) == "0o644"
    listing = _aliases(store)
    assert "gatewrap-ca" in listing and int(listing.split("contains ")[1].split()[0]) > 100, listing
    made = os.stat(store).st_mtime_ns
    again, _ = client_trust.java_truststore(str(ca))
    assert again == store and os.stat(store).st_mtime_ns == made, "the cached store is reused"
    shutil.rmtree(tmp_path / "ca")
    ca = _make_ca(tmp_path / "ca")
    store_b, _ = client_trust.java_truststore(str(ca))
    left = sorted(p for p in os.listdir(tmp_path / "ca") if p.endswith(".p12"))
    assert store_b != store and left == [os.path.basename(store_b)], "a new CA makes a new store, the old one goes"


@pytest.mark.parametrize("user,kept", [({}, None), ({"WGETRC": "/home/me/rc"}, "your WGETRC is kept"),
                                      ({"HOME": "dotfile"}, ".wgetrc is kept")],
                         ids=["without a wgetrc of the user's, one is staged",
                              "the user's WGETRC is kept, and said",
                              "the user's ~/.wgetrc is kept (WGETRC would hide it), and said"])
def test_wget_gets_a_staged_wgetrc_unless_the_user_has_one(tmp_path, user, kept):
    if user.get("HOME") == "dotfile":
        (tmp_path / ".wgetrc").write_text("tries = 3\n")
        user = {"HOME": str(tmp_path)}
    stage, note = client_trust.wgetrc_needed(user)
    assert (stage, note is None) == (kept is None, kept is None)
    assert kept is None or kept in note, note


def test_staging_an_inspecting_run_points_java_and_wget_at_the_ca(tmp_path):
    ca = _make_ca(tmp_path / "ca")
    env = {"JAVA_TOOL_OPTIONS": "-Dhttps.proxyHost=127.0.0.1", "HOME": str(tmp_path)}
    staged, mounts, _, notes = shims.stage_run("t1", False, str(ca), env)
    try:
        assert notes == [] and mounts == []
        store = os.path.join(staged, shims.TRUSTSTORE_FILE)
        assert env["JAVA_TOOL_OPTIONS"] == ("-Dhttps.proxyHost=127.0.0.1 " + client_trust.java_options(store))
        assert "gatewrap-ca" in _aliases(store)
        assert env["WGETRC"] == os.path.join(staged, shims.WGETRC_FILE)
        assert open(env["WGETRC"]).read().endswith(f"ca_certificate = {env['SSL_CERT_FILE']}\n")
    finally:
        shutil.rmtree(staged)
