//! The bytes and duration of a forwarded request (plain http, or inside an inspected
//! tunnel), for its record (`bytes_up`, `bytes_down`, `duration_ms`): the request body
//! counted on its way upstream ([`Counted`]), the response body on its way to the client
//! ([`Recorded`]), whose end writes the record.

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::Bytes;
use hyper::body::{Body, Frame, SizeHint};

use super::ctx::Pending;

/// A body that adds the length of each data frame it yields to a shared count.
pub struct Counted<B> {
    inner: B,
    count: Arc<AtomicU64>,
}

impl<B> Counted<B> {
    /// `inner`, counted into `count` (bytes).
    pub fn new(inner: B, count: Arc<AtomicU64>) -> Counted<B> {
        Counted { inner, count }
    }
}

impl<B: Body<Data = Bytes> + Unpin> Body for Counted<B> {
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        if let Poll::Ready(Some(Ok(frame))) = &polled {
            if let Some(data) = frame.data_ref() {
                self.count.fetch_add(data.len() as u64, Ordering::Relaxed);
            }
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

/// What the end of a response writes: the request's record (its status set) with the
/// bytes up (`up`, counted by [`Counted`]), the bytes down and the time since `started`.
pub struct Outcome {
    pub pending: Pending,
    pub started: Instant,
    pub up: Arc<AtomicU64>,
    /// Secret values masked in the response so far (see `secrets::mask`).
    pub masked: Arc<AtomicU64>,
}

/// A response body that counts what it passes to the client and writes the request's
/// record at its end: when its last data frame is handed on (before hyper writes it, so
/// that a client that has the whole response finds the record written), when it ends
/// empty (at once), on an error from upstream (`error` `upstream: ...`), or when hyper
/// drops it unfinished (the client went away: `error` `downstream: ...`).
pub struct Recorded<B: Body> {
    inner: B,
    outcome: Option<Outcome>,
    down: u64,
}

impl<B: Body> Recorded<B> {
    /// `inner`, whose end writes `outcome`'s record (at once when it is already at its end).
    pub fn new(inner: B, outcome: Outcome) -> Recorded<B> {
        let mut r = Recorded { inner, outcome: Some(outcome), down: 0 };
        if r.inner.is_end_stream() {
            r.finish(None);
        }
        r
    }

    /// Write the record with the counts so far, `error` if there was one; once.
    fn finish(&mut self, error: Option<String>) {
        let Some(Outcome { mut pending, started, up, masked }) = self.outcome.take() else { return };
        let rec = pending.rec();
        rec.redacted = Some(masked.load(Ordering::Relaxed)).filter(|n| *n > 0);
        rec.bytes_up = Some(up.load(Ordering::Relaxed));
        rec.bytes_down = Some(self.down);
        rec.duration_ms = Some(millis(started));
        if error.is_some() {
            rec.error = error;
        }
        pending.finish();
    }
}

/// Milliseconds since `t`, rounded to the microsecond.
pub fn millis(t: Instant) -> f64 {
    (t.elapsed().as_micros() as f64) / 1000.0
}

impl<B: Body<Data = Bytes> + Unpin> Body for Recorded<B>
where
    B::Error: std::fmt::Display,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let polled = Pin::new(&mut self.inner).poll_frame(cx);
        match &polled {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(data) = frame.data_ref() {
                    self.down += data.len() as u64;
                }
                if self.inner.is_end_stream() {
                    self.finish(None);
                }
            }
            Poll::Ready(Some(Err(e))) => {
                let error = format!("upstream: the response body broke off: {e}");
                self.finish(Some(error));
            }
            Poll::Ready(None) => self.finish(None),
            Poll::Pending => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl<B: Body> Drop for Recorded<B> {
    fn drop(&mut self) {
        if self.outcome.is_some() {
            let left = !self.inner.is_end_stream();
            self.finish(left.then(|| "downstream: client disconnected before the end of the response".to_string()));
        }
    }
}
