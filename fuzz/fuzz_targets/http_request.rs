//! The HTTP door's reading of requests, as a connection sees them: bytes arriving in
//! arbitrary pieces, each head judged by the real endpoint (route, Host, Origin, a token
//! against a stub store, Accept, Content-Type) before its body is awaited, then the body
//! judged as one JSON-RPC message. Invariants: no panic; a request never claims more bytes
//! than it was given nor a body outside them; a head is never larger than its limit; no
//! more than one head is ever buffered before a judgement (the read-room rule).
#![no_main]

use libfuzzer_sys::fuzz_target;

#[path = "alloc_cap.rs"]
mod alloc_cap;
#[global_allocator]
static ALLOC: alloc_cap::Capped = alloc_cap::Capped;
use std::time::Instant;
use toolwall::tokens::{AuthFailure, TokenInfo, TokenKind, TokenVerifier};
use toolwall::transport::http::config::HttpConfig;
use toolwall::transport::http::{
    DoorSettings, Endpoint, HeadDecision, HttpAuth, Progress, RequestLimits, RequestReader,
};

struct OneToken;

impl TokenVerifier for OneToken {
    fn verify(&self, presented: &str, _now_ms: i64) -> Result<TokenInfo, AuthFailure> {
        if presented == "twt_fuzz" {
            Ok(TokenInfo {
                id: 1,
                principal: "fuzz".into(),
                kind: TokenKind::Client,
                created_ms: 0,
                expires_ms: None,
                revoked_ms: None,
            })
        } else {
            Err(AuthFailure::Unknown)
        }
    }
}

fuzz_target!(|data: &[u8]| {
    // First byte: how the stream is cut into reads; second: small limits or defaults.
    let (Some(&cut), Some(&mode)) = (data.first(), data.get(1)) else {
        return;
    };
    let bytes = &data[2..];
    let mut http = HttpConfig::default();
    if mode & 1 == 1 {
        http.max_head_bytes = 256;
        http.max_headers = 8;
        http.max_body_bytes = 512;
    }
    let limits = RequestLimits::from(&http);
    let settings = DoorSettings {
        listen: "127.0.0.1:9210".parse().unwrap(),
        tls: false,
        public_url: (mode & 2 == 2).then(|| "https://mcp.example.com/mcp".to_owned()),
        auth: if mode & 4 == 4 { HttpAuth::None } else { HttpAuth::Tokens },
        metrics_public: mode & 8 == 8,
        http,
    };
    let Ok(mut endpoint) = Endpoint::new(settings) else {
        return;
    };
    let mut reader = RequestReader::new(limits);
    let chunk = (cut as usize % 64) + 1;
    let now = Instant::now();
    let mut buf: Vec<u8> = Vec::new();
    let mut fed = 0;
    let mut judged_body = false;
    loop {
        // The read-room rule: until a head is judged, at most one head (plus one byte).
        let room = match reader.current() {
            Some(r) if reader.in_body() => r.consumed + limits.max_head_bytes + 1,
            _ => limits.max_head_bytes + 1,
        }
        .saturating_sub(buf.len());
        let take = chunk.min(room).min(bytes.len() - fed);
        buf.extend_from_slice(&bytes[fed..fed + take]);
        fed += take;
        match reader.poll(&buf) {
            Err(e) => {
                assert!((400..600).contains(&e.status));
                return;
            }
            Ok(Progress::NeedMore) => {
                if take == 0 {
                    return;
                }
            }
            Ok(Progress::Head(request)) => {
                assert!(request.body.start <= request.body.end);
                assert!(request.body.end == request.consumed);
                assert!(request.body.start <= limits.max_head_bytes);
                assert!(request.body.len() <= limits.max_body_bytes);
                match endpoint.decide_head(&request, &OneToken, now, 0) {
                    HeadDecision::ReadBody { .. } => {
                        judged_body = true;
                        reader.proceed();
                    }
                    HeadDecision::Respond(r) => {
                        assert!(r.status >= 200);
                        if buf.len() < request.consumed {
                            return;
                        }
                        buf.drain(..request.consumed);
                        reader.reset();
                    }
                    HeadDecision::Health { .. } | HeadDecision::Metrics { .. } => {
                        if buf.len() < request.consumed {
                            return;
                        }
                        buf.drain(..request.consumed);
                        reader.reset();
                    }
                }
            }
            Ok(Progress::Ready(request)) => {
                assert!(judged_body, "a body is only awaited after its head was judged");
                judged_body = false;
                assert!(request.consumed <= buf.len());
                let _ = endpoint.decide_body(&request, &buf, "fuzz".into(), now);
                buf.drain(..request.consumed);
            }
        }
        assert!(buf.len() <= 2 * limits.max_head_bytes + limits.max_body_bytes + 2);
    }
});
