//! What runs in the cloned child between `clone3` and `execve`: async-signal-safe calls only.
//!
//! The child is made by a raw `clone3(2)` (no glibc `fork`), so glibc's view of the process
//! (its thread list, the cached thread id) is the parent's: the child makes system calls
//! directly where glibc would act on "all threads" (`setgroups`, `setresgid`, `setresuid`
//! broadcast to every thread in a multithreaded process, nptl(7)), and calls no function that
//! takes a lock or allocates.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::ptr;

const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
const LINUX_CAPABILITY_VERSION_3: u32 = 0x2008_0522;
// open_tree(2) and move_mount(2) flags (linux/mount.h; AT_RECURSIVE from linux/fcntl.h).
const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;

/// The steps, in the order they run; a failing one is reported to the parent by its code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Step {
    /// Writing `0` (the writer) to a cgroup v1 `cgroup.procs` opened by the parent.
    JoinCgroup = 1,
    /// Writing the agent's `/proc/self/oom_score_adj`.
    OomScoreAdj,
    /// prlimit(RLIMIT_NPROC) where no pids controller bounds the run.
    Nproc,
    /// prlimit(RLIMIT_NOFILE): the caller's soft limit back (gatewrap raised its own).
    Nofile,
    Signals,
    Setsid,
    Setns,
    Unshare,
    MountPrivate,
    RootMount,
    Hide,
    ReadOnly,
    /// chdir(2) to the working directory again, through the mounts just made.
    Reenter,
    Setgroups,
    Setresgid,
    BoundingSet,
    Ambient,
    Setresuid,
    Capset,
    NoNewPrivs,
    Landlock,
    Seccomp,
    CloseRange,
    /// chdir(2) to the working directory (reported as an exec error, as std's spawn did).
    Chdir,
    /// execve(2) of every candidate path failed.
    Exec,
}

impl Step {
    const ALL: [Step; 25] = [
        Step::JoinCgroup,
        Step::OomScoreAdj,
        Step::Nproc,
        Step::Nofile,
        Step::Signals,
        Step::Setsid,
        Step::Setns,
        Step::Unshare,
        Step::MountPrivate,
        Step::RootMount,
        Step::Hide,
        Step::ReadOnly,
        Step::Reenter,
        Step::Setgroups,
        Step::Setresgid,
        Step::BoundingSet,
        Step::Ambient,
        Step::Setresuid,
        Step::Capset,
        Step::NoNewPrivs,
        Step::Landlock,
        Step::Seccomp,
        Step::CloseRange,
        Step::Chdir,
        Step::Exec,
    ];

    pub fn from_code(code: u8) -> Option<Step> {
        Step::ALL.iter().copied().find(|s| *s as u8 == code)
    }
}

impl fmt::Display for Step {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Step::JoinCgroup => "joining the run's cgroup v1 (writing 0 to its cgroup.procs)",
            Step::OomScoreAdj => "setting the agent's oom_score_adj",
            Step::Nproc => "setting the agent's RLIMIT_NPROC",
            Step::Nofile => "setting the agent's RLIMIT_NOFILE",
            Step::Signals => "resetting SIGPIPE/SIGXFSZ",
            Step::Setsid => "setsid",
            Step::Setns => "setns into the sandbox netns",
            Step::Unshare => "unshare(CLONE_NEWNS | CLONE_NEWCGROUP)",
            Step::MountPrivate => "making the mount namespace private",
            Step::RootMount => "making the root directory a mount point (open_tree, move_mount, chroot)",
            Step::Hide => "hiding a host path under an empty tmpfs",
            Step::ReadOnly => "making a host path read-only",
            Step::Reenter => "entering the working directory in the agent's mount namespace (is it under a path hidden from the agent, such as /sys/fs/cgroup or /sys/fs/bpf?)",
            Step::Setgroups => "setgroups",
            Step::Setresgid => "setresgid",
            Step::BoundingSet => "dropping the capability bounding set",
            Step::Ambient => "clearing ambient capabilities",
            Step::Setresuid => "setresuid",
            Step::Capset => "capset (clearing capabilities)",
            Step::NoNewPrivs => "prctl(PR_SET_NO_NEW_PRIVS)",
            Step::Landlock => "landlock_restrict_self (the launcher's Landlock domain)",
            Step::Seccomp => "installing the baseline seccomp filter",
            Step::CloseRange => "close_range(CLOSE_RANGE_CLOEXEC)",
            Step::Chdir => "chdir to the working directory",
            Step::Exec => "execve",
        })
    }
}

/// Everything the child needs, prepared before `clone3`.
pub struct Plan {
    pub netns_fd: libc::c_int,
    /// Written by the child when a step fails: the [`Step`] code, then errno (i32, native
    /// byte order): [`REPORT_BYTES`] bytes, one atomic pipe write (pipe(7): PIPE_BUF).
    pub status_fd: libc::c_int,
    /// The paths to try with execve(2), in order: the program itself when it names a path,
    /// else each `PATH` entry joined with it (as execvp(3) searches).
    pub exec_paths: Vec<CString>,
    /// NULL-terminated pointers into `owned`'s strings (argv, then `KEY=value` pairs).
    pub argv: Vec<*const libc::c_char>,
    pub envp: Vec<*const libc::c_char>,
    /// The strings `argv` and `envp` point into, kept alive with the plan.
    pub _owned: (Vec<CString>, Vec<CString>),
    pub groups: Vec<libc::gid_t>,
    pub uid: libc::uid_t,
    pub gid: libc::gid_t,
    pub last_cap: u32,
    /// Paths covered by an empty read-only tmpfs in the agent's mount namespace.
    pub hide: Vec<CString>,
    /// Paths bind-mounted read-only onto themselves in the agent's mount namespace.
    pub readonly: Vec<CString>,
    /// The agent's working directory, entered again after [`Plan::root_as_mount`].
    pub cwd: CString,
    /// Drop to `uid`/`gid`/`groups` with no capabilities (false: the exec'd jail does it).
    pub drop_privileges: bool,
    /// The Landlock ruleset to enforce ([`super::landlock::ruleset_for`], created before fork;
    /// the parent keeps it open until the child has exec'd), or `None` without Landlock.
    pub landlock_fd: Option<libc::c_int>,
    /// The baseline seccomp filters ([`super::seccomp::build`]), installed in this order.
    pub filters: Vec<seccompiler::BpfProgram>,
    /// `cgroup.procs` of each cgroup v1 leaf of the run (pids, memory, cpu on a hybrid host),
    /// opened for writing by the parent; the child writes `0` to each, which cgroup v1 reads
    /// as "the writing task" (kernel/cgroup/cgroup.c, cgroup_procs_write_start).
    pub join_fds: Vec<libc::c_int>,
    /// The agent's oom_score_adj as the decimal text to write (proc(5)), or `None`.
    pub oom_score_adj: Option<CString>,
    /// RLIMIT_NPROC (soft and hard) for the agent, or `None` to keep the caller's.
    pub nproc: Option<u64>,
    /// The agent's soft RLIMIT_NOFILE (the hard one kept), or `None` to keep this process's.
    pub nofile: Option<u64>,
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: libc::c_int,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Bytes of one failure report on the status pipe: the step's code and an i32 errno.
pub const REPORT_BYTES: usize = 5;

/// Decode a report written by [`Plan::fail`]: the step and its errno.
pub fn decode_report(buf: &[u8; REPORT_BYTES]) -> Option<(Step, i32)> {
    let errno = i32::from_ne_bytes([buf[1], buf[2], buf[3], buf[4]]);
    Step::from_code(buf[0]).map(|step| (step, errno))
}

impl Plan {
    fn fail_with(&self, step: Step, errno: i32) {
        let e = errno.to_ne_bytes();
        let report: [u8; REPORT_BYTES] = [step as u8, e[0], e[1], e[2], e[3]];
        // SAFETY: write(2) from a local; the result does not matter (the parent then sees
        // the child exit without a report and says so).
        unsafe { libc::write(self.status_fd, report.as_ptr().cast(), REPORT_BYTES) };
    }

    fn fail(&self, step: Step) -> io::Error {
        let err = io::Error::last_os_error();
        self.fail_with(step, err.raw_os_error().unwrap_or(libc::EIO));
        err
    }

    fn check(&self, step: Step, rc: libc::c_long) -> io::Result<()> {
        if rc < 0 {
            Err(self.fail(step))
        } else {
            Ok(())
        }
    }

    /// A cgroup namespace rooted at the run's leaf: even a uid-0 agent without
    /// capabilities cannot move itself out of it (cgroup_namespaces(7): migration outside
    /// the namespace root fails). A private mount namespace in which the `hide` paths
    /// (gatewrap passes every cgroupfs and bpffs mount: a pin's fd would let a uid-0 agent
    /// detach the hooks, a cgroup root's fd leave the cgroup) are covered and the `readonly`
    /// ones (the audit log's folder, /proc/sys) bound read-only. Runs as root, before
    /// privileges are dropped.
    ///
    /// SAFETY: plain system calls on strings prepared before fork.
    unsafe fn isolate_mounts(&self) -> io::Result<()> {
        let none: *const libc::c_char = ptr::null();
        self.check(Step::Unshare, libc::unshare(libc::CLONE_NEWNS | libc::CLONE_NEWCGROUP).into())?;
        let mut rc = libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, ptr::null());
        if rc != 0 && io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL) {
            self.root_as_mount()?;
            rc = libc::mount(none, c"/".as_ptr(), none, libc::MS_REC | libc::MS_PRIVATE, ptr::null());
        }
        self.check(Step::MountPrivate, rc.into())?;
        for path in &self.hide {
            let flags = libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC | libc::MS_RDONLY;
            let rc = libc::mount(c"tmpfs".as_ptr(), path.as_ptr(), c"tmpfs".as_ptr(), flags,
                                 c"mode=000,size=4k".as_ptr().cast());
            self.check(Step::Hide, rc.into())?;
        }
        for path in &self.readonly {
            let rc = libc::mount(path.as_ptr(), path.as_ptr(), none, libc::MS_BIND | libc::MS_REC, ptr::null());
            self.check(Step::ReadOnly, rc.into())?;
            let flags = libc::MS_BIND | libc::MS_REMOUNT | libc::MS_RDONLY | libc::MS_NOSUID | libc::MS_NODEV;
            let rc = libc::mount(none, path.as_ptr(), none, flags, ptr::null());
            self.check(Step::ReadOnly, rc.into())?;
        }
        Ok(())
    }

    /// In a chroot the root directory is not a mount point: its propagation cannot be
    /// changed (mount(2): EINVAL) and nsjail refuses to start. Put a recursive clone of the
    /// tree at `/` on top of it (open_tree(2) `OPEN_TREE_CLONE | AT_RECURSIVE`, then
    /// move_mount(2), in this namespace only) and enter it (fchdir, `chroot(".")`, then the
    /// working directory again), so that `/` is a mount point here, as on a booted system.
    ///
    /// SAFETY: plain system calls on strings prepared before fork.
    unsafe fn root_as_mount(&self) -> io::Result<()> {
        let flags = OPEN_TREE_CLONE | AT_RECURSIVE | libc::O_CLOEXEC as libc::c_uint;
        let fd = libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, c"/".as_ptr(), flags);
        self.check(Step::RootMount, fd)?;
        let fd = fd as libc::c_int;
        let rc = libc::syscall(libc::SYS_move_mount, fd, c"".as_ptr(), libc::AT_FDCWD, c"/".as_ptr(),
                               MOVE_MOUNT_F_EMPTY_PATH);
        self.check(Step::RootMount, rc)?;
        self.check(Step::RootMount, libc::fchdir(fd).into())?;
        self.check(Step::RootMount, libc::chroot(c".".as_ptr()).into())?;
        libc::close(fd);
        self.check(Step::RootMount, libc::chdir(self.cwd.as_ptr()).into())
    }

    /// Enter the sandbox and drop privileges, in this order (the child was born in the run's
    /// cgroup: `CLONE_INTO_CGROUP`): signals, netns, cgroup + mount namespaces (hidden and read-only paths;
    /// then the working directory entered again, through them), the agent's user without
    /// capabilities ([`Plan::drop_to_agent`], unless the exec'd jail does it), no_new_privs,
    /// the Landlock domain (before the filters, which then need not allow its system calls),
    /// the baseline seccomp filters, and close-on-exec for every fd above 2.
    pub fn enter(&self) -> io::Result<()> {
        // SAFETY (whole block): plain system calls on prepared values, no allocation.
        unsafe {
            self.bound()?;
            // Python ignores SIGPIPE and SIGXFSZ, and ignored signals survive exec.
            if libc::signal(libc::SIGPIPE, libc::SIG_DFL) == libc::SIG_ERR
                || libc::signal(libc::SIGXFSZ, libc::SIG_DFL) == libc::SIG_ERR
            {
                return Err(self.fail(Step::Signals));
            }
            // The caller blocks the signals it waits for (sigtimedwait); the mask survives
            // fork and exec (signal(7)), so the agent starts with an empty one.
            let mut empty = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
            libc::sigemptyset(empty.as_mut_ptr());
            if libc::pthread_sigmask(libc::SIG_SETMASK, empty.as_ptr(), std::ptr::null_mut()) != 0 {
                return Err(self.fail(Step::Signals));
            }
            // A session of its own: no controlling terminal, so TIOCSTI cannot type into the
            // shell gatewrap was started from (tty_ioctl(4)); gatewrap forwards Ctrl-C.
            self.check(Step::Setsid, libc::setsid().into())?;
            self.check(Step::Setns, libc::setns(self.netns_fd, libc::CLONE_NEWNET).into())?;
            self.isolate_mounts()?;
            // Again, through the mounts just made: the working directory entered before them
            // is a reference to its dentry, which a tmpfs mounted over a hidden path does not
            // move (a cwd under /sys/fs/cgroup would still be the host's cgroupfs).
            self.check(Step::Reenter, libc::chdir(self.cwd.as_ptr()).into())?;
            if self.drop_privileges {
                self.drop_to_agent()?;
            }
            let rc = libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1 as libc::c_ulong, 0, 0, 0);
            self.check(Step::NoNewPrivs, rc.into())?;
            if let Some(fd) = self.landlock_fd {
                self.check(Step::Landlock, super::landlock::restrict_self(fd))?;
            }
            // Last but close_range and exec, which the filters allow; seccompiler's
            // apply_filter makes two system calls on the prepared program and no allocation.
            for filter in &self.filters {
                if seccompiler::apply_filter(filter).is_err() {
                    return Err(self.fail(Step::Seccomp));
                }
            }
            // Mark, don't close: the status pipe must stay open until exec.
            let rc = libc::syscall(libc::SYS_close_range, 3 as libc::c_uint, libc::c_uint::MAX, CLOSE_RANGE_CLOEXEC);
            self.check(Step::CloseRange, rc)?;
        }
        Ok(())
    }

    /// The run's bounds, first of all (before anything the agent's code can reach): the
    /// cgroup v1 leaves joined (their pids and memory limits then count this task and all it
    /// starts; the cgroup v2 leaf was joined at birth), the oom_score_adj written while still
    /// root (with CAP_SYS_RESOURCE the write also sets its floor, `oom_score_adj_min`, so the
    /// agent cannot lower it again: fs/proc/base.c, __set_oom_adj) and RLIMIT_NPROC where asked.
    ///
    /// SAFETY: plain system calls on prepared values, no allocation.
    unsafe fn bound(&self) -> io::Result<()> {
        for &fd in &self.join_fds {
            let n = libc::write(fd, c"0".as_ptr().cast(), 1);
            self.check(Step::JoinCgroup, if n == 1 { 0 } else { -1 })?;
        }
        if let Some(adj) = &self.oom_score_adj {
            let fd = libc::open(c"/proc/self/oom_score_adj".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
            self.check(Step::OomScoreAdj, fd.into())?;
            let len = adj.as_bytes().len();
            let n = libc::write(fd, adj.as_ptr().cast(), len);
            libc::close(fd);
            self.check(Step::OomScoreAdj, if n == len as isize { 0 } else { -1 })?;
        }
        if let Some(n) = self.nproc {
            let limit = libc::rlimit64 { rlim_cur: n, rlim_max: n };
            let rc = libc::syscall(libc::SYS_prlimit64, 0, libc::RLIMIT_NPROC, &limit as *const libc::rlimit64,
                                   ptr::null_mut::<libc::rlimit64>());
            self.check(Step::Nproc, rc)?;
        }
        if let Some(soft) = self.nofile {
            let mut limit = libc::rlimit64 { rlim_cur: 0, rlim_max: 0 };
            let rc = libc::syscall(libc::SYS_prlimit64, 0, libc::RLIMIT_NOFILE, ptr::null::<libc::rlimit64>(),
                                   &mut limit as *mut libc::rlimit64);
            self.check(Step::Nofile, rc)?;
            limit.rlim_cur = soft.min(limit.rlim_max);
            let rc = libc::syscall(libc::SYS_prlimit64, 0, libc::RLIMIT_NOFILE, &limit as *const libc::rlimit64,
                                   ptr::null_mut::<libc::rlimit64>());
            self.check(Step::Nofile, rc)?;
        }
        Ok(())
    }

    /// Become the agent's user with no capabilities: groups, gid, capability bounding set +
    /// ambient set, uid, capset(0).
    ///
    /// SAFETY: plain system calls on prepared values, no allocation.
    unsafe fn drop_to_agent(&self) -> io::Result<()> {
        {
            // Raw system calls: glibc's wrappers would signal the parent's other threads.
            let rc = libc::syscall(libc::SYS_setgroups, self.groups.len(), self.groups.as_ptr());
            self.check(Step::Setgroups, rc)?;
            self.check(Step::Setresgid, libc::syscall(libc::SYS_setresgid, self.gid, self.gid, self.gid))?;
            // Done for every uid (not only root): with the bounding set empty, nothing the
            // child execs can gain a capability back.
            for cap in 0..=self.last_cap {
                let rc = libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0);
                self.check(Step::BoundingSet, rc.into())?;
            }
            let rc = libc::prctl(libc::PR_CAP_AMBIENT, libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong, 0, 0, 0);
            self.check(Step::Ambient, rc.into())?;
            self.check(Step::Setresuid, libc::syscall(libc::SYS_setresuid, self.uid, self.uid, self.uid))?;
            let header = CapHeader { version: LINUX_CAPABILITY_VERSION_3, pid: 0 };
            let data = [CapData { effective: 0, permitted: 0, inheritable: 0 }; 2];
            let rc = libc::syscall(libc::SYS_capset, &header as *const CapHeader, data.as_ptr());
            self.check(Step::Capset, rc)
        }
    }
}

impl Plan {
    /// The child's whole life: the working directory, [`Plan::enter`], then execve(2) of
    /// each of `exec_paths` until one succeeds. Never returns: on a failure the step and
    /// errno go to the status pipe and the child exits with 127.
    ///
    /// SAFETY: to be called only in the child of `clone3`, on a plan prepared before it.
    pub unsafe fn run_child(&self) -> ! {
        if libc::chdir(self.cwd.as_ptr()) != 0 {
            self.fail(Step::Chdir);
            libc::_exit(127);
        }
        if self.enter().is_ok() {
            let errno = self.exec();
            self.fail_with(Step::Exec, errno);
        }
        libc::_exit(127)
    }

    /// execve(2) each candidate in turn, as execvp(3) does: a missing file or folder tries
    /// the next, a refused one is remembered (EACCES wins over ENOENT), anything else stops
    /// the search. Returns the errno to report.
    unsafe fn exec(&self) -> i32 {
        let mut refused = false;
        let mut last = libc::ENOENT;
        for path in &self.exec_paths {
            libc::execve(path.as_ptr(), self.argv.as_ptr(), self.envp.as_ptr());
            last = *libc::__errno_location();
            match last {
                libc::EACCES => refused = true,
                libc::ENOENT | libc::ENOTDIR | libc::ESTALE | libc::ENODEV | libc::ETIMEDOUT => {}
                _ => return last,
            }
        }
        if refused { libc::EACCES } else { last }
    }
}
