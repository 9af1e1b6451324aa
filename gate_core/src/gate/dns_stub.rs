//! The sandbox's DNS stub, on 127.0.0.1:53 and [::1]:53 (UDP and TCP) inside the netns.
//!
//! Names are resolved by the gate, for proxied requests only, after policy: the agent
//! itself resolves nothing. Every query is answered REFUSED at once (RFC 1035 §4.1.1,
//! RCODE 5), so a client that resolves locally fails fast, and DNS cannot carry data out;
//! each query is one audit record (event `dns`, decision `denied`, `dst_host` = the name),
//! up to [`RECORDS_PER_SECOND`] a second; the queries beyond are counted and told in one
//! record a second (`count`), so a query flood cannot fill the disk the audit log shares with
//! every run (a full disk makes every gate refuse all), and every query is still counted.
//! TCP connections are bounded: at most [`MAX_TCP_CONNECTIONS`] at once, within the run's
//! connection cap, each closed after [`TCP_IDLE_TIMEOUT`] without a query.
//! Messages are parsed and built with hickory-proto.

use std::net::{SocketAddr, UdpSocket};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, MessageType, ResponseCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use crate::audit::fields as f;

use super::{server, Ctx};

/// Largest query read over UDP, in bytes (EDNS payloads stay below it).
const MAX_UDP: usize = 4096;
/// Most DNS-over-TCP connections at once (they count in the run's connection cap too, of
/// which this keeps the rest for the proxy).
pub const MAX_TCP_CONNECTIONS: usize = 64;
/// How long a DNS-over-TCP connection may go without sending a complete query (or taking
/// its answer) before the stub closes it (RFC 7766 §6.2.3: servers should close idle
/// connections; a few seconds).
pub const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most `dns` records a run writes a second, one per query; the queries beyond are counted.
pub const RECORDS_PER_SECOND: u32 = 100;

/// The stub's record rate of one run: a fixed one-second window (the first query after a
/// window ends opens the next, and first reports what the last one held).
#[derive(Debug, Default)]
pub struct RecordRate(Mutex<RateWindow>);

#[derive(Debug, Default)]
struct RateWindow {
    start: Option<Instant>,
    written: u32,
    held: u64,
}

impl RecordRate {
    /// (may this query have a record of its own, queries held in the window that just ended
    /// to report first).
    fn admit(&self) -> (bool, u64) {
        self.admit_at(Instant::now())
    }

    /// [`Self::admit`] for a query that came at `now`.
    fn admit_at(&self, now: Instant) -> (bool, u64) {
        let mut w = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let mut report = 0;
        if w.start.is_none_or(|s| now.duration_since(s) >= Duration::from_secs(1)) {
            // The window that ended reports what it held: taken before the new one starts.
            report = std::mem::take(&mut w.held);
            *w = RateWindow { start: Some(now), written: 0, held: 0 };
        }
        if w.written < RECORDS_PER_SECOND {
            w.written += 1;
            (true, report)
        } else {
            w.held += 1;
            (false, report)
        }
    }

    fn take_held(&self) -> u64 {
        std::mem::take(&mut self.0.lock().unwrap_or_else(|p| p.into_inner()).held)
    }
}

/// Record the queries still held over the rate (at the gate's stop).
pub fn flush(ctx: &Ctx) {
    let held = ctx.dns_rate.take_held();
    if held > 0 {
        record_held(ctx, None, held);
    }
}

/// One record for `held` queries refused without a record of their own.
fn record_held(ctx: &Ctx, peer: Option<SocketAddr>, held: u64) {
    let mut rec = match peer {
        Some(p) => ctx.bare_record(f::EVENT_DNS, f::PROTO_DNS, p),
        None => crate::audit::GateRecord { run: ctx.run_id.clone(), event: f::EVENT_DNS, proto: f::PROTO_DNS, ..Default::default() },
    };
    rec.decision = f::DENIED;
    rec.count = Some(held);
    rec.reason = Some(format!(
        "dns: {held} more queries refused, over {RECORDS_PER_SECOND} records a second (counted, not recorded one by one)"
    ));
    // The run's denial count takes every query: ctx.record adds this record's one.
    ctx.counts.denied.fetch_add(held - 1, std::sync::atomic::Ordering::Relaxed);
    let _ = ctx.record(rec);
}

/// The reason every query is refused with.
pub const REASON: &str = "dns: the sandbox resolves nothing (the gate resolves names of proxied requests)";

/// The REFUSED answer to `query` (same id, op code and question), or None if it is not a
/// DNS query.
pub fn refuse(query: &[u8]) -> Option<(Vec<u8>, String)> {
    let q = Message::from_vec(query).ok()?;
    if q.message_type() != MessageType::Query {
        return None;
    }
    let name = q.queries().first().map(|x| x.name().to_ascii()).unwrap_or_default();
    let mut r = Message::new();
    r.set_id(q.id())
        .set_message_type(MessageType::Response)
        .set_op_code(q.op_code())
        .set_recursion_desired(q.recursion_desired())
        .set_recursion_available(false)
        .set_response_code(ResponseCode::Refused)
        .add_queries(q.queries().to_vec());
    Some((r.to_vec().ok()?, name.trim_end_matches('.').to_string()))
}

fn record(ctx: &Ctx, peer: SocketAddr, name: Option<&str>) {
    let (own, held) = ctx.dns_rate.admit();
    if held > 0 {
        record_held(ctx, Some(peer), held);
    }
    if !own {
        return;
    }
    let mut rec = ctx.bare_record(f::EVENT_DNS, f::PROTO_DNS, peer);
    rec.decision = f::DENIED;
    match name {
        Some(n) => {
            rec.dst_host = Some(n.to_string());
            rec.reason = Some(super::secrets::in_name(ctx, &mut rec, n, "DNS name").unwrap_or_else(|| REASON.into()));
        }
        None => rec.reason = Some("dns: malformed query".into()),
    }
    // Recorded before the answer; the answer is REFUSED whether or not the record could be
    // written (the stub lets nothing through either way).
    let _ = ctx.record(rec);
}

pub async fn serve_udp(sock: UdpSocket, ctx: Arc<Ctx>) {
    let Ok(sock) = tokio::net::UdpSocket::from_std(sock) else { return };
    let mut buf = vec![0u8; MAX_UDP];
    loop {
        let Ok((n, from)) = sock.recv_from(&mut buf).await else { continue };
        // Recorded as the client sent it (127.0.0.1, not ::ffff:127.0.0.1); answered where it came from.
        let peer = super::netns::canonical(from);
        match refuse(&buf[..n]) {
            Some((answer, name)) => {
                record(&ctx, peer, Some(&name));
                let _ = sock.send_to(&answer, from).await;
            }
            None => record(&ctx, peer, None),
        }
    }
}

/// Serve DNS over TCP on `listener`: each connection counted in `caps` (the run's
/// [`super::server::MAX_CONNECTIONS`] and [`MAX_TCP_CONNECTIONS`]), and closed after
/// [`TCP_IDLE_TIMEOUT`] without a complete query.
pub async fn serve_tcp(listener: TcpListener, ctx: Arc<Ctx>, caps: Vec<Arc<server::Cap>>) {
    let c = ctx.clone();
    server::accept_capped(listener, ctx, caps, None, f::EVENT_DNS, f::PROTO_DNS, move |stream, peer, slot| {
        tcp_connection(stream, peer, c.clone(), slot)
    })
    .await
}

/// Answer the queries of one TCP connection until it closes, sends garbage, or is idle.
async fn tcp_connection(mut stream: TcpStream, peer: SocketAddr, ctx: Arc<Ctx>, slot: server::Slot) {
    slot.identify(&ctx.clients, &stream, peer).await;
    loop {
        // RFC 1035 §4.2.2: each message is prefixed by its two-byte length.
        let query = async {
            let len = stream.read_u16().await?;
            let mut msg = vec![0u8; len as usize];
            stream.read_exact(&mut msg).await?;
            Ok::<_, std::io::Error>(msg)
        };
        let msg = match tokio::time::timeout(TCP_IDLE_TIMEOUT, query).await {
            Ok(Ok(msg)) => msg,
            Ok(Err(_)) => return,
            Err(_) => return tracing::debug!(client = %peer, "dns: tcp connection closed: idle"),
        };
        let Some((answer, name)) = refuse(&msg) else {
            record(&ctx, peer, None);
            return;
        };
        record(&ctx, peer, Some(&name));
        let send = async {
            stream.write_u16(answer.len() as u16).await?;
            stream.write_all(&answer).await
        };
        if !matches!(tokio::time::timeout(TCP_IDLE_TIMEOUT, send).await, Ok(Ok(()))) {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::{Name, RecordType};
    use std::str::FromStr;

    #[test]
    fn a_query_is_answered_refused_with_its_id_and_question() {
        let mut q = Message::new();
        q.set_id(4242).set_recursion_desired(true);
        q.add_query(Query::query(Name::from_str("exfil.secret.example.").unwrap(), RecordType::TXT));
        let (answer, name) = refuse(&q.to_vec().unwrap()).unwrap();
        let a = Message::from_vec(&answer).unwrap();
        assert_eq!((a.id(), a.message_type(), a.response_code()), (4242, MessageType::Response, ResponseCode::Refused));
        assert_eq!(a.queries(), q.queries());
        assert!(a.answers().is_empty());
        assert_eq!(name, "exfil.secret.example");
    }

    /// Every query is either recorded on its own or counted once: a window's held queries
    /// are reported when the next window opens, the last window's at the gate's stop.
    #[test]
    fn a_flood_over_several_windows_is_counted_exactly() {
        let rate = RecordRate::default();
        let t0 = Instant::now();
        let (mut own, mut reported) = (0u64, 0u64);
        for (second, queries) in [(0u64, 1700u64), (1, 3000), (3, 50), (4, 300)] {
            for i in 0..queries {
                let (o, held) = rate.admit_at(t0 + Duration::from_secs(second) + Duration::from_micros(i));
                own += o as u64;
                reported += held;
            }
        }
        reported += rate.take_held();
        assert_eq!(own, 4 * RECORDS_PER_SECOND as u64 - 50);
        assert_eq!(own + reported, 1700 + 3000 + 50 + 300);
    }

    #[test]
    fn garbage_and_responses_are_not_answered() {
        assert!(refuse(b"\x00\x01garbage").is_none());
        let mut r = Message::new();
        r.set_message_type(MessageType::Response);
        assert!(refuse(&r.to_vec().unwrap()).is_none());
    }
}
