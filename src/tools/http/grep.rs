//! Matching lines with context, numbered like `grep -n`: `N:line` for a match, `N-line`
//! for context, `--` between groups that do not touch. N is the 1-based line number in
//! the searched text. Lines longer than the limit are cut: a matching line around its
//! first match, a context line after its start, marked with `…`.

use regex::{Regex, RegexBuilder};

/// Compiled-program and lazy-DFA budgets for one pattern.
const REGEX_SIZE_LIMIT: usize = 1 << 20;

/// Compile an agent's pattern within the size limits; the error is for the agent.
pub fn compile_pattern(pattern: &str, max_chars: usize) -> Result<Regex, String> {
    let chars = pattern.chars().count();
    if chars > max_chars {
        return Err(format!(
            "pattern is {chars} characters, more than the limit of {max_chars}"
        ));
    }
    RegexBuilder::new(pattern)
        .size_limit(REGEX_SIZE_LIMIT)
        .dfa_size_limit(REGEX_SIZE_LIMIT)
        .nest_limit(64)
        .build()
        .map_err(|e| format!("invalid pattern: {e}"))
}

/// What a search found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GrepReport {
    /// The numbered lines, ready to show.
    pub output: String,
    /// Matching lines shown.
    pub matches: usize,
    /// Whether more lines matched beyond `max_matches`.
    pub more_matches: bool,
    /// Lines in the searched text.
    pub lines: usize,
}

/// Search `text` line by line.
pub fn grep(
    text: &str,
    re: &Regex,
    context: usize,
    max_matches: usize,
    max_line_chars: usize,
) -> GrepReport {
    let lines: Vec<&str> = text.lines().collect();
    let mut hits: Vec<usize> = Vec::new();
    let mut more_matches = false;
    for (i, line) in lines.iter().enumerate() {
        if re.is_match(line) {
            if hits.len() == max_matches {
                more_matches = true;
                break;
            }
            hits.push(i);
        }
    }
    let mut output = String::new();
    let mut printed_up_to: Option<usize> = None; // one past the last line printed
    for (k, &hit) in hits.iter().enumerate() {
        let from = hit.saturating_sub(context);
        let from = match printed_up_to {
            Some(p) if from < p => p,
            Some(p) if from > p => {
                output.push_str("--\n");
                from
            }
            _ => from,
        };
        // Context after this hit stops before the next hit's own context would start
        // printing, which the next iteration handles.
        let to = (hit + context).min(lines.len().saturating_sub(1));
        let to = match hits.get(k + 1) {
            Some(&next) if next <= to => next - 1,
            _ => to,
        };
        for (i, line) in lines.iter().enumerate().take(to + 1).skip(from) {
            // Earlier hits were printed already and `to` stops before the next one.
            let is_hit = i == hit;
            let shown = if is_hit {
                cut_around_match(line, re, max_line_chars)
            } else {
                cut_start(line, max_line_chars)
            };
            output.push_str(&format!(
                "{}{}{}\n",
                i + 1,
                if is_hit { ':' } else { '-' },
                shown
            ));
        }
        printed_up_to = Some(to + 1);
    }
    GrepReport {
        output,
        matches: hits.len(),
        more_matches,
        lines: lines.len(),
    }
}

fn cut_start(line: &str, max: usize) -> String {
    match line.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &line[..end]),
        None => line.to_string(),
    }
}

/// At most `max` characters of `line`, centred on its first match.
fn cut_around_match(line: &str, re: &Regex, max: usize) -> String {
    if line.chars().nth(max).is_none() {
        return line.to_string();
    }
    let match_start = re.find(line).map(|m| m.start()).unwrap_or(0);
    let chars_before = line[..match_start].chars().count();
    let first = chars_before.saturating_sub(max / 2);
    let mut indices = line.char_indices().map(|(i, _)| i).skip(first);
    let from = indices.next().unwrap_or(line.len());
    let rest = &line[from..];
    let to = rest
        .char_indices()
        .nth(max)
        .map(|(i, _)| i)
        .unwrap_or(rest.len());
    format!(
        "{}{}{}",
        if from > 0 { "…" } else { "" },
        &rest[..to],
        if to < rest.len() { "…" } else { "" }
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: usize) -> String {
        (1..=n).map(|i| format!("line {i}\n")).collect()
    }

    #[test]
    fn context_groups_and_numbers() {
        let t = text(20);
        let re = compile_pattern(r"^line (3|5|15)$", 100).unwrap();
        let r = grep(&t, &re, 1, 50, 1000);
        assert_eq!(
            r.output,
            "2-line 2\n3:line 3\n4-line 4\n5:line 5\n6-line 6\n--\n14-line 14\n15:line 15\n16-line 16\n"
        );
        assert_eq!(r.matches, 3);
        assert!(!r.more_matches);
        assert_eq!(r.lines, 20);
    }

    #[test]
    fn adjacent_hits_and_edges() {
        let t = text(5);
        let re = compile_pattern(r"line [1245]", 100).unwrap();
        let r = grep(&t, &re, 3, 50, 1000);
        assert_eq!(
            r.output,
            "1:line 1\n2:line 2\n3-line 3\n4:line 4\n5:line 5\n"
        );
        let r = grep(
            "a\r\nb\r\n",
            &compile_pattern("b", 10).unwrap(),
            0,
            50,
            1000,
        );
        assert_eq!(r.output, "2:b\n");
    }

    #[test]
    fn max_matches_and_no_match() {
        let t = text(100);
        let re = compile_pattern("line", 100).unwrap();
        let r = grep(&t, &re, 0, 10, 1000);
        assert_eq!(r.matches, 10);
        assert!(r.more_matches);
        assert_eq!(r.output.lines().count(), 10);
        let r = grep(&t, &compile_pattern("nothing", 100).unwrap(), 3, 10, 1000);
        assert_eq!(r.output, "");
        assert_eq!(r.matches, 0);
    }

    #[test]
    fn long_lines_are_cut_around_the_match() {
        let line = "x".repeat(5000) + "NEEDLE" + &"y".repeat(5000);
        let t = format!("{}\n{line}\n", "c".repeat(3000));
        let r = grep(&t, &compile_pattern("NEEDLE", 100).unwrap(), 1, 10, 100);
        let lines: Vec<&str> = r.output.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("1-ccc") && lines[0].ends_with('…'));
        assert!(
            lines[1].starts_with("2:…x") && lines[1].contains("NEEDLE") && lines[1].ends_with("y…")
        );
        assert!(lines[1].chars().count() < 110);
    }

    #[test]
    fn pattern_limits() {
        assert!(compile_pattern(&"a".repeat(101), 100).is_err());
        assert!(compile_pattern("(", 100).is_err());
        assert!(compile_pattern(r"\w{1000}{1000}", 100).is_err());
        assert!(compile_pattern("(?i)hello", 100).is_ok());
    }
}
