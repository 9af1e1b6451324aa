//! Directories the gate keeps its own files in (the audit log's, the TLS inspection CA's):
//! they must be root's and closed to others, all the way up, or a local user (or a root
//! agent run without the jail) could swap what the gate reads or writes there.

use std::fs::{self, DirBuilder};
use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
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

/// `mkdir -p path`, the directories it makes with `mode`; an existing directory is never
/// chmodded (a directory such as `/tmp` keeps its mode). Then [`check`] it.
pub fn ensure(path: &Path, mode: u32, deny: u32) -> Result<(), UnsafeDir> {
    match fs::symlink_metadata(path) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            DirBuilder::new().recursive(true).mode(mode).create(path).map_err(UnsafeDir::io("create", path))?
        }
        Err(e) => return Err(UnsafeDir::io("stat", path)(e)),
        Ok(_) => {}
    }
    check(path, deny)
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
