//! The response's mask: a secret's value that comes back, whole or split across frames, in
//! any of its forms, reaches the agent as as many `*`; the rest passes unchanged.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::{Arc, RwLock};
use std::task::{Context, Poll};

use base64::Engine as _;
use bytes::Bytes;
use http_body_util::BodyExt as _;
use hyper::body::{Body, Frame};
use hyper::header::{HeaderMap, HeaderValue};

use super::{mask, Secrets, Shared};

const PH: &str = "gwsecret_0123456789abcdef0123456789abcdef";
const VALUE: &str = "ghp_real/value+ABCD\"EFGHIJ";

fn shared() -> Shared {
    Arc::new(RwLock::new(Secrets::new(vec![("github".into(), VALUE.into(), Some(PH.into()))]).expect("valid")))
}

/// A body of the given frames.
struct Frames(VecDeque<Bytes>);

impl Body for Frames {
    type Data = Bytes;
    type Error = std::convert::Infallible;
    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
    }
}

/// The body `text` cut in frames of `size` bytes, masked: (what the agent reads, masks counted).
fn masked(text: &[u8], size: usize) -> (Vec<u8>, u64) {
    let body = Frames(text.chunks(size).map(Bytes::copy_from_slice).collect());
    let (body, count) = mask(&shared(), &mut HeaderMap::new(), body);
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let out = rt.block_on(body.collect()).expect("no error").to_bytes().to_vec();
    (out, count.load(Ordering::Relaxed))
}

fn stars(n: usize) -> String {
    "*".repeat(n)
}

#[test]
fn a_value_echoed_in_any_form_and_split_anywhere_comes_back_masked_to_the_same_length() {
    let json = serde_json::to_string(VALUE).expect("json");
    let json = &json[1..json.len() - 1];
    let pct = percent_encoding::utf8_percent_encode(VALUE, super::QUERY).to_string();
    let basic = base64::engine::general_purpose::STANDARD.encode(format!("bot:{VALUE}"));
    for form in [VALUE.to_string(), VALUE.to_ascii_uppercase(), json.to_string(), json.replace('/', "\\/"), pct] {
        let text = format!("{{\"headers\": {{\"Authorization\": \"Bearer {form}\"}}, \"ph\": \"{PH}\"}}");
        for size in [1, 3, 7, 64, text.len()] {
            let (out, n) = masked(text.as_bytes(), size);
            assert_eq!(String::from_utf8(out).expect("utf8"), text.replace(&form, &stars(form.len())), "{form} in frames of {size}");
            assert_eq!(n, 1, "{form} in frames of {size}");
        }
    }
    // Basic credentials echoed: the characters that hold only the value's bits are masked.
    let (out, n) = masked(format!("Basic {basic}").as_bytes(), 5);
    assert!(n >= 1 && out.iter().filter(|b| **b == b'*').count() >= super::MIN_PLACEHOLDER, "{}", String::from_utf8_lossy(&out));
}

#[test]
fn a_response_without_the_value_passes_as_it_came_placeholder_included() {
    let text = format!("ok {PH} ghp_real/value+ABC partial").into_bytes();
    for size in [1, 4, text.len()] {
        assert_eq!(masked(&text, size), (text.clone(), 0));
    }
}

#[test]
fn headers_that_echo_the_value_are_masked() {
    let mut headers = HeaderMap::new();
    headers.insert("x-echo", HeaderValue::from_str(&format!("token={VALUE}")).expect("header"));
    headers.insert("x-other", HeaderValue::from_static("fine"));
    let (_, count) = mask(&shared(), &mut headers, http_body_util::Empty::<Bytes>::new());
    assert_eq!(headers["x-echo"], format!("token={}", stars(VALUE.len())).as_str());
    assert_eq!(headers["x-other"], "fine");
    assert_eq!(count.load(Ordering::Relaxed), 1);
}

#[test]
fn a_short_password_echoed_in_basic_credentials_is_masked() {
    let short = "hunter2pass"; // its base64 forms are 13-14 characters, under MIN_PLACEHOLDER
    let secrets = Secrets::new(vec![("pw".into(), short.into(), Some(PH.into()))]).expect("valid");
    let mut echo = format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(format!("bot:{short}"))).into_bytes();
    assert_eq!(secrets.mask(&mut echo), 1, "{}", String::from_utf8_lossy(&echo));
    let left: Vec<u8> = echo.iter().copied().filter(|b| *b != b'*').collect();
    assert!(left.len() <= "Basic Ym90Om".len(), "{}", String::from_utf8_lossy(&echo));
}

#[test]
fn the_value_split_across_two_frames_at_every_offset_is_masked_and_little_is_held() {
    let text = format!("{}{VALUE}{}", "a".repeat(100), "b".repeat(100));
    for cut in 1..text.len() {
        let body = Frames(VecDeque::from([Bytes::copy_from_slice(&text.as_bytes()[..cut]), Bytes::copy_from_slice(&text.as_bytes()[cut..])]));
        let (mut body, count) = mask(&shared(), &mut HeaderMap::new(), body);
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let out = rt.block_on(async {
            let mut out = Vec::new();
            while let Some(frame) = body.frame().await {
                let data = frame.expect("no error").into_data().expect("data");
                // The hold-back is under the longest form (< 64 bytes here): the first frame
                // out has all of the first frame in but for that.
                assert!(!out.is_empty() || data.len() + 64 >= cut, "cut {cut}: first frame out {}", data.len());
                out.extend_from_slice(&data);
            }
            out
        });
        assert_eq!(String::from_utf8(out).expect("utf8"), text.replace(VALUE, &stars(VALUE.len())), "cut {cut}");
        assert_eq!(count.load(Ordering::Relaxed), 1, "cut {cut}");
    }
}

#[test]
fn a_reason_phrase_that_quotes_the_value_is_masked() {
    let mut ext = hyper::http::Extensions::new();
    ext.insert(hyper::ext::ReasonPhrase::try_from(format!("Bearer {VALUE}").into_bytes()).expect("reason"));
    assert_eq!(super::mask_reason(&shared(), &mut ext), 1);
    assert_eq!(ext.get::<hyper::ext::ReasonPhrase>().expect("kept").as_bytes(), format!("Bearer {}", stars(VALUE.len())).as_bytes());
    let mut plain = hyper::http::Extensions::new();
    assert_eq!(super::mask_reason(&shared(), &mut plain), 0);
}

#[test]
fn the_hold_back_is_the_same_number_of_bytes_whatever_they_are() {
    // What is held is seen by the agent (it comes later): a number of bytes, never a choice
    // of them (tests_oracle.rs: a choice told the agent the value). An event stream's events
    // therefore reach the agent with their last bytes held until the next event comes.
    let secrets = Secrets::new(vec![("github".into(), VALUE.into(), Some(PH.into()))]).expect("valid");
    let k = secrets.longest_mask() - 1;
    assert_eq!(secrets.held_back(3), 3, "fewer than k came: all held");
    assert_eq!(secrets.held_back(500), k);
    let event = format!("data: {}\n\n", "x".repeat(200));
    let events = Frames(VecDeque::from([Bytes::from(event.clone()), Bytes::from(event.clone())]));
    let (mut body, _) = mask(&shared(), &mut HeaderMap::new(), events);
    let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
    let first = rt.block_on(body.frame()).expect("a frame").expect("no error").into_data().expect("data");
    assert_eq!(&first[..], &event.as_bytes()[..event.len() - k], "the first event but its last k bytes");
}

/// Two secrets, the first's value the second's with more after it (two keys of one
/// account, a key and the same key with a suffix), listed in both orders.
fn prefixed(long_first: bool) -> (Shared, &'static str, &'static str) {
    const SHORT: &str = "sk_live_0123456789abcdef";
    const LONG: &str = "sk_live_0123456789abcdefXYZW9876";
    let mut list = vec![("short".to_string(), SHORT.to_string(), None), ("long".to_string(), LONG.to_string(), None)];
    if long_first {
        list.reverse();
    }
    (Arc::new(RwLock::new(Secrets::new(list).expect("valid"))), SHORT, LONG)
}

#[test]
fn a_value_that_begins_with_another_secrets_value_is_masked_whole_in_either_order_and_split_anywhere() {
    for long_first in [true, false] {
        let (secrets, _, long) = prefixed(long_first);
        let text = format!("{}{long}{}", "a".repeat(40), "b".repeat(40));
        for cut in 1..text.len() {
            let body = Frames(VecDeque::from([Bytes::copy_from_slice(&text.as_bytes()[..cut]), Bytes::copy_from_slice(&text.as_bytes()[cut..])]));
            let (body, count) = mask(&secrets, &mut HeaderMap::new(), body);
            let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
            let out = rt.block_on(body.collect()).expect("no error").to_bytes().to_vec();
            assert_eq!(String::from_utf8(out).expect("utf8"), text.replace(long, &stars(long.len())), "long first {long_first}, cut {cut}");
            assert_eq!(count.load(Ordering::Relaxed), 1, "long first {long_first}, cut {cut}");
        }
    }
}

#[test]
fn a_value_that_overlaps_another_secrets_value_is_masked_in_both() {
    // the end of one value is the start of the other: "…XYZ" and "XYZ…" written as "…XYZ…"
    let secrets = Secrets::new(vec![("a".into(), "tok_aaaaaaaaXYZ".into(), None), ("b".into(), "XYZbbbbbbbb_tok".into(), None)]).expect("valid");
    let text = b"[tok_aaaaaaaaXYZbbbbbbbb_tok]";
    let mut whole = text.to_vec();
    assert_eq!(secrets.mask(&mut whole), 2);
    assert_eq!(String::from_utf8(whole).expect("utf8"), format!("[{}]", stars(27)));
    // split anywhere: the first value's end, held as what may begin the second, is starred
    // when it goes
    let secrets: Shared = Arc::new(RwLock::new(secrets));
    for cut in 1..text.len() {
        let body = Frames(VecDeque::from([Bytes::copy_from_slice(&text[..cut]), Bytes::copy_from_slice(&text[cut..])]));
        let (body, count) = mask(&secrets, &mut HeaderMap::new(), body);
        let rt = tokio::runtime::Builder::new_current_thread().build().expect("runtime");
        let out = rt.block_on(body.collect()).expect("no error").to_bytes().to_vec();
        assert_eq!(String::from_utf8(out).expect("utf8"), format!("[{}]", stars(27)), "cut {cut}");
        assert_eq!(count.load(Ordering::Relaxed), 2, "cut {cut}");
    }
}
