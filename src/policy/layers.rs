//! Layering: built-in rules < the operator's `[policy]` < the corp config.
//!
//! - Every enabled rule of every layer counts in a decision; layers matter only when two
//!   define the same id, and for the default verdict.
//! - Same id in two layers: exactly one of the definitions must say `override = true`; it
//!   replaces the others. None, or more than one: a fault naming both places. The same id
//!   twice in one file is always a fault.
//! - A corp rule with `locked = true` wins over every lower definition; the operator's
//!   config defining the same id at all (to disable or redefine it) is a fault naming the rule.
//! - Default verdict: the operator's `default` when set, else the corp's, else `allow`. With
//!   `default_locked = true` in the corp config, an operator `default` that differs is a fault.
//! - The corp file is the one `TOOLWALL_CORP_CONFIG` names when set and non-empty (so a
//!   deployment can impose it without editing the operator's file), else `[policy] corp`.

use std::cell::OnceCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::builtin::{BUILTIN_ORIGIN, BUILTIN_RULES_TOML};
use super::config::{Action, CorpFile, MAX_ASK_TIMEOUT_SECS, PolicyConfig, RuleConfig, Verdict};
use super::error::PolicyError;
use super::rule::{Layer, Rule};
use crate::config::{MAX_CONFIG_BYTES, read_bounded};

/// The environment variable naming a corp config; it wins over `[policy] corp`.
pub const CORP_CONFIG_ENV: &str = "TOOLWALL_CORP_CONFIG";

/// Where the default verdict came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DefaultSource {
    pub layer: Layer,
    pub locked: bool,
}

/// Everything the layers resolve to, before the engine indexes it.
pub(crate) struct Layered {
    /// The winning definition of every id, in id order.
    pub rules: Vec<Rule>,
    pub default: Verdict,
    pub default_source: DefaultSource,
    pub ask_timeout: Duration,
    /// The corp config allows `ask_via = "client"` (true without a corp config).
    pub client_asks: bool,
    pub corp_file: Option<String>,
    /// Not faults, but worth the operator's eye.
    pub warnings: Vec<String>,
    /// "rule X at A replaced by B" lines, for `policy check`.
    pub replacements: Vec<String>,
}

/// One file's rules, with its text for line lookups.
struct Source {
    layer: Layer,
    name: String,
    /// The file's text, read only when a message needs a line number.
    text: OnceCell<Option<String>>,
    rules: Vec<RuleConfig>,
}

impl Source {
    fn new(layer: Layer, name: String, text: Option<String>, rules: Vec<RuleConfig>) -> Self {
        let cell = OnceCell::new();
        if text.is_some() {
            let _ = cell.set(text);
        }
        Source {
            layer,
            name,
            text: cell,
            rules,
        }
    }

    fn text(&self) -> Option<&str> {
        self.text
            .get_or_init(|| read_bounded(Path::new(&self.name), MAX_CONFIG_BYTES).ok())
            .as_deref()
    }
}

struct Entry<'s> {
    source: &'s Source,
    rule: &'s RuleConfig,
    /// Position in its file (0-based), for rules without an id.
    position: usize,
    /// How many earlier rules of the same file share this id, to find its line.
    occurrence: usize,
}

impl Entry<'_> {
    fn place(&self) -> String {
        let file = &self.source.name;
        if self.source.layer == Layer::Builtin {
            return file.clone();
        }
        match self
            .source
            .text()
            .and_then(|t| id_lines(t, &self.rule.id).get(self.occurrence).copied())
        {
            Some(line) => format!("{file} line {line}"),
            None => format!("{file} (rule #{})", self.position + 1),
        }
    }

    fn fault(&self, message: &str) -> String {
        if self.rule.id.is_empty() {
            format!("{}: rule without an id: {message}", self.place())
        } else {
            format!("{}: rule \"{}\": {message}", self.place(), self.rule.id)
        }
    }
}

/// The corp file to read: the environment's when set and non-empty, else the operator's key.
pub(crate) fn corp_path(
    operator: &PolicyConfig,
    corp_env: Option<&Path>,
    warnings: &mut Vec<String>,
) -> Option<PathBuf> {
    let from_config = operator
        .corp
        .as_deref()
        .filter(|p| !p.as_os_str().is_empty());
    match corp_env.filter(|p| !p.as_os_str().is_empty()) {
        Some(env) => {
            if let Some(cfg) = from_config
                && cfg != env
            {
                warnings.push(format!(
                    "{CORP_CONFIG_ENV}={} is used; [policy] corp = {:?} is ignored",
                    env.display(),
                    cfg.display()
                ));
            }
            Some(env.to_path_buf())
        }
        None => from_config.map(Path::to_path_buf),
    }
}

pub(crate) fn resolve(
    operator: &PolicyConfig,
    origin: &str,
    corp_env: Option<&Path>,
) -> Result<Layered, PolicyError> {
    let mut faults = Vec::new();
    let mut warnings = Vec::new();

    if !(1..=MAX_ASK_TIMEOUT_SECS).contains(&operator.ask_timeout_secs) {
        faults.push(format!(
            "{origin}: policy.ask_timeout_secs must be between 1 and {MAX_ASK_TIMEOUT_SECS}"
        ));
    }
    if operator.max_regex_bytes == 0 {
        faults.push(format!(
            "{origin}: policy.max_regex_bytes must be greater than 0"
        ));
    }

    let mut sources = Vec::new();
    if operator.builtin_rules {
        match toml::from_str::<CorpFile>(BUILTIN_RULES_TOML) {
            Ok(file) => sources.push(Source::new(
                Layer::Builtin,
                BUILTIN_ORIGIN.into(),
                Some(BUILTIN_RULES_TOML.to_string()),
                file.policy.rules,
            )),
            Err(e) => faults.push(format!("{BUILTIN_ORIGIN}: {}", e.to_string().trim_end())),
        }
    }
    // The operator's file is read again only to name lines in messages; an origin that is
    // not a readable file just loses the line numbers.
    sources.push(Source::new(
        Layer::Operator,
        origin.to_string(),
        None,
        operator.rules.clone(),
    ));

    let mut corp_default = None;
    let mut corp_default_locked = false;
    let mut client_asks = true;
    let corp = corp_path(operator, corp_env, &mut warnings);
    let corp_file = corp.as_ref().map(|p| p.display().to_string());
    if let Some(path) = &corp {
        let name = path.display().to_string();
        match read_bounded(path, MAX_CONFIG_BYTES) {
            Err(e) => faults.push(format!("corp config {name}: {e}")),
            Ok(text) => match toml::from_str::<CorpFile>(&text) {
                Err(e) => faults.push(format!("{name}: {}", e.to_string().trim_end())),
                Ok(file) => {
                    corp_default = file.policy.default;
                    corp_default_locked = file.policy.default_locked;
                    client_asks = file.policy.allow_ask_via_client;
                    if corp_default_locked && corp_default.is_none() {
                        faults.push(format!(
                            "{name}: default_locked = true needs a default to lock"
                        ));
                    }
                    sources.push(Source::new(
                        Layer::Corp,
                        name,
                        Some(text),
                        file.policy.rules,
                    ));
                }
            },
        }
    }

    let (default, default_source) = resolve_default(
        operator.default,
        origin,
        corp_default,
        corp_default_locked,
        corp_file.as_deref(),
        &mut faults,
    );

    // Compile every definition (a replaced one must still be valid config).
    let mut entries: Vec<Entry<'_>> = Vec::new();
    for source in &sources {
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (position, rule) in source.rules.iter().enumerate() {
            let occurrence = seen.entry(rule.id.as_str()).or_insert(0);
            entries.push(Entry {
                source,
                rule,
                position,
                occurrence: *occurrence,
            });
            *occurrence += 1;
        }
    }
    let mut compiled: Vec<Option<Rule>> = Vec::with_capacity(entries.len());
    for entry in &entries {
        match Rule::compile(
            entry.rule,
            entry.source.layer,
            &entry.source.name,
            operator.max_regex_bytes.max(1),
        ) {
            Ok(rule) => compiled.push(Some(rule)),
            Err(messages) => {
                faults.extend(messages.iter().map(|m| entry.fault(m)));
                compiled.push(None);
            }
        }
    }

    // Resolve ids across layers.
    let mut by_id: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (i, entry) in entries.iter().enumerate() {
        if !entry.rule.id.is_empty() {
            by_id.entry(entry.rule.id.as_str()).or_default().push(i);
        }
    }
    let mut replacements = Vec::new();
    let mut winners = Vec::new();
    for (id, group) in &by_id {
        match pick_winner(id, group, &entries, &mut faults, &mut warnings) {
            Some(w) => {
                for &loser in group.iter().filter(|&&i| i != w) {
                    replacements.push(format!(
                        "rule \"{id}\" at {} is replaced by the one at {}",
                        entries[loser].place(),
                        entries[w].place()
                    ));
                }
                winners.push(w);
            }
            None => continue,
        }
    }

    if !faults.is_empty() {
        return Err(PolicyError::new(faults));
    }
    let mut rules = Vec::with_capacity(winners.len());
    for w in winners {
        if let Some(rule) = compiled[w].take() {
            if rule.enabled && !client_asks && rule.ask_via == super::config::AskVia::Client {
                warnings.push(format!(
                    "{}: rule \"{}\": ask_via = \"client\" is not allowed by the corp config \
                     (allow_ask_via_client = false): its asks go to the operator",
                    entries[w].place(),
                    rule.id
                ));
            }
            if rule.enabled && rule.action != Some(Action::Rewrite) && rule.matches_everything() {
                warnings.push(format!(
                    "{}: rule \"{}\": no match fields, so it applies to every {} message",
                    entries[w].place(),
                    rule.id,
                    rule.phase
                ));
            }
            rules.push(rule);
        }
    }
    Ok(Layered {
        rules,
        default,
        default_source,
        ask_timeout: Duration::from_secs(operator.ask_timeout_secs),
        client_asks,
        corp_file,
        warnings,
        replacements,
    })
}

/// The default verdict and where it comes from: the operator's when set, else the corp's,
/// else allow; a locked corp default wins and a differing operator default is a fault.
fn resolve_default(
    operator: Option<Verdict>,
    origin: &str,
    corp: Option<Verdict>,
    corp_locked: bool,
    corp_file: Option<&str>,
    faults: &mut Vec<String>,
) -> (Verdict, DefaultSource) {
    let source = |layer, locked| DefaultSource { layer, locked };
    match (operator, corp) {
        (Some(op), Some(corp)) if corp_locked && op != corp => {
            faults.push(format!(
                "{origin}: policy.default = \"{op}\" conflicts with the corp config {}, which \
                 locks the default to \"{corp}\"",
                corp_file.unwrap_or("?")
            ));
            (corp, source(Layer::Corp, true))
        }
        (_, Some(corp)) if corp_locked => (corp, source(Layer::Corp, true)),
        (Some(op), _) => (op, source(Layer::Operator, false)),
        (None, Some(corp)) => (corp, source(Layer::Corp, false)),
        (None, None) => (Verdict::Allow, source(Layer::Builtin, false)),
    }
}

/// The definition that stands for `id`, or None after recording why none can.
fn pick_winner(
    id: &str,
    group: &[usize],
    entries: &[Entry<'_>],
    faults: &mut Vec<String>,
    warnings: &mut Vec<String>,
) -> Option<usize> {
    if let [only] = group {
        let entry = &entries[*only];
        if entry.rule.overrides {
            warnings.push(format!(
                "{}: rule \"{id}\": override = true but no other layer defines it; it is \
                 added as a new rule",
                entry.place()
            ));
        }
        return Some(*only);
    }
    // The same id twice in one file.
    let mut duplicate = false;
    for (n, &a) in group.iter().enumerate() {
        if let Some(&b) = group[n + 1..]
            .iter()
            .find(|&&b| entries[b].source.layer == entries[a].source.layer)
        {
            faults.push(format!(
                "{}: rule \"{id}\": duplicate rule id (also at {})",
                entries[b].place(),
                entries[a].place()
            ));
            duplicate = true;
        }
    }
    if duplicate {
        return None;
    }
    let locked = group
        .iter()
        .copied()
        .find(|&i| entries[i].source.layer == Layer::Corp && entries[i].rule.locked);
    if let Some(corp) = locked {
        let mut ok = true;
        for &other in group.iter().filter(|&&i| i != corp) {
            match entries[other].source.layer {
                Layer::Builtin if !entries[corp].rule.overrides => {
                    faults.push(format!(
                        "{}: rule \"{id}\": same id as a built-in rule; add override = true \
                         to replace it",
                        entries[corp].place()
                    ));
                    ok = false;
                }
                Layer::Builtin => {}
                _ => {
                    faults.push(format!(
                        "{}: rule \"{id}\": locked by the corp config ({}); it may not be \
                         disabled or redefined",
                        entries[other].place(),
                        entries[corp].place()
                    ));
                    ok = false;
                }
            }
        }
        return ok.then_some(corp);
    }
    let overriding: Vec<usize> = group
        .iter()
        .copied()
        .filter(|&i| entries[i].rule.overrides)
        .collect();
    match overriding.as_slice() {
        [one] => Some(*one),
        [] => {
            faults.push(format!(
                "{}: rule \"{id}\": duplicate rule id (also at {}); add override = true to \
                 the definition that should replace the other",
                entries[group[1]].place(),
                entries[group[0]].place()
            ));
            None
        }
        [a, b, ..] => {
            faults.push(format!(
                "{}: rule \"{id}\": override = true here and at {}; only one definition \
                 may override",
                entries[*b].place(),
                entries[*a].place()
            ));
            None
        }
    }
}

/// The 1-based lines where `id = "ID"` (or `'ID'`) is written, in order.
pub(crate) fn id_lines(text: &str, id: &str) -> Vec<usize> {
    let mut lines = Vec::new();
    if id.is_empty() {
        return lines;
    }
    for (n, line) in text.lines().enumerate() {
        if !line.trim_start().starts_with('#') && assigns_id(line, id) {
            lines.push(n + 1);
        }
    }
    lines
}

/// True if `line` holds the key-value `id = "ID"`, alone or inside an inline table.
fn assigns_id(line: &str, id: &str) -> bool {
    let bytes = line.as_bytes();
    let mut from = 0;
    while let Some(found) = line[from..].find("id") {
        let at = from + found;
        from = at + 2;
        let boundary_before = at == 0 || matches!(bytes[at - 1], b' ' | b'\t' | b'{' | b',');
        if !boundary_before {
            continue;
        }
        let rest = line[at + 2..].trim_start();
        let Some(rest) = rest.strip_prefix('=') else {
            continue;
        };
        let rest = rest.trim_start();
        for quote in ['"', '\''] {
            if let Some(value) = rest.strip_prefix(quote)
                && let Some(value) = value.strip_prefix(id)
                && value.starts_with(quote)
            {
                return true;
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_lines_finds_tables_and_inline_tables() {
        let text = "[[policy.rules]]\nid = \"a\"\naction = \"block\"\n\n\
                    rules = [{ id = 'b', action = \"allow\" }, {id=\"a\"}]\n# id = \"ab\"\n";
        assert_eq!(id_lines(text, "a"), vec![2, 5]);
        assert_eq!(id_lines(text, "b"), vec![5]);
        assert!(id_lines(text, "ab").is_empty());
        assert!(id_lines("pid = \"a\"", "a").is_empty());
    }
}
