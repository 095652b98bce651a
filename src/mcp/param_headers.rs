//! Tool parameters that also travel as HTTP headers (2026-07-28, `x-mcp-header`): which
//! parameters of a tool's `inputSchema` are header-bound, and whether a `tools/call`'s
//! `Mcp-Param-{Name}` headers agree with its arguments. Pure: the HTTP door asks the
//! catalog for a tool's bindings and judges the request with [`check`].
//!
//! A binding is valid only as the spec defines it: a non-empty `tchar` token, unique
//! (case-insensitively) within the tool, on a `string`, `integer` or `boolean` property
//! reached from the schema root through `properties` keys alone. A tool with any other
//! `x-mcp-header` is refused by [`bindings`] (the catalog does not serve it, as the spec asks
//! of a client), so a binding an agent could not mirror is never enforced.

use serde_json::Value;

/// The annotation key in a property's schema.
pub const ANNOTATION: &str = "x-mcp-header";
/// The prefix of the header a binding travels in (lowercase, as the request reader keeps
/// header names).
pub const HEADER_PREFIX: &str = "mcp-param-";
/// Most bindings one tool may declare: a bound on the work of judging one call (every
/// binding is a header the client must send, so no real tool comes near it).
pub const MAX_BINDINGS: usize = 32;
/// Longest header name suffix accepted (`Mcp-Param-` + this stays a short header name).
pub const MAX_NAME_CHARS: usize = 64;
/// Deepest `properties` chain a binding may sit at.
const MAX_DEPTH: usize = 16;
/// Largest integer both sides represent exactly (JavaScript's safe range).
const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// The primitive type a bound parameter has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ParamType {
    String,
    Integer,
    Boolean,
}

/// One header-bound parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// The `properties` keys from the arguments' root to the parameter.
    pub path: Vec<String>,
    /// The header name suffix, lowercase (header names compare case-insensitively).
    pub header: String,
    pub kind: ParamType,
}

/// The header-bound parameters of a tool, from its `inputSchema` (absent: none). An error
/// names the first annotation the spec does not allow.
pub fn bindings(input_schema: Option<&Value>) -> Result<Vec<Binding>, String> {
    let mut out = Vec::new();
    if let Some(schema) = input_schema {
        walk(schema, Some(&mut Vec::new()), 0, &mut out)?;
    }
    Ok(out)
}

/// Walk one schema. `path` is `Some` while the schema is reached through `properties`
/// keys alone (an annotation is allowed there), `None` below anything else.
fn walk(
    schema: &Value,
    mut path: Option<&mut Vec<String>>,
    depth: usize,
    out: &mut Vec<Binding>,
) -> Result<(), String> {
    let Value::Object(map) = schema else {
        if let Value::Array(items) = schema {
            for item in items {
                walk(item, None, depth + 1, out)?;
            }
        }
        return Ok(());
    };
    if depth > MAX_DEPTH * 4 {
        // serde_json's own nesting limit stops far sooner; this keeps the walk bounded
        // for a tree built another way.
        return Err("the inputSchema nests too deeply".into());
    }
    if let Some(annotation) = map.get(ANNOTATION) {
        let Some(path) = path.as_deref() else {
            return Err(format!(
                "{ANNOTATION} is allowed only on a property reached through properties keys"
            ));
        };
        out.push(binding(annotation, path, map.get("type"))?);
        if out.len() > MAX_BINDINGS {
            return Err(format!("more than {MAX_BINDINGS} {ANNOTATION} annotations"));
        }
        let name = &out[out.len() - 1].header;
        if out[..out.len() - 1].iter().any(|b| &b.header == name) {
            return Err(format!("{ANNOTATION} {name:?} appears twice"));
        }
    }
    for (key, value) in map {
        match key.as_str() {
            // Instance data, not schemas: an "x-mcp-header" key there is a value.
            "default" | "const" | "enum" | "examples" | ANNOTATION => {}
            "properties" => {
                let Value::Object(props) = value else {
                    continue;
                };
                for (name, sub) in props {
                    match path.as_deref_mut() {
                        Some(p) if p.len() < MAX_DEPTH => {
                            p.push(name.clone());
                            let r = walk(sub, Some(p), depth + 1, out);
                            p.pop();
                            r?;
                        }
                        _ => walk(sub, None, depth + 1, out)?,
                    }
                }
            }
            _ => walk(value, None, depth + 1, out)?,
        }
    }
    Ok(())
}

fn binding(annotation: &Value, path: &[String], kind: Option<&Value>) -> Result<Binding, String> {
    let shown = path.join(".");
    let Some(name) = annotation.as_str() else {
        return Err(format!("{ANNOTATION} of {shown:?} is not a string"));
    };
    if name.is_empty() || name.len() > MAX_NAME_CHARS || !name.bytes().all(is_tchar) {
        return Err(format!(
            "{ANNOTATION} of {shown:?} must be 1 to {MAX_NAME_CHARS} header-name characters"
        ));
    }
    if path.is_empty() {
        return Err(format!("{ANNOTATION} on the schema root"));
    }
    let kind = match kind.and_then(Value::as_str) {
        Some("string") => ParamType::String,
        Some("integer") => ParamType::Integer,
        Some("boolean") => ParamType::Boolean,
        _ => {
            return Err(format!(
                "{ANNOTATION} of {shown:?} is on a parameter that is not a string, integer or boolean"
            ));
        }
    };
    Ok(Binding {
        path: path.to_vec(),
        header: name.to_ascii_lowercase(),
        kind,
    })
}

/// RFC 9110 `tchar`.
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Check a call's `Mcp-Param-*` headers (`headers`: every request header as (lowercase
/// name, trimmed value)) against its `arguments` for the tool's `bindings`. Headers no
/// binding names are not ours to judge and pass. An error says what is wrong, to be
/// answered with 400 and `-32020`; it never quotes a value (a header value may be a
/// credential the client should not have sent).
pub fn check<'h>(
    bindings: &[Binding],
    arguments: Option<&Value>,
    headers: impl Iterator<Item = (&'h str, &'h [u8])> + Clone,
) -> Result<(), String> {
    for b in bindings {
        let mut sent = headers.clone().filter(|(name, _)| {
            name.strip_prefix(HEADER_PREFIX)
                .is_some_and(|suffix| suffix == b.header)
        });
        let header = sent.next().map(|(_, v)| v);
        if sent.next().is_some() {
            return Err(format!(
                "Header mismatch: the Mcp-Param-{} header appears more than once",
                b.header
            ));
        }
        let body = lookup(arguments, &b.path).filter(|v| !v.is_null());
        let shown = b.path.join(".");
        let (header, body) = match (header, body) {
            (None, None) => continue,
            (None, Some(_)) => {
                return Err(format!(
                    "Header mismatch: the Mcp-Param-{} header is required when the arguments have {shown}",
                    b.header
                ));
            }
            (Some(_), None) => {
                return Err(format!(
                    "Header mismatch: an Mcp-Param-{} header was sent but the arguments have no {shown}",
                    b.header
                ));
            }
            (Some(h), Some(v)) => (h, v),
        };
        // The value came within the request head (bounded by http.max_head_bytes), so its
        // decoded form is bounded too; it is decoded only here, once.
        let decoded = crate::transport::http::era::decode_mirrored_value(header)
            .map_err(|why| format!("Header mismatch: Mcp-Param-{}: {why}", b.header))?;
        let Some(expected) = header_text(b.kind, body) else {
            return Err(format!(
                "Header mismatch: the argument {shown} is not the {} its Mcp-Param-{} header mirrors",
                kind_word(b.kind),
                b.header
            ));
        };
        if decoded != expected {
            return Err(format!(
                "Header mismatch: the Mcp-Param-{} header does not match the argument {shown}",
                b.header
            ));
        }
    }
    Ok(())
}

/// What a client sends for `bindings` given the `arguments` it calls with: (header name
/// suffix, value as text, before the header encoding). Values absent, null or not of the
/// bound type are left out (a server that checks refuses the call, as it would any
/// client's).
pub fn mirrored(bindings: &[Binding], arguments: Option<&Value>) -> Vec<(String, String)> {
    bindings
        .iter()
        .filter_map(|b| {
            let value = lookup(arguments, &b.path).filter(|v| !v.is_null())?;
            Some((b.header.clone(), header_text(b.kind, value)?))
        })
        .collect()
}

fn lookup<'v>(arguments: Option<&'v Value>, path: &[String]) -> Option<&'v Value> {
    path.iter()
        .try_fold(arguments?, |v, key| v.as_object()?.get(key))
}

/// The text a header carries for a body value of the bound type (the spec's encoding),
/// `None` when the body value is not of that type.
fn header_text(kind: ParamType, value: &Value) -> Option<String> {
    match (kind, value) {
        (ParamType::String, Value::String(s)) => Some(s.clone()),
        (ParamType::Boolean, Value::Bool(b)) => Some(b.to_string()),
        (ParamType::Integer, Value::Number(n)) => {
            let i = n.as_i64().or_else(|| {
                n.as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() <= MAX_SAFE_INTEGER as f64)
                    .map(|f| f as i64)
            })?;
            (-MAX_SAFE_INTEGER..=MAX_SAFE_INTEGER)
                .contains(&i)
                .then(|| i.to_string())
        }
        _ => None,
    }
}

fn kind_word(kind: ParamType) -> &'static str {
    match kind {
        ParamType::String => "string",
        ParamType::Integer => "integer",
        ParamType::Boolean => "boolean",
    }
}

#[cfg(test)]
#[path = "param_headers_tests.rs"]
mod tests;
