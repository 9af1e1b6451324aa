"""bench/run's body: every section in turn, each failure recorded instead of raised, then
bench/results/latest.{json,md} (and docs/benchmarks.md with --readme).

Usage (root; bench/run takes the kernel lock and installs the peers first):
  python -m harness [--only startup,memory,proxies,hooks,policy,audit] [--quick] [--readme]
  python -m harness --readme-only     # latest.md into docs/benchmarks.md, nothing measured
  python -m harness --render          # latest.md again from latest.json (after a format change)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback

from . import report


def sections(quick: bool) -> dict:
    """Name -> a function measuring it, with the full or the quick (smoke-test) sizes."""
    from . import audit, hooks, memory, policy_bench, proxies, startup
    return {
        "startup": lambda: startup.measure(5 if quick else 15),
        "memory": lambda: memory.measure([3] if quick else [20, 50]),
        "proxies": lambda: proxies.measure(1 if quick else 3, 1 if quick else 2, 5 if quick else 60),
        "hooks": lambda: hooks.measure(20_000 if quick else 200_000),
        "policy": policy_bench.measure,
        "audit": lambda: audit.measure(20_000 if quick else 200_000),
    }


def main() -> int:
    ap = argparse.ArgumentParser(prog="bench/run", formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="Measure gatewrap against its peers (issue 13); root. Installs the peers\n"
                                 "(bench/install_peers.sh), then writes bench/results/latest.{json,md}.\n"
                                 "GATEWRAP_PYTHON=path picks the build measured (default: .venv/bin/python).")
    ap.add_argument("--only", help="comma-separated sections (default: all)")
    ap.add_argument("--quick", action="store_true", help="small sizes, a smoke test of the harness (~4 min)")
    ap.add_argument("--readme", action="store_true", help="also put the table in docs/benchmarks.md")
    ap.add_argument("--readme-only", action="store_true", help="only put bench/results/latest.md in docs/benchmarks.md")
    ap.add_argument("--render", action="store_true", help="only write latest.md again from latest.json")
    args = ap.parse_args()
    if args.render:
        with open(os.path.join(report.RESULTS, "latest.json")) as f:
            print(report.write(json.load(f)))
        return 0
    if args.readme_only:
        report.to_readme()
        return 0
    todo = sections(args.quick)
    names = args.only.split(",") if args.only else list(todo)
    unknown = [n for n in names if n not in todo]
    if unknown:
        ap.error(f"unknown section {', '.join(unknown)}; choose from {', '.join(todo)}")
    t0 = time.monotonic()
    res: dict = {"machine": report.machine(), "quick": args.quick, "sections": {}}
    for name in names:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        s0 = time.monotonic()
        try:
            res["sections"][name] = todo[name]()
        except (Exception, SystemExit) as e:  # a section's failure is reported, the others still run
            traceback.print_exc()
            res["sections"][name] = {"error": f"{type(e).__name__}: {e}"}
        res["sections"][name]["section_s"] = round(time.monotonic() - s0, 1)
        print(f"bench: {name} took {res['sections'][name]['section_s']} s", file=sys.stderr, flush=True)
    res["wall_s"] = round(time.monotonic() - t0, 1)
    print(report.write(res))
    if args.readme:
        report.to_readme()
    return 0


if __name__ == "__main__":
    sys.exit(main())
