//! TLS fixtures: a test PKI (rcgen), a blocking TLS upstream on loopback that answers what
//! it was asked, and a blocking TLS client that opens a CONNECT tunnel through the gate.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, ServerConfig, ServerConnection, StreamOwned};

use super::client::{connect, read_head};

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A CA (its PEM written to `dir/upstream-ca.pem`) and a server leaf for 127.0.0.1.
pub struct Pki {
    pub ca_pem: PathBuf,
    pub leaf: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

pub fn pki(dir: &Path, name: &str) -> Pki {
    let ca_key = KeyPair::generate().expect("ca key");
    let mut p = CertificateParams::default();
    p.distinguished_name.push(DnType::CommonName, format!("{name} test CA"));
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca_cert = p.self_signed(&ca_key).expect("ca cert");
    let issuer = Issuer::new(p, ca_key);
    let key = KeyPair::generate().expect("leaf key");
    let mut lp = CertificateParams::default();
    lp.subject_alt_names = vec![SanType::IpAddress("127.0.0.1".parse().expect("ip"))];
    let leaf = lp.signed_by(&key, &issuer).expect("leaf");
    let ca_pem = dir.join(format!("{name}-ca.pem"));
    std::fs::write(&ca_pem, ca_cert.pem()).expect("write ca pem");
    Pki {
        ca_pem,
        leaf: vec![leaf.der().clone()],
        key: PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
    }
}

/// Read one request (head, then a Content-Length or chunked body) from `s`.
fn read_request(s: &mut impl Read) -> Option<(String, Vec<u8>)> {
    let mut buf = Vec::new();
    let mut b = [0u8; 1];
    while !buf.ends_with(b"\r\n\r\n") {
        if s.read(&mut b).ok()? != 1 {
            return None;
        }
        buf.push(b[0]);
    }
    let head = String::from_utf8_lossy(&buf).into_owned();
    let lower = head.to_ascii_lowercase();
    let mut body = Vec::new();
    if let Some(n) = lower.split("\r\n").find_map(|l| l.strip_prefix("content-length:")).and_then(|v| v.trim().parse::<usize>().ok()) {
        body.resize(n, 0);
        s.read_exact(&mut body).ok()?;
    } else if lower.contains("transfer-encoding: chunked") {
        while !body.ends_with(b"0\r\n\r\n") {
            if s.read(&mut b).ok()? != 1 {
                return None;
            }
            body.push(b[0]);
        }
    }
    Some((head, body))
}

/// A TLS upstream on 127.0.0.1 serving `pki`'s leaf. Each request is answered 200 with
/// `METHOD PATH host=HOST body=N` and the header `x-conn: K`, K counting the TCP
/// connections it accepted from 1; the connection is kept until the client closes.
pub fn upstream(pki: &Pki) -> SocketAddr {
    let config = ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_no_client_auth()
        .with_single_cert(pki.leaf.clone(), pki.key.clone_key())
        .expect("server config");
    let config = Arc::new(config);
    let l = TcpListener::bind("127.0.0.1:0").expect("bind tls upstream");
    let addr = l.local_addr().expect("addr");
    std::thread::spawn(move || {
        for (k, s) in l.incoming().flatten().enumerate() {
            let config = config.clone();
            std::thread::spawn(move || {
                let Ok(conn) = ServerConnection::new(config) else { return };
                let mut tls = StreamOwned::new(conn, s);
                while let Some((head, body)) = read_request(&mut tls) {
                    let first = head.lines().next().unwrap_or_default().to_string();
                    let mut words = first.split(' ');
                    let (method, path) = (words.next().unwrap_or_default(), words.next().unwrap_or_default());
                    let host = head.lines().find_map(|l| l.strip_prefix("host: ").or(l.strip_prefix("Host: "))).unwrap_or("-");
                    let text = format!("{method} {path} host={host} body={}", body.len());
                    let resp = format!("HTTP/1.1 200 OK\r\nx-conn: {}\r\nContent-Length: {}\r\n\r\n{text}", k + 1, text.len());
                    if tls.write_all(resp.as_bytes()).and_then(|_| tls.flush()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    addr
}

/// CONNECT `target` through the gate at `gate` (from inside the netns: call it in
/// `in_netns`), then TLS trusting only `ca_pem`, with `sni` as the server name (an IP
/// string sends no SNI). Returns the CONNECT answer's head and the TLS stream, or the
/// handshake's error.
pub fn open(gate: SocketAddr, target: &str, ca_pem: &Path, sni: &str) -> (String, Result<StreamOwned<ClientConnection, TcpStream>, String>) {
    let mut s = connect(gate);
    s.write_all(format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n\r\n").as_bytes()).expect("send");
    let head = read_head(&mut s);
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca_pem).expect("ca pem") {
        roots.add(c.expect("ca cert")).expect("add root");
    }
    let mut config = ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    let name = ServerName::try_from(sni.to_string()).expect("server name");
    let mut conn = ClientConnection::new(Arc::new(config), name).expect("client");
    let mut result = Ok(());
    while conn.is_handshaking() {
        if let Err(e) = conn.complete_io(&mut s) {
            result = Err(e.to_string());
            break;
        }
    }
    if result.is_ok() {
        assert_eq!(conn.alpn_protocol(), Some(&b"http/1.1"[..]), "the gate offers only http/1.1");
    }
    (head, result.map(|_| StreamOwned::new(conn, s)))
}

/// Send `request` on `tls` and read one response (head and Content-Length body).
pub fn ask(tls: &mut StreamOwned<ClientConnection, TcpStream>, request: &str) -> String {
    tls.write_all(request.as_bytes()).expect("send through the tunnel");
    let (head, body) = read_response(tls).unwrap_or_default();
    format!("{head}{}", String::from_utf8_lossy(&body))
}

fn read_response(s: &mut impl Read) -> Option<(String, Vec<u8>)> {
    read_request(s)
}
