//! What a response body is (HTML, other text, or binary) and how to read it as text.
//!
//! The declared `Content-Type` decides; without one, the first bytes are sniffed.
//! Charsets: UTF-8 (the default), UTF-16 (by label or byte-order mark), and the
//! Windows-1252 family (which the web platform also uses for ISO-8859-1 and US-ASCII).
//! Other charsets are read as UTF-8 with invalid bytes replaced, and say so.

/// The kind of a body, for the tools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyKind {
    Html,
    Text,
    Binary,
}

/// The media type of a `Content-Type` value, lowercased, without parameters.
pub fn media_type(content_type: &str) -> String {
    content_type
        .split(';')
        .next()
        .unwrap_or("")
        .trim()
        .to_ascii_lowercase()
}

/// The `charset` parameter of a `Content-Type` value, lowercased.
pub fn charset_param(content_type: &str) -> Option<String> {
    content_type.split(';').skip(1).find_map(|param| {
        let (key, value) = param.split_once('=')?;
        if key.trim().eq_ignore_ascii_case("charset") {
            Some(value.trim().trim_matches('"').to_ascii_lowercase())
        } else {
            None
        }
    })
}

/// Whether the response's declared type is one we never read as text. Used before the
/// body is downloaded, so a refused binary costs no transfer.
pub fn declared_kind(content_type: Option<&str>) -> Option<BodyKind> {
    let media = media_type(content_type?);
    if media.is_empty() {
        return None;
    }
    Some(kind_of_media(&media))
}

fn kind_of_media(media: &str) -> BodyKind {
    if media == "text/html" || media == "application/xhtml+xml" {
        return BodyKind::Html;
    }
    let (top, sub) = media.split_once('/').unwrap_or((media, ""));
    let textual_application = matches!(
        sub,
        "json"
            | "xml"
            | "javascript"
            | "ecmascript"
            | "x-javascript"
            | "x-ndjson"
            | "yaml"
            | "x-yaml"
            | "toml"
            | "x-toml"
            | "sql"
            | "graphql"
            | "x-sh"
            | "x-www-form-urlencoded"
            | "csv"
            | "markdown"
            | "problem+json"
    ) || sub.ends_with("+json")
        || sub.ends_with("+xml")
        || sub.ends_with("+yaml");
    match top {
        "text" => BodyKind::Text,
        "application" | "image" if textual_application => BodyKind::Text,
        "image" if sub == "svg+xml" => BodyKind::Text,
        _ => BodyKind::Binary,
    }
}

/// The kind of a body with no declared type: HTML if it starts like HTML, text if its
/// first bytes are UTF-8 without control characters, else binary.
pub fn sniff_kind(body: &[u8]) -> BodyKind {
    let head = &body[..body.len().min(1024)];
    let lowered: Vec<u8> = head
        .iter()
        .skip_while(|b| b.is_ascii_whitespace())
        .take(64)
        .map(u8::to_ascii_lowercase)
        .collect();
    if lowered.starts_with(b"<!doctype html") || lowered.starts_with(b"<html") {
        return BodyKind::Html;
    }
    let text = match std::str::from_utf8(head) {
        Ok(t) => t,
        // A character cut by the 1024-byte window is still text.
        Err(e) if e.error_len().is_none() => {
            std::str::from_utf8(&head[..e.valid_up_to()]).unwrap_or("")
        }
        Err(_) => return BodyKind::Binary,
    };
    if text
        .chars()
        .any(|c| c.is_control() && !matches!(c, '\t' | '\n' | '\r' | '\x0c' | '\x1b'))
    {
        BodyKind::Binary
    } else {
        BodyKind::Text
    }
}

/// Decode a body as text. The second value names a charset that could not be honoured.
pub fn decode_text(body: &[u8], charset: Option<&str>) -> (String, Option<String>) {
    if let Some(rest) = body.strip_prefix(b"\xef\xbb\xbf") {
        return (String::from_utf8_lossy(rest).into_owned(), None);
    }
    if let Some(rest) = body.strip_prefix(b"\xff\xfe") {
        return (decode_utf16(rest, false), None);
    }
    if let Some(rest) = body.strip_prefix(b"\xfe\xff") {
        return (decode_utf16(rest, true), None);
    }
    match charset.unwrap_or("utf-8") {
        "utf-8" | "utf8" | "unicode-1-1-utf-8" => {
            (String::from_utf8_lossy(body).into_owned(), None)
        }
        "utf-16" | "utf-16le" => (decode_utf16(body, false), None),
        "utf-16be" => (decode_utf16(body, true), None),
        "iso-8859-1" | "iso8859-1" | "latin1" | "l1" | "windows-1252" | "cp1252" | "x-cp1252"
        | "us-ascii" | "ascii" | "cp819" | "ibm819" | "iso_8859-1" => {
            (decode_windows_1252(body), None)
        }
        other => (
            String::from_utf8_lossy(body).into_owned(),
            Some(other.to_string()),
        ),
    }
}

fn decode_utf16(body: &[u8], big_endian: bool) -> String {
    let units = body.chunks_exact(2).map(|pair| {
        if big_endian {
            u16::from_be_bytes([pair[0], pair[1]])
        } else {
            u16::from_le_bytes([pair[0], pair[1]])
        }
    });
    char::decode_utf16(units)
        .map(|c| c.unwrap_or(char::REPLACEMENT_CHARACTER))
        .collect()
}

/// Windows-1252: Latin-1 with printable characters in 0x80..0xA0.
const WINDOWS_1252_HIGH: [u16; 32] = [
    0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160, 0x2039,
    0x0152, 0x008D, 0x017D, 0x008F, 0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
    0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178,
];

fn decode_windows_1252(body: &[u8]) -> String {
    body.iter()
        .map(|&b| match b {
            0x80..=0x9f => char::from_u32(u32::from(WINDOWS_1252_HIGH[usize::from(b - 0x80)]))
                .unwrap_or(char::REPLACEMENT_CHARACTER),
            _ => char::from(b),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn declared_kinds() {
        let kind = |ct: &str| declared_kind(Some(ct));
        assert_eq!(kind("text/html; charset=utf-8"), Some(BodyKind::Html));
        assert_eq!(kind("TEXT/HTML"), Some(BodyKind::Html));
        assert_eq!(kind("application/xhtml+xml"), Some(BodyKind::Html));
        assert_eq!(kind("text/plain"), Some(BodyKind::Text));
        assert_eq!(kind("text/css"), Some(BodyKind::Text));
        assert_eq!(kind("application/json"), Some(BodyKind::Text));
        assert_eq!(kind("application/ld+json"), Some(BodyKind::Text));
        assert_eq!(kind("application/rss+xml"), Some(BodyKind::Text));
        assert_eq!(kind("image/svg+xml"), Some(BodyKind::Text));
        assert_eq!(kind("application/octet-stream"), Some(BodyKind::Binary));
        assert_eq!(kind("image/png"), Some(BodyKind::Binary));
        assert_eq!(kind("application/pdf"), Some(BodyKind::Binary));
        assert_eq!(kind("application/zip"), Some(BodyKind::Binary));
        assert_eq!(kind("video/mp4"), Some(BodyKind::Binary));
        assert_eq!(kind(""), None);
        assert_eq!(declared_kind(None), None);
    }

    #[test]
    fn sniffing() {
        assert_eq!(sniff_kind(b"  <!DOCTYPE html><p>x"), BodyKind::Html);
        assert_eq!(sniff_kind(b"<html>"), BodyKind::Html);
        assert_eq!(sniff_kind(b"hello\nworld\t\r\n"), BodyKind::Text);
        assert_eq!(sniff_kind("caf\u{e9}".as_bytes()), BodyKind::Text);
        assert_eq!(sniff_kind(b"\x89PNG\r\n\x1a\n\0\0"), BodyKind::Binary);
        assert_eq!(sniff_kind(b"abc\0def"), BodyKind::Binary);
        assert_eq!(sniff_kind(b"\xff\xfe\xfd"), BodyKind::Binary);
        let mut cut = vec![b'a'; 1023];
        cut.extend_from_slice("\u{e9}".as_bytes());
        assert_eq!(sniff_kind(&cut), BodyKind::Text);
    }

    #[test]
    fn charsets() {
        assert_eq!(
            charset_param("text/html; Charset=\"ISO-8859-1\""),
            Some("iso-8859-1".into())
        );
        assert_eq!(charset_param("text/html"), None);
        assert_eq!(
            decode_text(b"caf\xe9 \x80", Some("iso-8859-1")).0,
            "caf\u{e9} \u{20ac}"
        );
        assert_eq!(decode_text("café".as_bytes(), None).0, "café");
        assert_eq!(decode_text(b"\xef\xbb\xbfhi", Some("iso-8859-1")).0, "hi");
        assert_eq!(decode_text(b"\xff\xfeh\0i\0", None).0, "hi");
        assert_eq!(decode_text(b"\0h\0i", Some("utf-16be")).0, "hi");
        let (text, unknown) = decode_text(b"abc\xff", Some("koi8-r"));
        assert_eq!(text, "abc\u{fffd}");
        assert_eq!(unknown.as_deref(), Some("koi8-r"));
    }
}
