//! The policy matrix at the unit level: real TOML, real files for the corp layer and for
//! line numbers, whole values.

use std::io::Write;
use std::path::Path;

use serde_json::{Value, json};

use super::*;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Wrapper {
    #[serde(default)]
    policy: PolicyConfig,
}

fn cfg(text: &str) -> PolicyConfig {
    match toml::from_str::<Wrapper>(text) {
        Ok(w) => w.policy,
        Err(e) => panic!("test config does not parse: {e}"),
    }
}

fn load(text: &str) -> Policy {
    load_with(text, None)
}

fn load_with(text: &str, corp: Option<&Path>) -> Policy {
    match Policy::load_with_corp_env(&cfg(text), "test.toml", corp) {
        Ok(p) => p,
        Err(e) => panic!("policy does not load: {e}"),
    }
}

fn load_err(text: &str, origin: &str, corp: Option<&Path>) -> String {
    match Policy::load_with_corp_env(&cfg(text), origin, corp) {
        Ok(_) => panic!("policy loaded but should not"),
        Err(e) => e.to_string(),
    }
}

fn file(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().expect("temp file");
    f.write_all(text.as_bytes()).expect("write temp file");
    f
}

fn call<'a>(tool: &'a str, args: Option<&'a Value>) -> Subject<'a> {
    Subject {
        method: "tools/call",
        server: tool.split_once("__").map(|(s, _)| s),
        tool: Some(tool),
        resource: None,
        principal: "uid:1000",
        transport: Transport::Unix,
        process: "agent",
        arguments: args,
    }
}

fn verdict(p: &Policy, tool: &str, args: &Value) -> Verdict {
    p.decide(Phase::Request, &call(tool, Some(args)), None)
        .verdict
}

fn ids(d: &Decision) -> Vec<&str> {
    d.matched.iter().map(|m| &*m.id).collect()
}

#[test]
fn no_rules_means_the_default() {
    let p = load("");
    let d = p.decide(Phase::Request, &call("local__echo", None), None);
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.rule, None);
    assert_eq!(d.reason.as_deref(), Some("default"));
    assert!(d.matched.is_empty());
    assert_eq!(
        load("[policy]\ndefault = \"ask\"").default_verdict(),
        Verdict::Ask
    );
    assert_eq!(p.ask_timeout().as_secs(), 120);
}

#[test]
fn per_tool_block() {
    let p = load(
        r#"[[policy.rules]]
id = "no-shell"
action = "block"
tool = "local__shell"
reason = "no shell for agents"
"#,
    );
    let d = p.decide(Phase::Request, &call("local__shell", None), None);
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.rule.as_deref(), Some("no-shell"));
    assert_eq!(d.reason.as_deref(), Some("no shell for agents"));
    assert_eq!(d.matched[0].layer, Layer::Operator);
    assert_eq!(verdict(&p, "local__echo", &json!({})), Verdict::Allow);
    assert_eq!(verdict(&p, "local__shell2", &json!({})), Verdict::Allow);
}

#[test]
fn tool_globs_and_name_fields() {
    let p = load(
        r#"[[policy.rules]]
id = "github-from-vms-only-via-vsock"
action = "block"
tool = "github__*"
transport = ["unix", "stdio", "http"]

[[policy.rules]]
id = "uid-2000-nothing"
action = "block"
principal = "uid:2???"

[[policy.rules]]
id = "curl-asks"
action = "ask"
process = "*curl*"
"#,
    );
    let mut s = call("github__push", None);
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Block);
    s.transport = Transport::Vsock;
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Allow);
    s.principal = "uid:2001";
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Block);
    s.principal = "uid:1000";
    s.process = "/usr/bin/curl";
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Ask);
}

#[test]
fn resource_uri_rule() {
    let p = load(
        r#"[[policy.rules]]
id = "no-etc"
action = "block"
method = "resources/read"
resource = "file:///etc/*"
"#,
    );
    let mut s = call("x", None);
    s.method = "resources/read";
    s.tool = None;
    s.resource = Some("file:///etc/ssh/sshd_config");
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Block);
    s.resource = Some("file:///home/u/notes.txt");
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Allow);
    s.resource = None;
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Allow);
}

#[test]
fn argument_name_rule() {
    let p = load(
        r#"[[policy.rules]]
id = "no-auth-header"
action = "block"
tool = "local__http_*"
arg_present = "headers.Authorization"
"#,
    );
    let with = json!({"url": "https://x", "headers": {"Authorization": null}});
    let without = json!({"url": "https://x", "headers": {"Accept": "*/*"}});
    assert_eq!(
        verdict(&p, "local__http_get", &with),
        Verdict::Block,
        "null is present"
    );
    assert_eq!(verdict(&p, "local__http_get", &without), Verdict::Allow);
    let d = p.decide(Phase::Request, &call("local__http_get", None), None);
    assert_eq!(
        d.verdict,
        Verdict::Allow,
        "no arguments: the condition does not hold"
    );
}

#[test]
fn argument_value_rules() {
    let p = load(
        r#"[[policy.rules]]
id = "equals"
action = "block"
arg = { path = "mode", equals = "force" }

[[policy.rules]]
id = "equals-number"
action = "block"
arg = { path = "depth", equals = 3 }

[[policy.rules]]
id = "contains"
action = "block"
arg = { path = "command", contains = "rm -rf" }

[[policy.rules]]
id = "regex"
action = "block"
arg = { path = "url", matches = '^https?://(10|192\.168)\.' }

[[policy.rules]]
id = "glob"
action = "block"
arg = { path = "path", glob = "/etc/*" }

[[policy.rules]]
id = "both"
action = "block"
arg = [{ path = "a", equals = 1 }, { path = "b", equals = 2 }]
"#,
    );
    let cases = [
        (json!({"mode": "force"}), Some("equals")),
        (json!({"mode": "forced"}), None),
        (json!({"depth": 3}), Some("equals-number")),
        (json!({"depth": "3"}), None),
        (json!({"command": "cd / && rm -rf x"}), Some("contains")),
        (json!({"command": "rm -r x"}), None),
        (json!({"url": "http://192.168.1.1/admin"}), Some("regex")),
        (json!({"url": "https://example.com/?10.0"}), None),
        (json!({"path": "/etc/shadow"}), Some("glob")),
        (json!({"path": "/home/etc/x"}), None),
        (json!({"a": 1, "b": 2}), Some("both")),
        (json!({"a": 1, "b": 3}), None),
    ];
    for (args, want) in cases {
        let d = p.decide(Phase::Request, &call("local__x", Some(&args)), None);
        assert_eq!(d.rule.as_deref(), want, "{args}");
    }
}

#[test]
fn paths_with_indices() {
    let p = load(
        r#"[[policy.rules]]
id = "dotted-index"
action = "block"
arg = { path = "files.1.name", equals = "secret" }

[[policy.rules]]
id = "bracket-index"
action = "ask"
arg = { path = "matrix[0][1]", equals = 7 }
"#,
    );
    let a = json!({"files": [{"name": "ok"}, {"name": "secret"}]});
    let b = json!({"files": [{"name": "secret"}]});
    let c = json!({"matrix": [[6, 7]]});
    assert_eq!(verdict(&p, "t__t", &a), Verdict::Block);
    assert_eq!(verdict(&p, "t__t", &b), Verdict::Allow);
    assert_eq!(verdict(&p, "t__t", &c), Verdict::Ask);
}

#[test]
fn return_value_rule() {
    let p = load(
        r#"[[policy.rules]]
id = "no-aws-keys-out"
action = "block"
phase = "response"
result = { matches = 'AKIA[0-9A-Z]{16}' }
reason = "an AWS key in a result"

[[policy.rules]]
id = "error-flag"
action = "ask"
phase = "response"
result = { path = "isError", equals = true }
"#,
    );
    let s = call("local__read", None);
    let leak = json!({"content": [{"type": "text", "text": "key=AKIAABCDEFGHIJKLMNOP"}]});
    let fine = json!({"content": [{"type": "text", "text": "nothing here"}]});
    let structured = json!({"content": [], "structuredContent": {"k": "AKIAABCDEFGHIJKLMNOP"}});
    let failed = json!({"content": [], "isError": true});
    assert_eq!(
        p.decide(Phase::Response, &s, Some(&leak)).verdict,
        Verdict::Block
    );
    assert_eq!(
        p.decide(Phase::Response, &s, Some(&fine)).verdict,
        Verdict::Allow
    );
    assert_eq!(
        p.decide(Phase::Response, &s, Some(&structured)).verdict,
        Verdict::Block
    );
    assert_eq!(
        p.decide(Phase::Response, &s, Some(&failed)).verdict,
        Verdict::Ask
    );
    // Response rules never judge requests, and need a result.
    assert_eq!(
        p.decide(Phase::Request, &s, Some(&leak)).verdict,
        Verdict::Allow
    );
    assert_eq!(p.decide(Phase::Response, &s, None).verdict, Verdict::Allow);
}

#[test]
fn deny_over_allow_whatever_order_and_layer() {
    // Block in the corp layer, allow in the operator's, and the other way round; ids chosen
    // so that the restrictive rule sorts both first and last.
    for (op_action, corp_action, op_id, corp_id) in [
        ("allow", "block", "a-rule", "z-rule"),
        ("allow", "block", "z-rule", "a-rule"),
        ("block", "allow", "a-rule", "z-rule"),
        ("block", "allow", "z-rule", "a-rule"),
        ("ask", "allow", "z-rule", "a-rule"),
    ] {
        let corp = file(&format!(
            "[policy]\n[[policy.rules]]\nid = \"{corp_id}\"\naction = \"{corp_action}\"\n\
             tool = \"local__*\"\n"
        ));
        let p = load_with(
            &format!(
                "[[policy.rules]]\nid = \"{op_id}\"\naction = \"{op_action}\"\n\
                 tool = \"local__shell\"\n"
            ),
            Some(corp.path()),
        );
        let d = p.decide(Phase::Request, &call("local__shell", None), None);
        let want = if op_action == "ask" {
            Verdict::Ask
        } else {
            Verdict::Block
        };
        assert_eq!(
            d.verdict, want,
            "{op_action} {corp_action} {op_id} {corp_id}"
        );
        assert_eq!(d.matched.len(), 2);
        let decider = if op_action == "allow" { corp_id } else { op_id };
        assert_eq!(d.rule.as_deref(), Some(decider));
    }
}

#[test]
fn ties_go_to_the_first_id() {
    let p = load(
        r#"[[policy.rules]]
id = "b"
action = "block"

[[policy.rules]]
id = "a"
action = "block"
tool = "local__*"

[[policy.rules]]
id = "c"
action = "allow"
"#,
    );
    let d = p.decide(Phase::Request, &call("local__x", None), None);
    assert_eq!(d.rule.as_deref(), Some("a"));
    assert_eq!(ids(&d), vec!["a", "b", "c"]);
}

#[test]
fn locked_corp_rule_cannot_be_disabled_or_redefined() {
    let corp = file(
        r#"[policy]
[[policy.rules]]
id = "corp-no-exfil"
action = "block"
tool = "*__upload"
locked = true
"#,
    );
    let disable = "[[policy.rules]]\nid = \"corp-no-exfil\"\nenabled = false\noverride = true\n";
    let op = file(disable);
    let origin = op.path().display().to_string();
    let err = load_err(disable, &origin, Some(corp.path()));
    assert!(err.contains("corp-no-exfil"), "{err}");
    assert!(err.contains("locked"), "{err}");
    assert!(err.contains(&format!("{origin} line 2")), "{err}");
    assert!(
        err.contains(&format!("{} line 3", corp.path().display())),
        "{err}"
    );

    let redefine =
        "[[policy.rules]]\nid = \"corp-no-exfil\"\naction = \"allow\"\ntool = \"*__upload\"\n";
    let err = load_err(redefine, "test.toml", Some(corp.path()));
    assert!(
        err.contains("corp-no-exfil") && err.contains("locked"),
        "{err}"
    );

    // Untouched, it holds.
    let p = load_with("", Some(corp.path()));
    let d = p.decide(Phase::Request, &call("s3__upload", None), None);
    assert_eq!(
        (d.verdict, d.matched[0].layer),
        (Verdict::Block, Layer::Corp)
    );
}

#[test]
fn unlocked_corp_rule_can_be_overridden_on_purpose() {
    let corp = file(
        "[policy]\n[[policy.rules]]\nid = \"corp-ask-writes\"\naction = \"ask\"\ntool = \"*__write\"\n",
    );
    let dup =
        "[[policy.rules]]\nid = \"corp-ask-writes\"\naction = \"allow\"\ntool = \"*__write\"\n";
    let err = load_err(dup, "test.toml", Some(corp.path()));
    assert!(
        err.contains("rule \"corp-ask-writes\": duplicate rule id"),
        "{err}"
    );
    assert!(err.contains("override = true"), "{err}");
    assert!(err.contains(&corp.path().display().to_string()), "{err}");

    let p = load_with(
        &format!("{dup}override = true\nenabled = false\n"),
        Some(corp.path()),
    );
    let d = p.decide(Phase::Request, &call("fs__write", None), None);
    assert_eq!(d.verdict, Verdict::Allow, "the operator disabled it");
    assert!(d.matched.is_empty());
    assert_eq!(p.replacements().len(), 1);
}

#[test]
fn override_marker_rules() {
    // Disable a built-in by id, without an action.
    let p = load(
        "[[policy.rules]]\nid = \"builtin-private-key-in-arguments\"\noverride = true\n\
         enabled = false\n",
    );
    let key = json!({"k": "-----BEGIN RSA PRIVATE KEY-----\nMII..."});
    assert_eq!(verdict(&p, "local__x", &key), Verdict::Allow);
    assert_eq!(verdict(&load(""), "local__x", &key), Verdict::Block);

    // Same id without the marker: a fault naming both places.
    let err = load_err(
        "[[policy.rules]]\nid = \"builtin-private-key-in-arguments\"\naction = \"allow\"\n",
        "test.toml",
        None,
    );
    assert!(
        err.contains("built-in rules") && err.contains("test.toml"),
        "{err}"
    );

    // Both sides overriding: ambiguous.
    let corp = file("[policy]\n[[policy.rules]]\nid = \"x\"\naction = \"ask\"\noverride = true\n");
    let err = load_err(
        "[[policy.rules]]\nid = \"x\"\naction = \"allow\"\noverride = true\n",
        "test.toml",
        Some(corp.path()),
    );
    assert!(err.contains("only one definition may override"), "{err}");

    // Nothing to override: a warning, not a fault.
    let p = load("[[policy.rules]]\nid = \"lonely\"\naction = \"ask\"\noverride = true\n");
    assert!(p.warnings().iter().any(|w| w.contains("lonely")));
}

#[test]
fn duplicate_id_in_one_file_names_both_lines() {
    let text = "[[policy.rules]]\nid = \"dup\"\naction = \"allow\"\n\n\
                [[policy.rules]]\nid = \"dup\"\naction = \"block\"\noverride = true\n";
    let op = file(text);
    let origin = op.path().display().to_string();
    let err = load_err(text, &origin, None);
    assert!(err.contains("rule \"dup\": duplicate rule id"), "{err}");
    assert!(err.contains(&format!("{origin} line 6")), "{err}");
    assert!(err.contains(&format!("{origin} line 2")), "{err}");
}

#[test]
fn corp_locked_default() {
    let corp = file("[policy]\ndefault = \"block\"\ndefault_locked = true\n");
    let err = load_err(
        "[policy]\ndefault = \"allow\"\n",
        "op.toml",
        Some(corp.path()),
    );
    assert!(err.contains("default") && err.contains("locks"), "{err}");
    assert!(err.contains("op.toml"), "{err}");
    let p = load_with("", Some(corp.path()));
    assert_eq!(p.default_verdict(), Verdict::Block);
    assert!(p.default_source().locked);
    let p = load_with("[policy]\ndefault = \"block\"\n", Some(corp.path()));
    assert_eq!(p.default_verdict(), Verdict::Block);

    // Unlocked: the operator's explicit default stands; without one, the corp's.
    let corp = file("[policy]\ndefault = \"ask\"\n");
    assert_eq!(
        load_with("", Some(corp.path())).default_verdict(),
        Verdict::Ask
    );
    assert_eq!(
        load_with("[policy]\ndefault = \"allow\"\n", Some(corp.path())).default_verdict(),
        Verdict::Allow
    );

    let corp = file("[policy]\ndefault_locked = true\n");
    let err = load_err("", "op.toml", Some(corp.path()));
    assert!(err.contains("needs a default"), "{err}");
}

#[test]
fn corp_file_faults_name_the_file_and_line() {
    let corp = file("[policy]\n[[policy.rules]]\nid = \"a\"\naction = \"block\"\nbogus = 1\n");
    let err = load_err("", "op.toml", Some(corp.path()));
    assert!(err.contains(&corp.path().display().to_string()), "{err}");
    assert!(err.contains("bogus") && err.contains("line 5"), "{err}");

    let corp = file(
        "[policy]\n[[policy.rules]]\nid = \"a\"\naction = \"block\"\narg = { path = \"x\", like = \"y\" }\n",
    );
    let err = load_err("", "op.toml", Some(corp.path()));
    assert!(err.contains("like") && err.contains("line 5"), "{err}");

    let err = load_err("", "op.toml", Some(Path::new("/nonexistent/corp.toml")));
    assert!(err.contains("/nonexistent/corp.toml"), "{err}");

    let corp = file("[listen]\nunix = \"x\"\n");
    let err = load_err("", "op.toml", Some(corp.path()));
    assert!(err.contains("listen"), "{err}");
}

#[test]
fn corp_path_from_env_wins_over_config() {
    let env_corp = file("[policy]\ndefault = \"block\"\n");
    let cfg_corp = file("[policy]\ndefault = \"ask\"\n");
    let text = format!(
        "[policy]\ncorp = {:?}\n",
        cfg_corp.path().display().to_string()
    );
    assert_eq!(load_with(&text, None).default_verdict(), Verdict::Ask);
    let p = load_with(&text, Some(env_corp.path()));
    assert_eq!(p.default_verdict(), Verdict::Block);
    assert!(p.warnings().iter().any(|w| w.contains(CORP_CONFIG_ENV)));
    // An empty environment value counts as unset.
    assert_eq!(
        load_with(&text, Some(Path::new(""))).default_verdict(),
        Verdict::Ask
    );
}

#[test]
fn disabled_rules_do_not_count() {
    let p = load(
        r#"[[policy.rules]]
id = "off"
action = "block"
tool = "local__*"
enabled = false
"#,
    );
    let d = p.decide(Phase::Request, &call("local__x", None), None);
    assert_eq!(d.verdict, Verdict::Allow);
    assert!(d.matched.is_empty());
    assert!(!p.hides_tool("local__x", "local", "uid:1", Transport::Unix, "a"));
    let text = explain(
        &p,
        &ExplainQuery {
            tool: "local__x".into(),
            ..ExplainQuery::default()
        },
    );
    assert!(
        text.contains("disabled rules that would match: off"),
        "{text}"
    );
}

#[test]
fn a_900_kb_argument_is_judged_whole() {
    let p = load(
        r#"[[policy.rules]]
id = "needle"
action = "block"
arg = { path = "body", contains = "NEEDLE" }

[[policy.rules]]
id = "needle-anywhere"
action = "ask"
arg = { matches = 'NEE+DLE$' }
"#,
    );
    let small = json!({"body": "NEEDLE"});
    let big = json!({"body": format!("{}NEEDLE", "x".repeat(900 * 1024))});
    for args in [&small, &big] {
        let d = p.decide(Phase::Request, &call("local__x", Some(args)), None);
        assert_eq!(d.verdict, Verdict::Block);
        assert_eq!(ids(&d), vec!["needle", "needle-anywhere"]);
    }
    let big_clean = json!({"body": "x".repeat(900 * 1024)});
    assert_eq!(verdict(&p, "local__x", &big_clean), Verdict::Allow);
}

#[test]
fn rewrite_an_argument() {
    let p = load(
        r#"[[policy.rules]]
id = "b-strip-token"
action = "rewrite"
tool = "local__http_get"
replace = { path = "headers.Authorization", matches = '^Bearer .*$', with = "Bearer [redacted]" }

[[policy.rules]]
id = "a-lowercase-host"
action = "rewrite"
replace = { path = "url", matches = 'EXAMPLE\.COM', with = "example.com" }

[[policy.rules]]
id = "c-everywhere"
action = "rewrite"
replace = { matches = 'sk-[a-z0-9]+', with = "sk-***" }
"#,
    );
    let args = json!({"url": "https://EXAMPLE.COM/x",
                      "headers": {"Authorization": "Bearer abc"},
                      "notes": ["keep sk-abc123 out", 5]});
    let d = p.decide(Phase::Request, &call("local__http_get", Some(&args)), None);
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(d.rule, None, "rewrite rules never decide");
    let mut rewritten = args.clone();
    let applied = p.rewrite_arguments(&d, &mut rewritten);
    assert_eq!(
        applied,
        vec!["a-lowercase-host", "b-strip-token", "c-everywhere"]
    );
    assert_eq!(
        rewritten,
        json!({"url": "https://example.com/x",
               "headers": {"Authorization": "Bearer [redacted]"},
               "notes": ["keep sk-*** out", 5]})
    );
    // Nothing left to change: nothing reported.
    assert!(p.rewrite_arguments(&d, &mut rewritten).is_empty());
}

#[test]
fn rewrite_grants_nothing_and_yields_to_block() {
    let p = load(
        r#"[policy]
default = "block"

[[policy.rules]]
id = "redact"
action = "rewrite"
replace = { matches = "secret", with = "***" }

[[policy.rules]]
id = "allow-echo"
action = "allow"
tool = "local__echo"
"#,
    );
    let args = json!({"text": "secret"});
    let d = p.decide(Phase::Request, &call("local__other", Some(&args)), None);
    assert_eq!(d.verdict, Verdict::Block, "a rewrite rule is not an allow");
    let mut a = args.clone();
    assert!(p.rewrite_arguments(&d, &mut a).is_empty());
    assert_eq!(a, args);
    let d = p.decide(Phase::Request, &call("local__echo", Some(&args)), None);
    assert_eq!(d.verdict, Verdict::Allow);
    assert_eq!(p.rewrite_arguments(&d, &mut a), vec!["redact"]);
    assert_eq!(a, json!({"text": "***"}));
}

#[test]
fn rewrite_a_result() {
    let p = load(
        r#"[[policy.rules]]
id = "redact-emails"
action = "rewrite"
phase = "response"
replace = { matches = '[a-z]+@example\.com', with = "<email>" }

[[policy.rules]]
id = "redact-meta"
action = "rewrite"
phase = "response"
result = { path = "meta.kind", equals = "user" }
replace = { path = "meta.owner", matches = '.+', with = "<owner>" }
"#,
    );
    let result = json!({
        "content": [{"type": "text", "text": "mail bob@example.com"},
                    {"type": "resource", "resource": {"uri": "x:bob@example.com", "text": "to ann@example.com"}}],
        "structuredContent": {"to": ["ann@example.com"]},
        "meta": {"kind": "user", "owner": "ann"}
    });
    let s = call("mail__list", None);
    let d = p.decide(Phase::Response, &s, Some(&result));
    assert_eq!(d.verdict, Verdict::Allow);
    let mut r = result.clone();
    assert_eq!(
        p.rewrite_result(&d, &mut r),
        vec!["redact-emails", "redact-meta"]
    );
    assert_eq!(
        r,
        json!({
            "content": [{"type": "text", "text": "mail <email>"},
                        {"type": "resource", "resource": {"uri": "x:bob@example.com", "text": "to <email>"}}],
            "structuredContent": {"to": ["<email>"]},
            "meta": {"kind": "user", "owner": "<owner>"}
        })
    );
}

#[test]
fn tools_list_hiding() {
    let p = load(
        r#"[[policy.rules]]
id = "no-shell"
action = "block"
tool = "local__shell"

[[policy.rules]]
id = "no-rm"
action = "block"
tool = "local__fs"
arg = { path = "op", equals = "rm" }

[[policy.rules]]
id = "no-github-for-2000"
action = "block"
server = "github"
principal = "uid:2000"

[[policy.rules]]
id = "no-resources"
action = "block"
method = "resources/read"
"#,
    );
    let hides = |tool: &str, principal: &str| {
        let server = tool.split_once("__").map_or("", |(s, _)| s);
        p.hides_tool(tool, server, principal, Transport::Unix, "agent")
    };
    assert!(hides("local__shell", "uid:1000"));
    assert!(
        !hides("local__fs", "uid:1000"),
        "blocked only for some arguments"
    );
    assert!(hides("github__push", "uid:2000"));
    assert!(!hides("github__push", "uid:1000"));
    assert!(!hides("local__echo", "uid:1000"));

    // Default block: only tools some allow or ask rule may let through are listed.
    let p = load(
        r#"[policy]
default = "block"

[[policy.rules]]
id = "echo-ok"
action = "allow"
tool = "local__echo"

[[policy.rules]]
id = "read-small"
action = "ask"
tool = "local__read"
arg = { path = "path", glob = "/tmp/*" }
"#,
    );
    assert!(!p.hides_tool("local__echo", "local", "u", Transport::Unix, "a"));
    assert!(!p.hides_tool("local__read", "local", "u", Transport::Unix, "a"));
    assert!(p.hides_tool("local__shell", "local", "u", Transport::Unix, "a"));
}

#[test]
fn fast_path_queries() {
    let p = load(
        r#"[policy]
builtin_rules = false

[[policy.rules]]
id = "args"
action = "block"
tool = "local__fs"
arg = { path = "op", equals = "rm" }

[[policy.rules]]
id = "plain"
action = "block"
tool = "local__shell"

[[policy.rules]]
id = "resp"
action = "block"
phase = "response"
tool = "web__*"
result = { contains = "x" }

[[policy.rules]]
id = "resp-plain"
action = "block"
phase = "response"
method = "resources/read"
"#,
    );
    assert!(p.wants_arguments(Phase::Request, "tools/call", Some("local__fs")));
    assert!(!p.wants_arguments(Phase::Request, "tools/call", Some("local__shell")));
    assert!(!p.wants_arguments(Phase::Request, "tools/list", None));
    assert!(!p.wants_arguments(Phase::Response, "tools/call", Some("local__fs")));
    assert!(p.has_response_rules("tools/call", Some("web__get")));
    assert!(!p.has_response_rules("tools/call", Some("local__fs")));
    assert!(p.has_response_rules("resources/read", None));
    assert!(p.wants_result("tools/call", Some("web__get")));
    assert!(!p.wants_result("resources/read", None));
    assert_eq!(p.rule_count(), 4);
}

#[test]
fn builtin_rules_block_private_keys() {
    let p = load("");
    let key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n";
    let args = json!({"files": [{"content": key}]});
    let d = p.decide(Phase::Request, &call("github__gist", Some(&args)), None);
    assert_eq!(d.verdict, Verdict::Block);
    assert_eq!(d.matched[0].layer, Layer::Builtin);
    let result = json!({"content": [{"type": "text", "text": key}]});
    let d = p.decide(Phase::Response, &call("local__read", None), Some(&result));
    assert_eq!(d.rule.as_deref(), Some("builtin-private-key-in-result"));
    let cert = json!({"pem": "-----BEGIN CERTIFICATE-----"});
    assert_eq!(verdict(&p, "x__y", &cert), Verdict::Allow);
    let off = load("[policy]\nbuiltin_rules = false\n");
    assert_eq!(off.rule_count(), 0);
    assert_eq!(verdict(&off, "x__y", &args), Verdict::Allow);
}

#[test]
fn check_report_names_each_fault() {
    let text = r#"[[policy.rules]]
id = "bad-regex"
action = "block"
arg = { path = "x", matches = "(unclosed" }

[[policy.rules]]
id = "bad-glob"
action = "block"
tool = "local__[x"

[[policy.rules]]
id = "result-on-request"
action = "block"
result = { contains = "x" }

[[policy.rules]]
id = "replace-on-block"
action = "block"
replace = { matches = "a", with = "b" }

[[policy.rules]]
id = "rewrite-without-replace"
action = "rewrite"

[[policy.rules]]
id = "two-operators"
action = "block"
arg = { path = "x", equals = 1, contains = "1" }

[[policy.rules]]
id = "bad-path"
action = "block"
arg_present = "a..b"

[[policy.rules]]
id = "locked-here"
action = "block"
locked = true

[[policy.rules]]
id = "no-action"

[[policy.rules]]
id = "bad id!"
action = "block"

[[policy.rules]]
id = "bad-path"
action = "block"
"#;
    let op = file(text);
    let origin = op.path().display().to_string();
    let (out, code) = check_report_with_corp_env(&cfg(text), &origin, None);
    assert_eq!(code, CHECK_FAILED);
    let expect = [
        (
            "bad-regex",
            "line 2",
            "arg.matches: bad regex \"(unclosed\": unclosed group at character 1",
        ),
        ("bad-glob", "line 7", "tool: bad glob"),
        ("result-on-request", "line 12", "phase = \"response\""),
        ("replace-on-block", "line 17", "replace is only for"),
        ("rewrite-without-replace", "line 22", "needs replace"),
        ("two-operators", "line 26", "exactly one of"),
        ("bad-path", "line 31", "arg_present"),
        ("locked-here", "line 36", "only in the corp config"),
        ("no-action", "line 41", "action is required"),
        ("bad id!", "line 44", "id must be"),
        ("bad-path", "line 48", "duplicate rule id"),
    ];
    for (id, line, what) in expect {
        let found = out
            .lines()
            .any(|l| l.contains(&format!("rule \"{id}\"")) && l.contains(line) && l.contains(what));
        assert!(found, "no fault for {id} at {line} ({what}) in:\n{out}");
    }

    let (out, code) = check_report_with_corp_env(&cfg(""), "ok.toml", None);
    assert_eq!(code, 0, "{out}");
    assert!(out.starts_with("policy OK: 2 rules in force"), "{out}");
    assert!(out.contains("builtin-private-key-in-arguments"), "{out}");
}

#[test]
fn check_report_on_locked_violation() {
    let corp = file("[policy]\n[[policy.rules]]\nid = \"c\"\naction = \"block\"\nlocked = true\n");
    let text = "[[policy.rules]]\nid = \"c\"\nenabled = false\n";
    let (out, code) = check_report_with_corp_env(&cfg(text), "op.toml", Some(corp.path()));
    assert_eq!(code, CHECK_FAILED);
    assert!(
        out.contains("rule \"c\": locked by the corp config"),
        "{out}"
    );
}

#[test]
fn unknown_keys_are_refused_with_their_line() {
    for (text, key, line) in [
        ("[policy]\nbogus = 1\n", "bogus", "line 2"),
        (
            "[[policy.rules]]\nid = \"a\"\naction = \"block\"\nwhen = 1\n",
            "when",
            "line 4",
        ),
        (
            "[[policy.rules]]\nid = \"a\"\naction = \"block\"\narg = [{ path = \"a\", eq = 1 }]\n",
            "eq",
            "line 4",
        ),
        (
            "[[policy.rules]]\nid = \"a\"\naction = \"rewrite\"\nreplace = { matches = \"a\", with = \"b\", path = \"x\", to = 1 }\n",
            "to",
            "line 4",
        ),
        (
            "[[policy.rules]]\nid = \"a\"\naction = \"deny\"\n",
            "deny",
            "line 3",
        ),
        (
            "[[policy.rules]]\nid = \"a\"\naction = \"block\"\ntransport = \"tcp\"\n",
            "tcp",
            "line 4",
        ),
    ] {
        let err = match toml::from_str::<Wrapper>(text) {
            Ok(_) => panic!("accepted: {text}"),
            Err(e) => e.to_string(),
        };
        assert!(err.contains(key) && err.contains(line), "{err}");
    }
    // Through the real config loader too.
    let err = crate::config::Config::from_toml("[policy]\ndefalt = \"block\"\n", "t.toml")
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
    assert!(err.contains("defalt") && err.contains("line 2"), "{err}");
}

#[test]
fn explain_shows_decision_and_every_match() {
    let corp = file(
        "[policy]\n[[policy.rules]]\nid = \"corp-ask-shell\"\naction = \"ask\"\ntool = \"local__shell\"\nreason = \"shell needs a human\"\n",
    );
    let p = load_with(
        r#"[[policy.rules]]
id = "no-rm"
action = "block"
tool = "local__shell"
arg = { path = "cmd", contains = "rm " }
reason = "no deleting"

[[policy.rules]]
id = "redact"
action = "rewrite"
replace = { path = "cmd", matches = "hunter2", with = "***" }
"#,
        Some(corp.path()),
    );
    let mut q = ExplainQuery {
        tool: "local__shell".into(),
        args: Some(json!({"cmd": "rm -rf / hunter2"})),
        principal: "uid:1000".into(),
        ..ExplainQuery::default()
    };
    let out = explain(&p, &q);
    assert!(out.contains("decision: block"), "{out}");
    assert!(out.contains("deciding rule: no-rm (operator"), "{out}");
    assert!(out.contains("reason: no deleting"), "{out}");
    assert!(
        out.contains("corp-ask-shell") && out.contains("shell needs a human"),
        "{out}"
    );
    assert!(out.contains("corp "), "{out}");
    assert!(!out.contains("rewritten"), "no rewrite on block: {out}");

    q.args = Some(json!({"cmd": "echo hunter2"}));
    let out = explain(&p, &q);
    assert!(out.contains("decision: ask"), "{out}");
    assert!(
        out.contains("rewritten arguments (by redact, once approved)"),
        "{out}"
    );
    assert!(out.contains("echo ***"), "{out}");
    assert!(out.contains("tools/list: local__shell is listed"), "{out}");

    let q = ExplainQuery {
        tool: "local__cat".into(),
        phase: Phase::Response,
        result: Some(json!({"content": [{"type": "text", "text": "-----BEGIN PRIVATE KEY-----"}]})),
        ..ExplainQuery::default()
    };
    let out = explain(&p, &q);
    assert!(out.contains("decision: block"), "{out}");
    assert!(out.contains("builtin-private-key-in-result"), "{out}");
    assert!(out.contains("builtin"), "{out}");
}

#[test]
fn error_display_is_one_line_per_fault_joined() {
    let text = "[[policy.rules]]\nid = \"x\"\naction = \"block\"\ntool = \"[\"\n\n\
                [[policy.rules]]\nid = \"y\"\naction = \"block\"\narg = { matches = \"(\" }\n";
    let err = Policy::load_with_corp_env(&cfg(text), "op.toml", None).unwrap_err();
    assert_eq!(err.faults().len(), 2);
    assert!(err.to_string().starts_with("2 policy faults: "), "{err}");
}

#[test]
fn regex_size_limit_is_enforced() {
    let text = "[policy]\nmax_regex_bytes = 1000\n[[policy.rules]]\nid = \"big\"\naction = \"block\"\narg = { matches = '\\w{1000}' }\n";
    let err = load_err(text, "op.toml", None);
    assert!(err.contains("big") && err.contains("arg.matches"), "{err}");
}

/// Time per decision with 100 rules: `cargo test --release --lib policy::tests::timing --
/// --ignored --nocapture`. Prints; asserts nothing about time.
#[test]
#[ignore]
fn timing_100_rules() {
    let mut text = String::new();
    for i in 0..100 {
        let body = match i % 5 {
            0 => format!("tool = \"server{i}__*\""),
            1 => format!(
                "tool = \"local__tool{i}\"\narg = {{ path = \"path\", glob = \"/secret{i}/*\" }}"
            ),
            2 => format!("method = \"resources/read\"\nresource = \"file:///r{i}/*\""),
            3 => format!("tool = \"*__t{i}\"\nprincipal = \"uid:{i}\""),
            _ => {
                format!("tool = \"local__*\"\narg = {{ path = \"query\", matches = 'drop{i}\\b' }}")
            }
        };
        text.push_str(&format!(
            "[[policy.rules]]\nid = \"r{i:03}\"\naction = \"{}\"\n{body}\n\n",
            ["allow", "ask", "block"][i % 3]
        ));
    }
    let p = load(&text);
    assert_eq!(p.rule_count(), 102);
    // Matches r006 (allow, by glob on path) and r014 (block, by regex on query).
    let args = json!({"path": "/secret6/file.txt", "query": "drop14 table t", "n": 1});
    let s = call("local__tool6", Some(&args));
    let rounds = 200_000;
    let start = std::time::Instant::now();
    let mut blocks = 0;
    for _ in 0..rounds {
        let d = p.decide(Phase::Request, std::hint::black_box(&s), None);
        blocks += usize::from(d.verdict == Verdict::Block);
    }
    let per = start.elapsed() / rounds;
    let d = p.decide(Phase::Request, &s, None);
    println!(
        "100 rules (+2 built-in): {per:?} per decision; verdict {}, {} matched, {blocks} blocks",
        d.verdict,
        d.matched.len()
    );
    let small = call("other__thing", None);
    let start = std::time::Instant::now();
    for _ in 0..rounds {
        std::hint::black_box(p.decide(Phase::Request, std::hint::black_box(&small), None));
    }
    println!(
        "no arguments, nothing matching: {:?} per decision",
        start.elapsed() / rounds
    );
}

#[test]
fn limits_and_shapes() {
    fn shared<T: Send + Sync>() {}
    shared::<Policy>();
    for bad in [
        "ask_timeout_secs = 0",
        "ask_timeout_secs = 99999999999",
        "max_regex_bytes = 0",
    ] {
        let err = load_err(&format!("[policy]\n{bad}\n"), "op.toml", None);
        assert!(err.contains(bad.split(' ').next().unwrap_or("?")), "{err}");
    }
    // One transport or a list; one arg table or a list; one arg_present or a list.
    let p = load(
        r#"[[policy.rules]]
id = "http-only"
action = "block"
transport = "http"
arg_present = ["a", "b"]

[[policy.rules.arg]]
path = "a"
equals = 1
"#,
    );
    let args = json!({"a": 1, "b": 2});
    let mut s = call("x__y", Some(&args));
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Allow);
    s.transport = Transport::Http;
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Block);
    let only_a = json!({"a": 1});
    s.arguments = Some(&only_a);
    assert_eq!(p.decide(Phase::Request, &s, None).verdict, Verdict::Allow);
}

#[test]
fn readme_examples_load() {
    let readme = include_str!("README.md");
    let blocks: Vec<&str> = readme
        .split("```toml\n")
        .skip(1)
        .filter_map(|rest| rest.split("```").next())
        .collect();
    assert!(blocks.len() >= 5);
    for block in blocks {
        if block.contains("default_locked") {
            let corp = file(block);
            let p = load_with("", Some(corp.path()));
            assert_eq!(p.default_verdict(), Verdict::Block);
            let d = p.decide(Phase::Request, &call("s3__upload_file", None), None);
            assert_eq!(d.rule.as_deref(), Some("corp-no-uploads"));
        } else {
            let p = load(block);
            assert!(p.rule_count() >= 1, "{block}");
        }
    }
}

#[test]
fn ask_via_client_needs_every_matching_ask_rule_and_the_corp_config() {
    let rules = r#"
[[policy.rules]]
id = "a-client"
action = "ask"
tool = "gh__*"
ask_via = "client"

[[policy.rules]]
id = "b-operator"
action = "ask"
tool = "gh__delete*"
"#;
    let p = load(rules);
    let args = json!({});
    let d = p.decide(Phase::Request, &call("gh__search", Some(&args)), None);
    assert_eq!((d.verdict, d.ask_via), (Verdict::Ask, AskVia::Client));
    // Another matching ask rule that keeps the operator wins.
    let d = p.decide(Phase::Request, &call("gh__delete_repo", Some(&args)), None);
    assert_eq!((d.verdict, d.ask_via), (Verdict::Ask, AskVia::Operator));
    // A default ask is the operator's.
    let d = load("[policy]\ndefault = \"ask\"\n").decide(
        Phase::Request,
        &call("gh__search", Some(&args)),
        None,
    );
    assert_eq!(d.ask_via, AskVia::Operator);
    // The corp config forbids it: the operator decides, and the load says why.
    let corp = file("[policy]\nallow_ask_via_client = false\n");
    let p = load_with(rules, Some(corp.path()));
    let d = p.decide(Phase::Request, &call("gh__search", Some(&args)), None);
    assert_eq!(d.ask_via, AskVia::Operator);
    assert!(
        p.warnings().iter().any(|w| w.contains("a-client")),
        "{:?}",
        p.warnings()
    );
    // A different policy, a different fingerprint; the same one, the same.
    assert_eq!(load(rules).fingerprint(), load(rules).fingerprint());
    assert_ne!(load(rules).fingerprint(), load("").fingerprint());
}

#[test]
fn ask_via_only_where_it_means_something() {
    for (text, words) in [
        (
            "[[policy.rules]]\nid = \"x\"\naction = \"block\"\nask_via = \"client\"\n",
            "ask_via is only for action = \"ask\"",
        ),
        (
            "[[policy.rules]]\nid = \"x\"\naction = \"ask\"\nphase = \"response\"\nask_via = \"client\"\n",
            "needs phase = \"request\"",
        ),
    ] {
        let e = load_err(text, "t.toml", None);
        assert!(e.contains(words), "{e}");
    }
}
