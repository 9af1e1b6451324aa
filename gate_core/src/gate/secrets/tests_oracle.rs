//! The mask's hold-back says nothing of the value (found by an attacker, h-attack): which
//! bytes the mask lets go now and which it holds until more come is visible to the agent
//! (the held ones arrive later). When the mask held back only the bytes that may begin a
//! form (a proper prefix of one at the end of what came), an upstream the agent controls
//! (any host the policy allows, over plain http, inspected https or a WebSocket) that never
//! sees the secret told the agent, by sending its guesses and pausing, the value byte by
//! byte (ASCII case aside) and its base64 forms: ~95 guesses a byte. Contract 6: a secret
//! the gate injects never exists inside the sandbox.
//!
//! These tests play the agent: a guess that begins a form (every masked form of the value,
//! cut anywhere) and a guess of as many bytes that begins none must come out alike.

use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::mask::Hold;
use super::{Secrets, WsMasked};

const PH: &str = "gwsecret_0123456789abcdef0123456789abcdef";
const VALUE: &str = "sk-live-7Qx9pL2mN4vR8tW1";

fn secrets() -> Secrets {
    Secrets::new(vec![("api".into(), VALUE.into(), Some(PH.into()))]).expect("valid")
}

/// What the agent sees of `probe` sent as a chunk the upstream pauses after: the bytes that
/// came now (the rest is held back).
fn let_go_now(s: &Secrets, probe: &[u8]) -> Vec<u8> {
    let mut hold = Hold::default();
    hold.take(s, probe, false).0.to_vec()
}

/// Every masked form's first `n` bytes beside `n` bytes that begin none, for every `n` up
/// to the form's length and a little past it.
fn guesses(s: &Secrets) -> Vec<(Vec<u8>, Vec<u8>)> {
    let forms: Vec<Vec<u8>> = s.list.iter().flat_map(|x| x.masks.iter().cloned()).collect();
    assert!(forms.len() > 1, "the value and its encodings: {}", forms.len());
    let mut pairs = Vec::new();
    for form in &forms {
        for n in 1..=form.len() + 3 {
            let mut right = form[..n.min(form.len())].to_vec();
            right.resize(n, b'.');
            pairs.push((right, vec![b'~'; n]));
        }
    }
    pairs
}

/// What the agent sees of each pair: alike, or the pair that differs.
fn alike(s: &Secrets, oracle: impl Fn(&[u8]) -> Vec<u8>) {
    for (right, wrong) in guesses(s) {
        let (a, b) = (oracle(&right), oracle(&wrong));
        assert_eq!(
            a.len(),
            b.len(),
            "a guess that begins a form ({:?}) came {} bytes, one that begins none {}: the hold-back tells the agent",
            String::from_utf8_lossy(&right),
            a.len(),
            b.len()
        );
    }
}

#[test]
fn what_the_mask_holds_back_does_not_tell_the_value() {
    let s = secrets();
    alike(&s, |probe| let_go_now(&s, probe));
}

/// The same through the WebSocket mask: the upstream sends a frame's header, then a guess,
/// then pauses; the agent reads what comes within the pause.
#[test]
fn what_the_websocket_mask_holds_back_within_a_frame_does_not_tell_the_value() {
    let shared = Arc::new(RwLock::new(secrets()));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    let oracle = |probe: &[u8]| -> Vec<u8> {
        rt.block_on(async {
            let (mut server, gate_side) = tokio::io::duplex(1 << 16);
            let mut masked = WsMasked::new(gate_side, shared.clone());
            // a text frame of 100 bytes; the guess first, the rest after a pause
            server.write_all(&[0x81, 100]).await.expect("write");
            server.write_all(probe).await.expect("write");
            let mut got = Vec::new();
            let mut buf = [0u8; 256];
            while let Ok(Ok(n)) = tokio::time::timeout(Duration::from_millis(5), masked.read(&mut buf)).await {
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            got.split_off(2.min(got.len())) // the header passes as it came
        })
    };
    alike(&secrets(), oracle);
}
