//! A short passage of a document around the query terms, for result lists.

use crate::index::analyzer;

/// Analyzed tokens in the window that is scored.
const WINDOW_TOKENS: usize = 24;
/// Analyzed tokens shown before the first hit.
const LEAD_TOKENS: usize = 4;
/// Longest snippet, in bytes (cut at a character boundary).
const MAX_BYTES: usize = 320;

/// The window of `WINDOW_TOKENS` analyzed terms holding the most query-term occurrences (the earliest
/// such window), as text; the document's start when no term occurs.
pub fn snippet(text: &str, query_terms: &[String]) -> String {
    let tokens = analyzer::tokens(text);
    if tokens.is_empty() {
        return cut(text).to_string();
    }
    let hits: Vec<bool> = tokens.iter().map(|t| query_terms.contains(&t.term)).collect();
    let (mut best, mut best_count, mut count) = (0usize, 0usize, 0usize);
    for i in 0..tokens.len() {
        count += hits[i] as usize;
        if i >= WINDOW_TOKENS {
            count -= hits[i - WINDOW_TOKENS] as usize;
        }
        if count > best_count {
            best_count = count;
            best = (i + 1).saturating_sub(WINDOW_TOKENS);
        }
    }
    // Start a few words before the window's first hit, so the match sits near the front.
    let first_hit = (best..tokens.len()).find(|&i| hits[i]).unwrap_or(best);
    let start = if best_count == 0 { 0 } else { tokens[first_hit.saturating_sub(LEAD_TOKENS)].span.start };
    let body = cut(&text[start..]);
    let mut out = String::new();
    if start > 0 {
        out.push('…');
    }
    out.push_str(body.trim_end());
    if start + body.len() < text.len() {
        out.push('…');
    }
    out.replace("\n\n", " ")
}

/// At most `MAX_BYTES` of `s`, ending at a word boundary when one is near.
fn cut(s: &str) -> &str {
    if s.len() <= MAX_BYTES {
        return s;
    }
    let mut end = MAX_BYTES;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    match s[..end].rfind(char::is_whitespace) {
        Some(space) if space > MAX_BYTES / 2 => &s[..space],
        _ => &s[..end],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn picks_the_densest_window() {
        let filler = "lorem ipsum dolor sit amet ".repeat(30);
        let text = format!("{filler}the polio vaccine drive reached polio survivors. {filler}");
        let s = snippet(&text, &["polio".to_string(), "vaccin".to_string()]);
        assert!(s.starts_with('…') && s.ends_with('…'), "{s}");
        assert!(s.contains("polio vaccine drive reached polio"), "{s}");
        assert!(s.len() <= MAX_BYTES + 2 * '…'.len_utf8());
    }

    #[test]
    fn no_match_gives_the_start() {
        assert_eq!(snippet("Short text.", &["zebra".to_string()]), "Short text.");
    }
}
