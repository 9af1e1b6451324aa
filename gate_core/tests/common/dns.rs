//! A tiny authoritative DNS responder over UDP (hickory-proto messages, no hand parsing).
//!
//! Each name has a list of answer sets: the n-th query of a type for a name gets set n
//! (the last one from then on), with TTL 0, so a test can make a name rebind. A names
//! get the IPv4 addresses of the set, AAAA the IPv6 ones; unknown names get NXDOMAIN.

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use hickory_proto::serialize::binary::BinEncodable;

use super::client::in_netns;

pub type Zone = HashMap<String, Vec<Vec<IpAddr>>>;

/// A running responder; stopped on drop.
pub struct FakeDns {
    pub addr: SocketAddr,
    /// (name, type) → queries answered so far.
    pub queries: Arc<Mutex<HashMap<(String, RecordType), usize>>>,
    stop: Arc<AtomicBool>,
}

impl FakeDns {
    /// Listen on 127.0.0.1 (a free port) inside the netns `ns`.
    pub fn start(ns: PathBuf, zone: Zone) -> FakeDns {
        let socket = in_netns(ns, || UdpSocket::bind("127.0.0.1:0").expect("bind fake dns"));
        socket.set_read_timeout(Some(Duration::from_millis(50))).expect("read timeout");
        let addr = socket.local_addr().expect("dns addr");
        let queries = Arc::new(Mutex::new(HashMap::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (q, s) = (queries.clone(), stop.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 1500];
            while !s.load(Ordering::Relaxed) {
                let Ok((n, peer)) = socket.recv_from(&mut buf) else { continue };
                let Ok(request) = Message::from_vec(&buf[..n]) else { continue };
                let reply = answer(&zone, &q, &request);
                if let Ok(bytes) = reply.to_bytes() {
                    let _ = socket.send_to(&bytes, peer);
                }
            }
        });
        FakeDns { addr, queries, stop }
    }

    /// How many `rtype` queries for `name` were answered.
    pub fn count(&self, name: &str, rtype: RecordType) -> usize {
        let q = self.queries.lock().unwrap_or_else(|p| p.into_inner());
        q.get(&(name.to_string(), rtype)).copied().unwrap_or(0)
    }
}

impl Drop for FakeDns {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn answer(zone: &Zone, queries: &Mutex<HashMap<(String, RecordType), usize>>, request: &Message) -> Message {
    let mut reply = Message::new();
    reply
        .set_id(request.id())
        .set_message_type(MessageType::Response)
        .set_op_code(request.op_code())
        .set_authoritative(true)
        .set_recursion_desired(request.recursion_desired());
    let mut code = ResponseCode::NoError;
    for query in request.queries() {
        reply.add_query(query.clone());
        let name = query.name().to_lowercase().to_ascii();
        let name = name.trim_end_matches('.').to_string();
        let Some(sets) = zone.get(&name) else {
            code = ResponseCode::NXDomain;
            continue;
        };
        let n = {
            let mut q = queries.lock().unwrap_or_else(|p| p.into_inner());
            let n = q.entry((name.clone(), query.query_type())).or_insert(0);
            *n += 1;
            *n - 1
        };
        let set = sets.get(n).or(sets.last()).cloned().unwrap_or_default();
        for ip in set {
            let rdata = match (ip, query.query_type()) {
                (IpAddr::V4(a), RecordType::A) => RData::A(A(a)),
                (IpAddr::V6(a), RecordType::AAAA) => RData::AAAA(AAAA(a)),
                _ => continue,
            };
            reply.add_answer(Record::from_rdata(query.name().clone(), 0, rdata));
        }
    }
    reply.set_response_code(code);
    reply
}
