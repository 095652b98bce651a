//! HTML to markdown (htmd) or plain text (html2text), after `html_rebuild` has made the
//! page well-formed and shallow. The conversion runs on a thread of its own with a known
//! stack, so the converters' recursion never depends on the caller's stack, and a
//! converter that panics costs this call, not the worker.

use super::html_rebuild::rebuild_html;
use super::outcome::{ErrorCode, ToolError};

/// Stack of the conversion thread. The rebuilt page nests at most `max_html_depth` deep;
/// this leaves ample room for both converters' recursion at the largest useful depths.
pub const CONVERT_STACK_BYTES: usize = 64 * 1024 * 1024;

/// Width given to the text renderer: wide, so paragraphs stay on one line (grep matches
/// whole sentences and its line numbers mean paragraphs).
const TEXT_WIDTH: usize = 100_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HtmlFormat {
    Markdown,
    Text,
}

/// A converted page.
#[derive(Debug)]
pub struct Converted {
    pub text: String,
    /// Whether elements nested deeper than the limit were flattened.
    pub flattened: bool,
}

/// Convert `html` to `format`, nesting kept to `max_depth`.
pub fn convert_html(
    html: &str,
    format: HtmlFormat,
    max_depth: usize,
) -> Result<Converted, ToolError> {
    std::thread::scope(|scope| {
        let worker = std::thread::Builder::new()
            .name("http-convert".into())
            .stack_size(CONVERT_STACK_BYTES)
            .spawn_scoped(scope, || convert_here(html, format, max_depth))
            .map_err(|e| {
                ToolError::new(
                    ErrorCode::InternalError,
                    format!("cannot start the HTML conversion: {e}"),
                )
            })?;
        worker.join().unwrap_or_else(|_| {
            Err(ToolError::new(
                ErrorCode::UnsupportedContent,
                "this HTML could not be converted; format \"raw\" returns it as it is",
            ))
        })
    })
}

fn convert_here(html: &str, format: HtmlFormat, max_depth: usize) -> Result<Converted, ToolError> {
    let rebuilt = rebuild_html(html, max_depth);
    let text = match format {
        HtmlFormat::Markdown => htmd::HtmlToMarkdown::builder()
            .skip_tags(vec!["head", "script", "style", "template"])
            .build()
            .convert(&rebuilt.html)
            .map_err(|e| conversion_failed(&e))?,
        HtmlFormat::Text => {
            let without_head = strip_head(&rebuilt.html);
            html2text::config::with_decorator(html2text::render::TrivialDecorator::new())
                .allow_width_overflow()
                .no_link_wrapping()
                .string_from_read(without_head.as_bytes(), TEXT_WIDTH)
                .map_err(|e| conversion_failed(&e))?
        }
    };
    Ok(Converted {
        text: tidy(&text),
        flattened: rebuilt.flattened,
    })
}

fn conversion_failed(e: &dyn std::fmt::Display) -> ToolError {
    ToolError::new(
        ErrorCode::UnsupportedContent,
        format!("this HTML could not be converted ({e}); format \"raw\" returns it as it is"),
    )
}

/// The rebuilt page without its `<head>` (the text renderer would print the title).
fn strip_head(rebuilt: &str) -> &str {
    match (rebuilt.find("<head>"), rebuilt.find("</head>")) {
        (Some(0..=16), Some(end)) => &rebuilt[end + "</head>".len()..],
        _ => rebuilt,
    }
}

/// Trim trailing spaces on lines and collapse runs of blank lines to one.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank_run = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank_run += 1;
            if blank_run > 1 {
                continue;
            }
        } else {
            blank_run = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim_matches('\n').to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PAGE: &str = "<!doctype html><html><head><title>Doc</title>\
        <style>body{color:red}</style></head><body>\
        <h1>Title here</h1><p>Some <b>bold</b> and <a href=\"https://example.com/x\">a link</a>.</p>\
        <ul><li>one</li><li>two</li></ul><script>alert(1)</script></body></html>";

    #[test]
    fn markdown() {
        let c = convert_html(PAGE, HtmlFormat::Markdown, 256).unwrap();
        assert!(c.text.contains("# Title here"), "{}", c.text);
        assert!(c.text.contains("**bold**"), "{}", c.text);
        assert!(
            c.text.contains("[a link](https://example.com/x)"),
            "{}",
            c.text
        );
        assert!(c.text.contains("one"), "{}", c.text);
        assert!(!c.text.contains("alert"), "{}", c.text);
        assert!(!c.text.contains("color:red"), "{}", c.text);
        assert!(!c.text.contains("Doc"), "{}", c.text);
        assert!(!c.flattened);
    }

    #[test]
    fn text() {
        let c = convert_html(PAGE, HtmlFormat::Text, 256).unwrap();
        assert!(c.text.contains("Title here"), "{}", c.text);
        assert!(c.text.contains("Some bold and a link."), "{}", c.text);
        assert!(!c.text.contains("**"), "{}", c.text);
        assert!(!c.text.contains("alert"), "{}", c.text);
        assert!(!c.text.contains("Doc"), "{}", c.text);
    }

    #[test]
    fn hostile_nesting_converts_quickly_and_keeps_text() {
        for tag in ["div", "table", "ul", "blockquote", "b", "a href=x"] {
            let html = format!("<{tag}>").repeat(100_000) + "deep text";
            for format in [HtmlFormat::Markdown, HtmlFormat::Text] {
                let c = convert_html(&html, format, 256).unwrap();
                assert!(c.text.contains("deep text"), "{tag} {format:?}");
            }
        }
    }
}
