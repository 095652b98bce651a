//! What the client puts on a connection and takes off it, per door: agent frames, JSON
//! lines (stdio, the guest relay), or HTTP/1.1 `POST /mcp` with keep-alive. Every request is a
//! `local__echo` `tools/call` whose text is unique to (connection, sequence number), so no
//! layer can answer from a cache and the client can check each answer.

use serde::Deserialize;
use std::fmt::Write as _;
use toolwall_relay::frame::{self, Decoded};

/// The process name the client gives in frames and in the meta line.
pub const CLIENT_NAME: &str = "bench-agent";

/// How requests and replies are delimited on one connection.
#[derive(Debug, Clone)]
pub enum Wire {
    /// Agent frames; the reply carries the request's stream id.
    Framed,
    /// One JSON-RPC message per line; the reply is matched by its JSON-RPC id.
    Lines,
    /// HTTP/1.1 keep-alive; replies come in request order. `headers` are extra header lines
    /// (each ending in `\r\n`), e.g. a session id the door obtained when connecting.
    Http {
        host: String,
        path: String,
        headers: String,
    },
}

/// How a reply names the request it answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplyKey {
    /// The sequence number the request was sent with (stream id or JSON-RPC id).
    Seq(u32),
    /// The oldest request still waiting (HTTP/1.1 answers in order).
    Oldest,
}

/// One reply taken off the front of a buffer.
pub struct Reply<'a> {
    pub key: ReplyKey,
    pub payload: &'a [u8],
    pub consumed: usize,
}

const LOREM: &str = "lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod \
tempor incididunt ut labore et dolore magna aliqua ut enim ad minim veniam quis nostrud \
exercitation ullamco laboris nisi ut aliquip ex ea commodo consequat duis aute irure dolor";

/// The echo text of call `seq` on connection `conn`: a unique prefix, then 16 to 175 bytes
/// of varying filler. Plain ASCII without characters JSON escapes, so the reply holds it
/// verbatim.
pub fn call_text(conn: usize, seq: u32, out: &mut String) {
    out.clear();
    let _ = write!(out, "c{conn}-n{seq}-");
    let start = (seq as usize * 7 + conn * 13) % 100;
    let len = 16 + (seq as usize * 31 + conn) % 160;
    out.push_str(&LOREM[start..(start + len).min(LOREM.len())]);
}

/// The echo tool of toolwall's builtin worker.
pub const ECHO_TOOL: &str = "local__echo";

/// The JSON-RPC request for one echo call of `tool`.
pub fn request_json(seq: u32, tool: &str, text: &str, out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(b"{\"jsonrpc\":\"2.0\",\"id\":");
    out.extend_from_slice(seq.to_string().as_bytes());
    out.extend_from_slice(b",\"method\":\"tools/call\",\"params\":{\"name\":\"");
    out.extend_from_slice(tool.as_bytes());
    out.extend_from_slice(b"\",\"arguments\":{\"text\":\"");
    out.extend_from_slice(text.as_bytes());
    out.extend_from_slice(b"\"}}}");
}

impl Wire {
    /// Bytes sent once when the connection opens (the relay's meta line).
    pub fn preamble(&self) -> Vec<u8> {
        match self {
            Wire::Framed => frame::meta_line_for(CLIENT_NAME),
            _ => Vec::new(),
        }
    }

    /// Append request `seq` carrying `json` to `out`.
    pub fn encode(&self, seq: u32, json: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        match self {
            Wire::Framed => frame::encode(out, seq, 0, CLIENT_NAME, json)
                .map_err(|e| format!("encode frame: {e}")),
            Wire::Lines => {
                out.extend_from_slice(json);
                out.push(b'\n');
                Ok(())
            }
            Wire::Http {
                host,
                path,
                headers,
            } => {
                let head = format!(
                    "POST {path} HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n\
                     Accept: application/json, text/event-stream\r\nContent-Length: {}\r\n{headers}\r\n",
                    json.len()
                );
                out.extend_from_slice(head.as_bytes());
                out.extend_from_slice(json);
                Ok(())
            }
        }
    }

    /// The first whole reply in `buf`, `Ok(None)` when more bytes are needed.
    pub fn decode<'a>(&self, buf: &'a [u8]) -> Result<Option<Reply<'a>>, String> {
        match self {
            Wire::Framed => match frame::decode_frame(buf) {
                Ok(Decoded::NeedMore) => Ok(None),
                Ok(Decoded::Frame {
                    header,
                    payload,
                    consumed,
                    ..
                }) => Ok(Some(Reply {
                    key: ReplyKey::Seq(header.stream_id),
                    payload,
                    consumed,
                })),
                Ok(other) => Err(format!("unexpected frame: {other:?}")),
                Err(e) => Err(format!("bad frame: {e}")),
            },
            Wire::Lines => {
                let Some(nl) = buf.iter().position(|&b| b == b'\n') else {
                    return Ok(None);
                };
                let payload = &buf[..nl];
                Ok(Some(Reply {
                    key: ReplyKey::Seq(json_id(payload)?),
                    payload,
                    consumed: nl + 1,
                }))
            }
            Wire::Http { .. } => decode_http(buf),
        }
    }
}

#[derive(Deserialize)]
struct IdOnly {
    id: u32,
}

/// The JSON-RPC id of a reply line (the client only sends integer ids).
fn json_id(payload: &[u8]) -> Result<u32, String> {
    serde_json::from_slice::<IdOnly>(payload)
        .map(|m| m.id)
        .map_err(|e| {
            format!(
                "reply without an integer id ({e}): {}",
                String::from_utf8_lossy(&payload[..payload.len().min(300)])
            )
        })
}

/// Largest HTTP response head the client accepts.
const MAX_HTTP_HEAD: usize = 16 * 1024;

fn decode_http(buf: &[u8]) -> Result<Option<Reply<'_>>, String> {
    let mut headers = [httparse::EMPTY_HEADER; 32];
    let mut response = httparse::Response::new(&mut headers);
    let head_len = match response.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) if buf.len() > MAX_HTTP_HEAD => {
            return Err("HTTP response head too long".into());
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad HTTP response: {e}")),
    };
    if response.code != Some(200) {
        return Err(format!("HTTP status {:?}", response.code));
    }
    let mut length = None;
    for h in response.headers.iter() {
        if h.name.eq_ignore_ascii_case("content-length") {
            length = std::str::from_utf8(h.value)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok());
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err("chunked HTTP replies are not read by this client".into());
        }
    }
    let length = length.ok_or("HTTP reply without Content-Length")?;
    if buf.len() < head_len + length {
        return Ok(None);
    }
    Ok(Some(Reply {
        key: ReplyKey::Oldest,
        payload: &buf[head_len..head_len + length],
        consumed: head_len + length,
    }))
}

/// Whether `payload` is a successful echo of `text`: a result (no error, not `isError`)
/// that holds the text verbatim.
pub fn echoes(payload: &[u8], text: &str) -> bool {
    contains(payload, text.as_bytes())
        && contains(payload, b"\"result\"")
        && !contains(payload, b"\"isError\":true")
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    let Some((&first, rest)) = needle.split_first() else {
        return true;
    };
    let mut from = 0;
    while let Some(pos) = hay[from..].iter().position(|&b| b == first) {
        let at = from + pos;
        if hay[at + 1..].starts_with(rest) {
            return true;
        }
        from = at + 1;
    }
    false
}

/// Round-trip every wire through canned bytes before anything is measured, so a client-side
/// codec fault (the HTTP one has no door to meet yet) shows up as such, not as a slow door.
pub fn self_check() -> Result<(), String> {
    let mut text = String::new();
    call_text(2, 7, &mut text);
    let mut json = Vec::new();
    request_json(7, ECHO_TOOL, &text, &mut json);
    let reply = format!(
        "{{\"jsonrpc\":\"2.0\",\"id\":7,\"result\":{{\"content\":[{{\"type\":\"text\",\"text\":\"{text}\"}}]}}}}"
    );
    let http = Wire::Http {
        host: "127.0.0.1:1".into(),
        path: "/mcp".into(),
        headers: "Mcp-Session-Id: s\r\n".into(),
    };
    let mut request = Vec::new();
    http.encode(7, &json, &mut request)?;
    let head = String::from_utf8_lossy(&request);
    if !head.starts_with("POST /mcp HTTP/1.1\r\n") || !head.contains("Mcp-Session-Id: s\r\n\r\n{") {
        return Err(format!("HTTP request malformed: {head}"));
    }
    let mut framed = Vec::new();
    frame::encode(&mut framed, 7, 0, "", reply.as_bytes()).map_err(|e| e.to_string())?;
    let cases: [(Wire, Vec<u8>, ReplyKey); 3] = [
        (Wire::Framed, framed, ReplyKey::Seq(7)),
        (Wire::Lines, format!("{reply}\n").into_bytes(), ReplyKey::Seq(7)),
        (
            http,
            format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nContent-Length: {}\r\n\r\n{reply}",
                reply.len()
            )
            .into_bytes(),
            ReplyKey::Oldest,
        ),
    ];
    for (wire, bytes, key) in cases {
        if !matches!(wire.decode(&bytes[..bytes.len() - 1]), Ok(None)) {
            return Err(format!("{wire:?}: a cut reply is not incomplete"));
        }
        let mut twice = bytes.clone();
        twice.extend_from_slice(&bytes);
        match wire.decode(&twice) {
            Ok(Some(r))
                if r.key == key && r.consumed == bytes.len() && echoes(r.payload, &text) => {}
            Ok(Some(r)) => {
                return Err(format!(
                    "{wire:?}: decoded {:?}, {} of {} bytes",
                    r.key,
                    r.consumed,
                    bytes.len()
                ));
            }
            other => {
                return Err(format!(
                    "{wire:?}: {:?}",
                    other.map(|r| r.map(|r| r.consumed))
                ));
            }
        }
    }
    Ok(())
}
