//! Fine-tuning cross-encoders on long documents (`longrank train`): FirstP (first segments), all segments,
//! and BeST (Query-driven Segment Selection for Ranking Long Documents, CIKM 2021) — train on the segment of
//! each judged document that a model scores best, iterated EM-style.
//!
//! A run writes one directory per trained model under `--out` (`firstp`, `allp`, `best-1`, `best-2`, …),
//! each with `model/` (the checkpoint selected on dev, a Hugging Face cross-encoder the server loads),
//! `state/` (the latest weights and optimizer state, for resuming), `log.jsonl`, `curves.svg` and
//! `dev-run.txt`; BeST iterations also keep `selections.tsv` (the segment each (query, document) trained on).
//! `--method best` trains `allp` (θ⁽⁰⁾) and `best-1` side by side, `best-1` on the segments θ⁽⁰⁾ scores
//! highest as it trains, then each further iteration from a fresh start on the segments its predecessor
//! selects, until dev stops improving. `--method selector` distils a cross-encoder's segment scores into a
//! bi-encoder that picks the segments the cross-encoder reads (`selector`).

mod cobert;
mod data;
mod dev;
mod learner;
mod log;
mod optim;
mod plot;
mod scorer;
mod selector;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::{Device, Tensor};
use serde::{Deserialize, Serialize};

use crate::config::ModelConfig;
use crate::eval::passages::{overlaps, Passage};
use crate::eval::Qrels;
use crate::index::{Bm25Params, Collection, IndexError};
use crate::model::{CrossEncoder, ModelError, TrainableEncoder};
use crate::preselect::Preselect;
use crate::progress::{Progress, Unit};

pub use cobert::CoBertTraining;
pub use data::Query;
use data::{Documents, Example};
use dev::DevSet;
use learner::{Learner, Selector};
pub use optim::{learning_rate, AdamW};
use scorer::Scorer;
pub use selector::Teacher;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Model(#[from] ModelError),
    #[error(transparent)]
    Index(#[from] IndexError),
    #[error("training: {0}")]
    Candle(#[from] candle_core::Error),
    #[error("{}: {message}", path.display())]
    Io { path: PathBuf, message: String },
    #[error("{0}")]
    Data(String),
}

impl TrainError {
    fn io(path: &Path, message: impl ToString) -> TrainError {
        TrainError::Io { path: path.to_path_buf(), message: message.to_string() }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// First segments only.
    Firstp,
    /// Every segment inherits its document's label (a random one per example).
    Allp,
    /// BeST: the segment the previous model scores highest.
    Best,
    /// Co-BERT's heads over the frozen model (its first round and `[CLS]` states).
    Cobert,
    /// A learned preselection: a bi-encoder (`--init`) distilled from a cross-encoder's segment scores
    /// (`--teacher`); `--batch` documents per step, each read at the teacher's best segment and `--negatives`
    /// others (half its next best).
    Selector,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Loss {
    /// Pairwise hinge max(0, 1 − s⁺ + s⁻): one positive and one negative per example.
    Hinge,
    /// Softmax cross-entropy over one positive and `negatives` negatives.
    Softmax,
}

impl Loss {
    /// The loss of a batch's scores `[examples, 1 + negatives]` (each example's positive first), averaged over
    /// its examples, on the autograd graph.
    pub fn of(self, scores: &Tensor) -> candle_core::Result<Tensor> {
        match self {
            Loss::Hinge => {
                let margin = (scores.narrow(1, 1, 1)? - scores.narrow(1, 0, 1)?)? + 1.0;
                margin?.relu()?.mean_all()
            }
            Loss::Softmax => {
                let log_probs = candle_nn::ops::log_softmax(scores, 1)?;
                log_probs.narrow(1, 0, 1)?.mean_all()? * -1.0
            }
        }
    }
}

/// The dev measure for early stopping and model selection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
pub enum DevMeasure {
    #[value(name = "mrr@10")]
    #[serde(rename = "mrr@10")]
    Mrr10,
    #[value(name = "ndcg@10")]
    #[serde(rename = "ndcg@10")]
    Ndcg10,
}

/// Leading tokens of a document that training segments come from (`None`: all); `all` on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DocTokens(pub Option<usize>);

impl std::str::FromStr for DocTokens {
    type Err = String;

    fn from_str(text: &str) -> Result<DocTokens, String> {
        match text {
            "all" => Ok(DocTokens(None)),
            n => n.parse().map(|n| DocTokens(Some(n))).map_err(|_| format!("{n:?}: a number of tokens or `all`")),
        }
    }
}

/// Everything that decides what a run computes (kept in `train.json`; a resumed run must match it). The
/// command line's `longrank train` flags are these fields; the defaults are written once, here.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, clap::Args)]
pub struct TrainOptions {
    #[arg(long, value_enum, default_value_t = Method::Best)]
    pub method: Method,
    #[arg(long, value_enum, default_value_t = Loss::Hinge)]
    pub loss: Loss,
    /// Negatives per example with `--loss softmax`.
    #[arg(long, default_value_t = 10)]
    pub negatives: usize,
    /// BM25 depth negatives come from.
    #[arg(long, default_value_t = 100)]
    pub candidates: usize,
    /// Longest model input in word pieces.
    #[arg(long, default_value_t = 256)]
    pub max_length: usize,
    /// Queries are cut to this many word pieces.
    #[arg(long, default_value_t = 64)]
    pub max_query_tokens: usize,
    /// Leading tokens of each document that training segments come from, or `all`.
    #[arg(long, default_value = "2048")]
    pub doc_tokens: DocTokens,
    /// Draw each training segment's length between half and all of the budget (`--fixed-lengths`: the full
    /// budget).
    #[arg(long = "fixed-lengths", action = clap::ArgAction::SetFalse)]
    pub random_lengths: bool,
    /// Repeat the title in each segment (`--no-title`: do not).
    #[arg(long = "no-title", action = clap::ArgAction::SetFalse)]
    pub repeat_title: bool,
    /// Optimizer steps per model.
    #[arg(long, default_value_t = 1000)]
    pub steps: usize,
    /// Examples per forward pass.
    #[arg(long, default_value_t = 8)]
    pub batch: usize,
    /// Forward passes per optimizer step.
    #[arg(long, default_value_t = 1)]
    pub accumulate: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 2e-5)]
    pub lr: f64,
    /// Share of the steps spent warming up.
    #[arg(long, default_value_t = 0.1)]
    pub warmup: f64,
    /// AdamW's weight decay (matrices only).
    #[arg(long, default_value_t = 0.01)]
    pub weight_decay: f64,
    /// Seed of the examples, the dev sample and the initialization of missing layers.
    #[arg(long, default_value_t = 42)]
    pub seed: u64,
    /// Drop as the family's transformers model does in training, at its config's rates, the masks drawn from
    /// `--seed` and the step (so a resumed run drops as the uninterrupted one) [default: off, as before the
    /// option: no measurement here has decided between them]. Left out of `train.json` when off, so runs from
    /// before the option resume.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub dropout: bool,
    /// Steps between checkpoints (what an interrupted run resumes from).
    #[arg(long, default_value_t = 50)]
    pub checkpoint_every: usize,
    /// Steps between dev evaluations.
    #[arg(long, default_value_t = 200)]
    pub eval_every: usize,
    /// Evaluations without a dev gain before a model stops (0: never stop early).
    #[arg(long, default_value_t = 3)]
    pub patience: usize,
    /// The dev measure that selects checkpoints.
    #[arg(long, value_enum, default_value_t = DevMeasure::Mrr10)]
    pub dev_measure: DevMeasure,
    /// Dev queries (a seeded sample).
    #[arg(long, default_value_t = 100)]
    pub dev_queries: usize,
    /// Training queries: a seeded sample of this many [default: every training query]. Co-BERT runs the
    /// first round over each one's candidates before training, which bounds what a CPU can afford. Left out
    /// of `train.json` when none, so runs from before the option resume.
    #[arg(long)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub train_queries: Option<usize>,
    /// BM25 candidates each dev query re-ranks.
    #[arg(long, default_value_t = 5)]
    pub dev_depth: usize,
    /// Which segments the model reads in dev evaluation, as JSON (`'{"selector": "bm25", "per_doc": 2}'`: a
    /// cheaper dev run; the `bm25` selector's statistics are the dev candidates' own) [default: every segment].
    /// Left out of `train.json` when none, so runs from before the option resume.
    #[arg(long, value_parser = crate::rank::json_arg::<Preselect>, value_name = "JSON")]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dev_preselect: Option<Preselect>,
    /// BeST iterations at most.
    #[arg(long, default_value_t = 3)]
    pub iterations: usize,
    /// Folds that train (with `--folds` and `--dev-fold`) [default: every fold but the dev fold].
    #[arg(long, value_delimiter = ',')]
    pub train_folds: Vec<usize>,
    /// The fold dev questions come from (with `--folds`) [default: none, a seeded sample of `--dev-queries`].
    #[arg(long)]
    pub dev_fold: Option<usize>,
    /// Padded tokens per inference pass (selection and dev scoring): `model.max_batch_tokens`.
    #[arg(skip = ModelConfig::default().max_batch_tokens)]
    pub batch_tokens: usize,
    /// The first stage of negatives and dev candidates: `[bm25]` of the configuration. Left out of
    /// `train.json` at Anserini's defaults, so runs from before the setting resume.
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "is_anserini")]
    pub bm25: Bm25Params,
    /// Co-BERT's heads and first round (`--method cobert`).
    #[arg(skip)]
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cobert: Option<CoBertTraining>,
}

/// The stream of a step's dropout masks: the run's seed, apart from the streams its examples come from.
const DROPOUT_STREAM: u64 = 0x6472_6f70_6f75_7400;

/// A training step's dropout: on from `start` (when `options.dropout` asks for it) until this is dropped, its
/// masks drawn from the run's seed and the step.
struct Dropping(crate::model::Dropout);

impl Dropping {
    fn start(model: &TrainableEncoder, options: &TrainOptions, step: usize) -> Dropping {
        let dropout = model.dropout().clone();
        if options.dropout {
            dropout.start(crate::rng::Rng::stream(options.seed ^ DROPOUT_STREAM, step as u64).next_u64());
        }
        Dropping(dropout)
    }
}

impl Drop for Dropping {
    fn drop(&mut self) {
        self.0.stop();
    }
}

fn is_anserini(bm25: &Bm25Params) -> bool {
    *bm25 == Bm25Params::default()
}

impl Default for TrainOptions {
    /// The command line's defaults.
    fn default() -> Self {
        use clap::{FromArgMatches, Parser};
        #[derive(Parser)]
        struct Defaults {
            #[command(flatten)]
            options: TrainOptions,
        }
        let matches = <Defaults as clap::CommandFactory>::command().get_matches_from(["train"]);
        Defaults::from_arg_matches(&matches).expect("the defaults parse").options
    }
}

impl TrainOptions {
    fn validate(&self) -> Result<(), TrainError> {
        let bad = |m: &str| Err(TrainError::Data(m.to_string()));
        if self.steps == 0 || self.batch == 0 || self.accumulate == 0 {
            return bad("steps, batch and accumulate must be at least 1");
        }
        if self.loss == Loss::Softmax && self.negatives == 0 {
            return bad("the softmax loss needs at least one negative");
        }
        if self.max_length <= self.max_query_tokens + 4 {
            return bad("max_length must leave room for a segment after the query");
        }
        if self.eval_every == 0 || self.checkpoint_every == 0 {
            return bad("eval_every and checkpoint_every must be at least 1");
        }
        Ok(())
    }
}

/// The data a run trains and selects on.
pub struct TrainData<'a> {
    pub collection: &'a Collection,
    /// (qid, query text).
    pub topics: Vec<(String, String)>,
    pub qrels: Qrels,
    pub folds: Option<BTreeMap<String, usize>>,
    /// Gold passages, to report how often the document budget covers them.
    pub passages: Option<BTreeMap<String, Vec<Passage>>>,
    /// The cross-encoder whose segment scores `--method selector` learns.
    pub teacher: Option<&'a Teacher<'a>>,
}

/// One trained model's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ModelReport {
    pub name: String,
    pub dir: PathBuf,
    pub steps: usize,
    pub best_dev: Option<f64>,
    pub best_step: Option<usize>,
    pub stopped_early: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TrainReport {
    pub models: Vec<ModelReport>,
    /// The model to use: the best on dev.
    pub selected: Option<String>,
    pub train_queries: usize,
    pub dev_queries: usize,
    /// Share of (training query, relevant document) pairs whose gold passage overlaps a training segment.
    pub budget_covers_gold: Option<f64>,
}

/// Trains the models `options.method` calls for, starting each from `init`, resuming what `out` holds.
#[allow(clippy::too_many_arguments)]
pub fn train(
    data: &TrainData,
    init: &Path,
    out: &Path,
    options: &TrainOptions,
    device: &Device,
    dtype: candle_core::DType,
    progress: &dyn Progress,
) -> Result<TrainReport, TrainError> {
    options.validate()?;
    std::fs::create_dir_all(out).map_err(|e| TrainError::io(out, e))?;
    check_options(out, init, options)?;
    let qids: Vec<String> = data.topics.iter().map(|(q, _)| q.clone()).collect();
    let (train_qids, dev_qids) = data::split(&qids, data.folds.as_ref(), options)?;
    if options.method == Method::Cobert {
        let settings =
            options.cobert.ok_or_else(|| TrainError::Data("--method cobert needs Co-BERT settings".into()))?;
        let split = (&train_qids, &dev_qids);
        let model = cobert::train(
            &data.collection.snapshot(),
            &data.topics,
            &data.qrels,
            split,
            init,
            out,
            options,
            &settings,
            (device, dtype),
            progress,
        )?;
        return finish(out, vec![model], train_qids.len(), dev_qids.len(), None);
    }
    if options.method == Method::Selector {
        let teacher = data.teacher.ok_or_else(|| TrainError::Data("a selector learns from a teacher".into()))?;
        let split = (&train_qids, &dev_qids);
        let (model, train_docs, dev_docs) =
            selector::train(data, teacher, split, init, out, options, (device, dtype), progress)?;
        return finish(out, vec![model], train_docs, dev_docs, None);
    }
    progress.phase("preparing queries", 0, Unit::Items);
    // Training reads one view of the collection throughout.
    let snapshot = data.collection.snapshot();
    let queries = data::queries(&snapshot, &data.topics, &data.qrels, &train_qids, options)?;
    if queries.iter().all(|q| q.negatives.is_empty()) {
        return Err(TrainError::Data("no training query has both a relevant document and BM25 negatives".into()));
    }
    let dev = DevSet::new(&snapshot, &data.topics, &data.qrels, &dev_qids, options)?;
    // The initial model's tokenizer cuts training segments (it may lack the classifier a `CrossEncoder` needs).
    let tokenizer = TrainableEncoder::init(init, device, dtype, options.seed)?;
    let docs = Documents::new(&snapshot, options, &tokenizer);
    let initial_dev = std::cell::OnceCell::new();
    let run =
        Run { queries: &queries, dev: &dev, docs: &docs, options, init, out, device, dtype, progress, initial_dev };
    let budget_covers_gold = data.passages.as_ref().map(|passages| run.coverage(passages)).transpose()?;
    let models = match options.method {
        Method::Firstp => vec![run.train_one("firstp", Selector::First)?],
        Method::Allp => vec![run.train_one("allp", Selector::Random)?],
        Method::Best => run.best()?,
        Method::Cobert | Method::Selector => unreachable!("trained above"),
    };
    finish(out, models, queries.len(), dev.len(), budget_covers_gold)
}

/// The run's report, also written to `summary.json`.
fn finish(
    out: &Path,
    models: Vec<ModelReport>,
    train_queries: usize,
    dev_queries: usize,
    budget_covers_gold: Option<f64>,
) -> Result<TrainReport, TrainError> {
    // The best on dev; among equals the earliest (the cheaper iteration).
    let selected = models
        .iter()
        .filter_map(|m| Some((m.best_dev?, &m.name)))
        .fold(None, |best: Option<(f64, &String)>, (dev, name)| match best {
            Some((b, _)) if b >= dev => best,
            _ => Some((dev, name)),
        })
        .map(|(_, name)| name.clone());
    let report = TrainReport { models, selected, train_queries, dev_queries, budget_covers_gold };
    let path = out.join("summary.json");
    std::fs::write(&path, serde_json::to_vec_pretty(&report).unwrap_or_default())
        .map_err(|e| TrainError::io(&path, e))?;
    Ok(report)
}

/// Writes `train.json` on a new run; a resumed run must have been started with the same options.
fn check_options(out: &Path, init: &Path, options: &TrainOptions) -> Result<(), TrainError> {
    let path = out.join("train.json");
    let current = serde_json::json!({ "init": init, "options": options });
    if path.exists() {
        let text = std::fs::read(&path).map_err(|e| TrainError::io(&path, e))?;
        let before: serde_json::Value = serde_json::from_slice(&text).map_err(|e| TrainError::io(&path, e))?;
        if before != current {
            return Err(TrainError::io(
                &path,
                "this directory holds a run with other options or another initial model: resume it with the \
                 same ones, or train into a new --out",
            ));
        }
        return Ok(());
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&current).unwrap_or_default()).map_err(|e| TrainError::io(&path, e))
}

struct Run<'a> {
    queries: &'a [Query],
    dev: &'a DevSet,
    docs: &'a Documents<'a>,
    options: &'a TrainOptions,
    init: &'a Path,
    out: &'a Path,
    device: &'a Device,
    dtype: candle_core::DType,
    progress: &'a dyn Progress,
    /// The initial model's dev evaluation, computed once: every learner starts from the same weights.
    initial_dev: std::cell::OnceCell<dev::Evaluation>,
}

impl Run<'_> {
    fn learner(&self, name: &str, selector: Selector) -> Result<Learner, TrainError> {
        Learner::open(name, &self.out.join(name), selector, self)
    }

    fn train_one(&self, name: &str, selector: Selector) -> Result<ModelReport, TrainError> {
        let mut learners = vec![self.learner(name, selector)?];
        self.train_together(&mut learners)?;
        Ok(learners.remove(0).report())
    }

    /// BeST: θ⁽⁰⁾ (`allp`) and θ⁽¹⁾ side by side, then iterations from fresh starts while dev improves.
    fn best(&self) -> Result<Vec<ModelReport>, TrainError> {
        let mut learners = vec![self.learner("allp", Selector::Random)?, self.learner("best-1", Selector::Online(0))?];
        self.train_together(&mut learners)?;
        let mut reports: Vec<ModelReport> = learners.iter().map(|l| l.report()).collect();
        for iteration in 2..=self.options.iterations {
            let previous = &reports[reports.len() - 1];
            let name = format!("best-{iteration}");
            let selections = self.select(&previous.dir.join("model"), &self.out.join(&name))?;
            let report = self.train_one(&name, Selector::Fixed(selections))?;
            let improved = report.best_dev.unwrap_or(f64::MIN) > previous.best_dev.unwrap_or(f64::MIN);
            reports.push(report);
            if !improved {
                break;
            }
        }
        Ok(reports)
    }

    /// Steps the learners over the same examples until each is done.
    fn train_together(&self, learners: &mut [Learner]) -> Result<(), TrainError> {
        let start = learners.iter().map(|l| l.step()).min().unwrap_or(0);
        let names: Vec<&str> = learners.iter().map(|l| l.name()).collect();
        let phase = format!("training {}", names.join(" + "));
        if start == 0 {
            // The initial model's dev score (step 0): the mark training has to beat, in the log and the curves.
            for learner in learners.iter_mut() {
                learner.evaluate_initial(self)?;
            }
        }
        self.progress.resume(&phase, self.options.steps as u64, Unit::Items, start as u64);
        let started = std::time::Instant::now();
        for step in start + 1..=self.options.steps {
            if learners.iter().all(|l| l.done()) {
                break;
            }
            let examples = data::examples(self.queries, self.options, step);
            // Online selectors read their model as it was before this step's updates.
            let snapshots: Vec<Option<Scorer>> = (0..learners.len())
                .map(|i| {
                    let wanted = learners.iter().any(|l| matches!(l.selector(), Selector::Online(j) if *j == i));
                    wanted.then(|| Scorer::of(learners[i].model(), self.options)).transpose()
                })
                .collect::<Result<_, _>>()?;
            let mut losses = Vec::new();
            for learner in learners.iter_mut().filter(|l| !l.done() && l.step() < step) {
                let loss = learner.train_step(step, &examples, &snapshots, self)?;
                losses.push(format!("{} {loss:.4}", learner.name()));
            }
            let done = step - start;
            let rate = (done * self.options.batch * self.options.accumulate) as f64 / started.elapsed().as_secs_f64();
            self.progress.set(step as u64, &format!("loss {} · {rate:.2} examples/s", losses.join(", ")));
            let evaluating = step % self.options.eval_every == 0 || step == self.options.steps;
            for learner in learners.iter_mut().filter(|l| !l.done()) {
                if evaluating {
                    learner.evaluate(self)?;
                }
                if step % self.options.checkpoint_every == 0 || step == self.options.steps || learner.done() {
                    learner.checkpoint()?;
                }
            }
            if evaluating {
                // Dev scoring showed its own phase: back to training, its rate from here.
                self.progress.resume(&phase, self.options.steps as u64, Unit::Items, step as u64);
            }
        }
        for learner in learners.iter_mut() {
            learner.finish()?;
        }
        Ok(())
    }

    /// The segment of each training (query, document) that the model in `model_dir` scores highest, for
    /// every pair the run's examples use; kept in `dir/selections.tsv`, which a resumed run extends.
    fn select(&self, model_dir: &Path, dir: &Path) -> Result<HashMap<(String, String), usize>, TrainError> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        let path = dir.join("selections.tsv");
        let mut selections = learner::read_selections(&path)?;
        let mut pairs: Vec<(usize, String)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for step in 1..=self.options.steps {
            for example in data::examples(self.queries, self.options, step) {
                for docid in example.docs {
                    let key = (self.queries[example.query].qid.clone(), docid.clone());
                    if !selections.contains_key(&key) && seen.insert(key) {
                        pairs.push((example.query, docid));
                    }
                }
            }
        }
        let scorer = Scorer::cross(CrossEncoder::load(model_dir, self.device, self.dtype, None)?, self.options);
        let phase = format!("selecting segments with {}", model_dir.display());
        self.progress.phase(&phase, pairs.len() as u64, Unit::Items);
        let mut file =
            std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(|e| TrainError::io(&path, e))?;
        for (done, (query, docid)) in pairs.iter().enumerate() {
            let doc = self.docs.get(docid)?;
            let best = scorer.best_segment(&self.queries[*query].text, &doc)?;
            let qid = &self.queries[*query].qid;
            std::io::Write::write_all(&mut file, format!("{qid}\t{docid}\t{best}\n").as_bytes())
                .map_err(|e| TrainError::io(&path, e))?;
            selections.insert((qid.clone(), docid.clone()), best);
            self.progress.set(done as u64 + 1, "");
        }
        Ok(selections)
    }

    /// How often a training query's gold passage lies in the segments training may use.
    fn coverage(&self, passages: &BTreeMap<String, Vec<Passage>>) -> Result<f64, TrainError> {
        let (mut covered, mut total) = (0usize, 0usize);
        for query in self.queries {
            for passage in passages.get(&query.qid).into_iter().flatten().filter(|p| query.positives.contains(&p.docid))
            {
                let doc = self.docs.get(&passage.docid)?;
                total += 1;
                covered += doc.segments.iter().any(|s| overlaps(s.start, s.end, passage)) as usize;
            }
        }
        Ok(covered as f64 / total.max(1) as f64)
    }
}

/// The examples' segment inputs for one model: the relevant document's first, then its negatives'.
fn inputs_of(
    examples: &[Example],
    choose: &mut dyn FnMut(&Example, usize, &data::TrainingDoc) -> Result<usize, TrainError>,
    run: &Run,
) -> Result<Vec<(String, String)>, TrainError> {
    let mut out = Vec::new();
    for example in examples {
        let query = &run.queries[example.query].text;
        for (position, docid) in example.docs.iter().enumerate() {
            let doc = run.docs.get(docid)?;
            let index = choose(example, position, &doc)?;
            out.push((query.clone(), doc.input(index)));
        }
    }
    Ok(out)
}
