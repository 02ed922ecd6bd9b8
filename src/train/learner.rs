//! One model in training: its variables and optimizer, the segments it trains on, dev evaluations with
//! early stopping and model selection, checkpoints to resume from, and its log and curves.

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::data::{Example, TrainingDoc};
use super::optim::{learning_rate, AdamW};
use super::{inputs_of, Loss, ModelReport, Run, TrainError};
use crate::model::{CrossEncoder, Encoded, TrainableCrossEncoder};
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
pub(super) struct Progress {
    pub step: usize,
    pub best_dev: Option<f64>,
    pub best_step: Option<usize>,
    pub evals_without_gain: usize,
    pub done: bool,
    pub stopped_early: bool,
}

pub struct Learner {
    name: String,
    dir: PathBuf,
    model: TrainableCrossEncoder,
    optimizer: AdamW,
    selector: Selector,
    progress: Progress,
    /// The segments BeST's first iteration trained on, by (qid, docid).
    chosen: HashMap<(String, String), usize>,
    log: std::fs::File,
    losses: Vec<f64>,
}

impl Learner {
    /// A fresh model from the run's initial weights, or the one `dir/state` holds.
    pub fn open(name: &str, dir: &Path, selector: Selector, run: &Run) -> Result<Learner, TrainError> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        let model = TrainableCrossEncoder::init(run.init, run.device, run.dtype, run.options.seed)?;
        let mut optimizer = AdamW::new(model.variables(), run.options.weight_decay)?;
        let state = dir.join("state");
        let progress: Progress = if state.join("progress.json").exists() {
            let path = state.join("progress.json");
            let progress: Progress =
                serde_json::from_slice(&std::fs::read(&path).map_err(|e| TrainError::io(&path, e))?)
                    .map_err(|e| TrainError::io(&path, e))?;
            model.load_weights(&state.join("weights.safetensors"))?;
            optimizer.load(&state.join("optimizer.safetensors"), progress.step)?;
            progress
        } else {
            Progress::default()
        };
        let log_path = dir.join("log.jsonl");
        let kept = truncate_log(&log_path, progress.step)?;
        let chosen = match &selector {
            Selector::Online(_) => read_selections(&dir.join("selections.tsv"))?,
            _ => HashMap::new(),
        };
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .map_err(|e| TrainError::io(&log_path, e))?;
        let losses = kept.iter().filter_map(|e| e.get("loss").and_then(|l| l.as_f64())).collect();
        Ok(Learner {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            model,
            optimizer,
            selector,
            progress,
            chosen,
            log,
            losses,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn step(&self) -> usize {
        self.progress.step
    }

    pub fn done(&self) -> bool {
        self.progress.done
    }

    pub fn selector(&self) -> &Selector {
        &self.selector
    }

    pub fn model(&self) -> &TrainableCrossEncoder {
        &self.model
    }

    /// One optimizer step on this step's examples (in `accumulate` passes of `batch`); returns the loss.
    pub fn train_step(
        &mut self,
        step: usize,
        examples: &[Example],
        snapshots: &[Option<CrossEncoder>],
        run: &Run,
    ) -> Result<f64, TrainError> {
        let options = run.options;
        let started = std::time::Instant::now();
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
                            let best = best_segment(scorer, &run.queries[example.query].text, doc, options)?;
                            chosen.insert((qid.clone(), example.docs[position].clone()), best);
                            best
                        }
                    })
                };
                inputs_of(chunk, &mut choose, run, &self.model)?
            };
            let encoded: Vec<Encoded> = texts
                .iter()
                .map(|(q, s)| self.model.encode(q, s, options.max_length, options.max_query_tokens))
                .collect::<Result<_, _>>()?;
            let logits = self.model.forward(&encoded)?;
            let per_example = chunk[0].docs.len();
            let scores = logits.reshape((chunk.len(), per_example))?;
            let loss = match options.loss {
                Loss::Hinge => {
                    let margin = (scores.narrow(1, 1, 1)? - scores.narrow(1, 0, 1)?)? + 1.0;
                    margin?.relu()?.mean_all()?
                }
                Loss::Softmax => {
                    let log_probs = candle_nn::ops::log_softmax(&scores, 1)?;
                    (log_probs.narrow(1, 0, 1)?.mean_all()? * -1.0)?
                }
            };
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
        self.progress.step = step;
        self.losses.push(loss_total);
        let rate = examples.len() as f64 / started.elapsed().as_secs_f64();
        self.write_log(serde_json::json!({
            "step": step, "loss": loss_total, "lr": lr, "examples_per_s": rate,
        }))?;
        Ok(loss_total)
    }

    /// Scores dev; a gain saves the model as the selected one, and `patience` evaluations without one stop it.
    pub fn evaluate(&mut self, run: &Run) -> Result<(), TrainError> {
        run.progress.set(self.progress.step as u64, &format!("{}: scoring dev", self.name));
        let scorer = self.model.snapshot()?;
        let (value, measures, dev_run) = run.dev.evaluate(&scorer, run.options)?;
        let gain = self.progress.best_dev.is_none_or(|best| value > best);
        if gain {
            self.model.save(&self.dir.join("model"))?;
            let path = self.dir.join("dev-run.txt");
            let mut text = Vec::new();
            dev_run.write(&mut text).map_err(|e| TrainError::io(&path, e))?;
            std::fs::write(&path, text).map_err(|e| TrainError::io(&path, e))?;
            self.progress.best_dev = Some(value);
            self.progress.best_step = Some(self.progress.step);
            self.progress.evals_without_gain = 0;
        } else {
            self.progress.evals_without_gain += 1;
            if run.options.patience > 0 && self.progress.evals_without_gain >= run.options.patience {
                self.progress.done = true;
                self.progress.stopped_early = true;
            }
        }
        if self.progress.step >= run.options.steps {
            self.progress.done = true;
        }
        if self.progress.done && self.dir.join("model/model.safetensors").exists() {
            // A stopped model serves on (as a selector) with its selected weights.
            self.model.load_weights(&self.dir.join("model/model.safetensors"))?;
        }
        self.write_log(serde_json::json!({
            "step": self.progress.step, "dev": measures, "selected": gain,
        }))?;
        super::plot::write_curves(&self.dir.join("log.jsonl"), &self.dir.join("curves.svg"), &self.name)
    }

    /// Saves the weights, optimizer state and progress, replacing the previous checkpoint whole.
    pub fn checkpoint(&mut self) -> Result<(), TrainError> {
        if !self.chosen.is_empty() {
            write_selections(&self.dir.join("selections.tsv"), &self.chosen)?;
        }
        self.log.sync_data().map_err(|e| TrainError::io(&self.dir.join("log.jsonl"), e))?;
        save_state(&self.dir, &self.model, &self.optimizer, &self.progress)
    }

    /// Marks the model done once it has taken every step.
    pub fn finish(&mut self) -> Result<(), TrainError> {
        if !self.progress.done {
            self.progress.done = true;
            self.checkpoint()?;
        }
        Ok(())
    }

    pub fn report(&self) -> ModelReport {
        ModelReport {
            name: self.name.clone(),
            dir: self.dir.clone(),
            steps: self.progress.step,
            best_dev: self.progress.best_dev,
            best_step: self.progress.best_step,
            stopped_early: self.progress.stopped_early,
        }
    }

    fn write_log(&mut self, entry: serde_json::Value) -> Result<(), TrainError> {
        writeln!(self.log, "{entry}").map_err(|e| TrainError::io(&self.dir.join("log.jsonl"), e))
    }
}

/// The index of the document's training segment that `scorer` scores highest for the query (the first of
/// equals).
pub fn best_segment(
    scorer: &CrossEncoder,
    query: &str,
    doc: &TrainingDoc,
    options: &super::TrainOptions,
) -> Result<usize, TrainError> {
    let encoded: Vec<Encoded> = (0..doc.segments.len())
        .map(|i| scorer.encode(query, &doc.input(i), options.max_length, options.max_query_tokens))
        .collect::<Result<_, _>>()?;
    let scores = super::dev::score_batched(scorer, &encoded, options.batch_tokens)?;
    Ok(scores.iter().enumerate().fold(0, |best, (i, s)| if *s > scores[best] { i } else { best }))
}

/// Writes `dir/state` (weights, optimizer state, progress), replacing the previous one whole.
pub(super) fn save_state(
    dir: &Path,
    model: &TrainableCrossEncoder,
    optimizer: &AdamW,
    progress: &Progress,
) -> Result<(), TrainError> {
    let staging = dir.join("state.partial");
    let _ = std::fs::remove_dir_all(&staging);
    std::fs::create_dir_all(&staging).map_err(|e| TrainError::io(&staging, e))?;
    model.save_weights(&staging.join("weights.safetensors"))?;
    optimizer.save(&staging.join("optimizer.safetensors"))?;
    let path = staging.join("progress.json");
    std::fs::write(&path, serde_json::to_vec_pretty(progress).unwrap_or_default())
        .map_err(|e| TrainError::io(&path, e))?;
    crate::model::replace_dir(&staging, &dir.join("state"))?;
    Ok(())
}

/// Keeps the log's entries up to `step` (a resumed run redoes what came after its checkpoint).
pub(super) fn truncate_log(path: &Path, step: usize) -> Result<Vec<serde_json::Value>, TrainError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let text = std::fs::read_to_string(path).map_err(|e| TrainError::io(path, e))?;
    let kept: Vec<serde_json::Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|e| e.get("step").and_then(|s| s.as_u64()).is_some_and(|s| s as usize <= step))
        .collect();
    let body: String = kept.iter().map(|e| format!("{e}\n")).collect();
    std::fs::write(path, body).map_err(|e| TrainError::io(path, e))?;
    Ok(kept)
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
