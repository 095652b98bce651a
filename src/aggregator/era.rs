//! The two MCP eras as a client sees them, sans-IO: which era a server speaks, what every
//! request must carry in each, and how a 404 is recovered from.
//!
//! Detection, per server, when it is first reached (and again after it was down):
//! 1. `server/discover` as a modern (2026-07-28) request. A result whose
//!    `supportedVersions` lists 2026-07-28 makes the server **modern**: no handshake, no
//!    session, `_meta` on every request, `Mcp-Method` / `Mcp-Name` headers.
//! 2. Anything else (400, 404, 405, a JSON-RPC error, a result without that version) makes
//!    it **legacy**: `initialize` (asking for the newest legacy version), keep the
//!    `Mcp-Session-Id` it hands out, send `notifications/initialized`, then
//!    `MCP-Protocol-Version` and the session id on every request.
//!
//! 401 and 403 end detection at once (the credentials are wrong whatever the era), as do
//! network failures (the server is down).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde_json::{Map, Value, json};

use super::error::{UpstreamError, UpstreamErrorCode, quote_upstream};
use crate::mcp::protocol::{LEGACY_VERSIONS, NEWEST_LEGACY};

/// The modern-era version this client speaks.
pub const MODERN_VERSION: &str = "2026-07-28";

pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";

/// Longest session id kept (the spec asks for visible ASCII; anything longer is suspect).
pub const MAX_SESSION_ID_BYTES: usize = 512;

/// The era a server speaks, and its per-connection state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Era {
    Legacy {
        /// The version `initialize` negotiated.
        version: String,
        /// The `Mcp-Session-Id` the server handed out, if any (stateless servers give none).
        session_id: Option<String>,
    },
    Modern {
        version: String,
    },
}

impl Era {
    /// `legacy 2025-06-18` or `modern 2026-07-28`, for status and the ledger.
    pub fn describe(&self) -> String {
        match self {
            Era::Legacy { version, .. } => format!("legacy {version}"),
            Era::Modern { version } => format!("modern {version}"),
        }
    }

    pub fn is_modern(&self) -> bool {
        matches!(self, Era::Modern { .. })
    }
}

/// Which lists the server says it announces changes of.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ListChanges {
    pub tools: bool,
    pub resources: bool,
    pub prompts: bool,
    /// The server answers `completion/complete` (capability `completions`).
    pub completions: bool,
    /// The server takes `resources/subscribe` (capability `resources.subscribe`).
    pub subscribe: bool,
}

impl ListChanges {
    /// Whether the server sends anything on a listening stream toolwall wants: list
    /// changes, or updates of subscribed resources.
    pub fn any(&self) -> bool {
        self.tools || self.resources || self.prompts || self.subscribe
    }

    /// From a `capabilities` object (initialize result or server/discover).
    pub fn from_capabilities(caps: Option<&Value>) -> ListChanges {
        let flag = |kind: &str| {
            caps.and_then(|c| c.get(kind))
                .and_then(|k| k.get("listChanged"))
                .and_then(Value::as_bool)
                .unwrap_or(false)
        };
        ListChanges {
            tools: flag("tools"),
            resources: flag("resources"),
            prompts: flag("prompts"),
            completions: caps
                .and_then(|c| c.get("completions"))
                .is_some_and(Value::is_object),
            subscribe: caps
                .and_then(|c| c.get("resources"))
                .and_then(|r| r.get("subscribe"))
                .and_then(Value::as_bool)
                .unwrap_or(false),
        }
    }
}

fn client_info() -> Value {
    json!({"name": "toolwall", "version": env!("CARGO_PKG_VERSION")})
}

/// The `params` of `initialize`.
pub fn initialize_params() -> String {
    // toolwall relays these to the agent whose call asked (and refuses them for agents that
    // did not declare the capability): a legacy upstream asks only a client that declared
    // them.
    json!({
        "protocolVersion": NEWEST_LEGACY,
        "capabilities": {"elicitation": {}, "sampling": {}, "roots": {}},
        "clientInfo": client_info(),
    })
    .to_string()
}

/// What a `server/discover` attempt tells.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Discovery {
    Modern {
        version: String,
        changes: ListChanges,
    },
    /// Not modern: go on with `initialize`. Says why, for the log.
    TryLegacy(String),
}

/// Judge the answer to `server/discover`: `status` and, when there was one, the JSON-RPC
/// outcome (result text or error message).
pub fn judge_discover(status: u16, outcome: Option<Result<&str, &str>>) -> Discovery {
    let Some(outcome) = outcome else {
        return Discovery::TryLegacy(format!("server/discover answered HTTP {status}"));
    };
    let result = match outcome {
        Ok(result) => result,
        Err(message) => {
            return Discovery::TryLegacy(format!(
                "server/discover failed: {}",
                quote_upstream(message, 200)
            ));
        }
    };
    let Ok(value) = serde_json::from_str::<Value>(result) else {
        return Discovery::TryLegacy("server/discover result is not JSON".into());
    };
    let speaks_modern = value
        .get("supportedVersions")
        .and_then(Value::as_array)
        .is_some_and(|v| v.iter().any(|v| v.as_str() == Some(MODERN_VERSION)));
    if !speaks_modern {
        return Discovery::TryLegacy(format!("server/discover does not list {MODERN_VERSION}"));
    }
    Discovery::Modern {
        version: MODERN_VERSION.to_owned(),
        changes: ListChanges::from_capabilities(value.get("capabilities")),
    }
}

/// Judge the `initialize` result: the negotiated version (which must be one this client
/// speaks) and what the server announces.
pub fn judge_initialize(result: &str) -> Result<(String, ListChanges), UpstreamError> {
    let value: Value = serde_json::from_str(result).map_err(|_| {
        UpstreamError::new(
            UpstreamErrorCode::BadResponse,
            "the initialize result is not JSON",
        )
    })?;
    let version = value
        .get("protocolVersion")
        .and_then(Value::as_str)
        .ok_or_else(|| {
            UpstreamError::new(
                UpstreamErrorCode::BadResponse,
                "the initialize result has no protocolVersion",
            )
        })?;
    if !LEGACY_VERSIONS.contains(&version) {
        return Err(UpstreamError::new(
            UpstreamErrorCode::BadResponse,
            format!(
                "the server chose protocol version {}, which toolwall does not speak (it speaks {} and {MODERN_VERSION})",
                quote_upstream(version, 40),
                LEGACY_VERSIONS.join(", ")
            ),
        ));
    }
    Ok((
        version.to_owned(),
        ListChanges::from_capabilities(value.get("capabilities")),
    ))
}

/// A session id we may echo back: visible ASCII, bounded.
pub fn valid_session_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= MAX_SESSION_ID_BYTES
        && id.bytes().all(|b| (0x21..=0x7e).contains(&b))
}

/// The name `Mcp-Name` mirrors for a method, from its params.
pub fn mirrored_name<'a>(method: &str, params: Option<&'a Value>) -> Option<&'a str> {
    let key = match method {
        "tools/call" | "prompts/get" => "name",
        "resources/read" => "uri",
        _ => return None,
    };
    params?.get(key)?.as_str()
}

/// A header value as the modern era allows: as is when it is plain visible ASCII without
/// leading or trailing spaces, else `=?base64?...?=` of its UTF-8.
pub fn header_value(text: &str) -> String {
    let plain = !text.is_empty()
        && text.bytes().all(|b| (0x20..0x7f).contains(&b))
        && !text.starts_with(' ')
        && !text.ends_with(' ')
        && !text.starts_with("=?");
    if plain {
        text.to_owned()
    } else {
        format!("=?base64?{}?=", STANDARD.encode(text.as_bytes()))
    }
}

/// The protocol headers of one request (besides Accept, Content-Type, Authorization and
/// the operator's headers), for the era the server speaks (`None` while detecting: the
/// discover request is built as a modern one).
pub fn protocol_headers(
    era: Option<&Era>,
    method: &str,
    params: Option<&Value>,
) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    match era {
        Some(Era::Legacy {
            version,
            session_id,
        }) => {
            if method != "initialize" {
                out.push(("MCP-Protocol-Version", version.clone()));
                if let Some(id) = session_id {
                    out.push(("Mcp-Session-Id", id.clone()));
                }
            }
        }
        Some(Era::Modern { version }) => {
            out.push(("MCP-Protocol-Version", version.clone()));
            out.push(("Mcp-Method", header_value(method)));
            if let Some(name) = mirrored_name(method, params) {
                out.push(("Mcp-Name", header_value(name)));
            }
        }
        None => {
            out.push(("MCP-Protocol-Version", MODERN_VERSION.to_owned()));
            out.push(("Mcp-Method", header_value(method)));
        }
    }
    out
}

/// `params` as the era wants them: modern requests carry the protocol version and client
/// capabilities in `_meta` (an agent's own `_meta` keys, such as a progress token, stay;
/// the protocol's own keys are ours). Legacy params go as they are.
pub fn params_for(era: Option<&Era>, params: Option<Value>) -> Option<Value> {
    let modern_version = match era {
        Some(Era::Modern { version }) => version.as_str(),
        None => MODERN_VERSION,
        Some(Era::Legacy { .. }) => return params,
    };
    let mut params = match params {
        Some(Value::Object(m)) => m,
        _ => Map::new(),
    };
    let meta = params
        .entry("_meta")
        .or_insert_with(|| Value::Object(Map::new()));
    if !meta.is_object() {
        *meta = Value::Object(Map::new());
    }
    if let Some(meta) = meta.as_object_mut() {
        meta.retain(|k, _| !k.starts_with("io.modelcontextprotocol/"));
        meta.insert(META_PROTOCOL_VERSION.into(), json!(modern_version));
        meta.insert(META_CLIENT_CAPABILITIES.into(), json!({}));
        meta.insert(META_CLIENT_INFO.into(), client_info());
    }
    Some(Value::Object(params))
}

/// What to do after an answer's HTTP status, on attempt `attempt` (0 or 1) of `method`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterStatus {
    /// Use the answer (or report its error).
    Proceed,
    /// The session is gone: open a new one, then send the request again.
    RenewAndRetry,
    /// The session is gone: open a new one (so later requests work), but fail this one:
    /// a tool call is never sent twice, and a second 404 is not retried again.
    RenewAndFail,
}

/// A 404 to a request that carried a legacy session id means the server forgot the
/// session. One re-initialize and one retry, for anything but `tools/call`.
pub fn after_status(era: &Era, status: u16, method: &str, attempt: u32) -> AfterStatus {
    let had_session = matches!(
        era,
        Era::Legacy {
            session_id: Some(_),
            ..
        }
    );
    if status != 404 || !had_session {
        return AfterStatus::Proceed;
    }
    if attempt == 0 && method != "tools/call" {
        AfterStatus::RenewAndRetry
    } else {
        AfterStatus::RenewAndFail
    }
}

/// Map an HTTP status that is not a usable answer to an error naming the server.
pub fn status_error(server: &str, status: u16) -> Option<UpstreamError> {
    let (code, message) = match status {
        200..=299 => return None,
        401 => (
            UpstreamErrorCode::AuthRequired,
            format!(
                "server {server} answered 401: it needs credentials toolwall does not have or that it refused (servers.{server}.bearer_token_file / bearer_token_env)"
            ),
        ),
        403 => (
            UpstreamErrorCode::Forbidden,
            format!("server {server} answered 403: forbidden"),
        ),
        404 => (
            UpstreamErrorCode::HttpError,
            format!("server {server} answered 404: no MCP endpoint at that URL"),
        ),
        300..=399 => (
            UpstreamErrorCode::HttpError,
            format!(
                "server {server} answered a redirect ({status}); toolwall does not follow redirects from upstreams: configure the final URL"
            ),
        ),
        _ => (
            UpstreamErrorCode::HttpError,
            format!("server {server} answered HTTP {status}"),
        ),
    };
    Some(UpstreamError::new(code, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn legacy(session: Option<&str>) -> Era {
        Era::Legacy {
            version: "2025-06-18".into(),
            session_id: session.map(str::to_owned),
        }
    }

    #[test]
    fn discover_decides_the_era() {
        let modern = judge_discover(
            200,
            Some(Ok(
                r#"{"supportedVersions":["2026-07-28","2025-11-25"],"capabilities":{"tools":{"listChanged":true}}}"#,
            )),
        );
        assert_eq!(
            modern,
            Discovery::Modern {
                version: MODERN_VERSION.into(),
                changes: ListChanges {
                    tools: true,
                    resources: false,
                    prompts: false,
                    completions: false,
                    subscribe: false,
                }
            }
        );
        for (status, outcome) in [
            (400, None),
            (404, None),
            (405, None),
            (200, Some(Err("Method not found"))),
            (200, Some(Ok(r#"{"supportedVersions":["2025-11-25"]}"#))),
            (200, Some(Ok("not json"))),
            (200, Some(Ok("{}"))),
        ] {
            assert!(
                matches!(judge_discover(status, outcome), Discovery::TryLegacy(_)),
                "{status} {outcome:?}"
            );
        }
    }

    #[test]
    fn initialize_must_pick_a_version_we_speak() {
        let (v, changes) = judge_initialize(
            r#"{"protocolVersion":"2025-03-26","capabilities":{"prompts":{"listChanged":true}}}"#,
        )
        .unwrap();
        assert_eq!(v, "2025-03-26");
        assert!(changes.prompts && !changes.tools);
        for bad in ["{}", "[]", r#"{"protocolVersion":"1999-01-01"}"#, "x"] {
            let e = judge_initialize(bad).unwrap_err();
            assert_eq!(e.code, UpstreamErrorCode::BadResponse, "{bad}");
        }
    }

    #[test]
    fn headers_per_era() {
        let params = json!({"name": "search", "arguments": {}});
        let h = protocol_headers(Some(&legacy(Some("abc"))), "tools/call", Some(&params));
        assert_eq!(
            h,
            vec![
                ("MCP-Protocol-Version", "2025-06-18".to_string()),
                ("Mcp-Session-Id", "abc".to_string())
            ]
        );
        // initialize itself carries neither.
        assert!(protocol_headers(Some(&legacy(None)), "initialize", None).is_empty());
        let modern = Era::Modern {
            version: MODERN_VERSION.into(),
        };
        let h = protocol_headers(Some(&modern), "tools/call", Some(&params));
        assert!(h.contains(&("Mcp-Method", "tools/call".to_string())));
        assert!(h.contains(&("Mcp-Name", "search".to_string())));
        let read = json!({"uri": "file:///ä b"});
        let h = protocol_headers(Some(&modern), "resources/read", Some(&read));
        let name = &h.iter().find(|(k, _)| *k == "Mcp-Name").unwrap().1;
        assert_eq!(
            name,
            &format!("=?base64?{}?=", STANDARD.encode("file:///ä b"))
        );
        let h = protocol_headers(None, "server/discover", None);
        assert!(h.contains(&("MCP-Protocol-Version", MODERN_VERSION.to_string())));
    }

    #[test]
    fn modern_params_carry_meta_and_keep_the_agents_keys() {
        let modern = Era::Modern {
            version: MODERN_VERSION.into(),
        };
        let p = params_for(
            Some(&modern),
            Some(
                json!({"name": "x", "_meta": {"progressToken": 5, META_PROTOCOL_VERSION: "evil"}}),
            ),
        )
        .unwrap();
        assert_eq!(p["_meta"]["progressToken"], 5);
        assert_eq!(p["_meta"][META_PROTOCOL_VERSION], MODERN_VERSION);
        assert!(p["_meta"][META_CLIENT_CAPABILITIES].is_object());
        let p = params_for(None, None).unwrap();
        assert_eq!(p["_meta"][META_PROTOCOL_VERSION], MODERN_VERSION);
        let legacy_params = params_for(Some(&legacy(None)), Some(json!({"a": 1})));
        assert_eq!(legacy_params, Some(json!({"a": 1})));
    }

    #[test]
    fn one_renewal_one_retry_never_for_tool_calls() {
        let with = legacy(Some("s"));
        assert_eq!(
            after_status(&with, 404, "tools/list", 0),
            AfterStatus::RenewAndRetry
        );
        assert_eq!(
            after_status(&with, 404, "tools/list", 1),
            AfterStatus::RenewAndFail
        );
        assert_eq!(
            after_status(&with, 404, "tools/call", 0),
            AfterStatus::RenewAndFail
        );
        assert_eq!(
            after_status(&with, 200, "tools/call", 0),
            AfterStatus::Proceed
        );
        // Without a session a 404 is just a 404.
        assert_eq!(
            after_status(&legacy(None), 404, "tools/list", 0),
            AfterStatus::Proceed
        );
        let modern = Era::Modern {
            version: MODERN_VERSION.into(),
        };
        assert_eq!(
            after_status(&modern, 404, "tools/list", 0),
            AfterStatus::Proceed
        );
    }

    #[test]
    fn statuses_name_the_server() {
        let e = status_error("gh", 401).unwrap();
        assert_eq!(e.code, UpstreamErrorCode::AuthRequired);
        assert!(e.message.contains("gh"));
        assert_eq!(
            status_error("gh", 403).unwrap().code,
            UpstreamErrorCode::Forbidden
        );
        assert!(
            status_error("gh", 302)
                .unwrap()
                .message
                .contains("redirect")
        );
        assert!(status_error("gh", 202).is_none());
    }

    #[test]
    fn session_ids() {
        assert!(valid_session_id("a1-B2"));
        assert!(!valid_session_id(""));
        assert!(!valid_session_id("a b"));
        assert!(!valid_session_id("a\r\nX: y"));
        assert!(!valid_session_id(&"x".repeat(MAX_SESSION_ID_BYTES + 1)));
    }
}
