//! Credentials in the headers of a held request: redacted in what is stored and shown, kept
//! in the gate's memory for the send. Which headers a human may edit.
//!
//! No standard list of credential headers exists (RFC 9110 §11 names Authorization and
//! Proxy-Authorization, RFC 6265 Cookie and Set-Cookie); the names below are those plus the
//! API-key and token headers HTTP client loggers commonly redact (`x-api-key`, `api-key`,
//! `x-auth-token`, ...), and any name containing a credential word (`key` included:
//! `x-functions-key`, `dd-application-key`, `x-cmc_pro_api_key`): redacting too much only
//! hides a value from the reviewer, too little would store a secret.

/// What a redacted value is replaced with.
pub const REDACTED: &str = "[redacted]";

const CREDENTIAL_NAMES: [&str; 10] = [
    "authorization",
    "proxy-authorization",
    "cookie",
    "set-cookie",
    "x-api-key",
    "api-key",
    "x-auth-token",
    "x-amz-security-token",
    "x-goog-api-key",
    "ocp-apim-subscription-key",
];

const CREDENTIAL_WORDS: [&str; 10] =
    ["auth", "token", "secret", "passw", "key", "session", "cookie", "credential", "jwt", "bearer"];

/// Names holding a credential word that carry none: the request's own key (shown, fixed)
/// and the WebSocket handshake nonce (RFC 6455 §4.1).
const NOT_CREDENTIALS: [&str; 2] = ["idempotency-key", "sec-websocket-key"];

/// Headers a human may not change in an edit, besides credentials: they describe the hop or
/// the framing (RFC 9110 §7.6.1, RFC 9112 §6), or the destination (`host`, which is the
/// URL's, and the URL is not editable).
const FIXED_NAMES: [&str; 12] = [
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "proxy-connection",
    "keep-alive",
    "te",
    "trailer",
    "upgrade",
    "proxy-authenticate",
    "expect",
    "idempotency-key",
];

/// Whether header `name` (any case) carries a credential.
pub fn is_credential(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    CREDENTIAL_NAMES.contains(&n.as_str()) || (!NOT_CREDENTIALS.contains(&n.as_str()) && CREDENTIAL_WORDS.iter().any(|w| n.contains(w)))
}

/// Whether header `name` may be changed, added or removed in an edit.
pub fn is_editable(name: &str) -> bool {
    !is_credential(name) && !FIXED_NAMES.contains(&name.to_ascii_lowercase().as_str())
}

/// `headers` with every credential value replaced by [`REDACTED`] (names and order kept),
/// but the gate's own marker of an injected secret (`[secret NAME]`, see `gate::secrets`),
/// which holds no value and tells the human where the secret will go.
pub fn redact(headers: &[(String, String)]) -> Vec<(String, String)> {
    headers
        .iter()
        .map(|(n, v)| (n.clone(), if is_credential(n) && !is_secret_marker(v) { REDACTED.to_string() } else { v.clone() }))
        .collect()
}

/// `[secret NAME]`, after `Bearer `/`Basic ` and before ` user=USER` (percent-encoded): the
/// gate's marker (`gate::secrets::marker`), nothing else.
fn is_secret_marker(v: &str) -> bool {
    let v = v.strip_prefix("Bearer ").or_else(|| v.strip_prefix("Basic ")).unwrap_or(v);
    let Some(rest) = v.strip_prefix("[secret ") else { return false };
    let Some((name, tail)) = rest.split_once(']') else { return false };
    let user_ok = tail.is_empty()
        || tail.strip_prefix(" user=").is_some_and(|u| u.bytes().all(|b| b.is_ascii_alphanumeric() || b"%-_.~".contains(&b)));
    !name.is_empty() && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-') && user_ok
}

/// The headers of `list` that an edit may not touch, lower-cased names, in order.
pub fn fixed_part(list: &[(String, String)]) -> Vec<(String, String)> {
    list.iter().filter(|(n, _)| !is_editable(n)).map(|(n, v)| (n.to_ascii_lowercase(), v.clone())).collect()
}

/// Check an edit of `current` (stored, redacted) into `proposed`: the fixed part must be the
/// same. `Err(text)` names the first header changed that may not be.
pub fn check_edit(current: &[(String, String)], proposed: &[(String, String)]) -> Result<(), String> {
    for (n, v) in proposed {
        if n.is_empty() || !n.bytes().all(|b| b.is_ascii_graphic() && b != b':') {
            return Err(format!("invalid header name {n:?}"));
        }
        if v.bytes().any(|b| b == b'\r' || b == b'\n' || b == 0) {
            return Err(format!("header {n}: a value may not hold CR, LF or NUL"));
        }
    }
    let (old, new) = (fixed_part(current), fixed_part(proposed));
    if old != new {
        let changed = new
            .iter()
            .find(|h| !old.contains(h))
            .or_else(|| old.iter().find(|h| !new.contains(h)))
            .map(|(n, _)| n.clone())
            .unwrap_or_else(|| "order".to_string());
        return Err(format!(
            "header {changed} is not editable (credentials, Host, hop-by-hop headers, Content-Length and Idempotency-Key stay as the agent sent them)"
        ));
    }
    Ok(())
}
