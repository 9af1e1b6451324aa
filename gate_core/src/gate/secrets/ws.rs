//! The response's mask (`mask`) on a WebSocket after its `101` (RFC 6455): what the upstream
//! sends is read frame by frame, each header by tungstenite's parser (`FrameHeader::parse`,
//! RFC 6455 §5.2), and each frame's payload (a data or a control frame: a close reason may
//! quote the value too) is masked as it streams. Bytes are held back only as far as
//! `pending_tail` says, and never past the frame's end: once a frame's header came, all of
//! its bytes are on their way, so nothing waits for a message the server has not sent.
//!
//! Not looked into: a value split across two frames (a fragmented message), a compressed
//! message (`permessage-deflate`, RFC 7692: a request the gate injects into offers no
//! extension, see `inject`). A frame the server masked (RFC 6455 §5.1 forbids it; its
//! payload would pass unread) ends the connection, as a header that does not parse does.

use std::io::{self, Cursor};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};
use tungstenite::protocol::frame::FrameHeader;

use super::mask::Hold;
use super::Shared;

/// Bytes read from the upstream at a time.
const READ_BYTES: usize = 16 * 1024;

/// The upstream's side of an upgraded WebSocket (its read half), whose reads come masked
/// (see the module).
pub struct WsMasked<S> {
    inner: S,
    secrets: Shared,
    /// Read from `inner`, not yet looked at.
    input: BytesMut,
    /// Looked at, to be read by the relay.
    out: BytesMut,
    /// Bytes of the current frame's payload still to come; None between frames.
    left: Option<u64>,
    /// The current payload's bytes that may begin a value.
    held: Hold,
    eof: bool,
}

impl<S> WsMasked<S> {
    /// `inner` (the upstream's connection after its 101), masked for the run's `secrets`.
    pub fn new(inner: S, secrets: Shared) -> WsMasked<S> {
        WsMasked { inner, secrets, input: BytesMut::new(), out: BytesMut::new(), left: None, held: Hold::default(), eof: false }
    }

    /// Move what `input` holds to `out`, masked, as far as it can go; whether anything moved.
    ///
    /// Errors: `InvalidData` for a header that does not parse or a masked frame.
    fn look(&mut self) -> io::Result<bool> {
        let before = self.out.len();
        loop {
            match self.left {
                None => {
                    let mut cursor = Cursor::new(&self.input[..]);
                    let parsed = FrameHeader::parse(&mut cursor).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    let Some((header, len)) = parsed else { break };
                    if header.mask.is_some() {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "a masked frame from the server (RFC 6455 §5.1)"));
                    }
                    let header_len = cursor.position() as usize;
                    self.out.extend_from_slice(&self.input.split_to(header_len));
                    self.left = Some(len);
                }
                Some(left) => {
                    let n = left.min(self.input.len() as u64) as usize;
                    let left = left - n as u64;
                    let secrets = self.secrets.read().unwrap_or_else(|p| p.into_inner());
                    let (go, _) = self.held.take(&secrets, &self.input.split_to(n), left == 0);
                    self.out.extend_from_slice(&go);
                    self.left = (left > 0).then_some(left);
                    if left > 0 {
                        break; // the rest of the payload is still to come
                    }
                }
            }
        }
        Ok(self.out.len() > before)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for WsMasked<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = &mut *self;
        loop {
            if !this.out.is_empty() {
                let n = this.out.len().min(buf.remaining());
                buf.put_slice(&this.out[..n]);
                this.out.advance(n);
                return Poll::Ready(Ok(()));
            }
            if this.eof {
                // The upstream closed mid-frame: what was held goes, masked (it began no value
                // the upstream went on to send), and so do the bytes of a cut header.
                let (held, _) = this.held.take(&this.secrets.read().unwrap_or_else(|p| p.into_inner()), &[], true);
                this.out.extend_from_slice(&held);
                this.out.extend_from_slice(&this.input.split());
                if this.out.is_empty() {
                    return Poll::Ready(Ok(()));
                }
                continue;
            }
            let mut chunk = [0u8; READ_BYTES];
            let mut read = ReadBuf::new(&mut chunk);
            match Pin::new(&mut this.inner).poll_read(cx, &mut read) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Ready(Ok(())) if read.filled().is_empty() => this.eof = true,
                Poll::Ready(Ok(())) => {
                    this.input.extend_from_slice(read.filled());
                    this.look()?;
                }
            }
        }
    }
}
