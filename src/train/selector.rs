//! A learned preselection (`longrank train --method selector`): a sentence-transformers bi-encoder distilled
//! from a cross-encoder's segment scores, to serve as `bi-encoder:NAME` in front of that cross-encoder.
//!
//! For each (query, judged document) the teacher scores every segment as served MaxP reads it (kept in
//! `teacher-train.jsonl` and `teacher-dev.jsonl`, which a resumed run reads back). The student learns to put
//! the softmax of its cosines where the teacher's softmax is: cross-entropy against the teacher's distribution
//! (sharpened) over the teacher's best segment and `negatives` others drawn at each step: the teacher's next
//! best, which decide what `per_doc` 1 or 2 keeps, and random ones. Dev measures how often the
//! student's first segment is the teacher's best (`best_recall@1`, which selects the checkpoint) and how often
//! its first two hold it (`best_recall@2`): the recall a `per_doc` of 1 or 2 would have.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use candle_core::{Device, IndexOp, Tensor};
use serde::{Deserialize, Serialize};

use super::data::{self, Query};
use super::learner::Tracker;
use super::optim::{learning_rate, AdamW};
use super::{ModelReport, TrainData, TrainError, TrainOptions};
use crate::eval::{Run as TrecRun, Scored};
use crate::model::{cosine, BiEncoder, Encoded, TrainableEncoder};
use crate::preselect::by_score;
use crate::progress::{Progress, Unit};
use crate::rng::Rng;

/// The student's cosines are divided by this before the softmax (sentence-transformers' scale of 20), so
/// that a cosine's range can match the sharpness of the teacher's logits.
const TEMPERATURE: f64 = 0.05;

/// The teacher's logits are divided by this before its softmax. A cross-encoder's scores of one document's
/// segments span a few units and its best is often ahead by hundredths, so its plain softmax is near uniform
/// (median top mass 0.02 on SQuAD's articles, EXPERIMENTS.md) and a student fitting it learns to rank nothing;
/// at 0.1 clear wins are one-hot and near ties stay shared.
const TEACHER_TEMPERATURE: f64 = 0.1;

/// Texts per inference pass when dev embeds a document's segments.
const DEV_CHUNK: usize = 32;

/// A judged document as the teacher sees it: each segment's input and the teacher's score, in document order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    pub qid: String,
    pub query: String,
    pub docid: String,
    pub segments: Vec<String>,
    pub teacher: Vec<f32>,
}

impl Group {
    /// The teacher's best segment (the first of equals, as MaxP picks it).
    fn best(&self) -> usize {
        crate::rank::rerank::best(&self.teacher).unwrap_or(0)
    }
}

/// The teacher: a (query, document id) to every segment's input with its score.
pub type Teacher<'a> = dyn Fn(&str, &str) -> Result<Vec<(String, f32)>, TrainError> + 'a;

/// Trains the selector into `out/selector` from the bi-encoder `init`, resuming what is there. Returns its
/// report and the training and dev documents it learned and was measured on.
#[allow(clippy::too_many_arguments)]
pub fn train(
    data: &TrainData,
    teacher: &Teacher,
    (train_qids, dev_qids): (&BTreeSet<String>, &BTreeSet<String>),
    init: &Path,
    out: &Path,
    options: &TrainOptions,
    (device, dtype): (&Device, candle_core::DType),
    progress: &dyn Progress,
) -> Result<(ModelReport, usize, usize), TrainError> {
    let snapshot = data.collection.snapshot();
    let dir = out.join("selector");
    std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
    let groups = |qids: &BTreeSet<String>, file: &str| -> Result<Vec<Group>, TrainError> {
        let queries = data::queries(&snapshot, &data.topics, &data.qrels, qids, options)?;
        teach(&queries, &dir.join(file), teacher, progress)
    };
    let train_groups = groups(train_qids, "teacher-train.jsonl")?;
    let dev_groups = groups(dev_qids, "teacher-dev.jsonl")?;
    if train_groups.is_empty() || dev_groups.is_empty() {
        return Err(TrainError::Data("no training or dev document has two segments or more to choose among".into()));
    }
    let model = TrainableEncoder::init_bi_encoder(init, device, dtype)?;
    let mut optimizer = AdamW::new(model.variables(), options.weight_decay)?;
    let mut tracker = Tracker::open("selector", &dir, &model, &mut optimizer)?;
    if tracker.state.step == 0 && tracker.state.best_dev.is_none() {
        progress.phase("scoring dev with the initial model (step 0)", dev_groups.len() as u64, Unit::Items);
        tracker.evaluated(evaluate(&model.snapshot_bi_encoder()?, &dev_groups, progress)?, &model, options)?;
        tracker.checkpoint(&model, &optimizer)?;
    }
    let phase = "training the selector";
    let warmup = (options.warmup * options.steps as f64).round() as usize;
    let started = (std::time::Instant::now(), tracker.state.step);
    progress.phase(phase, options.steps as u64, Unit::Items);
    for step in tracker.state.step + 1..=options.steps {
        if tracker.state.done {
            break;
        }
        let lr = learning_rate(options.lr, step, warmup, options.steps);
        let loss = train_step(&model, &mut optimizer, &train_groups, (step, lr), options)?;
        let rate = ((step - started.1) * options.batch) as f64 / started.0.elapsed().as_secs_f64();
        tracker.stepped(step, loss, lr, Some(rate))?;
        progress.set(step as u64, &format!("loss {loss:.4} · {rate:.2} documents/s"));
        if step % options.eval_every == 0 || step == options.steps {
            progress.phase(&format!("selector: scoring dev at step {step}"), dev_groups.len() as u64, Unit::Items);
            tracker.evaluated(evaluate(&model.snapshot_bi_encoder()?, &dev_groups, progress)?, &model, options)?;
            progress.phase(phase, options.steps as u64, Unit::Items);
            progress.set(step as u64, "");
        }
        if step % options.checkpoint_every == 0 || step == options.steps || tracker.state.done {
            tracker.checkpoint(&model, &optimizer)?;
        }
    }
    if !tracker.state.done {
        tracker.state.done = true;
        tracker.checkpoint(&model, &optimizer)?;
    }
    Ok((tracker.report(), train_groups.len(), dev_groups.len()))
}

/// The teacher's view of each query's judged documents: read from `path` where an earlier attempt wrote it,
/// computed and appended for the rest. Documents with fewer than two segments are left out (nothing to choose).
fn teach(queries: &[Query], path: &Path, teacher: &Teacher, progress: &dyn Progress) -> Result<Vec<Group>, TrainError> {
    let mut known: BTreeMap<(String, String), Group> = BTreeMap::new();
    if path.exists() {
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        // A torn last line (an interruption) goes, and its document is scored again.
        let complete = &text[..text.rfind('\n').map_or(0, |end| end + 1)];
        if complete.len() < text.len() {
            std::fs::write(path, complete).map_err(|e| TrainError::io(path, e))?;
        }
        for line in complete.lines() {
            if let Ok(group) = serde_json::from_str::<Group>(line) {
                known.insert((group.qid.clone(), group.docid.clone()), group);
            }
        }
    }
    let pairs: Vec<(&Query, &String)> = queries.iter().flat_map(|q| q.positives.iter().map(move |d| (q, d))).collect();
    progress.phase(&format!("scoring segments with the teacher ({})", path.display()), pairs.len() as u64, Unit::Items);
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| TrainError::io(path, e))?;
    let mut groups = Vec::new();
    for (done, (query, docid)) in pairs.into_iter().enumerate() {
        let key = (query.qid.clone(), docid.clone());
        let group = match known.remove(&key) {
            Some(group) => group,
            None => {
                let (segments, teacher) = teacher(&query.text, docid)?.into_iter().unzip();
                let group = Group { qid: key.0, query: query.text.clone(), docid: key.1, segments, teacher };
                let line = serde_json::to_string(&group).unwrap_or_default() + "\n";
                std::io::Write::write_all(&mut file, line.as_bytes()).map_err(|e| TrainError::io(path, e))?;
                group
            }
        };
        if group.segments.len() >= 2 {
            groups.push(group);
        }
        progress.set(done as u64 + 1, "");
    }
    Ok(groups)
}

/// The segments one group trains on at a step: the teacher's best, then up to `negatives` others: half of
/// them the teacher's next best (rounded down), the rest drawn from the remaining ones, seeded.
fn drawn(group: &Group, negatives: usize, rng: &mut Rng) -> Vec<usize> {
    let mut order = by_score(&group.teacher);
    let hard = (negatives / 2 + 1).min(order.len());
    let mut others = order.split_off(hard);
    rng.shuffle(&mut others);
    others.truncate(negatives + 1 - hard);
    order.into_iter().chain(others).collect()
}

/// One optimizer step at learning rate `lr` on `options.batch` groups drawn for `step`; returns the mean loss.
fn train_step(
    model: &TrainableEncoder,
    optimizer: &mut AdamW,
    groups: &[Group],
    (step, lr): (usize, f64),
    options: &TrainOptions,
) -> Result<f64, TrainError> {
    let _dropping = super::Dropping::start(model, options, step);
    let mut rng = Rng::stream(options.seed, step as u64);
    let chosen: Vec<(&Group, Vec<usize>)> = (0..options.batch)
        .map(|_| {
            let group = &groups[rng.below(groups.len())];
            (group, drawn(group, options.negatives, &mut rng))
        })
        .collect();
    // One pass over every text of the step: each group's query, then its drawn segments.
    let mut encoded: Vec<Encoded> = Vec::new();
    for (group, segments) in &chosen {
        encoded.push(model.encode_text(&group.query)?);
        for &i in segments {
            encoded.push(model.encode_text(&group.segments[i])?);
        }
    }
    let embeddings = model.embed(&encoded)?;
    let mut losses = Vec::new();
    let mut offset = 0;
    for (group, segments) in &chosen {
        let query = embeddings.i(offset)?.unsqueeze(1)?;
        let cosines = embeddings.narrow(0, offset + 1, segments.len())?.matmul(&query)?.squeeze(1)?;
        let log_student = candle_nn::ops::log_softmax(&(cosines / TEMPERATURE)?, 0)?;
        let teacher: Vec<f32> = segments.iter().map(|&i| group.teacher[i]).collect();
        let target = candle_nn::ops::softmax(&(Tensor::new(teacher, model.device())? / TEACHER_TEMPERATURE)?, 0)?;
        losses.push((target.mul(&log_student)?.sum_all()? * -1.0)?);
        offset += 1 + segments.len();
    }
    let loss = Tensor::stack(&losses, 0)?.mean_all()?;
    let value = loss.to_scalar::<f32>()? as f64;
    let grads = loss.backward()?;
    let vars = model.variables();
    let grads: Vec<Tensor> = vars
        .iter()
        .map(|(name, var)| {
            grads
                .get(var.as_tensor())
                .map(Tensor::detach)
                .ok_or_else(|| TrainError::Data(format!("{name}: no gradient")))
        })
        .collect::<Result<_, _>>()?;
    optimizer.step(&grads, lr)?;
    Ok(value)
}

/// The student's ranking of every dev segment (a run of `docid#segment` ids): `best_recall@1` (the value that
/// selects checkpoints) and `best_recall@2`.
fn evaluate(
    model: &BiEncoder,
    groups: &[Group],
    progress: &dyn Progress,
) -> Result<(f64, BTreeMap<String, f64>, TrecRun), TrainError> {
    let mut run = TrecRun { tag: "selector".into(), ..Default::default() };
    let (mut first, mut second) = (0usize, 0usize);
    for (done, group) in groups.iter().enumerate() {
        let query = model.embed(&[model.encode(&group.query)?])?.remove(0);
        let mut scores: Vec<f32> = Vec::new();
        for chunk in group.segments.chunks(DEV_CHUNK) {
            let encoded: Vec<Encoded> = chunk.iter().map(|s| model.encode(s)).collect::<Result<_, _>>()?;
            scores.extend(model.embed(&encoded)?.iter().map(|e| cosine(e, &query)));
        }
        let best = group.best();
        let rank = by_score(&scores).iter().position(|&i| i == best);
        first += usize::from(rank == Some(0));
        second += usize::from(rank.is_some_and(|r| r < 2));
        let ranked =
            scores.iter().enumerate().map(|(i, &s)| Scored { docid: format!("{}#{i}", group.docid), score: s as f64 });
        run.topics.entry(group.qid.clone()).or_default().extend(ranked);
        progress.set(done as u64 + 1, "");
    }
    let n = groups.len().max(1) as f64;
    let (at1, at2) = (first as f64 / n, second as f64 / n);
    let measures = BTreeMap::from([("best_recall@1".to_string(), at1), ("best_recall@2".to_string(), at2)]);
    Ok((at1, measures, run))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn group(teacher: &[f32]) -> Group {
        Group {
            qid: "q".into(),
            query: "query".into(),
            docid: "d".into(),
            segments: teacher.iter().map(|s| s.to_string()).collect(),
            teacher: teacher.to_vec(),
        }
    }

    #[test]
    fn a_step_draws_the_teachers_best_then_its_next_best_then_distinct_others() {
        let g = group(&[0.1, 2.0, -1.0, 2.0, 0.5, 1.0]);
        let drawn = drawn(&g, 4, &mut Rng::new(3));
        assert_eq!(drawn[..3], [1, 3, 5], "the first of equal bests, then the next best two");
        assert_eq!(drawn.len(), 5);
        let mut rest = drawn[3..].to_vec();
        rest.sort();
        rest.dedup();
        assert_eq!(rest.len(), 2, "no segment twice");
        assert!(rest.iter().all(|i| [0, 2, 4].contains(i)));
        assert_eq!(super::drawn(&g, 10, &mut Rng::new(3)).len(), 6, "at most every segment");
        let one = super::drawn(&g, 1, &mut Rng::new(3));
        assert_eq!((one.len(), one[0]), (2, 1), "one negative: drawn, as half of one rounds down to none");
    }

    #[test]
    fn the_teachers_scores_are_kept_and_a_resumed_run_asks_only_for_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("teacher.jsonl");
        let query = |qid: &str, docs: &[&str]| Query {
            qid: qid.into(),
            text: format!("text of {qid}"),
            positives: docs.iter().map(|d| d.to_string()).collect(),
            negatives: Vec::new(),
        };
        let queries = [query("q1", &["a", "b"]), query("q2", &["c"])];
        let asked = std::cell::RefCell::new(Vec::new());
        let teacher = |q: &str, d: &str| -> Result<Vec<(String, f32)>, TrainError> {
            asked.borrow_mut().push(d.to_string());
            // Document b has one segment: nothing to choose, so it is not a group.
            let n = if d == "b" { 1 } else { 3 };
            Ok((0..n).map(|i| (format!("{q} {d} {i}"), i as f32)).collect())
        };
        let first = teach(&queries, &path, &teacher, &crate::progress::Silent).unwrap();
        assert_eq!(first.iter().map(|g| g.docid.as_str()).collect::<Vec<_>>(), ["a", "c"]);
        assert_eq!(first[0].segments[2], "text of q1 a 2");
        // An interruption tore the last line: only that document is scored again.
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, &text[..text.len() - 5]).unwrap();
        asked.borrow_mut().clear();
        let again = teach(&queries, &path, &teacher, &crate::progress::Silent).unwrap();
        assert_eq!(*asked.borrow(), ["c"]);
        assert_eq!(again, first);
        let lines = std::fs::read_to_string(&path).unwrap();
        assert_eq!(lines, text, "the torn line replaced whole");
    }
}
