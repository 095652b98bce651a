//! The two MCP eras on one endpoint, and the checks that come before a message reaches the
//! core.
//!
//! - **Legacy** (2025-11-25 and older): `initialize` opens a session named by
//!   `Mcp-Session-Id`; later requests carry it and `MCP-Protocol-Version`.
//! - **Modern** (2026-07-28): no handshake and no session. Every request carries its
//!   version and client capabilities in `params._meta`, mirrored into the
//!   `MCP-Protocol-Version`, `Mcp-Method` and `Mcp-Name` headers, which must agree with the
//!   body (intermediaries route on the headers, the core acts on the body).
//!
//! A request is modern when its `MCP-Protocol-Version` header names anything but a legacy
//! version, or, without the header, when its `_meta` names a protocol version; everything
//! else is legacy. So an unknown version gets the modern `UnsupportedProtocolVersionError`,
//! which lists every version served, and a legacy client's `initialize` is legacy.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::mcp::jsonrpc;
use crate::mcp::protocol::LEGACY_VERSIONS;

/// Modern-era versions, newest first.
pub const MODERN_VERSIONS: &[&str] = &["2026-07-28"];

/// The HTTP headers mirrored from (or naming) a message's protocol fields, lowercased.
pub const PROTOCOL_VERSION_HEADER: &str = "mcp-protocol-version";
pub const METHOD_HEADER: &str = "mcp-method";
pub const NAME_HEADER: &str = "mcp-name";
pub const SESSION_HEADER: &str = "mcp-session-id";

/// Headers do not match the body, or a required one is missing or malformed.
pub const HEADER_MISMATCH: i64 = -32020;
/// The request needs a client capability the client did not declare.
pub const MISSING_REQUIRED_CLIENT_CAPABILITY: i64 = -32021;
/// The requested protocol version is not served.
pub const UNSUPPORTED_PROTOCOL_VERSION: i64 = -32022;

/// `_meta` keys of a modern request.
pub const META_PROTOCOL_VERSION: &str = "io.modelcontextprotocol/protocolVersion";
pub const META_CLIENT_CAPABILITIES: &str = "io.modelcontextprotocol/clientCapabilities";
pub const META_CLIENT_INFO: &str = "io.modelcontextprotocol/clientInfo";
pub const META_SERVER_INFO: &str = "io.modelcontextprotocol/serverInfo";

/// Methods of the legacy era only; a modern request for one is "method not found".
pub const LEGACY_ONLY_METHODS: &[&str] = &[
    "initialize",
    "ping",
    "logging/setLevel",
    "resources/subscribe",
    "resources/unsubscribe",
];

/// Results a modern client may cache, with the `cacheScope` toolwall gives them. Lists
/// depend on the caller's policy, so they are private; discovery is the same for everyone.
pub const CACHEABLE_METHODS: &[(&str, &str)] = &[
    ("server/discover", "public"),
    ("tools/list", "private"),
    ("prompts/list", "private"),
    ("resources/list", "private"),
    ("resources/templates/list", "private"),
    ("resources/read", "private"),
];

/// Every version served, newest first: what `server/discover` and
/// `UnsupportedProtocolVersionError` list.
pub fn supported_versions() -> Vec<&'static str> {
    MODERN_VERSIONS
        .iter()
        .chain(LEGACY_VERSIONS.iter())
        .copied()
        .collect()
}

pub fn modern_version(version: &str) -> Option<&'static str> {
    MODERN_VERSIONS.iter().copied().find(|v| *v == version)
}

pub fn legacy_version(version: &str) -> Option<&'static str> {
    LEGACY_VERSIONS.iter().copied().find(|v| *v == version)
}

/// The `server/discover` result (before the endpoint adds `resultType`, caching hints and
/// `serverInfo`). Over HTTP toolwall serves no `subscriptions/listen` stream, so it
/// declares no `listChanged`: modern clients learn of changes by listing again.
pub fn discover_result(instructions: &str) -> Value {
    json!({
        "supportedVersions": supported_versions(),
        "capabilities": { "tools": {}, "resources": {}, "prompts": {} },
        "instructions": instructions,
    })
}

/// A refusal before the core: the HTTP status and the JSON-RPC error.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    pub status: u16,
    pub code: i64,
    pub message: String,
    pub data: Option<Value>,
}

impl Refusal {
    pub fn new(status: u16, code: i64, message: impl Into<String>) -> Refusal {
        Refusal {
            status,
            code,
            message: message.into(),
            data: None,
        }
    }

    fn mismatch(message: impl Into<String>) -> Refusal {
        Refusal::new(400, HEADER_MISMATCH, message)
    }
}

/// What the era checks need from the body, read once from its `params`.
#[derive(Debug, Default)]
pub struct ParamFacts {
    /// `params._meta` exists and is an object.
    pub meta_object: bool,
    /// `_meta[io.modelcontextprotocol/protocolVersion]`: None absent, Some(None) not a
    /// string, Some(Some(v)) the version.
    pub meta_version: Option<Option<String>>,
    /// `_meta[io.modelcontextprotocol/clientCapabilities]` is an object.
    pub meta_capabilities_object: bool,
    /// `params.name` when a string.
    pub name: Option<String>,
    /// `params.uri` when a string.
    pub uri: Option<String>,
    /// A field read here (`name`, `uri`, `_meta` or one of its version fields) appears
    /// more than once. The pipeline's parse keeps the last, a check reading the first
    /// would see another value: such a request is refused, never checked one way and
    /// served another.
    pub repeated_key: bool,
}

#[derive(Deserialize)]
struct RawParams<'a> {
    #[serde(borrow, rename = "_meta", default)]
    meta: Option<&'a RawValue>,
    #[serde(borrow, default)]
    name: Option<&'a RawValue>,
    #[serde(borrow, default)]
    uri: Option<&'a RawValue>,
}

#[derive(Deserialize)]
struct RawMeta<'a> {
    #[serde(borrow, rename = "io.modelcontextprotocol/protocolVersion", default)]
    protocol_version: Option<&'a RawValue>,
    #[serde(borrow, rename = "io.modelcontextprotocol/clientCapabilities", default)]
    client_capabilities: Option<&'a RawValue>,
}

fn is_object(raw: &RawValue) -> bool {
    raw.get().starts_with('{')
}

fn as_string(raw: &RawValue) -> Option<String> {
    serde_json::from_str::<String>(raw.get()).ok()
}

impl ParamFacts {
    /// Read `params` (already known to be an object or array, or absent).
    pub fn read(params: Option<&RawValue>) -> ParamFacts {
        let Some(params) = params.filter(|p| is_object(p)) else {
            return ParamFacts::default();
        };
        // The fields are raw values: the only error left is a repeated field.
        let Ok(raw) = serde_json::from_str::<RawParams>(params.get()) else {
            return ParamFacts {
                repeated_key: true,
                ..ParamFacts::default()
            };
        };
        let mut facts = ParamFacts {
            name: raw.name.and_then(as_string),
            uri: raw.uri.and_then(as_string),
            ..ParamFacts::default()
        };
        if let Some(meta) = raw.meta.filter(|m| is_object(m)) {
            facts.meta_object = true;
            match serde_json::from_str::<RawMeta>(meta.get()) {
                Ok(m) => {
                    facts.meta_version = m.protocol_version.map(as_string);
                    facts.meta_capabilities_object = m.client_capabilities.is_some_and(is_object);
                }
                Err(_) => facts.repeated_key = true,
            }
        }
        facts
    }
}

/// A header that may appear once appeared more often.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RepeatedHeader;

/// The one value of a header (already trimmed by the request reader); an error when it
/// appears more than once.
pub fn single_header<'a>(
    mut values: impl Iterator<Item = &'a [u8]>,
) -> Result<Option<&'a [u8]>, RepeatedHeader> {
    let first = values.next();
    if values.next().is_some() {
        return Err(RepeatedHeader);
    }
    Ok(first)
}

/// Whether the request belongs to the modern era (see the module comment).
pub fn is_modern(version_header: Option<&[u8]>, facts: &ParamFacts) -> bool {
    // A repeated key hides `_meta` from this reading: judged modern, the request meets
    // the refusal of repeated keys instead of passing as legacy unread.
    if facts.repeated_key && version_header.is_none() {
        return true;
    }
    match version_header {
        Some(v) => std::str::from_utf8(v)
            .ok()
            .and_then(legacy_version)
            .is_none(),
        None => matches!(facts.meta_version, Some(Some(_))),
    }
}

/// A header value mirrored from the body: plain visible ASCII (with inner spaces), or the
/// `=?base64?...?=` sentinel around strict, padded base64 of UTF-8.
pub fn decode_mirrored_value(value: &[u8]) -> Result<String, &'static str> {
    const OPEN: &[u8] = b"=?base64?";
    const CLOSE: &[u8] = b"?=";
    if value.len() >= OPEN.len() + CLOSE.len() && value.starts_with(OPEN) && value.ends_with(CLOSE)
    {
        let inner = &value[OPEN.len()..value.len() - CLOSE.len()];
        let bytes = STANDARD
            .decode(inner)
            .map_err(|_| "invalid base64 in header value")?;
        return String::from_utf8(bytes).map_err(|_| "base64 header value is not UTF-8");
    }
    if !value
        .iter()
        .all(|&b| b == b'\t' || (0x20..0x7f).contains(&b))
    {
        return Err("header value has characters outside visible ASCII");
    }
    // Checked ASCII above.
    Ok(String::from_utf8_lossy(value).into_owned())
}

/// The body field `Mcp-Name` mirrors for `method`, if the method has one.
fn name_source<'f>(method: &str, facts: &'f ParamFacts) -> Option<(Option<&'f str>, &'static str)> {
    match method {
        "tools/call" | "prompts/get" => Some((facts.name.as_deref(), "params.name")),
        "resources/read" => Some((facts.uri.as_deref(), "params.uri")),
        _ => None,
    }
}

/// The header values a modern request was sent with.
#[derive(Debug, Default, Clone, Copy)]
pub struct MirroredHeaders<'a> {
    pub protocol_version: Option<&'a [u8]>,
    pub method: Option<&'a [u8]>,
    pub name: Option<&'a [u8]>,
}

/// Check a modern request's headers against its body, then its version. Returns the
/// version served. The order follows what clients rely on: a missing or wrong `Mcp-Method`
/// or missing `_meta` fields first, then the header/body version agreement (-32020), then
/// whether the version is served (-32022), then `Mcp-Name`.
pub fn check_modern_request(
    method: &str,
    facts: &ParamFacts,
    headers: MirroredHeaders<'_>,
) -> Result<&'static str, Refusal> {
    // Checked against one reading of the body and served from another is no check.
    if facts.repeated_key {
        return Err(Refusal::new(
            400,
            jsonrpc::INVALID_PARAMS,
            "Invalid params: params repeats a key (name, uri, _meta or a _meta version \
             field); each may appear once",
        ));
    }
    let header_method = headers
        .method
        .ok_or_else(|| Refusal::mismatch("Header mismatch: the Mcp-Method header is required"))?;
    let header_method = decode_plain(header_method, "Mcp-Method")?;
    if header_method != method {
        return Err(Refusal::mismatch(format!(
            "Header mismatch: Mcp-Method header value {header_method:?} does not match body method {method:?}"
        )));
    }
    let version = match (&facts.meta_version, facts.meta_capabilities_object) {
        (Some(Some(v)), true) => v.as_str(),
        _ => {
            return Err(Refusal::new(
                400,
                jsonrpc::INVALID_PARAMS,
                format!(
                    "Invalid params: params._meta must carry {META_PROTOCOL_VERSION} (a string) \
                     and {META_CLIENT_CAPABILITIES} (an object)"
                ),
            ));
        }
    };
    let header_version = headers.protocol_version.ok_or_else(|| {
        Refusal::mismatch("Header mismatch: the MCP-Protocol-Version header is required")
    })?;
    let header_version = decode_plain(header_version, "MCP-Protocol-Version")?;
    if header_version != version {
        return Err(Refusal::mismatch(format!(
            "Header mismatch: MCP-Protocol-Version header value {header_version:?} does not match \
             body {META_PROTOCOL_VERSION} {version:?}"
        )));
    }
    let Some(served) = modern_version(version) else {
        let mut refusal = Refusal::new(
            400,
            UNSUPPORTED_PROTOCOL_VERSION,
            "Unsupported protocol version",
        );
        refusal.data = Some(json!({ "supported": supported_versions(), "requested": version }));
        return Err(refusal);
    };
    if let Some((body_value, field)) = name_source(method, facts) {
        match (headers.name, body_value) {
            (None, None) => {}
            (None, Some(_)) => {
                return Err(Refusal::mismatch(format!(
                    "Header mismatch: the Mcp-Name header is required when the body has {field}"
                )));
            }
            (Some(_), None) => {
                return Err(Refusal::mismatch(format!(
                    "Header mismatch: an Mcp-Name header was sent but the body has no {field}"
                )));
            }
            (Some(header), Some(body)) => {
                let decoded = decode_mirrored_value(header).map_err(|why| {
                    Refusal::mismatch(format!("Header mismatch: Mcp-Name: {why}"))
                })?;
                if decoded != body {
                    return Err(Refusal::mismatch(format!(
                        "Header mismatch: Mcp-Name header value {decoded:?} does not match body {field} {body:?}"
                    )));
                }
            }
        }
    }
    Ok(served)
}

fn decode_plain<'a>(value: &'a [u8], header: &str) -> Result<&'a str, Refusal> {
    std::str::from_utf8(value)
        .ok()
        .filter(|s| s.bytes().all(|b| (0x21..0x7f).contains(&b)))
        .ok_or_else(|| {
            Refusal::mismatch(format!(
                "Header mismatch: the {header} header has characters outside visible ASCII"
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(params: &str) -> ParamFacts {
        let raw: Box<RawValue> = serde_json::from_str(params).unwrap();
        ParamFacts::read(Some(&raw))
    }

    const META: &str = r#""_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#;

    fn headers<'a>(v: &'a str, m: &'a str, n: Option<&'a str>) -> MirroredHeaders<'a> {
        MirroredHeaders {
            protocol_version: Some(v.as_bytes()),
            method: Some(m.as_bytes()),
            name: n.map(str::as_bytes),
        }
    }

    #[test]
    fn reads_params() {
        let f = facts(&format!(r#"{{"name":"local__echo","uri":7,{META}}}"#));
        assert!(f.meta_object);
        assert_eq!(f.meta_version, Some(Some("2026-07-28".into())));
        assert!(f.meta_capabilities_object);
        assert_eq!(f.name.as_deref(), Some("local__echo"));
        assert_eq!(f.uri, None);
        let f = facts(r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":5}}"#);
        assert_eq!(f.meta_version, Some(None));
        assert!(!f.meta_capabilities_object);
        assert!(!facts("[1]").meta_object);
        assert!(!facts(r#"{"_meta":[]}"#).meta_object);
    }

    #[test]
    fn a_repeated_key_is_refused_in_every_reading() {
        for params in [
            format!(r#"{{"name":"a","arguments":{{}},"name":"b",{META}}}"#),
            format!(r#"{{"uri":"file:///a","uri":"file:///b",{META}}}"#),
            format!(r#"{{"name":"a",{META},{META}}}"#),
        ] {
            let f = facts(&params);
            assert!(f.repeated_key, "{params}");
            assert!(is_modern(None, &f), "{params}");
            for name in [None, Some("a"), Some("b")] {
                let r = check_modern_request(
                    "tools/call",
                    &f,
                    headers("2026-07-28", "tools/call", name),
                )
                .unwrap_err();
                assert_eq!(
                    (r.status, r.code),
                    (400, jsonrpc::INVALID_PARAMS),
                    "{params}"
                );
                assert!(r.message.contains("repeats a key"), "{}", r.message);
            }
        }
        // Other keys may repeat (the pipeline reads them itself).
        assert!(!facts(&format!(r#"{{"name":"a","x":1,"x":2,{META}}}"#)).repeated_key);
    }

    #[test]
    fn classification() {
        let none = ParamFacts::default();
        let modern = facts(&format!("{{{META}}}"));
        assert!(!is_modern(None, &none));
        assert!(is_modern(None, &modern));
        assert!(!is_modern(Some(b"2025-11-25"), &modern));
        assert!(is_modern(Some(b"2026-07-28"), &none));
        assert!(is_modern(Some(b"v999.0.0"), &none));
    }

    #[test]
    fn modern_checks_in_order() {
        let f = facts(&format!(r#"{{"name":"t",{META}}}"#));
        assert_eq!(
            check_modern_request(
                "tools/call",
                &f,
                headers("2026-07-28", "tools/call", Some("t"))
            ),
            Ok("2026-07-28")
        );
        // Whitespace around the value was trimmed by the request reader; inner case counts.
        let r = check_modern_request(
            "tools/call",
            &f,
            headers("2026-07-28", "TOOLS/CALL", Some("t")),
        )
        .unwrap_err();
        assert_eq!((r.status, r.code), (400, HEADER_MISMATCH));
        let r = check_modern_request(
            "tools/call",
            &f,
            MirroredHeaders {
                method: None,
                ..headers("2026-07-28", "", Some("t"))
            },
        )
        .unwrap_err();
        assert_eq!(r.code, HEADER_MISMATCH);
        let r = check_modern_request(
            "tools/call",
            &f,
            headers("2026-07-28", "tools/call", Some("u")),
        )
        .unwrap_err();
        assert_eq!(r.code, HEADER_MISMATCH);
        let r = check_modern_request("tools/call", &f, headers("2026-07-28", "tools/call", None))
            .unwrap_err();
        assert_eq!(r.code, HEADER_MISMATCH);
        // Missing _meta fields: -32602.
        for params in [
            r#"{}"#,
            r#"{"_meta":{"io.modelcontextprotocol/clientCapabilities":{}}}"#,
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28"}}"#,
        ] {
            let r = check_modern_request(
                "server/discover",
                &facts(params),
                headers("2026-07-28", "server/discover", None),
            )
            .unwrap_err();
            assert_eq!(
                (r.status, r.code),
                (400, jsonrpc::INVALID_PARAMS),
                "{params}"
            );
        }
        // Body and header versions disagree: -32020 before "unsupported".
        let odd = facts(
            r#"{"_meta":{"io.modelcontextprotocol/protocolVersion":"v999.0.0","io.modelcontextprotocol/clientCapabilities":{}}}"#,
        );
        let r = check_modern_request(
            "server/discover",
            &odd,
            headers("2026-07-28", "server/discover", None),
        )
        .unwrap_err();
        assert_eq!(r.code, HEADER_MISMATCH);
        let r = check_modern_request(
            "server/discover",
            &odd,
            headers("v999.0.0", "server/discover", None),
        )
        .unwrap_err();
        assert_eq!((r.status, r.code), (400, UNSUPPORTED_PROTOCOL_VERSION));
        let data = r.data.unwrap();
        assert_eq!(data["requested"], "v999.0.0");
        assert_eq!(data["supported"][0], "2026-07-28");
        // Mcp-Name only where the method defines it.
        let f = facts(&format!(r#"{{{META}}}"#));
        assert!(
            check_modern_request(
                "tools/list",
                &f,
                headers("2026-07-28", "tools/list", Some("whatever"))
            )
            .is_ok()
        );
        let r = check_modern_request(
            "tools/call",
            &f,
            headers("2026-07-28", "tools/call", Some("x")),
        )
        .unwrap_err();
        assert_eq!(r.code, HEADER_MISMATCH);
        let f = facts(&format!(r#"{{"uri":"file:///a b",{META}}}"#));
        assert!(
            check_modern_request(
                "resources/read",
                &f,
                headers("2026-07-28", "resources/read", Some("file:///a b"))
            )
            .is_ok()
        );
    }

    #[test]
    fn mirrored_values() {
        assert_eq!(decode_mirrored_value(b"us-west1").unwrap(), "us-west1");
        assert_eq!(
            decode_mirrored_value(b"=?base64?SGVsbG8=?=").unwrap(),
            "Hello"
        );
        assert_eq!(
            decode_mirrored_value(b"=?base64?SGVsbG8sIOS4lueVjA==?=").unwrap(),
            "Hello, 世界"
        );
        assert!(
            decode_mirrored_value(b"=?base64?SGVsbG8?=").is_err(),
            "missing padding"
        );
        assert!(decode_mirrored_value(b"=?base64?SGVs!!!bG8=?=").is_err());
        // Without both markers the value is literal.
        assert_eq!(
            decode_mirrored_value(b"=?base64?SGVsbG8=").unwrap(),
            "=?base64?SGVsbG8="
        );
        assert_eq!(decode_mirrored_value(b"SGVsbG8=").unwrap(), "SGVsbG8=");
        assert!(decode_mirrored_value("héllo".as_bytes()).is_err());
        assert!(decode_mirrored_value(b"a\x01b").is_err());
    }

    #[test]
    fn discover_lists_every_version() {
        let d = discover_result("x");
        let versions: Vec<&str> = d["supportedVersions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_str().unwrap())
            .collect();
        assert_eq!(versions[0], "2026-07-28");
        assert!(versions.contains(&"2025-11-25"));
        assert!(d["capabilities"]["tools"].get("listChanged").is_none());
    }
}
