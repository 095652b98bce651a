//! A window of a text by characters (Unicode scalar values, not bytes), and the note that
//! tells the agent where to continue.

/// A window of a text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window<'a> {
    pub text: &'a str,
    /// Index of the first character shown.
    pub start: usize,
    /// Characters shown.
    pub len: usize,
    /// Characters in the whole text.
    pub total: usize,
}

impl Window<'_> {
    /// Where the next window starts, when more remains.
    pub fn next_start(&self) -> Option<usize> {
        let end = self.start + self.len;
        (end < self.total).then_some(end)
    }
}

/// The characters `start .. start + max_len` of `text`. None when `start` is past the end
/// (a start equal to the length gives an empty window).
pub fn window(text: &str, start: usize, max_len: usize) -> Option<Window<'_>> {
    let mut indices = text.char_indices().map(|(i, _)| i);
    let from = if start == 0 {
        0
    } else {
        match indices.nth(start - 1) {
            Some(_) => indices.next().unwrap_or(text.len()),
            None => return None,
        }
    };
    let rest = &text[from..];
    let shown_end = rest
        .char_indices()
        .nth(max_len)
        .map(|(i, _)| i)
        .unwrap_or(rest.len());
    let shown = &rest[..shown_end];
    let len = shown.chars().count();
    let total = start + len + rest[shown_end..].chars().count();
    Some(Window {
        text: shown,
        start,
        len,
        total,
    })
}

/// The text to show: the window, then a note when more remains.
pub fn render_with_note(w: &Window<'_>, tool: &str) -> String {
    match w.next_start() {
        Some(next) => format!(
            "{}\n\n[Showing characters {}-{} of {}. {} more remain: call {tool} again with \
             start_index={next} to continue.]",
            w.text,
            w.start,
            w.start + w.len,
            w.total,
            w.total - next
        ),
        None => w.text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slices_by_characters() {
        let text = "h\u{e9}llo w\u{f6}rld \u{1f600}!";
        let w = window(text, 0, 5).unwrap();
        assert_eq!(w.text, "h\u{e9}llo");
        assert_eq!(w.total, 14);
        assert_eq!(w.next_start(), Some(5));
        let w = window(text, 5, 100).unwrap();
        assert_eq!(w.text, " w\u{f6}rld \u{1f600}!");
        assert_eq!(w.next_start(), None);
        let w = window(text, 12, 1).unwrap();
        assert_eq!(w.text, "\u{1f600}");
        assert_eq!(w.next_start(), Some(13));
        let w = window(text, 14, 10).unwrap();
        assert_eq!(w.text, "");
        assert_eq!(w.next_start(), None);
        assert_eq!(window(text, 15, 10), None);
        assert_eq!(window("", 0, 10).unwrap().total, 0);
        assert_eq!(window("", 1, 10), None);
    }

    #[test]
    fn windows_cover_the_text_exactly() {
        let text: String = (0..1000)
            .map(|i| char::from_u32(0x61 + i % 26).unwrap())
            .collect::<String>()
            + "\u{3042}\u{3044}\u{3046}";
        let mut joined = String::new();
        let mut start = 0;
        loop {
            let w = window(&text, start, 37).unwrap();
            joined.push_str(w.text);
            match w.next_start() {
                Some(n) => start = n,
                None => break,
            }
        }
        assert_eq!(joined, text);
    }

    #[test]
    fn note_names_the_next_start() {
        let w = window("abcdef", 0, 4).unwrap();
        let shown = render_with_note(&w, "fetch_http");
        assert!(shown.starts_with("abcd\n\n["));
        assert!(shown.contains("start_index=4"));
        let w = window("abcdef", 4, 4).unwrap();
        assert_eq!(render_with_note(&w, "fetch_http"), "ef");
    }
}
