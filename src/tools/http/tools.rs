//! The three tools: their MCP definitions, their arguments and what each does with a
//! response.

use base64::Engine;
use serde::Deserialize;
use serde_json::{Value, json};

use super::client::{Answer, Client, Method, read_body};
use super::config::HttpToolsConfig;
use super::content::{BodyKind, charset_param, declared_kind, decode_text, media_type, sniff_kind};
use super::grep::{compile_pattern, grep};
use super::html_convert::{HtmlFormat, convert_html};
use super::outcome::{ErrorCode, HttpFacts, ToolError};
use super::slice::{Window, render_with_note, window};

pub const FETCH_HTTP: &str = "fetch_http";
pub const GREP_HTTP: &str = "grep_http";
pub const HTTP_HEADERS: &str = "http_headers";

const DEFAULT_MAX_LENGTH: usize = 5000;
const DEFAULT_CONTEXT_LINES: usize = 3;
const DEFAULT_MAX_MATCHES: usize = 50;
/// Context lines and matches asked for are clamped to these.
const MAX_CONTEXT_LINES: usize = 100;
const MAX_MATCHES_LIMIT: usize = 10_000;

/// The MCP `Tool` objects, names without the server prefix.
pub fn tool_definitions() -> Vec<Value> {
    let url = json!({"type": "string", "description": "An absolute http:// or https:// URL."});
    let start_index = json!({"type": "integer", "minimum": 0, "default": 0,
        "description": "First character to return (characters, not bytes); use the next start_index a truncated answer gives."});
    let max_length = json!({"type": "integer", "minimum": 1, "default": DEFAULT_MAX_LENGTH,
        "description": "Most characters to return."});
    let annotations = json!({"readOnlyHint": true, "openWorldHint": true});
    vec![
        json!({
            "name": FETCH_HTTP,
            "description": "Fetch a web page or text document over HTTP(S) and return its content: HTML converted to markdown (default) or plain text, or the body as it is (\"raw\"; binary bodies come base64-encoded). Long content is returned in windows: the answer says when more remains and which start_index continues it. Internal and private addresses are refused.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "url": url,
                    "format": {"type": "string", "enum": ["markdown", "text", "raw"], "default": "markdown"},
                    "start_index": start_index,
                    "max_length": max_length,
                },
                "required": ["url"],
                "additionalProperties": false,
            },
            "annotations": annotations,
        }),
        json!({
            "name": GREP_HTTP,
            "description": "Fetch a URL and return the lines matching a regular expression (Rust regex syntax; (?i) for case-insensitive), with context lines, numbered like grep -n: \"N:line\" for a match, \"N-line\" for context, \"--\" between groups. N is the 1-based line number in the page's plain-text rendering for HTML, in the body itself for other text.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "url": url,
                    "pattern": {"type": "string", "description": "A regular expression matched against each line."},
                    "context_lines": {"type": "integer", "minimum": 0, "default": DEFAULT_CONTEXT_LINES},
                    "max_matches": {"type": "integer", "minimum": 1, "default": DEFAULT_MAX_MATCHES},
                    "start_index": start_index,
                    "max_length": max_length,
                },
                "required": ["url", "pattern"],
                "additionalProperties": false,
            },
            "annotations": annotations,
        }),
        json!({
            "name": HTTP_HEADERS,
            "description": "Send a HEAD (default) or GET request and return the status line and response headers, without the body. Redirects are not followed: a 3xx answer is reported with its Location.",
            "inputSchema": {
                "type": "object",
                "properties": {
                    "url": url,
                    "method": {"type": "string", "enum": ["HEAD", "GET"], "default": "HEAD"},
                },
                "required": ["url"],
                "additionalProperties": false,
            },
            "annotations": annotations,
        }),
    ]
}

#[derive(Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default)]
#[serde(rename_all = "lowercase")]
enum Format {
    #[default]
    Markdown,
    Text,
    Raw,
}

impl Format {
    fn as_str(self) -> &'static str {
        match self {
            Format::Markdown => "markdown",
            Format::Text => "text",
            Format::Raw => "raw",
        }
    }
}

fn default_max_length() -> usize {
    DEFAULT_MAX_LENGTH
}
fn default_context_lines() -> usize {
    DEFAULT_CONTEXT_LINES
}
fn default_max_matches() -> usize {
    DEFAULT_MAX_MATCHES
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct FetchArgs {
    url: String,
    #[serde(default)]
    format: Format,
    #[serde(default)]
    start_index: usize,
    #[serde(default = "default_max_length")]
    max_length: usize,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct GrepArgs {
    url: String,
    pattern: String,
    #[serde(default = "default_context_lines")]
    context_lines: usize,
    #[serde(default = "default_max_matches")]
    max_matches: usize,
    #[serde(default)]
    start_index: usize,
    #[serde(default = "default_max_length")]
    max_length: usize,
}

#[derive(Deserialize, Debug, Clone, Copy, Default)]
#[serde(rename_all = "UPPERCASE")]
enum HeadersMethod {
    #[default]
    Head,
    Get,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct HeadersArgs {
    url: String,
    #[serde(default)]
    method: HeadersMethod,
}

fn parse_args<T: serde::de::DeserializeOwned>(args: &Value) -> Result<T, ToolError> {
    T::deserialize(args).map_err(|e| ToolError::new(ErrorCode::InvalidArguments, e.to_string()))
}

fn check_max_length(max_length: usize, cfg: &HttpToolsConfig) -> Result<usize, ToolError> {
    if max_length == 0 {
        return Err(ToolError::new(
            ErrorCode::InvalidArguments,
            "max_length must be at least 1",
        ));
    }
    Ok(max_length.min(cfg.max_output_chars))
}

/// Run one tool. Ok is the success result; the facts are filled in either way.
pub fn run_tool(
    name: &str,
    args: &Value,
    cfg: &HttpToolsConfig,
    facts: &mut HttpFacts,
) -> Result<Value, ToolError> {
    if let Some(url) = args.get("url").and_then(Value::as_str) {
        facts.url = clip(url, cfg.max_url_bytes);
    }
    match name {
        FETCH_HTTP => fetch(parse_args(args)?, cfg, facts),
        GREP_HTTP => grep_tool(parse_args(args)?, cfg, facts),
        HTTP_HEADERS => headers(parse_args(args)?, cfg, facts),
        other => Err(ToolError::new(
            ErrorCode::InvalidArguments,
            format!("no tool named {other:?}"),
        )),
    }
}

/// At most `max` bytes of `s`, cut at a character boundary.
fn clip(s: &str, max: usize) -> String {
    let mut end = s.len().min(max);
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s[..end].to_string()
}

/// The response's content type and what kind of body it declares.
fn content_type(answer: &Answer) -> Option<String> {
    answer
        .response
        .headers()
        .get("content-type")
        .map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

fn require_success(answer: &Answer) -> Result<(), ToolError> {
    let status = answer.response.status();
    if status.is_success() {
        return Ok(());
    }
    Err(ToolError::new(
        ErrorCode::HttpError,
        format!(
            "{} answered {} {}",
            answer.url,
            status.as_u16(),
            status.canonical_reason().unwrap_or("")
        ),
    ))
}

fn binary_refused(ct: Option<&str>) -> ToolError {
    ToolError::new(
        ErrorCode::UnsupportedContent,
        format!(
            "the body is binary ({}); fetch_http with format \"raw\" returns it base64-encoded",
            ct.map(media_type)
                .unwrap_or_else(|| "undeclared type".into())
        ),
    )
}

/// A fetched body as text for `format`, with notes on how it was read.
struct Readable {
    text: String,
    kind: BodyKind,
    base64: bool,
    flattened: bool,
    charset_note: Option<String>,
}

fn fetch_readable(
    url: &str,
    format: Format,
    cfg: &HttpToolsConfig,
    facts: &mut HttpFacts,
) -> Result<(Readable, Answer, Option<String>), ToolError> {
    let client = Client::new(cfg)?;
    let mut answer = client.send(url, Method::Get, true, facts)?;
    require_success(&answer)?;
    let ct = content_type(&answer);
    let declared = declared_kind(ct.as_deref());
    if declared == Some(BodyKind::Binary) && format != Format::Raw {
        return Err(binary_refused(ct.as_deref()));
    }
    let body = read_body(&mut answer, cfg)?;
    let kind = declared.unwrap_or_else(|| sniff_kind(&body));
    if kind == BodyKind::Binary && format != Format::Raw {
        return Err(binary_refused(ct.as_deref()));
    }
    let charset = ct.as_deref().and_then(charset_param);
    let mut readable = Readable {
        text: String::new(),
        kind,
        base64: false,
        flattened: false,
        charset_note: None,
    };
    if kind == BodyKind::Binary {
        readable.text = base64::engine::general_purpose::STANDARD.encode(&body);
        readable.base64 = true;
        return Ok((readable, answer, ct));
    }
    let (text, unknown_charset) = decode_text(&body, charset.as_deref());
    drop(body);
    readable.charset_note =
        unknown_charset.map(|c| format!("charset {c:?} is not supported; read as UTF-8"));
    readable.text = match (kind, format) {
        (BodyKind::Html, Format::Markdown | Format::Text) => {
            let html_format = if format == Format::Markdown {
                HtmlFormat::Markdown
            } else {
                HtmlFormat::Text
            };
            let converted = convert_html(&text, html_format, cfg.max_html_depth)?;
            readable.flattened = converted.flattened;
            converted.text
        }
        _ => text,
    };
    Ok((readable, answer, ct))
}

fn window_or_error<'t>(
    text: &'t str,
    start: usize,
    max_length: usize,
) -> Result<Window<'t>, ToolError> {
    window(text, start, max_length).ok_or_else(|| {
        ToolError::new(
            ErrorCode::InvalidArguments,
            format!(
                "start_index {start} is past the end ({} characters)",
                text.chars().count()
            ),
        )
    })
}

fn fetch(
    args: FetchArgs,
    cfg: &HttpToolsConfig,
    facts: &mut HttpFacts,
) -> Result<Value, ToolError> {
    let max_length = check_max_length(args.max_length, cfg)?;
    let (readable, answer, ct) = fetch_readable(&args.url, args.format, cfg, facts)?;
    let w = window_or_error(&readable.text, args.start_index, max_length)?;
    let mut text = String::new();
    if readable.base64 {
        text.push_str(&format!(
            "[Binary body ({}), base64-encoded.]\n",
            ct.as_deref()
                .map(media_type)
                .unwrap_or_else(|| "undeclared type".into())
        ));
    }
    text.push_str(&render_with_note(&w, FETCH_HTTP));
    if let Some(note) = &readable.charset_note {
        text.push_str(&format!("\n[{note}]"));
    }
    let structured = json!({
        "url": args.url,
        "final_url": answer.url,
        "status": answer.response.status().as_u16(),
        "content_type": ct,
        "format": args.format.as_str(),
        "body_kind": kind_name(readable.kind),
        "encoding": if readable.base64 { "base64" } else { "text" },
        "start_index": w.start,
        "returned_chars": w.len,
        "total_chars": w.total,
        "truncated": w.next_start().is_some(),
        "next_start_index": w.next_start(),
        "html_flattened": readable.flattened,
        "charset_note": readable.charset_note,
    });
    Ok(super::outcome::success_result(text, structured))
}

fn kind_name(kind: BodyKind) -> &'static str {
    match kind {
        BodyKind::Html => "html",
        BodyKind::Text => "text",
        BodyKind::Binary => "binary",
    }
}

fn grep_tool(
    args: GrepArgs,
    cfg: &HttpToolsConfig,
    facts: &mut HttpFacts,
) -> Result<Value, ToolError> {
    let max_length = check_max_length(args.max_length, cfg)?;
    if args.max_matches == 0 {
        return Err(ToolError::new(
            ErrorCode::InvalidArguments,
            "max_matches must be at least 1",
        ));
    }
    // Compile before fetching: a bad pattern costs no request.
    let re = compile_pattern(&args.pattern, cfg.max_pattern_chars)
        .map_err(|m| ToolError::new(ErrorCode::InvalidArguments, m))?;
    let (readable, answer, _) = fetch_readable(&args.url, Format::Text, cfg, facts)?;
    let context = args.context_lines.min(MAX_CONTEXT_LINES);
    let max_matches = args.max_matches.min(MAX_MATCHES_LIMIT);
    let report = grep(
        &readable.text,
        &re,
        context,
        max_matches,
        cfg.max_grep_line_chars,
    );
    let w = window_or_error(&report.output, args.start_index, max_length)?;
    let numbered = if readable.kind == BodyKind::Html {
        "1-based line numbers of the page's plain-text rendering"
    } else {
        "1-based line numbers of the body"
    };
    let mut text = if report.matches == 0 {
        format!("No line of {} lines matches.", report.lines)
    } else {
        render_with_note(&w, GREP_HTTP)
    };
    if report.more_matches {
        text.push_str(&format!(
            "\n[Stopped after {} matching lines; more lines match.]",
            report.matches
        ));
    }
    let structured = json!({
        "url": args.url,
        "final_url": answer.url,
        "status": answer.response.status().as_u16(),
        "pattern": args.pattern,
        "matches": report.matches,
        "more_matches": report.more_matches,
        "lines": report.lines,
        "line_numbers": numbered,
        "context_lines": context,
        "start_index": w.start,
        "returned_chars": w.len,
        "total_chars": w.total,
        "truncated": w.next_start().is_some(),
        "next_start_index": w.next_start(),
        "html_flattened": readable.flattened,
    });
    Ok(super::outcome::success_result(text, structured))
}

fn headers(
    args: HeadersArgs,
    cfg: &HttpToolsConfig,
    facts: &mut HttpFacts,
) -> Result<Value, ToolError> {
    let client = Client::new(cfg)?;
    let method = match args.method {
        HeadersMethod::Head => Method::Head,
        HeadersMethod::Get => Method::Get,
    };
    // The body of a GET is never read: dropping the response closes the connection.
    let answer = client.send(&args.url, method, false, facts)?;
    let status = answer.response.status();
    let mut text = format!(
        "{:?} {} {}\n",
        answer.response.version(),
        status.as_u16(),
        status.canonical_reason().unwrap_or("")
    );
    let mut list = Vec::new();
    for (name, value) in answer.response.headers() {
        let value = String::from_utf8_lossy(value.as_bytes()).into_owned();
        text.push_str(&format!("{}: {}\n", name.as_str(), value));
        list.push(json!([name.as_str(), value]));
    }
    let structured = json!({
        "url": args.url,
        "method": if method == Method::Head { "HEAD" } else { "GET" },
        "status": status.as_u16(),
        "reason": status.canonical_reason(),
        "http_version": format!("{:?}", answer.response.version()),
        "headers": list,
    });
    Ok(super::outcome::success_result(text, structured))
}
