//! The pre-exec launcher against the real kernel (root): netns, cgroup, uid, capabilities,
//! no_new_privs and inherited fds.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

use _gate_core::launcher::{spawn, Mode, SpawnError, SpawnRequest};
use common::{require_root, Cgroup, Netns, TempDir};

const NOBODY: u32 = 65534;

fn request(argv: &[&str], ns: &Netns, cg: &Cgroup, uid: u32, cwd: &Path) -> SpawnRequest {
    SpawnRequest {
        argv: argv.iter().map(|s| s.to_string()).collect(),
        env: vec![("PATH".into(), "/usr/local/bin:/usr/bin:/bin".into())],
        cwd: cwd.to_path_buf(),
        netns_path: ns.path(),
        cgroup_dir: cg.dir.clone(),
        uid,
        gid: uid,
        groups: vec![],
        hide: vec![],
        readonly: vec![],
        mode: Mode::Direct,
        join_cgroups: vec![],
        oom_score_adj: None,
        nproc: None,
        nofile: None,
    }
}

fn status_field(pid: u32, key: &str) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{key}:")))
        .map(|v| v.split_whitespace().collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn kill_and_reap(pid: u32) {
    // SAFETY: signalling and reaping our own child.
    unsafe {
        libc::kill(pid as i32, libc::SIGKILL);
        let mut st = 0;
        libc::waitpid(pid as i32, &mut st, 0);
    }
}

fn wait_exit_code(pid: u32) -> i32 {
    let mut st = 0;
    // SAFETY: reaping our own child.
    unsafe { libc::waitpid(pid as i32, &mut st, 0) };
    libc::WEXITSTATUS(st)
}

/// A scratch directory the unprivileged child can write to.
fn tmpdir(tag: &str) -> TempDir {
    let d = TempDir::new(&format!("launcher-{tag}"));
    std::fs::set_permissions(&d.path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    d
}

/// Checks one sleeping child: sandbox membership and no privileges.
fn assert_sandboxed(pid: u32, ns: &Netns, cg: &Cgroup, uid: u32) {
    let ids = format!("{uid} {uid} {uid} {uid}");
    assert_eq!(status_field(pid, "Uid"), ids, "uid");
    assert_eq!(status_field(pid, "Gid"), ids, "gid");
    assert_eq!(status_field(pid, "Groups"), "", "no supplementary groups");
    for caps in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
        assert_eq!(status_field(pid, caps), "0000000000000000", "{caps}");
    }
    assert_eq!(status_field(pid, "NoNewPrivs"), "1");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    assert!(cgroup.lines().any(|l| l == format!("0::/{}", cg.rel)), "cgroup: {cgroup}");
    let ino = |p: &Path| std::fs::metadata(p).map(|m| m.ino()).unwrap_or(0);
    assert_eq!(ino(&PathBuf::from(format!("/proc/{pid}/ns/net"))), ino(&ns.path()), "netns");
    // Right after exec the dynamic loader briefly holds fd 3 (libc.so); an inherited fd
    // would stay, so wait for the set to settle.
    let fds = || {
        let mut v: Vec<String> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name().to_string_lossy().into_owned()).collect())
            .unwrap_or_default();
        v.sort();
        v
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while fds() != ["0", "1", "2"] && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    assert_eq!(fds(), vec!["0", "1", "2"], "only stdio is inherited");
}

/// Kills and reaps the child on drop, so a failed assertion leaves no process behind.
struct Reaper(u32);

impl Drop for Reaper {
    fn drop(&mut self) {
        kill_and_reap(self.0);
    }
}

#[test]
fn child_enters_the_sandbox_without_privileges() {
    require_root();
    let ns = Netns::new("l1");
    let cg = Cgroup::new("l1");
    let tmp = tmpdir("l1");
    let cwd = tmp.path.clone();
    // An fd without O_CLOEXEC, as Python or a careless library might leave open.
    // SAFETY: open(2) on a constant path.
    let leaked = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_RDONLY) };
    assert!(leaked > 2);

    for uid in [NOBODY, 0] {
        let pid = spawn(&request(&["sleep", "30"], &ns, &cg, uid, &cwd)).expect("spawn sleep");
        let _reaper = Reaper(pid);
        assert_sandboxed(pid, &ns, &cg, uid);
    }

    let out = cwd.join("out");
    let script = format!("id -u > {}", out.display());
    let pid = spawn(&request(&["sh", "-c", &script], &ns, &cg, NOBODY, &cwd)).expect("spawn id");
    assert_eq!(wait_exit_code(pid), 0);
    assert_eq!(std::fs::read_to_string(&out).unwrap_or_default().trim(), "65534");

    // SAFETY: closing the fd opened above.
    unsafe { libc::close(leaked) };
}

/// A cgroup v1 pids leaf for one test (these hosts' hybrid layout); None where no v1 pids
/// hierarchy is mounted.
struct PidsV1(PathBuf);

impl PidsV1 {
    fn new(tag: &str) -> Option<PidsV1> {
        let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
        let mount = mounts.lines().map(|l| l.split(' ').collect::<Vec<_>>()).find(|f| {
            f.len() > 3 && f[2] == "cgroup" && f[3].split(',').any(|o| o == "pids")
        })?[1]
            .to_string();
        let dir = PathBuf::from(mount).join(format!("gwtest-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        Some(PidsV1(dir))
    }
}

impl Drop for PidsV1 {
    fn drop(&mut self) {
        for _ in 0..50 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    }
}

#[test]
fn the_child_joins_its_v1_cgroups_and_takes_its_bounds_before_exec() {
    require_root();
    let ns = Netns::new("l5");
    let cg = Cgroup::new("l5");
    let Some(v1) = PidsV1::new("l5") else {
        eprintln!("no cgroup v1 pids hierarchy here: nothing to join");
        return;
    };
    std::fs::write(v1.0.join("pids.max"), "3").expect("pids.max");
    let tmp = tmpdir("l5");
    let out = tmp.path.join("out");
    let script = format!("exec > {} 2>&1; cat /proc/self/oom_score_adj; echo 100 > /proc/self/oom_score_adj; \
                          cat /proc/self/oom_score_adj; grep 'Max processes' /proc/self/limits; \
                          sleep 1 & sleep 1 & sleep 1 & wait", out.display());
    let mut req = request(&["sh", "-c", &script], &ns, &cg, NOBODY, &tmp.path);
    req.join_cgroups = vec![v1.0.clone()];
    req.oom_score_adj = Some(1000);
    req.nproc = Some(77);
    let pid = spawn(&req).expect("spawn");
    let code = wait_exit_code(pid);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.first(), Some(&"1000"), "the agent's oom_score_adj: {text}");
    // The launcher's write sets the floor too only with CAP_SYS_RESOURCE (fs/proc/base.c,
    // __set_oom_adj; capability 24, linux/capability.h), which some hosts' root lacks (these VMs' bounding set): then the agent
    // may lower it down to the floor gatewrap itself has.
    if status_field(std::process::id(), "CapEff").len() == 16
        && u64::from_str_radix(&status_field(std::process::id(), "CapEff"), 16).unwrap_or(0) & (1 << 24) != 0
    {
        assert_eq!(lines.get(1), Some(&"1000"), "the agent cannot lower it: {text}");
    }
    assert!(text.contains("Max processes             77                   77"), "RLIMIT_NPROC: {text}");
    // sh and two sleeps fill pids.max 3: the third fork is refused (dash exits 2).
    assert_eq!((code, text.contains("Cannot fork")), (2, true), "a fork past the v1 pids.max fails: {text}");
    let events = std::fs::read_to_string(v1.0.join("pids.events")).unwrap_or_default();
    assert!(events.trim() != "max 0", "the refused fork is counted in the v1 leaf: {events}");
}

#[test]
fn exec_failures_name_the_command() {
    require_root();
    let ns = Netns::new("l2");
    let cg = Cgroup::new("l2");
    let tmp = tmpdir("l2");
    let cwd = tmp.path.clone();
    let not_exec = cwd.join("script");
    std::fs::write(&not_exec, "#!/bin/sh\n").expect("write");
    let not_exec = not_exec.to_string_lossy().into_owned();

    let cases: Vec<(&str, Vec<&str>, &str, i32)> = vec![
        ("a missing command", vec!["gw-no-such-command"], "command not found: gw-no-such-command", libc::ENOENT),
        ("a file without x bit", vec![&not_exec], "permission denied: ", libc::EACCES),
    ];
    for (case, argv, msg, errno) in cases {
        match spawn(&request(&argv, &ns, &cg, NOBODY, &cwd)) {
            Ok(pid) => panic!("{case}: spawned {pid}"),
            Err(e) => {
                assert!(e.to_string().starts_with(msg), "{case}: {e}");
                assert_eq!(e.errno(), errno, "{case}");
                assert!(e.is_exec(), "{case}");
            }
        }
    }
    let mut bad = request(&["true"], &ns, &cg, NOBODY, &cwd.join("gone"));
    let e = spawn(&bad).expect_err("a missing working directory refused");
    assert!(e.is_exec() && e.to_string().contains("working directory"), "{e}");
    bad = request(&["true", "a\0b"], &ns, &cg, NOBODY, &cwd);
    assert!(matches!(spawn(&bad), Err(SpawnError::NulInArg(_))));
    let mut bad = request(&["true"], &ns, &cg, NOBODY, &cwd);
    bad.netns_path = PathBuf::from("/run/netns/gw-does-not-exist");
    assert!(matches!(spawn(&bad), Err(SpawnError::Netns { .. })));
    let mut bad = request(&["true"], &ns, &cg, NOBODY, &cwd);
    bad.cgroup_dir = PathBuf::from("/sys/fs/cgroup/gw-does-not-exist");
    let e = spawn(&bad).expect_err("missing cgroup refused");
    assert!(!e.is_exec() && e.errno() == libc::ENOENT, "{e}");
    assert!(e.to_string().starts_with("cannot open /sys/fs/cgroup/gw-does-not-exist to join the cgroup"), "{e}");
}

#[test]
fn the_baseline_filter_refuses_new_namespaces_but_leaves_nsjail_its_own() {
    require_root();
    let ns = Netns::new("l3");
    let cg = Cgroup::new("l3");
    let tmp = tmpdir("l3");
    let cwd = tmp.path.clone();
    // unshare(1) exits 1 when the system call fails; `true` runs inside the new namespaces.
    let cases = [
        ("a user namespace without the jail", Mode::Direct, "unshare -U true", false),
        ("a mount namespace in a user namespace without the jail", Mode::Direct, "unshare -Ur -m true", false),
        // nsjail runs as root (the launcher keeps root for it) and needs no user namespace.
        ("a mount + pid + ipc + uts namespace for nsjail", Mode::Nsjail, "unshare -m -p -f -i -u true", true),
        ("a user namespace for nsjail", Mode::Nsjail, "unshare -U true", false),
        ("a network namespace for nsjail", Mode::Nsjail, "unshare -n true", false),
        ("a plain command without the jail", Mode::Direct, "true", true),
    ];
    for (case, mode, script, ok) in cases {
        let mut req = request(&["sh", "-c", script], &ns, &cg, NOBODY, &cwd);
        req.mode = mode;
        let pid = spawn(&req).expect("spawn");
        assert_eq!(wait_exit_code(pid) == 0, ok, "{case}");
    }
}

#[test]
fn the_path_is_searched_as_execvp_does() {
    require_root();
    let ns = Netns::new("l4");
    let cg = Cgroup::new("l4");
    let tmp = tmpdir("l4");
    let cwd = tmp.path.clone();
    // An entry holding a non-executable file of the same name comes first: execvp(3) goes on
    // to the next entry, and reports EACCES only when no entry has the command.
    let refused = cwd.join("refused");
    std::fs::create_dir(&refused).expect("mkdir");
    std::fs::write(refused.join("true"), "#!/bin/sh\nexit 3\n").expect("write");
    let mut req = request(&["true"], &ns, &cg, NOBODY, &cwd);
    req.env = vec![("PATH".into(), format!("{}:/usr/bin:/bin", refused.display()))];
    let pid = spawn(&req).expect("found in a later entry");
    assert_eq!(wait_exit_code(pid), 0);
    req.env = vec![("PATH".into(), refused.display().to_string())];
    let e = spawn(&req).expect_err("only a refused candidate");
    assert_eq!(e.errno(), libc::EACCES, "{e}");
    // The child is born in the run's cgroup (CLONE_INTO_CGROUP): it is there before exec.
    let mut req = request(&["sleep", "30"], &ns, &cg, NOBODY, &cwd);
    req.env = vec![("PATH".into(), "/usr/bin:/bin".into())];
    let pid = spawn(&req).expect("spawn");
    let procs = std::fs::read_to_string(cg.dir.join("cgroup.procs")).expect("procs");
    kill_and_reap(pid);
    assert!(procs.lines().any(|l| l == pid.to_string()), "{procs}");
}
