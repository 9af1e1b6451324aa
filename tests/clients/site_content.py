"""What the package managers of the matrix fetch, written under the fake internet's sites
folder (``tests/fakenet/sites.py`` serves ``<sites>/<host>/<path>``):

* ``pypi.test``: a PEP 503 simple index with one wheel, ``gwdemo-1.0-py3-none-any.whl``
  (built here: a zip with the PEP 427 ``.dist-info`` files);
* ``git.test``: a dumb-HTTP git repository ``/demo.git`` (``git update-server-info``,
  gitprotocol-http(5)) whose README says ``GIT_README``;
* ``npm.test``: a static npm registry, the package document ``/gwdemo`` and its tarball
  (npm registry API: https://github.com/npm/registry/blob/main/docs/REGISTRY-API.md).
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import subprocess
import tarfile
import zipfile

WHEEL = "gwdemo-1.0-py3-none-any.whl"
GIT_README = "hello from the git repository on git.test"
NPM_DESCRIPTION = "a package from the fake npm registry on npm.test"
#: Names of the sites, which the clients' fake internet adds to its DNS (all on allowed.test's addresses).
HOSTS = ("pypi.test", "git.test", "npm.test", "api.openai.test")


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)


def _wheel() -> bytes:
    files = {
        "gwdemo/__init__.py": b"VALUE = 1\n",
        "gwdemo-1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: gwdemo\nVersion: 1.0\n",
        "gwdemo-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: gatewrap-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append("gwdemo-1.0.dist-info/RECORD,,")
    files["gwdemo-1.0.dist-info/RECORD"] = ("\n".join(record) + "\n").encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return buf.getvalue()


def pip_index(sites: str) -> None:
    wheel = _wheel()
    sha = hashlib.sha256(wheel).hexdigest()
    _write(os.path.join(sites, "pypi.test", "files", WHEEL), wheel)
    page = f'<!DOCTYPE html><html><body><a href="../../files/{WHEEL}#sha256={sha}">{WHEEL}</a></body></html>\n'
    _write(os.path.join(sites, "pypi.test", "simple", "gwdemo", "index.html"), page.encode())
    _write(os.path.join(sites, "pypi.test", "simple", "index.html"),
           b'<!DOCTYPE html><html><body><a href="gwdemo/">gwdemo</a></body></html>\n')


def git_repo(sites: str) -> None:
    work = os.path.join(sites, ".git-work")
    bare = os.path.join(sites, "git.test", "demo.git")
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@t.test", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@t.test", HOME=sites, GIT_CONFIG_NOSYSTEM="1")
    _write(os.path.join(work, "README"), (GIT_README + "\n").encode())
    for argv in (["git", "init", "-q", "-b", "main", work], ["git", "-C", work, "add", "README"],
                 ["git", "-C", work, "commit", "-qm", "demo"],
                 ["git", "clone", "-q", "--bare", work, bare],
                 ["git", "-C", bare, "update-server-info"]):
        subprocess.run(argv, check=True, env=env, capture_output=True, timeout=30)


def npm_registry(sites: str) -> None:
    pkg = json.dumps({"name": "gwdemo", "version": "1.0.0", "description": NPM_DESCRIPTION}).encode()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        info = tarfile.TarInfo("package/package.json")
        info.size = len(pkg)
        t.addfile(info, io.BytesIO(pkg))
    tgz = buf.getvalue()
    _write(os.path.join(sites, "npm.test", "gwdemo", "-", "gwdemo-1.0.0.tgz"), tgz)
    integrity = "sha512-" + base64.b64encode(hashlib.sha512(tgz).digest()).decode()
    doc = {"name": "gwdemo", "description": NPM_DESCRIPTION, "dist-tags": {"latest": "1.0.0"},
           "versions": {"1.0.0": {"name": "gwdemo", "version": "1.0.0", "description": NPM_DESCRIPTION,
                                  "dist": {"tarball": "https://npm.test/gwdemo/-/gwdemo-1.0.0.tgz",
                                           "shasum": hashlib.sha1(tgz).hexdigest(), "integrity": integrity}}}}
    # a folder answers with its index.json (tests/fakenet/sites.py): GET /gwdemo
    _write(os.path.join(sites, "npm.test", "gwdemo", "index.json"), json.dumps(doc).encode())


def openai_api(sites: str) -> None:
    _write(os.path.join(sites, "api.openai.test", ".openai"), b"")


def build_all(sites: str) -> None:
    """Write every site above under ``sites``."""
    pip_index(sites)
    git_repo(sites)
    npm_registry(sites)
    openai_api(sites)
