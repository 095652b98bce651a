//! HTTP/1.1 requests read incrementally from a connection's byte buffer, sans-IO.
//!
//! The loop appends what it reads to a buffer and calls [`RequestReader::poll`]. A head is
//! handed out on its own first ([`Progress::Head`]), before a byte of its body is wanted, so
//! the door can judge it (route, token, limits) and refuse it without reading the body or
//! sending `100 Continue`; only after [`RequestReader::proceed`] does the reader wait for the
//! body. A ready [`Request`] says where its body lies in the buffer and how many bytes it
//! used, so the loop can answer it, drain those bytes and poll again for a pipelined next
//! request. Heads are parsed by `httparse` once their blank line has arrived (found by
//! scanning only new bytes, so a client trickling bytes costs linear time). Bodies are
//! framed by `Content-Length` only.
//!
//! Every [`ParseError`] means the framing of the connection can no longer be trusted: the
//! loop sends [`ParseError::status`] and closes.

use std::ops::Range;

use super::config::HttpConfig;

/// The limits a request must fit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    pub max_head_bytes: usize,
    pub max_headers: usize,
    pub max_body_bytes: usize,
}

impl From<&HttpConfig> for RequestLimits {
    fn from(c: &HttpConfig) -> Self {
        RequestLimits {
            max_head_bytes: c.max_head_bytes,
            max_headers: c.max_headers,
            max_body_bytes: c.max_body_bytes,
        }
    }
}

impl Default for RequestLimits {
    fn default() -> Self {
        RequestLimits::from(&HttpConfig::default())
    }
}

/// One header: the name lowercased, the value with surrounding whitespace removed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub name: String,
    pub value: Vec<u8>,
}

/// A whole request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub method: String,
    /// The request target as sent (origin-form: starts with `/`, may carry a query).
    pub target: String,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub minor_version: u8,
    pub headers: Vec<Header>,
    /// Where the body lies in the buffer given to [`RequestReader::poll`].
    pub body: Range<usize>,
    /// Bytes of the buffer this request occupies (head and body); drain them once handled.
    pub consumed: usize,
    /// Whether the connection may carry another request after the answer to this one.
    pub keep_alive: bool,
    /// The client sent `Expect: 100-continue` (HTTP/1.1) and waits for `100 Continue`
    /// before its body.
    pub expects_continue: bool,
    /// The `Content-Length` it declared, when over `max_body_bytes`: the head is still
    /// handed out for judging (who asks is judged before how much: a client without a
    /// valid token must not learn the limit), its body is never read (`body` is empty),
    /// and a head that passes must be refused with 413 ([`RequestReader::poll`] fails so
    /// if it proceeds all the same).
    pub body_over_limit: Option<u64>,
}

impl Request {
    /// The target without its query.
    pub fn path(&self) -> &str {
        self.target.split('?').next().unwrap_or("")
    }

    /// The first header called `name` (lowercase).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|h| h.name == name)
            .map(|h| h.value.as_slice())
    }

    /// Every header called `name` (lowercase), in order.
    pub fn headers_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a [u8]> + 'a {
        self.headers
            .iter()
            .filter(move |h| h.name == name)
            .map(|h| h.value.as_slice())
    }
}

/// A request that cannot be read; send `status` and close the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ParseError {
    pub status: u16,
    pub reason: &'static str,
}

/// The reason of a 413.
pub const TOO_LARGE: &str = "request body too large";

fn fail<T>(status: u16, reason: &'static str) -> Result<T, ParseError> {
    Err(ParseError { status, reason })
}

/// What [`RequestReader::poll`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Progress {
    /// Not a whole head, or (after [`RequestReader::proceed`]) not a whole body yet.
    NeedMore,
    /// A head has arrived (its body may or may not have): judge it, then either call
    /// [`RequestReader::proceed`] to wait for the body, or refuse it. Until one of them,
    /// `poll` hands out the same head again.
    Head(Request),
    /// The whole request, body included.
    Ready(Request),
}

#[derive(Debug)]
enum Reading {
    /// Looking for the end of the next head.
    Head,
    /// A head handed out and not yet judged.
    Judging(Request),
    /// A judged head whose body is still arriving.
    Body(Request),
}

/// Reads requests one after another from one connection's buffer.
#[derive(Debug)]
pub struct RequestReader {
    limits: RequestLimits,
    reading: Reading,
    /// Bytes already searched for the end of the head.
    scanned: usize,
}

impl RequestReader {
    pub fn new(limits: RequestLimits) -> RequestReader {
        RequestReader {
            limits,
            reading: Reading::Head,
            scanned: 0,
        }
    }

    /// Whether a request has started but not finished (for the slow-client timers): the
    /// buffer is non-empty or a head awaits its body.
    pub fn mid_request(&self, buffered: usize) -> bool {
        !matches!(self.reading, Reading::Head) || buffered > 0
    }

    /// The head being judged or whose body is arriving, if any.
    pub fn current(&self) -> Option<&Request> {
        match &self.reading {
            Reading::Head => None,
            Reading::Judging(r) | Reading::Body(r) => Some(r),
        }
    }

    /// Whether a judged head waits for its body.
    pub fn in_body(&self) -> bool {
        matches!(self.reading, Reading::Body(_))
    }

    /// The head handed out by [`Progress::Head`] was accepted: wait for its body.
    pub fn proceed(&mut self) {
        if let Reading::Judging(r) = std::mem::replace(&mut self.reading, Reading::Head) {
            self.reading = Reading::Body(r);
        }
    }

    /// Forget the request being read (it was refused, or answered and drained): the next
    /// poll looks for a new head at the start of the buffer.
    pub fn reset(&mut self) {
        self.reading = Reading::Head;
        self.scanned = 0;
    }

    /// Look at the buffer, whose start is the start of the next request.
    pub fn poll(&mut self, buf: &[u8]) -> Result<Progress, ParseError> {
        match &self.reading {
            Reading::Judging(r) => return Ok(Progress::Head(r.clone())),
            Reading::Body(r) if r.body_over_limit.is_some() => return fail(413, TOO_LARGE),
            Reading::Body(r) => {
                if buf.len() < r.consumed {
                    return Ok(Progress::NeedMore);
                }
                let Reading::Body(r) = std::mem::replace(&mut self.reading, Reading::Head) else {
                    unreachable!("matched above")
                };
                self.scanned = 0;
                return Ok(Progress::Ready(r));
            }
            Reading::Head => {}
        }
        if !head_may_be_complete(buf, self.scanned) {
            self.scanned = buf.len();
            if buf.len() > self.limits.max_head_bytes {
                return fail(431, "request head too large");
            }
            return Ok(Progress::NeedMore);
        }
        let request = match parse_head(buf, &self.limits)? {
            Some(parsed) => parsed,
            None => {
                // A blank line before the request line, which httparse skips.
                self.scanned = buf.len();
                if buf.len() > self.limits.max_head_bytes {
                    return fail(431, "request head too large");
                }
                return Ok(Progress::NeedMore);
            }
        };
        self.scanned = 0;
        self.reading = Reading::Judging(request.clone());
        Ok(Progress::Head(request))
    }

    /// Poll, proceeding past every head at once (no judging): for callers that only parse.
    pub fn poll_whole(&mut self, buf: &[u8]) -> Result<Progress, ParseError> {
        match self.poll(buf)? {
            Progress::Head(r) if r.body_over_limit.is_some() => fail(413, TOO_LARGE),
            Progress::Head(_) => {
                self.proceed();
                self.poll(buf)
            }
            other => Ok(other),
        }
    }
}

/// Whether a line feed followed by an empty line appears in `buf` at or after `from`
/// (allowing for a terminator split across reads).
fn head_may_be_complete(buf: &[u8], from: usize) -> bool {
    let start = from.saturating_sub(2);
    let tail = &buf[start.min(buf.len())..];
    tail.windows(2).any(|w| w == b"\n\n") || tail.windows(3).any(|w| w == b"\n\r\n")
}

/// Parse a head once its end may be in the buffer. `Ok(None)`: httparse needs more.
fn parse_head(buf: &[u8], limits: &RequestLimits) -> Result<Option<Request>, ParseError> {
    let mut slots = vec![httparse::EMPTY_HEADER; limits.max_headers];
    let mut parsed = httparse::Request::new(&mut slots);
    let head_len = match parsed.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return fail(431, "too many headers"),
        Err(httparse::Error::Version) => return fail(505, "only HTTP/1.0 and HTTP/1.1 are served"),
        Err(_) => return fail(400, "malformed request head"),
    };
    if head_len > limits.max_head_bytes {
        return fail(431, "request head too large");
    }
    let (Some(method), Some(target), Some(minor_version)) =
        (parsed.method, parsed.path, parsed.version)
    else {
        return fail(400, "malformed request line");
    };
    if !target.starts_with('/') {
        // Absolute-form (proxies) and asterisk-form are not served by an origin server here.
        return fail(400, "the request target must be a path");
    }
    let headers: Vec<Header> = parsed
        .headers
        .iter()
        .map(|h| Header {
            name: h.name.to_ascii_lowercase(),
            value: trim_ows(h.value).to_vec(),
        })
        .collect();
    let count = |name: &str| headers.iter().filter(|h| h.name == name).count();
    let values = |name: &'static str| {
        headers
            .iter()
            .filter(move |h| h.name == name)
            .map(|h| h.value.as_slice())
    };

    match (minor_version, count("host")) {
        (1, 1) | (0, 0) | (0, 1) => {}
        (1, 0) => return fail(400, "HTTP/1.1 requires a Host header"),
        _ => return fail(400, "more than one Host header"),
    }

    let has_content_length = count("content-length") > 0;
    if count("transfer-encoding") > 0 {
        // Both framings at once is how request smuggling starts: refuse outright.
        if has_content_length {
            return fail(400, "Transfer-Encoding and Content-Length together");
        }
        if minor_version == 0 {
            return fail(400, "Transfer-Encoding in an HTTP/1.0 request");
        }
        let last_coding = values("transfer-encoding")
            .flat_map(|v| v.split(|&b| b == b','))
            .map(trim_ows)
            .rfind(|c| !c.is_empty())
            .unwrap_or(b"");
        if last_coding.eq_ignore_ascii_case(b"chunked") {
            return fail(
                411,
                "chunked request bodies are not accepted; send Content-Length",
            );
        }
        return fail(501, "unsupported Transfer-Encoding");
    }

    let mut body_over_limit = None;
    let body_len = if has_content_length {
        let mut length: Option<u64> = None;
        for item in values("content-length").flat_map(|v| v.split(|&b| b == b',')) {
            let item = trim_ows(item);
            if item.is_empty() || item.len() > 19 || !item.iter().all(u8::is_ascii_digit) {
                return fail(400, "invalid Content-Length");
            }
            let n: u64 = std::str::from_utf8(item)
                .ok()
                .and_then(|s| s.parse().ok())
                .ok_or(ParseError {
                    status: 400,
                    reason: "invalid Content-Length",
                })?;
            if length.is_some_and(|l| l != n) {
                return fail(400, "conflicting Content-Length values");
            }
            length = Some(n);
        }
        let n = length.unwrap_or(0);
        if n > limits.max_body_bytes as u64 {
            body_over_limit = Some(n);
            0
        } else {
            // Bounded by max_body_bytes, a usize.
            n as usize
        }
    } else {
        0
    };

    let mut expects_continue = false;
    if minor_version == 1 {
        match values("expect").next() {
            None => {}
            Some(v) if v.eq_ignore_ascii_case(b"100-continue") && count("expect") == 1 => {
                expects_continue = true;
            }
            Some(_) => return fail(417, "unsupported Expect"),
        }
    }

    let connection_has = |token: &[u8]| {
        values("connection")
            .flat_map(|v| v.split(|&b| b == b','))
            .any(|t| trim_ows(t).eq_ignore_ascii_case(token))
    };
    let keep_alive = if minor_version == 1 {
        !connection_has(b"close")
    } else {
        connection_has(b"keep-alive") && !connection_has(b"close")
    };

    Ok(Some(Request {
        method: method.to_owned(),
        target: target.to_owned(),
        minor_version,
        headers,
        body: head_len..head_len + body_len,
        consumed: head_len + body_len,
        // A body not read leaves the stream unframed: the connection ends after the answer.
        keep_alive: keep_alive && body_over_limit.is_none(),
        expects_continue,
        body_over_limit,
    }))
}

/// Without leading and trailing spaces and tabs (RFC 9110 optional whitespace).
pub fn trim_ows(value: &[u8]) -> &[u8] {
    let is_ows = |b: &u8| *b == b' ' || *b == b'\t';
    let start = value.iter().position(|b| !is_ows(b)).unwrap_or(value.len());
    let end = value
        .iter()
        .rposition(|b| !is_ows(b))
        .map_or(start, |i| i + 1);
    &value[start..end]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reader() -> RequestReader {
        RequestReader::new(RequestLimits::default())
    }

    fn ready(buf: &[u8]) -> Request {
        match reader().poll_whole(buf).unwrap() {
            Progress::Ready(r) => r,
            other => panic!("{other:?}"),
        }
    }

    fn error(buf: &[u8]) -> u16 {
        reader().poll_whole(buf).unwrap_err().status
    }

    const POST: &[u8] = b"POST /mcp?x=1 HTTP/1.1\r\nHost: 127.0.0.1:9210\r\nContent-Type: application/json\r\nX-Pad:   padded value  \r\nContent-Length: 7\r\n\r\n{\"a\":1}";

    #[test]
    fn whole_post() {
        let r = ready(POST);
        assert_eq!(r.method, "POST");
        assert_eq!(r.path(), "/mcp");
        assert_eq!(r.target, "/mcp?x=1");
        assert_eq!(&POST[r.body.clone()], b"{\"a\":1}");
        assert_eq!(r.consumed, POST.len());
        assert!(r.keep_alive);
        assert_eq!(r.header("content-type").unwrap(), b"application/json");
        assert_eq!(r.header("x-pad").unwrap(), b"padded value");
        assert_eq!(r.minor_version, 1);
    }

    #[test]
    fn byte_by_byte_is_the_same() {
        let mut rd = reader();
        for end in 0..POST.len() {
            assert_eq!(
                rd.poll_whole(&POST[..end]).unwrap(),
                Progress::NeedMore,
                "at {end}"
            );
        }
        assert_eq!(rd.poll_whole(POST).unwrap(), Progress::Ready(ready(POST)));
    }

    #[test]
    fn pipelined() {
        let get = b"GET /health HTTP/1.1\r\nHost: h\r\n\r\n";
        let mut buf = Vec::new();
        buf.extend_from_slice(POST);
        buf.extend_from_slice(get);
        buf.extend_from_slice(&POST[..10]);
        let mut rd = reader();
        let Progress::Ready(first) = rd.poll_whole(&buf).unwrap() else {
            panic!()
        };
        assert_eq!(first.consumed, POST.len());
        buf.drain(..first.consumed);
        let Progress::Ready(second) = rd.poll_whole(&buf).unwrap() else {
            panic!()
        };
        assert_eq!(second.path(), "/health");
        assert!(second.body.is_empty());
        buf.drain(..second.consumed);
        assert!(matches!(rd.poll_whole(&buf).unwrap(), Progress::NeedMore));
        assert!(rd.mid_request(buf.len()));
    }

    #[test]
    fn keep_alive_rules() {
        assert!(!ready(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n").keep_alive);
        assert!(!ready(b"GET / HTTP/1.1\r\nHost: h\r\nConnection: foo, Close\r\n\r\n").keep_alive);
        assert!(!ready(b"GET / HTTP/1.0\r\n\r\n").keep_alive);
        assert!(ready(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n").keep_alive);
        assert!(ready(b"GET / HTTP/1.1\r\nHost: h\r\n\r\n").keep_alive);
    }

    #[test]
    fn framing_errors() {
        assert_eq!(
            error(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n"),
            411
        );
        assert_eq!(
            error(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: gzip\r\n\r\n"),
            501
        );
        assert_eq!(
            error(b"POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\nabc"),
            400
        );
        assert_eq!(
            error(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        assert_eq!(
            error(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n"),
            400
        );
        assert_eq!(
            error(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: -1\r\n\r\n"),
            400
        );
        assert_eq!(
            error(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1e3\r\n\r\n"),
            400
        );
        assert_eq!(
            error(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 99999999999999999999999\r\n\r\n"),
            400
        );
        assert_eq!(
            error(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 1052673\r\n\r\n"),
            413
        );
        assert_eq!(error(b"GET / HTTP/1.1\r\n\r\n"), 400, "missing Host");
        assert_eq!(error(b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"), 400);
        assert_eq!(error(b"GET http://a/ HTTP/1.1\r\nHost: a\r\n\r\n"), 400);
        assert_eq!(error(b"GET / HTTP/2.0\r\nHost: a\r\n\r\n"), 505);
        assert_eq!(
            error(b"GET / HTTP/1.1\r\nHost: a\r\nExpect: magic\r\n\r\n"),
            417
        );
        assert_eq!(error(b"GET / HTTP/1.1\r\nHo st: a\r\n\r\n"), 400);
        assert_eq!(error(b"\x00\x01\x02\r\n\r\n"), 400);
        // Equal duplicates (also as a list) are one length.
        let r = ready(
            b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 2, 2\r\nContent-Length: 2\r\n\r\nab",
        );
        assert_eq!(r.body.len(), 2);
    }

    #[test]
    fn a_head_over_the_body_limit_is_judged_first_and_never_proceeds() {
        let limits = RequestLimits {
            max_body_bytes: 4,
            ..RequestLimits::default()
        };
        let mut rd = RequestReader::new(limits);
        let buf = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\nabcde";
        let Progress::Head(head) = rd.poll(buf).unwrap() else {
            panic!("the head is handed out for judging")
        };
        assert_eq!(head.body_over_limit, Some(5));
        assert!(head.body.is_empty() && !head.keep_alive);
        // Accepted all the same: the body is never read.
        rd.proceed();
        assert_eq!(rd.poll(buf).unwrap_err().status, 413);
    }

    #[test]
    fn body_limit_is_inclusive() {
        let limits = RequestLimits {
            max_body_bytes: 4,
            ..RequestLimits::default()
        };
        let mut rd = RequestReader::new(limits);
        assert!(matches!(
            rd.poll_whole(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 4\r\n\r\nabcd")
                .unwrap(),
            Progress::Ready(_)
        ));
        let mut rd = RequestReader::new(limits);
        assert_eq!(
            rd.poll_whole(b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n")
                .unwrap_err()
                .status,
            413
        );
    }

    #[test]
    fn head_limits() {
        let limits = RequestLimits {
            max_head_bytes: 64,
            max_headers: 3,
            ..RequestLimits::default()
        };
        let mut rd = RequestReader::new(limits);
        let long = format!("GET /{} HTTP/1.1\r\n", "a".repeat(100));
        assert_eq!(rd.poll_whole(long.as_bytes()).unwrap_err().status, 431);
        let mut rd = RequestReader::new(limits);
        let many = b"GET / HTTP/1.1\r\nHost: h\r\na: 1\r\nb: 2\r\nc: 3\r\n\r\n";
        assert_eq!(rd.poll_whole(many).unwrap_err().status, 431);
        // Exactly at the limit is fine.
        let mut rd = RequestReader::new(limits);
        assert!(matches!(
            rd.poll_whole(b"GET / HTTP/1.1\r\nHost: h\r\na: 1\r\nb: 2\r\n\r\n")
                .unwrap(),
            Progress::Ready(_)
        ));
    }

    #[test]
    fn expect_continue_is_a_fact_of_the_head() {
        let head =
            b"POST /mcp HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n";
        let mut rd = reader();
        let Progress::Head(r) = rd.poll(head).unwrap() else {
            panic!("the head comes first")
        };
        assert!(r.expects_continue);
        // Until judged, the same head again; no body is waited for.
        assert_eq!(rd.poll(head).unwrap(), Progress::Head(r.clone()));
        rd.proceed();
        let mut more = head.to_vec();
        more.push(b'{');
        assert_eq!(rd.poll(&more).unwrap(), Progress::NeedMore);
        more.push(b'}');
        assert!(matches!(rd.poll(&more).unwrap(), Progress::Ready(_)));
        // HTTP/1.0 ignores Expect.
        let Progress::Ready(r) = reader()
            .poll_whole(b"POST / HTTP/1.0\r\nExpect: whatever\r\n\r\n")
            .unwrap()
        else {
            panic!()
        };
        assert!(!r.expects_continue);
    }

    #[test]
    fn a_head_is_handed_out_before_its_body_and_can_be_refused() {
        let mut rd = reader();
        let head = b"POST /mcp HTTP/1.1\r\nHost: h\r\nContent-Length: 1000000\r\n\r\n";
        assert!(matches!(rd.poll(head).unwrap(), Progress::Head(_)));
        assert!(rd.mid_request(head.len()));
        // Refused: the reader looks for a new head at the start of the buffer.
        rd.reset();
        assert!(!rd.mid_request(0));
        assert_eq!(rd.poll(b"GET /hea").unwrap(), Progress::NeedMore);
    }

    #[test]
    fn leading_blank_line_and_bare_lf() {
        let r = ready(b"\r\nGET /health HTTP/1.1\r\nHost: h\r\n\r\n");
        assert_eq!(r.path(), "/health");
        let r = ready(b"GET /health HTTP/1.1\nHost: h\n\n");
        assert_eq!(r.path(), "/health");
        let mut rd = reader();
        assert_eq!(rd.poll_whole(b"\r\n\r\n").unwrap(), Progress::NeedMore);
    }

    #[test]
    fn trims() {
        assert_eq!(trim_ows(b" \t a b \t"), b"a b");
        assert_eq!(trim_ows(b"   "), b"");
        assert_eq!(trim_ows(b""), b"");
    }

    proptest! {
        #[test]
        fn no_panic_on_any_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..2048)) {
            let mut rd = reader();
            let _ = rd.poll_whole(&bytes);
            let mut rd = reader();
            for end in 0..bytes.len().min(64) {
                if rd.poll_whole(&bytes[..end]).is_err() { break; }
            }
        }

        #[test]
        fn no_panic_on_mangled_requests(
            cut in 0usize..200,
            insert in any::<u8>(),
            at in 0usize..200,
        ) {
            let mut bytes = POST.to_vec();
            let at = at.min(bytes.len());
            bytes.insert(at, insert);
            bytes.truncate(cut.max(1).min(bytes.len()));
            let _ = reader().poll_whole(&bytes);
        }

        #[test]
        fn any_split_reads_the_same(split in 0usize..POST.len()) {
            let mut rd = reader();
            let first = rd.poll_whole(&POST[..split]).unwrap();
            let waiting = matches!(first, Progress::NeedMore);
            prop_assert!(waiting);
            prop_assert_eq!(rd.poll_whole(POST).unwrap(), Progress::Ready(ready(POST)));
        }
    }
}
