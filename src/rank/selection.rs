//! Segment selection against gold passages (`longrank eval-segments`, the BeST paper's Table 2): for each
//! question, the model scores every segment of the document holding its gold passage, and the best one is
//! checked against the passage, beside the first segment and a random one.

use std::collections::BTreeMap;

use super::{Engine, RankError, RankOptions};
use crate::eval::passages::{Passage, SelectionStats};
use crate::eval::{Scored, Topic, TopicField};
use crate::index::Snapshot;
use crate::model::Cancel;
use crate::progress::Progress;

impl Engine {
    /// Selection statistics over the topics that have a gold passage in the collection.
    pub fn evaluate_selection(
        &self,
        snapshot: &Snapshot,
        topics: &[Topic],
        field: TopicField,
        passages: &BTreeMap<String, Vec<Passage>>,
        options: &RankOptions,
        progress: &dyn Progress,
    ) -> Result<SelectionStats, RankError> {
        let mut stats = SelectionStats::default();
        for (done, topic) in topics.iter().enumerate() {
            // The first gold passage of the question (SQuAD has one per question).
            if let Some(passage) = passages.get(&topic.qid).and_then(|p| p.first()) {
                let query = topic.query(field);
                let given = [Scored { docid: passage.docid.clone(), score: 0.0 }];
                let ranked =
                    self.rerank_run(snapshot, self.check_query(&query)?, options, &given, &Cancel::default())?;
                if let Some(evidence) = ranked.ranked.into_iter().next().and_then(|r| r.evidence) {
                    let segments: Vec<(usize, usize)> = evidence.segments.iter().map(|s| (s.start, s.end)).collect();
                    let best = evidence.best().map_or(0, |b| b.index);
                    stats.add(&segments, best, passage);
                }
            }
            progress.set(done as u64 + 1, &topic.qid);
        }
        Ok(stats)
    }
}
