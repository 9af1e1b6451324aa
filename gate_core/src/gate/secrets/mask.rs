//! The response's screen: every secret's value that comes back from upstream (an echo
//! endpoint, an error page quoting the request, a debug route) is masked before the agent
//! reads it, in the head and in the body as it streams.
//!
//! What is masked, ASCII case ignored: the value, its base64 forms (the same as the request
//! screen's, see `needles`), the value percent-encoded (as a query injects it) and
//! JSON-escaped (as an echo of the request in JSON writes it). Each occurrence becomes as
//! many `*` as it has bytes, so lengths (`Content-Length`) still hold; the request's record
//! counts them (`redacted`). The body holds back the last `longest form − 1` bytes of what
//! came (`held_back`) until more arrive or it ends, so that a value split across frames is
//! masked whole. The hold-back is that many bytes whatever they are: holding back only the
//! bytes that may begin a form told an agent whose upstream pauses after its guess, by when
//! the guess reached it, whether it began the value (byte by byte, the value). Occurrences are looked for in the bytes as they came, the longest form at
//! each place: a value that begins with another secret's, or overlaps it, is masked whole.
//! A placeholder is no secret:
//! it passes. A compressed body is not looked into: a request the gate injects a secret
//! into asks for none (`Accept-Encoding: identity`, see `inject`).

use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use hyper::body::{Body, Frame, SizeHint};
use hyper::header::{HeaderMap, HeaderValue};

use super::{Secrets, Shared};

impl Secrets {
    /// Mask every occurrence of a secret's value in `buf` (see the module); how many.
    pub fn mask(&self, buf: &mut [u8]) -> u64 {
        self.mask_before(buf, buf.len(), 0).0
    }

    /// Mask in `buf[..upto]` every occurrence of a form that begins before `upto`, and the
    /// first `covered` bytes (an occurrence's end the previous call could not star yet);
    /// (how many occurrences, where the last one covered ends: at most `buf.len()`, beyond
    /// `upto` when an occurrence runs past it, whose bytes from `upto` on are left as they
    /// are for the caller to star when it lets them go).
    ///
    /// Occurrences are found in the bytes as they came, not as masked so far, and at each
    /// place the longest form: a value that begins with another secret's value, or whose
    /// start is another's end, is masked whole. The caller holds back the bytes from
    /// `upto` on (`held_back` of the bytes as they came): a form that begins there may
    /// be completed by the next bytes and is looked for then.
    pub(super) fn mask_before(&self, buf: &mut [u8], upto: usize, covered: usize) -> (u64, usize) {
        let upto = upto.min(buf.len());
        let mut end = covered.min(buf.len());
        if self.list.is_empty() {
            buf[..end.min(upto)].fill(b'*');
            return (0, end);
        }
        let mut masked = 0;
        for i in 0..upto {
            if self.may_begin_mask(buf[i]) {
                let rest = &buf[i..];
                let hit = self.list.iter().flat_map(|s| s.masks.iter())
                    .filter(|n| rest.len() >= n.len() && rest[..n.len()].eq_ignore_ascii_case(n))
                    .map(Vec::len)
                    .max();
                if let Some(len) = hit {
                    if i + len > end {
                        masked += 1; // not one inside the last (a shorter form where a longer began)
                    }
                    end = end.max(i + len);
                }
            }
            // Every occurrence that covers byte i begins at or before it, so it is known
            // now; later places read from i + 1 on, so the byte can be starred.
            if i < end {
                buf[i] = b'*';
            }
        }
        (masked, end)
    }

    /// Mask the values in every header of `headers`; how many.
    pub fn mask_headers(&self, headers: &mut HeaderMap) -> u64 {
        if self.list.is_empty() {
            return 0; // every response of a run without secrets passes here: no copy of its headers
        }
        let mut masked = 0;
        for value in headers.values_mut() {
            let mut bytes = value.as_bytes().to_vec();
            let n = self.mask(&mut bytes);
            if n > 0 {
                // `*` is a visible character: the masked bytes are a header value still.
                if let Ok(v) = HeaderValue::from_bytes(&bytes) {
                    *value = v;
                    masked += n;
                }
            }
        }
        masked
    }

    /// Whether `b` is the first byte of a masked form (ASCII case ignored): a bit of
    /// `mask_starts`, so that most bytes cost one test.
    fn may_begin_mask(&self, b: u8) -> bool {
        self.mask_starts[usize::from(b >> 6)] & (1 << (b & 63)) != 0
    }

    /// The length of the longest masked form, in bytes (0 without secrets).
    pub(super) fn longest_mask(&self) -> usize {
        self.list.iter().flat_map(|s| s.masks.iter().map(Vec::len)).max().unwrap_or(0)
    }

    /// How many bytes at the end of `len` bytes that came are held back until more come:
    /// `longest form − 1` (the most of a form that can be there without the whole of it),
    /// or all of them when fewer came. It depends on the number of bytes alone, never on
    /// what they are: a hold-back of the bytes that may begin a form is seen by the agent
    /// (they reach it later) and tells it whether a guess its upstream sent begins the value.
    pub(super) fn held_back(&self, len: usize) -> usize {
        len.min(self.longest_mask().saturating_sub(1))
    }
}

/// The masked forms of `value` (see the module): the value, `base64_forms` of it (those at
/// least as long as the value or `MIN_PLACEHOLDER`), and its percent-encoded (`query`) and
/// JSON-escaped forms where they differ.
pub(super) fn masks(value: &str, base64_forms: Vec<Vec<u8>>) -> Vec<Vec<u8>> {
    let mut out = vec![value.as_bytes().to_vec()];
    let json = serde_json::to_string(value).unwrap_or_default();
    let json = json.strip_prefix('"').and_then(|j| j.strip_suffix('"')).unwrap_or_default();
    let forms = [
        percent_encoding::utf8_percent_encode(value, super::QUERY).to_string().into_bytes(),
        json.as_bytes().to_vec(),
        json.replace('/', "\\/").into_bytes(), // JSON may escape '/' too (RFC 8259 §7)
    ];
    // A base64 form is masked when it is as long as the value or `MIN_PLACEHOLDER`: a short
    // value (a password injected as Basic) is masked as sent, so its base64 must be too.
    let min = value.len().min(super::MIN_PLACEHOLDER);
    for form in base64_forms.into_iter().filter(|f| f.len() >= min).chain(forms) {
        if !form.is_empty() && !out.iter().any(|n| n.eq_ignore_ascii_case(&form)) {
            out.push(form);
        }
    }
    out
}

/// Mask the values in a response's reason phrase (RFC 9112 §4: text the server chooses, which
/// hyper keeps as `hyper::ext::ReasonPhrase` in `extensions` and writes to the agent); how
/// many. One that the masked bytes cannot stand for is dropped (the standard one is written).
pub fn mask_reason(secrets: &Shared, extensions: &mut hyper::http::Extensions) -> u64 {
    let Some(reason) = extensions.get::<hyper::ext::ReasonPhrase>() else { return 0 };
    let mut bytes = reason.as_bytes().to_vec();
    let n = secrets.read().unwrap_or_else(|p| p.into_inner()).mask(&mut bytes);
    if n > 0 {
        match hyper::ext::ReasonPhrase::try_from(bytes) {
            Ok(masked) => extensions.insert(masked),
            Err(_) => extensions.remove::<hyper::ext::ReasonPhrase>(),
        };
    }
    n
}

/// Bytes as they came, the last of them held back ([`Secrets::held_back`]),
/// and how many of their first bytes an occurrence found already covers
/// ([`Secrets::mask_before`]): the hold of a streamed body and of a WebSocket's frame.
#[derive(Default)]
pub(super) struct Hold {
    bytes: BytesMut,
    covered: usize,
}

impl Hold {
    /// Take `data` in; what can go now, masked, and how many occurrences it held: all of the
    /// held bytes when `end` (the body or the frame ends), else all but the last
    /// [`Secrets::held_back`], which the next bytes may complete a form with.
    pub(super) fn take(&mut self, secrets: &Secrets, data: &[u8], end: bool) -> (Bytes, u64) {
        self.bytes.extend_from_slice(data);
        let upto = if end { self.bytes.len() } else { self.bytes.len() - secrets.held_back(self.bytes.len()) };
        let (n, reach) = secrets.mask_before(&mut self.bytes, upto, self.covered);
        self.covered = reach.saturating_sub(upto);
        (self.bytes.split_to(upto).freeze(), n)
    }

    /// How many bytes are held.
    pub(super) fn len(&self) -> usize {
        self.bytes.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.bytes.is_empty()
    }
}

/// A response body with the run's secrets masked as it streams (see the module); the
/// masks are counted in `masked`.
pub struct Masked<B> {
    inner: B,
    secrets: Shared,
    held: Hold,
    /// Trailers that came while bytes were held: yielded after them.
    trailers: Option<Frame<Bytes>>,
    done: bool,
    masked: Arc<AtomicU64>,
}

/// `headers` masked now, and `body` to be masked as it streams, for the run's secrets; the
/// count of both in the returned counter (read at the body's end for the record).
pub fn mask<B>(secrets: &Shared, headers: &mut HeaderMap, body: B) -> (Masked<B>, Arc<AtomicU64>) {
    let in_head = secrets.read().unwrap_or_else(|p| p.into_inner()).mask_headers(headers);
    let masked = Arc::new(AtomicU64::new(in_head));
    let body = Masked { inner: body, secrets: secrets.clone(), held: Hold::default(), trailers: None, done: false, masked: masked.clone() };
    (body, masked)
}

impl<B> Masked<B> {
    /// The held bytes, masked, all of them.
    fn flush(&mut self, secrets: &Secrets) -> Bytes {
        let (out, n) = self.held.take(secrets, &[], true);
        self.masked.fetch_add(n, Ordering::Relaxed);
        out
    }
}

impl<B> Body for Masked<B>
where
    B: Body<Data = Bytes> + Unpin,
{
    type Data = Bytes;
    type Error = B::Error;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, B::Error>>> {
        let this = &mut *self;
        loop {
            if let Some(t) = this.trailers.take() {
                return Poll::Ready(Some(Ok(t)));
            }
            if this.done {
                return Poll::Ready(None);
            }
            let shared = this.secrets.clone();
            let secrets = shared.read().unwrap_or_else(|p| p.into_inner());
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => {
                    this.done = true;
                    if this.held.is_empty() {
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Ok(Frame::data(this.flush(&secrets)))));
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            match frame.into_data() {
                Ok(data) if this.held.is_empty() && secrets.is_empty() => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(data) => {
                    let (out, n) = this.held.take(&secrets, &data, false);
                    this.masked.fetch_add(n, Ordering::Relaxed);
                    if !out.is_empty() {
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                }
                Err(mut frame) => {
                    if let Some(t) = frame.trailers_mut() {
                        let n = secrets.mask_headers(t);
                        this.masked.fetch_add(n, Ordering::Relaxed);
                    }
                    if this.held.is_empty() {
                        return Poll::Ready(Some(Ok(frame)));
                    }
                    this.trailers = Some(frame);
                    return Poll::Ready(Some(Ok(Frame::data(this.flush(&secrets)))));
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.trailers.is_none() && self.held.is_empty() && (self.done || self.inner.is_end_stream())
    }

    fn size_hint(&self) -> SizeHint {
        let inner = if self.done { SizeHint::with_exact(0) } else { self.inner.size_hint() };
        super::body::held_hint(inner, self.held.len() as u64)
    }
}
