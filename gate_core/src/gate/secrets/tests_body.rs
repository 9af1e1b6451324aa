//! The body's screen: a secret split across frames anywhere is found before any of its bytes
//! are passed on; a clean body streams (a frame out per frame in, the held bytes bounded).

use std::pin::Pin;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame};

use super::{InBody, Screened, Secrets, Shared};

const PH: &str = "gwsecret_0123456789abcdef0123456789abcdef";
const VALUE: &str = "ghp_realvalue_ABCDEFGHIJKLMNOP";

fn shared() -> Shared {
    Arc::new(RwLock::new(Secrets::new(vec![("github".into(), VALUE.into(), Some(PH.into()))]).expect("valid")))
}

/// A body of the given frames, counting how many were taken.
struct Frames {
    left: std::collections::VecDeque<Bytes>,
    taken: Arc<std::sync::atomic::AtomicUsize>,
}

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let next = self.left.pop_front();
        if next.is_some() {
            self.taken.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Poll::Ready(next.map(|b| Ok(Frame::data(b))))
    }
}

fn frames(list: Vec<Vec<u8>>) -> (Frames, Arc<std::sync::atomic::AtomicUsize>) {
    let taken = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    (Frames { left: list.into_iter().map(Bytes::from).collect(), taken: taken.clone() }, taken)
}

/// What the screen passed on before it ended, and its error if it found a secret.
async fn drain(body: Frames) -> (Vec<u8>, Option<String>) {
    let mut s = Screened::new(body, shared());
    let mut out = Vec::new();
    while let Some(frame) = s.frame().await {
        match frame {
            Ok(f) => out.extend_from_slice(f.data_ref().map_or(&[][..], |d| &d[..])),
            Err(e) => return (out, e.downcast::<InBody>().ok().map(|f| f.to_string())),
        }
    }
    (out, None)
}

#[tokio::test]
async fn a_secret_split_anywhere_is_found_before_any_of_its_bytes_leave() {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let pct: String = PH.bytes().map(|b| format!("%{b:02X}")).collect();
    let table: Vec<(&str, String, &str)> = vec![
        ("the placeholder", PH.into(), "the placeholder of secret github in the body"),
        ("upper-cased", PH.to_ascii_uppercase(), "the placeholder of secret github in the body"),
        ("percent-encoded, every byte", pct, "the placeholder of secret github in the body"),
        ("in base64 at offset 0", b64(PH), "the placeholder of secret github in the body"),
        ("in base64 at offset 1", b64(&format!("x{PH}")), "the placeholder of secret github in the body"),
        ("in base64 at offset 2", b64(&format!("xy{PH}")), "the placeholder of secret github in the body"),
        ("the value", VALUE.into(), "the value of secret github in the body"),
    ];
    let prefix = vec![b'a'; 5000];
    for (case, needle, want) in &table {
        for cut in 0..=needle.len() {
            let (first, second) = needle.as_bytes().split_at(cut);
            let body = frames(vec![[&prefix[..], first].concat(), [second, b"tail"].concat()]).0;
            let (out, found) = drain(body).await;
            assert_eq!(found.as_deref(), Some(format!("secret_misuse: {want}").as_str()), "{case}, cut at {cut}");
            assert!(out.len() <= prefix.len(), "{case}, cut at {cut}: {} bytes passed on, the secret's among them", out.len());
        }
    }
}

#[tokio::test]
async fn a_clean_body_streams_a_frame_out_per_frame_in_whole_and_unchanged() {
    let chunk: Vec<u8> = (0..65536u32).map(|i| b"abcdefghij%+/="[(i % 14) as usize]).collect();
    let n = 160; // 10 MiB
    let (body, taken) = frames(vec![chunk.clone(); n]);
    let mut s = Screened::new(body, shared());
    let mut out = Vec::with_capacity(n * chunk.len());
    let mut frames_out = 0;
    while let Some(frame) = s.frame().await {
        let frame = frame.unwrap_or_else(|e| panic!("clean body refused: {e}"));
        frames_out += 1;
        // The screen never takes a second frame before passing the first on.
        assert!(taken.load(std::sync::atomic::Ordering::SeqCst) <= frames_out, "frame {frames_out} waited for more");
        out.extend_from_slice(frame.data_ref().map_or(&[][..], |d| &d[..]));
    }
    assert_eq!(out.len(), n * chunk.len());
    assert!(out.chunks(chunk.len()).all(|c| c == &chunk[..]), "the body changed on its way");
}

#[tokio::test]
async fn read_ahead_refuses_a_secret_in_the_first_frame_and_keeps_a_clean_one() {
    let (dirty, _) = frames(vec![format!("{{\"token\": \"{PH}\"}}").into_bytes()]);
    let found = Screened::new(dirty, shared()).read_ahead().await.err().map(|f| f.to_string());
    assert_eq!(found.as_deref(), Some("secret_misuse: the placeholder of secret github in the body"));
    let (clean, _) = frames(vec![b"{\"a\": 1}".to_vec()]);
    let s = Screened::new(clean, shared()).read_ahead().await.unwrap_or_else(|e| panic!("{e}"));
    let got = s.collect().await.unwrap_or_else(|e| panic!("{e}")).to_bytes();
    assert_eq!(&got[..], b"{\"a\": 1}");
}
