//! GOV2 / web-track bundles: `<DOC><DOCNO>..</DOCNO><DOCHDR>url + HTTP headers</DOCHDR> raw page </DOC>`.
//! Pages are HTML (to text) or anything else (kept as text); bytes are decoded as UTF-8 when valid, else by
//! the charset the headers or a `<meta>` tag name, else as windows-1252.

use super::markup::{self, decode_bytes, decode_entities, normalize_whitespace, strip_markup, Tag, PARAGRAPH};
use super::{trec, CorpusError, Document, Location};

/// Tags that start a new block of text; every other tag is inline and vanishes.
const BLOCK_TAGS: [&str; 33] = [
    "p",
    "div",
    "br",
    "h1",
    "h2",
    "h3",
    "h4",
    "h5",
    "h6",
    "li",
    "ul",
    "ol",
    "table",
    "tr",
    "td",
    "th",
    "thead",
    "tbody",
    "blockquote",
    "pre",
    "hr",
    "section",
    "article",
    "header",
    "footer",
    "nav",
    "form",
    "dl",
    "dt",
    "dd",
    "body",
    "title",
    "option",
];

/// Parses one GOV2 document from the raw bytes of its `<DOC>` chunk.
pub fn parse(raw: &[u8], at: &Location) -> Result<Document, CorpusError> {
    let malformed = |message: &str| CorpusError::Malformed { at: at.clone(), message: message.to_string() };
    let hdr_start = find(raw, b"<DOCHDR>").ok_or_else(|| malformed("no <DOCHDR>"))?;
    // The header's end after its start (a stray `</DOCHDR>` before it is page content, not a header).
    let hdr_end = find(&raw[hdr_start..], b"</DOCHDR>")
        .map(|e| hdr_start + e)
        .ok_or_else(|| malformed("<DOCHDR> without </DOCHDR>"))?;
    let id = trec::docno(&String::from_utf8_lossy(&raw[..hdr_start]), at)?;
    let header = String::from_utf8_lossy(&raw[hdr_start + 8..hdr_end]);
    let content_type = header
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.trim().eq_ignore_ascii_case("content-type")))
        .map(|(_, v)| v.trim().to_ascii_lowercase());
    let body_end = rfind(raw, b"</DOC>").filter(|e| *e > hdr_end).unwrap_or(raw.len());
    let body = &raw[hdr_end + 9..body_end];

    let sniff = String::from_utf8_lossy(&body[..body.len().min(4096)]).to_ascii_lowercase();
    let charset = content_type.as_deref().and_then(charset_of).or_else(|| meta_charset(&sniff));
    let (page, guessed_encoding) = decode_bytes(body, charset.as_deref());

    let is_html = match content_type.as_deref() {
        Some(ct) if ct.contains("html") || ct.contains("xml") => true,
        Some(ct) if !ct.is_empty() && !ct.starts_with("text/plain") && !ct.contains("unknown") => false,
        _ => ["<html", "<body", "<!doctype html", "<head", "<title"].iter().any(|t| sniff.contains(t)),
    };
    if !is_html {
        return Ok(Document { id, title: String::new(), text: normalize_whitespace(&page), guessed_encoding });
    }
    let title = markup::element_text(&page, "title").unwrap_or_default();
    let stripped = strip_markup(&page, block_separator, &["script", "style", "head", "noscript", "title"]);
    Ok(Document { id, title, text: normalize_whitespace(&decode_entities(&stripped)), guessed_encoding })
}

fn block_separator(tag: &Tag) -> &'static str {
    if BLOCK_TAGS.iter().any(|b| b.eq_ignore_ascii_case(tag.name)) {
        PARAGRAPH
    } else {
        ""
    }
}

/// `charset=...` in a Content-Type value.
fn charset_of(content_type: &str) -> Option<String> {
    let at = content_type.find("charset=")? + "charset=".len();
    let value: String = content_type[at..]
        .trim_start_matches(['"', '\''])
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | ':' | '.'))
        .collect();
    (!value.is_empty()).then_some(value)
}

/// The charset of `<meta charset=..>` or `<meta http-equiv="Content-Type" content="..; charset=..">`
/// in the (lower-cased) start of a page.
fn meta_charset(head: &str) -> Option<String> {
    let mut pos = 0;
    while let Some(start) = head[pos..].find("<meta").map(|i| i + pos) {
        let end = head[start..].find('>').map_or(head.len(), |e| start + e);
        if let Some(cs) = charset_of(&head[start..end]) {
            return Some(cs);
        }
        pos = end;
    }
    None
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w.eq_ignore_ascii_case(needle))
}

fn rfind(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).rposition(|w| w.eq_ignore_ascii_case(needle))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> Location {
        Location { path: "x".into(), line: None, offset: 0 }
    }

    #[test]
    fn html_page_to_text() {
        let raw = b"<DOC>\n<DOCNO>GX-1</DOCNO>\n<DOCHDR>\nhttp://a.gov/x\nContent-Type: text/html\n</DOCHDR>\n\
<html><head><title>T &amp; U</title><script>var x=1;</script></head><body><h1>Head</h1><p>A <b>bold</b> &#x27;x&#x27;\
<!-- c --><P>B & c</body></html>\n</DOC>\n";
        let d = parse(raw, &at()).unwrap();
        assert_eq!((d.id.as_str(), d.title.as_str()), ("GX-1", "T & U"));
        assert_eq!(d.text, "Head\n\nA bold 'x'\n\nB & c");
    }

    #[test]
    fn latin1_page_decoded_by_meta_charset_and_non_html_kept() {
        let mut raw = b"<DOC>\n<DOCNO>GX-2</DOCNO>\n<DOCHDR>\nhttp://a\nContent-Type: text/html\n</DOCHDR>\n\
<html><head><meta http-equiv=\"Content-Type\" content=\"text/html; charset=iso-8859-1\"></head><body>caf"
            .to_vec();
        raw.extend_from_slice(b"\xe9 \xa9</body></html>\n</DOC>\n");
        assert_eq!(parse(&raw, &at()).unwrap().text, "café ©");
        let pdf = b"<DOC>\n<DOCNO>GX-3</DOCNO>\n<DOCHDR>\nu\nContent-Type: application/pdf\n</DOCHDR>\nA <b>\x0c\nB\n</DOC>\n";
        assert_eq!(parse(pdf, &at()).unwrap().text, "A <b> B");
    }
}
