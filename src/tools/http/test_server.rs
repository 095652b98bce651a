//! A tiny HTTP/1.1 server on 127.0.0.1 for the tests: one thread per connection, fixed
//! answers by path, `Connection: close` always.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use flate2::Compression;
use flate2::write::GzEncoder;

pub const HTML_PAGE: &str = "<!DOCTYPE html><html><head><title>Test page</title>\
<style>p { color: red }</style></head><body>\
<h1>Main heading</h1>\
<p>First paragraph with <b>bold</b> text and <a href=\"https://example.com/docs\">a link</a>.</p>\
<h2>Second heading</h2>\
<ul><li>alpha item</li><li>beta item</li><li>gamma item</li></ul>\
<p>Caf\u{e9} cr\u{e8}me and \u{1f600} emoji.</p>\
<script>var secret = 'not shown';</script>\
</body></html>";

/// Bytes of a small PNG-like binary body.
pub const BINARY: &[u8] =
    b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";

/// The plain text served at /long: numbered sentences with multibyte characters.
pub fn long_text() -> String {
    (0..400)
        .map(|i| format!("Sentence {i}: na\u{ef}ve caf\u{e9} \u{3042}\u{3044}.\n"))
        .collect()
}

/// The plain text served at /lines: "row N" lines, every tenth one marked.
pub fn lines_text() -> String {
    (1..=100)
        .map(|i| {
            if i % 10 == 0 {
                format!("row {i} MARK\n")
            } else {
                format!("row {i}\n")
            }
        })
        .collect()
}

pub struct TestServer {
    pub port: u16,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
}

impl TestServer {
    pub fn start() -> TestServer {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind test server");
        let port = listener.local_addr().expect("local addr").port();
        let stop = Arc::new(AtomicBool::new(false));
        let stop_seen = stop.clone();
        let accept = std::thread::spawn(move || {
            for stream in listener.incoming() {
                if stop_seen.load(Ordering::SeqCst) {
                    break;
                }
                if let Ok(stream) = stream {
                    std::thread::spawn(move || serve(stream, port));
                }
            }
        });
        TestServer {
            port,
            stop,
            accept: Some(accept),
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }
}

impl Drop for TestServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop so it sees the flag.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
        if let Some(handle) = self.accept.take() {
            let _ = handle.join();
        }
    }
}

fn read_head(stream: &mut TcpStream) -> Option<(String, String)> {
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if head.len() > 64 * 1024 || stream.read(&mut byte).ok()? == 0 {
            return None;
        }
        head.push(byte[0]);
    }
    let text = String::from_utf8_lossy(&head).into_owned();
    let mut first = text.lines().next()?.split(' ');
    Some((first.next()?.to_string(), first.next()?.to_string()))
}

fn gzip(data: &[u8]) -> Vec<u8> {
    let mut enc = GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(data).expect("gzip");
    enc.finish().expect("gzip")
}

fn respond(
    stream: &mut TcpStream,
    method: &str,
    status: &str,
    headers: &[(&str, String)],
    body: &[u8],
) {
    let mut out = format!(
        "HTTP/1.1 {status}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        out.push_str(&format!("{k}: {v}\r\n"));
    }
    out.push_str("\r\n");
    let mut bytes = out.into_bytes();
    if method != "HEAD" {
        bytes.extend_from_slice(body);
    }
    let _ = stream.write_all(&bytes);
}

fn serve(mut stream: TcpStream, port: u16) {
    let _ = stream.set_read_timeout(Some(Duration::from_secs(5)));
    let Some((method, path)) = read_head(&mut stream) else {
        return;
    };
    let html = ("Content-Type", "text/html; charset=utf-8".to_string());
    let plain = ("Content-Type", "text/plain; charset=utf-8".to_string());
    let s = &mut stream;
    let m = method.as_str();
    match path.as_str() {
        "/html" => respond(
            s,
            m,
            "200 OK",
            &[html, ("X-Test", "yes".into())],
            HTML_PAGE.as_bytes(),
        ),
        "/long" => respond(s, m, "200 OK", &[plain], long_text().as_bytes()),
        "/lines" => respond(s, m, "200 OK", &[plain], lines_text().as_bytes()),
        "/gzip" => {
            let body = gzip(HTML_PAGE.as_bytes());
            respond(
                s,
                m,
                "200 OK",
                &[html, ("Content-Encoding", "gzip".into())],
                &body,
            )
        }
        "/gzip-bomb" => {
            let body = gzip(&vec![b'a'; 3 * 1024 * 1024]);
            respond(
                s,
                m,
                "200 OK",
                &[plain, ("Content-Encoding", "gzip".into())],
                &body,
            )
        }
        "/huge" => respond(s, m, "200 OK", &[plain], &vec![b'x'; 2 * 1024 * 1024]),
        "/huge-chunked" => {
            let head = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\n\
                        Transfer-Encoding: chunked\r\n\r\n";
            if s.write_all(head.as_bytes()).is_err() {
                return;
            }
            let chunk = format!("{:x}\r\n{}\r\n", 64 * 1024, "y".repeat(64 * 1024));
            for _ in 0..64 {
                if s.write_all(chunk.as_bytes()).is_err() {
                    return;
                }
            }
            let _ = s.write_all(b"0\r\n\r\n");
        }
        "/slow" => {
            let head = "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Type: text/plain\r\n\
                        Content-Length: 1000\r\n\r\n";
            if s.write_all(head.as_bytes()).is_err() {
                return;
            }
            // A byte every 100 ms: far slower than any test's whole-call timeout.
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(100));
                if s.write_all(b"z").is_err() {
                    return;
                }
            }
        }
        "/binary" => respond(
            s,
            m,
            "200 OK",
            &[("Content-Type", "image/png".into())],
            BINARY,
        ),
        "/binary-undeclared" => respond(s, m, "200 OK", &[], BINARY),
        "/latin1" => respond(
            s,
            m,
            "200 OK",
            &[("Content-Type", "text/plain; charset=iso-8859-1".into())],
            b"caf\xe9 \x80uro",
        ),
        "/redirect-relative" => respond(s, m, "302 Found", &[("Location", "/html".into())], b""),
        "/redirect-absolute" => respond(
            s,
            m,
            "301 Moved Permanently",
            &[(
                "Location",
                format!("http://127.0.0.1:{port}/redirect-relative"),
            )],
            b"",
        ),
        "/redirect-numeric" => respond(
            s,
            m,
            "307 Temporary Redirect",
            &[("Location", format!("http://2130706433:{port}/html"))],
            b"",
        ),
        "/redirect-other-loopback" => respond(
            s,
            m,
            "302 Found",
            &[("Location", format!("http://127.0.0.2:{port}/html"))],
            b"",
        ),
        "/redirect-metadata" => respond(
            s,
            m,
            "302 Found",
            &[(
                "Location",
                "http://169.254.169.254/latest/meta-data/".into(),
            )],
            b"",
        ),
        "/redirect-v6-loopback" => respond(
            s,
            m,
            "302 Found",
            &[("Location", format!("http://[::1]:{port}/html"))],
            b"",
        ),
        "/redirect-scheme" => respond(
            s,
            m,
            "302 Found",
            &[("Location", "file:///etc/passwd".into())],
            b"",
        ),
        "/redirect-loop" => respond(
            s,
            m,
            "302 Found",
            &[("Location", "/redirect-loop".into())],
            b"",
        ),
        "/deep" => {
            let page = "<div>".repeat(50_000) + "bottom text";
            respond(s, m, "200 OK", &[html], page.as_bytes())
        }
        _ => respond(s, m, "404 Not Found", &[plain], b"no such page"),
    }
}
