//! TREC evaluation files: topics (classic `<top>`, web-track XML, TSV), qrels and run files, gzip-aware,
//! every error naming its file and line.

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::EvalError;
use crate::corpus::normalize_whitespace;

/// One topic, with the fields its file had.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topic {
    pub qid: String,
    pub title: String,
    pub desc: String,
    pub narr: String,
}

/// Which topic field becomes the query.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum, utoipa::ToSchema)]
#[serde(rename_all = "kebab-case")]
#[schema(example = "title+desc")]
pub enum TopicField {
    #[default]
    Title,
    Desc,
    #[value(name = "title+desc")]
    #[serde(rename = "title+desc")]
    TitleDesc,
}

impl Topic {
    /// The query text for a field (falls back to the title when the field is empty, as for TSV topics).
    pub fn query(&self, field: TopicField) -> String {
        let text = match field {
            TopicField::Title => self.title.clone(),
            TopicField::Desc => self.desc.clone(),
            TopicField::TitleDesc => format!("{} {}", self.title, self.desc),
        };
        let text = text.trim();
        if text.is_empty() {
            self.title.clone()
        } else {
            text.to_string()
        }
    }
}

pub(super) fn read_text(path: &Path) -> Result<String, EvalError> {
    // The error names the path once (the corpus reader's own error names it too).
    let mut reader = crate::corpus::open_maybe_gz(path, None).map_err(|e| EvalError::Io {
        path: path.to_path_buf(),
        message: match e {
            crate::corpus::CorpusError::Io { source, .. } => source.to_string(),
            e => e.to_string(),
        },
    })?;
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut reader, &mut bytes)
        .map_err(|e| EvalError::Io { path: path.to_path_buf(), message: e.to_string() })?;
    Ok(String::from_utf8_lossy(&bytes).into_owned())
}

/// Reads a topic file, detecting its format from the content.
pub fn read_topics(path: &Path) -> Result<Vec<Topic>, EvalError> {
    parse_topics(&read_text(path)?, path)
}

/// Parses topics in any of the three formats; `path` names the source in errors.
pub fn parse_topics(text: &str, path: &Path) -> Result<Vec<Topic>, EvalError> {
    let head = text.trim_start();
    let topics = if head.starts_with("<top") && !head.starts_with("<topics") || text.contains("<num>") {
        parse_trec_topics(text, path)?
    } else if text.contains("<topic ") || text.contains("<topic>") {
        parse_xml_topics(text, path)?
    } else {
        parse_tsv_topics(text, path)?
    };
    if topics.is_empty() {
        return Err(EvalError::parse(
            path,
            1,
            "no topics found (expected TREC <top>, web-track <topic> or qid<TAB>text)",
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for (qid, line) in topics.iter().map(|(t, l)| (&t.qid, *l)) {
        // A run file's columns are split by whitespace: a qid holding some would break every line of it.
        if qid.is_empty() || qid.contains(char::is_whitespace) {
            return Err(EvalError::parse(path, line, &format!("topic id {qid:?} is empty or holds whitespace")));
        }
        if !seen.insert(qid.clone()) {
            return Err(EvalError::parse(path, line, &format!("duplicate topic {qid}")));
        }
    }
    Ok(topics.into_iter().map(|(t, _)| t).collect())
}

fn line_of(text: &str, offset: usize) -> usize {
    text[..offset.min(text.len())].bytes().filter(|b| *b == b'\n').count() + 1
}

/// Classic TREC topics: `<top> <num> Number: 301 <title> ... <desc> Description: ... <narr> Narrative: ... </top>`.
fn parse_trec_topics(text: &str, path: &Path) -> Result<Vec<(Topic, usize)>, EvalError> {
    let mut topics = Vec::new();
    let mut pos = 0;
    while let Some(start) = text[pos..].find("<top>").map(|i| i + pos) {
        let line = line_of(text, start);
        let end = text[start..]
            .find("</top>")
            .map(|i| i + start)
            .ok_or_else(|| EvalError::parse(path, line, "<top> without </top>"))?;
        let body = &text[start + 5..end];
        let field = |tag: &str| -> Option<String> {
            let open = body.find(tag)? + tag.len();
            // A field runs to the next tag (TREC topic files do not close them).
            let close = body[open..].find('<').map_or(body.len(), |i| i + open);
            Some(normalize_whitespace(&body[open..close]))
        };
        let num = field("<num>").ok_or_else(|| EvalError::parse(path, line, "topic without <num>"))?;
        let qid = num.trim_start_matches("Number:").trim().to_string();
        if qid.is_empty() || qid.contains(char::is_whitespace) {
            return Err(EvalError::parse(path, line, &format!("bad topic number {num:?}")));
        }
        let strip = |s: Option<String>, label: &str| {
            let s = s.unwrap_or_default();
            s.strip_prefix(label).map(|r| r.trim().to_string()).unwrap_or(s)
        };
        let title = strip(field("<title>"), "Topic:");
        if title.is_empty() {
            return Err(EvalError::parse(path, line, &format!("topic {qid} has no <title>")));
        }
        topics.push((
            Topic {
                qid,
                title,
                desc: strip(field("<desc>"), "Description:"),
                narr: strip(field("<narr>"), "Narrative:"),
            },
            line,
        ));
        pos = end + 6;
    }
    Ok(topics)
}

/// Web-track XML: `<topic number="..."><query>..</query><description>..</description><narrative>..`.
fn parse_xml_topics(text: &str, path: &Path) -> Result<Vec<(Topic, usize)>, EvalError> {
    let mut topics = Vec::new();
    let mut pos = 0;
    while let Some(start) = text[pos..].find("<topic").map(|i| i + pos) {
        let line = line_of(text, start);
        let open_end = text[start..]
            .find('>')
            .map(|i| i + start + 1)
            .ok_or_else(|| EvalError::parse(path, line, "unclosed <topic"))?;
        let end = text[open_end..]
            .find("</topic>")
            .map(|i| i + open_end)
            .ok_or_else(|| EvalError::parse(path, line, "<topic> without </topic>"))?;
        let attrs = &text[start..open_end];
        let qid = attrs
            .split("number=")
            .nth(1)
            .and_then(|r| r.trim_start_matches(['"', '\'']).split(['"', '\'']).next())
            .map(str::to_string)
            .ok_or_else(|| EvalError::parse(path, line, "<topic> without number=\"...\""))?;
        let body = &text[open_end..end];
        let element = |name: &str| -> String {
            let open = format!("<{name}>");
            body.find(&open)
                .and_then(|s| {
                    let s = s + open.len();
                    body[s..].find(&format!("</{name}>")).map(|e| normalize_whitespace(&body[s..s + e]))
                })
                .unwrap_or_default()
        };
        let title = element("query");
        if title.is_empty() {
            return Err(EvalError::parse(path, line, &format!("topic {qid} has no <query>")));
        }
        topics.push((Topic { qid, title, desc: element("description"), narr: element("narrative") }, line));
        pos = end + 8;
    }
    Ok(topics)
}

/// `qid<TAB>text` lines.
fn parse_tsv_topics(text: &str, path: &Path) -> Result<Vec<(Topic, usize)>, EvalError> {
    let mut topics = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (qid, query) =
            line.split_once('\t').ok_or_else(|| EvalError::parse(path, i + 1, "expected qid<TAB>query text"))?;
        let (qid, query) = (qid.trim(), query.trim());
        if qid.is_empty() || query.is_empty() {
            return Err(EvalError::parse(path, i + 1, "empty qid or query"));
        }
        let topic = Topic { qid: qid.into(), title: query.into(), desc: String::new(), narr: String::new() };
        topics.push((topic, i + 1));
    }
    Ok(topics)
}

/// Relevance judgments: qid -> docid -> grade.
#[derive(Debug, Clone, Default)]
pub struct Qrels {
    pub topics: BTreeMap<String, HashMap<String, i32>>,
}

impl Qrels {
    pub fn read(path: &Path) -> Result<Qrels, EvalError> {
        Qrels::parse(&read_text(path)?, path)
    }

    /// `qid iter docid grade` per line (whitespace separated). A docid judged twice keeps the last grade.
    pub fn parse(text: &str, path: &Path) -> Result<Qrels, EvalError> {
        let mut qrels = Qrels::default();
        for (i, line) in text.lines().enumerate() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.is_empty() {
                continue;
            }
            let [qid, _, docid, grade] = cols[..] else {
                return Err(EvalError::parse(
                    path,
                    i + 1,
                    &format!("expected 4 columns (qid 0 docid grade), found {}", cols.len()),
                ));
            };
            let grade: i32 = grade
                .parse()
                .map_err(|_| EvalError::parse(path, i + 1, &format!("grade {grade:?} is not an integer")))?;
            qrels.topics.entry(qid.to_string()).or_default().insert(docid.to_string(), grade);
        }
        if qrels.topics.is_empty() {
            return Err(EvalError::parse(path, 1, "no judgments"));
        }
        Ok(qrels)
    }
}

/// One retrieved document of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct Scored {
    pub docid: String,
    pub score: f64,
}

/// A topic's documents in trec_eval's order: score descending, ties by docid descending (how runs are written and
/// measured).
pub fn ranked(docs: &[Scored]) -> Vec<&Scored> {
    let mut ranked: Vec<&Scored> = docs.iter().collect();
    ranked.sort_by(|a, b| b.score.total_cmp(&a.score).then_with(|| b.docid.as_bytes().cmp(a.docid.as_bytes())));
    ranked
}

/// A run: qid -> retrieved documents (in file order), plus the problems found reading it.
#[derive(Debug, Clone, Default)]
pub struct Run {
    pub topics: BTreeMap<String, Vec<Scored>>,
    pub tag: String,
    pub warnings: super::Warnings,
}

impl Run {
    /// A batch's warnings: the run's own, the topics run that retrieved nothing, and the qrels' topics it lacks.
    pub fn batch_warnings(&self, topics: &[&str], qrels: Option<&Qrels>) -> super::Warnings {
        let mut warnings = self.warnings.clone();
        for qid in topics.iter().filter(|q| self.topics.get(**q).is_none_or(Vec::is_empty)) {
            warnings.add(super::WarningKind::RetrievedNothing, *qid);
        }
        for qid in qrels.into_iter().flat_map(|q| q.topics.keys()) {
            if !topics.contains(&qid.as_str()) {
                warnings.add(super::WarningKind::QrelsTopicNotInRun, qid.clone());
            }
        }
        warnings
    }

    pub fn read(path: &Path) -> Result<Run, EvalError> {
        Run::parse(&read_text(path)?, path)
    }

    /// `qid Q0 docid rank score tag` per line. The rank column is ignored (as trec_eval does); a docid
    /// repeated within a topic is reported and its first occurrence kept.
    pub fn parse(text: &str, path: &Path) -> Result<Run, EvalError> {
        let mut run = Run::default();
        let mut seen: HashMap<String, std::collections::HashSet<String>> = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let cols: Vec<&str> = line.split_whitespace().collect();
            if cols.is_empty() {
                continue;
            }
            let [qid, _, docid, _rank, score, tag] = cols[..] else {
                return Err(EvalError::parse(
                    path,
                    i + 1,
                    &format!("expected 6 columns (qid Q0 docid rank score tag), found {}", cols.len()),
                ));
            };
            let score: f64 = score
                .parse()
                .map_err(|_| EvalError::parse(path, i + 1, &format!("score {score:?} is not a number")))?;
            if !seen.entry(qid.to_string()).or_default().insert(docid.to_string()) {
                run.warnings.add(super::WarningKind::DuplicateDocid, format!("{qid} {docid}"));
                continue;
            }
            run.tag = tag.to_string();
            run.topics.entry(qid.to_string()).or_default().push(Scored { docid: docid.to_string(), score });
        }
        Ok(run)
    }

    /// What an interrupted batch had finished, from its partial run file (`text`, whole topics appended one
    /// after another): up to the last complete line, less the last topic, which the interruption may have cut
    /// short. A partial run of another run tag (another pipeline) is an error, not something to mix in.
    pub fn resume(text: &str, path: &Path, tag: &str) -> Result<Run, EvalError> {
        let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
        let mut run = Run::parse(complete, path)?;
        if !run.topics.is_empty() && run.tag != tag {
            return Err(EvalError::parse(
                path,
                complete.lines().count(),
                &format!("a partial run tagged {:?}, not {tag:?}: delete the file to start over", run.tag),
            ));
        }
        if let Some(last) = complete.lines().rev().find_map(|line| line.split_whitespace().next()) {
            run.topics.remove(last);
        }
        run.tag = tag.to_string();
        Ok(run)
    }

    /// Writes the run in TREC format, each topic ranked by score (ties by docid, as trec_eval orders them).
    pub fn write(&self, out: &mut impl Write) -> std::io::Result<()> {
        self.write_in(&[], out)
    }

    /// Writes the topics of `order` first, in that order (a topic file's), then any others by qid.
    pub fn write_in(&self, order: &[&str], out: &mut impl Write) -> std::io::Result<()> {
        let rest = self.topics.keys().map(String::as_str).filter(|q| !order.contains(q));
        let ordered: Vec<&str> = order.iter().copied().filter(|q| self.topics.contains_key(*q)).chain(rest).collect();
        for qid in ordered {
            for (rank, doc) in ranked(&self.topics[qid]).into_iter().enumerate() {
                writeln!(out, "{qid} Q0 {} {} {} {}", doc.docid, rank + 1, format_score(doc.score), self.tag)?;
            }
        }
        Ok(())
    }
}

/// A run written as it is made, for a batch that can be interrupted: each finished topic is appended to
/// `OUT.partial`; opened again, it keeps what an earlier attempt finished (`Run::resume`); `finish` writes the
/// whole run to `OUT` through a temporary file and a rename, so `OUT` is never half a run, then drops the
/// partial file.
pub struct PartialRun {
    path: PathBuf,
    file: std::fs::File,
    run: Run,
}

impl PartialRun {
    /// The partial run of `out` for run tag `tag`, with the topics an earlier attempt finished.
    pub fn open(out: &Path, tag: &str) -> Result<PartialRun, EvalError> {
        let path = with_suffix(out, "partial");
        let io = |e: std::io::Error| EvalError::Io { path: path.clone(), message: e.to_string() };
        let run = match std::fs::read_to_string(&path) {
            Ok(text) => Run::resume(&text, &path, tag)?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Run { tag: tag.to_string(), ..Default::default() },
            Err(e) => return Err(io(e)),
        };
        // Rewritten with what was kept, without a cut-off last topic (through a rename, so that an
        // interruption here loses nothing), then appended to.
        let mut text = Vec::new();
        run.write(&mut text).map_err(io)?;
        let kept = with_suffix(&path, "tmp");
        std::fs::write(&kept, &text).and_then(|()| std::fs::rename(&kept, &path)).map_err(io)?;
        let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(io)?;
        Ok(PartialRun { path, file, run })
    }

    /// The topics finished so far.
    pub fn run(&self) -> &Run {
        &self.run
    }

    /// Appends a finished topic.
    pub fn push(&mut self, qid: &str, scored: Vec<Scored>) -> Result<(), EvalError> {
        let one = Run { tag: self.run.tag.clone(), topics: [(qid.to_string(), scored)].into(), ..Default::default() };
        let mut text = Vec::new();
        one.write(&mut text).and_then(|()| self.file.write_all(&text)).map_err(|e| self.io(e))?;
        self.run.topics.extend(one.topics);
        Ok(())
    }

    /// Writes the whole run to `out`, topics in `order` (the topic file's), and removes the partial file;
    /// returns the run and its text.
    pub fn finish(self, out: &Path, order: &[&str]) -> Result<(Run, Vec<u8>), EvalError> {
        let mut text = Vec::new();
        self.run.write_in(order, &mut text).map_err(|e| self.io(e))?;
        let whole = with_suffix(out, "tmp");
        let out_err = |e: std::io::Error| EvalError::Io { path: out.to_path_buf(), message: e.to_string() };
        std::fs::write(&whole, &text).and_then(|()| std::fs::rename(&whole, out)).map_err(out_err)?;
        std::fs::remove_file(&self.path).map_err(|e| self.io(e))?;
        Ok((self.run, text))
    }

    fn io(&self, e: std::io::Error) -> EvalError {
        EvalError::Io { path: self.path.clone(), message: e.to_string() }
    }
}

/// `path` with `.suffix` appended (`run.txt` → `run.txt.partial`).
fn with_suffix(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_owned();
    name.push(".");
    name.push(suffix);
    PathBuf::from(name)
}

/// The shortest text that reads back as the same score: single precision when the score is one (our
/// BM25 scores are), so distinct scores never print as a tie and the order trec_eval sees is ours.
fn format_score(score: f64) -> String {
    let single = score as f32;
    if single as f64 == score {
        format!("{single}")
    } else {
        format!("{score}")
    }
}

/// `qid<TAB>fold` lines.
pub fn read_folds(path: &Path) -> Result<BTreeMap<String, usize>, EvalError> {
    let text = read_text(path)?;
    let mut folds = BTreeMap::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let (qid, fold) =
            line.split_once('\t').ok_or_else(|| EvalError::parse(path, i + 1, "expected qid<TAB>fold"))?;
        let fold = fold
            .trim()
            .parse()
            .map_err(|_| EvalError::parse(path, i + 1, &format!("fold {fold:?} is not a number")))?;
        folds.insert(qid.trim().to_string(), fold);
    }
    Ok(folds)
}

/// Seeded k-fold split: topics shuffled by a fixed generator, then dealt round-robin.
pub fn make_folds(qids: &[String], k: usize, seed: u64) -> BTreeMap<String, usize> {
    let mut order: Vec<&String> = qids.iter().collect();
    order.sort();
    crate::rng::Rng::new(seed).shuffle(&mut order);
    order.into_iter().enumerate().map(|(i, q)| (q.clone(), i % k.max(1))).collect()
}

/// A path for error messages of uploaded (in-memory) files.
pub fn upload_path(field: &str) -> PathBuf {
    PathBuf::from(format!("<{field}>"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_warning_per_kind_with_a_count_and_the_first_ids() {
        let run = Run::parse("1 Q0 a 1 2 t\n1 Q0 a 2 1 t\n", std::path::Path::new("r")).unwrap();
        let qrels = Qrels::parse("1 0 a 1\n9 0 b 1\n8 0 c 1\n", std::path::Path::new("q")).unwrap();
        let topics: Vec<String> = (1..=8).map(|i| i.to_string()).collect();
        let topics: Vec<&str> = topics.iter().map(String::as_str).collect();
        let list = run.batch_warnings(&topics, Some(&qrels)).list();
        assert_eq!(list.len(), 3);
        assert_eq!(
            (list[0].kind, list[0].count, list[0].first.clone()),
            (super::super::WarningKind::DuplicateDocid, 1, vec!["1 a".to_string()])
        );
        assert_eq!((list[1].kind, list[1].count), (super::super::WarningKind::RetrievedNothing, 7));
        assert_eq!(list[1].first, ["2", "3", "4", "5", "6"]);
        assert!(
            list[1].message.starts_with("7 topics retrieved nothing") && list[1].message.ends_with("6, …"),
            "{}",
            list[1].message
        );
        assert_eq!(
            (list[2].kind, list[2].first.clone()),
            (super::super::WarningKind::QrelsTopicNotInRun, vec!["9".to_string()])
        );
    }

    fn p() -> PathBuf {
        PathBuf::from("t")
    }

    #[test]
    fn classic_trec_topics() {
        let text = "<top>\n<num> Number: 301\n<title> International Organized Crime\n\n<desc> Description:\nIdentify organizations.\n\n<narr> Narrative:\nA relevant document must.\n</top>\n";
        let t = parse_topics(text, &p()).unwrap();
        assert_eq!(t[0].qid, "301");
        assert_eq!(t[0].title, "International Organized Crime");
        assert_eq!(t[0].desc, "Identify organizations.");
        assert_eq!(t[0].narr, "A relevant document must.");
        assert_eq!(t[0].query(TopicField::TitleDesc), "International Organized Crime Identify organizations.");
    }

    #[test]
    fn web_track_xml_and_tsv_topics() {
        let xml = "<webtrack2009>\n<topic number=\"1\" type=\"faceted\">\n  <query>obama family tree</query>\n  <description>Find information.</description>\n</topic>\n</webtrack2009>";
        let t = parse_topics(xml, &p()).unwrap();
        assert_eq!(
            (t[0].qid.as_str(), t[0].title.as_str(), t[0].desc.as_str()),
            ("1", "obama family tree", "Find information.")
        );
        let t = parse_topics("1\thello world\n2\tbye\n", &p()).unwrap();
        assert_eq!(t.len(), 2);
        let err = parse_topics("1\thello\nbroken line\n", &p()).unwrap_err();
        assert_eq!(err.to_string(), "t:2: expected qid<TAB>query text");
        // A qid with whitespace would break the run file's columns.
        let err = parse_topics("1\thello\n2 b\tbye\n", &p()).unwrap_err();
        assert_eq!(err.to_string(), "t:2: topic id \"2 b\" is empty or holds whitespace");
        let err = parse_topics(&xml.replace("number=\"1\"", "number=\"1 2\""), &p()).unwrap_err();
        assert!(err.to_string().contains("\"1 2\" is empty or holds whitespace"), "{err}");
    }

    #[test]
    fn qrels_and_runs_report_file_and_line() {
        let err = Qrels::parse("1 0 d1 1\n1 0 d2\n", &p()).unwrap_err();
        assert_eq!(err.to_string(), "t:2: expected 4 columns (qid 0 docid grade), found 3");
        let run = Run::parse("1 Q0 a 1 2.5 x\n1 Q0 a 2 1.0 x\n1 Q0 b 3 1.0 x\n", &p()).unwrap();
        assert_eq!(run.topics["1"].len(), 2);
        assert_eq!(run.warnings.list()[0].first, ["1 a"]);
        let err = Run::parse("1 Q0 a 1 high x\n", &p()).unwrap_err();
        assert_eq!(err.to_string(), "t:1: score \"high\" is not a number");
    }

    #[test]
    fn run_written_in_trec_order() {
        let run = Run::parse("1 Q0 a 9 1.5 t\n1 Q0 b 9 2.0 t\n1 Q0 c 9 1.5 t\n", &p()).unwrap();
        let mut out = Vec::new();
        run.write(&mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "1 Q0 b 1 2 t\n1 Q0 c 2 1.5 t\n1 Q0 a 3 1.5 t\n");
    }

    #[test]
    fn resume_keeps_whole_topics_but_the_last_and_refuses_another_tag() {
        // Topics in the order they were appended (not sorted); the file was cut inside topic 3's second line.
        let text = "9 Q0 a 1 2 t\n9 Q0 b 2 1 t\n10 Q0 c 1 3 t\n3 Q0 d 1 5 t\n3 Q0 e 2";
        let run = Run::resume(text, &p(), "t").unwrap();
        assert_eq!(run.topics.keys().collect::<Vec<_>>(), ["10", "9"]);
        assert_eq!(run.topics["9"].len(), 2);
        // Cut at a line's end, the last topic may still miss lines: it is dropped too.
        let run = Run::resume("9 Q0 a 1 2 t\n10 Q0 c 1 3 t\n", &p(), "t").unwrap();
        assert_eq!(run.topics.keys().collect::<Vec<_>>(), ["9"]);
        assert!(Run::resume("", &p(), "t").unwrap().topics.is_empty());
        let err = Run::resume("9 Q0 a 1 2 bm25\n10 Q0 c 1 3 bm25\n", &p(), "maxp").unwrap_err();
        assert_eq!(err.to_string(), "t:2: a partial run tagged \"bm25\", not \"maxp\": delete the file to start over");
    }

    #[test]
    fn a_partial_run_appends_topics_resumes_and_finishes_whole() {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("x.run");
        let doc = |docid: &str, score: f64| Scored { docid: docid.into(), score };
        let mut partial = PartialRun::open(&out, "t").unwrap();
        partial.push("2", vec![doc("a", 1.0)]).unwrap();
        partial.push("1", vec![doc("b", 2.0), doc("c", 1.0)]).unwrap();
        drop(partial); // interrupted: the last topic appended may be incomplete, so it is run again
        let mut partial = PartialRun::open(&out, "t").unwrap();
        assert_eq!(partial.run().topics.keys().collect::<Vec<_>>(), ["2"]);
        partial.push("1", vec![doc("b", 2.0)]).unwrap();
        // In the topic file's order, not the qids'.
        let (run, text) = partial.finish(&out, &["2", "1"]).unwrap();
        assert_eq!(run.topics.len(), 2);
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "2 Q0 a 1 1 t\n1 Q0 b 1 2 t\n");
        assert_eq!(std::fs::read(&out).unwrap(), text);
        assert!(!dir.path().join("x.run.partial").exists() && !dir.path().join("x.run.tmp").exists());
    }

    #[test]
    fn folds_are_seeded_and_balanced() {
        let qids: Vec<String> = (0..23).map(|i| i.to_string()).collect();
        let a = make_folds(&qids, 5, 7);
        assert_eq!(a, make_folds(&qids, 5, 7));
        assert_ne!(a, make_folds(&qids, 5, 8));
        let mut sizes = [0; 5];
        for f in a.values() {
            sizes[*f] += 1;
        }
        assert!(sizes.iter().all(|s| *s == 4 || *s == 5), "{sizes:?}");
    }
}
