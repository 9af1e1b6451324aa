"""Policy decisions at 10, 1,000 and 100,000 rules: runs the criterion benches of
gate_core/benches/policy_decide.rs (``cargo bench``, CARGO_TARGET_DIR honoured) and reads
criterion's estimates (``<target>/criterion/<group>/<case>/<n>/new/estimates.json``, the group's ``/`` written
``_``; the median point estimate in ns). Issue 13, target 5: flat in the number of rules. The ``load``
group (``from_toml`` of the same files) grows with the rules, so it is kept out of the ratios."""

from __future__ import annotations

import json
import os
import subprocess

from .common import ROOT, need


def measure() -> dict:
    """``median_ns``: ``{group: {case: {str(n): ns}}}`` of the decisions; ``ratio_100k_to_10``: per
    group and case, the median at 100,000 rules over the median at 10; ``load_ms``: ``{kind: {str(n): ms}}``
    of loading the policy."""
    cargo = need("cargo")
    target = os.environ.get("CARGO_TARGET_DIR", os.path.join(ROOT, "target"))
    p = subprocess.run([cargo, "bench", "-q", "-p", "gate_core", "--bench", "policy_decide"], cwd=ROOT,
                       capture_output=True, text=True, timeout=900)
    if p.returncode != 0:
        raise RuntimeError(f"cargo bench failed: {p.stderr[-2000:]}")
    base = os.path.join(target, "criterion")
    out: dict = {}
    for group in sorted(os.listdir(base)):
        if not (group.startswith("decide_") or group == "load"):
            continue
        for case in sorted(os.listdir(os.path.join(base, group))):
            for n in sorted(os.listdir(os.path.join(base, group, case)), key=lambda s: (not s.isdigit(), s)):
                est = os.path.join(base, group, case, n, "new", "estimates.json")
                if n.isdigit() and os.path.exists(est):
                    with open(est) as f:
                        ns = json.load(f)["median"]["point_estimate"]
                    out.setdefault(group, {}).setdefault(case, {})[n] = round(ns, 1)
    load = {kind: {n: round(ns / 1e6, 3) for n, ns in per.items()} for kind, per in out.pop("load", {}).items()}
    flat = {f"{g} {c}": round(v["100000"] / v["10"], 2) for g, cases in out.items() for c, v in cases.items()
            if "100000" in v and "10" in v}
    return {"median_ns": out, "ratio_100k_to_10": flat, "load_ms": load}
