//! Segment selection against gold passages (`longrank eval-segments`, the BeST paper's Table 2): for each
//! question, the model scores every segment of the document holding its gold passage, and the best one is
//! checked against the passage, beside the first segment and a random one. And a judged document as a
//! learned preselection is distilled from it: each segment's input with the model's score.

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
        // With a preselection, every segment is also read once, for the best segment it would have missed.
        let mut full = options.clone();
        let preselect = full.rerank.as_mut().map(|r| std::mem::take(&mut r.preselect)).filter(|p| p.active());
        let mut stats = SelectionStats::default();
        for (done, topic) in topics.iter().enumerate() {
            // The first gold passage of the question (SQuAD has one per question).
            if let Some(passage) = passages.get(&topic.qid).and_then(|p| p.first()) {
                let query = topic.query(field);
                let query = self.check_query(&query)?;
                let given = [Scored { docid: passage.docid.clone(), score: 0.0 }];
                let rerank = |options: &RankOptions| -> Result<_, RankError> {
                    let ranked = self.rerank_run(snapshot, query, options, &given, &Cancel::default())?;
                    Ok(ranked.ranked.into_iter().next().and_then(|r| r.evidence))
                };
                if let Some(evidence) = rerank(options)? {
                    let segments: Vec<(usize, usize)> = evidence.segments.iter().map(|s| (s.start, s.end)).collect();
                    let best = evidence.best().map_or(0, |b| b.index);
                    stats.add(&segments, best, passage);
                    if preselect.is_some() {
                        let best_of_all = rerank(&full)?.and_then(|e| e.best().map(|b| b.index));
                        let read = |i: usize| evidence.segments.get(i).is_some_and(|s| s.scored);
                        stats.best_recalled += usize::from(best_of_all.is_some_and(read));
                    }
                }
            }
            progress.set(done as u64 + 1, &topic.qid);
        }
        Ok(stats)
    }

    /// Every segment of `docid` as the model of `options` (a `maxp` pipeline's, every segment read) reads
    /// it, with the model's score, in document order: the teacher of `longrank train --method selector`.
    pub fn segment_scores(
        &self,
        snapshot: &Snapshot,
        query: &str,
        docid: &str,
        options: &RankOptions,
    ) -> Result<Vec<(String, f32)>, RankError> {
        let query = self.check_query(query)?;
        let model = self.model_for(options)?.ok_or(RankError::RerankingPipelineRequired {
            what: "scoring segments",
            pipeline: options.pipeline.name(),
        })?;
        let given = [Scored { docid: docid.to_string(), score: 0.0 }];
        let ranked = self.rerank_run(snapshot, query, options, &given, &Cancel::default())?;
        let Some(evidence) = ranked.ranked.into_iter().next().and_then(|r| r.evidence) else {
            return Ok(Vec::new());
        };
        let segment_options = &options.rerank.as_ref().expect("a model pipeline re-ranks").segments;
        let inputs = self.segments.inputs(&model.served, segment_options, &evidence.doc, usize::MAX);
        Ok(inputs
            .into_iter()
            .zip(&evidence.segments)
            .filter_map(|((_, text), s)| Some((text.into_owned(), s.score?)))
            .collect())
    }
}
