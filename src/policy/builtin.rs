//! The built-in rules: the lowest layer, loaded unless `[policy] builtin_rules = false`.
//! Each can be replaced or disabled by id with `override = true` (see the README). They
//! block only what no agent should pass around: PEM private keys.

/// Written in the same TOML as any config, so they are read and checked by the same code.
pub const BUILTIN_RULES_TOML: &str = r#"
[[policy.rules]]
id = "builtin-private-key-in-arguments"
action = "block"
arg = { matches = "-----BEGIN [A-Z0-9 ]*PRIVATE KEY" }
reason = "a private key in the arguments of a request for a server"

[[policy.rules]]
id = "builtin-private-key-in-result"
action = "block"
phase = "response"
result = { matches = "-----BEGIN [A-Z0-9 ]*PRIVATE KEY" }
reason = "a private key in an answer from a server (result or error)"
"#;

/// Where built-in rules say they come from.
pub const BUILTIN_ORIGIN: &str = "built-in rules";
