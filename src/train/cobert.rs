//! Co-BERT training (`--method cobert`): the first round (MaxP with the model to start from) runs once per
//! query and keeps, for each of its top-`depth` BM25 candidates, the best passage, its score and its final
//! `[CLS]` state (in `features-train.jsonl` / `features-dev.jsonl`, resumable); then the model trains on
//! groups of candidates drawn across queries, with per-document binary cross-entropy. With the backbone
//! frozen only the heads train, over the cached states, and the checkpoint is the starting cross-encoder
//! with `cobert.json` and `cobert.safetensors`. End to end, every step passes the best passages through the
//! backbone, which trains with the heads; the checkpoint is that backbone with the heads, and the starting
//! cross-encoder in `first-round/`, which still runs the first round.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::path::Path;

use candle_core::{DType, Tensor};
use clap::builder::TypedValueParser as _;
use serde::{Deserialize, Serialize};

use super::learner::Tracker;
use super::optim::{learning_rate, AdamW};
use super::scorer::Scorer;
use super::{ModelReport, TrainError, TrainOptions};
use crate::eval::{Qrels, Run, Scored};
use crate::index::Snapshot;
use crate::model::cobert::{groups, CoBertConfig};
use crate::model::{CoBertInit, TrainableEncoder};
use crate::progress::{Progress, Unit};
use crate::rank::rerank::Candidate;
use crate::rng::Rng;

/// What `--method cobert` adds to the options.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::Args)]
pub struct CoBertTraining {
    #[command(flatten)]
    pub heads: CoBertConfig,
    /// Co-BERT: first-stage candidates per query (k).
    #[arg(long = "cobert-depth", default_value_t = 100)]
    pub depth: usize,
    /// Co-BERT's heads drawn from the seed (`random`), or their layers copied from the backbone's last ones
    /// (`backbone`, the paper's choice). Random heads did better on dev in each of Medline's five folds of the
    /// Co-BERT experiment (EXPERIMENTS.md).
    #[arg(long = "heads", value_name = "INIT", default_value = "random", action = clap::ArgAction::Set,
          value_parser = clap::builder::PossibleValuesParser::new(["random", "backbone"]).map(|s| s == "backbone"))]
    pub from_backbone: bool,
    /// Co-BERT: train the backbone with the heads (a GPU's job; else the backbone is frozen and its states
    /// cached).
    #[arg(long)]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub end_to_end: bool,
}

/// One query's first round: candidates in first-round order with their best passage's score and state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Features {
    pub qid: String,
    pub docids: Vec<String>,
    pub first_round: Vec<f32>,
    /// `[k × hidden]`, row-major.
    pub states: Vec<f32>,
    /// The best passages as the model reads them (title prefix included).
    #[serde(default)]
    pub passages: Vec<String>,
}

/// The first round of every query of `qids`, from `path` where computed before (a torn last line is
/// recomputed), the rest computed by `scorer` as the `cobert` pipeline computes it, and appended.
#[allow(clippy::too_many_arguments)]
fn features(
    path: &Path,
    collection: &Snapshot,
    topics: &[(String, String)],
    qids: &BTreeSet<String>,
    scorer: &Scorer,
    options: &TrainOptions,
    depth: usize,
    progress: &dyn Progress,
) -> Result<Vec<Features>, TrainError> {
    let mut done: BTreeMap<String, Features> = BTreeMap::new();
    if path.exists() {
        let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
        let mut kept = String::new();
        for line in text.lines() {
            // A line cut by an interruption does not parse: it is dropped and its query recomputed.
            if let Ok(f) = serde_json::from_str::<Features>(line) {
                kept.push_str(line);
                kept.push('\n');
                done.insert(f.qid.clone(), f);
            }
        }
        if kept != text {
            std::fs::write(path, kept).map_err(|e| TrainError::io(path, e))?;
        }
    }
    let todo: Vec<&(String, String)> =
        topics.iter().filter(|(q, _)| qids.contains(q) && !done.contains_key(q)).collect();
    progress.phase(&format!("first round into {}", path.display()), todo.len() as u64, Unit::Items);
    let mut file =
        std::fs::OpenOptions::new().create(true).append(true).open(path).map_err(|e| TrainError::io(path, e))?;
    for (n, (qid, query)) in todo.into_iter().enumerate() {
        let mut candidates = Vec::new();
        for hit in collection.search(query, depth, options.bm25)? {
            candidates.push(Candidate { first_stage_score: Some(hit.score), doc: collection.document(hit.address)? });
        }
        let round = scorer.first_round(query, &candidates)?;
        let hidden = round.first().map_or(0, |p| p.output.len() - 2);
        let f = Features {
            qid: qid.clone(),
            docids: round.iter().map(|p| candidates[p.candidate].doc.docid.clone()).collect(),
            first_round: round.iter().map(|p| p.score).collect(),
            states: round.iter().flat_map(|p| p.output[1..1 + hidden].iter().copied()).collect(),
            passages: round.into_iter().map(|p| p.text).collect(),
        };
        writeln!(file, "{}", serde_json::to_string(&f).unwrap_or_default()).map_err(|e| TrainError::io(path, e))?;
        done.insert(qid.clone(), f);
        progress.set(n as u64 + 1, qid);
    }
    Ok(done.into_values().filter(|f| !f.docids.is_empty()).collect())
}

/// Trains Co-BERT's heads over the frozen model `init` into `out/cobert`.
#[allow(clippy::too_many_arguments)]
pub fn train(
    collection: &Snapshot,
    topics: &[(String, String)],
    qrels: &Qrels,
    (train_qids, dev_qids): (&BTreeSet<String>, &BTreeSet<String>),
    init: &Path,
    out: &Path,
    options: &TrainOptions,
    cobert: &CoBertTraining,
    (device, dtype): (&candle_core::Device, DType),
    progress: &dyn Progress,
) -> Result<ModelReport, TrainError> {
    let dir = out.join("cobert");
    std::fs::create_dir_all(&dir).map_err(|e| TrainError::io(&dir, e))?;
    let heads_init = CoBertInit { config: cobert.heads, from_backbone: cobert.from_backbone };
    // End to end, the passes run in `dtype` (f32 master weights); the frozen backbone's states are cached.
    let dtype = if cobert.end_to_end { dtype } else { DType::F32 };
    let mut model = TrainableEncoder::init_with(init, device, dtype, options.seed, Some(heads_init))?;
    if cobert.end_to_end {
        model.keep_first_round(init);
    }
    let first_round = Scorer::cobert_of(&model, options)?;
    let train = features(
        &dir.join("features-train.jsonl"),
        collection,
        topics,
        train_qids,
        &first_round,
        options,
        cobert.depth,
        progress,
    )?;
    let dev = features(
        &dir.join("features-dev.jsonl"),
        collection,
        topics,
        dev_qids,
        &first_round,
        options,
        cobert.depth,
        progress,
    )?;
    if cobert.end_to_end && train.iter().chain(&dev).any(|f| f.passages.len() != f.docids.len()) {
        return Err(TrainError::Data(format!(
            "the first round cached in {} lacks the best passages (an older version wrote it): delete its \
             features-*.jsonl to recompute them",
            dir.display()
        )));
    }
    let queries: BTreeMap<&str, &str> = topics.iter().map(|(q, t)| (q.as_str(), t.as_str())).collect();
    let relevant = |qid: &str, docid: &str| qrels.topics.get(qid).and_then(|j| j.get(docid)).is_some_and(|g| *g > 0);
    // Every group of every training query with a relevant candidate.
    let pool: Vec<(usize, usize, usize, usize)> = train
        .iter()
        .enumerate()
        .filter(|(_, f)| f.docids.iter().any(|d| relevant(&f.qid, d)))
        .flat_map(|(q, f)| {
            groups(f.docids.len(), cobert.heads.group, cobert.heads.overlap)
                .into_iter()
                .map(move |g| (q, g.start, g.len, g.carried))
        })
        .collect();
    if pool.is_empty() || dev.is_empty() {
        return Err(TrainError::Data(
            "Co-BERT needs training queries with a relevant candidate, and dev queries".into(),
        ));
    }
    let heads = model.cobert().ok_or_else(|| TrainError::Data("no Co-BERT heads".into()))?;
    // The heads' variables that the configured parts use (an ablated part stays as initialized).
    let unused: Vec<&str> = [
        (cobert.heads.groupwise, "cobert.relevance."),
        (!cobert.heads.groupwise, "cobert.groupwise."),
        (!cobert.heads.calibrate, "cobert.calibrator."),
    ]
    .into_iter()
    .filter_map(|(off, prefix)| off.then_some(prefix))
    .collect();
    // End to end, the backbone trains too (not the pooler and classifier: the heads read the `[CLS]` state).
    let trains = |n: &str| match n.strip_prefix("cobert.") {
        Some(_) => !unused.iter().any(|p| n.starts_with(p)),
        None => cobert.end_to_end && n.starts_with("bert.") && !n.starts_with("bert.pooler."),
    };
    let vars: Vec<_> = model.variables().into_iter().filter(|(n, _)| trains(n)).collect();
    let mut optimizer = AdamW::new(vars.clone(), options.weight_decay)?;
    let mut tracker = Tracker::open("cobert", &dir, &model, &mut optimizer)?;
    let hidden = first_round_hidden(&train)?;
    let tensor = |f: &Features, start: usize, len: usize| -> Result<(Tensor, Tensor), TrainError> {
        let r = Tensor::from_vec(f.states[start * hidden..(start + len) * hidden].to_vec(), (len, hidden), device)?;
        let s = Tensor::from_vec(f.first_round[start..start + len].to_vec(), len, device)?;
        Ok((r, s))
    };
    let fresh = cobert.end_to_end.then_some(&queries);
    if tracker.state.step == 0 && tracker.state.best_dev.is_none() {
        // The initial heads' dev score (step 0): the mark training has to beat.
        progress.phase("scoring dev with the initial model (step 0)", 0, Unit::Items);
        let evaluation = evaluate(&model, &dev, qrels, options, hidden, fresh)?;
        tracker.evaluated(evaluation, &model, options)?;
        tracker.checkpoint(&model, &optimizer)?;
    }
    progress.phase("training cobert", options.steps as u64, Unit::Items);
    let warmup = (options.warmup * options.steps as f64).round() as usize;
    while tracker.state.step < options.steps && !tracker.state.done {
        let step = tracker.state.step + 1;
        let _dropping = super::Dropping::start(&model, options, step);
        let mut rng = Rng::stream(options.seed, step as u64);
        let mut total: Option<Tensor> = None;
        for _ in 0..options.batch {
            let (q, start, len, carried) = pool[rng.below(pool.len())];
            let f = &train[q];
            let m = cobert.heads.prototypes.min(f.docids.len());
            let prototype_scores = Tensor::from_vec(f.first_round[..m].to_vec(), m, device)?;
            let (r, prototypes) = if cobert.end_to_end {
                // One backbone pass per document: the prototypes, then the group's other documents.
                let index: Vec<usize> = (0..m).chain((start..start + len).filter(|&j| j >= m)).collect();
                let query = queries.get(f.qid.as_str()).copied().unwrap_or_default();
                let encoded = index
                    .iter()
                    .map(|&j| model.encode(query, &f.passages[j], options.max_length, options.max_query_tokens))
                    .collect::<Result<Vec<_>, _>>()?;
                let states = model.cls_states(&encoded)?;
                let rows = |docs: std::ops::Range<usize>| -> Result<Tensor, TrainError> {
                    let at: Vec<u32> =
                        docs.map(|j| index.iter().position(|&i| i == j).unwrap_or_default() as u32).collect();
                    Ok(states.index_select(&Tensor::new(at.as_slice(), device)?, 0)?)
                };
                (rows(start..start + len)?, rows(0..m)?)
            } else {
                (tensor(f, start, len)?.0, tensor(f, 0, m)?.0)
            };
            let calibrated = heads.calibrate(&r, &prototypes, &prototype_scores)?;
            let logits = if cobert.heads.groupwise {
                let group = [crate::model::cobert::Group { start: 0, len, carried }];
                heads.score_groups(&calibrated, &group)?.squeeze(0)?
            } else {
                heads.score_alone(&calibrated)?
            };
            let labels: Vec<f32> =
                f.docids[start..start + len].iter().map(|d| relevant(&f.qid, d) as u8 as f32).collect();
            let y = Tensor::from_vec(labels, len, device)?;
            // Binary cross-entropy with logits: max(x, 0) − x·y + log(1 + e^(−|x|)).
            let loss =
                ((logits.relu()? - (&logits * &y)?)? + ((logits.abs()? * -1.0)?.exp()? + 1.0)?.log()?)?.mean_all()?;
            total = Some(match total {
                Some(t) => (t + loss)?,
                None => loss,
            });
        }
        let loss = (total.ok_or_else(|| TrainError::Data("empty batch".into()))? / options.batch as f64)?;
        let grads = loss.backward()?;
        let grads: Vec<Tensor> = vars
            .iter()
            .map(|(n, v)| {
                grads.get(v.as_tensor()).cloned().ok_or_else(|| TrainError::Data(format!("{n} received no gradient")))
            })
            .collect::<Result<_, _>>()?;
        let lr = learning_rate(options.lr, step, warmup, options.steps);
        optimizer.step(&grads, lr)?;
        let loss = loss.to_scalar::<f32>()? as f64;
        tracker.stepped(step, loss, lr, None)?;
        progress.set(step as u64, &format!("loss {loss:.4}"));
        if step % options.eval_every == 0 || step == options.steps {
            let evaluation = evaluate(&model, &dev, qrels, options, hidden, fresh)?;
            tracker.evaluated(evaluation, &model, options)?;
        }
        if step % options.checkpoint_every == 0 || step == options.steps || tracker.state.done {
            tracker.state.done |= step == options.steps;
            tracker.checkpoint(&model, &optimizer)?;
        }
    }
    Ok(tracker.report())
}

fn first_round_hidden(features: &[Features]) -> Result<usize, TrainError> {
    features
        .iter()
        .find(|f| !f.docids.is_empty())
        .map(|f| f.states.len() / f.docids.len())
        .ok_or_else(|| TrainError::Data("no query has first-stage candidates".into()))
}

/// Co-BERT's ranking of each dev query's candidates, as the `cobert` pipeline scores them: over the cached
/// states, or, with the queries given (end to end), over the states the current backbone computes.
fn evaluate(
    model: &TrainableEncoder,
    dev: &[Features],
    qrels: &Qrels,
    options: &TrainOptions,
    hidden: usize,
    fresh: Option<&BTreeMap<&str, &str>>,
) -> Result<(f64, BTreeMap<String, f64>, Run), TrainError> {
    let heads = model.cobert().ok_or_else(|| TrainError::Data("no Co-BERT heads".into()))?;
    let device = model.device();
    let backbone = fresh.map(|_| Scorer::cobert_of(model, options)).transpose()?;
    let mut run = Run { tag: "dev".into(), ..Default::default() };
    for f in dev {
        let k = f.docids.len();
        let states = match (&backbone, fresh) {
            (Some(backbone), Some(queries)) => {
                let query = queries.get(f.qid.as_str()).copied().unwrap_or_default();
                let passages: Vec<&str> = f.passages.iter().map(String::as_str).collect();
                let outputs = backbone.interactions(query, &passages)?;
                outputs.iter().flat_map(|o| o[1..1 + hidden].iter().copied()).collect()
            }
            _ => f.states.clone(),
        };
        let r = Tensor::from_vec(states, (k, hidden), device)?;
        let first = Tensor::new(f.first_round.as_slice(), device)?;
        let scores: Vec<f32> = heads.forward(&r, &first)?.to_vec1()?;
        let docs = f.docids.iter().zip(scores).map(|(d, s)| Scored { docid: d.clone(), score: s as f64 }).collect();
        run.topics.insert(f.qid.clone(), docs);
    }
    let qids: BTreeSet<&String> = dev.iter().map(|f| &f.qid).collect();
    let judged = Qrels {
        topics: qrels.topics.iter().filter(|(q, _)| qids.contains(q)).map(|(q, j)| (q.clone(), j.clone())).collect(),
    };
    let (value, named) = super::dev::measure(&run, &judged, options);
    Ok((value, named, run))
}
