//! What one upstream server's listing may hold: items per kind, bytes of the whole listing,
//! pages. The worker stops reading a listing the moment it goes over (so its memory is
//! bounded by one page plus the listing so far); the gateway checks again before the catalog
//! takes anything. A listing over budget is refused whole: the server is marked degraded
//! with the reason and keeps its last good catalog.
//!
//! Each limit has a `[servers]` default and a per-server override in `[servers.NAME]`; the
//! key that applied travels with the budget, so a refusal names the key to change.

use serde::{Deserialize, Serialize};

use crate::mcp::catalog::Kind;

/// Default of `[servers] max_tools`.
pub const DEFAULT_MAX_TOOLS: usize = 10_000;
/// Default of `[servers] max_resources`.
pub const DEFAULT_MAX_RESOURCES: usize = 10_000;
/// Default of `[servers] max_prompts`.
pub const DEFAULT_MAX_PROMPTS: usize = 10_000;
/// Default of `[servers] max_resource_templates`.
pub const DEFAULT_MAX_RESOURCE_TEMPLATES: usize = 1_000;
/// Default of `[servers] max_listing_bytes`: the bytes of the items of one listing, every
/// page together.
pub const DEFAULT_MAX_LISTING_BYTES: usize = 8 * 1024 * 1024;
/// Largest `max_listing_bytes`: a listing travels to the gateway as one worker message.
pub const MAX_LISTING_BYTES_LIMIT: usize = 15 * 1024 * 1024;
/// Default of `[servers] max_pages`: pages of one listing followed (cursors).
pub const DEFAULT_MAX_PAGES: usize = 100;
/// Longest cursor an upstream may hand back (it is kept to detect a loop).
pub const MAX_CURSOR_BYTES: usize = 4096;

/// The budget of one listing of one server, with the config key of each limit.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ListingBudget {
    pub max_items: usize,
    pub items_key: String,
    pub max_bytes: usize,
    pub bytes_key: String,
    pub max_pages: usize,
    pub pages_key: String,
}

impl ListingBudget {
    /// A budget whose keys are the `[servers]` defaults (tests, tools).
    pub fn plain(max_items: usize, max_bytes: usize, max_pages: usize) -> ListingBudget {
        ListingBudget {
            max_items,
            items_key: "servers.max_items".into(),
            max_bytes,
            bytes_key: "servers.max_listing_bytes".into(),
            max_pages,
            pages_key: "servers.max_pages".into(),
        }
    }
}

/// The configured limits of one server (after `[servers]` defaults and its own overrides).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerBudget {
    pub max_tools: usize,
    pub max_resources: usize,
    pub max_prompts: usize,
    pub max_resource_templates: usize,
    pub max_listing_bytes: usize,
    pub max_pages: usize,
    /// Which of the above came from the server's own table (for the key names).
    pub own: [bool; 6],
}

impl ServerBudget {
    /// The budget of a listing of `kind` from `server`.
    pub fn listing(&self, server: &str, kind: Kind) -> ListingBudget {
        let (index, max_items, item_key) = match kind {
            Kind::Tools => (0, self.max_tools, "max_tools"),
            Kind::Resources => (1, self.max_resources, "max_resources"),
            Kind::Prompts => (2, self.max_prompts, "max_prompts"),
            Kind::Templates => (3, self.max_resource_templates, "max_resource_templates"),
        };
        let key = |i: usize, name: &str| {
            if self.own[i] {
                format!("servers.{server}.{name}")
            } else {
                format!("servers.{name}")
            }
        };
        ListingBudget {
            max_items,
            items_key: key(index, item_key),
            max_bytes: self.max_listing_bytes,
            bytes_key: key(4, "max_listing_bytes"),
            max_pages: self.max_pages,
            pages_key: key(5, "max_pages"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_where_the_limit_came_from() {
        let b = ServerBudget {
            max_tools: 5,
            max_resources: 6,
            max_prompts: 7,
            max_resource_templates: 8,
            max_listing_bytes: 9,
            max_pages: 10,
            own: [true, false, false, false, false, true],
        };
        let t = b.listing("gh", Kind::Tools);
        assert_eq!(
            (t.max_items, t.items_key.as_str()),
            (5, "servers.gh.max_tools")
        );
        assert_eq!(t.bytes_key, "servers.max_listing_bytes");
        assert_eq!(t.pages_key, "servers.gh.max_pages");
        let r = b.listing("gh", Kind::Templates);
        assert_eq!(
            (r.max_items, r.items_key.as_str()),
            (8, "servers.max_resource_templates")
        );
    }
}
