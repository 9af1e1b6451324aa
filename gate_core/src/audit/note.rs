//! Signed checkpoints of the chain: a C2SP `tlog-checkpoint` body signed as a C2SP
//! `signed-note` with Ed25519 (https://c2sp.org/tlog-checkpoint, https://c2sp.org/signed-note).
//!
//! For a hash chain the checkpoint's "tree size" is the number of records before the
//! checkpoint record and its "root hash" is the chain head: the hash of the last of them
//! (the checkpoint record's own `prev`). It is a chain head, not a Merkle tree root.
//!
//! The key file holds one line in the format of Go's `golang.org/x/mod/sumdb/note`
//! signer keys: `PRIVATE+KEY+<name>+<key id, 8 hex>+<base64(0x01 || 32-byte seed)>`.
//! The verifier key is `<name>+<key id>+<base64(0x01 || 32-byte public key)>`; the key id
//! is the first 4 bytes of SHA-256(`<name>` || `\n` || 0x01 || public key).

use std::fs::{self, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ed25519_dalek::{Signer, SigningKey};
use sha2::{Digest, Sha256};

use crate::root_dir::{self, UnsafeDir};

/// Where the host's audit signing key is kept: its own directory (made 0700 root), which
/// runs hide from the agent (runner.py `_hidden_paths`), as the CA's `private`.
pub const DEFAULT_KEY: &str = "/var/lib/gatewrap/audit/signing-key";
/// The signed-note signature type of Ed25519.
const ALG_ED25519: u8 = 0x01;
/// The first word of a checkpoint's extension line that names the segment a rotated file
/// continues (`rotated_from audit.jsonl.000000005001`; see [`NoteKey::checkpoint`]).
pub const ROTATED_FROM_LINE: &str = "rotated_from";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot use the audit key's directory: {0}; it must be root's and closed to others (mode 0700)")]
    Dir(UnsafeDir),
    #[error("cannot read or create the audit key {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("audit key {path} is not a signed-note Ed25519 private key (PRIVATE+KEY+name+id+key): remove it to have a new one made, or restore the right one")]
    Malformed { path: PathBuf },
    #[error("audit key {path} is readable or writable by others (mode {mode:o}): chmod 0600 it")]
    Mode { path: PathBuf, mode: u32 },
}

/// An Ed25519 signer with its signed-note name.
pub struct NoteKey {
    name: String,
    key: SigningKey,
}

impl std::fmt::Debug for NoteKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NoteKey({})", self.verifier())
    }
}

/// The key name of a new key: `<hostname>/gatewrap-audit` (hostname(7); `localhost` if
/// it has none usable in a key name: no whitespace, no `+`).
fn default_name() -> String {
    let host = fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    let host = host.trim();
    let host = if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c == '+') { "localhost" } else { host };
    format!("{host}/gatewrap-audit")
}

impl NoteKey {
    /// Load the key at `path`, making it (and its directory, 0700) if missing: a new
    /// random seed (getrandom(2)) named `<hostname>/gatewrap-audit`, written 0600 to a
    /// temporary file and linked into place (so concurrent first uses agree on one key).
    pub fn load_or_create(path: &Path) -> Result<NoteKey, KeyError> {
        let io_err = |source| KeyError::Io { path: path.to_path_buf(), source };
        let dir = match path.parent() {
            Some(p) if !p.as_os_str().is_empty() => p,
            _ => Path::new("."),
        };
        root_dir::ensure(dir, 0o700, 0o077).map_err(KeyError::Dir)?;
        match fs::symlink_metadata(path) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::NotFound => Self::create(path, dir).map_err(io_err)?,
            Err(e) => return Err(io_err(e)),
        }
        let meta = fs::symlink_metadata(path).map_err(io_err)?;
        if !meta.is_file() {
            return Err(KeyError::Malformed { path: path.to_path_buf() });
        }
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Mode { path: path.to_path_buf(), mode });
        }
        let text = fs::read_to_string(path).map_err(io_err)?;
        Self::parse(text.trim_end()).ok_or_else(|| KeyError::Malformed { path: path.to_path_buf() })
    }

    fn create(path: &Path, dir: &Path) -> io::Result<()> {
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| io::Error::other(e.to_string()))?;
        let key = NoteKey { name: default_name(), key: SigningKey::from_bytes(&seed) };
        let tmp = dir.join(format!(".audit-key.{}", std::process::id()));
        let _ = fs::remove_file(&tmp);
        let mut f = OpenOptions::new().write(true).create_new(true).mode(0o600).custom_flags(libc::O_NOFOLLOW).open(&tmp)?;
        let written = f.write_all(format!("{}\n", key.private_text()).as_bytes()).and_then(|()| f.sync_all());
        // link(2) never replaces: if another process made the key first, keep theirs.
        let linked = written.and_then(|()| match fs::hard_link(&tmp, path) {
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(()),
            r => r,
        });
        let _ = fs::remove_file(&tmp);
        linked
    }

    /// Parse `PRIVATE+KEY+<name>+<id>+<base64>`; None unless it is an Ed25519 key whose
    /// id matches.
    fn parse(text: &str) -> Option<NoteKey> {
        let rest = text.strip_prefix("PRIVATE+KEY+")?;
        // The name has no `+`; the base64 key may.
        let mut parts = rest.splitn(3, '+');
        let (name, id, b64) = (parts.next()?, parts.next()?, parts.next()?);
        let raw = B64.decode(b64).ok()?;
        let (&alg, seed) = raw.split_first()?;
        let seed: [u8; 32] = seed.try_into().ok()?;
        if alg != ALG_ED25519 || name.is_empty() || name.chars().any(|c| c.is_whitespace() || c == '+') {
            return None;
        }
        let key = NoteKey { name: name.to_string(), key: SigningKey::from_bytes(&seed) };
        (id == hex4(&key.key_id())).then_some(key)
    }

    /// The key name (also the checkpoints' origin line).
    pub fn name(&self) -> &str {
        &self.name
    }

    fn key_id(&self) -> [u8; 4] {
        let mut h = Sha256::new();
        h.update(self.name.as_bytes());
        h.update(b"\n");
        h.update([ALG_ED25519]);
        h.update(self.key.verifying_key().as_bytes());
        let d = h.finalize();
        [d[0], d[1], d[2], d[3]]
    }

    fn private_text(&self) -> String {
        let mut raw = vec![ALG_ED25519];
        raw.extend_from_slice(self.key.as_bytes());
        format!("PRIVATE+KEY+{}+{}+{}", self.name, hex4(&self.key_id()), B64.encode(raw))
    }

    /// The verifier key, `<name>+<id>+<base64(0x01 || public key)>`.
    pub fn verifier(&self) -> String {
        let mut raw = vec![ALG_ED25519];
        raw.extend_from_slice(self.key.verifying_key().as_bytes());
        format!("{}+{}+{}", self.name, hex4(&self.key_id()), B64.encode(raw))
    }

    /// The signed note of the checkpoint `size`, `root`:
    /// `<origin>\n<size>\n<base64 root>\n[<extension>\n]\n— <name> <base64(key id || signature)>\n`,
    /// the signature over the body (its lines and their newlines). A rotated file's opening
    /// checkpoint has one extension line (tlog-checkpoint allows extension lines after the
    /// root hash), [`ROTATED_FROM_LINE`] and the segment's name: the signature then vouches
    /// that the writer started a file here, continuing that segment, so a log cut back to
    /// any other checkpoint cannot pass for a rotated one.
    pub fn checkpoint(&self, size: u64, root: &[u8; 32], rotated_from: Option<&str>) -> String {
        let mut body = format!("{}\n{size}\n{}\n", self.name, B64.encode(root));
        if let Some(from) = rotated_from {
            body.push_str(&format!("{ROTATED_FROM_LINE} {from}\n"));
        }
        let sig = self.key.sign(body.as_bytes());
        let mut raw = self.key_id().to_vec();
        raw.extend_from_slice(&sig.to_bytes());
        format!("{body}\n\u{2014} {} {}\n", self.name, B64.encode(raw))
    }
}

fn hex4(b: &[u8; 4]) -> String {
    b.iter().map(|b| format!("{b:02x}")).collect()
}
