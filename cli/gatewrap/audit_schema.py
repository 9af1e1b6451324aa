"""The audit record's schema as the package ships it: ``gatewrap/_schema/audit.schema.json``
(JSON Schema draft 2020-12; the checkout's top-level ``schema/`` is a link to that folder).
What the CLI takes from it instead of a second, hand-written list: the event names and the
decisions."""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any


@functools.cache
def schema() -> dict[str, Any]:
    """The schema document. Raises OSError (missing from the install) or ValueError (not JSON):
    a broken install, not something to work around."""
    return json.loads((resources.files("gatewrap") / "_schema" / "audit.schema.json").read_text(encoding="utf-8"))


def events() -> tuple[str, ...]:
    """Every ``event`` a record may have, in the schema's order (``properties.event.enum``)."""
    return tuple(schema()["properties"]["event"]["enum"])


def decisions() -> tuple[str, ...]:
    """Every ``decision`` a record may have, in the order the schema first names them: the
    ``enum`` and ``const`` values of every ``decision`` property (a cut record's, any string,
    adds none): ``("allowed", "denied", "failed", "attempted")``."""
    found: list[str] = []

    def walk(node: Any) -> None:
        if isinstance(node, list):
            for v in node:
                walk(v)
        elif isinstance(node, dict):
            props = node.get("properties")
            d = props.get("decision") if isinstance(props, dict) else None
            if isinstance(d, dict):
                found.extend(v for v in d.get("enum", [d["const"]] if "const" in d else []) if v not in found)
            for v in node.values():
                walk(v)

    walk(schema())
    return tuple(found)
