//! How many JSON nodes a text would become, counted on its bytes before any tree is built
//! (sans-IO). A megabyte of `[{"a":1},...]` is a few hundred thousand values, and a
//! `serde_json::Value` tree of them is a hundred times the text: the count decides before
//! the parse whether the tree may be built at all.
//!
//! A node is a value or an object member: the count is one, plus one per `{`, `[`, `,`
//! and `:` outside strings. It is an upper bound of the values the text holds (a trailing
//! comma or a stray colon counts too, and such text fails its parse anyway).

/// Default of `gateway.max_json_nodes`.
pub const DEFAULT_MAX_JSON_NODES: usize = 100_000;
/// Largest `gateway.max_json_nodes`, and the bound of a local server's host and the
/// aggregator worker, which parse a message before they know the gateway's setting.
pub const MAX_JSON_NODES: usize = 1_000_000;

/// The node count of `text` when it is at most `max`; `Err(more)` as soon as it is beyond
/// (`more` is the count reached, `max + 1`), so an oversized text is not scanned to its end.
pub fn within(text: &[u8], max: usize) -> Result<usize, usize> {
    let mut nodes = 1usize;
    let mut in_string = false;
    let mut escaped = false;
    for &b in text {
        if in_string {
            if escaped {
                escaped = false;
            } else if b == b'\\' {
                escaped = true;
            } else if b == b'"' {
                in_string = false;
            }
            continue;
        }
        match b {
            b'"' => in_string = true,
            b'{' | b'[' | b',' | b':' => {
                nodes += 1;
                if nodes > max {
                    return Err(nodes);
                }
            }
            _ => {}
        }
    }
    Ok(nodes)
}

/// The refusal's words for a text beyond `max` nodes (`key` names the setting).
pub fn too_many(what: &str, max: usize, key: &str) -> String {
    format!("{what} has more than {max} JSON values ({key})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_values_and_members_outside_strings() {
        assert_eq!(within(b"1", 10), Ok(1));
        assert_eq!(within(br#"{"a":1}"#, 10), Ok(3));
        assert_eq!(within(br#"[1,2,3]"#, 10), Ok(4));
        // Brackets, commas, colons and escaped quotes inside strings are text.
        assert_eq!(within(br#""[,:{\"[,""#, 10), Ok(1));
        assert_eq!(within(br#"{"k\\":"v,"}"#, 10), Ok(3));
    }

    #[test]
    fn stops_at_the_bound() {
        let many = format!("[{}0]", "0,".repeat(1000));
        assert_eq!(within(many.as_bytes(), 100), Err(101));
        assert!(within(many.as_bytes(), 2000).is_ok());
        // The count is at least the number of values a parse would build.
        let objs = format!("[{}{{\"a\":1}}]", "{\"a\":1},".repeat(500));
        let n = within(objs.as_bytes(), usize::MAX).unwrap();
        assert!(n > 501 * 2, "{n}");
    }
}
