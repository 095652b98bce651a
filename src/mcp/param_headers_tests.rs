use super::*;
use serde_json::json;

fn region_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "region": {"type": "string", "x-mcp-header": "Region"},
            "query": {"type": "string"},
            "opts": {"type": "object", "properties": {
                "limit": {"type": "integer", "x-mcp-header": "Limit"},
                "dry": {"type": "boolean", "x-mcp-header": "Dry-Run"}
            }}
        },
        "required": ["region"]
    })
}

fn headers<'a>(
    list: &'a [(&'a str, &'a str)],
) -> impl Iterator<Item = (&'a str, &'a [u8])> + Clone {
    list.iter().map(|(n, v)| (*n, v.as_bytes()))
}

fn judge(args: Value, list: &[(&str, &str)]) -> Result<(), String> {
    let b = bindings(Some(&region_schema())).unwrap();
    check(&b, Some(&args), headers(list))
}

#[test]
fn bindings_follow_properties_chains() {
    let b = bindings(Some(&region_schema())).unwrap();
    let mut found: Vec<_> = b
        .iter()
        .map(|b| (b.path.join("."), b.header.clone(), b.kind))
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        found,
        vec![
            ("opts.dry".into(), "dry-run".into(), ParamType::Boolean),
            ("opts.limit".into(), "limit".into(), ParamType::Integer),
            ("region".into(), "region".into(), ParamType::String),
        ]
    );
    assert_eq!(bindings(None).unwrap(), vec![]);
    // A property called x-mcp-header, and an x-mcp-header inside a default: no binding.
    let s = json!({"properties": {"x-mcp-header": {"type": "string"},
        "a": {"type": "object", "default": {"x-mcp-header": "A"}}}});
    assert_eq!(bindings(Some(&s)).unwrap(), vec![]);
}

#[test]
fn annotations_the_spec_forbids_refuse_the_tool() {
    let bad = [
        json!({"properties": {"a": {"type": "string", "x-mcp-header": ""}}}),
        json!({"properties": {"a": {"type": "string", "x-mcp-header": "Bad Name"}}}),
        json!({"properties": {"a": {"type": "string", "x-mcp-header": "A:B"}}}),
        json!({"properties": {"a": {"type": "string", "x-mcp-header": "A\r\nX-Evil: 1"}}}),
        json!({"properties": {"a": {"type": "string", "x-mcp-header": 7}}}),
        json!({"properties": {"a": {"type": "number", "x-mcp-header": "A"}}}),
        json!({"properties": {"a": {"type": "object", "x-mcp-header": "A"}}}),
        json!({"properties": {"a": {"x-mcp-header": "A"}}}),
        // Case-insensitively twice.
        json!({"properties": {"a": {"type": "string", "x-mcp-header": "Region"},
                              "b": {"type": "string", "x-mcp-header": "REGION"}}}),
        // Not reached through properties alone.
        json!({"properties": {"a": {"type": "array", "items": {"type": "string", "x-mcp-header": "A"}}}}),
        json!({"oneOf": [{"properties": {"a": {"type": "string", "x-mcp-header": "A"}}}]}),
        json!({"$defs": {"d": {"type": "string", "x-mcp-header": "A"}}}),
        json!({"type": "string", "x-mcp-header": "Root"}),
    ];
    for s in bad {
        assert!(bindings(Some(&s)).is_err(), "accepted {s}");
    }
    let mut many = serde_json::Map::new();
    for i in 0..=MAX_BINDINGS {
        many.insert(
            format!("p{i}"),
            json!({"type": "string", "x-mcp-header": format!("P{i}")}),
        );
    }
    assert!(bindings(Some(&json!({"properties": many}))).is_err());
}

#[test]
fn matching_headers_pass() {
    let args = json!({"region": "us-west1", "opts": {"limit": 42, "dry": false}});
    judge(
        args.clone(),
        &[
            ("mcp-param-region", "us-west1"),
            ("mcp-param-limit", "42"),
            ("mcp-param-dry-run", "false"),
            ("mcp-param-unknown", "whatever"),
            ("content-type", "application/json"),
        ],
    )
    .unwrap();
    // Base64 of the UTF-8 value; a value of the sentinel's shape travels encoded.
    judge(
        json!({"region": "Hello, 世界"}),
        &[("mcp-param-region", "=?base64?SGVsbG8sIOS4lueVjA==?=")],
    )
    .unwrap();
    // Without the full sentinel the value is literal.
    judge(
        json!({"region": "=?base64?SGVsbG8="}),
        &[("mcp-param-region", "=?base64?SGVsbG8=")],
    )
    .unwrap();
    // Omitted or null: no header expected.
    judge(json!({"query": "x"}), &[]).unwrap();
    judge(json!({"region": null}), &[]).unwrap();
    check(&[], None, headers(&[("mcp-param-region", "x")])).unwrap();
}

#[test]
fn missing_malformed_or_different_headers_are_refused() {
    type Case<'a> = (Value, &'a [(&'a str, &'a str)], &'a str);
    let cases: &[Case] = &[
        (json!({"region": "us"}), &[], "required"),
        (
            json!({"query": "q"}),
            &[("mcp-param-region", "us")],
            "no region",
        ),
        (
            json!({"region": "us"}),
            &[("mcp-param-region", "eu")],
            "does not match",
        ),
        (
            json!({"region": "Hello"}),
            &[("mcp-param-region", "=?base64?SGVsbG8?=")],
            "base64",
        ),
        (
            json!({"region": "Hello"}),
            &[("mcp-param-region", "=?base64?SGVs!!!bG8=?=")],
            "base64",
        ),
        (
            json!({"region": "é"}),
            &[("mcp-param-region", "\u{e9}")],
            "visible ASCII",
        ),
        (
            json!({"region": "a\u{1}"}),
            &[("mcp-param-region", "a\u{1}")],
            "visible ASCII",
        ),
        (
            json!({"region": "us"}),
            &[("mcp-param-region", "us"), ("mcp-param-region", "us")],
            "more than once",
        ),
        // The header decodes to the value, but the body holds another type.
        (
            json!({"region": 5}),
            &[("mcp-param-region", "5")],
            "not the string",
        ),
        (
            json!({"region": "x", "opts": {"limit": "42"}}),
            &[("mcp-param-region", "x"), ("mcp-param-limit", "42")],
            "not the integer",
        ),
        (
            json!({"region": "x", "opts": {"limit": 9007199254740993u64}}),
            &[
                ("mcp-param-region", "x"),
                ("mcp-param-limit", "9007199254740993"),
            ],
            "not the integer",
        ),
        (
            json!({"region": "x", "opts": {"limit": i64::MIN}}),
            &[("mcp-param-region", "x"), ("mcp-param-limit", "0")],
            "not the integer",
        ),
        (
            json!({"region": "x", "opts": {"dry": true}}),
            &[("mcp-param-region", "x"), ("mcp-param-dry-run", "True")],
            "does not match",
        ),
        (
            json!({"region": "x", "opts": {"limit": 7}}),
            &[("mcp-param-region", "x"), ("mcp-param-limit", "07")],
            "does not match",
        ),
    ];
    for (args, list, why) in cases {
        let err = judge(args.clone(), list).expect_err(&format!("accepted {args} with {list:?}"));
        assert!(err.starts_with("Header mismatch"), "{err}");
        assert!(err.contains(why), "{args} {list:?}: {err}");
    }
}

#[test]
fn refusals_never_quote_the_header_value() {
    let err = judge(
        json!({"region": "us"}),
        &[("mcp-param-region", "sk-secret-looking-value")],
    )
    .unwrap_err();
    assert!(!err.contains("sk-secret"), "{err}");
}

#[test]
fn mirrored_values_follow_the_bindings() {
    let b = bindings(Some(&region_schema())).unwrap();
    let mut m = mirrored(
        &b,
        Some(&json!({"region": "eu", "opts": {"limit": 3, "dry": true}, "query": "q"})),
    );
    m.sort();
    assert_eq!(
        m,
        vec![
            ("dry-run".to_owned(), "true".to_owned()),
            ("limit".to_owned(), "3".to_owned()),
            ("region".to_owned(), "eu".to_owned())
        ]
    );
    // Absent, null or of another type: no header.
    assert!(mirrored(&b, Some(&json!({"region": null, "opts": {"limit": "3"}}))).is_empty());
    assert!(mirrored(&b, None).is_empty());
}
