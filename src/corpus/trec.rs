//! TREC SGML documents as on TREC disks 4 and 5 (Robust04: FBIS, FT, LA Times, FR94), and the `<DOC>`
//! chunking shared with the GOV2 reader.

use std::io::BufRead;

use super::markup::{self, decode_bytes, decode_entities, normalize_whitespace, strip_markup, PARAGRAPH};
use super::{CorpusError, Document, Location};

/// Fields whose content makes up the text, in document order (Anserini's TrecCollection reads the same).
const TEXT_FIELDS: [&str; 7] = ["HEADLINE", "TI", "HL", "TITLE", "LP", "LEADPARA", "TEXT"];
/// Fields that give the title, by priority; FR94 has none of the first ones and names its bureau instead.
const TITLE_FIELDS: [&str; 6] = ["HEADLINE", "TI", "HL", "TITLE", "DOCTITLE", "USBUREAU"];
/// A `<DOC>` larger than this is malformed (a missing `</DOC>`), not a document to hold in memory.
const MAX_DOC_BYTES: usize = 64 << 20;

/// Splits a stream into the raw bytes of each `<DOC> ... </DOC>`, with the byte offset of its start
/// (in the decompressed stream). `<DOC>` and `</DOC>` sit on lines of their own in TREC files.
pub struct DocChunks<R> {
    reader: R,
    path: std::path::PathBuf,
    offset: u64,
    line: Vec<u8>,
    /// A `<DOC>` line met while the previous document was still open: it starts the next chunk.
    carry: Option<(u64, Vec<u8>)>,
}

impl<R: BufRead> DocChunks<R> {
    pub fn new(reader: R, path: std::path::PathBuf) -> Self {
        DocChunks { reader, path, offset: 0, line: Vec::new(), carry: None }
    }

    /// Reads the next line into `self.line`; returns its start offset, or `None` at the end.
    fn read_line(&mut self) -> Result<Option<u64>, CorpusError> {
        self.line.clear();
        let n = self
            .reader
            .read_until(b'\n', &mut self.line)
            .map_err(|source| CorpusError::Io { path: self.path.clone(), source })?;
        let start = self.offset;
        self.offset += n as u64;
        Ok((n > 0).then_some(start))
    }

    fn malformed(&self, offset: u64, message: &str) -> CorpusError {
        let at = Location { path: self.path.clone(), line: None, offset };
        CorpusError::Malformed { at, message: message.to_string() }
    }

    fn next_chunk(&mut self) -> Result<Option<(u64, Vec<u8>)>, CorpusError> {
        let (start, mut doc) = match self.carry.take() {
            Some(carried) => carried,
            None => loop {
                let Some(line_start) = self.read_line()? else { return Ok(None) };
                if contains(&self.line, b"<DOC>") {
                    break (line_start, std::mem::take(&mut self.line));
                }
            },
        };
        let mut last_line = 0;
        loop {
            if contains(&doc[last_line..], b"</DOC>") {
                return Ok(Some((start, doc)));
            }
            let Some(line_start) = self.read_line()? else {
                return Err(self.malformed(start, "<DOC> without </DOC> at the end of the file"));
            };
            if contains(&self.line, b"<DOC>") {
                self.carry = Some((line_start, std::mem::take(&mut self.line)));
                return Err(self.malformed(start, "<DOC> without </DOC> before the next <DOC>"));
            }
            last_line = doc.len();
            doc.extend_from_slice(&self.line);
            if doc.len() > MAX_DOC_BYTES {
                let message = format!("document larger than {} MiB (missing </DOC>?)", MAX_DOC_BYTES >> 20);
                return Err(self.malformed(start, &message));
            }
        }
    }
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w.eq_ignore_ascii_case(needle))
}

impl<R: BufRead> Iterator for DocChunks<R> {
    type Item = Result<(u64, Vec<u8>), CorpusError>;

    fn next(&mut self) -> Option<Self::Item> {
        self.next_chunk().transpose()
    }
}

/// Parses one TREC SGML document.
pub fn parse(raw: &[u8], at: &Location) -> Result<Document, CorpusError> {
    let (s, guessed_encoding) = decode_bytes(raw, None);
    let id = docno(&s, at)?;
    let mut pieces = Vec::new();
    let mut pos = 0;
    while let Some(m) = markup::next_markup(&s, pos) {
        let tag = match m {
            markup::Markup::Skip { end, .. } => {
                pos = end;
                continue;
            }
            markup::Markup::Tag(tag) => tag,
        };
        pos = tag.end;
        let Some(field) = TEXT_FIELDS.iter().find(|f| f.eq_ignore_ascii_case(tag.name)) else { continue };
        if tag.closing {
            continue;
        }
        let Some(close) = markup::find_ci(&s, &format!("</{field}>"), tag.end) else { continue };
        pieces.push(clean_sgml(&s[tag.end..close]));
        pos = close;
    }
    let title = TITLE_FIELDS.iter().find_map(|f| markup::element_text(&s, f)).unwrap_or_default();
    let text = normalize_whitespace(&pieces.join(PARAGRAPH));
    Ok(Document { id, title, text, guessed_encoding })
}

/// The trimmed `<DOCNO>`, required of every TREC document.
pub fn docno(s: &str, at: &Location) -> Result<String, CorpusError> {
    let malformed = |message: &str| CorpusError::Malformed { at: at.clone(), message: message.to_string() };
    let (_, start) = markup::find_open_tag(s, "DOCNO", 0).ok_or_else(|| malformed("no <DOCNO>"))?;
    let end = markup::find_ci(s, "</DOCNO>", start).ok_or_else(|| malformed("<DOCNO> without </DOCNO>"))?;
    let id = s[start..end].trim();
    if id.is_empty() {
        return Err(malformed("empty <DOCNO>"));
    }
    Ok(id.to_string())
}

/// SGML field content to text: `<P>` starts a paragraph, other tags separate words, comments go.
fn clean_sgml(s: &str) -> String {
    let stripped = strip_markup(s, |t| if t.name.eq_ignore_ascii_case("P") { PARAGRAPH } else { " " }, &[]);
    decode_entities(&stripped)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> Location {
        Location { path: "x".into(), line: None, offset: 0 }
    }

    #[test]
    fn fields_in_document_order_and_title_priority() {
        let raw = b"<DOC>\n<DOCNO> FT-1 </DOCNO>\n<DATE>920211</DATE>\n<HEADLINE>\nFT  11 FEB / Italy\n</HEADLINE>\n\
<TEXT>\nITALY set up &amp; <F P=105>English</F>\n<!-- c -->\n</TEXT>\n<PUB>FT</PUB>\n</DOC>\n";
        let d = parse(raw, &at()).unwrap();
        assert_eq!(d.id, "FT-1");
        assert_eq!(d.title, "FT 11 FEB / Italy");
        assert_eq!(d.text, "FT 11 FEB / Italy\n\nITALY set up & English");
    }

    #[test]
    fn missing_docno_is_malformed() {
        let err = parse(b"<DOC><TEXT>x</TEXT></DOC>", &at()).unwrap_err();
        assert!(err.to_string().contains("no <DOCNO>"), "{err}");
    }

    #[test]
    fn chunks_report_unclosed_documents_and_continue() {
        let data = b"junk\n<DOC>\n<DOCNO>a</DOCNO>\n</DOC>\n<DOC>\n<DOCNO>b</DOCNO>\n<DOC>\n<DOCNO>c</DOCNO>\n</DOC>\n";
        let chunks: Vec<_> = DocChunks::new(&data[..], "f".into()).collect();
        assert_eq!(chunks.len(), 3);
        assert_eq!(chunks[0].as_ref().unwrap().0, 5);
        assert!(chunks[1].is_err());
        let (offset, c) = chunks[2].as_ref().unwrap();
        assert!(String::from_utf8_lossy(c).contains("<DOCNO>c</DOCNO>"));
        assert_eq!(*offset, data.len() as u64 - c.len() as u64);
    }
}
