//! `longrank train`: its files and the run's options (`train::TrainOptions`, whose fields are the flags).

use std::path::PathBuf;

use longrank::config::Config;
use longrank::eval::{self, Qrels, TopicField};
use longrank::preselect::Preselect;
use longrank::rank::{RankParams, Usage};
use longrank::train::{self, CoBertTraining, Method, TrainData, TrainOptions};

use super::progress::Bar;

#[derive(clap::Args)]
pub struct TrainArgs {
    #[command(flatten)]
    pub global: super::Global,
    /// The collection [default: the only one, or `default_collection`].
    #[arg(long)]
    collection: Option<String>,
    /// Topics (TREC, TSV or JSON lines).
    #[arg(long, value_name = "FILE")]
    topics: PathBuf,
    /// Judgments (TREC qrels).
    #[arg(long, value_name = "FILE")]
    qrels: PathBuf,
    /// `qid<TAB>fold` (from `longrank folds`); with `--dev-fold`, dev comes from that fold and training from
    /// `--train-folds` [default: none, a seeded sample of the topics is dev].
    #[arg(long, value_name = "FILE")]
    folds: Option<PathBuf>,
    /// Gold passages (passages.bytes.tsv), to report how often the document budget covers them [default:
    /// none, no report].
    #[arg(long, value_name = "FILE")]
    passages: Option<PathBuf>,
    /// Topic field used as the query.
    #[arg(long, value_enum, default_value_t = TopicField::Title)]
    field: TopicField,
    /// The model to start from: a Hugging Face directory or hub id [default: `model.path` of the
    /// configuration].
    #[arg(long)]
    init: Option<String>,
    /// The run's directory (resumed when it holds a run with the same options).
    #[arg(long, value_name = "DIR")]
    out: PathBuf,
    /// The served model whose segment scores a selector learns (`--method selector`): a name from the
    /// configuration [default: the default model].
    #[arg(long, value_name = "NAME")]
    teacher: Option<String>,
    #[command(flatten)]
    options: TrainOptions,
    #[command(flatten)]
    cobert: CoBertTraining,
}

pub fn run(args: TrainArgs, config: &Config) -> anyhow::Result<()> {
    super::memory::keep_freed_memory();
    let mut options = args.options;
    options.batch_tokens = config.model.max_batch_tokens;
    options.bm25 = config.bm25;
    options.cobert = (options.method == Method::Cobert).then_some(args.cobert);
    let engine = super::open_engine(config)?;
    let collection = engine.collection(args.collection.as_deref())?;
    let topics = eval::read_topics(&args.topics)?.into_iter().map(|t| (t.qid.clone(), t.query(args.field))).collect();
    let folds = args.folds.as_deref().map(eval::read_folds).transpose()?;
    let passages = args.passages.as_deref().map(eval::passages::read_passages).transpose()?;
    let snapshot = collection.snapshot();
    // A selector's teacher reads every segment, as full MaxP does.
    let teacher = (options.method == Method::Selector)
        .then(|| {
            let params = RankParams {
                pipeline: Some("maxp".into()),
                model: args.teacher,
                preselect: Some(Preselect::default()),
                ..Default::default()
            };
            let teacher_options = engine.options(&params, Usage::Search)?;
            Ok::<_, anyhow::Error>(move |query: &str, docid: &str| {
                engine
                    .segment_scores(&snapshot, query, docid, &teacher_options)
                    .map_err(|e| train::TrainError::Data(format!("the teacher on {docid}: {e}")))
            })
        })
        .transpose()?;
    let data = TrainData {
        collection: &collection,
        topics,
        qrels: Qrels::read(&args.qrels)?,
        folds,
        passages,
        teacher: teacher.as_ref().map(|t| t as &train::Teacher),
    };
    let source = args.init.as_deref().unwrap_or(&config.model.path);
    anyhow::ensure!(!source.is_empty(), "no model to start from: give --init DIR or configure [model] path");
    let init = longrank::model::resolve(source, config.model.offline)?;
    let device = longrank::model::device(&config.model.device)?;
    let dtype = longrank::model::dtype(&config.model.dtype, &device)?;
    let bar = Bar::new();
    let report = train::train(&data, &init, &args.out, &options, &device, dtype, &bar)?;
    bar.finish();
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
