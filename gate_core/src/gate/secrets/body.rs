//! The request body's screen (issue 20): a body that passes the agent's bytes on except the
//! last few it has seen, which it holds back until more arrive or the body ends, so that a
//! placeholder or value split across frames is found before any of its bytes leave.
//!
//! Held back: `3 × longest needle − 1` bytes (the longest needle percent-encoded whole, less
//! one: see [`Secrets::found_in`] for the needles). Each frame is searched together with the
//! held bytes, as sent and percent-decoded once, ASCII case ignored, as the headers are. A
//! find ends the body with [`InBody`] (hyper then aborts the upstream request); the gate
//! answers 403 before anything is sent when the find is in what [`Screened::read_ahead`]
//! reads first. Memory: the held bytes plus one frame, whatever the body's length.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame, SizeHint};

use super::{Misuse, Secrets, Shared};

/// The error type of a request body on its way upstream.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A secret's placeholder or value found in a request body (or its trailers): the error a
/// [`Screened`] body ends with. Its text names the secret, never the value.
#[derive(Debug)]
pub struct InBody(pub Misuse);

impl std::fmt::Display for InBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: the {} of secret {} in the {}", super::REASON_MISUSE, self.0.what, self.0.secret, self.0.seen)
    }
}

impl std::error::Error for InBody {}

/// A request body screened for the run's secrets as it streams (see the module).
pub struct Screened<B> {
    inner: B,
    secrets: Shared,
    /// Seen, not yet passed on (at most the hold-back once a frame is handled).
    held: BytesMut,
    /// What [`Screened::read_ahead`] read, yielded first.
    ahead: Option<Option<Result<Frame<Bytes>, BoxError>>>,
    /// Trailers that came while bytes were held: yielded after them.
    trailers: Option<Frame<Bytes>>,
    done: bool,
}

impl Secrets {
    /// The secret in `hay`, a piece of a request body (as sent and percent-decoded once).
    pub fn in_body(&self, hay: &[u8]) -> Option<Misuse> {
        let (secret, what) = self.found_in_decoded(hay)?;
        Some(Misuse { secret: secret.to_string(), what, seen: "body".into() })
    }

    /// Bytes of a body held back so that no needle, percent-encoded, can straddle frames unseen.
    pub fn hold_back(&self) -> usize {
        (3 * self.longest()).saturating_sub(1)
    }
}

impl<B> Screened<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    /// `inner`, screened for `secrets` (read on each frame: a rotation applies at once).
    pub fn new(inner: B, secrets: Shared) -> Screened<B> {
        Screened { inner, secrets, held: BytesMut::new(), ahead: None, trailers: None, done: false }
    }

    /// Read until the first bytes could be passed on (more than the hold-back seen), the body
    /// ends or fails; kept to be yielded. `Err` when a secret is in what was read: nothing
    /// has been sent, so the caller refuses the request whole.
    pub async fn read_ahead(mut self) -> Result<Screened<B>, InBody> {
        match self.frame().await {
            Some(Err(e)) if e.is::<InBody>() => match e.downcast::<InBody>() {
                Ok(found) => Err(*found),
                Err(e) => {
                    self.ahead = Some(Some(Err(e)));
                    Ok(self)
                }
            },
            other => {
                self.ahead = Some(other);
                Ok(self)
            }
        }
    }

    /// A data frame of the held bytes, all of them.
    fn flush(&mut self) -> Frame<Bytes> {
        Frame::data(self.held.split().freeze())
    }
}

impl<B> Body for Screened<B>
where
    B: Body<Data = Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        loop {
            if let Some(ahead) = this.ahead.take() {
                return Poll::Ready(ahead);
            }
            if let Some(t) = this.trailers.take() {
                return Poll::Ready(Some(Ok(t)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    if this.held.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(this.flush())));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            let secrets = this.secrets.read().unwrap_or_else(|p| p.into_inner());
            match frame.into_data() {
                Ok(data) if this.held.is_empty() && secrets.is_empty() => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(data) => {
                    this.held.extend_from_slice(&data);
                    if let Some(found) = secrets.in_body(&this.held) {
                        this.done = true;
                        this.held.clear();
                        return Poll::Ready(Some(Err(Box::new(InBody(found)))));
                    }
                    let keep = secrets.hold_back();
                    if this.held.len() > keep {
                        let out = this.held.split_to(this.held.len() - keep).freeze();
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Err(frame) => {
                    let found = frame.trailers_ref().and_then(|t| secrets.misuse(t, ""));
                    if let Some(mut found) = found {
                        found.seen = format!("body's trailer ({})", found.seen);
                        this.done = true;
                        this.held.clear();
                        return Poll::Ready(Some(Err(Box::new(InBody(found)))));
                    }
                    if this.held.is_empty() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    this.trailers = Some(frame);
                    return Poll::Ready(Some(Ok(Frame::data(this.held.split().freeze()))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        let ahead_ends = matches!(self.ahead, Some(None));
        let nothing_ahead = self.ahead.is_none() || ahead_ends;
        nothing_ahead && self.trailers.is_none() && self.held.is_empty() && (ahead_ends || self.done || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let ahead = match &self.ahead {
            Some(Some(Ok(f))) => f.data_ref().map_or(0, |d| d.len()),
            _ => 0,
        };
        let inner = if self.done { SizeHint::with_exact(0) } else { self.inner.size_hint() };
        held_hint(inner, (self.held.len() + ahead) as u64)
    }
}

/// The size hint of a body that holds `held` bytes back from an inner one hinting `inner`.
pub(super) fn held_hint(inner: SizeHint, held: u64) -> SizeHint {
    let mut hint = SizeHint::new();
    hint.set_lower(inner.lower() + held);
    if let Some(upper) = inner.upper() {
        hint.set_upper(upper + held);
    }
    hint
}
