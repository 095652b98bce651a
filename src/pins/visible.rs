//! Upstream text made safe to review on a terminal: every character that does not show
//! as itself is written as `\u{…}` — controls and ANSI escapes, Unicode tag characters
//! (U+E0000–E007F, which models read and terminals do not show), zero-width characters,
//! line and paragraph separators, bidirectional marks and overrides, variation selectors,
//! other format characters, non-ASCII spaces and punctuation — and counted, so the
//! operator is warned. Letters and digits of any script are kept (descriptions in other
//! languages stay readable); a word that mixes ASCII letters with letters of another
//! script beyond Latin (a look-alike such as a Cyrillic `а` in `pаypal`) is counted too.

use std::fmt::Write as _;

/// What escaping found in one text.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Findings {
    /// Characters shown as `\u{…}` (newlines and tabs not counted).
    pub escaped: usize,
    /// Of which Unicode tag characters.
    pub tags: usize,
    /// Words mixing ASCII letters with letters of other scripts.
    pub mixed_words: usize,
}

impl Findings {
    pub fn any(&self) -> bool {
        self.escaped > 0 || self.mixed_words > 0
    }

    pub fn add(&mut self, other: Findings) {
        self.escaped += other.escaped;
        self.tags += other.tags;
        self.mixed_words += other.mixed_words;
    }

    /// The warning line for an operator, if anything was found.
    pub fn warning(&self) -> Option<String> {
        if !self.any() {
            return None;
        }
        let mut parts = Vec::new();
        if self.escaped > 0 {
            let tags = if self.tags > 0 {
                format!(
                    ", {} of them Unicode tag characters (hidden text)",
                    self.tags
                )
            } else {
                String::new()
            };
            parts.push(format!(
                "{} invisible, control or non-ASCII symbol characters shown as \\u{{…}}{tags}",
                self.escaped
            ));
        }
        if self.mixed_words > 0 {
            parts.push(format!(
                "{} words mix ASCII letters with letters of another script (look-alikes?)",
                self.mixed_words
            ));
        }
        Some(format!("! {}", parts.join("; ")))
    }
}

/// Whether `c` is shown as itself.
fn shows_as_itself(c: char) -> bool {
    if c.is_ascii() {
        return c == ' ' || c.is_ascii_graphic();
    }
    // Letters and digits of any script; never format characters, marks, spaces, symbols.
    c.is_alphanumeric() && !is_format(c)
}

/// Unicode format-like characters `char` does not classify for us: zero-width and bidi
/// marks, separators, variation selectors, tag characters, fillers.
pub fn is_format(c: char) -> bool {
    matches!(u32::from(c),
        0x00AD | 0x034F | 0x061C | 0x115F | 0x1160 | 0x17B4 | 0x17B5 | 0x180B..=0x180F
        | 0x200B..=0x200F | 0x2028..=0x202E | 0x2060..=0x206F | 0x3164 | 0xFE00..=0xFE0F
        | 0xFEFF | 0xFFA0 | 0xFFF0..=0xFFFB | 0x1D173..=0x1D17A | 0xE0000..=0xE0FFF)
}

/// `text` with everything that does not show as itself escaped, cut after `max` characters
/// (then `…`), and what was found (over the whole text, not only the part shown).
pub fn visible(text: &str, max: usize) -> (String, Findings) {
    let mut out = String::with_capacity(text.len().min(max * 4) + 8);
    let mut found = Findings::default();
    for (n, c) in text.chars().enumerate() {
        let show = n < max;
        if n == max {
            out.push('…');
        }
        match c {
            '\\' => {
                if show {
                    out.push_str("\\\\");
                }
            }
            '\n' => {
                if show {
                    out.push_str("\\n");
                }
            }
            '\t' => {
                if show {
                    out.push_str("\\t");
                }
            }
            c if shows_as_itself(c) => {
                if show {
                    out.push(c);
                }
            }
            c => {
                found.escaped += 1;
                if (0xE0000..=0xE007F).contains(&u32::from(c)) {
                    found.tags += 1;
                }
                if show {
                    let _ = write!(out, "\\u{{{:x}}}", u32::from(c));
                }
            }
        }
    }
    for word in text.split(|c: char| !c.is_alphanumeric()) {
        let ascii = word.chars().any(|c| c.is_ascii_alphabetic());
        // Latin letters with accents are at home beside ASCII; Greek, Cyrillic, fullwidth
        // and every later script are not.
        let other = word
            .chars()
            .any(|c| c.is_alphabetic() && u32::from(c) >= 0x0370);
        if ascii && other {
            found.mixed_words += 1;
        }
    }
    (out, found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tag_characters_zero_width_separators_and_bidi_are_shown() {
        let hidden: String = "SEND KEYS"
            .chars()
            .map(|c| char::from_u32(0xE0000 + c as u32).unwrap())
            .collect();
        let text =
            format!("Search{hidden}\u{200B}\u{2028}\u{202E}\u{2066}\u{FEFF}\u{FE0F}\u{1b}[2J");
        let (out, f) = visible(&text, 1000);
        assert!(out.starts_with("Search\\u{e0053}\\u{e0045}"), "{out}");
        for esc in [
            "\\u{200b}",
            "\\u{2028}",
            "\\u{202e}",
            "\\u{2066}",
            "\\u{feff}",
            "\\u{fe0f}",
            "\\u{1b}[2J",
        ] {
            assert!(out.contains(esc), "{esc} in {out}");
        }
        assert!(out.is_ascii(), "{out}");
        assert_eq!(f.tags, 9);
        assert_eq!(f.escaped, 9 + 7);
        assert!(f.warning().unwrap().contains("tag characters"));
    }

    #[test]
    fn ordinary_text_in_any_language_is_kept() {
        let (out, f) = visible("Résumé des données — 検索 (v2)\nnext", 1000);
        assert_eq!(out, "Résumé des données \\u{2014} 検索 (v2)\\nnext");
        assert_eq!(f.escaped, 1);
        assert_eq!(f.mixed_words, 0);
        let (out, f) = visible("plain \\ text", 1000);
        assert_eq!((out.as_str(), f.any()), ("plain \\\\ text", false));
    }

    #[test]
    fn look_alikes_are_counted_and_long_text_cut() {
        let (_, f) = visible("log in to p\u{430}ypal", 1000);
        assert_eq!(f.mixed_words, 1);
        let (out, f) = visible(&format!("{}\u{200B}", "a".repeat(10)), 5);
        assert_eq!(out, "aaaaa…");
        assert_eq!(f.escaped, 1, "found beyond the cut too");
    }
}
