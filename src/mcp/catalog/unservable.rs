//! Items the catalog refuses to serve: tools whose `x-mcp-header` annotations break the
//! spec (a client must not offer such a tool), definitions whose identifiers or schema
//! data hide characters or whose fields are not what the MCP schema says (`served_text`,
//! `spec_shape`), and definitions nested too deep (`listing`). Each is said once in the
//! log, naming the server, the item and the reason, escaped (the server's parts come from
//! the server).
//!
//! A server lists the same items again and again: a refusal is not logged again while
//! it stays in the server's listings. What was said is remembered per server and kind,
//! for the last listing reviewed and the one under review ([`listing_reviewed`] turns the
//! page): a refusal that goes from a listing and comes back is said again. The bound is
//! per server and kind too, so a server that floods its listing with refused items
//! silences only its own further lines, never another server's: at most
//! [`MAX_UNSERVABLE_LOGGED`] refusal lines per server and kind in [`LOG_WINDOW`] (a server
//! that renames its refused items at every listing would otherwise get that many lines
//! per relisting, once a second), then one line with how many more there are (at most
//! once a window, and only when that number changed). A refusal not logged for the
//! bound is said in a later window if it is still listed then. Each
//! refusal is remembered by a keyed hash of its text (8 bytes, not the text), and at most
//! [`MAX_LISTINGS_REMEMBERED`] (server, kind) memories are kept.
//!
//! The bounds are constants, not config keys: they only decide how many distinct refusal
//! lines are logged (the items are refused whatever they are), and the catalog that calls
//! [`note_item`] is built without the config in reach.

use std::collections::{HashMap, HashSet};
use std::hash::{BuildHasher, RandomState};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::Kind;
use crate::aggregator::error::quote_upstream;

/// Distinct refusals logged for one listing of one server and kind; beyond this many, one
/// line says how many more are not logged (the items are still refused). Documented in
/// the README; a fixed bound, see the module comment.
pub const MAX_UNSERVABLE_LOGGED: usize = 1024;
/// (server, kind) memories kept (64 servers' four kinds); past it one is forgotten, at
/// worst its refusals are said once more. Memory: at most this many times two sets of
/// [`MAX_UNSERVABLE_LOGGED`] 8-byte hashes (4 MiB), for that many servers with refusals.
pub const MAX_LISTINGS_REMEMBERED: usize = 256;
/// The time over which [`MAX_UNSERVABLE_LOGGED`] lines (and one "more" line) of a server
/// and kind may be logged.
pub const LOG_WINDOW: Duration = Duration::from_secs(600);
/// Characters of a server's tool name and of the reason kept in the line.
const QUOTED_CHARS: usize = 200;

/// What was said of one server's listings of one kind.
#[derive(Default)]
struct Said {
    /// Refusals of the last listing reviewed, said (or found said) then.
    before: HashSet<u64>,
    /// Refusals of the listing under review, said or found in `before`.
    now: HashSet<u64>,
    /// Refusals of the listing under review not logged (past the bound).
    unsaid: usize,
    /// `unsaid` as the last "more are not logged" line said it (0: none said).
    unsaid_told: usize,
    /// When the current [`LOG_WINDOW`] began (None: no line yet).
    window_start: Option<Instant>,
    /// Refusal lines logged in the current window.
    logged_in_window: usize,
    /// A "more are not logged" line was said in the current window.
    told_in_window: bool,
}

impl Said {
    /// Start a new window when the current one is over.
    fn roll(&mut self, now: Instant) {
        let over = self
            .window_start
            .is_none_or(|start| now.saturating_duration_since(start) >= LOG_WINDOW);
        if over {
            self.window_start = Some(now);
            self.logged_in_window = 0;
            self.told_in_window = false;
        }
    }
}

struct Memory {
    /// The hasher's random keys (a server cannot pick names that collide with one said
    /// before and so silence its line).
    keys: RandomState,
    said: HashMap<(String, Kind), Said>,
}

static MEMORY: Mutex<Option<Memory>> = Mutex::new(None);

fn with_memory<T>(f: impl FnOnce(&mut Memory) -> T) -> T {
    let mut m = MEMORY.lock().unwrap_or_else(|p| p.into_inner());
    f(m.get_or_insert_with(Memory::new))
}

impl Memory {
    fn new() -> Memory {
        Memory {
            keys: RandomState::new(),
            said: HashMap::new(),
        }
    }

    /// Whether the refusal of `what` for `why` in `server`'s listing of `kind` is to be
    /// logged now.
    fn note(&mut self, server: &str, kind: Kind, what: &str, why: &str, now: Instant) -> bool {
        let key = self.keys.hash_one((what, why));
        let at = (server.to_owned(), kind);
        if !self.said.contains_key(&at) && self.said.len() >= MAX_LISTINGS_REMEMBERED {
            let gone = self.said.keys().next().cloned();
            if let Some(gone) = gone {
                self.said.remove(&gone);
            }
        }
        let s = self.said.entry(at).or_default();
        if s.now.contains(&key) {
            return false;
        }
        if s.now.len() >= MAX_UNSERVABLE_LOGGED {
            s.unsaid += 1;
            return false;
        }
        if s.before.contains(&key) {
            s.now.insert(key);
            return false;
        }
        s.roll(now);
        if s.logged_in_window >= MAX_UNSERVABLE_LOGGED {
            s.unsaid += 1;
            return false;
        }
        s.logged_in_window += 1;
        s.now.insert(key);
        true
    }

    /// Turn the page after a listing; how many refusals went unlogged, when that is to be
    /// said (it changed).
    fn reviewed(&mut self, server: &str, kind: Kind, now: Instant) -> Option<usize> {
        let s = self.said.get_mut(&(server.to_owned(), kind))?;
        s.before = std::mem::take(&mut s.now);
        let unsaid = std::mem::take(&mut s.unsaid);
        s.roll(now);
        if unsaid == s.unsaid_told || s.told_in_window {
            return None;
        }
        s.unsaid_told = unsaid;
        if unsaid == 0 {
            return None;
        }
        s.told_in_window = true;
        Some(unsaid)
    }

    fn forget(&mut self, server: &str) {
        self.said.retain(|(s, _), _| s != server);
    }
}

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
        Kind::Tools,
        &format!("tool {:?}", quote_upstream(tool, QUOTED_CHARS)),
        &format!(
            "its x-mcp-header annotations are invalid ({})",
            quote_upstream(why, QUOTED_CHARS)
        ),
    );
}

/// The refusal of an item of `kind` named `name` (see `served_text::unservable`).
pub fn note_item(server: &str, kind: Kind, name: &str, why: &str) {
    let word = match kind {
        Kind::Tools => "tool",
        Kind::Prompts => "prompt",
        Kind::Resources => "resource",
        Kind::Templates => "resource template",
    };
    note(
        server,
        kind,
        &format!("{word} {:?}", quote_upstream(name, QUOTED_CHARS)),
        why,
    );
}

/// Log the refusal of `what` of `server`, unless it was said already.
fn note(server: &str, kind: Kind, what: &str, why: &str) {
    if with_memory(|m| m.note(server, kind, what, why, Instant::now())) {
        crate::warn!("{}", line(server, what, why));
    }
}

/// A listing of `server`'s `kind` was reviewed (every refusal in it noted): what it
/// refused is what the next one is compared with, and the line on refusals not logged is
/// said when their number changed.
pub fn listing_reviewed(server: &str, kind: Kind) {
    let unsaid = with_memory(|m| m.reviewed(server, kind, Instant::now()));
    if let Some(n) = unsaid {
        crate::warn!(
            "server {}: {n} more {} of its listing are not served (invalid x-mcp-header annotations, hiding characters in what an agent sends back, fields that are not what the MCP schema says, nesting too deep); at most {MAX_UNSERVABLE_LOGGED} are logged in {} minutes, the rest are not",
            quote_upstream(server, QUOTED_CHARS),
            kind.word(),
            LOG_WINDOW.as_secs() / 60,
        );
    }
}

/// Forget a server (removed by a reload).
pub fn forget(server: &str) {
    with_memory(|m| m.forget(server));
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

    fn remembered(m: &Memory, server: &str) -> (usize, usize, usize) {
        let s = &m.said[&(server.to_owned(), Kind::Tools)];
        (s.before.len(), s.now.len(), s.unsaid)
    }

    #[test]
    fn what_is_remembered_is_bounded_and_small() {
        let long = "t".repeat(100_000);
        for n in 0..MAX_UNSERVABLE_LOGGED + 10 {
            let name = format!("{n}{long}");
            note_item("bounded", Kind::Tools, &name, "why");
            note_item("bounded", Kind::Tools, &name, "why");
        }
        listing_reviewed("bounded", Kind::Tools);
        let mut m = Memory::new();
        let t = Instant::now();
        for n in 0..MAX_UNSERVABLE_LOGGED + 10 {
            assert_eq!(
                m.note("s", Kind::Tools, &n.to_string(), "why", t),
                n < MAX_UNSERVABLE_LOGGED
            );
            assert!(!m.note("s", Kind::Tools, &n.to_string(), "why", t));
        }
        // Past the bound nothing is remembered: each noting is counted.
        assert_eq!(remembered(&m, "s"), (0, MAX_UNSERVABLE_LOGGED, 20));
        assert_eq!(m.reviewed("s", Kind::Tools, t), Some(20));
        assert_eq!(remembered(&m, "s"), (MAX_UNSERVABLE_LOGGED, 0, 0));
        for n in 0..2 * MAX_LISTINGS_REMEMBERED {
            m.note(&format!("many{n}"), Kind::Prompts, "p", "why", t);
        }
        assert_eq!(m.said.len(), MAX_LISTINGS_REMEMBERED);
    }

    #[test]
    fn one_server_flooding_leaves_another_servers_refusals_said() {
        let mut m = Memory::new();
        let t = Instant::now();
        let flood = |m: &mut Memory, at: Instant| {
            (0..MAX_UNSERVABLE_LOGGED + 50)
                .filter(|n| m.note("flooder", Kind::Tools, &format!("t{n}"), "why", at))
                .count()
        };
        assert_eq!(flood(&mut m, t), MAX_UNSERVABLE_LOGGED);
        assert_eq!(
            remembered(&m, "flooder").2,
            50,
            "its own lines past the bound"
        );
        assert!(
            m.note("other", Kind::Tools, "late", "why", t),
            "another server's is said"
        );
        assert_eq!(m.reviewed("flooder", Kind::Tools, t), Some(50));
        // The same listing again: no line, and the "more" line is not said again.
        assert_eq!(flood(&mut m, t), 0);
        assert_eq!(m.reviewed("flooder", Kind::Tools, t), None);
        // The flood gone: a new refusal waits for the next window (this one's lines are
        // spent), then is said; one that comes back is said again.
        assert!(!m.note("flooder", Kind::Tools, "after", "why", t));
        assert_eq!(
            m.reviewed("flooder", Kind::Tools, t),
            None,
            "told once a window"
        );
        let later = t + LOG_WINDOW;
        assert!(m.note("flooder", Kind::Tools, "after", "why", later));
        assert_eq!(m.reviewed("flooder", Kind::Tools, later), None);
        assert!(m.note("flooder", Kind::Tools, "t0", "why", later));
        assert!(!m.note("flooder", Kind::Tools, "after", "why", later));
        m.forget("flooder");
        assert!(!m.said.contains_key(&("flooder".to_owned(), Kind::Tools)));
        assert!(m.said.contains_key(&("other".to_owned(), Kind::Tools)));
    }

    /// A server that renames its refused items at every listing gets at most
    /// MAX_UNSERVABLE_LOGGED lines and one "more" line per window, however often it is
    /// listed. (Failed before: every relisting logged MAX_UNSERVABLE_LOGGED lines anew.)
    #[test]
    fn a_server_renaming_its_refusals_at_every_listing_is_bounded_over_time() {
        let mut m = Memory::new();
        let t = Instant::now();
        let (mut lines, mut more) = (0, 0);
        for listing in 0..20 {
            let at = t + Duration::from_secs(listing);
            lines += (0..MAX_UNSERVABLE_LOGGED)
                .filter(|n| m.note("rot", Kind::Tools, &format!("l{listing}-{n}"), "why", at))
                .count();
            more += usize::from(m.reviewed("rot", Kind::Tools, at).is_some());
        }
        assert_eq!((lines, more), (MAX_UNSERVABLE_LOGGED, 1));
        // The next window: its lines again.
        let next = t + LOG_WINDOW + Duration::from_secs(20);
        let said = (0..10)
            .filter(|n| m.note("rot", Kind::Tools, &format!("n{n}"), "why", next))
            .count();
        assert_eq!(said, 10);
    }
}
