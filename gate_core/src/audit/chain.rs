//! The hash chain: every record carries `seq` (its 1-based position in the chain) and
//! `prev` (the SHA-256, lowercase hex, of the previous line's exact bytes, its newline
//! included); the first record of a log carries [`genesis`].
//!
//! Writers in several processes share one file: under the log's `flock(2)` the writer reads
//! the file's last line back ([`Head::of_file`]) rather than trusting what it wrote itself.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::cap::MAX_RECORD;

/// What [`genesis`] hashes.
pub const GENESIS_TEXT: &str = "gatewrap audit log v1\n";

/// The `prev` of a log's first record: SHA-256 of [`GENESIS_TEXT`].
pub fn genesis() -> [u8; 32] {
    Sha256::digest(GENESIS_TEXT.as_bytes()).into()
}

/// SHA-256 of `line`.
pub fn hash(line: &[u8]) -> [u8; 32] {
    Sha256::digest(line).into()
}

/// Lowercase hex of a hash.
pub fn hex(h: &[u8; 32]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(64);
    for b in h {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 15)] as char);
    }
    out
}

/// The chain's head as the file holds it: the hash and `seq` of its last line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Head {
    /// The last line's hash ([`genesis`] for an empty file).
    pub hash: [u8; 32],
    /// The last line's `seq`; 0 for an empty file, or a last line without one (a record
    /// written before the chain, or not JSON): the next record starts a chain at 1.
    pub seq: u64,
    /// The last line is a `checkpoint` record.
    pub checkpoint: bool,
    /// Where the last line starts (0: it is the file's only line, or the file is empty).
    pub start: u64,
}

#[derive(Deserialize)]
struct Tail<'a> {
    seq: Option<u64>,
    #[serde(borrow)]
    event: Option<&'a str>,
}

impl Head {
    /// The head of `file` (of `len` bytes): its last line is read back (at most
    /// [`MAX_RECORD`] bytes from the end, the longest a line is; a longer one, never
    /// written by us, counts as not a record). A last line without its newline (a cut
    /// write) is hashed as it is.
    pub fn of_file(file: &File, len: u64) -> io::Result<Head> {
        if len == 0 {
            return Ok(Head { hash: genesis(), seq: 0, checkpoint: false, start: 0 });
        }
        let n = len.min(MAX_RECORD as u64 + 1);
        let mut buf = vec![0u8; n as usize];
        file.read_exact_at(&mut buf, len - n)?;
        let body = buf.strip_suffix(b"\n").unwrap_or(&buf);
        let start = match body.iter().rposition(|&b| b == b'\n') {
            Some(i) => i + 1,
            None if n == len => 0,
            None => return Ok(Head { hash: hash(&buf), seq: 0, checkpoint: false, start: len - n }),
        };
        let last = &buf[start..];
        let tail: Option<Tail> = serde_json::from_slice(last).ok();
        Ok(Head {
            hash: hash(last),
            seq: tail.as_ref().and_then(|t| t.seq).unwrap_or(0),
            checkpoint: tail.and_then(|t| t.event) == Some(super::fields::EVENT_CHECKPOINT),
            start: len - n + start as u64,
        })
    }
}

/// The longest `seq` is written (u64::MAX), for sizing a line before its place is known.
pub const SEQ_PLACEHOLDER: u64 = u64::MAX;
/// A `prev` of the right length, for sizing a line before its place is known.
pub const PREV_PLACEHOLDER: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// `line` (serialized with [`SEQ_PLACEHOLDER`] and [`PREV_PLACEHOLDER`] right after `v`
/// and `time`) with the placeholders replaced by `seq` and `prev`; never longer.
pub fn place(line: &str, time_prefix_len: usize, seq: u64, prev: &[u8; 32]) -> String {
    let placeholder = format!(",\"seq\":{SEQ_PLACEHOLDER},\"prev\":\"{PREV_PLACEHOLDER}\"");
    let (head, rest) = line.split_at(time_prefix_len);
    let rest = rest.strip_prefix(placeholder.as_str()).expect("seq and prev follow v and time");
    let mut out = String::with_capacity(line.len());
    out.push_str(head);
    out.push_str(&format!(",\"seq\":{seq},\"prev\":\"{}\"", hex(prev)));
    out.push_str(rest);
    out
}
