//! Items the catalog refuses to serve: tools whose `x-mcp-header` annotations break the
//! spec (a client must not offer such a tool), and definitions whose identifiers or
//! schema data hide characters or whose text fields are not text (`served_text`). Each
//! is said once in the log, naming the server, the item and the reason, escaped (the
//! server's parts come from the server). A server lists the same tools again and again; the same refusal is not
//! logged again, and the memory of what was said is bounded: at most
//! [`MAX_UNSERVABLE_LOGGED`] refusals, each remembered by a keyed hash of its text (a
//! server's tool names and reasons can be long; 8 bytes each are kept, not their text).
//!
//! The bound is a constant, not a config key: it only decides how many distinct refusal
//! lines are logged (the tools are refused whatever it is), it costs at most 8 KiB, and
//! the catalog that calls [`note`] is built without the config in reach.

use std::collections::HashSet;
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;

use crate::aggregator::error::quote_upstream;

/// Distinct (server, tool, reason) refusals remembered so each is logged once; beyond
/// this many, one line says further refusals go unlogged (the tools are still refused).
/// Documented in the README (x-mcp-header); a fixed bound, see the module comment.
pub const MAX_UNSERVABLE_LOGGED: usize = 1024;
/// Characters of a server's tool name and of the reason kept in the line.
const QUOTED_CHARS: usize = 200;

/// The hashes of the refusals said, with the hasher's random keys (so a server cannot
/// pick names that collide with one said before and so silence its line).
static SAID: Mutex<Option<(RandomState, HashSet<u64>)>> = Mutex::new(None);

/// The log line for `what` (`tool "name"`) of `server`, refused for `why` (toolwall's own
/// words; what came from the server in it already quoted).
pub fn line(server: &str, what: &str, why: &str) -> String {
    format!(
        "server {}: {what} is not served: {why}",
        quote_upstream(server, QUOTED_CHARS),
    )
}

/// The refusal of a tool whose `x-mcp-header` annotations are invalid (`why` from the
/// server's schema).
pub fn note_headers(server: &str, tool: &str, why: &str) {
    note(
        server,
        &format!("tool {:?}", quote_upstream(tool, QUOTED_CHARS)),
        &format!(
            "its x-mcp-header annotations are invalid ({})",
            quote_upstream(why, QUOTED_CHARS)
        ),
    );
}

/// The refusal of an item of `kind` named `name` (see `served_text::unservable`).
pub fn note_item(server: &str, kind: super::Kind, name: &str, why: &str) {
    let kind = match kind {
        super::Kind::Tools => "tool",
        super::Kind::Prompts => "prompt",
        super::Kind::Resources => "resource",
        super::Kind::Templates => "resource template",
    };
    note(
        server,
        &format!("{kind} {:?}", quote_upstream(name, QUOTED_CHARS)),
        why,
    );
}

/// Log the refusal of `what` of `server`, unless it was said already.
fn note(server: &str, what: &str, why: &str) {
    let mut said = SAID.lock().unwrap_or_else(|p| p.into_inner());
    let (keys, said) = said.get_or_insert_with(|| (RandomState::new(), HashSet::new()));
    let key = keys.hash_one((server, what, why));
    if said.contains(&key) {
        return;
    }
    match said.len() {
        n if n < MAX_UNSERVABLE_LOGGED => {
            crate::warn!("{}", line(server, what, why));
            said.insert(key);
        }
        n if n == MAX_UNSERVABLE_LOGGED => {
            crate::warn!(
                "more tools, prompts or resources are not served (invalid x-mcp-header annotations, hiding characters in what an agent sends back, text fields that are not text); {MAX_UNSERVABLE_LOGGED} were logged, the rest are not"
            );
            said.insert(key);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_names_server_and_tool_escaped() {
        let l = line(
            "gh",
            &format!(
                "tool {:?}",
                quote_upstream("evil\u{1b}[2Jtool", QUOTED_CHARS)
            ),
            &format!(
                "its x-mcp-header annotations are invalid ({})",
                quote_upstream("header \"A\r\nX\" is invalid", QUOTED_CHARS)
            ),
        );
        assert!(l.starts_with("server gh: tool "), "{l}");
        assert!(
            !l.contains('\u{1b}') && !l.contains('\r') && !l.contains('\n'),
            "{l}"
        );
        assert!(l.contains("x-mcp-header"), "{l}");
    }

    #[test]
    fn what_is_remembered_is_bounded_and_small() {
        let long = "t".repeat(100_000);
        for n in 0..MAX_UNSERVABLE_LOGGED + 10 {
            let name = format!("{n}{long}");
            note_item("bounded", super::super::Kind::Tools, &name, "why");
            note_item("bounded", super::super::Kind::Tools, &name, "why");
        }
        let said = SAID.lock().unwrap();
        let (_, said) = said.as_ref().unwrap();
        // One past the bound: the line that says the rest go unlogged.
        assert_eq!(said.len(), MAX_UNSERVABLE_LOGGED + 1);
    }
}
