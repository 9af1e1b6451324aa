//! The tasks of one gate, and the runtime they run on.
//!
//! Every task the gate spawns (accept loops, connections, tunnels, upgrades, inspected
//! tunnels, held requests, pool reapers and upstream connection tasks) goes through
//! [`Tasks::spawn`]: it runs under the gate's [`CancellationToken`] and is counted in its
//! [`TaskTracker`]. [`Tasks::end`] cancels them all and waits until each future has been
//! dropped, which closes its sockets. That is what lets many gates share one runtime
//! ([`shared`]): stopping one ends exactly its work and nothing of the others.
//!
//! `spawn_blocking` work (the `/proc` lookups in `client`, at most `client::THREADS` of
//! those at once for all gates; the approvals store has a thread of its own, see
//! `hold::Approvals::call`) is not tracked: each closure does a bounded piece of work and
//! ends on its own.

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex, OnceLock};
use std::time::Duration;

use tokio::runtime::{Handle, Runtime};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// Worker threads of a gate's runtime (its own, or the shared one).
pub const WORKER_THREADS: usize = 2;

/// A multi-thread runtime of [`WORKER_THREADS`] workers named `gate-N`.
///
/// Built on the calling thread, whose network namespace its threads inherit: call it from
/// a thread in the host netns (never from the listener thread of `netns`), so that
/// upstream connections start from there.
///
/// Errors: the OS error of creating the threads or the event loop.
pub fn build() -> std::io::Result<Runtime> {
    let next = AtomicUsize::new(0);
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(WORKER_THREADS)
        .thread_name_fn(move || format!("gate-{}", next.fetch_add(1, Ordering::Relaxed)))
        .enable_all()
        .build()
}

static SHARED: OnceLock<Runtime> = OnceLock::new();
/// Serialises the first build, so that exactly one runtime is ever made.
static BUILDING: Mutex<()> = Mutex::new(());

/// The process-wide runtime shared by gates started with `shared_runtime`: built by the
/// first such gate (see [`build`] for the namespace it must be built in), never shut down.
///
/// Errors: the OS error of building it (the next call tries again).
pub fn shared() -> std::io::Result<&'static Runtime> {
    if let Some(rt) = SHARED.get() {
        return Ok(rt);
    }
    let _first = BUILDING.lock().unwrap_or_else(|p| p.into_inner());
    if let Some(rt) = SHARED.get() {
        return Ok(rt);
    }
    let rt = build()?;
    Ok(SHARED.get_or_init(move || rt))
}

/// One gate's token and tracker, and the runtime its tasks are spawned on. Cheap to clone.
#[derive(Clone)]
pub struct Tasks {
    token: CancellationToken,
    tracker: TaskTracker,
    handle: Handle,
}

impl Tasks {
    /// No tasks yet; they will run on `handle`'s runtime.
    pub fn new(handle: Handle) -> Tasks {
        Tasks { token: CancellationToken::new(), tracker: TaskTracker::new(), handle }
    }

    /// Run `fut` on the gate's runtime until it completes or the gate stops, whichever is
    /// first; stopping drops it (closing what it owns). Callable from any thread. After
    /// [`Tasks::end`] the future is dropped at its first poll.
    pub fn spawn<F>(&self, fut: F)
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        let token = self.token.clone();
        self.tracker.spawn_on(
            async move {
                tokio::select! {
                    biased;
                    () = token.cancelled() => {}
                    _ = fut => {}
                }
            },
            &self.handle,
        );
    }

    /// Tasks spawned and not yet ended (finished or dropped).
    pub fn live(&self) -> usize {
        self.tracker.len()
    }

    /// Cancel every task and wait up to `timeout` until each has ended. Blocks the calling
    /// thread (no runtime needed; on one of the runtime's own workers it only holds that
    /// worker). Idempotent. Returns true if all ended within `timeout`.
    pub fn end(&self, timeout: Duration) -> bool {
        self.tracker.close();
        self.token.cancel();
        if self.tracker.is_empty() {
            return true;
        }
        let (tx, rx) = mpsc::sync_channel(1);
        let tracker = self.tracker.clone();
        self.handle.spawn(async move {
            tracker.wait().await;
            let _ = tx.send(());
        });
        rx.recv_timeout(timeout).is_ok()
    }
}
