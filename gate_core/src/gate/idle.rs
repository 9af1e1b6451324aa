//! Copy bytes both ways between two streams until either side closes, or until neither
//! side has sent anything for the idle timeout (tunnels and upgraded connections).

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Time of the last byte read from either stream, in ms since `start`.
pub(super) struct Activity {
    start: Instant,
    last_ms: AtomicU64,
}

impl Activity {
    pub(super) fn new() -> Activity {
        Activity { start: Instant::now(), last_ms: AtomicU64::new(0) }
    }

    /// Note that a byte crossed now.
    pub(super) fn touch(&self) {
        self.last_ms.store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    fn idle_for(&self) -> Duration {
        self.start.elapsed().saturating_sub(Duration::from_millis(self.last_ms.load(Ordering::Relaxed)))
    }
}

/// A stream that notes every successful read in the shared [`Activity`].
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// How a relay ended.
#[derive(Debug)]
pub enum Ended {
    /// Both directions done: bytes client→upstream, upstream→client.
    Closed(u64, u64),
    Error(io::Error),
    /// Nothing was sent either way for the idle timeout; both streams are dropped.
    Idle,
}

/// Bytes each direction of a relay reads and writes at a time: 32 times tokio's default
/// (8 KiB), which made a tunnel's bulk transfer cost a `recvfrom` and a `sendto` per 8 KiB
/// (0.2x a direct download on loopback). Allocated zeroed, so the pages a short exchange
/// never fills are never touched (glibc maps large blocks lazily, mmap(2)).
pub const BUFFER_BYTES: usize = 256 * 1024;

/// [`tokio::io::copy_bidirectional_with_sizes`] with [`BUFFER_BYTES`] each way, ended
/// after `idle` without a byte in either direction.
pub async fn relay<A, B>(a: A, b: B, idle: Duration) -> Ended
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let activity = Arc::new(Activity::new());
    let mut a = Watched { inner: a, activity: activity.clone() };
    let mut b = Watched { inner: b, activity: activity.clone() };
    let watchdog = watchdog(&activity, idle);
    tokio::select! {
        r = tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, BUFFER_BYTES, BUFFER_BYTES) => match r {
            Ok((up, down)) => Ended::Closed(up, down),
            Err(e) => Ended::Error(e),
        },
        () = watchdog => Ended::Idle,
    }
}

/// Returns once nothing was noted in `activity` for `idle`.
pub(super) async fn watchdog(activity: &Activity, idle: Duration) {
    loop {
        let left = idle.saturating_sub(activity.idle_for());
        if left.is_zero() {
            return;
        }
        tokio::time::sleep(left).await;
    }
}
