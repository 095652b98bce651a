//! The one-line summary `systemctl status` shows (`STATUS=`).

/// Longest status line sent; longer ones are cut on a character boundary.
pub const MAX_STATUS_BYTES: usize = 512;

/// What the status line summarises; the gateway fills it from its core and supervisor.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StatusFacts {
    /// `READY=1` was sent.
    pub ready: bool,
    /// SIGTERM arrived; draining.
    pub stopping: bool,
    /// `tools/call` requests answered since start.
    pub calls_served: u64,
    /// Requests in flight now.
    pub in_flight: usize,
    pub workers_ready: usize,
    pub workers_total: usize,
    /// Outcome of the last reload, e.g. "ok, 12 rules" or "failed: ...".
    pub last_reload: Option<String>,
}

/// `serving: 42 calls, 1 in flight, workers 1/1 ready, last reload ok, 12 rules`.
pub fn status_line(facts: &StatusFacts) -> String {
    let state = if facts.stopping {
        "stopping"
    } else if facts.ready {
        "serving"
    } else {
        "starting"
    };
    let mut line = format!(
        "{state}: {} calls, {} in flight, workers {}/{} ready",
        facts.calls_served, facts.in_flight, facts.workers_ready, facts.workers_total
    );
    if let Some(reload) = &facts.last_reload {
        line.push_str(", last reload ");
        line.push_str(reload);
    }
    sanitize_status(&line)
}

/// Control characters become spaces (a newline would start another assignment in the
/// notification), and the line is cut to [`MAX_STATUS_BYTES`].
pub(crate) fn sanitize_status(line: &str) -> String {
    let mut out = String::with_capacity(line.len().min(MAX_STATUS_BYTES));
    for c in line.chars() {
        let c = if c.is_control() { ' ' } else { c };
        if out.len() + c.len_utf8() > MAX_STATUS_BYTES {
            break;
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_and_counts() {
        let mut facts = StatusFacts {
            workers_total: 2,
            ..StatusFacts::default()
        };
        assert_eq!(
            status_line(&facts),
            "starting: 0 calls, 0 in flight, workers 0/2 ready"
        );
        facts.ready = true;
        facts.workers_ready = 2;
        facts.calls_served = 42;
        facts.in_flight = 1;
        facts.last_reload = Some("ok, 12 rules".into());
        assert_eq!(
            status_line(&facts),
            "serving: 42 calls, 1 in flight, workers 2/2 ready, last reload ok, 12 rules"
        );
        facts.stopping = true;
        assert!(status_line(&facts).starts_with("stopping: "));
    }

    #[test]
    fn reload_error_text_cannot_inject_assignments() {
        let facts = StatusFacts {
            last_reload: Some("failed: bad\nREADY=1\r\n".into()),
            ..StatusFacts::default()
        };
        let line = status_line(&facts);
        assert!(!line.contains('\n') && !line.contains('\r'), "{line:?}");
    }

    #[test]
    fn long_lines_are_cut_on_a_character_boundary() {
        let line = sanitize_status(&"é".repeat(MAX_STATUS_BYTES));
        assert!(line.len() <= MAX_STATUS_BYTES);
        assert!(line.len() >= MAX_STATUS_BYTES - 1);
        assert!(line.chars().all(|c| c == 'é'));
    }
}
