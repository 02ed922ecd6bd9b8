//! Gold passages (`qid<TAB>docid<TAB>start<TAB>end`, UTF-8 byte offsets into the document's text, end
//! exclusive: the `passages.bytes.tsv` of ../shared/data) and how well a segment selection hits them.

use std::collections::BTreeMap;
use std::path::Path;

use super::formats::read_text;
use super::EvalError;

/// A judged passage: where in which document a question's answer is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Passage {
    pub docid: String,
    pub start: usize,
    pub end: usize,
}

/// Gold passages by qid (a question may have several).
pub fn read_passages(path: &Path) -> Result<BTreeMap<String, Vec<Passage>>, EvalError> {
    parse_passages(&read_text(path)?, path)
}

/// Parses gold passages; `path` names the source in errors.
pub fn parse_passages(text: &str, path: &Path) -> Result<BTreeMap<String, Vec<Passage>>, EvalError> {
    let mut out: BTreeMap<String, Vec<Passage>> = BTreeMap::new();
    for (i, line) in text.lines().enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let fields: Vec<&str> = line.split('\t').collect();
        let [qid, docid, start, end] = fields[..] else {
            return Err(EvalError::parse(path, i + 1, "expected qid<TAB>docid<TAB>start<TAB>end"));
        };
        let offset = |v: &str| {
            v.trim().parse::<usize>().map_err(|_| EvalError::parse(path, i + 1, &format!("bad offset {v:?}")))
        };
        let (start, end) = (offset(start)?, offset(end)?);
        if end < start {
            return Err(EvalError::parse(path, i + 1, &format!("passage ends ({end}) before it starts ({start})")));
        }
        out.entry(qid.to_string()).or_default().push(Passage { docid: docid.to_string(), start, end });
    }
    Ok(out)
}

/// Whether the byte range `start..end` contains or overlaps the passage.
pub fn overlaps(start: usize, end: usize, passage: &Passage) -> bool {
    start < passage.end && passage.start < end
}

/// Segment selection against gold passages over many questions (the BeST paper's Table 2): how often the
/// selected segment overlaps the gold passage, against the first segment and a random one.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SelectionStats {
    pub questions: usize,
    pub segments: usize,
    pub selected_hits: usize,
    pub first_hits: usize,
    /// Sum over questions of the share of segments overlapping the passage: a random segment's expected hits.
    pub random_hits: f64,
    /// With a preselection: questions whose best segment with every segment read is among those the selector
    /// picked.
    pub best_recalled: usize,
}

impl SelectionStats {
    /// Adds one question: its document's segments (byte ranges, in document order), the selected one's
    /// index, and the gold passage.
    pub fn add(&mut self, segments: &[(usize, usize)], selected: usize, passage: &Passage) {
        if segments.is_empty() {
            return;
        }
        let hit = |&(s, e): &(usize, usize)| overlaps(s, e, passage);
        self.questions += 1;
        self.segments += segments.len();
        self.selected_hits += usize::from(hit(&segments[selected]));
        self.first_hits += usize::from(hit(&segments[0]));
        self.random_hits += segments.iter().filter(|s| hit(s)).count() as f64 / segments.len() as f64;
    }

    pub fn precision(&self, hits: f64) -> f64 {
        if self.questions == 0 {
            0.0
        } else {
            hits / self.questions as f64
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlap_and_selection_precision() {
        let gold = Passage { docid: "d".into(), start: 100, end: 200 };
        assert!(overlaps(150, 160, &gold) && overlaps(50, 101, &gold) && overlaps(199, 300, &gold));
        assert!(!overlaps(0, 100, &gold) && !overlaps(200, 250, &gold));
        let mut stats = SelectionStats::default();
        let segments = [(0, 90), (91, 180), (181, 260), (261, 400)];
        stats.add(&segments, 1, &gold);
        stats.add(&segments, 3, &gold);
        assert_eq!((stats.questions, stats.selected_hits, stats.first_hits), (2, 1, 0));
        assert_eq!(stats.precision(stats.selected_hits as f64), 0.5);
        assert!((stats.precision(stats.random_hits) - 0.5).abs() < 1e-12);
    }

    #[test]
    fn malformed_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("passages.tsv");
        std::fs::write(&path, "q1\td1\t0\t10\nq2\td2\tten\t20\n").unwrap();
        let err = read_passages(&path).unwrap_err().to_string();
        assert!(err.ends_with("passages.tsv:2: bad offset \"ten\""), "{err}");
        std::fs::write(&path, "q1\td1\t0\t10\nq1\td1\t30\t40\n").unwrap();
        assert_eq!(read_passages(&path).unwrap()["q1"].len(), 2);
    }
}
