"""The README and the documentation site (docs/, mkdocs.yml): the README stays short and its
links lead somewhere, the policy reference lists exactly the keys the parser takes, and the
generated reference pages are current. No root, no network. (The site's own build, with every
link and anchor checked, is `mkdocs build --strict` in scripts/setup.sh test.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
POLICY_PAGE = ROOT / "docs" / "reference" / "policy.md"
#: The policy file's schema: serde structs with deny_unknown_fields (any other key is refused),
#: in gate_core/src/policy/file.rs (and any other module of the policy that declares one).
PARSER = ROOT / "gate_core" / "src" / "policy"
#: README's budget, in bytes: read in five minutes; everything else is in docs/.
README_MAX_BYTES = 12 * 1024

LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(page: Path) -> set[str]:
    """The ids MkDocs' toc extension gives the headings of ``page`` (lower case, punctuation
    dropped, spaces to dashes), and GitHub's (which keeps the same ones for these headings)."""
    ids = set()
    for line in page.read_text().splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            text = re.sub(r"[`*]", "", m.group(1)).strip().lower()
            ids.add("-".join("".join(c for c in text if c.isalnum() or c in " -_").split()))
    return ids


def test_the_readme_is_at_most_12_kb():
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, over {README_MAX_BYTES}: move detail into docs/"


def test_every_link_in_the_readme_leads_to_a_file_of_the_repository_and_its_heading():
    text = README.read_text()
    links = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert links, "the README links into docs/"
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        dest = ROOT / path if path else README
        if not dest.exists():
            broken.append(f"{target}: no {path}")
        elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
            broken.append(f"{target}: no heading #{anchor} in {path}")
    assert not broken, broken


def test_the_readme_keeps_the_two_commands_the_fresh_debian_check_runs():
    text = README.read_text()
    assert "sudo scripts/setup.sh demo" in text and "sudo scripts/setup.sh test" in text


# ---------------------------------------------------------------- the policy reference

#: Each serde struct of the parser, as the page's tables name it (``<!-- policy-keys: NAME -->``).
STRUCTS = {"FileSchema": "top", "RuleSchema": "rule", "BudgetSchema": "budget", "SandboxSchema": "sandbox",
           "NotifySchema": "notify", "ApprovalsSchema": "approvals", "SecretSchema": "secret",
           "InjectSchema": "inject"}
#: What each Rust field type is called on the page.
TYPES = [(r"\bOneOrMore\b", "integer or array of integers"),
         (r"Vec<Spanned<RuleSchema>>|Vec<Spanned<SecretSchema>>|Vec<SecretSchema>", "array of tables"),
         (r"[A-Z]\w*Schema>*$", "table"), (r"SpannedList<String>|Vec<Spanned<String>>|Vec<String>", "array of strings"),
         (r"Vec<Spanned<i64>>|Vec<i64>", "array of integers"), (r"\bString\b", "string"),
         (r"\bi64\b|\bu\d+\b", "integer"), (r"\bbool\b", "boolean")]


def _parser_keys() -> dict[str, dict[str, str]]:
    """{table: {key: page type}} from the parser's serde structs (a ``rename`` wins over the
    field's name; ``r#as`` is ``as``)."""
    src = "\n".join(f.read_text() for f in sorted(PARSER.rglob("*.rs")))
    out: dict[str, dict[str, str]] = {}
    for name, body in re.findall(r"struct (\w+) \{(.*?)\n\}", src, re.S):
        if name not in STRUCTS:
            continue
        keys, rename = {}, None
        for line in body.splitlines():
            line = line.strip()
            if m := re.match(r'#\[serde\(.*rename = "([^"]+)"', line):
                rename = m.group(1)
            elif m := re.match(r"(?:pub )?(r#)?(\w+): (.+),$", line):
                rust = m.group(3)
                kind = next((t for pat, t in TYPES if re.search(pat, rust)), f"? {rust}")
                keys[rename or m.group(2)] = kind
                rename = None
        out[STRUCTS[name]] = keys
    return out


def _page_keys() -> dict[str, dict[str, tuple[str, bool]]]:
    """{table: {key: (type cell, planned)}} from the page's tables."""
    out: dict[str, dict[str, tuple[str, bool]]] = {}
    for table, block in re.findall(r"<!-- policy-keys: (\w+) -->\n(.*?)(?:\n\n|\Z)", POLICY_PAGE.read_text(), re.S):
        rows = {}
        for key, planned, kind in re.findall(r"^\| `([^`]+)`( \*\(planned\)\*)? \| ([^|]+) \|", block, re.M):
            rows[key] = (kind.strip(), bool(planned))
        out[table] = rows
    return out


def test_the_policy_reference_lists_every_key_the_parser_takes_with_its_type():
    parser, page = _parser_keys(), _page_keys()
    assert {"top", "rule", "budget", "sandbox"} <= set(parser), "the parser's structs were not found"
    problems = []
    for table, keys in parser.items():
        for key, kind in keys.items():
            doc = page.get(table, {}).get(key)
            if doc is None:
                problems.append(f"[{table}] {key}: the parser takes it, docs/reference/policy.md lacks it")
            elif doc[1]:
                problems.append(f"[{table}] {key}: the parser takes it now: fill in its row and drop *(planned)*")
            elif not doc[0].startswith(kind):
                problems.append(f"[{table}] {key}: the page says {doc[0]!r}, the parser reads {kind!r}")
    for table, keys in page.items():
        for key, (_, planned) in keys.items():
            if not planned and key not in parser.get(table, {}):
                problems.append(f"[{table}] {key}: on the page, but the parser refuses it")
    assert not problems, "\n".join(problems)


def _examples(page: Path = POLICY_PAGE) -> list[str]:
    return re.findall(r"```toml\n(.*?)```", page.read_text(), re.S)


@pytest.mark.parametrize("page,n", [(POLICY_PAGE, 0), (POLICY_PAGE, 1), (README, 0)],
                         ids=["the reference's full example", "the reference's report mode", "the README's policy"])
def test_the_policy_examples_are_accepted_by_policy_check(page, n, tmp_path):
    path = tmp_path / "policy.toml"
    path.write_text(_examples(page)[n])
    p = subprocess.run([sys.executable, "-m", "gatewrap", "policy", "check", str(path)],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr


def test_the_policy_reference_examples_use_every_key_that_is_not_planned():
    text = "\n".join(_examples())
    used = set(re.findall(r"^\s*(?:\[+)?(\w+)", text, re.M)) | set(re.findall(r"[{,]\s*(\w+) =", text))
    missing = [f"[{t}] {k}" for t, keys in _page_keys().items() for k, (_, planned) in keys.items()
               if not planned and k not in used]
    assert not missing, missing


# ---------------------------------------------------------------- generated pages

def test_the_generated_reference_pages_are_current():
    """docs/reference/cli.md (every --help) and audit-record.md (the JSON Schema)."""
    p = subprocess.run([sys.executable, str(ROOT / "scripts" / "docs_reference.py"), "--check"],
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


@pytest.mark.parametrize("script,page,marker", [
    ("escape_table", "docs/security.md", "escape-table"),
    ("client_matrix", "docs/guide/clients.md", "client-matrix"),
], ids=["the escape table is its results file's", "the client matrix is its results file's"])
def test_the_generated_tables_are_their_results_files(script, page, marker):
    """The committed results (tests/escape/results.json, tests/clients/results.json, written by
    `scripts/escape_table.py --run` and `scripts/client_matrix.py --run`) rendered now are what
    the page holds: a results file committed without its table, or a table edited by hand, fails."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location(script, ROOT / "scripts" / f"{script}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    results = ROOT / "tests" / ("escape" if script == "escape_table" else "clients") / "results.json"
    text = (ROOT / page).read_text()
    block = text.split(f"<!-- {marker}:start -->\n")[1].split(f"<!-- {marker}:end -->")[0]
    assert block == mod.render(json.loads(results.read_text())), f"run: .venv/bin/python scripts/{script}.py"


def test_the_breakpoints_tutorial_shows_the_example_policy_as_it_is():
    page = (ROOT / "docs" / "tutorials" / "breakpoints.md").read_text()
    policy = (ROOT / "examples" / "breakpoint" / "policy.toml").read_text()
    assert "```toml\n" + policy.rstrip() + "\n```" in page, "copy examples/breakpoint/policy.toml into the page again"


def test_the_config_reference_lists_exactly_the_keys_the_config_reader_takes():
    from gatewrap.approvals.state import CONFIG_KEYS

    page = (ROOT / "docs" / "reference" / "config.md").read_text()
    block = page.split("<!-- config-keys -->\n")[1].split("\n\n")[0]
    documented = set(re.findall(r"^\| `\[(\w+)\]` \| `(\w+)` \|", block, re.M))
    assert documented == {(t, k) for t, keys in CONFIG_KEYS.items() for k in keys}
