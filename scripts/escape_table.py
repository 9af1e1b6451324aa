#!/usr/bin/env python3
"""Turn the escape suite's results into the security page's table (docs/security.md).

    sudo .venv/bin/python scripts/escape_table.py --run   # run tests/escape, then render
    scripts/escape_table.py [--results tests/escape/results.json] [--page docs/security.md] [--stdout]

``tests/escape/results.json`` is written by the escape suite (tests/escape/conftest.py)
at the end of a session run with ``--write-results`` (``--run`` does that). This script renders it as a markdown
table (vector -> hook or layer -> errno or outcome -> verdict) and replaces the text
between ``<!-- escape-table:start -->`` and ``<!-- escape-table:end -->`` in the page.
If the page lacks the markers (or with ``--stdout``), the table goes to stdout and the
page is left alone. Exit status: 0, or 1 if the results file is missing or malformed.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

from readme_markers import cell as _cell, run_suite, write_table  # noqa: E402

START, END = "<!-- escape-table:start -->", "<!-- escape-table:end -->"
VERDICTS = {"held": "held", "OPEN": "**OPEN**", "hang": "**hang** (no egress, but no error either)"}



def render(entries: list[dict]) -> str:
    """The markdown table (and a one-line tally) for ``entries`` of results.json."""
    lines = ["| vector | hook or layer | errno or outcome | verdict |", "| --- | --- | --- | --- |"]
    for e in entries:
        verdict = VERDICTS.get(e.get("verdict", ""), f"**{_cell(e.get('verdict', '?'))}**")
        if e.get("outcome") == "xfailed":
            verdict += " (known, xfail)"
        elif e.get("outcome") == "failed" and e.get("verdict") == "held":
            verdict += " (test failed: see the suite)"
        lines.append(f"| {_cell(e['vector'])} | {_cell(e.get('layer', '?'))} | "
                     f"{_cell(e.get('observed', '?'))} | {verdict} |")
    tally: dict[str, int] = {}
    for e in entries:
        tally[e.get("verdict", "?")] = tally.get(e.get("verdict", "?"), 0) + 1
    summary = ", ".join(f"{n} {k}" for k, n in sorted(tally.items(), key=lambda kv: (kv[0] != "held", kv[0])))
    lines += ["", f"{len(entries)} vectors: {summary}."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--results", type=Path, default=ROOT / "tests" / "escape" / "results.json")
    ap.add_argument("--page", "--readme", dest="page", type=Path, default=ROOT / "docs" / "security.md",
                    help="the page holding the markers (--readme: its old name)")
    ap.add_argument("--stdout", action="store_true", help="print the table; do not touch the page")
    ap.add_argument("--run", action="store_true",
                    help="run tests/escape first (as root, with this interpreter), writing the results file")
    args = ap.parse_args(argv)
    if args.run and run_suite("tests/escape", sys.executable) not in (0, 1):
        print("escape_table: the suite did not run to its end; the page is left alone", file=sys.stderr)
        return 1
    try:
        entries = json.loads(args.results.read_text())
        assert isinstance(entries, list) and all("vector" in e for e in entries)
    except (OSError, ValueError, AssertionError) as e:
        print(f"escape_table: cannot read {args.results} ({e}); run the escape suite first: "
              "sudo .venv/bin/python scripts/escape_table.py --run", file=sys.stderr)
        return 1
    return write_table(args.page, START, END, render(entries), "escape_table", args.stdout)


if __name__ == "__main__":
    sys.exit(main())
