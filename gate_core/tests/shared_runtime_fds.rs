//! Gates started and stopped on the shared runtime hold three descriptors while they run and
//! release every one (root). Its own test binary: the only test in the process, so the fd
//! count is this test's.

mod common;

use std::sync::{Arc, RwLock};

use _gate_core::audit::AuditLog;
use _gate_core::gate::{Gate, GateConfig};
use _gate_core::policy::{Action, Policy};
use common::{require_root, Netns, TempDir};

/// Cycles of start and stop.
const CYCLES: usize = 200;

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

fn start(ns: &Netns, audit: &Arc<AuditLog>) -> Gate {
    Gate::start(GateConfig {
        run_id: "gw-fds".into(),
        dns_stub: true,
        shared_runtime: true,
        ..common::gate_config(ns, Arc::new(RwLock::new(Policy::new(Action::Deny))), audit.clone())
    })
    .expect("gate starts")
}

#[test]
fn start_and_stop_on_the_shared_runtime_leaks_no_fd() {
    require_root();
    let ns = Netns::new("rt-fds");
    let dir = TempDir::new("shared-rt-fds");
    let audit = Arc::new(AuditLog::open(dir.path.join("audit.jsonl")).expect("audit"));
    // The first gate builds the shared runtime (its event loop's descriptors stay).
    let first = start(&ns, &audit);
    first.stop();
    drop(first);
    let baseline = open_fds();
    for i in 0..CYCLES {
        // The DNS stub binds port 53 in the same netns each time: the last gate's are closed.
        let gate = start(&ns, &audit);
        // One socket each for the proxy, the DNS stub's UDP and its TCP, each serving 127.0.0.1
        // and ::1 (a daemon holds them for every idle sandbox: issue 23, target 4).
        assert_eq!(open_fds(), baseline + 3, "cycle {i}: the gate holds its three listeners, nothing else");
        gate.stop();
        assert_eq!(gate.live_tasks(), 0, "cycle {i}");
        drop(gate);
    }
    assert_eq!(open_fds(), baseline, "descriptors after {CYCLES} cycles");
}
