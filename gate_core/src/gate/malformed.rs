//! Requests hyper refuses before the gate's service sees them (bad request line, invalid
//! header, head over the size limit). hyper answers those itself; the gate still owes the
//! audit log a record of the refusal (contract 5).

use hyper::StatusCode;

/// A request head hyper could not parse, as the gate records it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Malformed {
    /// Short cause for the audit reason, e.g. "invalid HTTP header parsed".
    pub cause: String,
    /// The status hyper sent (400, 414 or 431); `None` when it sent nothing.
    pub status: Option<u16>,
}

impl Malformed {
    /// The audit `reason`: `protocol: malformed request (<cause>)`.
    pub fn reason(&self) -> String {
        format!("protocol: malformed request ({})", self.cause)
    }
}

/// What a connection's final error says about the client's request.
///
/// Only parse errors are refusals; a clean EOF ends without an error, and a client that
/// disconnects (idle, or mid-head), a header-read timeout, or an I/O error is no decision
/// and gives `None`. The status mirrors hyper 1's `Server::on_error`: 431 for a head over
/// the limit, 414 for a URI over its internal limit, 400 for a bad method, URI, version or
/// header, nothing for an HTTP/2 preface (hyper closes without answering).
pub fn classify(err: &hyper::Error) -> Option<Malformed> {
    if !err.is_parse() {
        return None;
    }
    // hyper's messages are fixed, short ASCII ("invalid URI", "message head is too large").
    let text = err.to_string();
    let (cause, status) = if err.is_parse_version_h2() {
        ("HTTP/2 preface".to_string(), None)
    } else if err.is_parse_too_large() && text == "URI too long" {
        (text, Some(StatusCode::URI_TOO_LONG))
    } else if err.is_parse_too_large() {
        ("header section too large".to_string(), Some(StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE))
    } else if err.is_parse_status() || text.starts_with("internal error") {
        (text, None)
    } else {
        (text, Some(StatusCode::BAD_REQUEST))
    };
    Some(Malformed { cause, status: status.map(|s| s.as_u16()) })
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use http_body_util::Empty;
    use hyper::service::service_fn;
    use hyper::Response;
    use hyper_util::rt::TokioIo;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// Serve one connection with the gate's settings that receives `input` (then EOF if
    /// `close`); return what hyper answered and how the connection ended.
    async fn serve(input: Vec<u8>, close: bool) -> (String, Option<Malformed>) {
        let (mut client, server) = tokio::io::duplex(256 * 1024);
        let service = service_fn(|_req| async { Ok::<_, Infallible>(Response::new(Empty::<bytes::Bytes>::new())) });
        let conn = tokio::spawn(crate::gate::server::builder().serve_connection(TokioIo::new(server), service));
        client.write_all(&input).await.expect("write");
        if close {
            client.shutdown().await.expect("shutdown");
        }
        let mut out = Vec::new();
        let _ = client.read_to_end(&mut out).await;
        let ended = conn.await.expect("join");
        (String::from_utf8_lossy(&out).into_owned(), ended.err().as_ref().and_then(classify))
    }

    #[tokio::test]
    async fn parse_errors_are_refusals_with_the_status_hyper_sent() {
        let big = format!("GET http://a.test/ HTTP/1.1\r\nX-Big: {}\r\n\r\n", "a".repeat(100_000));
        let many: String = (0..200).map(|i| format!("X-{i}: 1\r\n")).collect();
        let table: Vec<(&str, Vec<u8>, &str, Option<u16>)> = vec![
            ("a bad request line", b"NOT HTTP AT ALL\r\n\r\n".to_vec(), "invalid HTTP version parsed", Some(400)),
            ("a bad method", b"G@T http://a.test/ HTTP/1.1\r\n\r\n".to_vec(), "invalid HTTP method parsed", Some(400)),
            (
                "invalid header bytes",
                b"GET http://a.test/ HTTP/1.1\r\nBad Name: x\r\n\r\n".to_vec(),
                "invalid HTTP header parsed",
                Some(400),
            ),
            ("a head over the limit", big.into_bytes(), "header section too large", Some(431)),
            (
                "too many headers",
                format!("GET http://a.test/ HTTP/1.1\r\n{many}\r\n").into_bytes(),
                "header section too large",
                Some(431),
            ),
            ("an HTTP/2 preface", b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n".to_vec(), "HTTP/2 preface", None),
        ];
        for (case, input, cause, status) in table {
            // Whether or not the client half-closes after sending.
            for close in [false, true] {
                let (answer, got) = serve(input.clone(), close).await;
                let want = Malformed { cause: cause.to_string(), status };
                assert_eq!(got.as_ref(), Some(&want), "{case} (close {close}): {answer:?}");
                match status {
                    Some(s) => assert!(answer.starts_with(&format!("HTTP/1.1 {s} ")), "{case}: {answer:?}"),
                    None => assert!(answer.is_empty(), "{case}: {answer:?}"),
                }
                assert_eq!(want.reason(), format!("protocol: malformed request ({cause})"));
            }
        }
    }

    #[tokio::test]
    async fn disconnects_are_not_refusals() {
        let table: &[(&str, &[u8])] = &[
            ("a clean EOF", b""),
            ("an idle client leaving", b"\r\n"),
            ("a client leaving mid-head", b"GET http://a.test/ HTTP/1.1\r\nHost: a"),
            ("a complete request", b"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n"),
        ];
        for (case, input) in table {
            let (_, got) = serve(input.to_vec(), true).await;
            assert_eq!(got, None, "{case}");
        }
    }
}
