//! The baseline seccomp filter the launcher installs on the agent in every mode, built with
//! rust-vmm's `seccompiler` before `fork` and loaded in the child as its last step before exec.
//!
//! Seccomp filters are inherited across fork and kept across execve, and a process can only
//! add filters, never remove them (seccomp(2)); when several filters return `SECCOMP_RET_ERRNO`
//! the most recently installed one's errno wins, so each errno gets a filter of its own here
//! and they match disjoint system calls. Rules, in both modes:
//!
//! * `EPERM`: `ptrace`, `pidfd_getfd` (a socket taken from another process would carry no
//!   cgroup hooks: sock_addr hooks run from the socket's cgroup), `process_vm_readv`/`writev`,
//!   `bpf`, `setns`, `keyctl`/`add_key`/`request_key`, `kexec_*`, `*_module`,
//!   `perf_event_open`, `userfaultfd`; `ioctl` with request `TIOCSTI` (0x5412) or `TIOCLINUX`
//!   (0x541c) compared on its low 32 bits (the kernel's `cmd` is an `unsigned int`:
//!   ioctl(2)); `clone` and `unshare` with a namespace flag (see [`Mode`]).
//! * `ENOSYS`: `clone3` (its flags sit in memory a filter cannot read, among them
//!   `CLONE_INTO_CGROUP`; libc falls back to `clone`, whose flags the filter sees, and legacy
//!   `clone` takes only 32 bits of flags), `io_uring_*` (IORING_OP_SOCKET makes sockets
//!   without socket(2)), and every x32-ABI system call number (`nr | 0x40000000`, which shares
//!   `AUDIT_ARCH_X86_64` and would pass every rule keyed on the native numbers).
//! * `EAFNOSUPPORT`: `socket`/`socketpair` of a family other than `AF_UNIX`, `AF_INET`,
//!   `AF_INET6`, `AF_NETLINK` (low 32 bits of `domain`): AF_PACKET, AF_VSOCK (reaches the
//!   hypervisor host from any netns) and the rest pass no cgroup hook.
//! * Another architecture's system call (i386 `int 0x80`): the process is killed (seccompiler's
//!   architecture check).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition,
    SeccompFilter, SeccompRule, TargetArch,
};

/// What the launcher execs, which decides which namespaces and mounts the filter leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// nsjail, run as root, which must still create mount, pid, ipc and uts namespaces
    /// (`clone` with those flags, measured with strace; no user namespace: it runs without
    /// one) and mount and pivot_root its view; its own kafel policy then applies the full
    /// rules to the agent on top of this filter.
    Nsjail,
    /// The agent itself (`--jail none`): no new namespace of any kind, no mount system call.
    Direct,
}

/// `CLONE_NEW*` flags (linux/sched.h). `CLONE_NEWTIME` (0x80) is only meaningful to `unshare`:
/// in `clone` those bits are the exit signal.
const NEWNS: u64 = 0x0002_0000;
const NEWCGROUP: u64 = 0x0200_0000;
const NEWUTS: u64 = 0x0400_0000;
const NEWIPC: u64 = 0x0800_0000;
const NEWUSER: u64 = 0x1000_0000;
const NEWPID: u64 = 0x2000_0000;
const NEWNET: u64 = 0x4000_0000;
const NEWTIME: u64 = 0x0000_0080;

/// ioctl requests that type into or control a terminal (tty_ioctl(4), ioctl_console(2)).
const TIOCSTI: u64 = 0x5412;
const TIOCLINUX: u64 = 0x541c;

/// Socket families left to the agent (linux/socket.h): unix, inet, inet6, netlink.
const FAMILIES: [u64; 4] = [1, 2, 10, 16];

/// x32 system calls are the x86_64 ABI's numbers with this bit set (asm/unistd.h); the x32
/// table ends below 0x40000000 + 548 on Linux 6.18 (512..547 are x32-only entries).
const X32_BIT: i64 = 0x4000_0000;
const X32_LAST: i64 = 600;

/// Error building the filter (a seccompiler rule or program error).
#[derive(Debug, thiserror::Error)]
#[error("cannot build the launcher's seccomp filter: {0}")]
pub struct BuildError(#[from] seccompiler::BackendError);

fn arch() -> TargetArch {
    if cfg!(target_arch = "aarch64") {
        TargetArch::aarch64
    } else if cfg!(target_arch = "riscv64") {
        TargetArch::riscv64
    } else {
        TargetArch::x86_64
    }
}

/// One rule: argument `arg`'s low 32 bits, masked with `mask`, equal `value`.
fn low32(arg: u8, mask: u64, value: u64) -> Result<SeccompRule, BuildError> {
    Ok(SeccompRule::new(vec![SeccompCondition::new(arg, Len::Dword, Op::MaskedEq(mask), value)?])?)
}

/// One rule per flag: any of `flags` set in argument 0.
fn any_flag(flags: &[u64]) -> Result<Vec<SeccompRule>, BuildError> {
    flags.iter().map(|&f| low32(0, f, f)).collect()
}

fn program(rules: BTreeMap<i64, Vec<SeccompRule>>, errno: i32) -> Result<BpfProgram, BuildError> {
    let filter = SeccompFilter::new(rules, SeccompAction::Allow, SeccompAction::Errno(errno as u32), arch())?;
    Ok(filter.try_into()?)
}

fn eperm(mode: Mode) -> Result<BpfProgram, BuildError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> = [
        libc::SYS_ptrace,
        libc::SYS_pidfd_getfd,
        libc::SYS_process_vm_readv,
        libc::SYS_process_vm_writev,
        libc::SYS_bpf,
        libc::SYS_setns,
        libc::SYS_keyctl,
        libc::SYS_add_key,
        libc::SYS_request_key,
        libc::SYS_kexec_load,
        libc::SYS_kexec_file_load,
        libc::SYS_init_module,
        libc::SYS_finit_module,
        libc::SYS_delete_module,
        libc::SYS_perf_event_open,
        libc::SYS_userfaultfd,
    ]
    .into_iter()
    .map(|nr| (nr, vec![]))
    .collect();
    rules.insert(libc::SYS_ioctl, vec![low32(1, u32::MAX.into(), TIOCSTI)?, low32(1, u32::MAX.into(), TIOCLINUX)?]);
    let (clone, unshare): (&[u64], &[u64]) = match mode {
        Mode::Nsjail => (&[NEWNET, NEWCGROUP, NEWUSER], &[NEWNET, NEWCGROUP, NEWUSER, NEWTIME]),
        Mode::Direct => (
            &[NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET],
            &[NEWNS, NEWCGROUP, NEWUTS, NEWIPC, NEWUSER, NEWPID, NEWNET, NEWTIME],
        ),
    };
    rules.insert(libc::SYS_clone, any_flag(clone)?);
    rules.insert(libc::SYS_unshare, any_flag(unshare)?);
    if mode == Mode::Direct {
        for nr in [
            libc::SYS_mount,
            libc::SYS_umount2,
            libc::SYS_pivot_root,
            libc::SYS_open_tree,
            libc::SYS_move_mount,
            libc::SYS_fsopen,
            libc::SYS_fsconfig,
            libc::SYS_fsmount,
            libc::SYS_fspick,
            libc::SYS_mount_setattr,
        ] {
            rules.insert(nr, vec![]);
        }
    }
    program(rules, libc::EPERM)
}

fn enosys() -> Result<BpfProgram, BuildError> {
    let mut rules: BTreeMap<i64, Vec<SeccompRule>> =
        [libc::SYS_clone3, libc::SYS_io_uring_setup, libc::SYS_io_uring_enter, libc::SYS_io_uring_register]
            .into_iter()
            .map(|nr| (nr, vec![]))
            .collect();
    if arch() == TargetArch::x86_64 {
        rules.extend((0..=X32_LAST).map(|nr| (X32_BIT | nr, vec![])));
    }
    program(rules, libc::ENOSYS)
}

fn eafnosupport() -> Result<BpfProgram, BuildError> {
    let other_family = || -> Result<Vec<SeccompRule>, BuildError> {
        let conds = FAMILIES
            .iter()
            .map(|&f| SeccompCondition::new(0, Len::Dword, Op::Ne, f))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(vec![SeccompRule::new(conds)?])
    };
    let rules = BTreeMap::from([(libc::SYS_socket, other_family()?), (libc::SYS_socketpair, other_family()?)]);
    program(rules, libc::EAFNOSUPPORT)
}

/// The baseline filters for `mode`, in the order the child installs them (EPERM, ENOSYS,
/// EAFNOSUPPORT). Allocates: call before `fork`.
///
/// Errors: [`BuildError`] when seccompiler rejects a rule or the program is too long
/// (BPF_MAXINSNS, 4096).
pub fn build(mode: Mode) -> Result<Vec<BpfProgram>, BuildError> {
    Ok(vec![eperm(mode)?, enosys()?, eafnosupport()?])
}
