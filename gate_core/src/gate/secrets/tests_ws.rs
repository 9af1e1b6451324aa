//! The WebSocket's mask: a value in a frame's payload reaches the agent masked however the
//! upstream's bytes are cut, the frames' headers pass untouched, and nothing is held past a
//! frame's end (a server waiting for the client's answer is not left waiting).

use std::sync::{Arc, RwLock};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::{Secrets, Shared, WsMasked};

const PH: &str = "gwsecret_0123456789abcdef0123456789abcdef";
const VALUE: &str = "ghp_real/value+ABCD\"EFGHIJ";

fn shared() -> Shared {
    Arc::new(RwLock::new(Secrets::new(vec![("github".into(), VALUE.into(), Some(PH.into()))]).expect("valid")))
}

/// An unmasked text frame (RFC 6455 §5.2) of `payload` (under 126 bytes).
fn frame(payload: &[u8], fin: bool) -> Vec<u8> {
    assert!(payload.len() < 126);
    let mut out = vec![if fin { 0x81 } else { 0x01 }, payload.len() as u8];
    out.extend_from_slice(payload);
    out
}

/// What the agent reads of `wire` sent in pieces cut at `cuts`, each piece read before
/// the next is sent.
fn through(wire: &[u8], cuts: &[usize]) -> std::io::Result<Vec<u8>> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let (mut server, gate_side) = tokio::io::duplex(1 << 16);
        let mut masked = WsMasked::new(gate_side, shared());
        let writer = async move {
            let mut at = 0;
            for &cut in cuts.iter().chain(std::iter::once(&wire.len())) {
                server.write_all(&wire[at..cut]).await.expect("write");
                at = cut;
                for _ in 0..4 {
                    tokio::task::yield_now().await; // the reader takes this piece alone
                }
            }
        };
        let reader = async {
            let mut out = Vec::new();
            masked.read_to_end(&mut out).await.map(|_| out)
        };
        tokio::join!(writer, reader).1
    })
}

#[test]
fn a_value_in_a_frame_cut_anywhere_comes_masked_and_the_header_as_it_was() {
    let payload = format!("{{\"authorization\": \"Bearer {VALUE}\"}}");
    let wire = [frame(payload.as_bytes(), true), frame(b"ping", true)].concat();
    let want = [frame(payload.replace(VALUE, &"*".repeat(VALUE.len())).as_bytes(), true), frame(b"ping", true)].concat();
    for cut in 0..=wire.len() {
        assert_eq!(through(&wire, &[cut]).expect("read"), want, "cut at {cut}");
    }
}

#[test]
fn a_frame_that_ends_with_what_may_begin_a_value_is_not_held_past_its_end() {
    // The server sends "... ghp_r" and waits for the client: the agent must read it now.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let (mut server, gate_side) = tokio::io::duplex(1 << 16);
        let mut masked = WsMasked::new(gate_side, shared());
        let sent = frame(b"your token starts ghp_r", true);
        server.write_all(&sent).await.expect("write");
        let mut got = vec![0u8; sent.len()];
        tokio::time::timeout(std::time::Duration::from_secs(5), masked.read_exact(&mut got)).await
            .expect("the frame whole, without the server's next one").expect("read");
        assert_eq!(got, sent);
    });
}

#[test]
fn a_masked_frame_from_the_server_ends_the_connection() {
    let mut masked_frame = vec![0x81, 0x80 | 4, 1, 2, 3, 4];
    masked_frame.extend(b"ghp_".iter().zip([1u8, 2, 3, 4]).map(|(b, k)| b ^ k));
    let err = through(&masked_frame, &[]).expect_err("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}

#[test]
fn a_value_that_begins_with_another_secrets_value_is_masked_whole_however_cut() {
    const SHORT: &str = "sk_live_0123456789abcdef";
    const LONG: &str = "sk_live_0123456789abcdefXYZW9876";
    let secrets: Shared = Arc::new(RwLock::new(
        Secrets::new(vec![("long".into(), LONG.into(), None), ("short".into(), SHORT.into(), None)]).expect("valid")));
    let wire = frame(format!("[{LONG}]").as_bytes(), true);
    for cut in 3..wire.len() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let got = rt.block_on(async {
            let (mut server, gate_side) = tokio::io::duplex(1 << 16);
            let mut masked = WsMasked::new(gate_side, secrets.clone());
            let mut out = Vec::new();
            server.write_all(&wire[..cut]).await.expect("write");
            let mut buf = [0u8; 256];
            let n = masked.read(&mut buf).await.expect("read");
            out.extend_from_slice(&buf[..n]);
            server.write_all(&wire[cut..]).await.expect("write");
            drop(server);
            masked.read_to_end(&mut out).await.expect("read");
            out
        });
        assert_eq!(got, frame(format!("[{}]", "*".repeat(LONG.len())).as_bytes(), true), "cut {cut}: {}", String::from_utf8_lossy(&got));
    }
}

// A fragmented message (RFC 6455 §5.4): the last bytes of a fragment (held_back)
// are carried into its next fragment, the gate's frames re-encoded around them.

use std::io::Cursor;
use std::time::Duration;

use tungstenite::protocol::frame::coding::{Control, Data, OpCode};
use tungstenite::protocol::frame::FrameHeader;

const TEXT: OpCode = OpCode::Data(Data::Text);
const MORE: OpCode = OpCode::Data(Data::Continue);
const PING: OpCode = OpCode::Control(Control::Ping);
const CLOSE: OpCode = OpCode::Control(Control::Close);

/// An unmasked frame of any length, its header formatted by tungstenite.
fn raw(opcode: OpCode, fin: bool, payload: &[u8]) -> Vec<u8> {
    let header = FrameHeader { is_final: fin, opcode, ..FrameHeader::default() };
    let mut out = Vec::new();
    header.format(payload.len() as u64, &mut out).expect("format");
    out.extend_from_slice(payload);
    out
}

/// `payload`'s fragments cut at `cuts`: a text frame without FIN, then continuation frames,
/// the last with FIN.
fn fragments(payload: &[u8], cuts: &[usize]) -> Vec<Vec<u8>> {
    let bounds: Vec<usize> = std::iter::once(0).chain(cuts.iter().copied()).chain(std::iter::once(payload.len())).collect();
    let last = bounds.len() - 2;
    bounds.windows(2).enumerate()
        .map(|(k, w)| raw(if k == 0 { TEXT } else { MORE }, k == last, &payload[w[0]..w[1]]))
        .collect()
}

/// The frames of `wire` parsed back by tungstenite: (header, payload). Panics on bytes that
/// are no whole frame (a header whose length does not match the bytes that follow it).
fn parse(wire: &[u8]) -> Vec<(FrameHeader, Vec<u8>)> {
    let mut cursor = Cursor::new(wire);
    let mut out = Vec::new();
    while (cursor.position() as usize) < wire.len() {
        let (header, len) = FrameHeader::parse(&mut cursor).expect("a header").expect("a whole header");
        let at = cursor.position() as usize;
        let end = at + usize::try_from(len).expect("length");
        assert!(end <= wire.len(), "a frame of {len} bytes with {} left", wire.len() - at);
        assert!(header.mask.is_none());
        out.push((header, wire[at..end].to_vec()));
        cursor.set_position(end as u64);
    }
    out
}

/// What a client makes of `wire` (RFC 6455 §5.4): each message joined from its fragments,
/// each control frame as it came, in order, as (opcode, payload); asserting that the
/// fragments' opcodes and FIN bits are as §5.4 has them, and (with `whole`) that every
/// message ended.
fn messages(wire: &[u8], whole: bool) -> Vec<(OpCode, Vec<u8>)> {
    let mut out = Vec::new();
    let mut open: Option<(OpCode, Vec<u8>)> = None;
    for (header, payload) in parse(wire) {
        match header.opcode {
            OpCode::Control(_) => {
                assert!(header.is_final, "a fragmented control frame");
                out.push((header.opcode, payload));
            }
            MORE => {
                let (_, message) = open.as_mut().expect("a continuation frame in a message");
                message.extend_from_slice(&payload);
                assert!(!header.rsv1, "RSV1 on a continuation frame");
            }
            opcode => {
                assert!(open.is_none(), "a new message before the last one's end");
                open = Some((opcode, payload));
            }
        }
        if header.is_final && !matches!(header.opcode, OpCode::Control(_)) {
            out.push(open.take().expect("a message"));
        }
    }
    if let Some(unfinished) = open {
        assert!(!whole, "a message without its end");
        out.push(unfinished);
    }
    out
}

fn starred(text: &str) -> Vec<u8> {
    text.replace(VALUE, &"*".repeat(VALUE.len())).into_bytes()
}

fn echo() -> String {
    format!("{{\"authorization\": \"Bearer {VALUE}\"}}")
}

#[test]
fn a_value_split_at_any_cut_across_two_fragments_comes_masked() {
    let payload = echo();
    for cut in 0..=payload.len() {
        let wire = fragments(payload.as_bytes(), &[cut]).concat();
        let first = wire.len() - (payload.len() - cut) - 2;
        // All at once, each fragment read before the next is sent, and the second cut in two.
        for reads in [vec![], vec![first], vec![first, (first + 3).min(wire.len())]] {
            let got = through(&wire, &reads).expect("read");
            assert_eq!(messages(&got, true), vec![(TEXT, starred(&payload))], "cut {cut}, reads {reads:?}: {}", String::from_utf8_lossy(&got));
        }
    }
}

#[test]
fn the_fragments_cut_anywhere_on_the_wire_come_masked() {
    let payload = echo();
    let at = payload.find(VALUE).expect("value") + 9;
    let wire = fragments(payload.as_bytes(), &[at]).concat();
    for cut in 0..=wire.len() {
        let got = through(&wire, &[cut]).expect("read");
        assert_eq!(messages(&got, true), vec![(TEXT, starred(&payload))], "wire cut {cut}");
    }
}

#[test]
fn a_value_split_across_three_fragments_comes_masked() {
    let payload = echo();
    let start = payload.find(VALUE).expect("value");
    for i in start..=start + VALUE.len() {
        for j in i..=start + VALUE.len() {
            let wire = fragments(payload.as_bytes(), &[i, j]).concat();
            let got = through(&wire, &[]).expect("read");
            assert_eq!(messages(&got, true), vec![(TEXT, starred(&payload))], "cuts {i}, {j}");
        }
    }
}

#[test]
fn a_ping_between_fragments_passes_as_it_came_and_the_value_comes_masked() {
    let payload = echo();
    let start = payload.find(VALUE).expect("value");
    let ping = raw(PING, true, b"are you there");
    for cut in start..=start + VALUE.len() {
        let [first, second] = <[Vec<u8>; 2]>::try_from(fragments(payload.as_bytes(), &[cut])).expect("two");
        let wire = [first.clone(), ping.clone(), second].concat();
        for reads in [vec![], vec![first.len(), first.len() + ping.len()]] {
            let got = through(&wire, &reads).expect("read");
            assert_eq!(messages(&got, true), vec![(PING, b"are you there".to_vec()), (TEXT, starred(&payload))], "cut {cut}");
            let frames = parse(&got);
            let at = frames.iter().position(|(h, _)| h.opcode == PING).expect("the ping");
            // (the message's first frame too, when the whole first fragment was held back)
            assert!(frames[at + 1..].iter().any(|(h, _)| h.is_final && (h.opcode == MORE || h.opcode == TEXT)),
                    "the ping comes before the message's end");
            assert!(got.windows(ping.len()).any(|w| w == ping), "the ping's bytes as they came");
        }
    }
}

/// The bytes `masked` gives within `wait` (all of them if the stream ends sooner).
async fn read_for<R: tokio::io::AsyncRead + Unpin>(masked: &mut R, wait: Duration) -> Vec<u8> {
    let mut got = Vec::new();
    let mut buf = [0u8; 1024];
    while let Ok(Ok(n)) = tokio::time::timeout(wait, masked.read(&mut buf)).await {
        if n == 0 {
            break;
        }
        got.extend_from_slice(&buf[..n]);
    }
    got
}

#[test]
fn a_fragments_last_bytes_are_held_and_the_fin_fragment_lets_all_go() {
    // The server sends 200 bytes and "ghp_r" without FIN, then the last fragment, empty, and
    // waits: the fragment's last k bytes (the longest form − 1, whatever they are) wait.
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let k = shared().read().expect("secrets").longest_mask() - 1;
        let (mut server, gate_side) = tokio::io::duplex(1 << 16);
        let mut masked = WsMasked::new(gate_side, shared());
        let sent = [b"x".repeat(200), b"ghp_r".to_vec()].concat();
        server.write_all(&raw(TEXT, false, &sent)).await.expect("write");
        let got = read_for(&mut masked, Duration::from_millis(200)).await;
        assert_eq!(messages(&got, false), vec![(TEXT, sent[..sent.len() - k].to_vec())], "held: the last {k}");
        assert!(parse(&got).iter().all(|(h, _)| !h.is_final));
        server.write_all(&raw(MORE, true, b"")).await.expect("write");
        let rest = read_for(&mut masked, Duration::from_millis(200)).await;
        let frames = parse(&rest);
        assert_eq!(frames.len(), 1, "one frame: {frames:?}");
        assert_eq!((frames[0].0.opcode, frames[0].0.is_final, frames[0].1.as_slice()), (MORE, true, &sent[sent.len() - k..]));
    });
}

#[test]
fn a_fin_fragment_that_ends_with_what_may_begin_a_value_is_not_held_past_its_end() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let (mut server, gate_side) = tokio::io::duplex(1 << 16);
        let mut masked = WsMasked::new(gate_side, shared());
        server.write_all(&fragments(b"your token starts ghp_r", &[5, 12]).concat()).await.expect("write");
        let got = read_for(&mut masked, Duration::from_millis(300)).await;
        assert_eq!(messages(&got, true), vec![(TEXT, b"your token starts ghp_r".to_vec())]);
    });
}

#[test]
fn re_encoded_headers_state_their_lengths_in_each_length_format() {
    // 70 000 bytes then half the value (a 64-bit length), 300 bytes (16-bit), 7 bytes (7-bit).
    let payload = format!("{}{VALUE}{}tail.", "x".repeat(70_000), "y".repeat(290));
    let cuts = [70_000 + 10, 70_000 + 10 + 300];
    let wire = fragments(payload.as_bytes(), &cuts).concat();
    let reads: Vec<usize> = (1..wire.len() / 4096).map(|k| k * 4096).collect();
    let got = through(&wire, &reads).expect("read");
    assert_eq!(messages(&got, true), vec![(TEXT, starred(&payload))]);
    let frames = parse(&got);
    assert!(frames.iter().any(|(_, p)| p.len() > 65_535) && frames.iter().any(|(_, p)| (126..=65_535).contains(&p.len())));
    let (last, rest) = frames.split_last().expect("frames");
    assert!(last.0.is_final && rest.iter().all(|(h, _)| !h.is_final));
    assert_eq!(frames[0].0.opcode, TEXT);
    assert!(rest[1..].iter().all(|(h, _)| h.opcode == MORE) && last.0.opcode == MORE);
}

#[test]
fn a_first_fragment_held_whole_goes_with_its_opcode_and_rsv1() {
    // A binary message whose first fragment (RSV1 set, as permessage-deflate's) is all held.
    let first = FrameHeader { is_final: false, rsv1: true, opcode: OpCode::Data(Data::Binary), ..FrameHeader::default() };
    let mut wire = Vec::new();
    first.format(4, &mut wire).expect("format");
    wire.extend_from_slice(b"ghp_");
    wire.extend(raw(MORE, true, b"not a token"));
    let got = through(&wire, &[]).expect("read");
    let frames = parse(&got);
    assert_eq!(frames.len(), 1, "{frames:?}");
    let (header, payload) = &frames[0];
    assert_eq!((header.opcode, header.rsv1, header.is_final), (OpCode::Data(Data::Binary), true, true));
    assert_eq!(payload, b"ghp_not a token");
}

#[test]
fn a_close_between_fragments_lets_the_held_bytes_go_first_and_passes_as_it_came() {
    let close = raw(CLOSE, true, &[[0x03, 0xe8].as_slice(), b"bye"].concat());
    let wire = [raw(TEXT, false, b"your token starts ghp_re"), close.clone()].concat();
    let got = through(&wire, &[]).expect("read");
    // (`messages` lists a message without its end last)
    assert_eq!(messages(&got, false), vec![(CLOSE, close[2..].to_vec()), (TEXT, b"your token starts ghp_re".to_vec())]);
    assert!(got.ends_with(&close));
}

#[test]
fn the_end_of_the_stream_between_fragments_lets_the_held_bytes_go() {
    let got = through(&raw(TEXT, false, b"your token starts ghp_re"), &[]).expect("read");
    assert_eq!(messages(&got, false), vec![(TEXT, b"your token starts ghp_re".to_vec())]);
}

#[test]
fn a_value_in_a_close_between_fragments_comes_masked() {
    let payload = echo();
    let at = payload.find(VALUE).expect("value") + 5;
    let reason = format!("bad token {VALUE}");
    let close = raw(CLOSE, true, &[[0x03, 0xe8].as_slice(), reason.as_bytes()].concat());
    let wire = [raw(TEXT, false, &payload.as_bytes()[..at]), close].concat();
    let got = through(&wire, &[]).expect("read");
    let mut masked_close = vec![0x03, 0xe8];
    masked_close.extend(starred(&reason));
    assert_eq!(messages(&got, false), vec![(CLOSE, masked_close), (TEXT, payload.as_bytes()[..at].to_vec())]);
}

#[test]
fn messages_after_a_fragmented_one_pass_as_they_came() {
    let payload = echo();
    let at = payload.find(VALUE).expect("value") + 7;
    let whole = raw(TEXT, true, b"next message");
    let wire = [fragments(payload.as_bytes(), &[at]).concat(), whole.clone()].concat();
    let got = through(&wire, &[]).expect("read");
    assert_eq!(messages(&got, true), vec![(TEXT, starred(&payload)), (TEXT, b"next message".to_vec())]);
    assert!(got.ends_with(&whole));
}

#[test]
fn a_frame_of_a_reserved_opcode_between_fragments_ends_the_connection() {
    // tungstenite's parser refuses opcodes 3-7 and 11-15 (RFC 6455 §5.2: the client fails
    // the connection), as it does a header that does not parse.
    let payload = echo();
    let at = payload.find(VALUE).expect("value") + 4;
    let odd = raw(OpCode::Data(Data::Reserved(3)), false, b"odd ghp_r");
    let [first, second] = <[Vec<u8>; 2]>::try_from(fragments(payload.as_bytes(), &[at])).expect("two");
    let err = through(&[first, odd, second].concat(), &[]).expect_err("refused");
    assert_eq!(err.kind(), std::io::ErrorKind::InvalidData);
}

// --- attacks (h-attack-ws) ---------------------------------------------------------------

/// A continuation frame whose 64-bit length has its top bit set (RFC 6455 §5.2: "the most
/// significant bit MUST be 0"), after a fragment whose end the mask holds back: the carried
/// bytes plus that length overflow u64 in `begin` (`self.held.len() as u64 + len`). A debug
/// build panics; a release build (no overflow checks) wraps, writes a FIN header of a few
/// bytes, then routes every later byte of the frame to `spill`, which grows without bound
/// (never sent: the frame never ends): memory of the gate (the shared daemon's, every run's
/// gate) taken by an upstream. Either such a header ends the connection (InvalidData, as a
/// masked frame does), or the bytes that came go on, but the gate holds no more than a form.
#[test]
fn a_length_with_its_top_bit_set_after_held_bytes_neither_panics_nor_piles_up() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        rt.block_on(async {
            let (mut server, gate_side) = tokio::io::duplex(1 << 20);
            let mut masked = WsMasked::new(gate_side, shared());
            server.write_all(&raw(TEXT, false, b"your token starts ghp_r")).await.expect("write");
            let _ = read_for(&mut masked, Duration::from_millis(100)).await;
            // FIN + continuation, 127: an 8-byte length, u64::MAX
            let mut wire = vec![0x80, 127];
            wire.extend_from_slice(&u64::MAX.to_be_bytes());
            let sent = 256 * 1024;
            wire.extend(std::iter::repeat_n(b'x', sent));
            let writer = async {
                let _ = server.write_all(&wire).await;
                server
            };
            let reader = async {
                let mut got = Vec::new();
                let mut buf = [0u8; 4096];
                loop {
                    match tokio::time::timeout(Duration::from_millis(300), masked.read(&mut buf)).await {
                        Ok(Ok(0)) | Err(_) => break Ok(got),
                        Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
                        Ok(Err(e)) => break Err(e),
                    }
                }
            };
            let (_server, got) = tokio::join!(writer, reader);
            match got {
                Err(e) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidData),
                Ok(got) => assert!(got.len() + 4096 >= sent, "the agent read {} of {sent} bytes: the rest piles up in the gate", got.len()),
            }
        })
    }));
    assert!(outcome.is_ok(), "WsMasked panicked on a frame length with its top bit set");
}
