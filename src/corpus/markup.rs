//! Markup helpers shared by the SGML and HTML readers: a tag scanner, entity decoding and whitespace
//! normalization. Both TREC SGML and real-world HTML are too broken for a strict parser, so we scan.

/// One tag found in markup: `<name ...>` or `</name>`, with its byte range.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tag<'a> {
    pub name: &'a str,
    pub closing: bool,
    pub start: usize,
    pub end: usize,
    /// The raw text between the name and `>`, for attribute lookups (`<meta ... charset=...>`).
    pub attrs: &'a str,
}

/// What the scanner met next: a tag, or a comment / declaration / processing instruction to skip.
#[derive(Debug)]
pub enum Markup<'a> {
    Tag(Tag<'a>),
    Skip { start: usize, end: usize },
}

/// Finds the next tag, comment or declaration at or after `from`. A `<` not followed by a letter,
/// `/`, `!` or `?` is text (a bare `a < b`), as browsers treat it.
pub fn next_markup(s: &str, from: usize) -> Option<Markup<'_>> {
    let bytes = s.as_bytes();
    let mut i = from;
    while let Some(off) = memchr(b'<', &bytes[i..]) {
        let start = i + off;
        let rest = &s[start..];
        if let Some(comment) = rest.strip_prefix("<!--") {
            let end = comment.find("-->").map(|e| start + 4 + e + 3).unwrap_or(s.len());
            return Some(Markup::Skip { start, end });
        }
        let next = bytes.get(start + 1).copied();
        match next {
            Some(b'!') | Some(b'?') => {
                let end = rest.find('>').map(|e| start + e + 1).unwrap_or(s.len());
                return Some(Markup::Skip { start, end });
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'/' => {
                let closing = c == b'/';
                let name_start = start + 1 + closing as usize;
                let name_len = bytes[name_start..]
                    .iter()
                    .position(|b| !(b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_' || *b == b':'))
                    .unwrap_or(bytes.len() - name_start);
                if name_len == 0 {
                    i = start + 1;
                    continue;
                }
                let gt = rest.find('>')?;
                let end = start + gt + 1;
                let name_end = name_start + name_len;
                let attrs = if name_end < end - 1 { &s[name_end..end - 1] } else { "" };
                return Some(Markup::Tag(Tag { name: &s[name_start..name_end], closing, start, end, attrs }));
            }
            _ => i = start + 1,
        }
    }
    None
}

fn memchr(needle: u8, hay: &[u8]) -> Option<usize> {
    hay.iter().position(|b| *b == needle)
}

/// Removes tags and comments. `separator` says what replaces each tag (a space, nothing, or
/// `PARAGRAPH_MARK` for block-level tags); the contents of tags named in `skip` (script, style) are dropped
/// when their closing tag exists.
pub fn strip_markup(s: &str, separator: impl Fn(&Tag) -> &'static str, skip: &[&str]) -> String {
    let mut out = String::with_capacity(s.len());
    let mut pos = 0;
    while let Some(m) = next_markup(s, pos) {
        match m {
            Markup::Skip { start, end } => {
                out.push_str(&s[pos..start]);
                pos = end;
            }
            Markup::Tag(t) => {
                out.push_str(&s[pos..t.start]);
                pos = t.end;
                if !t.closing && skip.iter().any(|n| n.eq_ignore_ascii_case(t.name)) {
                    if let Some(close) = find_ci(s, &format!("</{}", t.name), t.end) {
                        pos = s[close..].find('>').map_or(s.len(), |e| close + e + 1);
                    }
                }
                out.push_str(separator(&t));
            }
        }
    }
    out.push_str(&s[pos..]);
    out
}

/// The cleaned content of the first `<name>...</name>` element (tags stripped, entities decoded,
/// whitespace collapsed), if any.
pub fn element_text(s: &str, name: &str) -> Option<String> {
    let (_, after) = find_open_tag(s, name, 0)?;
    let close = find_ci(s, &format!("</{name}>"), after)?;
    let text = normalize_whitespace(&decode_entities(&strip_markup(&s[after..close], |_| " ", &[])));
    Some(text.replace("\n\n", " "))
}

/// The byte range of the first opening tag `<name>` or `<name attrs>` at or after `from`, matching the
/// whole name (`<TI>` is not `<TIME>`).
pub fn find_open_tag(s: &str, name: &str, from: usize) -> Option<(usize, usize)> {
    let mut at = from;
    loop {
        let open = find_ci(s, &format!("<{name}"), at)?;
        let next = s.as_bytes().get(open + 1 + name.len()).copied();
        if matches!(next, Some(b'>') | Some(b' ') | Some(b'\t') | Some(b'\n') | Some(b'\r')) {
            let end = s[open..].find('>')? + open + 1;
            return Some((open, end));
        }
        at = open + 1;
    }
}

/// Byte offset of the first case-insensitive occurrence of the ASCII `needle` in `hay` at or after `from`.
pub fn find_ci(hay: &str, needle: &str, from: usize) -> Option<usize> {
    let h = hay.as_bytes();
    let n = needle.as_bytes();
    if n.is_empty() || h.len() < n.len() {
        return None;
    }
    (from..=h.len() - n.len()).find(|&i| h[i..i + n.len()].eq_ignore_ascii_case(n))
}

/// Replaces HTML and SGML character entities (named, decimal, hexadecimal). Unknown entities and
/// bare ampersands are kept as written.
pub fn decode_entities(s: &str) -> String {
    if !s.contains('&') {
        return s.to_string();
    }
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let after = &rest[amp + 1..];
        let end = after.bytes().take(32).position(|b| b == b';');
        let decoded = end.and_then(|e| decode_entity(&after[..e]).map(|d| (d, e)));
        match decoded {
            Some((text, e)) => {
                out.push_str(&text);
                rest = &after[e + 1..];
            }
            None => {
                out.push('&');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn decode_entity(name: &str) -> Option<String> {
    if let Some(num) = name.strip_prefix('#') {
        let code = match num.strip_prefix(['x', 'X']) {
            Some(hex) => u32::from_str_radix(hex, 16).ok()?,
            None => num.parse::<u32>().ok()?,
        };
        // Numeric references in the C1 range mean windows-1252 characters in practice (as browsers decode them).
        let c = if (0x80..0xa0).contains(&code) {
            let byte = [code as u8];
            let (text, _, _) = encoding_rs::WINDOWS_1252.decode(&byte);
            text.chars().next()?
        } else {
            char::from_u32(code)?
        };
        return Some(c.to_string());
    }
    if let Some(i) = LATIN1_NAMES.iter().position(|n| *n == name) {
        return char::from_u32(0xa0 + i as u32).map(String::from);
    }
    let text = match name {
        "amp" | "AMP" => "&",
        "lt" | "LT" => "<",
        "gt" | "GT" => ">",
        "quot" | "QUOT" => "\"",
        "apos" => "'",
        // SGML entities of the TREC disks (Federal Register, FBIS).
        "hyph" => "-",
        "blank" => " ",
        "lsqb" => "[",
        "rsqb" => "]",
        "mu" => "\u{3bc}",
        "ge" => "\u{2265}",
        "le" => "\u{2264}",
        "ne" => "\u{2260}",
        "bull" => "\u{2022}",
        "ndash" => "\u{2013}",
        "mdash" => "\u{2014}",
        "lsquo" => "\u{2018}",
        "rsquo" => "\u{2019}",
        "sbquo" => "\u{201a}",
        "ldquo" => "\u{201c}",
        "rdquo" => "\u{201d}",
        "bdquo" => "\u{201e}",
        "hellip" => "\u{2026}",
        "trade" => "\u{2122}",
        "euro" => "\u{20ac}",
        "dagger" => "\u{2020}",
        "Dagger" => "\u{2021}",
        "permil" => "\u{2030}",
        "lsaquo" => "\u{2039}",
        "rsaquo" => "\u{203a}",
        "OElig" => "\u{152}",
        "oelig" => "\u{153}",
        "Scaron" => "\u{160}",
        "scaron" => "\u{161}",
        "Yuml" => "\u{178}",
        "fnof" => "\u{192}",
        "circ" => "\u{2c6}",
        "tilde" => "\u{2dc}",
        "ensp" => "\u{2002}",
        "emsp" => "\u{2003}",
        "thinsp" => "\u{2009}",
        "zwnj" => "\u{200c}",
        "zwj" => "\u{200d}",
        "prime" => "\u{2032}",
        "Prime" => "\u{2033}",
        "larr" => "\u{2190}",
        "rarr" => "\u{2192}",
        "uarr" => "\u{2191}",
        "darr" => "\u{2193}",
        "harr" => "\u{2194}",
        "minus" => "\u{2212}",
        "infin" => "\u{221e}",
        "asymp" => "\u{2248}",
        "equiv" => "\u{2261}",
        "sum" => "\u{2211}",
        "prod" => "\u{220f}",
        "radic" => "\u{221a}",
        "alpha" => "\u{3b1}",
        "beta" => "\u{3b2}",
        "gamma" => "\u{3b3}",
        "delta" => "\u{3b4}",
        "epsilon" => "\u{3b5}",
        "lambda" => "\u{3bb}",
        "pi" => "\u{3c0}",
        "sigma" => "\u{3c3}",
        "omega" => "\u{3c9}",
        _ => return None,
    };
    Some(text.to_string())
}

/// HTML's Latin-1 entity names, in code-point order from U+00A0.
const LATIN1_NAMES: [&str; 96] = [
    "nbsp", "iexcl", "cent", "pound", "curren", "yen", "brvbar", "sect", "uml", "copy", "ordf", "laquo", "not", "shy",
    "reg", "macr", "deg", "plusmn", "sup2", "sup3", "acute", "micro", "para", "middot", "cedil", "sup1", "ordm",
    "raquo", "frac14", "frac12", "frac34", "iquest", "Agrave", "Aacute", "Acirc", "Atilde", "Auml", "Aring", "AElig",
    "Ccedil", "Egrave", "Eacute", "Ecirc", "Euml", "Igrave", "Iacute", "Icirc", "Iuml", "ETH", "Ntilde", "Ograve",
    "Oacute", "Ocirc", "Otilde", "Ouml", "times", "Oslash", "Ugrave", "Uacute", "Ucirc", "Uuml", "Yacute", "THORN",
    "szlig", "agrave", "aacute", "acirc", "atilde", "auml", "aring", "aelig", "ccedil", "egrave", "eacute", "ecirc",
    "euml", "igrave", "iacute", "icirc", "iuml", "eth", "ntilde", "ograve", "oacute", "ocirc", "otilde", "ouml",
    "divide", "oslash", "ugrave", "uacute", "ucirc", "uuml", "yacute", "thorn", "yuml",
];

/// Collapses whitespace: a blank line (or a `\u{1}` paragraph mark left by the tag strippers) becomes a
/// paragraph break `\n\n`, every other run of whitespace one space; leading and trailing whitespace goes.
/// Paragraph breaks are kept because the segmenter cuts on them.
pub fn normalize_whitespace(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut pending_space = false;
    let mut newlines = 0usize;
    let mut paragraph = false;
    for c in s.chars() {
        if c == PARAGRAPH_MARK {
            paragraph = true;
        } else if c == '\n' {
            newlines += 1;
            if newlines >= 2 {
                paragraph = true;
            }
        } else if c.is_whitespace() {
            pending_space = true;
        } else {
            if !out.is_empty() {
                if paragraph {
                    out.push_str("\n\n");
                } else if pending_space || newlines > 0 {
                    out.push(' ');
                }
            }
            out.push(c);
            pending_space = false;
            newlines = 0;
            paragraph = false;
        }
    }
    out
}

/// Marks a paragraph boundary in intermediate text (block-level tags); `normalize_whitespace` turns it into
/// `\n\n`. A control character that never occurs in decoded documents.
pub const PARAGRAPH_MARK: char = '\u{1}';
/// `PARAGRAPH_MARK` as a string, for tag separators.
pub const PARAGRAPH: &str = "\u{1}";

/// Decodes bytes as UTF-8 when valid, else with the given label's encoding, else windows-1252 (what
/// browsers assume for Latin-1 pages); with the encoding's name when it was that guess (the bytes not UTF-8
/// and no known label), for the build to report.
pub fn decode_bytes(bytes: &[u8], label: Option<&str>) -> (String, Option<&'static str>) {
    if let Ok(s) = std::str::from_utf8(bytes) {
        return (s.to_string(), None);
    }
    let (encoding, guessed) = match label.and_then(|l| encoding_rs::Encoding::for_label(l.trim().as_bytes())) {
        Some(named) => (named, None),
        None => (encoding_rs::WINDOWS_1252, Some(encoding_rs::WINDOWS_1252.name())),
    };
    let (text, _, _) = encoding.decode(bytes);
    (text.into_owned(), guessed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_named_numeric_and_sgml() {
        assert_eq!(decode_entities("a &amp; b &lt;c&gt;"), "a & b <c>");
        assert_eq!(decode_entities("world&#x27;s &#233;t&eacute;"), "world's été");
        assert_eq!(decode_entities("August&hyph;1 &sect;&blank;3"), "August-1 § 3");
        assert_eq!(decode_entities("bare & ampersand &unknown; &#150;"), "bare & ampersand &unknown; \u{2013}");
        assert_eq!(decode_entities("&copy; &yuml; &nbsp;"), "© ÿ \u{a0}");
    }

    #[test]
    fn whitespace_keeps_paragraphs() {
        assert_eq!(normalize_whitespace("  a\n b  c\n\n\n d\t\x0ce \n"), "a b c\n\nd e");
        assert_eq!(normalize_whitespace("x\u{1}y"), "x\n\ny");
        assert_eq!(normalize_whitespace("\u{1} x \u{1}"), "x");
    }

    #[test]
    fn scanner_finds_tags_comments_and_text_lt() {
        let s = "a < b <P class=x>t</p><!-- c --><!DOCTYPE html>";
        let Some(Markup::Tag(t)) = next_markup(s, 0) else { panic!() };
        assert_eq!((t.name, t.closing, t.attrs), ("P", false, " class=x"));
        let Some(Markup::Tag(t)) = next_markup(s, t.end) else { panic!() };
        assert_eq!((t.name, t.closing), ("p", true));
        let Some(Markup::Skip { end, .. }) = next_markup(s, t.end) else { panic!() };
        assert!(matches!(next_markup(s, end), Some(Markup::Skip { .. })));
    }

    #[test]
    fn decoding_falls_back_to_windows_1252_and_says_so() {
        assert_eq!(decode_bytes(b"caf\xe9 \xa9", None), ("café ©".into(), Some("windows-1252")));
        assert_eq!(decode_bytes(b"caf\xe9", Some("no-such-charset")), ("café".into(), Some("windows-1252")));
        assert_eq!(decode_bytes("café".as_bytes(), Some("iso-8859-1")), ("café".into(), None));
        assert_eq!(decode_bytes(b"\xe9", Some("iso-8859-2")), ("é".into(), None));
    }
}
