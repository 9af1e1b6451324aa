#!/usr/bin/env python3
"""Turn the client matrix's results into the clients page's table (docs/guide/clients.md).

    sudo .venv/bin/python scripts/client_matrix.py --run   # run tests/clients, then render
    scripts/client_matrix.py [--results tests/clients/results.json] [--page docs/guide/clients.md] [--stdout]

``tests/clients/results.json`` is written by tests/clients (its conftest) at the end of a
session run with ``--write-results`` (``--run`` does that): one entry per (client, case, tls) with what the client
showed and pytest's outcome. This script renders one row per client (in ``rank`` order) and
one column per (tls, case) found in the file: the cases ``allowed``, ``denied``,
``unwrapped`` for ``tls`` = ``tunnel`` first, then those of any other tls mode (e.g. TLS
inspection's ``inspected``), headed ``case (mode)``. The text between
``<!-- client-matrix:start -->`` and ``<!-- client-matrix:end -->`` in the page is
replaced; without the markers (or with ``--stdout``) the table goes to stdout. Exit status:
0, or 1 if the results file is missing or malformed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from readme_markers import cell as _cell, run_suite, write_table  # noqa: E402

START, END = "<!-- client-matrix:start -->", "<!-- client-matrix:end -->"
CASES = ("allowed", "denied", "unwrapped")
#: How each tls mode is named in a column's heading ("" for the plain CONNECT tunnel).
TLS_MODES = {"tunnel": "", "inspected": "with TLS inspection"}
#: A cell shows at most this many characters of what the client said (results.json has all).
CELL_CHARS = 120


def _columns(entries: list[dict]) -> list[tuple[str, str]]:
    modes = sorted({e.get("tls", "tunnel") for e in entries},
                   key=lambda m: (list(TLS_MODES).index(m) if m in TLS_MODES else len(TLS_MODES), m))
    present = {(e.get("tls", "tunnel"), e["case"]) for e in entries}
    return [(m, c) for m in modes for c in CASES if (m, c) in present]


def _heading(mode: str, case: str) -> str:
    label = TLS_MODES.get(mode, mode)
    return f"{case} ({label})" if label else case


def _verdict(e: dict | None) -> str:
    if e is None:
        return "not run"
    observed = _cell(e.get("observed", "?"))
    if len(observed) > CELL_CHARS:
        observed = observed[: CELL_CHARS - 1].rstrip() + "…"
    return f"✓ {observed}" if e.get("outcome") == "passed" else f"**{_cell(e.get('outcome', 'failed'))}**: {observed}"


def render(entries: list[dict]) -> str:
    """The markdown table (and a one-line tally) for ``entries`` of results.json."""
    cols = _columns(entries)
    cells: dict[tuple[str, str, str], dict] = {}
    ranks: dict[str, float] = {}
    for e in entries:
        cells[(e["client"], e.get("tls", "tunnel"), e["case"])] = e
        ranks[e["client"]] = min(ranks.get(e["client"], float("inf")), e.get("rank", float("inf")))
    clients = sorted(ranks, key=lambda c: (ranks[c], c))
    lines = ["| client | " + " | ".join(_heading(m, c) for m, c in cols) + " |",
             "| --- |" + " --- |" * len(cols)]
    for client in clients:
        lines.append(f"| {_cell(client)} | " + " | ".join(_verdict(cells.get((client, m, c))) for m, c in cols) + " |")
    passed = sum(1 for e in entries if e.get("outcome") == "passed")
    lines += ["", f"{len(clients)} clients, {len(entries)} cells: {passed} passed"
              + (f", {len(entries) - passed} not passed." if passed < len(entries) else ".")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "tests" / "clients" / "results.json")
    ap.add_argument("--page", "--readme", dest="page", type=Path, default=ROOT / "docs" / "guide" / "clients.md",
                    help="the page holding the markers (--readme: its old name)")
    ap.add_argument("--stdout", action="store_true", help="print the table; do not touch the page")
    ap.add_argument("--run", action="store_true",
                    help="run tests/clients first (as root, with this interpreter), writing the results file")
    args = ap.parse_args(argv)
    if args.run and run_suite("tests/clients", sys.executable) not in (0, 1):
        print("client_matrix: the suite did not run to its end; the page is left alone", file=sys.stderr)
        return 1
    try:
        entries = json.loads(args.results.read_text())
        assert isinstance(entries, list) and all("client" in e and "case" in e for e in entries)
    except (OSError, ValueError, AssertionError) as e:
        print(f"client_matrix: cannot read {args.results} ({e}); run the matrix first: "
              "sudo .venv/bin/python scripts/client_matrix.py --run", file=sys.stderr)
        return 1
    return write_table(args.page, START, END, render(entries), "client_matrix", args.stdout)


if __name__ == "__main__":
    sys.exit(main())
