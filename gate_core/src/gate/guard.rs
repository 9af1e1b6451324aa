//! The SSRF guard at dial time (contract 4): every address a destination stands for is
//! classified on every request, and the gate dials only the ones kept.
//!
//! An address is kept when it is public (by the registries, the gate's `public_ranges`
//! or the policy file's), when an `allow` rule names it exactly (any class, metadata
//! included), or when the destination is a name whose rule (allow, or an approved ask)
//! has `allow_private = true` and the class is one that covers (see
//! [`Class::allow_private_covers`]). Nothing is cached: a name that resolved to a public
//! address once is judged again on its next lookup (DNS rebinding), and the address
//! dialled is the one judged (no second lookup).
//!
//! `report` mode does not lift the guard (DESIGN contract 4 holds in every mode): it
//! refuses, and its record (reason `ssrf: <class> address <ip>`) is what `gatewrap policy
//! suggest` turns into a rule with `allow_private = true`.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use tokio::net::TcpStream;

use crate::policy::ssrf::{Class, PublicRanges};
use crate::policy::{Action, Host, Policy};

use super::admit::Admission;
use super::dial::{self, DialError};
use super::Ctx;

/// Lookups of one run in flight at once: a run whose agent asks for a thousand names that
/// never answer holds that many of the resolver's queries, retransmits and sockets on the
/// runtime every run shares (issue 23, target 5); the others wait their turn, in its time.
pub const MAX_LOOKUPS: usize = 32;

/// Resolve (names only), screen, and connect to the first kept address that answers;
/// `early`: the lookup [`Early::start`] began already (an approved request), else made here.
pub async fn dial(ctx: &Ctx, adm: &Admission, early: Option<Early>) -> Result<(TcpStream, SocketAddr), DialError> {
    let kept = vetted(ctx, adm, early).await?;
    dial::connect_any(&kept, adm.port, ctx.connect_timeout).await
}

/// Resolve (names only) and screen: the addresses the gate may dial for `adm`, in order
/// (never empty). The pool (`pool.rs`) reuses a connection only to one of these. `early`:
/// the lookup of `adm.host` started before (see [`Early`]); its addresses are screened here,
/// now, as a lookup made here would be.
///
/// Errors: the lookup's [`DialError`], or [`DialError::Ssrf`] when every address is refused.
pub async fn vetted(ctx: &Ctx, adm: &Admission, early: Option<Early>) -> Result<Vec<IpAddr>, DialError> {
    room(ctx)?;
    let ips = match early {
        Some(early) => early.addresses().await?,
        None => lookup(ctx, &adm.host).await?,
    };
    // Again after the lookup: the run's other requests that passed beside this one while it
    // waited have opened their sockets since, and the dial follows without a wait.
    room(ctx)?;
    screen_for(ctx, adm, ips)
}

/// [`DialError::Short`] when the gate's process is short of descriptors and the run holds
/// its share of them or more (see [`super::fd_room::short_now`]; what passes opens one: the
/// lookup's socket, or the upstream one).
fn room(ctx: &Ctx) -> Result<(), DialError> {
    let held = ctx.held();
    match super::fd_room::short_now(held, 1) {
        true => Err(DialError::Short { held }),
        false => Ok(()),
    }
}

/// What `host` resolves to (a name's lookup takes one of the run's [`MAX_LOOKUPS`] slots,
/// waited for within the lookup's own time limit, the gate's connect timeout).
async fn lookup(ctx: &Ctx, host: &Host) -> Result<Vec<IpAddr>, DialError> {
    let started = tokio::time::Instant::now();
    let _slot = match (host, host.ip()) {
        (Host::Name(name), None) => Some(
            tokio::time::timeout(ctx.connect_timeout, ctx.lookups.acquire())
                .await
                .map_err(|_| DialError::DnsTimeout(name.clone()))?
                .map_err(|_| DialError::DnsTimeout(name.clone()))?,
        ),
        _ => None,
    };
    let limit = ctx.connect_timeout.saturating_sub(started.elapsed());
    dial::addresses(&ctx.resolver, host, limit).await
}

/// A name's lookup started ahead of the dial, on its own task: an approved request's,
/// begun alongside the claim (`hold.rs`) so that the human's yes does not wait for the claim
/// and then for DNS in turn. Only the lookup: its addresses are screened by [`vetted`] when
/// the request is sent (after the claim was won and the `admit` record written), and a
/// claim that is lost drops it (the task is aborted; nothing is dialled).
pub struct Early {
    task: tokio::task::JoinHandle<Result<Vec<IpAddr>, DialError>>,
    host: String,
}

impl Early {
    /// Start resolving `host` on the current runtime; `None` for an IP literal (nothing
    /// to look up) or outside a runtime.
    pub fn start(ctx: &Arc<Ctx>, host: &Host) -> Option<Early> {
        if !matches!((host, host.ip()), (Host::Name(_), None)) {
            return None;
        }
        let (ctx, host) = (ctx.clone(), host.clone());
        let rt = tokio::runtime::Handle::try_current().ok()?;
        let name = host.to_string();
        Some(Early { task: rt.spawn(async move { lookup(&ctx, &host).await }), host: name })
    }

    /// The lookup's answer (as [`vetted`] would have had it).
    async fn addresses(mut self) -> Result<Vec<IpAddr>, DialError> {
        let host = std::mem::take(&mut self.host);
        (&mut self.task).await.unwrap_or_else(|e| Err(DialError::Dns { host, msg: format!("the lookup's task ended: {e}") }))
    }
}

impl Drop for Early {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn screen_for(ctx: &Ctx, adm: &Admission, ips: Vec<IpAddr>) -> Result<Vec<IpAddr>, DialError> {
    let policy = ctx.policy.read().unwrap_or_else(|p| p.into_inner());
    let allow_private = adm.decision.allow_private && matches!(adm.host, Host::Name(_));
    // An IP literal an allow rule matched (whatever its methods, path and schemes) is named
    // for this request: the rule decided it.
    let by_decision = adm.host.ip().filter(|_| adm.decision.action == Action::Allow && adm.decision.rule.is_some());
    screen(&policy, &ctx.public_ranges.with(&policy.public_ranges), allow_private, by_decision, adm.port, ips)
}

/// The addresses of `ips` the gate may dial on `port`, in order; when none is left, the
/// first refused one and its class ([`DialError::Ssrf`]). `allow_private`: the destination
/// is a name whose deciding rule has `allow_private = true`. `named_by_decision`: the
/// destination is this IP literal and an allow rule decided the request (it names it,
/// even when scoped by method, path or scheme; see [`Policy::names_ip`]).
pub fn screen(
    policy: &Policy,
    ranges: &PublicRanges,
    allow_private: bool,
    named_by_decision: Option<IpAddr>,
    port: u16,
    ips: Vec<IpAddr>,
) -> Result<Vec<IpAddr>, DialError> {
    let mut refused: Option<(IpAddr, Class)> = None;
    let mut kept = Vec::with_capacity(ips.len());
    for ip in ips {
        let class = ranges.classify(ip);
        let allowed = class == Class::Public
            || named_by_decision == Some(ip)
            || policy.names_ip(ip, port).is_some()
            || (allow_private && class.allow_private_covers());
        if allowed {
            kept.push(ip);
        } else {
            tracing::debug!(dst.ip = %ip, class = %class, "ssrf guard: address dropped");
            refused.get_or_insert((ip, class));
        }
    }
    match (kept.is_empty(), refused) {
        (true, Some((ip, class))) => Err(DialError::Ssrf { ip, class }),
        _ => Ok(kept),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::file::from_toml;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    fn ips(list: &[&str]) -> Vec<IpAddr> {
        list.iter().map(|s| ip(s)).collect()
    }

    #[test]
    fn screening_keeps_public_named_and_allow_private_addresses() {
        let text = "default = \"allow\"\n\n[[rule]]\nhost = \"169.254.169.254\"\nport = 80\naction = \"allow\"\n\n\
                    [[rule]]\nhost = \"::ffff:10.0.0.1\"\nport = 80\naction = \"allow\"\n";
        let policy = from_toml(text, "p.toml").unwrap_or_else(|e| panic!("{e}"));
        let ranges = PublicRanges::parse(&["203.0.113.0/24"]).unwrap_or_else(|e| panic!("{e}"));
        let refused = |class, addr: &str| Err::<Vec<IpAddr>, (Class, IpAddr)>((class, ip(addr)));
        #[allow(clippy::type_complexity)]
        let table: &[(&str, bool, u16, &[&str], Result<Vec<IpAddr>, (Class, IpAddr)>)] = &[
            ("public", false, 80, &["8.8.8.8"], Ok(ips(&["8.8.8.8"]))),
            ("loopback", false, 80, &["127.0.0.1"], refused(Class::Loopback, "127.0.0.1")),
            ("loopback, allow_private", true, 80, &["127.0.0.1"], Ok(ips(&["127.0.0.1"]))),
            ("private dropped, public kept", false, 80, &["10.0.0.1", "8.8.8.8"], Ok(ips(&["8.8.8.8"]))),
            ("the first refusal is reported", false, 80, &["10.0.0.1", "fe80::1"], refused(Class::Private, "10.0.0.1")),
            ("metadata, allow_private", true, 443, &["169.254.169.254"], refused(Class::Metadata, "169.254.169.254")),
            ("metadata, named", false, 80, &["169.254.169.254"], Ok(ips(&["169.254.169.254"]))),
            ("embedded, allow_private", true, 80, &["::ffff:127.0.0.1"], refused(Class::EmbeddedIpv4, "::ffff:127.0.0.1")),
            ("embedded, named", false, 80, &["::ffff:10.0.0.1"], Ok(ips(&["::ffff:10.0.0.1"]))),
            ("documentation listed public", false, 80, &["203.0.113.7"], Ok(ips(&["203.0.113.7"]))),
            ("documentation not listed", false, 80, &["198.51.100.7"], refused(Class::Documentation, "198.51.100.7")),
            ("documentation, allow_private", true, 80, &["198.51.100.7"], Ok(ips(&["198.51.100.7"]))),
            ("multicast, allow_private", true, 80, &["224.0.0.1"], refused(Class::Multicast, "224.0.0.1")),
        ];
        for (case, allow_private, port, input, want) in table {
            let got = screen(&policy, &ranges, *allow_private, None, *port, ips(input)).map_err(|e| match e {
                DialError::Ssrf { ip, class } => (class, ip),
                other => panic!("{case}: {other}"),
            });
            assert_eq!(&got, want, "{case}");
        }
        let e = screen(&policy, &ranges, false, None, 80, ips(&["100.64.0.1"])).err().map(|e| e.to_string());
        assert_eq!(e.as_deref(), Some("ssrf: cgnat address 100.64.0.1"));
        // The IP literal a (scoped) allow rule decided is named for that request alone.
        let named = screen(&policy, &ranges, false, Some(ip("10.0.0.7")), 80, ips(&["10.0.0.7"]));
        assert_eq!(named.ok(), Some(ips(&["10.0.0.7"])));
    }
}
