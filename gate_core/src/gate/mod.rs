//! The gate: an HTTP forward proxy (absolute-form + CONNECT) listening inside the sandbox
//! netns and dialing from the host netns.

mod admit;
pub mod client;
mod connect;
mod dns_stub;
mod ctx;
pub mod dial;
mod forward;
mod guard;
mod hold;
mod idle;
pub mod inspect;
mod malformed;
mod notice;
pub mod netns;
mod pool;
pub mod respond;
mod server;
mod splice;
pub mod target;
mod upgrade;
mod wait_endpoint;

pub use hold::OnAsked;

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use hickory_resolver::config::{NameServerConfigGroup, ResolverConfig, ResolverOpts, LookupIpStrategy};
use hickory_resolver::TokioAsyncResolver;

use crate::audit::AuditLog;
use crate::policy::ssrf::PublicRanges;
use crate::policy::Policy;

pub use ctx::Counts;
use ctx::Ctx;
pub use forward::strip_hop_by_hop;

/// How long `stop` waits for the runtime's tasks to wind down.
const STOP_TIMEOUT: Duration = Duration::from_millis(800);

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("cannot open netns {path}: {source}; does the sandbox exist?")]
    NetnsOpen { path: PathBuf, source: io::Error },
    #[error("cannot enter netns {path}: {source}; the gate needs CAP_SYS_ADMIN (run gatewrap as root)")]
    Setns { path: PathBuf, source: io::Error },
    #[error("cannot listen on {addr} in netns {path}: {source}; is `lo` up there and the port free?")]
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
    /// Print a line on stderr for each refused or failed request (see `notice`).
    pub notices: bool,
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

/// A running gate; `stop` (or drop) shuts it down.
pub struct Gate {
    runtime: Mutex<Option<tokio::runtime::Runtime>>,
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
        let listen_addrs: Vec<SocketAddr> = listeners.iter().filter_map(|l| l.local_addr().ok()).collect();
        let next = AtomicUsize::new(0);
        // Built on the caller's thread, so its workers are in the host netns.
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name_fn(move || format!("gate-{}", next.fetch_add(1, Ordering::Relaxed)))
            .enable_all()
            .build()
            .map_err(GateError::Runtime)?;
        let counts = Arc::new(Counts::default());
        let approvals = match &config.state {
            Some(url) => Some(Arc::new(hold::Approvals::start(url, &config.run_id, config.on_asked).map_err(GateError::Approvals)?)),
            None => None,
        };
        let ctx = {
            let _guard = runtime.enter();
            Arc::new(Ctx {
                run_id: config.run_id,
                policy: config.policy,
                audit: config.audit,
                resolver: resolver(config.nameservers.as_deref())?,
                connect_timeout: config.connect_timeout,
                counts: counts.clone(),
                public_ranges: config.public_ranges,
                notices: notice::Notices::new(config.notices),
                budgets: crate::policy::Budgets::default(),
                inspector,
                idle_timeout: config.idle_timeout,
                audit_failing: Default::default(),
                clients: Arc::new(client::Clients::new(config.run_cgroup)),
                dns_rate: Default::default(),
                upstream: pool::Pool::new(pool::IDLE_TIMEOUT, pool::MAX_IDLE_PER_KEY),
                inspected: pool::Pool::new(pool::IDLE_TIMEOUT, pool::MAX_IDLE_PER_KEY),
                approvals,
                listen_addrs: listen_addrs.clone(),
            })
        };
        let open = server::Cap::new(server::MAX_CONNECTIONS, "open connections");
        for l in listeners {
            let _guard = runtime.enter();
            let l = tokio::net::TcpListener::from_std(l).map_err(GateError::Runtime)?;
            runtime.spawn(server::serve(l, ctx.clone(), open.clone()));
        }
        if let Some((udp, tcp)) = dns {
            let _guard = runtime.enter();
            for s in udp {
                runtime.spawn(dns_stub::serve_udp(s, ctx.clone()));
            }
            // DNS over TCP counts in the run's cap and has a smaller one of its own, so it
            // can never take the proxy's connections.
            let dns_open = server::Cap::new(dns_stub::MAX_TCP_CONNECTIONS, "open DNS-over-TCP connections");
            for l in tcp {
                let l = tokio::net::TcpListener::from_std(l).map_err(GateError::Runtime)?;
                runtime.spawn(dns_stub::serve_tcp(l, ctx.clone(), vec![open.clone(), dns_open.clone()]));
            }
        }
        Ok(Gate { runtime: Mutex::new(Some(runtime)), listen_addrs, counts, ctx })
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

    /// (inspected tunnels, report-mode decisions `enforce` would have denied) so far.
    pub fn more_counts(&self) -> (u64, u64) {
        (self.counts.inspected.load(Ordering::Relaxed), self.counts.would_deny.load(Ordering::Relaxed))
    }

    /// Stop accepting, abort tunnels and in-flight requests, shut the runtime down. Idempotent.
    pub fn stop(&self) {
        let runtime = self.runtime.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(rt) = runtime {
            rt.shutdown_timeout(STOP_TIMEOUT);
            dns_stub::flush(&self.ctx);
            if let Some(ap) = &self.ctx.approvals {
                ap.end_run(&self.ctx.run_id);
            }
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        self.stop();
    }
}
