//! HTTP/1.1 responses written into a byte vector, sans-IO.
//!
//! Every response says how long it is (`Content-Length`), whether the connection stays
//! open (`Connection`), when it was made (`Date`) and that it must not be cached
//! (`Cache-Control: no-store`: MCP answers are per caller). Header names are compile-time
//! constants; a value carrying CR, LF or NUL is dropped rather than written, so nothing can
//! split a response.

use std::time::SystemTime;

use super::http_date::imf_fixdate;

/// What the loop writes to the connection, and whether to close it after.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HttpResponse {
    pub status: u16,
    pub bytes: Vec<u8>,
    /// Close the connection once `bytes` are written.
    pub close: bool,
}

/// The interim answer to `Expect: 100-continue`.
pub const CONTINUE_100: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

/// JSON, as every MCP answer and refusal body.
pub const JSON: &str = "application/json";
/// Prometheus text exposition format.
pub const PROMETHEUS_TEXT: &str = "text/plain; version=0.0.4; charset=utf-8";

pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        202 => "Accepted",
        204 => "No Content",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        406 => "Not Acceptable",
        408 => "Request Timeout",
        411 => "Length Required",
        413 => "Content Too Large",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        421 => "Misdirected Request",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        503 => "Service Unavailable",
        505 => "HTTP Version Not Supported",
        _ => "Unknown",
    }
}

/// Statuses that never carry a body, and so no `Content-Length` (RFC 9110 §8.6).
fn bodiless(status: u16) -> bool {
    (100..200).contains(&status) || status == 204 || status == 304
}

/// A response being put together.
#[derive(Debug, Clone)]
pub struct ResponseBuilder {
    status: u16,
    headers: Vec<(&'static str, String)>,
    keep_alive: bool,
    date: Option<SystemTime>,
}

impl ResponseBuilder {
    pub fn new(status: u16) -> ResponseBuilder {
        ResponseBuilder {
            status,
            headers: Vec::new(),
            keep_alive: true,
            date: None,
        }
    }

    /// Add a header; a value containing CR, LF or NUL is dropped (and would be a bug).
    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> ResponseBuilder {
        let value = value.into();
        debug_assert!(
            !value.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)),
            "header {name} value with a line break"
        );
        if !value.bytes().any(|b| matches!(b, b'\r' | b'\n' | 0)) {
            self.headers.push((name, value));
        }
        self
    }

    /// Whether the connection stays open after this response.
    pub fn keep_alive(mut self, keep_alive: bool) -> ResponseBuilder {
        self.keep_alive = keep_alive;
        self
    }

    /// The `Date` to send (default: now).
    pub fn date(mut self, date: SystemTime) -> ResponseBuilder {
        self.date = Some(date);
        self
    }

    /// With a body of `content_type`.
    pub fn body(self, content_type: &'static str, body: &[u8]) -> HttpResponse {
        self.header("Content-Type", content_type).finish(body)
    }

    /// Without a body (`Content-Length: 0` where the status allows a length).
    pub fn empty(self) -> HttpResponse {
        self.finish(b"")
    }

    /// The head of a streamed response of `content_type`: `Transfer-Encoding: chunked`,
    /// no `Content-Length`; the body follows in chunks (see `sse_writer.rs`).
    pub fn chunked_head(self, content_type: &'static str) -> Vec<u8> {
        self.stream_head(content_type, true)
    }

    /// The head of a response whose body ends with the connection (HTTP/1.0 streaming).
    pub fn open_head(self, content_type: &'static str) -> Vec<u8> {
        self.keep_alive(false).stream_head(content_type, false)
    }

    fn stream_head(self, content_type: &'static str, chunked: bool) -> Vec<u8> {
        let date = imf_fixdate(self.date.unwrap_or_else(SystemTime::now));
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(self.status.to_string().as_bytes());
        out.push(b' ');
        out.extend_from_slice(reason_phrase(self.status).as_bytes());
        out.extend_from_slice(b"\r\n");
        let mut put = |name: &str, value: &str| {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        };
        put("Date", &date);
        put("Cache-Control", "no-store");
        put("X-Content-Type-Options", "nosniff");
        put("Content-Type", content_type);
        for (name, value) in &self.headers {
            put(name, value);
        }
        if chunked {
            put("Transfer-Encoding", "chunked");
        }
        put(
            "Connection",
            if self.keep_alive {
                "keep-alive"
            } else {
                "close"
            },
        );
        out.extend_from_slice(b"\r\n");
        out
    }

    fn finish(self, body: &[u8]) -> HttpResponse {
        let date = imf_fixdate(self.date.unwrap_or_else(SystemTime::now));
        let mut out = Vec::with_capacity(160 + body.len() + self.headers.len() * 32);
        out.extend_from_slice(b"HTTP/1.1 ");
        out.extend_from_slice(self.status.to_string().as_bytes());
        out.push(b' ');
        out.extend_from_slice(reason_phrase(self.status).as_bytes());
        out.extend_from_slice(b"\r\n");
        let mut put = |name: &str, value: &str| {
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        };
        put("Date", &date);
        put("Cache-Control", "no-store");
        put("X-Content-Type-Options", "nosniff");
        for (name, value) in &self.headers {
            put(name, value);
        }
        let body = if bodiless(self.status) {
            &b""[..]
        } else {
            put("Content-Length", &body.len().to_string());
            body
        };
        put(
            "Connection",
            if self.keep_alive {
                "keep-alive"
            } else {
                "close"
            },
        );
        out.extend_from_slice(b"\r\n");
        out.extend_from_slice(body);
        HttpResponse {
            status: self.status,
            bytes: out,
            close: !self.keep_alive,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A response read back: status, lowercased headers, body.
    pub struct Parsed {
        pub status: u16,
        pub headers: Vec<(String, String)>,
        pub body: Vec<u8>,
    }

    impl Parsed {
        pub fn header(&self, name: &str) -> Option<&str> {
            self.headers
                .iter()
                .find(|(n, _)| n == name)
                .map(|(_, v)| v.as_str())
        }

        pub fn json(&self) -> serde_json::Value {
            serde_json::from_slice(&self.body).unwrap()
        }
    }

    /// Parse a response with httparse, checking that its length is what it says.
    pub fn parse(bytes: &[u8]) -> Parsed {
        let mut slots = [httparse::EMPTY_HEADER; 32];
        let mut resp = httparse::Response::new(&mut slots);
        let httparse::Status::Complete(head) = resp.parse(bytes).unwrap() else {
            panic!("partial response")
        };
        let headers: Vec<(String, String)> = resp
            .headers
            .iter()
            .map(|h| {
                (
                    h.name.to_ascii_lowercase(),
                    String::from_utf8(h.value.to_vec()).unwrap(),
                )
            })
            .collect();
        let body = bytes[head..].to_vec();
        if let Some((_, len)) = headers.iter().find(|(n, _)| n == "content-length") {
            assert_eq!(len.parse::<usize>().unwrap(), body.len());
        }
        Parsed {
            status: resp.code.unwrap(),
            headers,
            body,
        }
    }

    #[test]
    fn writes_a_json_response() {
        let r = ResponseBuilder::new(200)
            .header("Mcp-Session-Id", "abc")
            .body(JSON, b"{}");
        assert!(!r.close);
        let p = parse(&r.bytes);
        assert_eq!(p.status, 200);
        assert_eq!(p.header("content-type"), Some(JSON));
        assert_eq!(p.header("mcp-session-id"), Some("abc"));
        assert_eq!(p.header("connection"), Some("keep-alive"));
        assert_eq!(p.header("cache-control"), Some("no-store"));
        assert!(p.header("date").unwrap().ends_with(" GMT"));
        assert_eq!(p.body, b"{}");
    }

    #[test]
    fn closing_and_bodiless() {
        let r = ResponseBuilder::new(204).keep_alive(false).empty();
        assert!(r.close);
        let p = parse(&r.bytes);
        assert_eq!(p.header("content-length"), None);
        assert_eq!(p.header("connection"), Some("close"));
        let p = parse(&ResponseBuilder::new(202).empty().bytes);
        assert_eq!(p.header("content-length"), Some("0"));
    }

    #[test]
    #[cfg(not(debug_assertions))]
    fn injection_is_dropped() {
        let r = ResponseBuilder::new(200)
            .header("X", "a\r\nSet-Cookie: x")
            .empty();
        assert!(parse(&r.bytes).header("set-cookie").is_none());
    }
}
