//! The gate's CA for TLS inspection: one per host install, made on first use and reused.
//!
//! Layout under the CA directory (default [`DEFAULT_CA_DIR`]):
//! - `ca.crt`: the CA certificate, PEM, mode 0644 (the agent trusts it: see the run's
//!   `SSL_CERT_FILE` and friends);
//! - `private/ca.key`: its ECDSA P-256 key, PKCS#8 PEM, mode 0600, in a 0700 directory
//!   owned by root, which the launcher hides from the agent (an empty tmpfs over it).
//!
//! The certificate is a CA with path length 0 (it signs leaves only; RFC 5280 §4.2.1.9),
//! key usages keyCertSign and cRLSign, valid ten years.

use std::fs::{self, File, OpenOptions};
use std::io::{self, Read, Write};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose};
use rustls_pki_types::CertificateDer;
use time::{Duration, OffsetDateTime};

use crate::root_dir::{self, UnsafeDir};

/// Where a host install keeps its CA unless told otherwise.
pub const DEFAULT_CA_DIR: &str = "/var/lib/gatewrap/ca";
pub const CERT_FILE: &str = "ca.crt";
pub const KEY_DIR: &str = "private";
pub const KEY_FILE: &str = "ca.key";
const VALID_DAYS: i64 = 3650;

#[derive(Debug, thiserror::Error)]
pub enum CaError {
    #[error("tls inspection CA: cannot {what} {path}: {source}")]
    Io { what: &'static str, path: PathBuf, source: io::Error },
    #[error("tls inspection CA: {path} is readable by others or not owned by root (mode {mode:o}); the key must be 0600 root: fix it, or remove the CA directory to make a new CA")]
    Exposed { path: PathBuf, mode: u32 },
    #[error("tls inspection CA: {path} {why}; choose a --ca-dir only root can write (default /var/lib/gatewrap/ca)")]
    Unsafe { path: PathBuf, why: &'static str },
    #[error("tls inspection CA: {path}: {msg}; remove the CA directory to make a new CA")]
    Bad { path: PathBuf, msg: String },
    #[error("tls inspection CA: cannot make a certificate: {0}")]
    Rcgen(#[from] rcgen::Error),
}

/// The CA: signs leaf certificates ([`super::leaf`]).
pub struct Ca {
    pub(super) issuer: Issuer<'static, KeyPair>,
    /// The CA certificate (DER), sent after each leaf.
    pub(super) cert: CertificateDer<'static>,
    /// The CA certificate as PEM (what `ca.crt` holds).
    pub cert_pem: String,
    /// Path of `ca.crt`.
    pub cert_path: PathBuf,
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(io::Error) -> CaError + 'a {
    move |source| CaError::Io { what, path: path.to_path_buf(), source }
}

/// `mkdir -p path` (new directories get `mode`) and check it is safe to keep a key under
/// ([`root_dir::check`], `deny` = the mode bits others must not have).
fn ensure_dir(path: &Path, mode: u32, deny: u32) -> Result<(), CaError> {
    root_dir::ensure(path, mode, deny).map_err(|e| match e {
        UnsafeDir::Io { what, path, source } => CaError::Io { what, path, source },
        UnsafeDir::Unsafe { path, why } => CaError::Unsafe { path, why },
    })
}

/// Write `data` to `path` through a temporary file and a rename (never a half-written file).
fn write_atomic(path: &Path, data: &[u8], mode: u32) -> Result<(), CaError> {
    let tmp = path.with_extension("tmp");
    let _ = fs::remove_file(&tmp);
    let mut f = OpenOptions::new().write(true).create_new(true).mode(mode).open(&tmp).map_err(io_err("create", &tmp))?;
    f.write_all(data).and_then(|_| f.sync_all()).map_err(io_err("write", &tmp))?;
    fs::rename(&tmp, path).map_err(io_err("rename to", path))
}

fn ca_params() -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::OrganizationName, "gatewrap");
    p.distinguished_name.push(DnType::CommonName, "gatewrap TLS inspection CA");
    p.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let now = OffsetDateTime::now_utc();
    p.not_before = now - Duration::days(1);
    p.not_after = now + Duration::days(VALID_DAYS);
    p
}

impl Ca {
    /// Load the CA from `dir`, or make one there if it has none. Two runs starting at once
    /// make one CA between them (an exclusive lock on `private/` while deciding).
    pub fn load_or_create(dir: &Path) -> Result<Ca, CaError> {
        ensure_dir(dir, 0o755, 0o022)?;
        let key_dir = dir.join(KEY_DIR);
        ensure_dir(&key_dir, 0o700, 0o077)?;
        let lock = File::open(&key_dir).map_err(io_err("open", &key_dir))?;
        // SAFETY: flock on a descriptor we own; released when `lock` is dropped.
        if unsafe { libc::flock(lock.as_raw_fd(), libc::LOCK_EX) } != 0 {
            return Err(io_err("lock", &key_dir)(io::Error::last_os_error()));
        }
        let key_path = key_dir.join(KEY_FILE);
        let cert_path = dir.join(CERT_FILE);
        if !key_path.exists() {
            let key = KeyPair::generate()?;
            let cert = ca_params().self_signed(&key)?;
            write_atomic(&key_path, key.serialize_pem().as_bytes(), 0o600)?;
            write_atomic(&cert_path, cert.pem().as_bytes(), 0o644)?;
        }
        Ca::load(&key_path, &cert_path)
    }

    fn load(key_path: &Path, cert_path: &Path) -> Result<Ca, CaError> {
        // The checks and the read are of one open file, never followed through a link.
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW)
            .open(key_path)
            .map_err(io_err("open", key_path))?;
        let meta = f.metadata().map_err(io_err("stat", key_path))?;
        // SAFETY: geteuid has no preconditions.
        if !meta.is_file() || meta.mode() & 0o077 != 0 || meta.uid() != unsafe { libc::geteuid() } {
            return Err(CaError::Exposed { path: key_path.to_path_buf(), mode: meta.mode() & 0o7777 });
        }
        let mut key_pem = String::new();
        f.read_to_string(&mut key_pem).map_err(io_err("read", key_path))?;
        let key = KeyPair::from_pem(&key_pem).map_err(|e| CaError::Bad { path: key_path.into(), msg: e.to_string() })?;
        let cert_pem = fs::read_to_string(cert_path).map_err(io_err("read", cert_path))?;
        let bad = |msg: String| CaError::Bad { path: cert_path.into(), msg };
        let der = rustls_pki_types::pem::PemObject::from_pem_slice(cert_pem.as_bytes())
            .map(|c: CertificateDer<'_>| c.into_owned())
            .map_err(|e| bad(format!("not a PEM certificate: {e}")))?;
        // The certificate must carry this key (its SubjectPublicKeyInfo holds the raw key).
        if !der.windows(key.public_key_raw().len()).any(|w| w == key.public_key_raw()) {
            return Err(bad("the certificate does not match private/ca.key".into()));
        }
        let issuer = Issuer::from_ca_cert_der(&der, key).map_err(|e| bad(e.to_string()))?;
        Ok(Ca { issuer, cert: der, cert_pem, cert_path: cert_path.to_path_buf() })
    }
}
