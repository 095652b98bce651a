//! The built-in HTTP tools `fetch_http`, `grep_http` and `http_headers` (served as
//! `local__…`). They run inside the confined builtin worker; `call_tool` blocks, so the
//! worker runs it on its pool. Where they may connect is decided by `address_policy`
//! before any connection; see README.md in this directory.

mod address_policy;
mod client;
mod config;
mod content;
mod grep;
mod html_convert;
mod html_rebuild;
mod ip_ranges;
mod outcome;
mod redirect;
mod resolver;
mod slice;
mod tools;
mod url_target;

#[cfg(test)]
mod test_server;
#[cfg(test)]
mod tests;

pub use address_policy::{AddressPolicy, AllowEntry};
pub use config::{HttpToolsConfig, tool_ports};
pub use outcome::{ErrorCode, HttpFacts, ToolError, ToolOutcome};
// The aggregator checks and pins upstream addresses with the same parser and resolver.
pub use resolver::{MAX_ADDRESSES_TRIED, PinnedResolver, resolve_name};
pub use tools::{FETCH_HTTP, GREP_HTTP, HTTP_HEADERS};
pub use url_target::{Target, TargetError, TargetHost, parse_target};

/// The MCP `Tool` objects of the HTTP tools (names without the `local__` prefix).
pub fn tool_definitions() -> Vec<serde_json::Value> {
    tools::tool_definitions()
}

/// Run one HTTP tool to completion (blocking: network, then conversion). Every refusal is
/// a result with `isError: true` and a code; the facts are filled in either way.
pub fn call_tool(name: &str, args: &serde_json::Value, cfg: &HttpToolsConfig) -> ToolOutcome {
    let mut facts = HttpFacts::default();
    let result = match tools::run_tool(name, args, cfg, &mut facts) {
        Ok(result) => {
            facts.outcome = "ok".into();
            result
        }
        Err(err) => {
            facts.outcome = err.code.as_str().into();
            outcome::error_result(&err)
        }
    };
    ToolOutcome { result, facts }
}
