#!/usr/bin/env bash
# Wall time of `gatewrap run -- /bin/true`, cold (hooks not attached: compile, load, pin,
# attach) and warm (hooks pinned and attached: compile for the map layouts, map updates).
# Needs root and hyperfine (Debian package). Writes bench/results/run_true.json.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p bench/results
GW=${GATEWRAP:-gatewrap}
PY=$(dirname "$(readlink -f "$(command -v "$GW")")")/python
unload="$PY -c 'from gatewrap.sandbox import cgroup; from gatewrap.bpf import loader; loader.unload(cgroup.parent_dir())'"
log=$(mktemp -d)/audit.jsonl
hyperfine --runs 5 --prepare "$unload" --export-json bench/results/run_true_cold.json \
	-n cold "$GW run --audit-log $log -- /bin/true"
hyperfine --runs 10 --warmup 1 --export-json bench/results/run_true_warm.json \
	-n warm "$GW run --audit-log $log -- /bin/true"
