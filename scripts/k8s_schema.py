#!/usr/bin/env python3
"""Make tests/data/kubernetes/schema.json: the JSON Schema of the Kubernetes kinds that
contrib/kubernetes/ uses, cut from the API server's own OpenAPI v3 documents.

    scripts/k8s_schema.py                 # go mod download k8s.io/kubernetes@VERSION, then write
    scripts/k8s_schema.py --module-dir D  # from an unpacked module (D/api/openapi-spec/v3)

Where it comes from: the module ``k8s.io/kubernetes`` at :data:`VERSION`, fetched through the
Go module proxy by ``go mod download`` (which checks it against :data:`MODULE_SUM`, the
go.sum hash), its ``api/openapi-spec/v3/*_openapi.json`` (what ``kube-apiserver`` serves at
/openapi/v3). Only the kinds in :data:`KINDS` and the component schemas they reach are
kept, so the file stays small (tests/test_contrib_kubernetes.py validates every manifest
against it offline: CI downloads nothing).

The OpenAPI schemas are turned into JSON Schema as kubeconform's ``openapi2jsonschema``
does in its strict mode: an object schema with ``properties`` and no
``additionalProperties`` gets ``additionalProperties: false`` (the API server drops or, with
``kubectl --validate=strict``, refuses an unknown field: a typo must fail the test);
``int-or-string`` becomes ``string`` or ``integer``; ``Quantity`` (``resource.Quantity``,
"1", 1 or "500m") becomes ``string`` or ``number``; each kind's ``apiVersion`` and ``kind``
are pinned to its group, version and kind (``x-kubernetes-group-version-kind``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "tests" / "data" / "kubernetes" / "schema.json"
#: The Kubernetes release whose API the manifests are checked against, and its go.sum hash.
VERSION = "v1.34.2"
MODULE_SUM = "h1:WQdDvYJazkmkwSncgNwGvVtaCt4TYXIU3wSMRgvp3MI="
#: (OpenAPI v3 document, component schema) of every kind contrib/kubernetes/ may use.
KINDS = [
    ("api__v1_openapi.json", "io.k8s.api.core.v1.Namespace"),
    ("api__v1_openapi.json", "io.k8s.api.core.v1.ConfigMap"),
    ("api__v1_openapi.json", "io.k8s.api.core.v1.Secret"),
    ("api__v1_openapi.json", "io.k8s.api.core.v1.Pod"),
    ("apis__apps__v1_openapi.json", "io.k8s.api.apps.v1.DaemonSet"),
    ("apis__node.k8s.io__v1_openapi.json", "io.k8s.api.node.v1.RuntimeClass"),
]
INT_OR_STRING = "io.k8s.apimachinery.pkg.util.intstr.IntOrString"
QUANTITY = "io.k8s.apimachinery.pkg.api.resource.Quantity"


def download() -> Path:
    """The unpacked module folder, fetched by ``go mod download`` (the Go module cache keeps
    it; Go checks the zip against go.sum's database, and we against :data:`MODULE_SUM`).

    Raises:
        SystemExit: go is missing, the download failed, or the hash is not the pinned one.
    """
    try:
        out = subprocess.run(["go", "mod", "download", "-json", f"k8s.io/kubernetes@{VERSION}"], check=True,
                             capture_output=True, text=True, cwd="/").stdout
    except (OSError, subprocess.CalledProcessError) as e:
        sys.exit(f"k8s_schema: go mod download k8s.io/kubernetes@{VERSION} failed: {e}")
    info = json.loads(out)
    if info.get("Sum") != MODULE_SUM:
        sys.exit(f"k8s_schema: k8s.io/kubernetes@{VERSION} has hash {info.get('Sum')}, not the pinned {MODULE_SUM}")
    return Path(info["Dir"])


def _strict(node: Any) -> Any:
    """``node`` (an OpenAPI v3 schema) as strict JSON Schema, refs to ``#/definitions/``."""
    if isinstance(node, list):
        return [_strict(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _strict(v) for k, v in node.items() if not k.startswith("x-") and k not in ("description", "nullable")}
    if "$ref" in out:
        out["$ref"] = out["$ref"].replace("#/components/schemas/", "#/definitions/")
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _refs(node: Any) -> set[str]:
    if isinstance(node, list):
        return set().union(*(_refs(n) for n in node)) if node else set()
    if not isinstance(node, dict):
        return set()
    found = {node["$ref"].rsplit("/", 1)[-1]} if isinstance(node.get("$ref"), str) else set()
    return found.union(*(_refs(v) for v in node.values()))


def build(spec_dir: Path) -> dict[str, Any]:
    """The schema document: ``definitions`` (every reached component, strict) and ``kinds``
    (``"apiVersion/kind"`` -> the name of its definition)."""
    docs: dict[str, dict[str, Any]] = {}
    sources = {}
    for doc, _ in KINDS:
        if doc not in docs:
            raw = (spec_dir / doc).read_bytes()
            sources[doc] = hashlib.sha256(raw).hexdigest()
            docs[doc] = json.loads(raw)["components"]["schemas"]
    definitions: dict[str, Any] = {}
    kinds: dict[str, str] = {}
    for doc, name in KINDS:
        schemas = docs[doc]
        gvk = schemas[name]["x-kubernetes-group-version-kind"][0]
        api_version = f"{gvk['group']}/{gvk['version']}" if gvk["group"] else gvk["version"]
        kinds[f"{api_version}/{gvk['kind']}"] = name
        todo = [name]
        while todo:
            current = todo.pop()
            if current in definitions:
                continue
            definitions[current] = _strict(schemas[current])
            todo.extend(_refs(schemas[current]) - definitions.keys())
        top = definitions[name]
        top["properties"]["apiVersion"] = {"type": "string", "enum": [api_version]}
        top["properties"]["kind"] = {"type": "string", "enum": [gvk["kind"]]}
        top["required"] = sorted(set(top.get("required", [])) | {"apiVersion", "kind", "metadata"})
    if INT_OR_STRING in definitions:
        definitions[INT_OR_STRING] = {"type": ["string", "integer"]}
    if QUANTITY in definitions:
        definitions[QUANTITY] = {"type": ["string", "number"]}
    return {"$comment": f"made by scripts/k8s_schema.py from k8s.io/kubernetes@{VERSION} ({MODULE_SUM}), "
                        "api/openapi-spec/v3 (sha256 of each document below); do not edit",
            "source": {"module": f"k8s.io/kubernetes@{VERSION}", "sum": MODULE_SUM, "documents": sources},
            "kinds": kinds, "definitions": dict(sorted(definitions.items()))}


def main() -> None:
    """The command line (the module's docstring)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--module-dir", type=Path, help="an unpacked k8s.io/kubernetes module (default: go mod download)")
    args = parser.parse_args()
    module = args.module_dir or download()
    schema = build(module / "api" / "openapi-spec" / "v3")
    OUT.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(schema, indent=None, separators=(",", ":"), sort_keys=False) + "\n"
    OUT.write_text(text)
    print(f"k8s_schema: wrote {os.path.relpath(OUT, ROOT)} ({len(text)} bytes, {len(schema['definitions'])} definitions)")


if __name__ == "__main__":
    main()
