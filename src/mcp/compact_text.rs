//! Is a JSON text the compact serialization of itself? The ledger keeps the arguments as
//! they arrived and, when they differ, what went upstream as well (toolwall forwards its
//! own serialization of what policy judged). Whitespace between tokens is the common
//! difference (Python's `json.dumps` puts a space after every `:` and `,`) and carries no
//! meaning: the compact text follows from the arrived one by dropping it, so a second copy
//! would be a ledger page per call that proves nothing.

use serde_json::Value;

/// toolwall's own compact serialization of `value`. serde_json's writer fills a byte
/// buffer directly; `Value`'s `Display` (what `to_string()` uses) formats through
/// `fmt::Write` piece by piece into a `String` grown from empty, which cost the gateway
/// ~4% of its CPU at 64 calls in flight (the judged arguments and every answer).
pub fn compact(value: &Value) -> String {
    // A `Value` always serializes: its keys are strings and its numbers finite.
    serde_json::to_string(value).unwrap_or_default()
}

/// True when `arrived` is `compact` with only insignificant whitespace (space, tab, CR,
/// LF outside strings, RFC 8259 §2) added. Any other difference — escapes, key order,
/// number spellings, duplicate keys — is a difference.
pub fn same_but_whitespace(arrived: &str, compact: &str) -> bool {
    if arrived.len() == compact.len() {
        // No whitespace can have been added: one memcmp decides.
        return arrived == compact;
    }
    let mut want = compact.bytes();
    let mut in_string = false;
    let mut escaped = false;
    for b in arrived.bytes() {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
        } else if matches!(b, b' ' | b'\t' | b'\n' | b'\r') {
            continue;
        } else if b == b'"' {
            in_string = true;
        }
        if want.next() != Some(b) {
            return false;
        }
    }
    want.next().is_none()
}

#[cfg(test)]
mod tests {
    use super::same_but_whitespace;

    #[test]
    fn whitespace_between_tokens_is_no_difference() {
        for (arrived, compact) in [
            (r#"{"a":1}"#, r#"{"a":1}"#),
            (r#"{"a": 1, "b": [1, 2]}"#, r#"{"a":1,"b":[1,2]}"#),
            ("{\n\t\"a\" :\r\n 1 }\n", r#"{"a":1}"#),
            (r#" {} "#, "{}"),
        ] {
            assert!(same_but_whitespace(arrived, compact), "{arrived:?}");
        }
    }

    #[test]
    fn every_other_difference_is_one() {
        for (arrived, compact) in [
            // Whitespace inside a string is content.
            (r#"{"a":"x y"}"#, r#"{"a":"xy"}"#),
            (r#"{"a":"x"}"#, r#"{"a":"x y"}"#),
            // An escaped quote does not end the string: the space after it is content.
            (r#"{"a":"\" x"}"#, r#"{"a":"\"x"}"#),
            // Escapes, key order, duplicates, numbers.
            (r#"{"a":"\u0041"}"#, r#"{"a":"A"}"#),
            (r#"{"b":1,"a":2}"#, r#"{"a":2,"b":1}"#),
            (r#"{"a":1,"a":2}"#, r#"{"a":2}"#),
            (r#"{"a":1.0}"#, r#"{"a":1}"#),
            // A prefix either way.
            (r#"{"a":1}"#, r#"{"a":1}}"#),
            (r#"{"a":1}}"#, r#"{"a":1}"#),
            ("", "{}"),
        ] {
            assert!(!same_but_whitespace(arrived, compact), "{arrived:?}");
        }
    }

    #[test]
    fn what_serde_writes_matches_a_spaced_copy_of_itself() {
        let value = serde_json::json!({"text": "a \"quoted\" \\ word", "n": [1, -2.5, null]});
        let compact = value.to_string();
        let spaced = serde_json::to_string_pretty(&value).unwrap();
        assert!(same_but_whitespace(&spaced, &compact));
        assert!(same_but_whitespace(&compact, &compact));
    }
}
