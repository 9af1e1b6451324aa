//! The launcher's Landlock domain: it handles no file system access (the mount view and the
//! jail decide what files the agent sees) and exists for what every Landlock domain brings:
//! a process in it cannot ptrace, nor so open `/proc/PID/mem` of, a process outside it
//! (kernel doc userspace-api/landlock.rst, "Ptrace restrictions", since ABI 1), and, from ABI 6
//! (Linux 6.12), its scopes: no `connect`/`sendto` to an abstract unix socket bound outside the
//! domain (`LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`) and no signal to a process outside it
//! (`LANDLOCK_SCOPE_SIGNAL`); both fail with `EPERM`.
//!
//! Three raw system calls (the kernel ABI, as the uapi header defines it): the ABI probe and
//! `landlock_create_ruleset` run before `fork`, `landlock_restrict_self` in the child (one
//! system call on a prepared fd, async-signal-safe). The `landlock` crate was not used: its
//! `restrict_self` also decides compatibility and builds a status at that point, which the
//! child between fork and exec must not do.

use std::io;
use std::os::fd::{FromRawFd, OwnedFd};

use super::seccomp::Mode;

/// `struct landlock_ruleset_attr` (include/uapi/linux/landlock.h): `handled_access_net` since
/// ABI 4, `scoped` since ABI 6. A kernel of an older ABI accepts this larger struct when the
/// fields it does not know are zero (copy_struct_from_user: `E2BIG` otherwise).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RulesetAttr {
    pub handled_access_fs: u64,
    pub handled_access_net: u64,
    pub scoped: u64,
}

/// `landlock_create_ruleset` flag: return the ABI version (attr NULL, size 0).
const CREATE_RULESET_VERSION: u32 = 1 << 0;
/// `LANDLOCK_ACCESS_FS_MAKE_BLOCK` (ABI 1): create a block device.
pub const ACCESS_FS_MAKE_BLOCK: u64 = 1 << 11;
/// `LANDLOCK_SCOPE_ABSTRACT_UNIX_SOCKET`, `LANDLOCK_SCOPE_SIGNAL` (ABI 6).
pub const SCOPE_ABSTRACT_UNIX_SOCKET: u64 = 1 << 0;
pub const SCOPE_SIGNAL: u64 = 1 << 1;
/// The first ABI with scopes (Linux 6.12).
pub const ABI_SCOPES: u32 = 6;

/// The running kernel's Landlock ABI version (1 for Linux 5.13, 6 for 6.12, ...), or `None`
/// when Landlock is not built (`ENOSYS`) or not enabled at boot (`EOPNOTSUPP`), or any other
/// refusal of the probe (landlock_create_ruleset(2), `LANDLOCK_CREATE_RULESET_VERSION`).
pub fn abi() -> Option<u32> {
    // SAFETY: the documented version query: NULL attr, size 0, no memory is read or written.
    let rc = unsafe {
        libc::syscall(libc::SYS_landlock_create_ruleset, std::ptr::null::<RulesetAttr>(), 0usize,
                      CREATE_RULESET_VERSION)
    };
    (rc > 0).then_some(rc as u32)
}

/// The ruleset the launcher applies for `abi` (from [`abi`]) and `mode`, or `None` for none:
///
/// 1. No Landlock: none (gatewrap carries on; `gatewrap doctor` says what is then open).
/// 2. ABI 6 and later, both modes: the two scopes and no access right. A domain that handles
///    no file system right leaves mount(2) and pivot_root(2) alone (the kernel's sb_mount and
///    sb_pivotroot hooks only refuse them to a domain that handles file system access:
///    landlock.rst, "Filesystem topology modification"), so nsjail still builds its view.
/// 3. ABI 1 to 5, `--jail none`: a ruleset must handle something (an empty one is refused
///    with `ENOMSG`), so it handles `MAKE_BLOCK` with no rule: making a block device needs
///    `CAP_MKNOD` (mknod(2)), which the agent, without capabilities, never has. Mounts are then
///    refused, as the baseline seccomp filter already does in this mode.
/// 4. ABI 1 to 5 under nsjail: none, since handling any file system right would refuse
///    nsjail's mounts; the jail's pid namespace already hides the host's processes.
pub fn ruleset_for(abi: Option<u32>, mode: Mode) -> Option<RulesetAttr> {
    match (abi?, mode) {
        (v, _) if v >= ABI_SCOPES => Some(RulesetAttr {
            handled_access_fs: 0,
            handled_access_net: 0,
            scoped: SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL,
        }),
        (_, Mode::Direct) => Some(RulesetAttr { handled_access_fs: ACCESS_FS_MAKE_BLOCK, handled_access_net: 0, scoped: 0 }),
        (_, Mode::Nsjail) => None,
    }
}

/// Create the ruleset (landlock_create_ruleset(2)); the fd is close-on-exec (the kernel
/// always sets `O_CLOEXEC` on it). Errors: the kernel's errno (`ENOMSG` for an empty ruleset,
/// `EINVAL` for a right or scope this ABI does not know).
pub fn create(attr: &RulesetAttr) -> io::Result<OwnedFd> {
    // SAFETY: attr points to a live struct of the size passed.
    let rc = unsafe {
        libc::syscall(libc::SYS_landlock_create_ruleset, attr as *const RulesetAttr,
                      std::mem::size_of::<RulesetAttr>(), 0u32)
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(rc as libc::c_int) })
}

/// Enforce the ruleset `fd` on the calling thread and its future children
/// (landlock_restrict_self(2); needs no_new_privs or `CAP_SYS_ADMIN`). Async-signal-safe: one
/// system call; returns its raw result (negative on failure, errno set).
///
/// # Safety
/// A plain system call; `fd` must be a ruleset fd the caller keeps open.
pub unsafe fn restrict_self(fd: libc::c_int) -> libc::c_long {
    libc::syscall(libc::SYS_landlock_restrict_self, fd, 0u32)
}
