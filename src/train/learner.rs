//! One model in training: its variables and optimizer, the segments it trains on, and its `Tracker` (dev
//! evaluations with early stopping and model selection, checkpoints to resume from, its log and curves),
//! which Co-BERT's training shares.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::data::{Example, TrainingDoc};
use super::log::{Entry, Log};
use super::optim::{learning_rate, AdamW};
use super::scorer::Scorer;
use super::{inputs_of, ModelReport, Run, TrainError, TrainOptions};
use crate::eval::Run as TrecRun;
use crate::model::{Encoded, TrainableEncoder};
use crate::progress::Unit;
use crate::rng::Rng;

/// Which segment of each document a model trains on.
pub enum Selector {
    /// The first (FirstP).
    First,
    /// A random one of the leading segments (all segments inherit the document's label).
    Random,
    /// The one another model of the run scores highest at this step (BeST's first iteration).
    Online(usize),
    /// Chosen beforehand by the previous iteration's model.
    Fixed(HashMap<(String, String), usize>),
}

/// What `state/progress.json` keeps between checkpoints.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub(super) struct TrainState {
    pub step: usize,
    pub best_dev: Option<f64>,
    pub best_step: Option<usize>,
    pub evals_without_gain: usize,
    pub done: bool,
    pub stopped_early: bool,
}

/// One model's course on disk, shared by every method: its state to resume from (`state/`), its log, and dev
/// evaluations with model selection (a gain saves `model/` and `dev-run.txt`) and early stopping.
pub(super) struct Tracker {
    name: String,
    dir: PathBuf,
    pub state: TrainState,
    log: Log,
}

impl Tracker {
    /// Opens `dir`, loading the state it holds into `model` and `optimizer` (a fresh start when none).
    pub fn open(
        name: &str,
        dir: &Path,
        model: &TrainableEncoder,
        optimizer: &mut AdamW,
    ) -> Result<Tracker, TrainError> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        let state_dir = dir.join("state");
        let path = state_dir.join("progress.json");
        let state: TrainState = if path.exists() {
            let state: TrainState =
                serde_json::from_slice(&std::fs::read(&path).map_err(|e| TrainError::io(&path, e))?)
                    .map_err(|e| TrainError::io(&path, e))?;
            model.load_weights(&state_dir.join("weights.safetensors"))?;
            optimizer.load(&state_dir.join("optimizer.safetensors"), state.step)?;
            state
        } else {
            TrainState::default()
        };
        let (log, _) = Log::open(&dir.join("log.jsonl"), state.step)?;
        Ok(Tracker { name: name.to_string(), dir: dir.to_path_buf(), state, log })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Logs an optimizer step.
    pub fn stepped(&mut self, step: usize, loss: f64, lr: f64, examples_per_s: Option<f64>) -> Result<(), TrainError> {
        self.state.step = step;
        self.log.append(&Entry { step, loss: Some(loss), lr: Some(lr), examples_per_s, ..Default::default() })
    }

    /// Records a dev evaluation of `model` at the current step: a gain saves it as the selected checkpoint with
    /// its dev run; `patience` evaluations without one stop the model; the last step ends it. Returns whether
    /// it gained.
    pub fn evaluated(
        &mut self,
        (value, measures, run): (f64, BTreeMap<String, f64>, TrecRun),
        model: &TrainableEncoder,
        options: &TrainOptions,
    ) -> Result<bool, TrainError> {
        let state = &mut self.state;
        let gain = state.best_dev.is_none_or(|best| value > best);
        if gain {
            model.save(&self.dir.join("model"))?;
            let path = self.dir.join("dev-run.txt");
            let mut text = Vec::new();
            run.write(&mut text).map_err(|e| TrainError::io(&path, e))?;
            std::fs::write(&path, text).map_err(|e| TrainError::io(&path, e))?;
            (state.best_dev, state.best_step, state.evals_without_gain) = (Some(value), Some(state.step), 0);
        } else {
            state.evals_without_gain += 1;
            if options.patience > 0 && state.evals_without_gain >= options.patience {
                (state.done, state.stopped_early) = (true, true);
            }
        }
        state.done |= state.step >= options.steps;
        let entry = Entry { step: state.step, dev: Some(measures), selected: Some(gain), ..Default::default() };
        self.log.append(&entry)?;
        super::plot::write_curves(self.log.path(), &self.dir.join("curves.svg"), &self.name)?;
        Ok(gain)
    }

    /// Saves the weights, optimizer state and progress, replacing the previous checkpoint whole (after the
    /// log that describes them).
    pub fn checkpoint(&mut self, model: &TrainableEncoder, optimizer: &AdamW) -> Result<(), TrainError> {
        self.log.sync()?;
        let staging = self.dir.join("state.partial");
        let _ = std::fs::remove_dir_all(&staging);
        std::fs::create_dir_all(&staging).map_err(|e| TrainError::io(&staging, e))?;
        model.save_weights(&staging.join("weights.safetensors"))?;
        optimizer.save(&staging.join("optimizer.safetensors"))?;
        let path = staging.join("progress.json");
        std::fs::write(&path, serde_json::to_vec_pretty(&self.state).unwrap_or_default())
            .map_err(|e| TrainError::io(&path, e))?;
        crate::model::replace_dir(&staging, &self.dir.join("state"))?;
        crate::hooks::point("train.checkpoint");
        Ok(())
    }

    pub fn report(&self) -> ModelReport {
        ModelReport {
            name: self.name.clone(),
            dir: self.dir.clone(),
            steps: self.state.step,
            best_dev: self.state.best_dev,
            best_step: self.state.best_step,
            stopped_early: self.state.stopped_early,
        }
    }
}

pub struct Learner {
    model: TrainableEncoder,
    optimizer: AdamW,
    selector: Selector,
    tracker: Tracker,
    /// The segments BeST's first iteration trained on, by (qid, docid).
    chosen: HashMap<(String, String), usize>,
}

impl Learner {
    /// A fresh model from the run's initial weights, or the one `dir/state` holds.
    pub fn open(name: &str, dir: &Path, selector: Selector, run: &Run) -> Result<Learner, TrainError> {
        let model = TrainableEncoder::init(run.init, run.device, run.dtype, run.options.seed)?;
        let mut optimizer = AdamW::new(model.variables(), run.options.weight_decay)?;
        let tracker = Tracker::open(name, dir, &model, &mut optimizer)?;
        let chosen = match &selector {
            Selector::Online(_) => read_selections(&dir.join("selections.tsv"))?,
            _ => HashMap::new(),
        };
        Ok(Learner { model, optimizer, selector, tracker, chosen })
    }

    pub fn name(&self) -> &str {
        &self.tracker.name
    }

    pub fn step(&self) -> usize {
        self.tracker.state.step
    }

    pub fn done(&self) -> bool {
        self.tracker.state.done
    }

    pub fn selector(&self) -> &Selector {
        &self.selector
    }

    pub fn model(&self) -> &TrainableEncoder {
        &self.model
    }

    /// One optimizer step on this step's examples (in `accumulate` passes of `batch`); returns the loss.
    pub fn train_step(
        &mut self,
        step: usize,
        examples: &[Example],
        snapshots: &[Option<Scorer>],
        run: &Run,
    ) -> Result<f64, TrainError> {
        let options = run.options;
        let started = std::time::Instant::now();
        let _dropping = super::Dropping::start(&self.model, options, step);
        let vars = self.model.variables();
        let mut sums: Vec<Option<Tensor>> = vec![None; vars.len()];
        let mut loss_total = 0.0;
        for chunk in examples.chunks(options.batch) {
            let texts = {
                let selector = &self.selector;
                let chosen = &mut self.chosen;
                let mut choose = |example: &Example, position: usize, doc: &TrainingDoc| -> Result<usize, TrainError> {
                    let n = doc.segments.len().max(1);
                    let qid = &run.queries[example.query].qid;
                    Ok(match selector {
                        Selector::First => 0,
                        Selector::Random => Rng::stream(example.seed, position as u64).below(n),
                        Selector::Fixed(selections) => selections
                            .get(&(qid.clone(), example.docs[position].clone()))
                            .copied()
                            .unwrap_or(0)
                            .min(n - 1),
                        Selector::Online(j) => {
                            let scorer =
                                snapshots[*j].as_ref().ok_or_else(|| TrainError::Data("no selector model".into()))?;
                            let best = scorer.best_segment(&run.queries[example.query].text, doc)?;
                            chosen.insert((qid.clone(), example.docs[position].clone()), best);
                            best
                        }
                    })
                };
                inputs_of(chunk, &mut choose, run)?
            };
            let encoded: Vec<Encoded> = texts
                .iter()
                .map(|(q, s)| self.model.encode(q, s, options.max_length, options.max_query_tokens))
                .collect::<Result<_, _>>()?;
            let logits = self.model.forward(&encoded)?;
            let per_example = chunk[0].docs.len();
            let scores = logits.reshape((chunk.len(), per_example))?;
            let loss = options.loss.of(&scores)?;
            let weight = chunk.len() as f64 / examples.len() as f64;
            loss_total += loss.to_scalar::<f32>()? as f64 * weight;
            let grads = (loss * weight)?.backward()?;
            for (sum, (name, var)) in sums.iter_mut().zip(&vars) {
                let grad = grads
                    .get(var.as_tensor())
                    .ok_or_else(|| TrainError::Data(format!("variable {name} received no gradient")))?
                    .detach();
                *sum = Some(match sum.take() {
                    Some(s) => (s + grad)?,
                    None => grad,
                });
            }
        }
        let grads: Vec<Tensor> = sums.into_iter().flatten().collect();
        let warmup = (options.warmup * options.steps as f64).round() as usize;
        let lr = learning_rate(options.lr, step, warmup, options.steps);
        self.optimizer.step(&grads, lr)?;
        let rate = examples.len() as f64 / started.elapsed().as_secs_f64();
        self.tracker.stepped(step, loss_total, lr, Some(rate))?;
        Ok(loss_total)
    }

    /// Scores dev; a gain saves the model as the selected one, and `patience` evaluations without one stop it.
    pub fn evaluate(&mut self, run: &Run) -> Result<(), TrainError> {
        run.progress.phase(
            &format!("{}: scoring dev at step {}", self.name(), self.step()),
            run.dev.len() as u64,
            Unit::Items,
        );
        let scorer = Scorer::of(&self.model, run.options)?;
        let evaluation = run.dev.evaluate(&scorer, run.options, run.progress)?;
        self.record(evaluation, run)
    }

    /// The dev score of the weights training starts from (step 0), scored once per run for every learner,
    /// then a checkpoint (so that a resumed run does not score it again).
    pub fn evaluate_initial(&mut self, run: &Run) -> Result<(), TrainError> {
        let evaluation = match run.initial_dev.get() {
            Some(evaluation) => evaluation.clone(),
            None => {
                run.progress.phase("scoring dev with the initial model (step 0)", run.dev.len() as u64, Unit::Items);
                let scorer = Scorer::of(&self.model, run.options)?;
                let evaluation = run.dev.evaluate(&scorer, run.options, run.progress)?;
                run.initial_dev.get_or_init(|| evaluation.clone());
                evaluation
            }
        };
        self.record(evaluation, run)?;
        self.checkpoint()
    }

    fn record(&mut self, evaluation: super::dev::Evaluation, run: &Run) -> Result<(), TrainError> {
        self.tracker.evaluated(evaluation, &self.model, run.options)?;
        let selected = self.tracker.dir().join("model/model.safetensors");
        if self.done() && selected.exists() {
            // A stopped model serves on (as a selector) with its selected weights.
            self.model.load_weights(&selected)?;
        }
        Ok(())
    }

    /// Saves the weights, optimizer state and progress, replacing the previous checkpoint whole.
    pub fn checkpoint(&mut self) -> Result<(), TrainError> {
        if !self.chosen.is_empty() {
            write_selections(&self.tracker.dir().join("selections.tsv"), &self.chosen)?;
        }
        self.tracker.checkpoint(&self.model, &self.optimizer)
    }

    /// Marks the model done once it has taken every step.
    pub fn finish(&mut self) -> Result<(), TrainError> {
        if !self.done() {
            self.tracker.state.done = true;
            self.checkpoint()?;
        }
        Ok(())
    }

    pub fn report(&self) -> ModelReport {
        self.tracker.report()
    }
}

/// `qid<TAB>docid<TAB>segment` lines; a torn last line is ignored.
pub fn read_selections(path: &Path) -> Result<HashMap<(String, String), usize>, TrainError> {
    if !path.exists() {
        return Ok(HashMap::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut cols = line.split('\t');
            let (qid, docid, index) = (cols.next()?, cols.next()?, cols.next()?.parse().ok()?);
            Some(((qid.to_string(), docid.to_string()), index))
        })
        .collect())
}

fn write_selections(path: &Path, selections: &HashMap<(String, String), usize>) -> Result<(), TrainError> {
    let mut lines: Vec<String> = selections.iter().map(|((q, d), i)| format!("{q}\t{d}\t{i}\n")).collect();
    lines.sort();
    let staging = path.with_extension("tsv.partial");
    std::fs::write(&staging, lines.concat()).map_err(|e| TrainError::io(&staging, e))?;
    std::fs::rename(&staging, path).map_err(|e| TrainError::io(path, e))
}
