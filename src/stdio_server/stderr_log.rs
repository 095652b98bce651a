//! A local server's stderr in its host, sans-IO: the last lines (for the error when the
//! server fails to start or dies), and the lines sent on to the gateway, at most
//! `lines_per_sec` (a burst of a few seconds' worth), the rest counted. Every line has the
//! server's secret values replaced by `<secret NAME>` before it goes anywhere.

use std::collections::VecDeque;

use crate::aggregator::error::quote_upstream;
use std::time::Instant;

/// Lines kept for error messages.
pub const TAIL_LINES: usize = 20;
/// Longest stderr line kept (longer ones are cut).
pub const MAX_LINE_BYTES: usize = 1000;
/// Seconds of `lines_per_sec` a burst may use.
const BURST_SECS: f64 = 5.0;

#[derive(Debug)]
pub struct StderrLog {
    tail: VecDeque<String>,
    pending: Vec<String>,
    dropped: u64,
    tokens: f64,
    per_sec: f64,
    refilled: Instant,
    /// (variable, value) of each secret, longest value first.
    secrets: Vec<(String, String)>,
}

impl StderrLog {
    pub fn new(lines_per_sec: u32, secrets: &[(String, String)], now: Instant) -> StderrLog {
        let per_sec = f64::from(lines_per_sec.max(1));
        let mut secrets: Vec<(String, String)> = secrets
            .iter()
            .filter(|(_, v)| !v.is_empty())
            .cloned()
            .collect();
        secrets.sort_by_key(|(_, v)| std::cmp::Reverse(v.len()));
        StderrLog {
            tail: VecDeque::new(),
            pending: Vec::new(),
            dropped: 0,
            tokens: per_sec * BURST_SECS,
            per_sec,
            refilled: now,
            secrets,
        }
    }

    /// `text` with every secret value replaced.
    pub fn redact(&self, text: &str) -> String {
        redact(&self.secrets, text)
    }

    /// Bytes of a stderr line to read before its end is dropped: the kept length plus the
    /// longest secret, so a secret that starts before the cut is read whole and replaced
    /// whole (cut first, its head would pass as text no secret matches).
    pub fn read_limit(&self) -> usize {
        MAX_LINE_BYTES + self.secrets.first().map_or(0, |(_, v)| v.len())
    }

    /// One line the server wrote, at most [`StderrLog::read_limit`] bytes (`cut`: its end
    /// was dropped).
    pub fn line(&mut self, raw: &[u8], cut: bool, now: Instant) {
        let (mut text, shortened) =
            redact_cut(&self.secrets, &String::from_utf8_lossy(raw), MAX_LINE_BYTES);
        if cut || shortened {
            text.push_str(" …(cut)");
        }
        if self.tail.len() == TAIL_LINES {
            self.tail.pop_front();
        }
        self.tail.push_back(text.clone());
        let elapsed = now.saturating_duration_since(self.refilled).as_secs_f64();
        self.refilled = now;
        self.tokens = (self.tokens + elapsed * self.per_sec).min(self.per_sec * BURST_SECS);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            self.pending.push(text);
        } else {
            self.dropped += 1;
        }
    }

    /// Lines to send on, and how many were dropped since the last batch; `None` when
    /// there is nothing to say.
    pub fn take_batch(&mut self) -> Option<(Vec<String>, u64)> {
        if self.pending.is_empty() && self.dropped == 0 {
            return None;
        }
        Some((
            std::mem::take(&mut self.pending),
            std::mem::take(&mut self.dropped),
        ))
    }

    /// The last `n` lines, oldest first.
    pub fn tail(&self, n: usize) -> Vec<String> {
        let skip = self.tail.len().saturating_sub(n);
        self.tail.iter().skip(skip).cloned().collect()
    }

    /// The last lines as one string for an error message (empty when there are none).
    pub fn tail_text(&self, n: usize) -> String {
        let lines = self.tail(n);
        if lines.is_empty() {
            return String::new();
        }
        // Escaped: the lines go into log lines and agents' errors, where a raw CR or
        // escape sequence could forge or hide what an operator reads.
        let quoted: Vec<String> = lines
            .iter()
            .map(|l| quote_upstream(l, MAX_LINE_BYTES + 100))
            .collect();
        format!("; its last stderr lines: {}", quoted.join(" | "))
    }
}

/// `text` with every value of `secrets` replaced by `<secret NAME>`.
pub fn redact(secrets: &[(String, String)], text: &str) -> String {
    let mut out = text.to_owned();
    for (name, value) in secrets {
        if !value.is_empty() && out.contains(value.as_str()) {
            out = out.replace(value.as_str(), &format!("<secret {name}>"));
        }
    }
    out
}

/// [`redact`], and cut to at most `max` bytes of the text (on a char boundary): a secret
/// that starts before the cut is replaced whole, one that starts after it is dropped with
/// the rest. True when something was cut.
pub fn redact_cut(secrets: &[(String, String)], text: &str, max: usize) -> (String, bool) {
    let mut hits: Vec<(usize, usize, &str)> = Vec::new();
    for (name, value) in secrets {
        if value.is_empty() {
            continue;
        }
        for (at, _) in text.match_indices(value.as_str()) {
            hits.push((at, at + value.len(), name));
        }
    }
    // At one position the longest secret wins; an occurrence inside a replaced one is
    // already gone.
    hits.sort_by_key(|&(at, end, _)| (at, std::cmp::Reverse(end)));
    let mut limit = max.min(text.len());
    while !text.is_char_boundary(limit) {
        limit -= 1;
    }
    let mut out = String::with_capacity(limit + 32);
    let mut pos = 0;
    for (at, end, name) in hits {
        if at < pos {
            continue;
        }
        if at >= limit {
            break;
        }
        out.push_str(&text[pos..at]);
        out.push_str(&format!("<secret {name}>"));
        pos = end;
    }
    if pos < limit {
        out.push_str(&text[pos..limit]);
    }
    (out, text.len() > limit.max(pos))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn secrets_never_leave_and_floods_are_counted() {
        let t0 = Instant::now();
        let secrets = vec![("TOK".to_string(), "hunter2-value".to_string())];
        let mut log = StderrLog::new(2, &secrets, t0);
        log.line(b"starting with hunter2-value in env", false, t0);
        let (lines, dropped) = log.take_batch().unwrap();
        assert_eq!(lines, vec!["starting with <secret TOK> in env".to_string()]);
        assert_eq!(dropped, 0);
        for i in 0..100 {
            log.line(format!("line {i}").as_bytes(), false, t0);
        }
        let (lines, dropped) = log.take_batch().unwrap();
        // A burst of 5 s at 2 lines/s: 10 lines, the first one taken above.
        assert_eq!(lines.len(), 9);
        assert_eq!(dropped, 91);
        assert!(log.take_batch().is_none());
        assert_eq!(log.tail(3), vec!["line 97", "line 98", "line 99"]);
        assert_eq!(log.tail(1000).len(), TAIL_LINES);
        // Time refills the budget.
        log.line(b"later", true, t0 + Duration::from_secs(1));
        let (lines, _) = log.take_batch().unwrap();
        assert_eq!(lines, vec!["later …(cut)".to_string()]);
        assert!(log.tail_text(2).contains("line 99 | later"));
    }

    #[test]
    fn a_secret_across_the_cut_is_replaced_whole_and_lines_are_escaped_in_errors() {
        let t0 = Instant::now();
        let secret = "TWSECRETplainAlpha987654321x";
        let secrets = vec![("S".to_string(), secret.to_string())];
        let mut log = StderrLog::new(100, &secrets, t0);
        assert_eq!(log.read_limit(), MAX_LINE_BYTES + secret.len());
        // The secret starts 27 bytes before the cut (the attack that leaked 27 of 28).
        let mut raw = "f".repeat(MAX_LINE_BYTES - 27).into_bytes();
        raw.extend_from_slice(secret.as_bytes());
        log.line(&raw, false, t0);
        let (lines, _) = log.take_batch().unwrap();
        assert!(!lines[0].contains("TWSECRET"), "{}", lines[0]);
        assert!(lines[0].ends_with("<secret S> …(cut)") || lines[0].ends_with("<secret S>"));
        // A secret that starts after the cut is dropped with the rest.
        let mut raw = "f".repeat(MAX_LINE_BYTES + 1).into_bytes();
        raw.extend_from_slice(secret.as_bytes());
        let (text, cut) = redact_cut(&secrets, &String::from_utf8_lossy(&raw), MAX_LINE_BYTES);
        assert!(cut && !text.contains('T') && text.len() == MAX_LINE_BYTES);
        // Overlapping secrets: the longest at a position wins.
        let two = vec![
            ("LONG".to_string(), "abcdef".to_string()),
            ("SHORT".to_string(), "cd".to_string()),
        ];
        assert_eq!(
            redact_cut(&two, "xabcdefcd", 100).0,
            "x<secret LONG><secret SHORT>"
        );
        // Control characters and direction marks are escaped where the tail is quoted.
        log.line(
            "innocent\r1796189999.000 info: forged\x1b[8m\u{202e}".as_bytes(),
            false,
            t0,
        );
        let tail = log.tail_text(1);
        assert!(!tail.chars().any(|c| c.is_control()), "{tail:?}");
        assert!(tail.contains("\\u{d}"), "{tail}");
    }
}
