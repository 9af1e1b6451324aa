//! The gate: an HTTP forward proxy (absolute-form + CONNECT) listening inside the sandbox
//! netns and dialing from the host netns.

mod admit;
pub mod client;
mod connect;
mod dns_stub;
mod fd_room;
mod fold;
mod ctx;
pub mod dial;
mod forward;
mod guard;
mod hold;
pub use hold::AnswerHint;
pub use respond::AllowHint;
mod idle;
pub mod inspect;
mod malformed;
mod metered;
mod notice;
mod notice_fd;
pub mod netns;
mod pool;
pub mod respond;
mod server;
pub mod secrets;
mod splice;
pub mod target;
pub mod tasks;
mod upgrade;
mod wait_endpoint;

pub use hold::OnAsked;

use std::io;
use std::net::SocketAddr;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts, LookupIpStrategy};
use hickory_resolver::TokioAsyncResolver;

use crate::audit::AuditLog;
use crate::policy::ssrf::PublicRanges;
use crate::policy::Policy;

pub use ctx::Counts;
use ctx::Ctx;
pub use forward::strip_hop_by_hop;
pub use server::{MAX_CONNECTIONS, MAX_HALF_CLOSED};

/// How long `stop` waits for the gate's tasks to wind down (and, on a runtime of its own,
/// for that runtime's blocking threads).
const STOP_TIMEOUT: Duration = Duration::from_millis(800);

/// What to do about a listener that could not be made: out of descriptors (EMFILE, ENFILE:
/// socket(2)) is the process's limit, anything else the namespace's `lo` or the port.
fn bind_hint(e: &io::Error) -> &'static str {
    match e.raw_os_error() {
        Some(libc::EMFILE) | Some(libc::ENFILE) => {
            "the gate's process is out of file descriptors: its runs hold them all (gatewrap ps), or its hard \
             RLIMIT_NOFILE is too low for them (the shared daemon takes the hard limit as its own)"
        }
        _ => "is `lo` up there and the port free?",
    }
}

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("cannot open netns {path}: {source}; does the sandbox exist?")]
    NetnsOpen { path: PathBuf, source: io::Error },
    #[error("cannot enter netns {path}: {source}; the gate needs CAP_SYS_ADMIN (run gatewrap as root)")]
    Setns { path: PathBuf, source: io::Error },
    #[error("cannot listen on {addr} in netns {path}: {source}; {}", bind_hint(source))]
    Bind { addr: SocketAddr, path: PathBuf, source: io::Error },
    #[error("{0}")]
    Thread(String),
    #[error("cannot start the gate's runtime: {0}")]
    Runtime(io::Error),
    #[error("cannot read the host's DNS configuration: {0}; pass nameservers explicitly")]
    Dns(String),
    #[error("invalid nameserver {0:?}: expected IP:PORT, e.g. \"198.51.100.2:53\" or \"[2001:db8::2]:53\"")]
    Nameserver(String),
    #[error("invalid connect_timeout {0}: expected a positive number of seconds")]
    ConnectTimeout(f64),
    #[error("invalid idle_timeout {0}: expected a positive number of seconds")]
    IdleTimeout(f64),
    #[error("{0}")]
    Inspect(#[from] inspect::InspectError),
    #[error("approvals: {0}")]
    Approvals(String),
}

/// How long a tunnel or an upgraded (WebSocket) connection may carry nothing either way
/// before the gate closes it, by default.
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(300);

pub struct GateConfig {
    pub run_id: String,
    pub netns_path: PathBuf,
    pub policy: Arc<RwLock<Policy>>,
    pub audit: Arc<AuditLog>,
    pub listen_port: u16,
    /// `None`: the host's /etc/resolv.conf.
    pub nameservers: Option<Vec<String>>,
    pub connect_timeout: Duration,
    /// Ranges the SSRF guard counts as public besides the globally reachable ones.
    pub public_ranges: PublicRanges,
    /// Print a line for each refused or failed request (see `notice`): on `notice_fd`, else
    /// on the process's stderr.
    pub notices: bool,
    /// Where the notices go instead of stderr (e.g. the run's terminal, handed to a daemon);
    /// the gate owns it and closes it when it is dropped. Write errors are ignored.
    pub notice_fd: Option<OwnedFd>,
    /// Run on the process-wide runtime shared by all such gates ([`tasks::shared`]) instead
    /// of a runtime of its own; `stop` then ends this gate's tasks only.
    pub shared_runtime: bool,
    /// Serve the DNS stub on port 53 in the netns (see `dns_stub`).
    pub dns_stub: bool,
    /// TLS inspection (the CA, upstream roots, body limit); off by default.
    pub inspect: inspect::InspectSettings,
    /// Idle timeout of tunnels and upgraded connections ([`DEFAULT_IDLE_TIMEOUT`]).
    pub idle_timeout: Duration,
    /// The run's cgroup directory: each connection's records name the process of it that
    /// holds the client socket (`client`); `None`: they do not.
    pub run_cgroup: Option<PathBuf>,
    /// The approvals store's URL (see `approvals::Store::open`); `None`: approvals off.
    pub state: Option<String>,
    /// Called with each new approval (e.g. to notify a human).
    pub on_asked: Option<OnAsked>,
    /// The run's resolved secrets (see `secrets`); [`Gate::secrets`] replaces them.
    pub secrets: secrets::Shared,
    /// How the live line of an approval says to answer it.
    pub answer_hint: AnswerHint,
    /// Which settings the 403 bodies and notices name to allow a destination: `gatewrap
    /// run`'s flags, or a container's annotations and runtime flags.
    pub allow_hint: AllowHint,
}

fn parse_nameservers(list: &[String]) -> Result<ResolverConfig, GateError> {
    let mut group = NameServerConfigGroup::new();
    for s in list {
        let addr: SocketAddr = s.parse().map_err(|_| GateError::Nameserver(s.clone()))?;
        // UDP and TCP for each server.
        group.merge(NameServerConfigGroup::from_ips_clear(&[addr.ip()], addr.port(), true));
    }
    Ok(ResolverConfig::from_parts(None, vec![], group))
}

fn resolver(nameservers: Option<&[String]>) -> Result<TokioAsyncResolver, GateError> {
    let (config, mut opts) = match nameservers {
        // Explicit nameservers mean exactly those: no /etc/hosts either.
        Some(list) => {
            let mut opts = ResolverOpts::default();
            opts.use_hosts_file = false;
            (parse_nameservers(list)?, opts)
        }
        None => hickory_resolver::system_conf::read_system_conf().map_err(|e| GateError::Dns(e.to_string()))?,
    };
    opts.ip_strategy = LookupIpStrategy::Ipv4AndIpv6;
    Ok(TokioAsyncResolver::tokio(config, opts))
}

/// Each listener as tokio's (registered with the current runtime), or the first error.
fn tokio_listeners(list: Vec<std::net::TcpListener>) -> io::Result<Vec<tokio::net::TcpListener>> {
    list.into_iter().map(tokio::net::TcpListener::from_std).collect()
}

/// A running gate; `stop` (or drop) shuts it down.
pub struct Gate {
    /// Its own runtime (`None` on the shared one, or once stopped).
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
    stopped: AtomicBool,
    listen_addrs: Vec<SocketAddr>,
    counts: Arc<Counts>,
    /// Kept to record, at the stop, the DNS queries still held over the record rate.
    ctx: Arc<Ctx>,
}

impl Gate {
    /// Bind the listeners in the sandbox netns and start serving. Returns once listening.
    pub fn start(config: GateConfig) -> Result<Gate, GateError> {
        if config.connect_timeout.is_zero() {
            return Err(GateError::ConnectTimeout(config.connect_timeout.as_secs_f64()));
        }
        if config.idle_timeout.is_zero() {
            return Err(GateError::IdleTimeout(config.idle_timeout.as_secs_f64()));
        }
        let inspector = inspect::Inspector::new(&config.inspect)?.map(Arc::new);
        let listeners = netns::listeners(&config.netns_path, config.listen_port)?;
        let dns = if config.dns_stub { Some(netns::dns_sockets(&config.netns_path)?) } else { None };
        let listen_addrs: Vec<SocketAddr> = listeners.iter().filter_map(|l| l.local_addr().ok()).flat_map(netns::served).collect();
        // Built on the caller's thread, so its workers are in the host netns.
        let own = if config.shared_runtime { None } else { Some(tasks::build().map_err(GateError::Runtime)?) };
        let handle = match &own {
            Some(rt) => rt.handle().clone(),
            None => tasks::shared().map_err(GateError::Runtime)?.handle().clone(),
        };
        let tasks = tasks::Tasks::new(handle.clone());
        let sink = match config.notice_fd {
            Some(fd) if config.notices => Some(notice_fd::FdSink::new(fd)),
            _ => None,
        };
        let counts = Arc::new(Counts::default());
        let approvals = match &config.state {
            Some(url) => Some(Arc::new(hold::Approvals::start(url, &config.run_id, &handle, config.on_asked, config.answer_hint.clone()).map_err(GateError::Approvals)?)),
            None => None,
        };
        let _guard = handle.enter();
        let ctx = {
            Arc::new(Ctx {
                run_id: config.run_id,
                policy: config.policy,
                audit: config.audit,
                resolver: resolver(config.nameservers.as_deref())?,
                lookups: tokio::sync::Semaphore::new(guard::MAX_LOOKUPS),
                connect_timeout: config.connect_timeout,
                counts: counts.clone(),
                public_ranges: config.public_ranges,
                notices: notice::Notices::new(config.notices, sink),
                budgets: crate::policy::Budgets::default(),
                inspector,
                idle_timeout: config.idle_timeout,
                audit_failing: Default::default(),
                clients: Arc::new(client::Clients::new(
                    config.run_cgroup.map(|cg| client::Scope::new(cg, Some(&config.netns_path))),
                    tasks.clone(),
                )),
                dns_rate: Default::default(),
                folds: Default::default(),
                upstream: pool::Pool::new(tasks.clone(), pool::IDLE_TIMEOUT, pool::MAX_IDLE_PER_KEY),
                inspected: pool::Pool::new(tasks.clone(), pool::IDLE_TIMEOUT, pool::MAX_IDLE_PER_KEY),
                tasks,
                approvals,
                listen_addrs: listen_addrs.clone(),
                secrets: config.secrets,
                allow_hint: config.allow_hint,
                open: server::Cap::new(server::MAX_CONNECTIONS, "open connections"),
                half_closed: server::Cap::new(server::MAX_HALF_CLOSED, "half-closed tunnels"),
            })
        };
        // Every socket is converted before the first task is spawned: an error then leaves
        // nothing running (on the shared runtime nothing else would end it).
        let proxy = tokio_listeners(listeners).map_err(GateError::Runtime)?;
        let dns = match dns {
            Some((udp, tcp)) => Some((udp, tokio_listeners(tcp).map_err(GateError::Runtime)?)),
            None => None,
        };
        ctx.spawn(fold::run(ctx.clone()));
        let (open, half_closed) = (ctx.open.clone(), ctx.half_closed.clone());
        for l in proxy {
            ctx.spawn(server::serve(l, ctx.clone(), open.clone(), half_closed.clone()));
        }
        if let Some((udp, tcp)) = dns {
            for s in udp {
                ctx.spawn(dns_stub::serve_udp(s, ctx.clone()));
            }
            // DNS over TCP counts in the run's cap and has a smaller one of its own, so it
            // can never take the proxy's connections.
            let dns_open = server::Cap::new(dns_stub::MAX_TCP_CONNECTIONS, "open DNS-over-TCP connections");
            for l in tcp {
                ctx.spawn(dns_stub::serve_tcp(l, ctx.clone(), vec![open.clone(), dns_open.clone()]));
            }
        }
        drop(_guard);
        Ok(Gate { runtime: Mutex::new(own), stopped: AtomicBool::new(false), listen_addrs, counts, ctx })
    }

    /// The run's secrets, shared with the serving tasks: a rotation writes new ones here.
    pub fn secrets(&self) -> &secrets::Shared {
        &self.ctx.secrets
    }

    pub fn listen_addrs(&self) -> &[SocketAddr] {
        &self.listen_addrs
    }

    /// (allowed, denied, failed) decisions so far.
    pub fn counts(&self) -> (u64, u64, u64) {
        (
            self.counts.allowed.load(Ordering::Relaxed),
            self.counts.denied.load(Ordering::Relaxed),
            self.counts.failed.load(Ordering::Relaxed),
        )
    }

    /// (inspected tunnels, report-mode decisions `enforce` would have denied, requests
    /// refused unsent because their record could not be written, requests answered 409
    /// while their approval waits) so far.
    pub fn more_counts(&self) -> (u64, u64, u64, u64) {
        (
            self.counts.inspected.load(Ordering::Relaxed),
            self.counts.would_deny.load(Ordering::Relaxed),
            self.counts.unsent.load(Ordering::Relaxed),
            self.counts.held.load(Ordering::Relaxed),
        )
    }

    /// Tasks of this gate not yet ended (accept loops, connections, tunnels...); 0 once
    /// `stop` has returned in time.
    pub fn live_tasks(&self) -> usize {
        self.ctx.tasks.live()
    }

    /// Stop accepting, abort tunnels and in-flight requests: cancel every task of this gate
    /// and wait up to [`STOP_TIMEOUT`] for them to end (their sockets closed); on a runtime
    /// of its own, then shut it down within what is left of that time. Other gates on the
    /// shared runtime are untouched. Then record the DNS queries held over the record rate
    /// and end the run in the approvals store. Blocks the calling thread (call it off the
    /// runtime, e.g. with the GIL released); idempotent.
    pub fn stop(&self) {
        self.stop_serving(true);
    }

    /// [`Self::stop`], ending the run in the approvals store only if `end_run`: a daemon that
    /// stops while the run goes on (a restarted daemon takes it back, its approvals with it)
    /// still records the DNS queries held over the record rate, which would go with it.
    pub fn stop_serving(&self, end_run: bool) {
        if self.stopped.swap(true, Ordering::AcqRel) {
            return;
        }
        let started = Instant::now();
        if !self.ctx.tasks.end(STOP_TIMEOUT) {
            tracing::warn!(run = %self.ctx.run_id, tasks = self.ctx.tasks.live(), "gate tasks still running after the stop timeout");
        }
        let runtime = self.runtime.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(rt) = runtime {
            rt.shutdown_timeout(STOP_TIMEOUT.saturating_sub(started.elapsed()));
        }
        dns_stub::flush(&self.ctx);
        fold::flush(&self.ctx);
        if !end_run {
            return;
        }
        if let Some(ap) = &self.ctx.approvals {
            ap.end_run(&self.ctx.run_id);
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stop();
    }
}

#[cfg(test)]
mod bind_hint_tests {
    use super::*;

    #[test]
    fn a_listener_refused_for_want_of_descriptors_says_so_not_lo_or_the_port() {
        let err = |errno| GateError::Bind { addr: "[::1]:53".parse().expect("addr"), path: "/run/netns/x".into(), source: io::Error::from_raw_os_error(errno) }.to_string();
        assert!(err(libc::EMFILE).contains("out of file descriptors") && !err(libc::EMFILE).contains("`lo`"));
        assert!(err(libc::EADDRINUSE).ends_with("is `lo` up there and the port free?"));
    }
}
