//! Rewrites hostile or sloppy HTML into well-formed HTML of bounded depth before any tree
//! builder sees it.
//!
//! Why: the HTML tree builder scans its stack of open elements on most tags, so a page of
//! nothing but `<div>` costs time quadratic in its size (measured: 40 000 nested `<div>`s,
//! 200 KB, take 6 s to parse), and the converters walk the tree recursively. Here the
//! page goes through the tokenizer alone (linear) and a small stack of our own, at most
//! `max_depth` deep: tags beyond that depth are dropped (their text is kept), every
//! element is closed explicitly, scripts, styles and comments are dropped, and only the
//! attributes the converters use are kept. The result parses in linear time and nests at
//! most about `max_depth` deep, whatever the input.

use std::cell::RefCell;
use std::collections::HashMap;
use std::fmt::Write;

use html5ever::tendril::StrTendril;
use html5ever::tokenizer::states::RawKind;
use html5ever::tokenizer::{
    BufferQueue, Tag, TagKind, Token, TokenSink, TokenSinkResult, Tokenizer, TokenizerOpts,
};

/// The rewritten page.
#[derive(Debug)]
pub struct Rebuilt {
    pub html: String,
    /// Whether tags were dropped for being nested deeper than the limit.
    pub flattened: bool,
}

/// Rewrite `html` as described above.
pub fn rebuild_html(html: &str, max_depth: usize) -> Rebuilt {
    let sink = RebuildSink {
        state: RefCell::new(Builder::new(html.len(), max_depth.max(1))),
    };
    let tokenizer = Tokenizer::new(sink, TokenizerOpts::default());
    let queue = BufferQueue::default();
    queue.push_back(StrTendril::from_slice(html));
    // The sink never asks to pause for scripts, so one feed consumes everything.
    let _ = tokenizer.feed(&queue);
    tokenizer.end();
    let mut builder = tokenizer.sink.state.into_inner();
    builder.close_all();
    Rebuilt {
        html: builder.out,
        flattened: builder.flattened,
    }
}

/// Elements whose content is dropped with them (raw text to the tokenizer).
const DROPPED_RAW: &[(&str, RawKind)] = &[
    ("script", RawKind::ScriptData),
    ("style", RawKind::Rawtext),
    ("xmp", RawKind::Rawtext),
    ("iframe", RawKind::Rawtext),
    ("noembed", RawKind::Rawtext),
    ("noframes", RawKind::Rawtext),
    // Read as a browser with scripting on reads it.
    ("noscript", RawKind::Rawtext),
];

/// Elements whose content is text only (escaped, not markup) but kept.
const KEPT_RCDATA: &[&str] = &["title", "textarea"];

/// Elements without content or end tag.
const VOID: &[&str] = &[
    "area", "base", "basefont", "bgsound", "br", "col", "embed", "frame", "hr", "img", "input",
    "keygen", "link", "meta", "param", "source", "track", "wbr",
];

/// Elements whose start closes an open `<p>` (HTML's "close a p element").
const CLOSES_P: &[&str] = &[
    "address",
    "article",
    "aside",
    "blockquote",
    "center",
    "details",
    "dialog",
    "dir",
    "div",
    "dl",
    "fieldset",
    "figcaption",
    "figure",
    "footer",
    "form",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "header",
    "hgroup",
    "hr",
    "main",
    "menu",
    "nav",
    "ol",
    "p",
    "pre",
    "section",
    "summary",
    "table",
    "ul",
    "li",
    "dd",
    "dt",
    "listing",
];

/// Elements that stop the search for an element to close implicitly.
const SCOPE_BOUNDARY: &[&str] = &[
    "applet", "caption", "html", "table", "td", "th", "marquee", "object", "template", "button",
];

const HEADINGS: &[&str] = &["h1", "h2", "h3", "h4", "h5", "h6"];

/// Attributes the converters read; all others are dropped.
const KEPT_ATTRIBUTES: &[&str] = &["href", "src", "alt", "title", "colspan", "rowspan", "start"];

/// An implied-end rule: the nearest open element among `targets`, unless one of `stops`
/// is open inside it.
struct Rule {
    targets: &'static [&'static str],
    stops: &'static [&'static str],
}

const RULE_P: usize = 0;
const RULE_LI: usize = 1;
const RULE_DD_DT: usize = 2;
const RULE_TR: usize = 3;
const RULE_CELL: usize = 4;
const RULE_SECTION: usize = 5;
const RULE_TR_IN_TABLE: usize = 6;
const RULE_OPTION: usize = 7;
const RULE_A: usize = 8;
const RULE_HEAD: usize = 9;

const RULES: [Rule; 10] = [
    Rule {
        targets: &["p"],
        stops: SCOPE_BOUNDARY,
    },
    Rule {
        targets: &["li"],
        stops: &["ul", "ol", "menu", "dl", "table", "td", "th"],
    },
    Rule {
        targets: &["dd", "dt"],
        stops: &["dl", "ul", "ol", "table", "td", "th"],
    },
    Rule {
        targets: &["tr"],
        stops: &["table", "tbody", "thead", "tfoot"],
    },
    Rule {
        targets: &["td", "th"],
        stops: &["tr", "table"],
    },
    Rule {
        targets: &["tbody", "thead", "tfoot"],
        stops: &["table"],
    },
    Rule {
        targets: &["tr"],
        stops: &["table"],
    },
    Rule {
        targets: &["option"],
        stops: &["select", "datalist"],
    },
    Rule {
        targets: &["a"],
        stops: SCOPE_BOUNDARY,
    },
    Rule {
        targets: &["head"],
        stops: &[],
    },
];

/// One open element, with what each rule would close from here, so no tag ever scans the
/// stack (that scan is the cost this module exists to avoid).
struct Open {
    name: String,
    nearest: [Option<usize>; RULES.len()],
}

struct Builder {
    out: String,
    stack: Vec<Open>,
    /// Stack indices of the open elements of each name, innermost last.
    open_by_name: HashMap<String, Vec<usize>>,
    max_depth: usize,
    flattened: bool,
    /// Inside a dropped raw-text element: its name.
    dropping: Option<String>,
}

impl Builder {
    fn new(input_len: usize, max_depth: usize) -> Builder {
        let mut out = String::with_capacity(input_len.min(64 * 1024 * 1024) + 64);
        out.push_str("<!DOCTYPE html>");
        Builder {
            out,
            stack: Vec::new(),
            open_by_name: HashMap::new(),
            max_depth,
            flattened: false,
            dropping: None,
        }
    }

    fn text(&mut self, text: &str) {
        if self.dropping.is_some() {
            return;
        }
        for c in text.chars() {
            match c {
                '&' => self.out.push_str("&amp;"),
                '<' => self.out.push_str("&lt;"),
                '>' => self.out.push_str("&gt;"),
                c => self.out.push(c),
            }
        }
    }

    fn start_tag(&mut self, tag: &Tag) -> TokenSinkResult<()> {
        let name: &str = &tag.name;
        if self.dropping.is_some() {
            return TokenSinkResult::Continue;
        }
        if let Some((_, kind)) = DROPPED_RAW.iter().find(|(n, _)| *n == name) {
            self.dropping = Some(name.to_string());
            return TokenSinkResult::RawData(*kind);
        }
        let wellformed_name = !name.is_empty()
            && name
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
        if name == "body"
            && let Some(i) = self.nearest(RULE_HEAD)
        {
            self.close_to(i);
        }
        // The parser makes html/head/body itself; a nested one would only confuse it.
        let top_level_only = matches!(name, "html" | "head" | "body");
        if !wellformed_name || name == "html" || (top_level_only && !self.stack.is_empty()) {
            return self.raw_kind_for(name);
        }
        self.close_implied_by(name);
        let void = VOID.contains(&name);
        if !void && self.stack.len() >= self.max_depth {
            self.flattened = true;
            return self.raw_kind_for(name);
        }
        self.out.push('<');
        self.out.push_str(name);
        for attr in &tag.attrs {
            let attr_name: &str = &attr.name.local;
            if attr.name.ns.is_empty() && KEPT_ATTRIBUTES.contains(&attr_name) {
                let _ = write!(self.out, " {attr_name}=\"");
                for c in attr.value.chars() {
                    match c {
                        '&' => self.out.push_str("&amp;"),
                        '"' => self.out.push_str("&quot;"),
                        '<' => self.out.push_str("&lt;"),
                        '>' => self.out.push_str("&gt;"),
                        c => self.out.push(c),
                    }
                }
                self.out.push('"');
            }
        }
        self.out.push('>');
        if void {
            return TokenSinkResult::Continue;
        }
        if tag.self_closing {
            let _ = write!(self.out, "</{name}>");
            return TokenSinkResult::Continue;
        }
        self.push(name);
        self.raw_kind_for(name)
    }

    fn push(&mut self, name: &str) {
        let index = self.stack.len();
        let parent = self
            .stack
            .last()
            .map(|o| o.nearest)
            .unwrap_or([None; RULES.len()]);
        let mut nearest = [None; RULES.len()];
        for (r, rule) in RULES.iter().enumerate() {
            nearest[r] = if rule.targets.contains(&name) {
                Some(index)
            } else if rule.stops.contains(&name) {
                None
            } else {
                parent[r]
            };
        }
        self.stack.push(Open {
            name: name.to_string(),
            nearest,
        });
        self.open_by_name
            .entry(name.to_string())
            .or_default()
            .push(index);
    }

    fn nearest(&self, rule: usize) -> Option<usize> {
        self.stack.last().and_then(|o| o.nearest[rule])
    }

    /// `title` and `textarea` hold text only, whether or not we keep the element.
    fn raw_kind_for(&self, name: &str) -> TokenSinkResult<()> {
        if KEPT_RCDATA.contains(&name) {
            TokenSinkResult::RawData(RawKind::Rcdata)
        } else if name == "plaintext" {
            TokenSinkResult::Plaintext
        } else {
            TokenSinkResult::Continue
        }
    }

    fn end_tag(&mut self, tag: &Tag) {
        let name: &str = &tag.name;
        if let Some(dropped) = &self.dropping {
            if dropped == name {
                self.dropping = None;
            }
            return;
        }
        if name == "br" {
            self.out.push_str("<br>");
            return;
        }
        let innermost = self
            .open_by_name
            .get(name)
            .and_then(|indices| indices.last().copied());
        if let Some(i) = innermost {
            self.close_to(i);
        }
    }

    /// Close the element at stack index `i` and everything opened inside it.
    fn close_to(&mut self, i: usize) {
        while self.stack.len() > i {
            if let Some(open) = self.stack.pop() {
                let _ = write!(self.out, "</{}>", open.name);
                if let Some(indices) = self.open_by_name.get_mut(&open.name) {
                    indices.pop();
                }
            }
        }
    }

    /// The commonest implied end tags, so sloppy pages keep their shape and depth.
    fn close_implied_by(&mut self, name: &str) {
        if CLOSES_P.contains(&name)
            && let Some(i) = self.nearest(RULE_P)
        {
            self.close_to(i);
        }
        let implied = match name {
            "li" => self.nearest(RULE_LI),
            "dd" | "dt" => self.nearest(RULE_DD_DT),
            "tr" => self.nearest(RULE_TR),
            "td" | "th" => self.nearest(RULE_CELL),
            "tbody" | "thead" | "tfoot" => self
                .nearest(RULE_SECTION)
                .or_else(|| self.nearest(RULE_TR_IN_TABLE)),
            "option" | "optgroup" => self.nearest(RULE_OPTION),
            "a" => self.nearest(RULE_A),
            h if HEADINGS.contains(&h) => self
                .stack
                .last()
                .filter(|top| HEADINGS.contains(&top.name.as_str()))
                .map(|_| self.stack.len() - 1),
            _ => None,
        };
        if let Some(i) = implied {
            self.close_to(i);
        }
    }

    fn close_all(&mut self) {
        self.close_to(0);
    }
}

struct RebuildSink {
    state: RefCell<Builder>,
}

impl TokenSink for RebuildSink {
    type Handle = ();

    fn process_token(&self, token: Token, _line: u64) -> TokenSinkResult<()> {
        let mut b = self.state.borrow_mut();
        match token {
            Token::TagToken(tag) => match tag.kind {
                TagKind::StartTag => return b.start_tag(&tag),
                TagKind::EndTag => b.end_tag(&tag),
            },
            Token::CharacterTokens(text) => b.text(&text),
            Token::DoctypeToken(_)
            | Token::CommentToken(_)
            | Token::NullCharacterToken
            | Token::EOFToken
            | Token::ParseError(_) => {}
        }
        TokenSinkResult::Continue
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(html: &str, depth: usize) -> String {
        rebuild_html(html, depth)
            .html
            .trim_start_matches("<!DOCTYPE html>")
            .to_string()
    }

    #[test]
    fn well_formed_output_keeps_text_and_links() {
        let got = body(
            "<html><head><title>T&amp;</title><script>if (a<b) x()</script></head>\
             <body><p class=x>Hi <a href=\"/a?b=1&amp;c=2\" onclick=evil()>there</a><br>\
             <!-- c --><img src=i.png alt='A \"q\"'></body></html>",
            64,
        );
        assert_eq!(
            got,
            "<head><title>T&amp;</title></head><body><p>Hi \
             <a href=\"/a?b=1&amp;c=2\">there</a><br><img src=\"i.png\" alt=\"A &quot;q&quot;\">\
             </p></body>"
        );
    }

    #[test]
    fn implied_end_tags() {
        assert_eq!(body("<p>a<p>b", 64), "<p>a</p><p>b</p>");
        assert_eq!(
            body("<ul><li>a<li>b</ul>", 64),
            "<ul><li>a</li><li>b</li></ul>"
        );
        assert_eq!(
            body("<table><tr><td>1<td>2<tr><td>3</table>", 64),
            "<table><tr><td>1</td><td>2</td></tr><tr><td>3</td></tr></table>"
        );
        assert_eq!(body("<p>x<div>y</div>", 64), "<p>x</p><div>y</div>");
        assert_eq!(body("<b>x</i>y</b>", 64), "<b>xy</b>");
        assert_eq!(
            body("<div><span>x</div>y", 64),
            "<div><span>x</span></div>y"
        );
    }

    #[test]
    fn depth_is_bounded() {
        let deep = "<div>".repeat(10_000) + "text";
        let r = rebuild_html(&deep, 100);
        assert!(r.flattened);
        assert_eq!(r.html.matches("<div>").count(), 100);
        assert_eq!(r.html.matches("</div>").count(), 100);
        assert!(r.html.contains("text"));
        // Self-closing non-void tags do not hide depth.
        let r = rebuild_html(&"<div/>".repeat(1000), 10);
        assert!(!r.html.contains("<div><div>"));
    }

    #[test]
    fn raw_text_is_not_markup() {
        let got = body(
            "<style>p{}</style><textarea><b>x</b></textarea><noscript><p>js</p></noscript>ok",
            64,
        );
        assert_eq!(got, "<textarea>&lt;b&gt;x&lt;/b&gt;</textarea>ok");
        let got = body("<script></div></div><p>hidden</script><p>shown", 64);
        assert_eq!(got, "<p>shown</p>");
    }

    #[test]
    fn odd_names_are_dropped_but_text_kept() {
        assert_eq!(body("<a\"b>x</a\"b><x:y>z", 64), "xz");
    }
}
