//! The policy the benchmark runs with: realistic operator rules (blocks, asks and allows on
//! other tools, argument regexes), none of which blocks `local__echo`. Some of them do look
//! at every call's arguments (an argument regex without a tool), so the echo pays for a real
//! evaluation, not a shortcut.

/// The 20 rules of the gateway's config, as `[[policy.rules]]` tables.
pub const TWENTY_RULES: &str = r#"
[[policy.rules]]
id = "no-shell"
action = "block"
tool = "*__shell*"
reason = "agents do not get a shell"

[[policy.rules]]
id = "no-exec"
action = "block"
tool = "*__exec*"

[[policy.rules]]
id = "vm-deletes-ask"
action = "ask"
tool = "*__delete*"
transport = "vsock"

[[policy.rules]]
id = "no-ssh-dir"
action = "block"
arg = { path = "path", matches = '(^|/)\.ssh(/|$)' }
reason = "~/.ssh is off limits"

[[policy.rules]]
id = "no-internal-urls"
action = "block"
tool = "local__http_*"
arg = { path = "url", matches = '^https?://(localhost|127\.|10\.|192\.168\.|169\.254\.)' }

[[policy.rules]]
id = "no-aws-keys-out"
action = "block"
arg = { matches = 'AKIA[0-9A-Z]{16}' }
reason = "no AWS access keys leave through tools"

[[policy.rules]]
id = "local-reads"
action = "allow"
tool = "local__{read,list,search}*"

[[policy.rules]]
id = "local-echo"
action = "allow"
tool = "local__echo"

[[policy.rules]]
id = "no-uploads"
action = "block"
tool = "*__upload*"

[[policy.rules]]
id = "payments-ask"
action = "ask"
server = "payments"

[[policy.rules]]
id = "no-db-drop"
action = "block"
tool = "db__drop*"

[[policy.rules]]
id = "db-writes-ask"
action = "ask"
tool = "db__{insert,update}*"

[[policy.rules]]
id = "no-etc-shadow"
action = "block"
method = "resources/read"
resource = "file:///etc/shadow"

[[policy.rules]]
id = "mail-ask"
action = "ask"
tool = "*__send_mail*"

[[policy.rules]]
id = "github-reads"
action = "allow"
tool = "github__{get,list,search}_*"

[[policy.rules]]
id = "github-force-push"
action = "block"
tool = "github__push*"
arg_present = "force"

[[policy.rules]]
id = "no-curl-process"
action = "block"
process = "curl"

[[policy.rules]]
id = "no-root-principal"
action = "block"
principal = "uid:0"
tool = "*__write*"

[[policy.rules]]
id = "file-urls"
action = "block"
tool = "local__http_*"
arg = { path = "url", matches = '^(file|gopher|ftp):' }

[[policy.rules]]
id = "no-aws-keys-in"
action = "block"
phase = "response"
tool = "*__http_*"
result = { matches = 'AKIA[0-9A-Z]{16}' }
"#;

/// `n` rules for the policy micro-benchmark, as the `[[rules]]` tables of a bare
/// `PolicyConfig`: the twenty above first (as many as fit), then generated ones alike them
/// (a tool glob for another server, every fifth one with an argument regex).
pub fn rules_toml(n: usize) -> String {
    let mut out = String::from("builtin_rules = false\n");
    let twenty = TWENTY_RULES.replace("[[policy.rules]]", "[[rules]]");
    for (taken, table) in twenty.split("[[rules]]").skip(1).enumerate() {
        if taken == n {
            return out;
        }
        out.push_str("[[rules]]");
        out.push_str(table);
    }
    for i in 20..n {
        out.push_str(&format!(
            "\n[[rules]]\nid = \"svc{i}-rule\"\naction = \"{}\"\ntool = \"svc{i}__*\"\n",
            ["block", "ask", "allow"][i % 3]
        ));
        if i % 5 == 0 {
            out.push_str(&format!(
                "arg = {{ path = \"query\", matches = '(?i)drop\\s+table\\s+t{i}' }}\n"
            ));
        }
    }
    out
}
