#!/usr/bin/env bash
# Installs the peers the harness measures gatewrap against, from Debian (apt-get), each on its
# own so one that fails is reported missing rather than stopping the rest:
#   squid, tinyproxy (proxies), bubblewrap, firejail (sandboxes), nginx (the upstream),
#   hey (the load tool: Go's HTTP client, CONNECT for https through a proxy), curl (bulk).
# Services are not started by the packages here (policy-rc.d); the harness runs its own
# instances on loopback with its own configuration. Prints one line per package: "ok NAME" or
# "missing NAME" (waiting up to 15 min for another apt run's lock). Root. Usage: bench/install_peers.sh
set -u
export DEBIAN_FRONTEND=noninteractive
declare -A cmd=([squid]=squid [tinyproxy]=tinyproxy [bubblewrap]=bwrap [firejail]=firejail
	[nginx]=nginx [hey]=hey [curl]=curl)
need=()
for p in "${!cmd[@]}"; do command -v "${cmd[$p]}" >/dev/null || need+=("$p"); done
if [ ${#need[@]} -gt 0 ]; then
	apt-get -o DPkg::Lock::Timeout=900 update -qq >/dev/null 2>&1 || true
	for p in "${need[@]}"; do
		apt-get -o DPkg::Lock::Timeout=900 install -y -qq --no-install-recommends "$p" >/dev/null 2>&1 || true
	done
fi
for p in "${!cmd[@]}"; do
	if command -v "${cmd[$p]}" >/dev/null; then echo "ok $p"; else echo "missing $p"; fi
done
