//! Secrets in the gate (issue 20): the run's resolved values and placeholders, the screen of
//! every request for them, and the injection of a value where its rule says.
//!
//! Two steps on each request path (plain http in `forward.rs`, inspected https in
//! `inspect/inner.rs`):
//! 1. [`screen`], after the decision and before any hold or record of the admission: the
//!    agent's own credentials in the injected place (every `Authorization`, any case, all
//!    duplicates; the named header; every occurrence of the query parameter) are removed and
//!    a marker `[secret NAME]` put there (what an approval shows); then every header and the
//!    target (as sent and percent-decoded once, Basic credentials base64-decoded) are
//!    searched for any secret's placeholder or value (ASCII case ignored). Found: 403, the
//!    record denied with reason `secret_misuse: ...` and `secret` naming it, never the value.
//!    A secret with `budget = N` is carried by N requests of a run at most: the next one
//!    that would carry it is refused (403, reason `budget: secret NAME ...`), counted with
//!    the rules' budgets (`policy::budget`, a window as long as the run).
//! 2. [`inject`], just before the request goes upstream: the marker's place gets the value.
//!
//! The value is in no record, no answer and no approval: only in the upstream request.

mod body;
mod mask;
mod ws;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_body;
#[cfg(test)]
mod tests_mask;
#[cfg(test)]
mod tests_ws;
#[cfg(test)]
mod tests_oracle;

pub use body::{BoxError, InBody, Screened};
pub use mask::{mask, mask_reason, Masked};
pub use ws::WsMasked;

use std::sync::{Arc, RwLock};

use base64::Engine as _;
use hyper::header::{HeaderMap, HeaderName, HeaderValue, AUTHORIZATION};
use hyper::http::uri::PathAndQuery;
use hyper::{Response, StatusCode};

use crate::audit::GateRecord;
use crate::policy::budget::REASON_BUDGET;
use crate::policy::{Budget, Inject, Place, Spend};

use super::admit::Admission;
use super::respond::Body;
use super::Ctx;

/// Reason prefix of a request refused because it carries a secret outside its rule.
pub const REASON_MISUSE: &str = "secret_misuse";

/// One resolved secret of a run.
pub struct Secret {
    name: String,
    value: String,
    /// What the screen looks for (see [`needles`]): `(placeholder|value, bytes)`.
    needles: Vec<(&'static str, Vec<u8>)>,
    /// What a response is masked for (see `mask`): the value's forms.
    masks: Vec<Vec<u8>>,
}

/// A run's resolved secrets (few: a linear search).
#[derive(Default)]
pub struct Secrets {
    list: Vec<Secret>,
    /// The bytes any needle starts with, both ASCII cases (a bit per byte value): the search
    /// compares needles only where one of these is, so a body costs about a lookup per byte.
    starts: [u64; 4],
    /// The same for the masks of responses.
    mask_starts: [u64; 4],
}

/// The run's secrets as the gate shares them: replaced whole on rotation ([`Secrets::new`]).
pub type Shared = Arc<RwLock<Secrets>>;

/// A secret's value or placeholder found where no rule injects it.
#[derive(Debug, PartialEq, Eq)]
pub struct Misuse {
    pub secret: String,
    /// `placeholder` | `value`.
    pub what: &'static str,
    /// `header x-foo`, `target`, `basic credentials in header authorization`, ...
    pub seen: String,
}

/// Shortest placeholder accepted: it must not occur by chance.
pub const MIN_PLACEHOLDER: usize = 16;

impl Secrets {
    /// The run's secrets from `(name, value, placeholder)`.
    ///
    /// Errors: a name twice, an empty value or one that cannot be a header value (visible
    /// ASCII, space and tab only: RFC 9110 §5.5), a placeholder shorter than
    /// [`MIN_PLACEHOLDER`] or not alphanumeric. Messages name the secret, never the value.
    pub fn new(list: Vec<(String, String, Option<String>)>) -> Result<Secrets, String> {
        let mut out = Secrets::default();
        for (name, value, placeholder) in list {
            if out.list.iter().any(|s| s.name == name) {
                return Err(format!("secret {name:?} given twice"));
            }
            if value.is_empty() || !value.bytes().all(|b| b == b'\t' || (0x20..0x7f).contains(&b)) {
                return Err(format!("secret {name:?}: its value is empty or holds characters a header cannot carry (only visible ASCII, space and tab)"));
            }
            if let Some(p) = &placeholder {
                if p.len() < MIN_PLACEHOLDER || !p.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
                    return Err(format!("secret {name:?}: placeholder must be at least {MIN_PLACEHOLDER} letters, digits or _"));
                }
            }
            let needles = needles(placeholder.as_deref(), &value);
            let masks = mask::masks(&value, base64_forms(value.as_bytes()));
            for (starts, firsts) in [(&mut out.starts, needles.iter().filter_map(|(_, n)| n.first()).collect::<Vec<_>>()),
                                     (&mut out.mask_starts, masks.iter().filter_map(|n| n.first()).collect())] {
                for b in firsts {
                    for c in [b.to_ascii_lowercase(), b.to_ascii_uppercase()] {
                        starts[usize::from(c >> 6)] |= 1 << (c & 63);
                    }
                }
            }
            out.list.push(Secret { name, value, needles, masks });
        }
        Ok(out)
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    fn value(&self, name: &str) -> Option<&str> {
        self.list.iter().find(|s| s.name == name).map(|s| s.value.as_str())
    }

    /// The first secret one of whose [`needles`] occurs in `hay` (ASCII case ignored).
    /// The first place in `hay` that starts a needle wins.
    pub fn found_in(&self, hay: &[u8]) -> Option<(&str, &'static str)> {
        let starts = |b: u8| self.starts[usize::from(b >> 6)] & (1 << (b & 63)) != 0;
        hay.iter().enumerate().filter(|(_, b)| starts(**b)).find_map(|(i, _)| {
            let rest = &hay[i..];
            self.list.iter().find_map(|s| {
                s.needles
                    .iter()
                    .find(|(_, n)| rest.len() >= n.len() && rest[..n.len()].eq_ignore_ascii_case(n))
                    .map(|(what, _)| (s.name.as_str(), *what))
            })
        })
    }

    /// The longest needle of any secret (bytes; 0 without secrets).
    pub fn longest(&self) -> usize {
        self.list.iter().flat_map(|s| s.needles.iter().map(|(_, n)| n.len())).max().unwrap_or(0)
    }

    /// [`Secrets::found_in`] on `hay` as it is and percent-decoded once.
    fn found_in_decoded(&self, hay: &[u8]) -> Option<(&str, &'static str)> {
        self.found_in(hay).or_else(|| {
            if !hay.contains(&b'%') {
                return None;
            }
            let decoded: Vec<u8> = percent_encoding::percent_decode(hay).collect();
            (decoded.len() != hay.len()).then(|| self.found_in(&decoded)).flatten()
        })
    }

    /// Where in `headers` and `target` a secret is (see the module's step 1).
    pub fn misuse(&self, headers: &HeaderMap, target: &str) -> Option<Misuse> {
        let found = |(name, what): (&str, &'static str), seen: String| Misuse { secret: name.to_string(), what, seen };
        if let Some(f) = self.found_in_decoded(target.as_bytes()) {
            return Some(found(f, "target".into()));
        }
        for (name, value) in headers {
            if let Some(f) = basic_credentials(value).and_then(|c| self.found_in(&c)) {
                return Some(found(f, format!("basic credentials in header {name}")));
            }
            if let Some(f) = self.found_in(name.as_str().as_bytes()).or_else(|| self.found_in_decoded(value.as_bytes())) {
                return Some(found(f, format!("header {name}")));
            }
        }
        None
    }
}

/// What the screen looks for of one secret (headers, target, body: one definition), each
/// compared ASCII case ignored, as sent and percent-decoded once: the placeholder and the
/// value themselves, and the base64 of each (RFC 4648 §4 and its URL-safe alphabet, §5) at
/// each of the three offsets it can start at in a longer base64 text: the characters that
/// hold only the secret's bits, when there are at least [`MIN_PLACEHOLDER`] of them (a
/// shorter run would match by chance).
fn needles(placeholder: Option<&str>, value: &str) -> Vec<(&'static str, Vec<u8>)> {
    let mut out = Vec::new();
    for (what, text) in placeholder.map(|p| ("placeholder", p)).into_iter().chain([("value", value)]) {
        out.push((what, text.as_bytes().to_vec()));
        for form in base64_forms(text.as_bytes()) {
            if form.len() >= MIN_PLACEHOLDER && !out.iter().any(|(_, n)| n.eq_ignore_ascii_case(&form)) {
                out.push((what, form));
            }
        }
    }
    out
}

/// The base64 characters of `text` that do not depend on its neighbours, for `text` starting
/// 0, 1 or 2 bytes into a 3-byte group (standard and URL-safe alphabets).
fn base64_forms(text: &[u8]) -> Vec<Vec<u8>> {
    use base64::engine::general_purpose::{STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let mut out = Vec::new();
    for k in 0..3usize {
        let mut padded = vec![0u8; k];
        padded.extend_from_slice(text);
        padded.extend_from_slice(&[0, 0]);
        // Character i holds bits [6i, 6i+6); the text's are [8k, 8k + 8 len).
        let (first, end) = ((8 * k).div_ceil(6), (8 * (k + text.len())) / 6);
        for engine in [&STANDARD_NO_PAD, &URL_SAFE_NO_PAD] {
            let enc = engine.encode(&padded);
            if let Some(chars) = enc.as_bytes().get(first..end) {
                if !out.contains(&chars.to_vec()) {
                    out.push(chars.to_vec());
                }
            }
        }
    }
    out
}

/// The decoded `user:password` of a `Basic` credentials value (RFC 7617), if it is one.
fn basic_credentials(value: &HeaderValue) -> Option<Vec<u8>> {
    let v = value.to_str().ok()?.trim();
    let (scheme, b64) = v.split_once(' ')?;
    scheme.eq_ignore_ascii_case("basic").then(|| base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()).flatten()
}

/// The marker that stands where `inject` puts its value until [`inject`] (an approval shows it).
pub fn marker(inject: &Inject) -> String {
    format!("[secret {}]", inject.secret)
}

/// Characters escaped in a query parameter's name and value (the WHATWG URL standard's
/// component set: `&`, `=`, `+`, `%` and the like never pass through).
const QUERY: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC.remove(b'-').remove(b'_').remove(b'.').remove(b'~');

/// `pq` with every parameter named `key` (compared percent-decoded) replaced by one
/// `key=VALUE` at the end, `value` percent-encoded.
fn set_query(pq: &str, key: &str, value: &str) -> String {
    let (path, query) = pq.split_once('?').unwrap_or((pq, ""));
    let mut kept: Vec<&str> = query
        .split('&')
        .filter(|p| !p.is_empty())
        .filter(|p| {
            let name = p.split('=').next().unwrap_or_default();
            percent_encoding::percent_decode_str(&name.replace('+', " ")).decode_utf8_lossy() != key
        })
        .collect();
    let pair = format!("{}={}", percent_encoding::utf8_percent_encode(key, QUERY), percent_encoding::utf8_percent_encode(value, QUERY));
    kept.push(&pair);
    format!("{path}?{}", kept.join("&"))
}

/// The user of the agent's own Basic credentials (the first `Authorization`), else "".
fn agent_user(headers: &HeaderMap) -> String {
    let creds = headers.get(AUTHORIZATION).and_then(basic_credentials).unwrap_or_default();
    let text = String::from_utf8_lossy(&creds);
    text.split_once(':').map_or(String::new(), |(u, _)| u.to_string())
}

/// Put `text` in the injected place of `headers`/`pq` (the agent's own taken out first).
/// `user`: for Basic, the user to keep (carried in the marker as `user=` percent-encoded).
fn place(inject: &Inject, headers: &mut HeaderMap, pq: &str, text: &str) -> Option<String> {
    let set = |headers: &mut HeaderMap, name: HeaderName, v: String| {
        headers.remove(&name);
        if let Ok(mut hv) = HeaderValue::from_str(&v) {
            hv.set_sensitive(true);
            headers.insert(name, hv);
        }
    };
    match &inject.place {
        Place::Bearer => set(headers, AUTHORIZATION, format!("Bearer {text}")),
        Place::Basic => set(headers, AUTHORIZATION, format!("Basic {text}")),
        Place::Header(h) => {
            if let Ok(name) = HeaderName::from_bytes(h.as_bytes()) {
                set(headers, name, text.to_string());
            }
        }
        Place::Query(q) => return Some(set_query(pq, q, text)),
    }
    None
}

/// Step 1 of the module: strip the injected place and mark it, then look for secrets
/// anywhere else. Returns the request target to use from here (its query changed when the
/// rule injects one), or the answer already recorded (403 `secret_misuse`, or 503 when the
/// rule's secret was not resolved for this run).
#[allow(clippy::result_large_err)]
pub fn screen(ctx: &Ctx, adm: &Admission, rec: &mut GateRecord, headers: &mut HeaderMap, pq: PathAndQuery)
    -> Result<PathAndQuery, Response<Body>> {
    let inject = adm.decision.inject.as_deref();
    // Before the secrets' lock: a reload takes the policy's, then the secrets'.
    let budget = inject.and_then(|i| {
        let policy = ctx.policy.read().unwrap_or_else(|p| p.into_inner());
        policy.secrets.iter().find(|d| d.name == i.secret).and_then(|d| d.budget)
    });
    let secrets = ctx.secrets.read().unwrap_or_else(|p| p.into_inner());
    if secrets.is_empty() && inject.is_none() {
        return Ok(pq);
    }
    let mut pq = pq;
    if let Some(i) = inject {
        if secrets.value(&i.secret).is_none() {
            drop(secrets);
            let reason = format!("{REASON_MISUSE}: secret {} was not resolved for this run", i.secret);
            let body = format!("gatewrap gate: rule {} injects secret {}, which this run has no value for\n",
                adm.decision.rule.as_deref().unwrap_or("-"), i.secret);
            rec.secret = Some(i.secret.clone());
            return Err(ctx.refuse_with(rec.clone(), StatusCode::SERVICE_UNAVAILABLE, reason, body));
        }
        if let Some(count) = budget {
            let per_run = Budget { count, per: std::time::Duration::MAX };
            if let Spend::Over { .. } = ctx.budgets.spend(&format!("[[secret]] {}", i.secret), &per_run, std::time::Instant::now()) {
                drop(secrets);
                let reason = format!("{REASON_BUDGET}: secret {} carried in {count} requests of this run, its budget", i.secret);
                let body = format!(
                    "gatewrap gate: secret {} may be carried in {count} requests per run (`budget` on its [[secret]]) and \
                     this run has used them; raise the budget or start a new run\n",
                    i.secret
                );
                rec.secret = Some(i.secret.clone());
                return Err(ctx.refuse_with(rec.clone(), StatusCode::FORBIDDEN, reason, body));
            }
        }
        let mark = match i.place {
            Place::Basic => {
                let user = agent_user(headers);
                format!("{} user={}", marker(i), percent_encoding::utf8_percent_encode(&user, QUERY))
            }
            _ => marker(i),
        };
        if let Some(q) = place(i, headers, pq.as_str(), &mark) {
            pq = q.parse().unwrap_or(pq);
        }
        rec.secret = Some(i.secret.clone());
    }
    let Some(m) = secrets.misuse(headers, pq.as_str()) else { return Ok(pq) };
    drop(secrets);
    Err(refuse_misuse(ctx, adm, rec, m))
}

/// The text of a misuse's reason (`secret_misuse: ...`) and of the gate's 403 about it.
pub fn misuse_texts(m: &Misuse, hp: &str) -> (String, String) {
    let reason = format!("{REASON_MISUSE}: the {} of secret {} in the {} to {hp}", m.what, m.secret, m.seen);
    let body = format!(
        "gatewrap gate: the {} of secret {} was sent in the {} to {hp}; the gate puts a secret only where a \
         rule injects it (`inject`), so nothing else may carry it\n",
        m.what, m.secret, m.seen
    );
    (reason, body)
}

/// Refuse (403, recorded `secret_misuse`, `secret` naming it) a request that carries `m`.
fn refuse_misuse(ctx: &Ctx, adm: &Admission, rec: &mut GateRecord, m: Misuse) -> Response<Body> {
    let (reason, body) = misuse_texts(&m, &adm.host.with_port(adm.port));
    rec.secret = Some(m.secret);
    rec.would = None;
    ctx.refuse_with(rec.clone(), StatusCode::FORBIDDEN, reason, body)
}

/// Step 1 for the body, after [`screen`] and before any hold or dial: `body` screened as it
/// streams ([`Screened`]), its first bytes read ahead so that a secret in them is refused
/// (403, recorded) before anything is sent. Without secrets in the run, `body` passes as it is.
#[allow(clippy::result_large_err)]
pub async fn screen_body<B>(ctx: &Ctx, adm: &Admission, rec: &mut GateRecord, body: B) -> Result<Screened<B>, Response<Body>>
where
    B: hyper::body::Body<Data = bytes::Bytes> + Unpin,
    B::Error: Into<BoxError>,
{
    let screened = Screened::new(body, ctx.secrets.clone());
    if ctx.secrets.read().unwrap_or_else(|p| p.into_inner()).is_empty() {
        return Ok(screened);
    }
    screened.read_ahead().await.map_err(|InBody(m)| refuse_misuse(ctx, adm, rec, m))
}

/// Step 2 of the module: the value in the place [`screen`] marked (`parts`' headers and
/// target), `Accept-Encoding: identity` (RFC 9110 §12.5.3) and no `Sec-WebSocket-Extensions`
/// (RFC 6455 §9.1: no `permessage-deflate`, RFC 7692), so that the response or the WebSocket's
/// messages come uncompressed and the mask (`mask`, `WsMasked`) sees any echo of the value.
/// Nothing when the decision injects nothing.
pub fn inject(ctx: &Ctx, adm: &Admission, parts: &mut hyper::http::request::Parts) {
    let Some(i) = adm.decision.inject.as_deref() else { return };
    let secrets = ctx.secrets.read().unwrap_or_else(|p| p.into_inner());
    let Some(value) = secrets.value(&i.secret) else { return };
    parts.headers.insert(hyper::header::ACCEPT_ENCODING, HeaderValue::from_static("identity"));
    parts.headers.remove(hyper::header::SEC_WEBSOCKET_EXTENSIONS);
    let text = match i.place {
        Place::Basic => {
            let user = parts.headers.get(AUTHORIZATION).and_then(|v| v.to_str().ok()).and_then(|v| v.rsplit_once(" user=")).map(|(_, u)| u);
            let user = percent_encoding::percent_decode_str(user.unwrap_or_default()).decode_utf8_lossy().into_owned();
            base64::engine::general_purpose::STANDARD.encode(format!("{user}:{value}"))
        }
        _ => value.to_string(),
    };
    let pq = parts.uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    if let Some(q) = place(i, &mut parts.headers, &pq, &text) {
        if let Ok(uri) = q.parse() {
            parts.uri = uri;
        }
    }
}

/// A destination name (`where_`: `CONNECT host`, `DNS name`) that holds a secret's
/// placeholder or value: `Some(reason)` (`secret_misuse: ...`), with `rec.secret` set.
pub fn in_name(ctx: &Ctx, rec: &mut GateRecord, name: &str, where_: &str) -> Option<String> {
    let secrets = ctx.secrets.read().unwrap_or_else(|p| p.into_inner());
    let (secret, what) = secrets.found_in(name.as_bytes())?;
    rec.secret = Some(secret.to_string());
    Some(format!("{REASON_MISUSE}: the {what} of secret {secret} in the {where_}"))
}

/// Refuse (403, recorded) a CONNECT whose host holds a secret's placeholder or value.
#[allow(clippy::result_large_err)]
pub fn screen_connect(ctx: &Ctx, rec: &mut GateRecord, host: &str) -> Result<(), Response<Body>> {
    match in_name(ctx, rec, host, "CONNECT host") {
        None => Ok(()),
        Some(reason) => {
            let body = format!("gatewrap gate: {reason}; a secret goes only where a rule injects it\n");
            rec.would = None;
            Err(ctx.refuse_with(rec.clone(), StatusCode::FORBIDDEN, reason, body))
        }
    }
}
