//! Directories the gate keeps its own files in (the audit log's, the TLS inspection CA's):
//! they must be root's and closed to others, all the way up, or a local user (or a root
//! agent run without the jail) could swap what the gate reads or writes there.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Why a directory is not safe to keep the gate's files in.
#[derive(Debug, thiserror::Error)]
pub enum UnsafeDir {
    #[error("cannot {what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: io::Error },
    /// `path` (the directory itself, or one above it) fails the check: `why` says how.
    #[error("{path} {why}")]
    Unsafe { path: PathBuf, why: &'static str },
}

impl UnsafeDir {
    fn io<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> UnsafeDir + 'a {
        move |source| UnsafeDir::Io { what, path: path.to_path_buf(), source }
    }
}

/// `mkdir -p path`: `path` itself made with `mode`, the missing directories above it with
/// 0755, whatever the umask (a 0700 `/var/lib/gatewrap/audit` must not close
/// `/var/lib/gatewrap`, where the CA folder the agent reads goes too, nor a `sudo` user's
/// umask 077 the CA folder); an existing directory is never chmodded (a directory such as
/// `/tmp` keeps its mode). Then [`check`] it.
pub fn ensure(path: &Path, mode: u32, deny: u32) -> Result<(), UnsafeDir> {
    let missing: Vec<&Path> = path.ancestors().take_while(|p| !p.as_os_str().is_empty() && !exists(p)).collect();
    for (i, dir) in missing.iter().rev().enumerate() {
        let m = if i + 1 == missing.len() { mode } else { 0o755 };
        match DirBuilder::new().mode(0o700).create(dir) {
            Ok(()) => fs::set_permissions(dir, fs::Permissions::from_mode(m)).map_err(UnsafeDir::io("chmod", dir))?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {} // made meanwhile: not ours to chmod
            Err(e) => return Err(UnsafeDir::io("create", dir)(e)),
        }
    }
    check(path, deny)
}

/// Whether `path` exists, without following a final symbolic link (one counts as there).
fn exists(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok()
}

/// `path` is a real directory (not a symbolic link) owned by the gate's user (root) without
/// the mode bits `deny` (e.g. `0o022`: not writable by group and others), and every
/// directory above it is root's (or the gate's user's) and not writable by group or others,
/// unless it is sticky (as `/tmp`: others cannot rename or remove what they do not own
/// there, see inode(7) "S_ISVTX").
pub fn check(path: &Path, deny: u32) -> Result<(), UnsafeDir> {
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    let unsafe_dir = |why| Err(UnsafeDir::Unsafe { path: path.to_path_buf(), why });
    let meta = fs::symlink_metadata(path).map_err(UnsafeDir::io("stat", path))?;
    if meta.file_type().is_symlink() || !meta.is_dir() {
        return unsafe_dir("is a symbolic link or not a directory");
    }
    if meta.uid() != me {
        return unsafe_dir("is not owned by root");
    }
    if meta.mode() & deny != 0 {
        return unsafe_dir(if deny & 0o044 != 0 { "is readable or writable by others" } else { "is writable by others" });
    }
    let real = fs::canonicalize(path).map_err(UnsafeDir::io("resolve", path))?;
    for dir in real.ancestors().skip(1) {
        let m = fs::metadata(dir).map_err(UnsafeDir::io("stat", dir))?;
        let sticky = m.mode() & 0o1000 != 0;
        if (m.uid() != me && m.uid() != 0) || (m.mode() & 0o022 != 0 && !sticky) {
            return Err(UnsafeDir::Unsafe { path: dir.to_path_buf(), why: "(above it) is not root's, or is writable by others" });
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_directory_gets_its_mode_and_the_folders_made_above_it_0755() {
        let base = std::env::temp_dir().join(format!("gw-root-dir-{}", std::process::id()));
        let leaf = base.join("gatewrap").join("audit");
        let made = ensure(&leaf, 0o700, 0o077);
        let mode = |p: &Path| fs::metadata(p).map(|m| m.mode() & 0o777).unwrap_or(0);
        let modes = (mode(&base), mode(&base.join("gatewrap")), mode(&leaf));
        fs::remove_dir_all(&base).unwrap();
        // check() may refuse the host's temp dir (e.g. not root's); making the folders is the point
        assert!(!matches!(made, Err(UnsafeDir::Io { .. })), "{made:?}");
        assert_eq!(modes, (0o755, 0o755, 0o700), "{:o} {:o} {:o}", modes.0, modes.1, modes.2);
    }
}
