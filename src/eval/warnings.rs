//! Warnings about a run and its evaluation: one per kind, with a count and the first few ids, worded for what
//! happened. The CLI prints one line per kind, a job's `warnings` lists them, the page shows them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{Qrels, Run};

/// Ids kept per kind.
const FIRST: usize = 5;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum WarningKind {
    /// A document listed twice in one topic of a run (the first is kept).
    DuplicateDocid,
    /// A topic that was run and retrieved nothing.
    RetrievedNothing,
    /// A topic of the qrels that the run does not have (not in the topic file).
    QrelsTopicNotInRun,
}

/// One kind of warning: how often, where first, and what it means.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct Warning {
    pub kind: WarningKind,
    pub count: usize,
    /// The first ids concerned (topics; `qid docid` for duplicate documents).
    pub first: Vec<String>,
    pub message: String,
}

#[derive(Debug, Clone, Default, PartialEq)]
pub struct Warnings(BTreeMap<WarningKind, (usize, Vec<String>)>);

impl Warnings {
    pub fn add(&mut self, kind: WarningKind, id: impl Into<String>) {
        let (count, first) = self.0.entry(kind).or_default();
        *count += 1;
        if first.len() < FIRST {
            first.push(id.into());
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn list(&self) -> Vec<Warning> {
        self.0
            .iter()
            .map(|(&kind, (count, first))| {
                let ids = first.join(", ") + if *count > first.len() { ", …" } else { "" };
                let what = match kind {
                    WarningKind::DuplicateDocid => {
                        format!(
                            "{} listed twice in a topic of the run (the first kept): {ids}",
                            counted(*count, "document")
                        )
                    }
                    WarningKind::RetrievedNothing => format!(
                        "{} retrieved nothing, so trec_eval leaves {} out of the means (-c counts {} as zeros): {ids}",
                        counted(*count, "topic"),
                        them(*count),
                        them(*count)
                    ),
                    WarningKind::QrelsTopicNotInRun => {
                        format!(
                            "{} of the qrels not in the topic file, so not in the means: {ids}",
                            counted(*count, "topic")
                        )
                    }
                };
                Warning { kind, count: *count, first: first.clone(), message: what }
            })
            .collect()
    }
}

/// "1 topic", "2 topics".
pub fn counted(count: usize, noun: &str) -> String {
    format!("{count} {noun}{}", if count == 1 { "" } else { "s" })
}

fn them(count: usize) -> &'static str {
    if count == 1 {
        "it"
    } else {
        "them"
    }
}

/// A batch's warnings: the run's own, the topics run that retrieved nothing, and the qrels' topics it lacks.
pub fn of_batch(run: &Run, topics: &[&str], qrels: Option<&Qrels>) -> Warnings {
    let mut warnings = run.warnings.clone();
    for qid in topics.iter().filter(|q| run.topics.get(**q).is_none_or(Vec::is_empty)) {
        warnings.add(WarningKind::RetrievedNothing, *qid);
    }
    for qid in qrels.into_iter().flat_map(|q| q.topics.keys()) {
        if !topics.contains(&qid.as_str()) {
            warnings.add(WarningKind::QrelsTopicNotInRun, qid.clone());
        }
    }
    warnings
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
        let list = of_batch(&run, &topics, Some(&qrels)).list();
        assert_eq!(list.len(), 3);
        assert_eq!(
            (list[0].kind, list[0].count, list[0].first.clone()),
            (WarningKind::DuplicateDocid, 1, vec!["1 a".to_string()])
        );
        assert_eq!((list[1].kind, list[1].count), (WarningKind::RetrievedNothing, 7));
        assert_eq!(list[1].first, ["2", "3", "4", "5", "6"]);
        assert!(
            list[1].message.starts_with("7 topics retrieved nothing") && list[1].message.ends_with("6, …"),
            "{}",
            list[1].message
        );
        assert_eq!((list[2].kind, list[2].first.clone()), (WarningKind::QrelsTopicNotInRun, vec!["9".to_string()]));
    }
}
