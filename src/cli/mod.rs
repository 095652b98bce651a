//! The command line: parsed from the table in `args.rs` (each subcommand accepts only its
//! own flags and has its own `--help`), then dispatched here. Every subcommand takes
//! `--config FILE`; without it the system config when it exists, else the embedded
//! defaults.

use std::io::{BufRead, BufReader, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::time::Duration;

use crate::config::Config;
use crate::gateway::event_loop::{Exit, FromSystemd, Gateway, Mode};
use crate::policy::{self, ExplainQuery, Phase, Policy, Transport};

mod args;
mod format;

use args::{Outcome, Parsed};
use format::{format_approvals, format_status};

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
    // The ledger's subcommands have their own filters and help (src/ledger/cli.rs).
    if crate::ledger::cli::is_ledger_command(&args) {
        return crate::ledger::cli::run(args);
    }
    let parsed = match args::parse(args)? {
        Outcome::Run(p) => p,
        Outcome::Help(text) => {
            print!("{text}");
            return Ok(0);
        }
        Outcome::Version => {
            println!("toolwall {}", env!("CARGO_PKG_VERSION"));
            return Ok(0);
        }
    };
    let config_path = parsed.config();
    let json_out = parsed.switch("json");
    let positional: Vec<&str> = parsed.positional.iter().map(String::as_str).collect();
    let words: Vec<&str> = parsed.words.iter().copied().chain(positional).collect();
    match words.as_slice() {
        ["worker", role] => {
            let role = role.parse().map_err(|e: String| e)?;
            Ok(crate::workers::worker_main::run(role))
        }
        // Internal: the gateway starts it (agent programs' user switch).
        ["agent-launcher"] => Ok(crate::launcher::server::run()),
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
        ["status", server] => {
            let config = load(config_path)?;
            let request = serde_json::json!({"op": "status", "server": server});
            let reply = admin_request(&config, &request)?;
            if json_out {
                println!("{reply}");
            } else {
                print!("{}", format::format_server_status(&reply));
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
                serde_json::json!({"op": "deny", "id": id, "reason": parsed.flag("reason")})
            };
            let reply = admin_request(&config, &request)?;
            admin_outcome(&reply, json_out)
        }
        ["import", file] => {
            // The secrets go to the state directory of the config merged into, else of
            // --config.
            let write = parsed.flag("write").map(PathBuf::from);
            let config = match &write {
                Some(target) if target.exists() => {
                    Config::from_file(target).map_err(|e| e.to_string())?
                }
                _ => load(config_path.clone())?,
            };
            crate::import::run(&crate::import::ImportRequest {
                file: std::path::Path::new(file),
                write: write.as_deref(),
                rewrite_client: parsed.switch("rewrite-client"),
                config: &config,
                config_path: config_path.clone().or_else(|| config.source.clone()),
            })
        }
        ["token", "create"] => {
            let config = load(config_path)?;
            let principal = parsed
                .flag("principal")
                .ok_or("token create needs --principal NAME")?
                .to_owned();
            crate::tokens::validate_principal(&principal)?;
            let kind = crate::tokens::TokenKind::parse(parsed.flag("kind").unwrap_or("client"))?;
            let lifetime = crate::tokens::cli_output::parse_lifetime(
                parsed.flag("expires").unwrap_or("never"),
            )?;
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
            let digest = crate::pins::cli_output::check_digest(tool, parsed.flag("digest"))?;
            let config = load(config_path)?;
            let reply = admin_request(
                &config,
                &serde_json::json!({"op": "pin_approve", "tool": tool, "digest": digest}),
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
            let query = explain_query(&parsed)?;
            print!("{}", policy::explain(&policy, &query));
            Ok(0)
        }
        _ => Err(format!(
            "unknown command {:?}; see toolwall --help",
            words.join(" ")
        )),
    }
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

/// Most bytes of one admin answer this command reads. A `pins list` holds every pinned
/// and held definition of every server, each up to its server's budgets: one server's
/// 1,300 held tools and prompts of 6,000 characters, 1,000 templates and 10,000 long URIs
/// came to more than 16 MiB, the bound before.
const ADMIN_ANSWER_MAX_BYTES: u64 = 256 * 1024 * 1024;

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
    let mut reader = BufReader::new(stream).take(ADMIN_ANSWER_MAX_BYTES);
    let mut answer = String::new();
    reader
        .read_line(&mut answer)
        .map_err(|e| format!("admin socket: {e}"))?;
    if !answer.ends_with('\n') && answer.len() as u64 >= ADMIN_ANSWER_MAX_BYTES {
        return Err(format!(
            "the daemon's answer is larger than {} MiB, the most this command reads \
             (for `pins list`: servers listing many large definitions; lower their \
             [servers] listing budgets)",
            ADMIN_ANSWER_MAX_BYTES >> 20
        ));
    }
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

/// `policy explain`'s flags as a query.
fn explain_query(p: &Parsed) -> Result<ExplainQuery, String> {
    let owned = |f: &str| p.flag(f).map(str::to_owned);
    ExplainArgs {
        tool: owned("tool"),
        args: owned("args"),
        principal: owned("principal"),
        transport: owned("transport"),
        process: owned("process"),
        method: owned("method"),
        phase: owned("phase"),
        result: owned("result"),
        resource: owned("resource"),
    }
    .into_query()
}

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
