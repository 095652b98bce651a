//! The fields of a listed definition whose type or values the MCP schema fixes, checked
//! before it is served. A client that validates what it receives (the official Python
//! SDK's pydantic models, for one) refuses a whole `tools/list`, `resources/list` or
//! `resources/templates/list` answer for one bad item in it, so one hostile server could
//! otherwise take every server's tools away from such a client. A definition that fails
//! is not served and is said once in the log (`unservable`), naming the field.
//!
//! The tables follow the schema of the protocol versions toolwall serves (2025-11-25 and
//! 2026-07-28: `Tool`, `Prompt`, `PromptArgument`, `Resource`, `ResourceTemplate`, `Icon`,
//! `ToolAnnotations`, `ToolExecution`, `Annotations`); where they differ the stricter one
//! holds, since either kind of client may be behind toolwall. Only fields the schema
//! names are checked: anything else a server adds is allowed by the spec and passed as it
//! is. The key fields (`name` of tools and prompts, `uri`, `uriTemplate`) are checked by
//! the listing already.

use serde_json::Value;

use super::Kind;
use crate::aggregator::error::quote_upstream;

/// The largest float that is still an exact whole number (2^53).
const MAX_EXACT_FLOAT: f64 = 9_007_199_254_740_992.0;

/// What a field must be.
#[derive(Debug, Clone, Copy)]
enum Shape {
    Text,
    Bool,
    Object,
    Array,
    /// A JSON Schema: an object or a boolean.
    Schema,
    /// One of these strings.
    OneOf(&'static [&'static str]),
    /// A number from 0 to 1.
    Unit,
    /// A whole number, not negative.
    Count,
}

impl Shape {
    fn fits(self, v: &Value) -> bool {
        match self {
            Shape::Text => v.is_string(),
            Shape::Bool => v.is_boolean(),
            Shape::Object => v.is_object(),
            Shape::Array => v.is_array(),
            Shape::Schema => v.is_object() || v.is_boolean(),
            Shape::OneOf(words) => v.as_str().is_some_and(|s| words.contains(&s)),
            Shape::Unit => v.as_f64().is_some_and(|n| (0.0..=1.0).contains(&n)),
            // An integer toolwall serves as one: a float is a count only while it is exact
            // (2^53); beyond, or beyond u64 (which toolwall reads as a float), a client's
            // integer parser refuses it, and the whole listing with it.
            Shape::Count => {
                v.is_u64()
                    || v.as_f64()
                        .is_some_and(|n| (0.0..=MAX_EXACT_FLOAT).contains(&n) && n.fract() == 0.0)
            }
        }
    }

    fn problem(self) -> String {
        match self {
            Shape::Text => "is not a string".into(),
            Shape::Bool => "is not true or false".into(),
            Shape::Object => "is not an object".into(),
            Shape::Array => "is not an array".into(),
            Shape::Schema => "is not a schema (an object or a boolean)".into(),
            Shape::OneOf(words) => {
                let words: Vec<String> = words.iter().map(|w| format!("\"{w}\"")).collect();
                format!("is not one of {}", words.join(", "))
            }
            Shape::Unit => "is not a number from 0 to 1".into(),
            Shape::Count => "is not a whole number of bytes".into(),
        }
    }
}

/// One checked field: its path from the definition (`/`-separated; `*` is every element
/// of an array or every value of an object), what it must be, and whether it must be there
/// when what holds it is. Parents come before their fields: the first failure is named.
struct Field {
    path: &'static str,
    shape: Shape,
    required: bool,
}

const fn opt(path: &'static str, shape: Shape) -> Field {
    Field {
        path,
        shape,
        required: false,
    }
}

const fn req(path: &'static str, shape: Shape) -> Field {
    Field {
        path,
        shape,
        required: true,
    }
}

/// `BaseMetadata` (every kind; `name` is the key of tools and prompts, checked by the
/// listing) and the `description` every kind has.
const TEXT: &[Field] = &[
    // Display name for people.
    opt("title", Shape::Text),
    // What the model reads to choose the item.
    opt("description", Shape::Text),
    // Free-form metadata: `MetaObject`, a record.
    opt("_meta", Shape::Object),
];

/// `Icons`: `icons?: Icon[]` (tools, prompts, resources, templates).
const ICONS: &[Field] = &[
    opt("icons", Shape::Array),
    opt("icons/*", Shape::Object),
    // The icon's URI (http(s) or data:).
    req("icons/*/src", Shape::Text),
    // MIME type override.
    opt("icons/*/mimeType", Shape::Text),
    // "48x48", "any": an array of strings.
    opt("icons/*/sizes", Shape::Array),
    opt("icons/*/sizes/*", Shape::Text),
    // The background the icon is drawn for.
    opt("icons/*/theme", Shape::OneOf(&["light", "dark"])),
];

/// `Annotations` of resources and templates.
const ANNOTATIONS: &[Field] = &[
    opt("annotations", Shape::Object),
    // `Role[]`.
    opt("annotations/audience", Shape::Array),
    opt(
        "annotations/audience/*",
        Shape::OneOf(&["user", "assistant"]),
    ),
    // Importance, 0 (optional) to 1 (required).
    opt("annotations/priority", Shape::Unit),
    // An ISO 8601 time, as a string.
    opt("annotations/lastModified", Shape::Text),
];

const TOOL: &[Field] = &[
    // Tool arguments are always a JSON object: `type: "object"` is required at the root.
    req("inputSchema", Shape::Object),
    req("inputSchema/type", Shape::OneOf(&["object"])),
    // The JSON Schema dialect's URI.
    opt("inputSchema/$schema", Shape::Text),
    // Property name -> schema (2025-11-25 types it: an object of schemas).
    opt("inputSchema/properties", Shape::Object),
    opt("inputSchema/properties/*", Shape::Schema),
    // Names of required properties.
    opt("inputSchema/required", Shape::Array),
    opt("inputSchema/required/*", Shape::Text),
    // The same for the result's structured content; 2025-11-25 requires `type: "object"`.
    opt("outputSchema", Shape::Object),
    req("outputSchema/type", Shape::OneOf(&["object"])),
    opt("outputSchema/$schema", Shape::Text),
    opt("outputSchema/properties", Shape::Object),
    opt("outputSchema/properties/*", Shape::Schema),
    opt("outputSchema/required", Shape::Array),
    opt("outputSchema/required/*", Shape::Text),
    // `ToolAnnotations`: a display title and four boolean hints.
    opt("annotations", Shape::Object),
    opt("annotations/title", Shape::Text),
    opt("annotations/readOnlyHint", Shape::Bool),
    opt("annotations/destructiveHint", Shape::Bool),
    opt("annotations/idempotentHint", Shape::Bool),
    opt("annotations/openWorldHint", Shape::Bool),
    // `ToolExecution` (2025-11-25): whether calls may run as tasks.
    opt("execution", Shape::Object),
    opt(
        "execution/taskSupport",
        Shape::OneOf(&["forbidden", "optional", "required"]),
    ),
];

const PROMPT: &[Field] = &[
    // `PromptArgument[]`.
    opt("arguments", Shape::Array),
    opt("arguments/*", Shape::Object),
    // What a client sends the value under.
    req("arguments/*/name", Shape::Text),
    opt("arguments/*/title", Shape::Text),
    opt("arguments/*/description", Shape::Text),
    // Whether a client must send it.
    opt("arguments/*/required", Shape::Bool),
];

/// Resources and templates: `name` is required (`BaseMetadata`); the key is the URI.
const RESOURCE_COMMON: &[Field] = &[
    req("name", Shape::Text),
    // The MIME type of the content, if known.
    opt("mimeType", Shape::Text),
];

const RESOURCE: &[Field] = &[
    // Size of the raw content in bytes.
    opt("size", Shape::Count),
];

/// The tables of `kind`, in order.
fn tables(kind: Kind) -> &'static [&'static [Field]] {
    match kind {
        Kind::Tools => &[TEXT, ICONS, TOOL],
        Kind::Prompts => &[TEXT, ICONS, PROMPT],
        Kind::Resources => &[TEXT, RESOURCE_COMMON, RESOURCE, ICONS, ANNOTATIONS],
        Kind::Templates => &[TEXT, RESOURCE_COMMON, ICONS, ANNOTATIONS],
    }
}

/// The first field of `item` (a definition of `kind`) that is not what the MCP schema
/// says, as the reason it is not served (`its \`icons[0].theme\` is not one of …`); `None`
/// when every checked field fits. `item` must be an object (checked before).
pub fn mismatch(kind: Kind, item: &Value) -> Option<String> {
    let mut at = Vec::new();
    tables(kind)
        .iter()
        .flat_map(|t| t.iter())
        .find_map(|field| check(item, field, field.path.split('/'), &mut at))
}

/// One step of the path walked, shown only when a field fails (nothing is allocated for
/// a definition that fits).
enum Step<'a> {
    Field(&'static str),
    Index(usize),
    Key(&'a str),
}

/// Check `field` at the `steps` left below `v`; `at` is the path walked to `v`.
fn check<'a>(
    v: &'a Value,
    field: &Field,
    mut steps: std::str::Split<'static, char>,
    at: &mut Vec<Step<'a>>,
) -> Option<String> {
    let Some(step) = steps.next() else {
        return (!field.shape.fits(v))
            .then(|| format!("its `{}` {}", shown(at), field.shape.problem()));
    };
    if step == "*" {
        // The holder's own entry checked its type; anything else is walked past.
        let why = match v {
            Value::Array(a) => a.iter().enumerate().find_map(|(i, v)| {
                at.push(Step::Index(i));
                let why = check(v, field, steps.clone(), at);
                at.pop();
                why
            }),
            Value::Object(m) => m.iter().find_map(|(k, v)| {
                at.push(Step::Key(k));
                let why = check(v, field, steps.clone(), at);
                at.pop();
                why
            }),
            _ => None,
        };
        return why;
    }
    let Value::Object(map) = v else {
        return None;
    };
    at.push(Step::Field(step));
    let last = steps.clone().next().is_none();
    let why = match map.get(step) {
        Some(v) => check(v, field, steps, at),
        None if field.required && last => Some(format!(
            "its `{}` is missing (the MCP schema requires it)",
            shown(at)
        )),
        None => None,
    };
    at.pop();
    why
}

/// `icons[0].sizes`, `inputSchema.properties["q"]` (a key is the server's: escaped, cut).
fn shown(at: &[Step]) -> String {
    let mut out = String::new();
    for step in at {
        match step {
            Step::Field(f) if out.is_empty() => out.push_str(f),
            Step::Field(f) => {
                out.push('.');
                out.push_str(f);
            }
            Step::Index(i) => out.push_str(&format!("[{i}]")),
            Step::Key(k) => out.push_str(&format!("[\"{}\"]", quote_upstream(k, 64))),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool(extra: Value) -> Value {
        let mut t = json!({"name": "t", "inputSchema": {"type": "object"}});
        for (k, v) in extra.as_object().unwrap() {
            t[k] = v.clone();
        }
        t
    }

    #[test]
    fn fields_the_schema_fixes_are_checked_for_every_kind() {
        let bad_tools = [
            (
                json!({"execution": {"taskSupport": "bogus"}}),
                "execution.taskSupport",
            ),
            (json!({"execution": "x"}), "execution"),
            (json!({"icons": "https://x/i.png"}), "icons"),
            (
                json!({"icons": [{"src": "s", "sizes": "48x48"}]}),
                "icons[0].sizes",
            ),
            (
                json!({"icons": [{"src": "s", "sizes": [48]}]}),
                "icons[0].sizes[0]",
            ),
            (
                json!({"icons": [{"src": "s"}, {"src": "s", "theme": "bright"}]}),
                "icons[1].theme",
            ),
            (json!({"icons": [{"src": {"u": 1}}]}), "icons[0].src"),
            (
                json!({"icons": [{"mimeType": "image/png"}]}),
                "icons[0].src",
            ),
            (json!({"_meta": "str"}), "_meta"),
            (
                json!({"inputSchema": {"type": "array"}}),
                "inputSchema.type",
            ),
            (json!({"inputSchema": {}}), "inputSchema.type"),
            (
                json!({"inputSchema": {"type": "object", "required": "q"}}),
                "inputSchema.required",
            ),
            (
                json!({"inputSchema": {"type": "object", "properties": {"q\u{202e}": 5}}}),
                "inputSchema.properties[\"q\\u{202e}\"]",
            ),
            (
                json!({"outputSchema": {"type": "string"}}),
                "outputSchema.type",
            ),
            (json!({"outputSchema": {}}), "outputSchema.type"),
            (
                json!({"annotations": {"readOnlyHint": "maybe"}}),
                "annotations.readOnlyHint",
            ),
            (
                json!({"annotations": {"openWorldHint": 1}}),
                "annotations.openWorldHint",
            ),
            (json!({"title": null}), "title"),
        ];
        for (extra, field) in bad_tools {
            let why = mismatch(Kind::Tools, &tool(extra.clone()))
                .unwrap_or_else(|| panic!("{extra} passed"));
            assert!(
                why.starts_with(&format!("its `{field}` ")),
                "{extra}: {why}"
            );
        }
        let no_schema = json!({"name": "t"});
        let why = mismatch(Kind::Tools, &no_schema).unwrap();
        assert_eq!(
            why,
            "its `inputSchema` is missing (the MCP schema requires it)"
        );

        let res = |extra: Value| {
            let mut r = json!({"uri": "x://a", "name": "a"});
            for (k, v) in extra.as_object().unwrap() {
                r[k] = v.clone();
            }
            r
        };
        for (extra, field) in [
            (
                json!({"annotations": {"priority": "high"}}),
                "annotations.priority",
            ),
            (
                json!({"annotations": {"priority": 1.5}}),
                "annotations.priority",
            ),
            (
                json!({"annotations": {"audience": ["robot"]}}),
                "annotations.audience[0]",
            ),
            (
                json!({"annotations": {"audience": "user"}}),
                "annotations.audience",
            ),
            (
                json!({"annotations": {"lastModified": 5}}),
                "annotations.lastModified",
            ),
            (json!({"size": "12"}), "size"),
            (json!({"size": 1.5}), "size"),
            (json!({"size": -1}), "size"),
            // Counts a client's integer parser refuses (atk9 F1: the SDK refused every
            // server's resources for one of these): floats past 2^53, and integers past
            // u64, which toolwall reads as floats.
            (json!({"size": 1e300}), "size"),
            (json!({"size": 1e19}), "size"),
            (json!({"size": 9.3e18}), "size"),
            (
                serde_json::from_str::<Value>(r#"{"size": 18446744073709551616}"#).unwrap(),
                "size",
            ),
            (json!({"mimeType": ["text/plain"]}), "mimeType"),
            (json!({"name": 5}), "name"),
        ] {
            for kind in [Kind::Resources, Kind::Templates] {
                if kind == Kind::Templates && field == "size" {
                    continue;
                }
                let why = mismatch(kind, &res(extra.clone()))
                    .unwrap_or_else(|| panic!("{kind:?} {extra} passed"));
                assert!(
                    why.starts_with(&format!("its `{field}` ")),
                    "{extra}: {why}"
                );
            }
        }
        assert!(
            mismatch(Kind::Resources, &json!({"uri": "x://a"})).is_some(),
            "no name"
        );
        for (p, field) in [
            (json!({"name": "p", "arguments": {"a": 1}}), "arguments"),
            (
                json!({"name": "p", "arguments": [{"description": "d"}]}),
                "arguments[0].name",
            ),
            (
                json!({"name": "p", "arguments": [{"name": "a", "required": "yes"}]}),
                "arguments[0].required",
            ),
            (
                json!({"name": "p", "icons": [{"src": "s", "theme": "x"}]}),
                "icons[0].theme",
            ),
        ] {
            let why = mismatch(Kind::Prompts, &p).unwrap_or_else(|| panic!("{p} passed"));
            assert!(why.starts_with(&format!("its `{field}` ")), "{p}: {why}");
        }
    }

    #[test]
    fn what_the_schema_allows_passes_and_extra_fields_are_free() {
        let t = json!({"name": "t", "title": "T", "description": "d",
            "inputSchema": {"type": "object", "$schema": "https://json-schema.org/draft/2020-12/schema",
                "properties": {"q": {"type": "string"}, "any": true}, "required": ["q"],
                "additionalProperties": false, "x-vendor": [1, 2]},
            "outputSchema": {"type": "object", "properties": {"r": {"type": "number"}}},
            "annotations": {"title": "a", "readOnlyHint": true, "destructiveHint": false,
                "idempotentHint": true, "openWorldHint": false, "x-extra": "anything"},
            "execution": {"taskSupport": "optional"},
            "icons": [{"src": "data:image/png;base64,AA", "mimeType": "image/png",
                "sizes": ["48x48", "any"], "theme": "dark"}],
            "_meta": {"io.example/x": [1]}, "vendorField": {"a": null}});
        assert_eq!(mismatch(Kind::Tools, &t), None);
        let r = json!({"uri": "x://a", "name": "a", "mimeType": "text/plain", "size": 12,
            "annotations": {"audience": ["user", "assistant"], "priority": 0,
                "lastModified": "2025-01-12T15:00:58Z"}, "other": 5});
        assert_eq!(mismatch(Kind::Resources, &r), None);
        let r =
            json!({"uri": "x://a", "name": "a", "size": 12.0, "annotations": {"priority": 0.5}});
        assert_eq!(mismatch(Kind::Resources, &r), None);
        let p = json!({"name": "p", "arguments": [{"name": "a", "required": true, "title": "A"}]});
        assert_eq!(mismatch(Kind::Prompts, &p), None);
        let tpl = json!({"uriTemplate": "x://{id}", "name": "x", "mimeType": "text/plain"});
        assert_eq!(mismatch(Kind::Templates, &tpl), None);
    }
}
