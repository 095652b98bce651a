//! The command line. Every subcommand takes `--config FILE`; without it the system config
//! when it exists, else the embedded defaults.

use lexopt::prelude::*;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::Config;
use crate::gateway::event_loop::{Exit, FromSystemd, Gateway, Mode};
use crate::policy::{self, ExplainQuery, Phase, Policy, Transport};

const USAGE: &str = "\
toolwall: an MCP firewall between AI agents and the tools they call

Usage: toolwall <COMMAND> [--config FILE] [OPTIONS]

Gateway:
  serve                      Run the gateway daemon (framed unix/vsock doors, HTTP door,
                             admin socket)
  stdio                      Serve one host agent on stdin/stdout (no daemon needed)

Daemon (over the admin socket):
  status [--json]            Workers, confinement, counters, ledger health
  reload                     Re-read the config; the policy swaps atomically
  approvals [--json]         Calls held by an `ask` rule, with their arguments
  approve ID                 Let a held call go to its tool
  deny ID [--reason TEXT]    Refuse a held call
  pins list [--json]         Pinned upstream tools; a changed one shows old and new
  pins approve SERVER__TOOL  Accept a pinned tool's changed definition

Tokens for the HTTP door (stored as hashes in the ledger database):
  token create --principal NAME [--kind client|admin] [--expires 30d|never]
                             Prints the token once; keep it, it cannot be shown again
  token list                 Ids, principals, kinds, expiry, revocation
  token revoke ID

Files (no daemon needed):
  ledger tail | query | show ID | stats | verify | key | archive list
                             Read, question and check the ledger (live or a copy):
                             `toolwall ledger --help` for filters and options
  policy check               Validate the policy (config, corp layer); non-zero on any fault
  policy explain --tool NAME [--args JSON] [--principal P] [--transport T]
                 [--process P] [--method M] [--resource URI]
                 [--phase request|response] [--result JSON]
                             The decision for a call and every rule that matched

Options:
  --config FILE              Config file (default /etc/toolwall/toolwall.toml if it exists,
                             else embedded defaults with state in ./toolwall-data/)
  -h, --help                 This help
  -V, --version              Version

Internal: `toolwall worker ROLE` is started by the gateway only.
";

/// Run the command line; returns the exit code.
pub fn main() -> i32 {
    match run() {
        Ok(code) => code,
        Err(message) => {
            eprintln!("toolwall: {message}");
            2
        }
    }
}

fn run() -> Result<i32, String> {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if crate::ledger::cli::is_ledger_command(&args) {
        return crate::ledger::cli::run(args);
    }
    let mut parser = lexopt::Parser::from_args(args);
    let mut command: Vec<String> = Vec::new();
    let mut config_path: Option<PathBuf> = None;
    let mut json_out = false;
    let mut reason: Option<String> = None;
    let mut explain = ExplainArgs::default();
    let mut kind: Option<String> = None;
    let mut expires: Option<String> = None;
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        match arg {
            Short('h') | Long("help") => {
                print!("{USAGE}");
                return Ok(0);
            }
            Short('V') | Long("version") => {
                println!("toolwall {}", env!("CARGO_PKG_VERSION"));
                return Ok(0);
            }
            Long("config") => config_path = Some(parser.value().map_err(|e| e.to_string())?.into()),
            Long("json") => json_out = true,
            Long("reason") => reason = Some(string(parser.value())?),
            Long("tool") => explain.tool = Some(string(parser.value())?),
            Long("args") => explain.args = Some(string(parser.value())?),
            Long("principal") => explain.principal = Some(string(parser.value())?),
            Long("transport") => explain.transport = Some(string(parser.value())?),
            Long("process") => explain.process = Some(string(parser.value())?),
            Long("method") => explain.method = Some(string(parser.value())?),
            Long("phase") => explain.phase = Some(string(parser.value())?),
            Long("result") => explain.result = Some(string(parser.value())?),
            Long("resource") => explain.resource = Some(string(parser.value())?),
            Long("kind") => kind = Some(string(parser.value())?),
            Long("expires") => expires = Some(string(parser.value())?),
            Value(v) => command.push(
                v.into_string()
                    .map_err(|v| format!("argument {v:?} is not UTF-8"))?,
            ),
            _ => return Err(arg.unexpected().to_string()),
        }
    }
    let words: Vec<&str> = command.iter().map(String::as_str).collect();
    match words.as_slice() {
        [] => {
            eprint!("{USAGE}");
            Ok(2)
        }
        ["worker", role] => {
            let role = role.parse().map_err(|e: String| e)?;
            Ok(crate::workers::worker_main::run(role))
        }
        ["serve"] => serve(config_path, Mode::Serve),
        ["stdio"] => serve(config_path, Mode::Stdio),
        ["status"] => {
            let config = load(config_path)?;
            let reply = admin_request(&config, &serde_json::json!({"op": "status"}))?;
            if json_out {
                println!("{reply}");
            } else {
                print!("{}", format_status(&reply));
            }
            Ok(if reply["ok"] == true { 0 } else { 1 })
        }
        ["reload"] => {
            let config = load(config_path)?;
            let reply = admin_request(&config, &serde_json::json!({"op": "reload"}))?;
            admin_outcome(&reply, json_out)
        }
        ["approvals"] => {
            let config = load(config_path)?;
            let reply = admin_request(&config, &serde_json::json!({"op": "approvals"}))?;
            if json_out {
                println!("{reply}");
            } else {
                print!("{}", format_approvals(&reply));
            }
            Ok(if reply["ok"] == true { 0 } else { 1 })
        }
        ["approve", id] | ["deny", id] => {
            let id: u64 = id
                .parse()
                .map_err(|_| format!("approval id must be a number, got {id:?}"))?;
            let config = load(config_path)?;
            let request = if words[0] == "approve" {
                serde_json::json!({"op": "approve", "id": id})
            } else {
                serde_json::json!({"op": "deny", "id": id, "reason": reason})
            };
            let reply = admin_request(&config, &request)?;
            admin_outcome(&reply, json_out)
        }
        ["token", "create"] => {
            let config = load(config_path)?;
            let principal = explain
                .principal
                .ok_or("token create needs --principal NAME")?;
            crate::tokens::validate_principal(&principal)?;
            let kind = crate::tokens::TokenKind::parse(kind.as_deref().unwrap_or("client"))?;
            let lifetime =
                crate::tokens::cli_output::parse_lifetime(expires.as_deref().unwrap_or("never"))?;
            let store =
                crate::tokens::TokenStore::open(&config.ledger.path).map_err(|e| e.to_string())?;
            let new = store
                .create(&principal, kind, lifetime, crate::ledger::now_ms())
                .map_err(|e| e.to_string())?;
            print!("{}", crate::tokens::cli_output::format_created(&new));
            Ok(0)
        }
        ["token", "list"] => {
            let config = load(config_path)?;
            let store =
                crate::tokens::TokenStore::open(&config.ledger.path).map_err(|e| e.to_string())?;
            let tokens = store.list().map_err(|e| e.to_string())?;
            print!(
                "{}",
                crate::tokens::cli_output::format_list(&tokens, crate::ledger::now_ms())
            );
            Ok(0)
        }
        ["token", "revoke", id] => {
            let id = crate::tokens::cli_output::parse_token_id(id)?;
            let config = load(config_path)?;
            let store =
                crate::tokens::TokenStore::open(&config.ledger.path).map_err(|e| e.to_string())?;
            let outcome = store
                .revoke(id, crate::ledger::now_ms())
                .map_err(|e| e.to_string())?;
            let (text, code) = crate::tokens::cli_output::format_revoked(id, &outcome);
            print!("{text}");
            Ok(code)
        }
        ["pins", "list"] => {
            let config = load(config_path)?;
            let reply = admin_request(&config, &serde_json::json!({"op": "pins"}))?;
            if json_out {
                println!("{reply}");
            } else if reply["ok"] == true {
                print!("{}", crate::pins::cli_output::format_pins(&reply["pins"]));
            } else {
                eprintln!("toolwall: {}", reply["error"].as_str().unwrap_or("failed"));
            }
            Ok(if reply["ok"] == true { 0 } else { 1 })
        }
        ["pins", "approve", tool] => {
            let config = load(config_path)?;
            let reply = admin_request(
                &config,
                &serde_json::json!({"op": "pin_approve", "tool": tool}),
            )?;
            admin_outcome(&reply, json_out)
        }
        ["policy", "check"] => {
            let config = match Config::load(config_path.as_deref()) {
                Ok(c) => c,
                Err(e) => {
                    println!("{e}");
                    return Ok(1);
                }
            };
            let origin = origin(&config);
            let (text, code) = policy::check_report(&config.policy, &origin);
            print!("{text}");
            if !text.ends_with('\n') {
                println!();
            }
            Ok(code)
        }
        ["policy", "explain"] => {
            let config = load(config_path)?;
            let policy =
                Policy::load(&config.policy, &origin(&config)).map_err(|e| e.to_string())?;
            let query = explain.into_query()?;
            print!("{}", policy::explain(&policy, &query));
            Ok(0)
        }
        _ => Err(format!(
            "unknown command {:?}; see toolwall --help",
            command.join(" ")
        )),
    }
}

fn string(v: Result<std::ffi::OsString, lexopt::Error>) -> Result<String, String> {
    v.map_err(|e| e.to_string())?
        .into_string()
        .map_err(|v| format!("argument {v:?} is not UTF-8"))
}

fn load(path: Option<PathBuf>) -> Result<Config, String> {
    Config::load(path.as_deref()).map_err(|e| e.to_string())
}

fn origin(config: &Config) -> String {
    config
        .source
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "embedded defaults".into())
}

fn serve(config_path: Option<PathBuf>, mode: Mode) -> Result<i32, String> {
    // What systemd passed is taken before anything opens an fd or starts a thread.
    let from_systemd = match mode {
        Mode::Serve => FromSystemd {
            inherited: crate::systemd::listen_fds()?,
            notifier: crate::systemd::Notifier::from_env()
                .map_err(|e| format!("NOTIFY_SOCKET: {e}"))?,
            watchdog_period: crate::systemd::watchdog_interval(),
        },
        Mode::Stdio => FromSystemd::default(),
    };
    let config = load(config_path)?;
    let mut gateway = Gateway::with_systemd(config, mode, from_systemd)?;
    match gateway.run()? {
        Exit::Stopped | Exit::StdinClosed => Ok(0),
    }
}

/// Longest wait for the daemon's answer.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(10);

fn admin_request(
    config: &Config,
    request: &serde_json::Value,
) -> Result<serde_json::Value, String> {
    let path = &config.admin.socket;
    let mut stream = UnixStream::connect(path).map_err(|e| {
        format!(
            "cannot reach the daemon at {}: {e} (is `toolwall serve` running with this config?)",
            path.display()
        )
    })?;
    stream
        .set_read_timeout(Some(ADMIN_TIMEOUT))
        .map_err(|e| e.to_string())?;
    let mut line = request.to_string();
    line.push('\n');
    stream
        .write_all(line.as_bytes())
        .map_err(|e| format!("admin socket: {e}"))?;
    let mut reader = BufReader::new(stream).take(16 * 1024 * 1024);
    let mut answer = String::new();
    reader
        .read_line(&mut answer)
        .map_err(|e| format!("admin socket: {e}"))?;
    serde_json::from_str(&answer).map_err(|e| format!("admin socket sent a bad answer: {e}"))
}

fn admin_outcome(reply: &serde_json::Value, json_out: bool) -> Result<i32, String> {
    if json_out {
        println!("{reply}");
    } else if reply["ok"] == true {
        println!(
            "{}",
            reply
                .get("message")
                .and_then(|m| m.as_str())
                .unwrap_or("ok")
        );
    } else {
        eprintln!("toolwall: {}", reply["error"].as_str().unwrap_or("failed"));
    }
    Ok(if reply["ok"] == true { 0 } else { 1 })
}

fn format_status(s: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if s["ok"] != true {
        let _ = writeln!(out, "error: {}", s["error"]);
        return out;
    }
    let _ = writeln!(
        out,
        "toolwall {}  ready: {}  uptime: {} s  connections: {}  in flight: {}  tools: {}",
        s["version"].as_str().unwrap_or(""),
        s["ready"],
        s["uptime_s"],
        s["connections"],
        s["in_flight"],
        s["tools"]
    );
    let _ = writeln!(
        out,
        "ledger: {} (writable: {})  policy: {} rules, default {}  sandbox: {}  last reload: {}",
        s["ledger"]["path"].as_str().unwrap_or(""),
        s["ledger"]["writable"],
        s["policy"]["rules"],
        s["policy"]["default"].as_str().unwrap_or(""),
        s["sandbox_mode"].as_str().unwrap_or(""),
        s["last_reload"].as_str().unwrap_or("never")
    );
    let c = &s["counters"];
    let _ = writeln!(
        out,
        "calls: {} (allowed {}, denied {}, error {})",
        c["calls_total"], c["calls_allowed"], c["calls_denied"], c["calls_error"]
    );
    for w in s["workers"].as_array().into_iter().flatten() {
        let conf = &w["confinement"];
        let _ = writeln!(
            out,
            "worker {}  role {}  pid {}  state {}  restarts {}  landlock ABI {} {}  seccomp {}  no_new_privs {}",
            w["name"].as_str().unwrap_or(""),
            w["role"].as_str().unwrap_or(""),
            w["pid"],
            w["state"].as_str().unwrap_or(""),
            w["restarts"],
            conf["landlock_abi"],
            conf["landlock"].as_str().unwrap_or("unknown"),
            conf["seccomp"],
            conf["no_new_privs"]
        );
        for p in conf["probes"].as_array().into_iter().flatten() {
            let _ = writeln!(
                out,
                "    probe {:<24} {}  {}",
                p["name"].as_str().unwrap_or(""),
                if p["denied"] == true {
                    "denied"
                } else if p["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("by design"))
                {
                    "allowed (by design)"
                } else {
                    "ALLOWED"
                },
                p["detail"].as_str().unwrap_or("")
            );
        }
        for warning in w["warnings"].as_array().into_iter().flatten() {
            let _ = writeln!(out, "    WARNING: {}", warning.as_str().unwrap_or(""));
        }
        if let Some(e) = w["last_exit"].as_str() {
            let _ = writeln!(out, "    last exit: {e}");
        }
    }
    out.push_str(&crate::aggregator::status::format_servers(&s["servers"]));
    out
}

fn format_approvals(reply: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let pending = reply["pending"].as_array().cloned().unwrap_or_default();
    if pending.is_empty() {
        out.push_str("no calls awaiting approval\n");
    }
    for p in pending {
        let _ = writeln!(
            out,
            "{}  {}  principal {}  process {}  via {}  waiting {} ms  rule {}\n    arguments: {}",
            p["id"],
            p["tool"].as_str().unwrap_or(""),
            p["principal"].as_str().unwrap_or(""),
            p["process"].as_str().unwrap_or(""),
            p["transport"].as_str().unwrap_or(""),
            p["waiting_ms"],
            p["rule"].as_str().unwrap_or("-"),
            p["arguments"].as_str().unwrap_or("")
        );
    }
    out
}

#[derive(Default)]
struct ExplainArgs {
    tool: Option<String>,
    args: Option<String>,
    principal: Option<String>,
    transport: Option<String>,
    process: Option<String>,
    method: Option<String>,
    phase: Option<String>,
    result: Option<String>,
    resource: Option<String>,
}

impl ExplainArgs {
    fn into_query(self) -> Result<ExplainQuery, String> {
        let tool = self.tool.ok_or("policy explain needs --tool NAME")?;
        let json =
            |what: &str, text: Option<String>| -> Result<Option<serde_json::Value>, String> {
                text.map(|t| {
                    serde_json::from_str(&t).map_err(|e| format!("{what} is not valid JSON: {e}"))
                })
                .transpose()
            };
        let transport = match self.transport.as_deref().unwrap_or("unix") {
            "unix" => Transport::Unix,
            "vsock" => Transport::Vsock,
            "stdio" => Transport::Stdio,
            "http" => Transport::Http,
            other => {
                return Err(format!(
                    "--transport must be unix, vsock, stdio or http, not {other:?}"
                ));
            }
        };
        let phase = match self.phase.as_deref().unwrap_or("request") {
            "request" => Phase::Request,
            "response" => Phase::Response,
            other => {
                return Err(format!(
                    "--phase must be request or response, not {other:?}"
                ));
            }
        };
        Ok(ExplainQuery {
            tool,
            args: json("--args", self.args)?,
            principal: self.principal.unwrap_or_else(|| "uid:0".into()),
            transport,
            process: self.process.unwrap_or_else(|| "unknown".into()),
            phase,
            result: json("--result", self.result)?,
            method: self.method.unwrap_or_else(|| "tools/call".into()),
            resource: self.resource,
        })
    }
}
