//! Leaf certificates for inspected tunnels, made from the CONNECT target (never from
//! upstream), signed by the gate's CA, and kept in a bounded cache.
//!
//! A leaf names one host: a DNS name (subjectAltName dNSName) or an IP address
//! (iPAddress; RFC 5280 §4.2.1.6), with extended key usage serverAuth and a fresh ECDSA
//! P-256 key. It is valid from an hour before it is made for [`LEAF_VALIDITY`]; the
//! cache hands it out for [`CACHE_TTL`] only, well before it expires.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rcgen::{CertificateParams, DnType, ExtendedKeyUsagePurpose, KeyPair, KeyUsagePurpose, SanType};
use rustls::sign::CertifiedKey;
use rustls_pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::policy::Host;

use super::ca::Ca;

/// How long a leaf is valid (after its `notBefore`, an hour in the past).
pub const LEAF_VALIDITY: Duration = Duration::from_secs(7 * 24 * 3600);
/// How long the cache hands out a leaf.
pub const CACHE_TTL: Duration = Duration::from_secs(24 * 3600);
/// Most leaves cached; past it, expired ones go first, then the oldest.
pub const CACHE_ENTRIES: usize = 1024;

#[derive(Debug, thiserror::Error)]
pub enum LeafError {
    #[error("tls: cannot make a certificate for {host}: {msg}")]
    Make { host: String, msg: String },
}

/// Sign a leaf for `host` with `ca`; the chain is the leaf then the CA certificate.
pub fn issue(ca: &Ca, host: &Host) -> Result<CertifiedKey, LeafError> {
    let fail = |msg: String| LeafError::Make { host: host.to_string(), msg };
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, host.to_string());
    p.subject_alt_names = vec![match host.ip() {
        Some(ip) => SanType::IpAddress(ip),
        None => SanType::DnsName(host.to_string().try_into().map_err(|e: rcgen::Error| fail(e.to_string()))?),
    }];
    p.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.use_authority_key_identifier_extension = true;
    let now = time::OffsetDateTime::now_utc();
    p.not_before = now - time::Duration::hours(1);
    p.not_after = now + LEAF_VALIDITY;
    let key = KeyPair::generate().map_err(|e| fail(e.to_string()))?;
    let cert = p.signed_by(&key, &ca.issuer).map_err(|e| fail(e.to_string()))?;
    let der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let signer = rustls::crypto::ring::sign::any_ecdsa_type(&der).map_err(|e| fail(e.to_string()))?;
    Ok(CertifiedKey::new(vec![cert.der().clone(), ca.cert.clone()], signer))
}

/// Leaves by canonical host, each with when it was made.
#[derive(Default)]
pub struct LeafCache {
    entries: Mutex<HashMap<String, (Instant, Arc<CertifiedKey>)>>,
}

impl LeafCache {
    /// The cached leaf for `host` if it is younger than [`CACHE_TTL`], else a new one.
    /// Signing happens outside the lock (two tunnels may both sign; the later one is kept).
    pub fn get(&self, ca: &Ca, host: &Host) -> Result<Arc<CertifiedKey>, LeafError> {
        let key = host.to_string();
        let now = Instant::now();
        if let Some((made, leaf)) = self.lock().get(&key) {
            if now.duration_since(*made) < CACHE_TTL {
                return Ok(leaf.clone());
            }
        }
        let leaf = Arc::new(issue(ca, host)?);
        let mut entries = self.lock();
        if entries.len() >= CACHE_ENTRIES && !entries.contains_key(&key) {
            entries.retain(|_, (made, _)| now.duration_since(*made) < CACHE_TTL);
            if entries.len() >= CACHE_ENTRIES {
                let oldest = entries.iter().min_by_key(|(_, (made, _))| *made).map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    entries.remove(&k);
                }
            }
        }
        entries.insert(key, (now, leaf.clone()));
        Ok(leaf)
    }

    /// How many leaves are cached.
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, (Instant, Arc<CertifiedKey>)>> {
        self.entries.lock().unwrap_or_else(|p| p.into_inner())
    }
}
