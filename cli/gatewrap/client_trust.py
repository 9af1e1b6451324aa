"""Trust in the gate's CA for the clients that read no CA variable, when the run TLS-inspects.

* **Java** reads no PEM file from the environment: its default trust store is the JDK's
  ``lib/security/cacerts`` (JSSE Reference Guide, "The cacerts Certificates File"). gatewrap
  makes a PKCS#12 trust store of that file's certificates plus the gate's CA with the JDK's
  ``keytool`` (keytool(1): ``-importkeystore``, ``-importcert``), keeps it in the CA folder
  (``java-truststore-<key>.p12``, ``<key>`` a digest of the CA certificate and the cacerts
  file, so it is rebuilt when either changes) and points the JVM at it through
  ``JAVA_TOOL_OPTIONS`` (``-Djavax.net.ssl.trustStore=...``; JSSE's system properties).
* **wget** built with GnuTLS (Debian's) ignores ``SSL_CERT_FILE``: it trusts GnuTLS's compiled-in
  system roots, or the ``ca_certificate`` of a wgetrc (wget(1), "Startup File"). gatewrap
  stages a wgetrc saying ``ca_certificate = <bundle>`` and sets ``WGETRC``, unless the user has
  a ``WGETRC`` or a ``~/.wgetrc`` of their own (which ``WGETRC`` would hide), and then says so.
"""

from __future__ import annotations

import glob
import hashlib
import os
import shutil
import subprocess
import tempfile

#: The trust store's password. Not a secret: the store holds public certificates only, and
#: Java asks for a password to check its integrity ("changeit" is the JDK's own for cacerts).
STORE_PASSWORD = "changeit"
STORE_PREFIX = "java-truststore-"
WGETRC_FILE = "wgetrc"
#: How long keytool may take (each run of it starts a JVM), seconds.
KEYTOOL_TIMEOUT_S = 120
#: Where keytool is looked for, and the whole environment it runs with (root runs it: the
#: user's JAVA_TOOL_OPTIONS or _JAVA_OPTIONS could load an agent into its JVM).
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def find_keytool() -> str | None:
    """The system JDK's keytool, on :data:`SYSTEM_PATH` only, or None. Never the user's
    ``PATH`` or ``JAVA_HOME``: gatewrap runs it as root (any JDK's roots will do, the store
    is read by every JVM from 8 on)."""
    return shutil.which("keytool", path=SYSTEM_PATH)


def jdk_cacerts(keytool: str) -> str | None:
    """The default trust store of ``keytool``'s JDK (``<java.home>/lib/security/cacerts``,
    followed through Debian's symlink to /etc/ssl/certs/java/cacerts), or None."""
    home = os.path.dirname(os.path.dirname(os.path.realpath(keytool)))
    for rel in ("lib/security/cacerts", "jre/lib/security/cacerts"):
        path = os.path.join(home, rel)
        if os.path.isfile(path):
            return path
    return None


def _keytool(keytool: str, *args: str) -> None:
    p = subprocess.run([keytool, *args, "-noprompt"], capture_output=True, text=True, timeout=KEYTOOL_TIMEOUT_S,
                       env={"PATH": SYSTEM_PATH, "LC_ALL": "C"})
    if p.returncode != 0:
        raise RuntimeError((p.stdout + p.stderr).strip().splitlines()[-1] if (p.stdout + p.stderr).strip()
                           else f"exit status {p.returncode}")


def java_truststore(ca_cert: str) -> tuple[str | None, str | None]:
    """Return (the path of the PKCS#12 trust store for ``ca_cert``, None) or (None, a note
    for stderr saying why there is none: no keytool, no cacerts, or keytool's error).

    The store is made once per (CA certificate, cacerts) pair in the CA's folder (``ca_cert``'s,
    which is root's and outside ``private/``), atomically (built beside it, then renamed), mode
    0644; stores of an earlier pair are removed.
    """
    keytool = find_keytool()
    if keytool is None:
        return None, ("gatewrap: note: no keytool (a JDK's) in /usr/bin or the like, so Java will not trust "
                      "the gate's CA under TLS inspection; install a JDK, or give Java a trust store yourself")
    cacerts = jdk_cacerts(keytool)
    if cacerts is None:
        return None, f"gatewrap: note: {keytool}'s JDK has no lib/security/cacerts, so Java will not trust the gate's CA"
    digest = hashlib.sha256()
    for path in (ca_cert, cacerts):
        with open(path, "rb") as f:
            digest.update(hashlib.sha256(f.read()).digest())
    folder = os.path.dirname(os.path.abspath(ca_cert))
    store = os.path.join(folder, f"{STORE_PREFIX}{digest.hexdigest()[:16]}.p12")
    if os.path.isfile(store):
        return store, None
    fd, tmp = tempfile.mkstemp(prefix=".java-truststore-", suffix=".p12", dir=folder)
    os.close(fd)
    os.unlink(tmp)  # keytool makes the file; an empty one is not a keystore
    try:
        _keytool(keytool, "-importkeystore", "-srckeystore", cacerts, "-srcstorepass", STORE_PASSWORD,
                 "-destkeystore", tmp, "-deststoretype", "PKCS12", "-deststorepass", STORE_PASSWORD)
        _keytool(keytool, "-importcert", "-alias", "gatewrap-ca", "-file", ca_cert, "-keystore", tmp,
                 "-storetype", "PKCS12", "-storepass", STORE_PASSWORD)
        os.chmod(tmp, 0o644)
        os.replace(tmp, store)
    except (RuntimeError, OSError, subprocess.TimeoutExpired) as e:
        if os.path.exists(tmp):
            os.unlink(tmp)
        return None, f"gatewrap: note: keytool could not make Java's trust store ({e}), so Java will not trust the gate's CA"
    for old in glob.glob(os.path.join(folder, f"{STORE_PREFIX}*.p12")):
        if old != store:
            os.unlink(old)
    return store, None


def java_options(store: str) -> str:
    """The JSSE properties that make ``store`` (as the agent sees it) the JVM's trust store."""
    return (f"-Djavax.net.ssl.trustStore={store} -Djavax.net.ssl.trustStoreType=PKCS12 "
            f"-Djavax.net.ssl.trustStorePassword={STORE_PASSWORD}")


def wgetrc_needed(env: dict[str, str]) -> tuple[bool, str | None]:
    """Whether to stage a wgetrc for this run: (True, None), or (False, a note for stderr)
    when the user's ``WGETRC`` or ``$HOME/.wgetrc`` would be hidden by ours."""
    if env.get("WGETRC"):
        return False, ("gatewrap: note: your WGETRC is kept, so wget trusts the gate's CA only if it says "
                       "ca_certificate = $SSL_CERT_FILE's bundle")
    home = env.get("HOME")
    if home and os.path.lexists(os.path.join(home, ".wgetrc")):
        return False, (f"gatewrap: note: {home}/.wgetrc is kept (WGETRC would hide it), so wget trusts the "
                       "gate's CA only if it says ca_certificate = $SSL_CERT_FILE's bundle")
    return True, None


def write_wgetrc(staged: str, bundle: str) -> str:
    """Write ``<staged>/wgetrc`` pointing wget at ``bundle`` (as the agent sees it); its path."""
    path = os.path.join(staged, WGETRC_FILE)
    with open(path, "w") as f:
        f.write(f"# gatewrap: trust the gate's CA (TLS inspection)\nca_certificate = {bundle}\n")
    os.chmod(path, 0o644)
    return path
