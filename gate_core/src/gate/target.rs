//! Request targets: the host and port an authority names, and whether a `Host` header
//! agrees with them (RFC 9112 §3.2.2: in absolute form the target wins; the gate refuses
//! a request whose `Host` says otherwise rather than silently rewriting it).

use hyper::header::{HeaderMap, HOST};
use hyper::http::uri::{Authority, PathAndQuery};
use hyper::Uri;

use crate::policy::{canonical_host, Host};

/// Port of an absolute-form `http://` target that names none.
pub const HTTP_DEFAULT_PORT: u16 = 80;

/// A port is written but is not a TCP port the gate can dial (1-65535, digits only).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid port {0:?}: expected 1-65535")]
pub struct InvalidPort(pub String);

/// Why a `Host` header does not fit the request target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum HostHeaderError {
    #[error("more than one Host header")]
    Several,
    #[error("an HTTP/1.1 request without a Host header")]
    Missing,
    #[error("Host header disagrees with the request target")]
    Disagrees,
}

/// A port as written after `:`: ASCII digits only, value 1-65535 (leading zeros allowed,
/// as RFC 3986 `port = *DIGIT` permits). `None` for anything else, including "" and "0".
pub fn parse_port(text: &str) -> Option<u16> {
    if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    // Strip leading zeros first so a long run of them cannot overflow the parse.
    let digits = text.trim_start_matches('0');
    match digits.parse::<u16>() {
        Ok(p) if p != 0 => Some(p),
        _ => None,
    }
}

/// The host (as written: `name`, `1.2.3.4`, `[v6]`) and port of an authority, without any
/// `user:password@`. The port is `None` when none is written at all; a written port that
/// is empty, zero, out of range or not digits is an error, never the default.
pub fn split_authority(a: &Authority) -> Result<(&str, Option<u16>), InvalidPort> {
    let host = a.host();
    let hostport = a.as_str().rsplit('@').next().unwrap_or_default();
    let rest = hostport.strip_prefix(host).unwrap_or(hostport);
    match rest {
        "" => Ok((host, None)),
        _ => match rest.strip_prefix(':') {
            Some(text) => parse_port(text).map(|p| (host, Some(p))).ok_or_else(|| InvalidPort(text.to_string())),
            None => Err(InvalidPort(rest.to_string())),
        },
    }
}

/// Check the `Host` header(s) of an absolute-form request against its canonical target.
///
/// No `Host` header is fine in HTTP/1.0 (the gate writes one); an HTTP/1.1 request
/// (`http11`) must have one (RFC 9112 §3.2: a server answers 400 otherwise). It must name
/// the same host and port once canonicalised: case, a trailing dot, IPv6 spelling and an
/// omitted default port (80) do not matter. An unparsable value or userinfo disagrees.
pub fn check_host_header(headers: &HeaderMap, host: &Host, port: u16, http11: bool) -> Result<(), HostHeaderError> {
    let mut values = headers.get_all(HOST).iter();
    let Some(value) = values.next() else {
        return if http11 { Err(HostHeaderError::Missing) } else { Ok(()) };
    };
    if values.next().is_some() {
        return Err(HostHeaderError::Several);
    }
    let agrees = value
        .to_str()
        .ok()
        .filter(|v| !v.contains('@'))
        .and_then(|v| v.parse::<Authority>().ok())
        .and_then(|a| {
            let (h, p) = split_authority(&a).ok()?;
            Some((canonical_host(h).ok()?, p.unwrap_or(HTTP_DEFAULT_PORT)))
        })
        .is_some_and(|(h, p)| h == *host && p == port);
    match agrees {
        true => Ok(()),
        false => Err(HostHeaderError::Disagrees),
    }
}

/// The request target to send upstream (RFC 9112 §3.2): `*` for `OPTIONS *`, else
/// [`origin_form`] (`OPTIONS http://h` is sent as `OPTIONS /`: the http crate reads an empty
/// path as `/`). `None`: the asterisk-form with another method, which §3.2.4 allows for
/// OPTIONS only (refused, not rewritten).
pub fn upstream_target(method: &hyper::Method, uri: &Uri) -> Option<PathAndQuery> {
    match uri.path_and_query().map(PathAndQuery::as_str) {
        Some("*") if method == hyper::Method::OPTIONS => Some(PathAndQuery::from_static("*")),
        Some("*") => None,
        _ => Some(origin_form(uri)),
    }
}

/// Why a request with the asterisk-form and a method other than OPTIONS is refused.
pub const ASTERISK_REASON: &str = "protocol: the asterisk-form target is for OPTIONS only";
pub const ASTERISK_REFUSED: &str = "gatewrap gate: a request target of '*' is for OPTIONS only (RFC 9112 §3.2.4)";

/// The origin-form of a request's target (RFC 9112 §3.2.1): its path and query, an empty
/// path sent as `/` (`http://h`, `http://h?q` and `http://h#f` become `/`, `/?q`, `/`; the
/// http crate drops a fragment while parsing). Always built anew from the text: a
/// `PathAndQuery` the http crate left empty prints `/` but is written as nothing.
pub fn origin_form(uri: &Uri) -> PathAndQuery {
    let s = uri.path_and_query().map_or("/", PathAndQuery::as_str);
    let s = if s.starts_with('/') { s.to_string() } else { format!("/{s}") };
    PathAndQuery::try_from(s).unwrap_or_else(|_| PathAndQuery::from_static("/"))
}

#[cfg(test)]
mod tests {
    use hyper::header::HeaderValue;

    use super::*;

    fn auth(s: &str) -> Authority {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn ports_are_1_to_65535_or_refused() {
        /// (case, authority, host and port, or the invalid port text)
        type Row<'a> = (&'a str, &'a str, Result<(&'a str, Option<u16>), &'a str>);
        let table: &[Row] = &[
            ("no port", "a.test", Ok(("a.test", None))),
            ("a port", "a.test:8080", Ok(("a.test", Some(8080)))),
            ("the largest port", "a.test:65535", Ok(("a.test", Some(65535)))),
            ("leading zeros", "a.test:00080", Ok(("a.test", Some(80)))),
            ("IPv6 and a port", "[::1]:443", Ok(("[::1]", Some(443)))),
            ("IPv6 alone", "[::1]", Ok(("[::1]", None))),
            ("userinfo is dropped", "u:p@a.test:81", Ok(("a.test", Some(81)))),
            ("one past the largest", "a.test:65536", Err("65536")),
            ("wraps around to 80", "a.test:65616", Err("65616")),
            ("far too large", "a.test:99999", Err("99999")),
            ("zero", "a.test:0", Err("0")),
            ("zeros", "a.test:000", Err("000")),
            ("empty", "a.test:", Err("")),
            ("IPv6 and an empty port", "[::1]:", Err("")),
        ];
        for (case, input, want) in table {
            let a = auth(input);
            let got = split_authority(&a);
            let want = want.map_err(|p| InvalidPort(p.to_string()));
            assert_eq!(got, want, "{case}");
        }
        for bad in ["+80", "-1", "8o", " 80", "１"] {
            assert_eq!(parse_port(bad), None, "{bad:?}");
        }
        assert_eq!(parse_port(&format!("{}1", "0".repeat(40))), Some(1));
    }

    fn check(values: &[&str], target: &str, port: u16) -> Result<(), HostHeaderError> {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(HOST, HeaderValue::from_str(v).unwrap_or_else(|e| panic!("{v}: {e}")));
        }
        let host = canonical_host(target).unwrap_or_else(|e| panic!("{target}: {e}"));
        check_host_header(&headers, &host, port, true)
    }

    #[test]
    fn host_headers_must_agree_canonically() {
        use HostHeaderError::{Disagrees, Missing, Several};
        /// (case, Host header values, target host, target port, verdict)
        type Row<'a> = (&'a str, &'a [&'a str], &'a str, u16, Result<(), HostHeaderError>);
        let table: &[Row] = &[
            ("no Host header in HTTP/1.1", &[], "a.test", 80, Err(Missing)),
            ("the same", &["a.test"], "a.test", 80, Ok(())),
            ("case and a trailing dot", &["A.Test."], "a.test", 80, Ok(())),
            ("default port written out", &["a.test:80"], "a.test", 80, Ok(())),
            ("default port left out", &["a.test"], "a.test", 80, Ok(())),
            ("a non-default port", &["a.test:8080"], "a.test", 8080, Ok(())),
            ("IPv6 spelled differently", &["[0:0::1]:8080"], "::1", 8080, Ok(())),
            ("upper-case punycode", &["XN--BCHER-KVA.test"], "bücher.test", 80, Ok(())),
            ("another host", &["b.test"], "a.test", 80, Err(Disagrees)),
            ("a port left out that is not the default", &["a.test"], "a.test", 8080, Err(Disagrees)),
            ("another port", &["a.test:81"], "a.test", 80, Err(Disagrees)),
            ("an invalid port", &["a.test:99999"], "a.test", 80, Err(Disagrees)),
            ("an empty port", &["a.test:"], "a.test", 80, Err(Disagrees)),
            ("empty", &[""], "a.test", 80, Err(Disagrees)),
            ("userinfo", &["u@a.test"], "a.test", 80, Err(Disagrees)),
            ("a path", &["a.test/x"], "a.test", 80, Err(Disagrees)),
            ("an invalid name", &["a..test"], "a.test", 80, Err(Disagrees)),
            ("two that agree", &["a.test", "a.test"], "a.test", 80, Err(Several)),
        ];
        for (case, values, target, port, want) in table {
            assert_eq!(check(values, target, *port), *want, "{case}");
        }
        let host = canonical_host("a.test").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(check_host_header(&HeaderMap::new(), &host, 80, false), Ok(()), "no Host header in HTTP/1.0");
    }

    #[test]
    fn the_asterisk_form_is_for_options_only() {
        use hyper::Method;
        let table: &[(&str, Method, &str, Option<&str>)] = &[
            ("OPTIONS * is kept", Method::OPTIONS, "*", Some("*")),
            ("OPTIONS of a bare absolute URI is /", Method::OPTIONS, "http://h", Some("/")),
            ("OPTIONS of a path is kept", Method::OPTIONS, "http://h/a", Some("/a")),
            ("GET * is refused", Method::GET, "*", None),
            ("GET of a bare absolute URI is /", Method::GET, "http://h", Some("/")),
        ];
        for (case, method, uri, want) in table {
            let uri: Uri = uri.parse().unwrap_or_else(|e| panic!("{case}: {e}"));
            let got = upstream_target(method, &uri).map(|pq| pq.as_str().to_string());
            assert_eq!(got.as_deref(), *want, "{case}");
        }
    }

    #[test]
    fn origin_form_sends_an_empty_path_as_a_slash() {
        let table: &[(&str, &str, &str)] = &[
            ("no path", "http://h", "/"),
            ("a fragment right after the host", "http://h#@evil.test/", "/"),
            ("a query right after the host", "http://h?x=1", "/?x=1"),
            ("a path and query are kept", "http://h/a/b?c", "/a/b?c"),
            ("origin form is kept", "/a?b", "/a?b"),
            ("the asterisk form is a path of its own for other methods", "*", "/*"),
        ];
        for (case, uri, want) in table {
            let uri: Uri = uri.parse().unwrap_or_else(|e| panic!("{case}: {e}"));
            let pq = origin_form(&uri);
            assert_eq!(Uri::from(pq).to_string(), *want, "{case}");
        }
    }
}
