//! Rotation by size: when the next line would take the log past its limit, the file is
//! renamed to a segment, `<log>.<seq of its first record, 12 digits or more>` (e.g.
//! `audit.jsonl.000000005001`), and a new file takes the log's path, its first record a
//! checkpoint continuing the chain (`seq` one more, `prev` the hash of the old file's last
//! line, `rotated_from` the segment's name).
//!
//! All of it happens under the old file's `flock(2)`, which every writer takes before it
//! writes: the old file first gets a closing checkpoint (unless its last record is one), the
//! new file is made under a hidden name, locked, given its opening checkpoint, and only then
//! put in place (`link(2)` of the old file to the segment's name, then `rename(2)` of the new
//! one over the path: the path always names a whole log, never nothing). A writer that waited
//! for the lock sees that its descriptor is no longer the file at the path and opens the new
//! one ([`super::AuditLog::write`]). A failure at any step leaves the log at the path as it
//! was (a closing checkpoint may remain: it is a valid record) and is the record's error.

use std::ffi::OsString;
use std::fs::{self, File};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::cap::MAX_RECORD;

/// The default size limit of the live file: 100 MiB.
pub const DEFAULT_MAX_SIZE: u64 = 100 << 20;
/// The smallest limit accepted (4 KiB): a new file must hold its opening checkpoint and a line.
pub const MIN_MAX_SIZE: u64 = 4096;
/// Digits of a segment's sequence number, at least (zero-padded: names sort as the chain).
const SEQ_DIGITS: usize = 12;

/// When to rotate, and how many rotated segments to keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rotation {
    /// Rotate before a line that would take the live file past this many bytes.
    pub max_size: u64,
    /// Keep at most this many segments (the oldest are deleted after a rotation); None: all.
    pub keep: Option<usize>,
}

/// The path of the segment whose first record has `seq`: `<path>.<seq, 12 digits or more>`.
pub fn segment_path(path: &Path, seq: u64) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(format!(".{seq:0SEQ_DIGITS$}"));
    PathBuf::from(name)
}

/// The first `seq` a segment's file name says (its suffix after `<base>.`, 12 digits or
/// more), or None when `name` is not one of the log's segments.
pub fn segment_seq(base: &str, name: &str) -> Option<u64> {
    let digits = name.strip_prefix(base)?.strip_prefix('.')?;
    if digits.len() < SEQ_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The log's rotated segments beside `path`, oldest first: (first seq, path).
pub fn segments(path: &Path) -> io::Result<Vec<(u64, PathBuf)>> {
    let (dir, base) = split(path);
    let mut out = Vec::new();
    for e in fs::read_dir(dir)? {
        let e = e?;
        let name = e.file_name();
        if let Some(seq) = name.to_str().and_then(|n| segment_seq(&base, n)) {
            if e.file_type()?.is_file() {
                out.push((seq, e.path()));
            }
        }
    }
    out.sort();
    Ok(out)
}

/// The directory and file name of `path`.
fn split(path: &Path) -> (PathBuf, String) {
    let dir = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let base = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    (dir, base)
}

/// The hidden name the new file is made under before it takes the path:
/// `<dir>/.<base>.new.<pid>`.
pub fn staging_path(path: &Path) -> PathBuf {
    let (dir, base) = split(path);
    let mut name = OsString::from(".");
    name.push(base);
    name.push(format!(".new.{}", std::process::id()));
    dir.join(name)
}

#[derive(Deserialize)]
struct First {
    seq: Option<u64>,
}

/// The `seq` of `file`'s first line (read from its start, at most [`MAX_RECORD`] bytes);
/// 0 when it has none (a line written before the chain existed, or not JSON).
pub fn first_seq(file: &File, len: u64) -> io::Result<u64> {
    let n = len.min(MAX_RECORD as u64);
    let mut buf = vec![0u8; n as usize];
    file.read_exact_at(&mut buf, 0)?;
    let line = match buf.iter().position(|&b| b == b'\n') {
        Some(i) => &buf[..=i],
        None => return Ok(0),
    };
    Ok(serde_json::from_slice::<First>(line).ok().and_then(|f| f.seq).unwrap_or(0))
}

/// Put the segment name on the old file (a second name: `link(2)`), then the new file at
/// the path (`rename(2)`, which replaces the old name atomically). A segment name that is
/// already the old file (a rotation cut short by a crash after its link) is kept.
pub fn swap(path: &Path, old: &File, staged: &Path, segment: &Path) -> io::Result<()> {
    match fs::hard_link(path, segment) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
            let (mine, there) = (old.metadata()?, fs::symlink_metadata(segment)?);
            if (mine.dev(), mine.ino()) != (there.dev(), there.ino()) {
                return Err(io::Error::new(
                    io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not the file being rotated: move it away", segment.display()),
                ));
            }
        }
        Err(e) => return Err(e),
    }
    fs::rename(staged, path)
}

/// Delete the oldest segments beyond `keep`. Returns the paths it could not delete, with why.
pub fn prune(path: &Path, keep: usize) -> Vec<(PathBuf, io::Error)> {
    let mut failed = Vec::new();
    match segments(path) {
        Ok(segs) if segs.len() > keep => {
            for (_, p) in &segs[..segs.len() - keep] {
                if let Err(e) = fs::remove_file(p) {
                    failed.push((p.clone(), e));
                }
            }
        }
        Ok(_) => {}
        Err(e) => failed.push((path.to_path_buf(), e)),
    }
    failed
}

/// `file`'s length in bytes when it (locked) is still the file at `path`: the same device
/// and inode. None when the path is gone or names another file (rotated, or replaced).
pub fn current_len(path: &Path, file: &File) -> io::Result<Option<u64>> {
    let mine = file.metadata()?;
    match fs::symlink_metadata(path) {
        Ok(there) if (mine.dev(), mine.ino()) == (there.dev(), there.ino()) => Ok(Some(mine.len())),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}
