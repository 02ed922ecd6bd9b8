//! `longrank train`: its arguments and the terminal progress bar.

use std::path::PathBuf;

use anyhow::Context;
use longrank::config::Config;
use longrank::eval::{self, Qrels, TopicField};
use longrank::model::cobert::CoBertConfig;
use longrank::train::{self, DevMeasure, Loss, Method, TrainData, TrainOptions};

/// Where Co-BERT's heads start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum HeadsInit {
    Random,
    Backbone,
}

#[derive(clap::Args)]
pub struct TrainArgs {
    #[arg(long)]
    collection: Option<String>,
    /// Topics (TREC, TSV or JSON lines).
    #[arg(long)]
    topics: PathBuf,
    #[arg(long)]
    qrels: PathBuf,
    /// `qid<TAB>fold` (from `longrank folds`); with `--dev-fold`, dev comes from that fold and training from
    /// `--train-folds` (default: every other fold).
    #[arg(long)]
    folds: Option<PathBuf>,
    #[arg(long, value_delimiter = ',')]
    train_folds: Vec<usize>,
    #[arg(long)]
    dev_fold: Option<usize>,
    /// Gold passages (passages.bytes.tsv), to report how often the document budget covers them.
    #[arg(long)]
    passages: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t = TopicField::Title)]
    field: TopicField,
    /// The model to start from: a Hugging Face directory or hub id (default: the configured model).
    #[arg(long)]
    init: Option<String>,
    /// The run's directory (resumed when it holds a run with the same options).
    #[arg(long)]
    out: PathBuf,
    #[arg(long, value_enum, default_value_t = Method::Best)]
    method: Method,
    #[arg(long, value_enum, default_value_t = Loss::Hinge)]
    loss: Loss,
    /// Negatives per example with `--loss softmax`.
    #[arg(long, default_value_t = 10)]
    negatives: usize,
    /// BM25 depth negatives come from.
    #[arg(long, default_value_t = 100)]
    candidates: usize,
    #[arg(long, default_value_t = 256)]
    max_length: usize,
    #[arg(long, default_value_t = 64)]
    max_query_tokens: usize,
    /// Leading tokens of each document that training segments come from, or `all`.
    #[arg(long, default_value = "2048")]
    doc_tokens: String,
    /// Cut training segments at the full budget (default: lengths drawn between half and all of it).
    #[arg(long)]
    fixed_lengths: bool,
    /// Do not repeat the title in each segment.
    #[arg(long)]
    no_title: bool,
    /// Optimizer steps per model.
    #[arg(long, default_value_t = 1000)]
    steps: usize,
    /// Examples per forward pass.
    #[arg(long, default_value_t = 8)]
    batch: usize,
    /// Forward passes per optimizer step.
    #[arg(long, default_value_t = 1)]
    accumulate: usize,
    #[arg(long, default_value_t = 2e-5)]
    lr: f64,
    /// Share of the steps spent warming up.
    #[arg(long, default_value_t = 0.1)]
    warmup: f64,
    #[arg(long, default_value_t = 0.01)]
    weight_decay: f64,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value_t = 50)]
    checkpoint_every: usize,
    #[arg(long, default_value_t = 200)]
    eval_every: usize,
    /// Evaluations without a dev gain before a model stops (0: never early).
    #[arg(long, default_value_t = 3)]
    patience: usize,
    #[arg(long, value_enum, default_value_t = DevMeasure::Mrr10)]
    dev_measure: DevMeasure,
    #[arg(long, default_value_t = 100)]
    dev_queries: usize,
    /// Training queries: a seeded sample of this many (default: every training query). Co-BERT runs the
    /// first round over each one's candidates before training, which bounds what a CPU can afford.
    #[arg(long)]
    train_queries: Option<usize>,
    #[arg(long, default_value_t = 5)]
    dev_depth: usize,
    /// BeST iterations at most.
    #[arg(long, default_value_t = 3)]
    iterations: usize,
    /// Co-BERT: first-stage candidates per query (k).
    #[arg(long, default_value_t = 100)]
    cobert_depth: usize,
    /// Co-BERT: prototypes m, group size n, overlap o.
    #[arg(long, default_value_t = 4)]
    prototypes: usize,
    #[arg(long, default_value_t = 60)]
    group: usize,
    #[arg(long, default_value_t = 4)]
    overlap: usize,
    /// Co-BERT ablations: no calibration, no groupwise scorer, calibration without the averaging.
    #[arg(long)]
    no_calibration: bool,
    #[arg(long)]
    no_groupwise: bool,
    #[arg(long)]
    no_average: bool,
    /// Co-BERT's heads drawn from the seed, or their layers copied from the backbone's last ones (the paper's
    /// choice). Random heads did better on dev in each of Medline's five folds of the Co-BERT experiment
    /// (EXPERIMENTS.md).
    #[arg(long, value_enum, default_value_t = HeadsInit::Random)]
    heads: HeadsInit,
    /// Co-BERT: train the backbone with the heads (a GPU's job; else the backbone is frozen and its states
    /// cached).
    #[arg(long)]
    end_to_end: bool,
}

impl TrainArgs {
    fn options(&self, config: &Config) -> anyhow::Result<TrainOptions> {
        let doc_tokens = match self.doc_tokens.as_str() {
            "all" => None,
            n => Some(n.parse().with_context(|| format!("--doc-tokens {n:?}: a number of tokens or `all`"))?),
        };
        Ok(TrainOptions {
            method: self.method,
            loss: self.loss,
            negatives: self.negatives,
            candidates: self.candidates,
            max_length: self.max_length,
            max_query_tokens: self.max_query_tokens,
            doc_tokens,
            random_lengths: !self.fixed_lengths,
            repeat_title: !self.no_title,
            steps: self.steps,
            batch: self.batch,
            accumulate: self.accumulate,
            lr: self.lr,
            warmup: self.warmup,
            weight_decay: self.weight_decay,
            seed: self.seed,
            checkpoint_every: self.checkpoint_every,
            eval_every: self.eval_every,
            patience: self.patience,
            dev_measure: self.dev_measure,
            dev_queries: self.dev_queries,
            train_queries: self.train_queries,
            dev_depth: self.dev_depth,
            iterations: self.iterations,
            train_folds: self.train_folds.clone(),
            dev_fold: self.dev_fold,
            batch_tokens: config.model.max_batch_tokens,
            cobert: (self.method == Method::Cobert).then(|| train::CoBertTraining {
                heads: CoBertConfig {
                    prototypes: self.prototypes,
                    group: self.group,
                    overlap: self.overlap,
                    calibrate: !self.no_calibration,
                    groupwise: !self.no_groupwise,
                    average: !self.no_average,
                    ..CoBertConfig::default()
                },
                depth: self.cobert_depth,
                from_backbone: self.heads == HeadsInit::Backbone,
                end_to_end: self.end_to_end,
            }),
        })
    }
}

pub fn run(args: TrainArgs, config: &Config) -> anyhow::Result<()> {
    let options = args.options(config)?;
    let engine = super::open_engine(config)?;
    let collection = engine.collection(args.collection.as_deref())?;
    let topics = eval::read_topics(&args.topics)?.into_iter().map(|t| (t.qid.clone(), t.query(args.field))).collect();
    let folds = args.folds.as_deref().map(eval::read_folds).transpose()?;
    let passages = args.passages.as_deref().map(eval::passages::read_passages).transpose()?;
    let data = TrainData { collection: &collection, topics, qrels: Qrels::read(&args.qrels)?, folds, passages };
    let source = args.init.as_deref().unwrap_or(&config.model.path);
    anyhow::ensure!(!source.is_empty(), "no model to start from: give --init DIR or configure [model] path");
    let init = longrank::model::resolve(source, config.model.offline)?;
    let device = longrank::model::device(&config.model.device)?;
    let dtype = longrank::model::dtype(&config.model.dtype, &device)?;
    let bar = super::progress_bar(0, "")?;
    bar.set_style(indicatif::ProgressStyle::with_template("{prefix}: {bar:30} {pos}/{len} · {msg} · ETA {eta}")?);
    let bar = Bar(bar);
    let report = train::train(&data, &init, &args.out, &options, &device, dtype, &bar)?;
    bar.0.finish_and_clear();
    println!("{:<10}\t{:>6}\t{:>9}\t{:>9}\tstopped early", "model", "steps", "best dev", "best step");
    for m in &report.models {
        let dev = m.best_dev.map_or("-".into(), |v| format!("{v:.4}"));
        let step = m.best_step.map_or("-".into(), |v| v.to_string());
        println!("{:<10}\t{:>6}\t{dev:>9}\t{step:>9}\t{}", m.name, m.steps, m.stopped_early);
    }
    if let Some(coverage) = report.budget_covers_gold {
        println!("the document budget covers the gold passage for {:.1} % of training pairs", 100.0 * coverage);
    }
    if let Some(selected) = &report.selected {
        println!("selected on dev: {}", args.out.join(selected).join("model").display());
    }
    Ok(())
}

/// The progress bar: `phase` restarts it with a new length and label.
struct Bar(indicatif::ProgressBar);

impl train::Progress for Bar {
    fn phase(&self, name: &str, total: u64) {
        self.0.set_length(total);
        self.0.set_position(0);
        self.0.reset_eta();
        self.0.set_prefix(name.to_string());
        if !self.0.is_hidden() {
            return;
        }
        eprintln!("{name}");
    }

    fn set(&self, done: u64, message: &str) {
        self.0.set_position(done);
        self.0.set_message(message.to_string());
    }
}
