//! The command line as data: every subcommand, the words that name it, its positional
//! arguments and the only flags it accepts. Parsing is sans-IO (a list of arguments in, a
//! parsed command or a help text out), and `--help` is generated from the same table, so it
//! cannot drift from what is accepted.

use std::collections::BTreeMap;
use std::ffi::OsString;

/// A flag: `--long`, maybe `-s`, maybe with a value.
pub struct Flag {
    pub long: &'static str,
    pub short: Option<char>,
    /// The value's name in help (`FILE`), or None for a switch.
    pub value: Option<&'static str>,
    pub help: &'static str,
}

/// One subcommand.
pub struct Command {
    pub words: &'static [&'static str],
    /// Names of positional arguments, in order; `[NAME]` is optional (only at the end).
    pub positional: &'static [&'static str],
    /// The flags it accepts besides `--config` and `--help`.
    pub flags: &'static [&'static str],
    pub group: &'static str,
    pub summary: &'static str,
}

pub const FLAGS: &[Flag] = &[
    Flag {
        long: "config",
        short: None,
        value: Some("FILE"),
        help: "Config file (default /etc/toolwall/toolwall.toml if it exists, else embedded defaults with state in ./toolwall-data/)",
    },
    Flag {
        long: "json",
        short: None,
        value: None,
        help: "Print the daemon's answer as JSON",
    },
    Flag {
        long: "reason",
        short: None,
        value: Some("TEXT"),
        help: "Why (recorded with the decision)",
    },
    Flag {
        long: "tool",
        short: None,
        value: Some("NAME"),
        help: "The namespaced tool, server__tool",
    },
    Flag {
        long: "args",
        short: None,
        value: Some("JSON"),
        help: "The call's arguments",
    },
    Flag {
        long: "principal",
        short: None,
        value: Some("P"),
        help: "Who calls (uid:N, cid:N or a token's principal)",
    },
    Flag {
        long: "transport",
        short: None,
        value: Some("T"),
        help: "unix | vsock | stdio | http (default unix)",
    },
    Flag {
        long: "process",
        short: None,
        value: Some("NAME"),
        help: "The calling process's name",
    },
    Flag {
        long: "method",
        short: None,
        value: Some("M"),
        help: "The JSON-RPC method (default tools/call)",
    },
    Flag {
        long: "resource",
        short: None,
        value: Some("URI"),
        help: "The URI of a resources/read",
    },
    Flag {
        long: "phase",
        short: None,
        value: Some("P"),
        help: "request | response (default request)",
    },
    Flag {
        long: "result",
        short: None,
        value: Some("JSON"),
        help: "The result, for the response phase",
    },
    Flag {
        long: "kind",
        short: None,
        value: Some("K"),
        help: "client | admin (default client)",
    },
    Flag {
        long: "expires",
        short: None,
        value: Some("D"),
        help: "30d, 12h, ... or never (default never)",
    },
    Flag {
        long: "write",
        short: None,
        value: Some("CONFIG"),
        help: "Merge the imported servers into this toolwall config (refused when a name is taken; the previous file is kept as CONFIG.toolwall-backup)",
    },
    Flag {
        long: "rewrite-client",
        short: None,
        value: None,
        help: "Replace the imported servers in the client's file with one toolwall entry (the previous file is kept as FILE.toolwall-backup; the diff is printed)",
    },
    Flag {
        long: "digest",
        short: None,
        value: Some("SHA256"),
        help: "The digest `pins list` shows for the version you reviewed (required)",
    },
];

pub const COMMANDS: &[Command] = &[
    Command {
        words: &["serve"],
        positional: &[],
        flags: &[],
        group: "Gateway",
        summary: "Run the gateway daemon (framed unix/vsock doors, HTTP door, admin socket)",
    },
    Command {
        words: &["stdio"],
        positional: &[],
        flags: &[],
        group: "Gateway",
        summary: "Serve one host agent on stdin/stdout (no daemon needed; asks are refused unless the admin socket is out of the agent's reach)",
    },
    Command {
        words: &["status"],
        positional: &["[SERVER]"],
        flags: &["json"],
        group: "Daemon (over the admin socket)",
        summary: "Workers, confinement, counters, ledger health; with SERVER, that server's state, its host's probes and a local server's last stderr lines",
    },
    Command {
        words: &["reload"],
        positional: &[],
        flags: &["json"],
        group: "Daemon (over the admin socket)",
        summary: "Re-read the config; the policy swaps atomically",
    },
    Command {
        words: &["approvals"],
        positional: &[],
        flags: &["json"],
        group: "Daemon (over the admin socket)",
        summary: "Calls held by an `ask` rule, with their arguments",
    },
    Command {
        words: &["approve"],
        positional: &["ID"],
        flags: &["json"],
        group: "Daemon (over the admin socket)",
        summary: "Let a held call go to its server",
    },
    Command {
        words: &["deny"],
        positional: &["ID"],
        flags: &["reason", "json"],
        group: "Daemon (over the admin socket)",
        summary: "Refuse a held call",
    },
    Command {
        words: &["pins", "list"],
        positional: &[],
        flags: &["json"],
        group: "Daemon (over the admin socket)",
        summary: "Pinned upstream tools: each version's full sha256, a changed tool's fields approved and waiting, new tools held",
    },
    Command {
        words: &["pins", "approve"],
        positional: &["SERVER__TOOL"],
        flags: &["digest", "json"],
        group: "Daemon (over the admin socket)",
        summary: "Approve exactly the waiting definition with that digest",
    },
    Command {
        words: &["import"],
        positional: &["FILE"],
        flags: &["write", "rewrite-client"],
        group: "Files (no daemon needed)",
        summary: "Print an agent client's MCP servers (Claude Code .mcp.json or ~/.claude.json, Cursor mcp.json, VS Code .vscode/mcp.json, Codex config.toml) as [servers.*] tables; secrets go to 0600 files in the state directory",
    },
    Command {
        words: &["token", "create"],
        positional: &[],
        flags: &["principal", "kind", "expires"],
        group: "Tokens for the HTTP door (stored as hashes in the ledger database)",
        summary: "Create a token; printed once, it cannot be shown again",
    },
    Command {
        words: &["token", "list"],
        positional: &[],
        flags: &[],
        group: "Tokens for the HTTP door (stored as hashes in the ledger database)",
        summary: "Ids, principals, kinds, expiry, revocation",
    },
    Command {
        words: &["token", "revoke"],
        positional: &["ID"],
        flags: &[],
        group: "Tokens for the HTTP door (stored as hashes in the ledger database)",
        summary: "Revoke a token",
    },
    Command {
        // Shown in the usage only: `toolwall ledger ...` is parsed by `crate::ledger::cli`,
        // which has its own subcommands, filters and --help.
        words: &["ledger"],
        positional: &["tail|query|show ID|stats|verify|key|archive list"],
        flags: &[],
        group: "Files (no daemon needed)",
        summary: "Read, question and check the ledger, live or a copy (`toolwall ledger --help` for filters and options)",
    },
    Command {
        words: &["policy", "check"],
        positional: &[],
        flags: &[],
        group: "Files (no daemon needed)",
        summary: "Validate the policy (config, corp layer); non-zero on any fault",
    },
    Command {
        words: &["policy", "explain"],
        positional: &[],
        flags: &[
            "tool",
            "args",
            "principal",
            "transport",
            "process",
            "method",
            "resource",
            "phase",
            "result",
        ],
        group: "Files (no daemon needed)",
        summary: "The decision for a call and every rule that matched",
    },
    Command {
        words: &["worker"],
        positional: &["ROLE"],
        flags: &[],
        group: "",
        summary: "Internal: started by the gateway only",
    },
    Command {
        words: &["agent-launcher"],
        positional: &[],
        flags: &[],
        group: "",
        summary: "Internal: started by the gateway only (agent programs' user switch)",
    },
];

/// What the command line asked for.
#[derive(Debug)]
pub enum Outcome {
    Run(Parsed),
    /// Print this (exit 0).
    Help(String),
    Version,
}

#[derive(Debug)]
pub struct Parsed {
    pub words: &'static [&'static str],
    pub positional: Vec<String>,
    /// Flags given, by long name; a switch maps to "".
    pub flags: BTreeMap<&'static str, String>,
}

impl Parsed {
    pub fn flag(&self, long: &str) -> Option<&str> {
        self.flags.get(long).map(String::as_str)
    }

    pub fn switch(&self, long: &str) -> bool {
        self.flags.contains_key(long)
    }

    pub fn config(&self) -> Option<std::path::PathBuf> {
        self.flag("config").map(Into::into)
    }
}

fn flag_by_long(long: &str) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.long == long)
}

fn flag_by_short(short: char) -> Option<&'static Flag> {
    FLAGS.iter().find(|f| f.short == Some(short))
}

/// Parse the arguments after the program name.
pub fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Outcome, String> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let mut words: Vec<String> = Vec::new();
    let mut given: Vec<(&'static Flag, String)> = Vec::new();
    let mut help = false;
    while let Some(arg) = parser.next().map_err(|e| e.to_string())? {
        let flag = match arg {
            Short('h') | Long("help") => {
                help = true;
                continue;
            }
            Short('V') | Long("version") => return Ok(Outcome::Version),
            Long(name) => flag_by_long(name).ok_or_else(|| format!("unknown flag --{name}"))?,
            Short(c) => flag_by_short(c).ok_or_else(|| format!("unknown flag -{c}"))?,
            Value(v) => {
                words.push(
                    v.into_string()
                        .map_err(|v| format!("argument {v:?} is not UTF-8"))?,
                );
                continue;
            }
        };
        let value = match flag.value {
            Some(_) => parser
                .value()
                .map_err(|e| e.to_string())?
                .into_string()
                .map_err(|v| format!("the value of --{} ({v:?}) is not UTF-8", flag.long))?,
            None => String::new(),
        };
        given.push((flag, value));
    }
    let command = find(&words);
    if help {
        return Ok(Outcome::Help(match command {
            Some(c) => command_help(c),
            None => usage(),
        }));
    }
    let Some(command) = command else {
        return Err(if words.is_empty() {
            format!("no command given\n\n{}", usage())
        } else {
            format!("unknown command {:?}; see toolwall --help", words.join(" "))
        });
    };
    let name = command.words.join(" ");
    let positional: Vec<String> = words[command.words.len()..].to_vec();
    let required = command
        .positional
        .iter()
        .filter(|p| !p.starts_with('['))
        .count();
    if positional.len() < required || positional.len() > command.positional.len() {
        return Err(format!(
            "toolwall {name} takes {}; see toolwall {name} --help",
            match command.positional {
                [] => "no arguments".to_owned(),
                names => names.join(" "),
            }
        ));
    }
    let mut flags = BTreeMap::new();
    for (flag, value) in given {
        if flag.long != "config" && !command.flags.contains(&flag.long) {
            return Err(format!(
                "toolwall {name} does not take --{}; see toolwall {name} --help",
                flag.long
            ));
        }
        if flags.insert(flag.long, value).is_some() {
            return Err(format!("--{} is given twice", flag.long));
        }
    }
    Ok(Outcome::Run(Parsed {
        words: command.words,
        positional,
        flags,
    }))
}

/// The command whose words start `words`, the longest such.
fn find(words: &[String]) -> Option<&'static Command> {
    COMMANDS
        .iter()
        .filter(|c| c.words.len() <= words.len() && c.words.iter().zip(words).all(|(a, b)| *a == b))
        .max_by_key(|c| c.words.len())
}

fn synopsis(c: &Command) -> String {
    let mut s = c.words.join(" ");
    for p in c.positional {
        s.push(' ');
        s.push_str(p);
    }
    for long in c.flags {
        let Some(f) = flag_by_long(long) else {
            continue;
        };
        s.push_str(&match (f.short, f.value) {
            (Some(short), Some(v)) => format!(" [-{short} {v}]"),
            (_, Some(v)) => format!(" [--{long} {v}]"),
            (_, None) => format!(" [--{long}]"),
        });
    }
    s
}

/// The whole usage: every public command by group.
pub fn usage() -> String {
    let mut out = String::from(
        "toolwall: an MCP firewall between AI agents and the tools they call\n\n\
         Usage: toolwall <COMMAND> [--config FILE] [OPTIONS]\n",
    );
    let mut group = "";
    for c in COMMANDS.iter().filter(|c| !c.group.is_empty()) {
        if c.group != group {
            group = c.group;
            out.push_str(&format!("\n{group}:\n"));
        }
        out.push_str(&format!("  {}\n      {}\n", synopsis(c), c.summary));
    }
    out.push_str(
        "\nEvery command takes --config FILE (default /etc/toolwall/toolwall.toml if it exists,\n\
         else embedded defaults with state in ./toolwall-data/) and -h/--help.\n\
         -V, --version prints the version. `toolwall worker ROLE` and `toolwall agent-launcher`\n\
         are internal: only the gateway starts them.\n",
    );
    out
}

/// One command's help: synopsis, summary, and each flag it takes.
pub fn command_help(c: &Command) -> String {
    let mut out = format!(
        "Usage: toolwall {} [--config FILE]\n\n{}\n\nOptions:\n",
        synopsis(c),
        c.summary
    );
    for long in c.flags.iter().chain(["config"].iter()) {
        let Some(f) = flag_by_long(long) else {
            continue;
        };
        let name = match (f.short, f.value) {
            (Some(s), Some(v)) => format!("-{s} {v}"),
            (_, Some(v)) => format!("--{} {v}", f.long),
            (_, None) => format!("--{}", f.long),
        };
        out.push_str(&format!("  {name:<22} {}\n", f.help));
    }
    out.push_str("  -h, --help             This help\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str]) -> Result<Outcome, String> {
        parse(args.iter().map(OsString::from))
    }

    #[test]
    fn each_command_takes_only_its_own_flags() {
        let e = run(&["serve", "--tool", "x"]).unwrap_err();
        assert!(e.contains("toolwall serve does not take --tool"), "{e}");
        let e = run(&["status", "--reason", "3"]).unwrap_err();
        assert!(e.contains("does not take --reason"), "{e}");
        assert!(run(&["serve", "--config", "x.toml"]).is_ok());
        assert!(run(&["--config", "x.toml", "status", "--json"]).is_ok());
        let Ok(Outcome::Run(p)) = run(&["deny", "7", "--reason", "no", "--json"]) else {
            panic!("parses")
        };
        assert_eq!((p.flag("reason"), p.switch("json")), (Some("no"), true));
        let e = run(&["deny", "3", "--reason", "a", "--reason", "b"]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
    }

    #[test]
    fn positional_arguments_are_counted() {
        assert!(run(&["approve"]).unwrap_err().contains("takes ID"));
        assert!(
            run(&["approve", "1", "2"])
                .unwrap_err()
                .contains("takes ID")
        );
        assert!(
            run(&["serve", "extra"])
                .unwrap_err()
                .contains("takes no arguments")
        );
        let Ok(Outcome::Run(p)) = run(&["pins", "approve", "gh__search"]) else {
            panic!("parses")
        };
        assert_eq!(p.words, &["pins", "approve"]);
        assert_eq!(p.positional, vec!["gh__search"]);
        assert!(run(&["nope"]).unwrap_err().contains("unknown command"));
        assert!(run(&["--frobnicate"]).unwrap_err().contains("unknown flag"));
    }

    #[test]
    fn help_is_per_command_and_lists_what_it_accepts() {
        let Ok(Outcome::Help(h)) = run(&["deny", "--help"]) else {
            panic!("help")
        };
        assert!(
            h.starts_with("Usage: toolwall deny ID [--reason TEXT] [--json]"),
            "{h}"
        );
        assert!(h.contains("--reason TEXT") && !h.contains("--tool"), "{h}");
        let Ok(Outcome::Help(all)) = run(&["--help"]) else {
            panic!("help")
        };
        for c in COMMANDS.iter().filter(|c| !c.group.is_empty()) {
            assert!(all.contains(&synopsis(c)), "usage lists {}", synopsis(c));
        }
        assert!(
            !all.contains("worker ROLE\n"),
            "internal commands are not listed"
        );
        // Every flag a command names exists.
        for c in COMMANDS {
            for f in c.flags {
                assert!(flag_by_long(f).is_some(), "{f}");
            }
        }
    }
}
