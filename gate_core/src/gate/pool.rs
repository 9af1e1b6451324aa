//! Upstream HTTP/1.1 connections kept open between requests (keep-alive), so that a run's
//! requests to one upstream do not each open a TCP connection and leave it in TIME_WAIT
//! (after ~14k of those to one address, `connect()` spends its time looking for a free port).
//!
//! What it keeps to:
//! - The SSRF guard is asked on every request: [`checkout`] resolves and screens first
//!   ([`guard::vetted`]), then takes a kept connection only if its peer is one of the
//!   addresses the guard kept for this request, in their order, else dials them
//!   ([`dial::connect_any`]). A name that now resolves elsewhere (DNS rebinding, a new
//!   deployment) gets a new connection to its new, vetted address (contract 4).
//! - A connection is kept under a [`Key`]: scheme, host the request was decided for,
//!   deciding rule and peer address; each gate (one run, one policy) has its own pool, and
//!   one more for the TLS connections of inspected tunnels (`inspect/inner.rs`, scheme
//!   `https`, host the TLS server name), shared by all of the run's tunnels to that host.
//! - A kept connection is given back only once hyper has read its response to the end and
//!   the connection can carry another request (`SendRequest::ready`); it is dropped after
//!   [`IDLE_TIMEOUT`] unused, beyond [`MAX_IDLE_PER_KEY`], when upstream closes it, or
//!   after a `101 Switching Protocols` (the connection is then the upgrade's).
//!
//! Why not hyper-util's legacy `Client`: its pool is keyed by the request URI's scheme and
//! authority and its connector sees only that URI, so it can key neither by rule nor dial
//! the guard's ordered addresses with fallback, and it tells which address it used only
//! with the response, where the audit record needs it once the dial is done (`Pending`).

use std::collections::HashMap;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use hyper::body::{Body, Incoming};

/// The body of a request the gate sends upstream: the agent's, or an approved (edited) one.
/// A request body on its way upstream (its errors boxed: the client's, or the secrets screen's).
pub type ReqBody = http_body_util::combinators::BoxBody<bytes::Bytes, super::secrets::BoxError>;
use hyper::client::conn::http1::{self, SendRequest};
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::policy::Host;

use super::admit::Admission;
use super::dial::{self, DialError};
use super::forward::{send_failure, SendFailure};
use super::tasks::Tasks;
use super::{guard, Ctx};

/// How long a kept connection may wait unused before the gate closes it: below the
/// keep-alive timeouts of common servers (nginx 75 s, Squid's 60 s, hyper-util's own
/// pool 90 s), so the gate, not upstream, usually ends it.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// Most unused connections kept per [`Key`]: as many as the load tools' largest
/// concurrency (256) can use at once; beyond it a connection is closed when it is free.
pub const MAX_IDLE_PER_KEY: usize = 256;

/// What a kept connection may be reused for: the same scheme, host (the TLS server name
/// when there is TLS), deciding rule (`None`: the default) and peer address.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Key {
    pub scheme: &'static str,
    pub host: Host,
    pub rule: Option<String>,
    pub addr: SocketAddr,
}

struct Idle<B> {
    sender: SendRequest<B>,
    since: Instant,
}

struct Shared<B> {
    idle: HashMap<Key, Vec<Idle<B>>>,
    /// A task drops expired connections while some are kept (see [`reap`]).
    reaping: bool,
}

/// The kept connections of one gate, for request bodies of type `B`.
pub struct Pool<B> {
    shared: Arc<Mutex<Shared<B>>>,
    /// The gate's tasks: the pool's own (waiting for a connection to be free, reaping,
    /// hyper's connection tasks) are among them, so they end when the gate stops.
    tasks: Tasks,
    idle_timeout: Duration,
    max_idle: usize,
}

impl<B> Pool<B>
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    /// An empty pool: connections unused for `idle_timeout` are closed, at most `max_idle`
    /// kept per key; its tasks are spawned as `tasks`.
    pub fn new(tasks: Tasks, idle_timeout: Duration, max_idle: usize) -> Pool<B> {
        Pool { shared: Arc::new(Mutex::new(Shared { idle: HashMap::new(), reaping: false })), tasks, idle_timeout, max_idle }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Shared<B>> {
        self.shared.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A kept connection under `key` that can take a request now (the most recently used
    /// first); expired and closed ones met on the way are dropped.
    pub fn take(&self, key: &Key) -> Option<SendRequest<B>> {
        let mut shared = self.lock();
        let list = shared.idle.get_mut(key)?;
        let mut found = None;
        while let Some(idle) = list.pop() {
            if idle.since.elapsed() < self.idle_timeout && idle.sender.is_ready() {
                found = Some(idle.sender);
                break;
            }
        }
        if list.is_empty() {
            shared.idle.remove(key);
        }
        found
    }

    /// Keep `sender` under `key` once it can carry another request (its response read to
    /// the end); dropped instead if upstream or hyper closes the connection first.
    pub fn give_back(&self, key: Key, mut sender: SendRequest<B>) {
        let pool = self.clone_handle();
        self.tasks.spawn(async move {
            if sender.ready().await.is_ok() {
                pool.keep(key, sender);
            }
        });
    }

    /// Keep `sender` (ready) under `key`, unless [`MAX_IDLE_PER_KEY`] are kept already;
    /// starts the task that drops expired ones ([`reap`]) if it is not running.
    fn keep(&self, key: Key, sender: SendRequest<B>) {
        let mut shared = self.lock();
        let list = shared.idle.entry(key).or_default();
        if list.len() >= self.max_idle {
            return;
        }
        list.push(Idle { sender, since: Instant::now() });
        if !shared.reaping {
            shared.reaping = true;
            self.tasks.spawn(reap(Arc::downgrade(&self.shared), self.idle_timeout));
        }
    }

    /// The same pool, for a task that outlives the caller's borrow.
    fn clone_handle(&self) -> Pool<B> {
        Pool { shared: self.shared.clone(), tasks: self.tasks.clone(), idle_timeout: self.idle_timeout, max_idle: self.max_idle }
    }

    /// The kept connection for the first of `ips` (the addresses the SSRF guard kept for
    /// this request, in its order; `port` theirs) that has one under `key(addr)`, with its key.
    pub fn take_vetted(&self, ips: &[IpAddr], port: u16, key: impl Fn(SocketAddr) -> Key) -> Option<(Key, SendRequest<B>)> {
        ips.iter().map(|ip| key(SocketAddr::new(*ip, port))).find_map(|k| self.take(&k).map(|s| (k, s)))
    }

    /// Connections kept now, over all keys (tests).
    #[cfg(test)]
    fn kept(&self) -> usize {
        self.lock().idle.values().map(Vec::len).sum()
    }
}

impl<B> Shared<B> {
    /// Drop the kept connections unused for `idle_timeout` or closed; true if some are left.
    fn prune(&mut self, idle_timeout: Duration) -> bool {
        self.idle.retain(|_, list| {
            list.retain(|idle| idle.since.elapsed() < idle_timeout && !idle.sender.is_closed());
            !list.is_empty()
        });
        !self.idle.is_empty()
    }
}

/// Every half `idle_timeout`, [`Shared::prune`]; ends when nothing is kept (the next
/// [`Pool::keep`] starts it again) or the pool is gone (the gate stopped).
async fn reap<B>(shared: Weak<Mutex<Shared<B>>>, idle_timeout: Duration) {
    loop {
        tokio::time::sleep(idle_timeout / 2).await;
        let Some(strong) = shared.upgrade() else { return };
        let mut guard = strong.lock().unwrap_or_else(|p| p.into_inner());
        if !guard.prune(idle_timeout) {
            guard.reaping = false;
            return;
        }
    }
}

/// An upstream connection for one request: a kept one, or one just dialled.
pub struct Conn<'p> {
    pool: &'p Pool<ReqBody>,
    key: Key,
    sender: SendRequest<ReqBody>,
    reused: bool,
    connect_timeout: Duration,
}

/// The connection for the plain-http request `adm` allowed: resolve and screen (the SSRF
/// guard, on every request), then a kept connection to the first vetted address that has
/// one, else a new one to the first vetted address that answers. `early`: an approved
/// request's lookup, started alongside its claim ([`guard::Early`]).
///
/// Errors: the [`DialError`] of the lookup, the guard (403) or the dial (502/504).
pub async fn checkout<'p>(ctx: &Ctx, pool: &'p Pool<ReqBody>, adm: &Admission, early: Option<guard::Early>) -> Result<Conn<'p>, DialError> {
    let kept = guard::vetted(ctx, adm, early).await?;
    let key = |addr| Key { scheme: "http", host: adm.host.clone(), rule: adm.decision.rule.clone(), addr };
    if let Some((key, sender)) = pool.take_vetted(&kept, adm.port, key) {
        return Ok(Conn { pool, key, sender, reused: true, connect_timeout: ctx.connect_timeout });
    }
    let (tcp, addr) = dial::connect_any(&kept, adm.port, ctx.connect_timeout).await?;
    let sender = handshake(&pool.tasks, tcp, addr).await?;
    Ok(Conn { pool, key: key(addr), sender, reused: false, connect_timeout: ctx.connect_timeout })
}

/// Start hyper's HTTP/1.1 client on `tcp` (upgrades kept for WebSocket, see `upgrade`);
/// its connection task is one of `tasks`.
async fn handshake(tasks: &Tasks, tcp: TcpStream, addr: SocketAddr) -> Result<SendRequest<ReqBody>, DialError> {
    let (sender, conn) = http1::handshake(TokioIo::new(tcp))
        .await
        .map_err(|e| DialError::Io { addr, source: io::Error::other(e) })?;
    tasks.spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    Ok(sender)
}

impl Conn<'_> {
    /// The peer address: one the SSRF guard kept for this request.
    pub fn addr(&self) -> SocketAddr {
        self.key.addr
    }

    /// Send `req` (origin form, with its Host header) and return the response head; the
    /// connection goes back to the pool once its body is read, unless the response is a
    /// `101`. A kept connection that upstream closed before the request was written is
    /// replaced by a new one to the same address, once (hyper hands the request back:
    /// nothing of it reached upstream).
    pub async fn send(mut self, req: Request<ReqBody>) -> Result<Response<Incoming>, SendFailure> {
        let resp = match self.sender.try_send_request(req).await {
            Ok(resp) => resp,
            Err(mut e) => match e.take_message() {
                Some(req) if self.reused => {
                    tracing::debug!(dst.ip = %self.key.addr, error = %e.error(), "kept connection closed; dialling again");
                    let addr = self.key.addr;
                    let (tcp, _) = dial::connect_any(&[addr.ip()], addr.port(), self.connect_timeout)
                        .await
                        .map_err(|e| SendFailure::Upstream(e.to_string()))?;
                    self.sender = handshake(&self.pool.tasks, tcp, addr).await.map_err(|e| SendFailure::Upstream(e.to_string()))?;
                    self.sender.send_request(req).await.map_err(|e| send_failure(&e))?
                }
                _ => return Err(send_failure(&e.into_error())),
            },
        };
        if resp.status() != StatusCode::SWITCHING_PROTOCOLS {
            self.pool.give_back(self.key, self.sender);
        }
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::Empty;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A loopback upstream that answers every request on every connection with a
    /// keep-alive 200 of 2 bytes; returns its address and a count of accepted connections.
    async fn upstream() -> (SocketAddr, Arc<std::sync::atomic::AtomicUsize>) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap_or_else(|e| panic!("bind: {e}"));
        let addr = l.local_addr().unwrap_or_else(|e| panic!("{e}"));
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let mut seen = Vec::new();
                    loop {
                        let n = match s.read(&mut buf).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => n,
                        };
                        seen.extend_from_slice(&buf[..n]);
                        while let Some(end) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                            seen.drain(..end + 4);
                            if s.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok").await.is_err() {
                                return;
                            }
                        }
                    }
                });
            }
        });
        (addr, accepted)
    }

    /// Tasks on the test's runtime.
    fn tasks() -> Tasks {
        Tasks::new(tokio::runtime::Handle::current())
    }

    fn key(addr: SocketAddr) -> Key {
        Key { scheme: "http", host: Host::Name("a.test".into()), rule: Some("r".into()), addr }
    }

    async fn exchange(sender: &mut SendRequest<Empty<bytes::Bytes>>) {
        let req = Request::builder().uri("/").header("host", "a.test").body(Empty::new());
        let resp = sender.send_request(req.unwrap_or_else(|e| panic!("{e}"))).await.unwrap_or_else(|e| panic!("send: {e}"));
        let body = http_body_util::BodyExt::collect(resp.into_body()).await.unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(&body.to_bytes()[..], b"ok");
    }

    /// A ready connection to `addr`, its connection task spawned.
    async fn connected(addr: SocketAddr) -> (SendRequest<Empty<bytes::Bytes>>, tokio::task::JoinHandle<()>) {
        let tcp = TcpStream::connect(addr).await.unwrap_or_else(|e| panic!("{e}"));
        let (mut sender, conn) = http1::handshake(TokioIo::new(tcp)).await.unwrap_or_else(|e| panic!("{e}"));
        let task = tokio::spawn(async move {
            let _ = conn.await;
        });
        sender.ready().await.unwrap_or_else(|e| panic!("{e}"));
        (sender, task)
    }

    #[tokio::test]
    async fn a_connection_kept_is_taken_again_under_its_key_only() {
        let (addr, accepted) = upstream().await;
        let pool: Pool<Empty<bytes::Bytes>> = Pool::new(tasks(), IDLE_TIMEOUT, MAX_IDLE_PER_KEY);
        let (mut sender, _task) = connected(addr).await;
        exchange(&mut sender).await;
        sender.ready().await.unwrap_or_else(|e| panic!("{e}"));
        pool.keep(key(addr), sender);
        // Another rule, host, scheme or address: not this connection.
        let other_rule = Key { rule: None, ..key(addr) };
        let other_host = Key { host: Host::Name("b.test".into()), ..key(addr) };
        let other_scheme = Key { scheme: "https", ..key(addr) };
        let other_addr = key(SocketAddr::new(addr.ip(), addr.port().wrapping_add(1)));
        for k in [other_rule, other_host, other_scheme, other_addr] {
            assert!(pool.take(&k).is_none(), "{k:?}");
        }
        let mut again = pool.take(&key(addr)).unwrap_or_else(|| panic!("the kept connection is gone"));
        exchange(&mut again).await;
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 1, "one TCP connection for both requests");
        assert!(pool.take(&key(addr)).is_none(), "taken twice");
    }

    #[tokio::test]
    async fn expired_and_closed_connections_are_dropped_not_taken() {
        let (addr, _) = upstream().await;
        let expired: Pool<Empty<bytes::Bytes>> = Pool::new(tasks(), Duration::ZERO, MAX_IDLE_PER_KEY);
        let (sender, _task) = connected(addr).await;
        expired.keep(key(addr), sender);
        assert!(expired.take(&key(addr)).is_none());
        assert_eq!(expired.kept(), 0);

        let pool: Pool<Empty<bytes::Bytes>> = Pool::new(tasks(), IDLE_TIMEOUT, MAX_IDLE_PER_KEY);
        let (sender, task) = connected(addr).await;
        pool.keep(key(addr), sender);
        task.abort(); // hyper's connection ends, as when upstream closes it
        let _ = task.await;
        assert!(!pool.lock().prune(IDLE_TIMEOUT), "a closed connection is pruned");
        let (sender, task) = connected(addr).await;
        pool.keep(key(addr), sender);
        task.abort();
        let _ = task.await;
        assert!(pool.take(&key(addr)).is_none(), "a closed connection is not taken");
    }

    #[tokio::test]
    async fn no_more_than_max_idle_are_kept_per_key() {
        let (addr, _) = upstream().await;
        let pool: Pool<Empty<bytes::Bytes>> = Pool::new(tasks(), IDLE_TIMEOUT, 2);
        let mut tasks = Vec::new();
        for _ in 0..3 {
            let (sender, task) = connected(addr).await;
            tasks.push(task);
            pool.keep(key(addr), sender);
        }
        assert_eq!(pool.kept(), 2);
        let other = SocketAddr::new(addr.ip(), addr.port().wrapping_add(1));
        let (sender, _task) = connected(addr).await;
        pool.keep(key(other), sender);
        assert_eq!(pool.kept(), 3, "the limit is per key");
    }
}
