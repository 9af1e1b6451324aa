//! The response's mask (`mask`) on a WebSocket after its `101` (RFC 6455): what the upstream
//! sends is read frame by frame, each header by tungstenite's parser (`FrameHeader::parse`,
//! RFC 6455 §5.2), and each frame's payload (a data or a control frame: a close reason may
//! quote the value too) is masked as it streams. The last `longest masked form − 1` bytes that
//! came are held back (`held_back`: their number, never what they are, decides), and never
//! past a message's end.
//!
//! A frame that is a message whole (FIN, §5.4), and a control frame (ping, pong, close: at
//! most 125 bytes, never fragmented), keeps its header as it came and is masked alone: once
//! its header came, all of its bytes are on their way, so nothing waits for a message the
//! server has not sent. A fragmented message (a text or binary frame without FIN, then
//! continuation frames) is masked as one: the last bytes of a fragment (`held_back`) are
//! carried into its next fragment, so a value cut at a fragment's boundary is
//! masked whole. The gate re-frames such a message (§5.4 lets an intermediary change the
//! fragmentation of a message without extensions; `permessage-deflate`'s RSV1 stays on its
//! first frame only, RFC 7692 §6.1): the headers are written by tungstenite's
//! `FrameHeader::format`, a fragment's length known before its bytes are:
//! - a fragment without FIN of `n` bytes, `c` carried in (total `t = c + n`), goes as up to
//!   two frames without FIN: `t − k` bytes (`k` the longest form − 1, what a fragment's end
//!   holds back) as its bytes stream, then at its end what is not carried on;
//! - the last fragment (FIN) goes as one frame of `c + n` bytes, all of them.
//!
//! Control frames between fragments pass as they came, where they came; a close frame, or the
//! end of the stream, first lets the carried bytes go (masked) in a frame without FIN.
//!
//! Not looked into: a compressed message (`permessage-deflate`, RFC 7692: a request the gate
//! injects into offers no extension, see `inject`). A frame the server masked (RFC 6455 §5.1
//! forbids it; its payload would pass unread) ends the connection, as a header that does
//! not parse does.

use std::io::{self, Cursor};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf as _, BytesMut};
use tokio::io::{AsyncRead, ReadBuf};
use tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

use super::mask::Hold;
use super::{Secrets, Shared};

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
    /// The current frame's header as it came.
    current: FrameHeader,
    /// Bytes the last header written to `out` still owes its payload.
    owed: u64,
    /// Bytes let go past `owed` (the last of a fragment without FIN): framed at its end.
    spill: BytesMut,
    /// The data message's last bytes (`held_back`), carried across its fragments.
    held: Hold,
    /// The control frame's (masked alone).
    ctl: Hold,
    /// A fragmented message is under way (a fragment without FIN came, its last has not).
    fragmented: bool,
    /// The header of the fragmented message's first frame, until a frame of it is written.
    first: Option<FrameHeader>,
    eof: bool,
}

impl<S> WsMasked<S> {
    /// `inner` (the upstream's connection after its 101), masked for the run's `secrets`.
    pub fn new(inner: S, secrets: Shared) -> WsMasked<S> {
        WsMasked {
            inner,
            secrets,
            input: BytesMut::new(),
            out: BytesMut::new(),
            left: None,
            current: FrameHeader::default(),
            owed: 0,
            spill: BytesMut::new(),
            held: Hold::default(),
            ctl: Hold::default(),
            fragmented: false,
            first: None,
            eof: false,
        }
    }

    /// Move what `input` holds to `out`, masked, as far as it can go; whether anything moved.
    ///
    /// Errors: `InvalidData` for a header that does not parse or a masked frame.
    fn look(&mut self) -> io::Result<bool> {
        let before = self.out.len();
        let shared = self.secrets.clone();
        let secrets = shared.read().unwrap_or_else(|p| p.into_inner());
        loop {
            match self.left {
                None => {
                    let mut cursor = Cursor::new(&self.input[..]);
                    let parsed = FrameHeader::parse(&mut cursor).map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
                    let Some((header, len)) = parsed else { break };
                    if header.mask.is_some() {
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "a masked frame from the server (RFC 6455 §5.1)"));
                    }
                    if len > i64::MAX as u64 {
                        // RFC 6455 §5.2: a 64-bit length's most significant bit MUST be 0; added to
                        // the bytes carried in (`begin`) it would overflow
                        return Err(io::Error::new(io::ErrorKind::InvalidData, "a frame length with its most significant bit set (RFC 6455 §5.2)"));
                    }
                    let as_came = self.input.split_to(cursor.position() as usize);
                    self.begin(&secrets, header, len, &as_came);
                    self.left = Some(len);
                }
                Some(left) => {
                    let n = left.min(self.input.len() as u64) as usize;
                    let left = left - n as u64;
                    let data = self.input.split_to(n);
                    self.stream(&secrets, &data, left == 0);
                    self.left = (left > 0).then_some(left);
                    if left > 0 {
                        break; // the rest of the payload is still to come
                    }
                }
            }
        }
        Ok(self.out.len() > before)
    }

    /// A frame's header came (`as_came`, its bytes; `len`, its payload's): write the header
    /// its bytes go under, or none yet (see the module).
    fn begin(&mut self, secrets: &Secrets, header: FrameHeader, len: u64, as_came: &[u8]) {
        let continues = header.opcode == OpCode::Data(Data::Continue);
        let data = is_data(&header);
        if header.opcode == OpCode::Control(Control::Close) || (data && self.fragmented && !continues) {
            // A close ends the message; so does a new one (RFC 6455 §5.4 forbids it).
            self.release(secrets);
            self.fragmented = false;
            self.first = None;
        }
        let is_final = header.is_final;
        if !data || (is_final && !self.fragmented) {
            self.current = header;
            self.out.extend_from_slice(as_came); // a control frame, or a message whole
            self.owed = len;
            return;
        }
        if !self.fragmented && !continues {
            self.first = Some(header.clone()); // a message's first fragment
        }
        self.fragmented = true;
        self.current = header;
        let total = self.held.len() as u64 + len;
        if is_final {
            self.owed = total;
            self.frame(true, total);
        } else {
            let longest = secrets.longest_mask() as u64;
            self.owed = total.saturating_sub(longest.saturating_sub(1));
            if self.owed > 0 {
                self.frame(false, self.owed);
            }
        }
    }

    /// `data` of the current frame's payload came, the payload's last when `end`.
    fn stream(&mut self, secrets: &Secrets, data: &[u8], end: bool) {
        let control = !is_data(&self.current);
        let lets_all_go = end && (control || self.current.is_final);
        let hold = if control { &mut self.ctl } else { &mut self.held };
        let (go, _) = hold.take(secrets, data, lets_all_go);
        self.route(&go);
        if !end || lets_all_go {
            if end && self.current.is_final && !control {
                self.fragmented = false;
                self.first = None;
            }
            return;
        }
        // A fragment without FIN ends: what is not carried on goes in a frame of its own.
        if self.owed > 0 {
            // The hold kept more than the header allowed for (the secrets changed since).
            let (go, _) = self.held.take(secrets, &[], true);
            self.route(&go);
        }
        if !self.spill.is_empty() {
            let spill = self.spill.split();
            self.frame(false, spill.len() as u64);
            self.out.extend_from_slice(&spill);
        }
    }

    /// Bytes let go (masked): the header written last owes them, or they wait in `spill`.
    fn route(&mut self, go: &[u8]) {
        let n = self.owed.min(go.len() as u64) as usize;
        self.out.extend_from_slice(&go[..n]);
        self.owed -= n as u64;
        self.spill.extend_from_slice(&go[n..]);
    }

    /// The carried bytes go (masked), in a frame without FIN of the message under way.
    fn release(&mut self, secrets: &Secrets) {
        if self.held.is_empty() {
            return;
        }
        let (go, _) = self.held.take(secrets, &[], true);
        self.frame(false, go.len() as u64);
        self.out.extend_from_slice(&go);
    }

    /// Write the header of a frame of the fragmented message, `len` bytes: the message's
    /// first (its opcode and RSV bits) if none of it was written yet, else a continuation.
    fn frame(&mut self, is_final: bool, len: u64) {
        let mut header = self.first.take().unwrap_or_else(|| {
            let rsv = self.current.opcode == OpCode::Data(Data::Continue); // RSV1 of a first frame is its message's
            FrameHeader {
                is_final,
                rsv1: rsv && self.current.rsv1,
                rsv2: rsv && self.current.rsv2,
                rsv3: rsv && self.current.rsv3,
                opcode: OpCode::Data(Data::Continue),
                mask: None,
            }
        });
        header.is_final = is_final;
        let mut bytes = Vec::with_capacity(header.len(len));
        header.format(len, &mut bytes).expect("a Vec takes any write");
        self.out.extend_from_slice(&bytes);
    }

    /// The upstream closed: the current frame's bytes go, and what was carried (masked: they
    /// began no value the upstream went on to send), then the bytes of a cut header.
    fn flush(&mut self) {
        let shared = self.secrets.clone();
        let secrets = shared.read().unwrap_or_else(|p| p.into_inner());
        if self.left.take().is_some() {
            let control = !is_data(&self.current);
            let hold = if control { &mut self.ctl } else { &mut self.held };
            let (go, _) = hold.take(&secrets, &[], true);
            self.route(&go);
            if !self.spill.is_empty() {
                let spill = self.spill.split();
                self.frame(false, spill.len() as u64);
                self.out.extend_from_slice(&spill);
            }
        }
        self.release(&secrets);
        let rest = self.input.split();
        self.out.extend_from_slice(&rest);
    }
}

/// Whether `header` is a data frame's, which may be part of a fragmented message (text,
/// binary, continuation); a control frame is masked alone. (The parser refuses a reserved
/// opcode: the connection ends.)
fn is_data(header: &FrameHeader) -> bool {
    matches!(header.opcode, OpCode::Data(Data::Text | Data::Binary | Data::Continue))
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
                this.flush();
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
