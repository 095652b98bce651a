//! What the admin commands print for a human (`--json` prints the daemon's answer as is).

pub fn format_status(s: &serde_json::Value) -> String {
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
    if let Some(seats) = s["seats"].as_object() {
        let _ = writeln!(
            out,
            "seats: {}",
            crate::gateway::door_limits::seats_line(seats)
        );
    }
    let c = &s["counters"];
    let _ = writeln!(
        out,
        "calls: {} (allowed {}, denied {}, error {})",
        c["calls_total"], c["calls_allowed"], c["calls_denied"], c["calls_error"]
    );
    out.push_str(&crate::launcher::plan::format_status(&s["agents"]));
    for w in s["workers"].as_array().into_iter().flatten() {
        format_worker(&mut out, w);
    }
    out.push_str(&crate::aggregator::status::format_servers(&s["servers"]));
    out
}

pub fn format_approvals(reply: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let pending = reply["pending"].as_array().cloned().unwrap_or_default();
    if pending.is_empty() {
        out.push_str("no calls awaiting approval\n");
    }
    // Everything but the id and the wait is the agent's or an upstream's text: written out
    // so that no control, bidi, tag or invisible character reaches the operator's terminal
    // as itself, and long runs of spaces are named.
    let shown = |v: &serde_json::Value, absent: &str| {
        let (text, found) = crate::pins::visible::visible(v.as_str().unwrap_or(absent));
        if found.longest_space_run > 8 {
            format!("{text} [a run of {} spaces]", found.longest_space_run)
        } else {
            text
        }
    };
    for p in pending {
        let _ = writeln!(
            out,
            "{}  {}  principal {}  process {}  via {}  waiting {} ms  rule {}\n    arguments: {}",
            p["id"],
            shown(&p["tool"], ""),
            shown(&p["principal"], ""),
            shown(&p["process"], ""),
            shown(&p["transport"], ""),
            p["waiting_ms"],
            shown(&p["rule"], "-"),
            shown(&p["arguments"], "")
        );
    }
    out
}

/// One worker's lines of `toolwall status`: identity, confinement, each probe.
fn format_worker(out: &mut String, w: &serde_json::Value) {
    use std::fmt::Write as _;
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
    if !conf.is_null() {
        let _ = writeln!(
            out,
            "    uid {}  gid {}  capabilities cleared {}  bounding set cleared {}",
            conf["uid"], conf["gid"], conf["capabilities_cleared"], conf["bounding_set_cleared"]
        );
    }
    match w["gaps"].as_array() {
        Some(gaps) if gaps.is_empty() => {
            let _ = writeln!(out, "    confined: yes");
        }
        Some(gaps) => {
            for gap in gaps {
                let _ = writeln!(out, "    NOT CONFINED: {}", gap.as_str().unwrap_or(""));
            }
        }
        None => {
            let _ = writeln!(out, "    confined: not attested yet");
        }
    }
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

/// `toolwall status SERVER`: the server's line, its worker (for a local server, its own
/// host and its probes) and its last stderr lines.
pub fn format_server_status(s: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    if s["ok"] != true {
        let _ = writeln!(out, "error: {}", s["error"].as_str().unwrap_or(""));
        return out;
    }
    out.push_str(&crate::aggregator::status::format_servers(
        &serde_json::Value::Array(vec![s["server"].clone()]),
    ));
    if !s["worker"].is_null() {
        format_worker(&mut out, &s["worker"]);
    }
    let cg = &s["cgroup"];
    if cg["in_force"] == true {
        let f = |k: &str| cg[k].as_str().unwrap_or("?").to_string();
        let _ = writeln!(
            out,
            "cgroup: {}  pids {} of {}  memory {} of {} bytes  oom kills {}",
            cg["path"].as_str().unwrap_or(""),
            f("pids.current"),
            f("pids.max"),
            f("memory.current"),
            f("memory.max"),
            f("memory.events.oom_kill"),
        );
    } else if cg["in_force"] == false {
        let _ = writeln!(
            out,
            "cgroup: none ({}): rlimits only",
            cg["reason"].as_str().unwrap_or("unknown")
        );
    }
    let stderr = &s["server"]["stderr"];
    if let Some(lines) = stderr["lines"].as_array() {
        let dropped = stderr["dropped"].as_u64().unwrap_or(0);
        let _ = writeln!(
            out,
            "stderr (last {} lines{}):",
            lines.len(),
            if dropped > 0 {
                format!(", {dropped} earlier or rate-limited lines not kept")
            } else {
                String::new()
            }
        );
        for l in lines {
            let _ = writeln!(out, "    {}", l.as_str().unwrap_or(""));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn approvals_write_out_what_a_terminal_would_hide() {
        let reply = serde_json::json!({"pending": [{
            "id": 7, "tool": "local__echo", "principal": "uid:1001",
            "process": "claude\u{1b}[2K\rcode", "transport": "unix", "waiting_ms": 5,
            "rule": "ask-echo",
            "arguments": "{\"text\":\"ls\u{202e}\u{2066}x\u{2069}\u{e003b}\u{e0072}\u{2028}          ; rm -rf ~\"}"
        }]});
        let out = format_approvals(&reply);
        assert_eq!(out.lines().count(), 2, "{out}");
        for hidden in [
            '\u{1b}',
            '\r',
            '\u{202e}',
            '\u{2066}',
            '\u{2069}',
            '\u{e003b}',
            '\u{2028}',
        ] {
            assert!(!out.contains(hidden), "{hidden:?} shown as itself: {out:?}");
        }
        assert!(out.contains("[a run of 10 spaces]"), "{out}");
        assert!(out.contains("rm -rf ~"), "{out}");
    }
}
