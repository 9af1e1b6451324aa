//! Test fixtures that touch the kernel: a netns and a cgroup, removed on drop. Root only.

#![allow(dead_code)]

pub mod client;
pub mod dns;
pub mod tls;

use std::path::PathBuf;
use std::process::Command;

/// Kernel tests (netns, cgroups, setns) need root; they fail without it rather than pass
/// unchecked, like the pytest suite's kernel tests.
pub fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert!(unsafe { libc::geteuid() } == 0, "this kernel test needs root: run `cargo test` as root");
}

fn ip(args: &[&str]) {
    let ok = Command::new("ip").args(args).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "ip {args:?} failed");
}

/// `ip ARGS` inside the named netns `ns`, entered with `nsenter --net` only (`ip -n` and `ip
/// netns exec` also remount /sys, which fails with EINVAL where / is not a mount point, as in
/// a chroot).
pub fn ip_in(ns: &str, args: &[&str]) {
    let netns = format!("--net=/run/netns/{ns}");
    let ok = Command::new("nsenter").arg(&netns).arg("--").arg("ip").args(args).status().map(|s| s.success()).unwrap_or(false);
    assert!(ok, "ip {args:?} in netns {ns} failed");
}

/// `ip netns add NAME` with `lo` up; deleted on drop.
pub struct Netns {
    pub name: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let name = format!("gwt-{tag}-{}", std::process::id());
        let _ = Command::new("ip").args(["netns", "del", &name]).stderr(std::process::Stdio::null()).status();
        ip(&["netns", "add", &name]);
        // owned from here: a panic of the next `ip` drops it, which deletes the netns
        let ns = Netns { name };
        ip_in(&ns.name, &["link", "set", "lo", "up"]);
        ns
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).status();
    }
}

/// The cgroup2 mount point, from /proc/self/mounts.
pub fn cgroup2_root() -> PathBuf {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|f| f.len() > 2 && f[2] == "cgroup2")
        .map(|f| PathBuf::from(f[1]))
        .unwrap_or_else(|| PathBuf::from("/sys/fs/cgroup"))
}

/// A child cgroup of the cgroup2 root; removed on drop (it must be empty by then).
pub struct Cgroup {
    pub dir: PathBuf,
    pub rel: String,
}

impl Cgroup {
    pub fn new(tag: &str) -> Cgroup {
        let rel = format!("gwtest-{tag}-{}", std::process::id());
        let dir = cgroup2_root().join(&rel);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Cgroup { dir, rel }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

/// A directory under the temp dir, removed on drop (also when a test panics).
pub struct TempDir {
    pub path: PathBuf,
}

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        let path = std::env::temp_dir().join(format!("gw-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("mkdir {}: {e}", path.display()));
        TempDir { path }
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// A gate's configuration for a test in `ns`: `policy` and `audit`, listening on an ephemeral
/// port, no nameservers, a 1 s connect timeout, no notices, no DNS stub, no approvals, its own
/// runtime. Tests change what they need with struct update syntax (`..gate_config(...)`).
pub fn gate_config(
    ns: &Netns,
    policy: std::sync::Arc<std::sync::RwLock<_gate_core::policy::Policy>>,
    audit: std::sync::Arc<_gate_core::audit::AuditLog>,
) -> _gate_core::gate::GateConfig {
    _gate_core::gate::GateConfig {
        run_id: format!("gw-{}", ns.name),
        netns_path: ns.path(),
        policy,
        audit,
        listen_port: 0,
        nameservers: Some(vec![]),
        connect_timeout: std::time::Duration::from_secs(1),
        public_ranges: _gate_core::policy::ssrf::PublicRanges::default(),
        notices: false,
        dns_stub: false,
        inspect: Default::default(),
        idle_timeout: _gate_core::gate::DEFAULT_IDLE_TIMEOUT,
        run_cgroup: None,
        state: None,
        on_asked: None,
        secrets: Default::default(),
        answer_hint: Default::default(),
        allow_hint: Default::default(),
        notice_fd: None,
        shared_runtime: false,
    }
}
