//! An answer streamed as `text/event-stream`, sans-IO: a call that yields messages before
//! its answer (progress, log messages, a server's requests) is answered with a `200` whose
//! body is a chunked event stream, one `message` event per JSON-RPC message, the final
//! response last, then the end of the chunked body (the connection may carry the next
//! request). Each event is one chunk, so a client sees each message as soon as it is
//! written. An HTTP/1.0 client, which knows no chunks, gets the events as they are and the
//! end of the connection as the end of the stream.

use super::response::ResponseBuilder;

pub const EVENT_STREAM: &str = "text/event-stream";

/// How the stream's body is framed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// HTTP/1.1: chunks, and the connection may carry on.
    Chunked,
    /// HTTP/1.0: the body ends with the connection.
    UntilClose,
}

/// The head of a streamed answer.
pub fn head(keep_alive: bool, framing: Framing) -> Vec<u8> {
    let builder = ResponseBuilder::new(200);
    match framing {
        Framing::Chunked => builder.keep_alive(keep_alive).chunked_head(EVENT_STREAM),
        Framing::UntilClose => builder.open_head(EVENT_STREAM),
    }
}

/// One `message` event holding `json`, as one chunk. A raw line break (which JSON text
/// from the core never has) would end the `data` line: each line becomes its own `data`
/// line, which the client joins back with the line break.
pub fn event(out: &mut Vec<u8>, json: &[u8], framing: Framing) {
    let mut data = Vec::with_capacity(json.len() + 24);
    data.extend_from_slice(b"event: message\n");
    for line in json.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        data.extend_from_slice(b"data: ");
        data.extend_from_slice(line);
        data.push(b'\n');
    }
    data.push(b'\n');
    match framing {
        Framing::Chunked => chunk(out, &data),
        Framing::UntilClose => out.extend_from_slice(&data),
    }
}

/// The end of the stream (the last, empty chunk; or nothing: the connection closes).
pub fn end(out: &mut Vec<u8>, framing: Framing) {
    if framing == Framing::Chunked {
        out.extend_from_slice(b"0\r\n\r\n");
    }
}

fn chunk(out: &mut Vec<u8>, data: &[u8]) {
    out.extend_from_slice(format!("{:x}\r\n", data.len()).as_bytes());
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Undo the chunked framing and split the events' data.
    fn events(body: &[u8]) -> (Vec<String>, bool) {
        let mut rest = body;
        let mut text = Vec::new();
        let mut ended = false;
        while let Some(nl) = rest.windows(2).position(|w| w == b"\r\n") {
            let len = usize::from_str_radix(std::str::from_utf8(&rest[..nl]).unwrap(), 16).unwrap();
            rest = &rest[nl + 2..];
            if len == 0 {
                ended = rest == b"\r\n";
                break;
            }
            text.extend_from_slice(&rest[..len]);
            assert_eq!(&rest[len..len + 2], b"\r\n");
            rest = &rest[len + 2..];
        }
        let text = String::from_utf8(text).unwrap();
        let data = text
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| {
                e.lines()
                    .filter_map(|l| l.strip_prefix("data: "))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .collect();
        (data, ended)
    }

    #[test]
    fn head_events_and_end() {
        let h = String::from_utf8(head(true, Framing::Chunked)).unwrap();
        assert!(h.starts_with("HTTP/1.1 200 OK\r\n"));
        assert!(h.contains("Content-Type: text/event-stream\r\n"));
        assert!(h.contains("Transfer-Encoding: chunked\r\n"));
        assert!(!h.to_ascii_lowercase().contains("content-length"));
        assert!(h.ends_with("\r\n\r\n"));
        let mut body = Vec::new();
        event(
            &mut body,
            br#"{"jsonrpc":"2.0","method":"notifications/progress"}"#,
            Framing::Chunked,
        );
        event(&mut body, b"{\"a\":\n1}", Framing::Chunked);
        event(
            &mut body,
            br#"{"jsonrpc":"2.0","id":1,"result":{}}"#,
            Framing::Chunked,
        );
        end(&mut body, Framing::Chunked);
        let (data, ended) = events(&body);
        assert!(ended);
        assert_eq!(data.len(), 3);
        assert_eq!(data[1], "{\"a\":\n1}");
        let last: serde_json::Value = serde_json::from_str(&data[2]).unwrap();
        assert_eq!(last["id"], 1);
    }

    #[test]
    fn an_http_10_client_gets_the_stream_until_close() {
        let h = String::from_utf8(head(true, Framing::UntilClose)).unwrap();
        assert!(h.contains("Connection: close\r\n"), "{h}");
        assert!(!h.to_ascii_lowercase().contains("transfer-encoding"));
        assert!(!h.to_ascii_lowercase().contains("content-length"));
        let mut body = Vec::new();
        event(&mut body, b"{}", Framing::UntilClose);
        end(&mut body, Framing::UntilClose);
        assert_eq!(body, b"event: message\ndata: {}\n\n");
    }
}
