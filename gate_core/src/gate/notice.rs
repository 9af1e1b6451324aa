//! Live one-line notices, on gatewrap's stderr (or the run's own descriptor, see
//! `notice_fd`), of what the gate refused or could not reach.
//!
//! A CONNECT client shows only "response 403"; the reason is here (and in the audit log).
//! After [`MAX_NOTICES`] one line says the rest are suppressed; the audit log keeps all.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::audit::{fields as f, GateRecord};

use super::notice_fd::FdSink;

/// Notices per run before they are suppressed.
pub const MAX_NOTICES: u64 = 20;

#[derive(Debug, Default)]
pub struct Notices {
    enabled: bool,
    /// Where the lines go; `None`: the process's stderr.
    sink: Option<FdSink>,
    shown: AtomicU64,
    /// The last line shown: a repeat of it is not shown again (a lookup asks for A and AAAA
    /// of each nameserver: four identical DNS refusals).
    last: Mutex<String>,
    /// Keys of the lines [`Notices::say_once`] has said (one per host: bounded by the run's
    /// hosts; past [`MAX_ONCE`] keys nothing more is said that way).
    once: Mutex<std::collections::HashSet<String>>,
}

/// Most keys [`Notices::say_once`] remembers: past them it says nothing more.
pub const MAX_ONCE: usize = 1000;

impl Notices {
    /// Notices on `sink` (`None`: stderr) if `enabled`, else none.
    pub fn new(enabled: bool, sink: Option<FdSink>) -> Notices {
        Notices { enabled, sink, shown: AtomicU64::new(0), last: Mutex::new(String::new()), once: Mutex::default() }
    }

    /// Print one line; write errors are ignored (never a panic, unlike `eprintln!`).
    fn print(&self, text: &str) {
        match &self.sink {
            Some(sink) => sink.send(format!("{text}\n")),
            None => {
                let _ = writeln!(std::io::stderr().lock(), "{text}");
            }
        }
    }

    /// Print the notice of a refused (`denied`) or failed decision; allowed ones are silent.
    pub fn show(&self, rec: &GateRecord) {
        // A spent budget is told once per window by `say` instead of once per request.
        if !self.enabled || rec.decision == f::ALLOWED || rec.reason.as_deref() == Some(crate::policy::budget::REASON_BUDGET) {
            return;
        }
        let text = line(rec);
        {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            if *last == text {
                return;
            }
            *last = text.clone();
        }
        let n = self.shown.fetch_add(1, Ordering::Relaxed) + 1;
        if n == MAX_NOTICES + 1 {
            self.print(&format!(
                "gatewrap: more requests refused by the gate; further notices suppressed \
                 (gatewrap audit --run {} --denied)",
                rec.run
            ));
        }
        if n <= MAX_NOTICES {
            self.print(&text);
        }
    }
}

impl Notices {
    /// Print one line as it is (control characters escaped), outside the per-run cap:
    /// for notices that are already rare (a budget spent: once per window).
    pub fn say(&self, text: &str) {
        if self.enabled {
            self.print(&printable(text));
        }
    }

    /// [`Notices::say`] `text` the first time `key` (a host) comes, never again in this run.
    pub fn say_once(&self, key: &str, text: &str) {
        let first = {
            let mut once = self.once.lock().unwrap_or_else(|p| p.into_inner());
            once.len() < MAX_ONCE && once.insert(key.to_string())
        };
        if first {
            self.say(text);
        }
    }
}

/// `gatewrap: denied CONNECT evil.test:443 (policy: default deny)`, control characters escaped.
pub fn line(rec: &GateRecord) -> String {
    if rec.event == f::EVENT_DNS {
        let name = rec.dst_host.as_deref().unwrap_or("a malformed query");
        return printable(&format!(
            "gatewrap: refused a DNS query for {name}: the sandbox resolves nothing; send requests through \
             the gate, which resolves the names it allows"
        ));
    }
    let what = match (&rec.dst_host, rec.dst_port) {
        (Some(h), Some(p)) if h.contains(':') => format!("[{h}]:{p}"),
        (Some(h), Some(p)) => format!("{h}:{p}"),
        _ => rec.target.clone().unwrap_or_else(|| "a request".into()),
    };
    let method = rec.method.as_deref().unwrap_or("");
    let why = rec.error.as_deref().or(rec.reason.as_deref()).unwrap_or("");
    let verb = match rec.decision {
        f::DENIED => "denied",
        // The gate's own fault (the audit log cannot be written): nothing was dialled.
        _ if why.starts_with("internal:") => "did not send",
        _ => "could not reach",
    };
    printable(&format!("gatewrap: {verb} {method} {what} ({why})").replace("  ", " "))
}

fn printable(s: &str) -> String {
    s.chars().flat_map(|c| if c.is_control() { c.escape_default().collect::<Vec<_>>() } else { vec![c] }).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_denial_names_the_destination_and_the_reason_and_escapes_controls() {
        let rec = GateRecord {
            decision: f::DENIED,
            method: Some("CONNECT".into()),
            dst_host: Some("evil.test".into()),
            dst_port: Some(443),
            reason: Some("policy: default deny\x1b[2J".into()),
            ..GateRecord::default()
        };
        assert_eq!(line(&rec), "gatewrap: denied CONNECT evil.test:443 (policy: default deny\\u{1b}[2J)");
    }

    #[test]
    fn an_ipv6_destination_is_bracketed() {
        let rec = GateRecord {
            decision: f::DENIED,
            method: Some("GET".into()),
            dst_host: Some("::1".into()),
            dst_port: Some(80),
            reason: Some("ssrf: loopback address ::1".into()),
            ..GateRecord::default()
        };
        assert_eq!(line(&rec), "gatewrap: denied GET [::1]:80 (ssrf: loopback address ::1)");
    }

    #[test]
    fn a_failure_names_its_cause() {
        let rec = GateRecord {
            decision: f::FAILED,
            method: Some("GET".into()),
            dst_host: Some("x.test".into()),
            dst_port: Some(80),
            reason: Some("policy: rule --allow x.test".into()),
            error: Some("dns: no address for x.test".into()),
            ..GateRecord::default()
        };
        assert_eq!(line(&rec), "gatewrap: could not reach GET x.test:80 (dns: no address for x.test)");
        let unrecorded = GateRecord { error: Some("internal: cannot write audit log /l: No space left on device".into()), ..rec };
        assert_eq!(line(&unrecorded), "gatewrap: did not send GET x.test:80 (internal: cannot write audit log /l: No space left on device)");
    }
}
