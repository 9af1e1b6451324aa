"""What the documentation's generated tables share: markdown cells, and a page's text between two
markers (``<!-- NAME:start -->`` ... ``<!-- NAME:end -->``) replaced by a table.

Used by ``escape_table.py`` and ``client_matrix.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def cell(text: object) -> str:
    """``text`` as one markdown table cell: ``|`` escaped, newlines folded, trimmed."""
    return str(text).replace("|", "\\|").replace("\n", " ").strip()


def replace_between_markers(text: str, start: str, end: str, table: str) -> str | None:
    """``text`` with the part between ``start`` and ``end`` replaced by ``table``; None if the
    markers are absent or out of order."""
    i, j = text.find(start), text.find(end)
    if i < 0 or j < 0 or j < i:
        return None
    return text[: i + len(start)] + "\n" + table + text[j:]


def write_table(readme: Path, start: str, end: str, table: str, name: str, to_stdout: bool) -> int:
    """Put ``table`` between the markers of ``readme`` (a page of docs/) (or print it: with ``to_stdout``, or
    when the markers are missing, which ``name``, the script, says on stderr). Returns 0."""
    if to_stdout:
        sys.stdout.write(table)
        return 0
    try:
        text = readme.read_text()
    except OSError:
        text = ""
    new = replace_between_markers(text, start, end, table)
    if new is None:
        print(f"{name}: no {start} / {end} markers in {readme}; the table:", file=sys.stderr)
        sys.stdout.write(table)
    elif new != text:
        readme.write_text(new)
        print(f"{name}: updated {readme}", file=sys.stderr)
    else:
        print(f"{name}: {readme} is up to date", file=sys.stderr)
    return 0


def run_suite(tests: str, python: str) -> int:
    """Run the pytest suite ``tests`` (a path under the repository, e.g. ``tests/escape``) with
    ``python`` (the project's venv) and ``--write-results``, so it writes its results file.
    Needs root for the kernel tests. Returns pytest's exit status."""
    cmd = [python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "--write-results", tests]
    print(f"running {' '.join(cmd)}", file=sys.stderr)
    return subprocess.call(cmd, cwd=ROOT)
