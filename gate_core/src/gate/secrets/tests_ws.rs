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
