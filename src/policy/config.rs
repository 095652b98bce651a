//! The `[policy]` table as the operator (and the corp config) writes it. These types only
//! carry what the TOML says; `rule.rs` and `layers.rs` validate and compile them.

use serde::de::{self, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::marker::PhantomData;
use std::path::PathBuf;

/// Default seconds an `ask` waits for a human before it is denied.
pub const DEFAULT_ASK_TIMEOUT_SECS: u64 = 120;
/// Largest `ask_timeout_secs` accepted (a week): a deadline must stay representable.
pub const MAX_ASK_TIMEOUT_SECS: u64 = 7 * 24 * 3600;
/// Default compiled-size limit of one regex (`matches`), in bytes.
pub const DEFAULT_MAX_REGEX_BYTES: usize = 2 * 1024 * 1024;

/// The operator's `[policy]` table.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields, default)]
pub struct PolicyConfig {
    /// Verdict when no rule decides. Not set: the corp config's, else `allow`.
    pub default: Option<Verdict>,
    /// Seconds an `ask` waits for a human before it is denied.
    pub ask_timeout_secs: u64,
    /// The corp config file. `TOOLWALL_CORP_CONFIG`, when set and non-empty, wins over it.
    pub corp: Option<PathBuf>,
    /// Whether the built-in rules are loaded (each can also be overridden by id).
    pub builtin_rules: bool,
    /// Compiled-size limit of one regex, in bytes; a larger pattern is a config fault.
    pub max_regex_bytes: usize,
    /// `[[policy.rules]]`.
    pub rules: Vec<RuleConfig>,
}

impl Default for PolicyConfig {
    fn default() -> Self {
        PolicyConfig {
            default: None,
            ask_timeout_secs: DEFAULT_ASK_TIMEOUT_SECS,
            corp: None,
            builtin_rules: true,
            max_regex_bytes: DEFAULT_MAX_REGEX_BYTES,
            rules: Vec::new(),
        }
    }
}

/// A corp config file: nothing but its own `[policy]` table.
#[derive(Deserialize, Clone, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct CorpFile {
    pub policy: CorpPolicyConfig,
}

/// The corp config's `[policy]` table.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields, default)]
pub struct CorpPolicyConfig {
    /// Verdict when no rule decides, unless the operator sets another (see `default_locked`).
    pub default: Option<Verdict>,
    /// The operator may not set a `default` different from this one.
    pub default_locked: bool,
    /// `false`: no rule of any layer may have an `ask` answered at the agent's client
    /// (`ask_via = "client"`): such asks go to the operator.
    pub allow_ask_via_client: bool,
    pub rules: Vec<RuleConfig>,
}

impl Default for CorpPolicyConfig {
    fn default() -> Self {
        CorpPolicyConfig {
            default: None,
            default_locked: false,
            allow_ask_via_client: true,
            rules: Vec::new(),
        }
    }
}

/// One `[[policy.rules]]` entry. Every match field given must hold for the rule to match.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields, default)]
pub struct RuleConfig {
    pub id: String,
    /// Required unless `enabled = false`.
    pub action: Option<Action>,
    pub phase: Phase,
    pub reason: Option<String>,
    pub enabled: bool,
    /// Corp config only: no lower layer may disable or redefine this rule.
    pub locked: bool,
    /// This definition replaces the rule of the same id from another layer.
    #[serde(rename = "override")]
    pub overrides: bool,
    pub method: Option<String>,
    pub server: Option<String>,
    pub tool: Option<String>,
    pub resource: Option<String>,
    pub principal: Option<String>,
    #[serde(deserialize_with = "one_or_many")]
    pub transport: Vec<Transport>,
    pub process: Option<String>,
    #[serde(deserialize_with = "one_or_many")]
    pub arg_present: Vec<String>,
    #[serde(deserialize_with = "one_or_many")]
    pub arg: Vec<ValueCondition>,
    #[serde(deserialize_with = "one_or_many")]
    pub result: Vec<ValueCondition>,
    pub replace: Option<ReplaceConfig>,
    /// Who answers an `ask`: the operator (default) or the human at the agent's client.
    pub ask_via: Option<AskVia>,
}

impl Default for RuleConfig {
    fn default() -> Self {
        RuleConfig {
            id: String::new(),
            action: None,
            phase: Phase::Request,
            reason: None,
            enabled: true,
            locked: false,
            overrides: false,
            method: None,
            server: None,
            tool: None,
            resource: None,
            principal: None,
            transport: Vec::new(),
            process: None,
            arg_present: Vec::new(),
            arg: Vec::new(),
            result: Vec::new(),
            replace: None,
            ask_via: None,
        }
    }
}

/// `arg = { path, equals | contains | matches | glob }` and `result = { ... }`.
#[derive(Deserialize, Clone, Debug, Default)]
#[serde(deny_unknown_fields, default)]
pub struct ValueCondition {
    /// Where to look; absent: every value anywhere (see the README).
    pub path: Option<String>,
    pub equals: Option<serde_json::Value>,
    pub contains: Option<String>,
    pub matches: Option<String>,
    pub glob: Option<String>,
}

/// `replace = { path?, matches, with }` of a `rewrite` rule.
#[derive(Deserialize, Clone, Debug)]
#[serde(deny_unknown_fields)]
pub struct ReplaceConfig {
    /// Argument path (request phase) or result path (response phase); absent: see the README.
    #[serde(default)]
    pub path: Option<String>,
    pub matches: String,
    /// Replacement text; `$1` / `${name}` refer to capture groups, `$$` is a literal `$`.
    pub with: String,
}

/// Who answers an `ask` rule's question.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "lowercase")]
pub enum AskVia {
    /// The operator, over the admin socket (never over an agent's door).
    #[default]
    Operator,
    /// The human at the agent's client, through an elicitation bound to the exact call.
    Client,
}

impl AskVia {
    pub fn as_str(self) -> &'static str {
        match self {
            AskVia::Operator => "operator",
            AskVia::Client => "client",
        }
    }
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Action {
    Allow,
    Ask,
    Block,
    Rewrite,
}

impl Action {
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Allow => "allow",
            Action::Ask => "ask",
            Action::Block => "block",
            Action::Rewrite => "rewrite",
        }
    }

    /// The verdict this action votes for; `rewrite` votes for none (it never grants a call).
    pub fn verdict(self) -> Option<Verdict> {
        match self {
            Action::Allow => Some(Verdict::Allow),
            Action::Ask => Some(Verdict::Ask),
            Action::Block => Some(Verdict::Block),
            Action::Rewrite => None,
        }
    }
}

impl fmt::Display for Action {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The outcome of a decision. Ordered by restriction: `Block > Ask > Allow`.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Allow,
    Ask,
    Block,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Allow => "allow",
            Verdict::Ask => "ask",
            Verdict::Block => "block",
        }
    }
}

impl fmt::Display for Verdict {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Default, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Phase {
    #[default]
    Request,
    Response,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Request => "request",
            Phase::Response => "response",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The door a message came through.
#[derive(Deserialize, Serialize, Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Transport {
    Vsock,
    Unix,
    Stdio,
    Http,
}

impl Transport {
    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Vsock => "vsock",
            Transport::Unix => "unix",
            Transport::Stdio => "stdio",
            Transport::Http => "http",
        }
    }

    /// One bit per transport, for a rule's transport set.
    pub(crate) fn bit(self) -> u8 {
        match self {
            Transport::Vsock => 1,
            Transport::Unix => 2,
            Transport::Stdio => 4,
            Transport::Http => 8,
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Transport {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "vsock" => Ok(Transport::Vsock),
            "unix" => Ok(Transport::Unix),
            "stdio" => Ok(Transport::Stdio),
            "http" => Ok(Transport::Http),
            other => Err(format!(
                "unknown transport {other:?}: expected vsock, unix, stdio or http"
            )),
        }
    }
}

impl std::str::FromStr for Phase {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "request" => Ok(Phase::Request),
            "response" => Ok(Phase::Response),
            other => Err(format!(
                "unknown phase {other:?}: expected request or response"
            )),
        }
    }
}

/// Accept one value or a list of them, keeping the inner type's own error messages (an
/// untagged enum would replace them with "did not match any variant").
fn one_or_many<'de, D, T>(deserializer: D) -> Result<Vec<T>, D::Error>
where
    D: Deserializer<'de>,
    T: Deserialize<'de>,
{
    struct OneOrMany<T>(PhantomData<T>);

    impl<'de, T: Deserialize<'de>> Visitor<'de> for OneOrMany<T> {
        type Value = Vec<T>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("one value or a list of values")
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Vec<T>, E> {
            T::deserialize(de::value::StrDeserializer::<E>::new(v)).map(|one| vec![one])
        }

        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Vec<T>, A::Error> {
            T::deserialize(de::value::MapAccessDeserializer::new(map)).map(|one| vec![one])
        }

        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Vec<T>, A::Error> {
            Vec::<T>::deserialize(de::value::SeqAccessDeserializer::new(seq))
        }
    }

    deserializer.deserialize_any(OneOrMany(PhantomData))
}
