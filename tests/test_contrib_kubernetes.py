"""contrib/kubernetes/, checked offline: no cluster runs here (docs/guide/kubernetes.md says
what is tested and what is on paper).

- Every manifest against the Kubernetes API's schema: tests/data/kubernetes/schema.json,
  cut from k8s.io/kubernetes v1.34.2's OpenAPI v3 by scripts/k8s_schema.py (strict: an
  unknown field fails, as ``kubectl --validate=strict`` refuses it), and a manifest made wrong
  on purpose fails.
- containerd's runtime handler: the installer (the ConfigMap's install.sh, run by ``sh``)
  adds it to the config this machine's containerd (Debian's 1.6) writes by default, and
  containerd itself reads the result (``containerd config dump``) with the keys it knows.
- The installer is valid POSIX shell and writes only the paths it says; gatewrap-oci as it
  installs it runs with the standard library alone (``python3 -I -S``).
"""

from __future__ import annotations

import copy
import fnmatch
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest
import yaml

from gatewrap.oci import bundle

ROOT = Path(__file__).resolve().parent.parent
CONTRIB = ROOT / "contrib" / "kubernetes"
SCHEMA = json.loads((ROOT / "tests" / "data" / "kubernetes" / "schema.json").read_text())
RUNTIMES = ("plugins", "io.containerd.grpc.v1.cri", "containerd", "runtimes")


def _documents() -> list[tuple[str, dict]]:
    """(file and index, object) of every manifest under contrib/kubernetes/."""
    out = []
    for path in sorted(CONTRIB.rglob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                out.append((f"{path.relative_to(CONTRIB)}#{i}", doc))
    return out


DOCUMENTS = _documents()


def _object(kind: str, name: str) -> dict:
    found = [d for _, d in DOCUMENTS if d["kind"] == kind and d["metadata"]["name"] == name]
    assert len(found) == 1, f"one {kind} {name} in contrib/kubernetes/"
    return found[0]


def _errors(doc: dict) -> list[str]:
    """What the API's schema finds wrong with ``doc`` (empty: nothing)."""
    key = f"{doc.get('apiVersion')}/{doc.get('kind')}"
    if key not in SCHEMA["kinds"]:
        return [f"{key}: a kind tests/data/kubernetes/schema.json does not have (scripts/k8s_schema.py KINDS)"]
    schema = {"definitions": SCHEMA["definitions"], "allOf": [{"$ref": "#/definitions/" + SCHEMA["kinds"][key]}]}
    validator = jsonschema.Draft7Validator(schema)
    return [f"{'.'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(doc)]


INSTALLER = _object("ConfigMap", "gatewrap-installer")["data"]
INSTALL_SH = INSTALLER["install.sh"]
SNIPPET = INSTALLER["containerd-gatewrap.toml"]


@pytest.mark.parametrize("where,doc", DOCUMENTS, ids=[w for w, _ in DOCUMENTS])
def test_every_manifest_is_valid_against_the_kubernetes_api_schema(where: str, doc: dict) -> None:
    assert _errors(doc) == []


def _pod() -> dict:
    return copy.deepcopy(_object("Pod", "agent-allow"))


def _daemonset() -> dict:
    return copy.deepcopy(_object("DaemonSet", "gatewrap"))


def _misspelled(doc: dict) -> dict:
    doc["spec"]["runtimeClassNam"] = doc["spec"].pop("runtimeClassName")
    return doc


def _deep_typo(doc: dict) -> dict:
    doc["spec"]["containers"][0]["securityContext"]["privilegd"] = True
    return doc


def _mode_as_string(doc: dict) -> dict:
    doc["spec"]["template"]["spec"]["volumes"][0]["configMap"]["defaultMode"] = "0o555"
    return doc


def _no_handler(doc: dict) -> dict:
    del doc["handler"]
    return doc


def _old_api(doc: dict) -> dict:
    doc["apiVersion"] = "extensions/v1beta1"
    return doc


def _host_path_typo(doc: dict) -> dict:
    doc["spec"]["template"]["spec"]["volumes"][-1]["hostPath"]["type"] = 7
    return doc


@pytest.mark.parametrize("what,doc,said", [
    ("a misspelled field", lambda: _misspelled(_pod()), "'runtimeClassNam' was unexpected"),
    ("a misspelled field deep in a container", lambda: _deep_typo(_pod()), "'privilegd' was unexpected"),
    ("a file mode as a string", lambda: _mode_as_string(_daemonset()), "'0o555' is not of type 'integer'"),
    ("a RuntimeClass without its handler", lambda: _no_handler(copy.deepcopy(_object("RuntimeClass", "gatewrap"))),
     "'handler' is a required property"),
    ("an API version the server no longer serves", lambda: _old_api(_daemonset()), "extensions/v1beta1/DaemonSet"),
    ("a hostPath type that is not a string", lambda: _host_path_typo(_daemonset()), "7 is not of type 'string'"),
])
def test_a_manifest_made_wrong_on_purpose_fails_validation(what: str, doc, said: str) -> None:
    errors = _errors(doc())
    assert any(said in e for e in errors), f"{what}: {errors}"


def test_the_schema_is_the_pinned_kubernetes_release() -> None:
    source = SCHEMA["source"]
    assert source["module"] == "k8s.io/kubernetes@v1.34.2"
    assert source["sum"] == "h1:WQdDvYJazkmkwSncgNwGvVtaCt4TYXIU3wSMRgvp3MI="
    assert set(SCHEMA["kinds"]) >= {"v1/Pod", "apps/v1/DaemonSet", "node.k8s.io/v1/RuntimeClass", "v1/ConfigMap"}


def test_the_daemonset_mounts_only_volumes_it_declares_and_keys_its_configmaps_have() -> None:
    spec = _object("DaemonSet", "gatewrap")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    for c in spec["initContainers"] + spec["containers"]:
        for m in c.get("volumeMounts", []):
            assert m["name"] in volumes, f"{c['name']} mounts {m['name']}"
    config = _object("Secret", "gatewrap-config")["stringData"]
    for c in spec["containers"]:
        for e in c.get("env", []):
            ref = e.get("valueFrom", {}).get("secretKeyRef")
            assert ref is None or ref["key"] in config
    mounts = {m["mountPath"]: m for c in spec["containers"] if c["name"] == "daemon" for m in c["volumeMounts"]}
    assert config.keys() >= {mounts["/etc/gatewrap/config.toml"]["subPath"]}
    assert spec["hostPID"] is True  # runc opens the run's netns as /proc/PID/fd/FD of the daemon
    # The install container's host folders are the ones install.sh writes under $HOST.
    install = next(c for c in spec["initContainers"] if c["name"] == "install")
    host = {m["mountPath"] for m in install["volumeMounts"] if m["mountPath"].startswith("/host/")}
    assert host == {"/host/opt/gatewrap", "/host/usr/local/bin", "/host/etc/containerd"}


def test_the_daemon_sees_the_nodes_paths_it_shares_with_runc_at_the_same_paths() -> None:
    from gatewrap import run_types, shims
    from gatewrap.bpf import loader
    from gatewrap.sandbox import registry
    from gatewrap.shared import protocol

    spec = _object("DaemonSet", "gatewrap")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in spec["volumes"]}
    daemon = next(c for c in spec["containers"] if c["name"] == "daemon")
    same = {m["mountPath"] for m in daemon["volumeMounts"]
            if volumes[m["name"]].get("hostPath", {}).get("path") == m["mountPath"] and not m.get("readOnly")}
    # What gatewrap-oci (on the node) and runc read from the daemon's answer, what a next
    # daemon finds again, and the state that outlives the pod.
    shared = [protocol.DEFAULT_SOCKET, registry.RUNS_DIR, shims.STAGED_ROOT + "/gw-x", loader.PIN_ROOT,
              run_types.DEFAULT_AUDIT_LOG, run_types.DEFAULT_CA_DIR, "/sys/fs/cgroup/gatewrap"]
    for path in shared:
        assert any(path == m or path.startswith(m + "/") for m in same), f"{path}: not the node's in the daemon's view"


def test_the_example_pods_name_the_runtime_class_and_a_policy_the_daemon_has() -> None:
    runtime_class = _object("RuntimeClass", "gatewrap")
    policies = _object("ConfigMap", "gatewrap-policies")["data"]
    for name in ("agent-allow", "agent-policy"):
        pod = _object("Pod", name)
        assert pod["spec"]["runtimeClassName"] == runtime_class["metadata"]["name"]
        notes = pod["metadata"]["annotations"]
        assert notes.keys() & {bundle.POLICY_ANNOTATION, bundle.ALLOW_ANNOTATION}
        if bundle.POLICY_ANNOTATION in notes:
            folder, _, key = notes[bundle.POLICY_ANNOTATION].rpartition("/")
            assert folder == "/etc/gatewrap/policies" and key in policies
    assert runtime_class["handler"] in tomllib.loads(SNIPPET)["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"]


def test_the_policies_and_the_config_are_valid_for_gatewrap(tmp_path: Path) -> None:
    from gatewrap.approvals import state

    gatewrap = str(Path(sys.executable).parent / "gatewrap")
    for key, text in _object("ConfigMap", "gatewrap-policies")["data"].items():
        (tmp_path / key).write_text(text)
        done = subprocess.run([gatewrap, "policy", "check", str(tmp_path / key)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
    (tmp_path / "config.toml").write_text(_object("Secret", "gatewrap-config")["stringData"]["config.toml"])
    assert state.load_config(str(tmp_path / "config.toml")) == {}


def _containerd() -> str:
    path = shutil.which("containerd")
    assert path, "containerd is not installed (scripts/setup.sh test-deps installs Debian's)"
    return path


def _dump(config: Path) -> dict:
    """The config containerd itself reads from ``config`` (``containerd config dump``)."""
    done = subprocess.run([_containerd(), "--config", str(config), "config", "dump"], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return tomllib.loads(done.stdout)


def _runtimes(config: dict) -> dict:
    for key in RUNTIMES:
        config = config[key]
    return config


def test_the_handler_has_only_keys_containerd_has_and_passes_gatewraps_annotations() -> None:
    default = tomllib.loads(subprocess.run([_containerd(), "config", "default"], capture_output=True, text=True,
                                           check=True).stdout)
    runc = _runtimes(default)["runc"]
    ours = _runtimes(tomllib.loads(SNIPPET))["gatewrap"]
    assert set(ours) <= set(runc), "runtime keys containerd 1.6 does not have"
    assert set(ours["options"]) <= set(runc["options"]), "runc options containerd 1.6 does not have"
    assert ours["runtime_type"] == "io.containerd.runc.v2"
    assert ours["options"] == {"BinaryName": "/usr/local/bin/gatewrap-oci", "SystemdCgroup": False}
    for note in (bundle.POLICY_ANNOTATION, bundle.ALLOW_ANNOTATION):
        assert any(fnmatch.fnmatchcase(note, p) for p in ours["pod_annotations"])


def _installer(tmp_path: Path, step: str, **env: str) -> subprocess.CompletedProcess:
    """Run install.sh's function ``step`` with ``env`` over the defaults: no nsenter (this
    machine's commands), no containerd restart, the ConfigMap's snippet."""
    script = tmp_path / "install.sh"
    script.write_text(INSTALL_SH)
    snippet = tmp_path / "containerd-gatewrap.toml"
    snippet.write_text(SNIPPET)
    environ = {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "GATEWRAP_INSTALL_LIB": "1",
               "GATEWRAP_ON_HOST": "", "GATEWRAP_RESTART": "no", "GATEWRAP_SNIPPET": str(snippet), **env}
    return subprocess.run(["sh", "-c", f'. "$1" && {step}', "sh", str(script)], env=environ, capture_output=True,
                          text=True)


def test_the_installer_is_valid_posix_shell(tmp_path: Path) -> None:
    script = tmp_path / "install.sh"
    script.write_text(INSTALL_SH)
    for shell in ("sh", "dash", "bash"):
        done = subprocess.run([shell, "-n", str(script)], capture_output=True, text=True)
        assert done.returncode == 0, f"{shell}: {done.stderr}"


def test_the_installer_adds_the_handler_containerd_reads_once_and_takes_it_away(tmp_path: Path) -> None:
    conf = tmp_path / "etc" / "containerd" / "config.toml"
    conf.parent.mkdir(parents=True)
    conf.write_text(subprocess.run([_containerd(), "config", "default"], capture_output=True, text=True,
                                   check=True).stdout)
    original = conf.read_text()
    here = {"GATEWRAP_HOST": "", "GATEWRAP_CONTAINERD_CONFIG": str(conf)}
    done = _installer(tmp_path, "containerd_config", **here)
    assert done.returncode == 0, done.stderr
    assert "added the gatewrap runtime" in done.stderr
    runtimes = _runtimes(_dump(conf))
    assert runtimes["gatewrap"]["runtime_type"] == "io.containerd.runc.v2"
    assert runtimes["gatewrap"]["pod_annotations"] == ["gatewrap.*"]
    assert runtimes["gatewrap"]["options"]["BinaryName"] == "/usr/local/bin/gatewrap-oci"
    assert runtimes["gatewrap"]["options"]["SystemdCgroup"] is False
    assert runtimes["runc"]["runtime_type"] == "io.containerd.runc.v2"  # the node's own runtime kept
    assert (conf.parent / "config.toml.gatewrap-orig").read_text() == original
    installed = conf.read_text()
    again = _installer(tmp_path, "containerd_config", **here)
    assert again.returncode == 0 and "already has the gatewrap runtime" in again.stderr
    assert conf.read_text() == installed
    # uninstall as the node's paths under $HOST (the same file)
    undone = _installer(tmp_path, "uninstall", GATEWRAP_HOST=str(tmp_path), GATEWRAP_CONTAINERD_CONFIG="/etc/containerd/config.toml")
    assert undone.returncode == 0, undone.stderr
    assert conf.read_text() == original.rstrip("\n") + "\n"
    assert "gatewrap" not in _runtimes(_dump(conf))


@pytest.mark.parametrize("what,before,said", [
    ("no config file", None, "built-in runc runtime written out"),
    ("a config that relies on the built-in runc", 'version = 2\n[plugins."io.containerd.grpc.v1.cri"]\n'
     '  sandbox_image = "pause"\n', "built-in runc runtime written out"),
    ("containerd 2.x's config", 'version = 3\n', "config version 3"),
    ("a version 1 config", '[plugins.cri]\n  sandbox_image = "pause"\n', "config version 1"),
    ("a gatewrap runtime of the admin's", 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd.runtimes.gatewrap]\n'
     '  runtime_type = "io.containerd.runc.v2"\n', "left as it is"),
    ("a config containerd cannot read with it", 'version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n'
     '  runtimes = { runc = { runtime_type = "io.containerd.runc.v2" } }\n', "left unchanged"),
])
def test_the_installer_leaves_a_config_it_cannot_extend_as_it_was(tmp_path: Path, what: str, before: str | None,
                                                                   said: str) -> None:
    conf = tmp_path / "config.toml"
    if before is not None:
        conf.write_text(before)
    done = _installer(tmp_path, "containerd_config", GATEWRAP_HOST="", GATEWRAP_CONTAINERD_CONFIG=str(conf))
    assert said in done.stderr, f"{what}: {done.stderr}"
    if said.startswith("built-in runc"):
        # A runtimes table replaces containerd's built-in ones: without runc written out, the
        # CRI plugin would not load (tests/containers/test_kubernetes_cri.py starts one).
        assert done.returncode == 0 and set(_runtimes(_dump(conf))) == {"runc", "gatewrap"}
    elif said != "left as it is":
        assert done.returncode != 0 and conf.read_text() == before
    else:
        assert done.returncode == 0 and conf.read_text() == before
    assert not (tmp_path / "config.toml.gatewrap-new").exists()


def test_the_installer_writes_gatewrap_oci_which_runs_on_the_standard_library_alone(tmp_path: Path) -> None:
    host = tmp_path / "host"
    done = _installer(tmp_path, "install_files", GATEWRAP_HOST=str(host))
    assert done.returncode == 0, done.stderr
    written = sorted(str(p.relative_to(host)) for p in host.rglob("*") if p.is_file())
    assert "usr/local/bin/gatewrap-oci" in written
    assert all(w == "usr/local/bin/gatewrap-oci" or w.startswith("opt/gatewrap/lib/gatewrap/") for w in written), written
    assert not any(w.endswith(".so") or "__pycache__" in w for w in written)
    wrapper = host / "usr" / "local" / "bin" / "gatewrap-oci"
    assert os.stat(wrapper).st_mode & 0o777 == 0o755
    text = wrapper.read_text()
    assert text.startswith("#!/bin/sh\n") and "/usr/bin/python3 -I -S" in text
    # The wrapper as the node runs it, its library folder the one written here: runc's
    # command line goes through gatewrap-oci to the runc it names (here echo).
    local = tmp_path / "gatewrap-oci"
    local.write_text(text.replace('"/opt/gatewrap/lib"', json.dumps(str(host / "opt" / "gatewrap" / "lib"))))
    ran = subprocess.run(["sh", str(local), "--gatewrap-runc", "/bin/echo", "--root", "/run/x", "state", "c1"],
                         capture_output=True, text=True, env={"PATH": "/usr/bin:/bin"})
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.split() == ["--root", "/run/x", "state", "c1"]
    # What create and delete import, with the node's python3 and nothing but the standard library.
    lib = str(host / "opt" / "gatewrap" / "lib")
    imports = subprocess.run(["/usr/bin/python3", "-I", "-S", "-c",
                              f"import sys; sys.path.insert(0, {lib!r}); import gatewrap.oci.main, gatewrap.oci.bundle, "
                              "gatewrap.sandbox.registry, gatewrap.shared.client, gatewrap.shared.protocol, json"],
                             capture_output=True, text=True)
    assert imports.returncode == 0, imports.stderr
