//! Attack (h-attack): the mask's hold-back is an oracle for the value. The mask holds back
//! the bytes at the end of what came that are a proper prefix of a masked form
//! (`pending_tail`), until more come or the body/frame ends; which bytes it holds is visible
//! to the agent (they arrive later, in the next chunk or frame). An upstream the agent
//! controls (any host the policy allows, over plain http or inspected https, or a WebSocket)
//! never sees the secret, yet by sending guesses and pausing it learns, byte by byte, the
//! value (ASCII case aside) and its base64 forms: ~95 guesses a byte.
//!
//! These tests play the agent: they see only what the mask lets go now, and they recover the
//! value. They FAIL while the oracle is there (contract 6: a secret the gate injects never
//! exists inside the sandbox).

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

/// The agent's search: every form whose bytes it can extend one guess at a time (a probe held
/// back whole is a proper prefix of a form; one that comes starred is a form whole).
fn recover(oracle: impl Fn(&[u8]) -> Vec<u8>) -> Vec<String> {
    let guesses: Vec<u8> = (0x20u8..0x7f).filter(|b| !b.is_ascii_uppercase()).collect();
    let mut found = Vec::new();
    let mut stack = vec![Vec::<u8>::new()];
    while let Some(prefix) = stack.pop() {
        for &c in &guesses {
            let mut probe = prefix.clone();
            probe.push(c);
            let now = oracle(&probe);
            if now.is_empty() {
                stack.push(probe); // held whole: a proper prefix of a form
            } else if now.iter().all(|&b| b == b'*') && now.len() == probe.len() {
                found.push(String::from_utf8_lossy(&probe).into_owned()); // a form whole
            }
        }
        assert!(found.len() + stack.len() < 1000, "search ran away");
    }
    found
}

#[test]
fn what_the_mask_holds_back_does_not_tell_the_value() {
    let s = secrets();
    let found = recover(|probe| let_go_now(&s, probe));
    assert!(
        !found.iter().any(|f| f.eq_ignore_ascii_case(VALUE)),
        "the agent recovered the value (ASCII case aside) from the hold-back alone: {found:?}"
    );
}

/// The same through main's WebSocket mask: the upstream sends a frame's header, then a guess,
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
    let found = recover(oracle);
    assert!(
        !found.iter().any(|f| f.eq_ignore_ascii_case(VALUE)),
        "the agent recovered the value (ASCII case aside) through the WebSocket mask: {found:?}"
    );
}
