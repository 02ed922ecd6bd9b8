//! Warnings about a run and its evaluation: one per kind, with a count and the first few ids, worded for what
//! happened. The CLI prints one line per kind, a job's `warnings` lists them, the page shows them.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

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
