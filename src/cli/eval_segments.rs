//! `longrank eval-segments`: how often the model's best segment of a question's gold document overlaps its
//! gold passage (P@1), against the first segment and a random one.

use std::path::PathBuf;

use longrank::config::Config;
use longrank::eval::{self, TopicField};
use longrank::preselect::Preselect;
use longrank::rank::{RankParams, Usage};

use super::progress::Bar;

#[derive(clap::Args)]
pub struct EvalSegmentsArgs {
    #[command(flatten)]
    pub global: super::Global,
    /// The collection [default: the only one, or `default_collection`].
    #[arg(long)]
    collection: Option<String>,
    /// Topic file (any topic format).
    #[arg(long, value_name = "FILE")]
    topics: PathBuf,
    /// Gold passages, `qid<TAB>docid<TAB>start<TAB>end` in UTF-8 byte offsets (passages.bytes.tsv).
    #[arg(long, value_name = "FILE")]
    passages: PathBuf,
    /// Topic field used as the query.
    #[arg(long, value_enum, default_value_t = TopicField::Title)]
    field: TopicField,
    /// The model, by configured name [default: the default model].
    #[arg(long = "name")]
    name: Option<String>,
    /// Which segments the model reads, as JSON (`'{"selector": "bm25", "per_doc": 1}'`): P@1 is then of the
    /// model's best among them, and `best_recall` says how often they include the best of every segment
    /// [default: none, every segment].
    #[arg(long, value_parser = longrank::rank::json_arg::<Preselect>, value_name = "JSON")]
    preselect: Option<Preselect>,
}

pub fn run(args: EvalSegmentsArgs, config: &Config) -> anyhow::Result<()> {
    let engine = super::open_engine(config)?;
    let collection = engine.collection(args.collection.as_deref())?;
    let topics = eval::read_topics(&args.topics)?;
    let passages = eval::passages::read_passages(&args.passages)?;
    let params = RankParams {
        pipeline: Some("maxp".into()),
        model: args.name,
        preselect: Some(args.preselect.unwrap_or_default()),
        ..Default::default()
    };
    let options = engine.options(&params, Usage::Search)?;
    let preselected = options.rerank.as_ref().is_some_and(|r| r.preselect.active());
    let bar = Bar::counting(topics.len() as u64, "topics");
    let stats = engine.evaluate_selection(&collection.snapshot(), &topics, args.field, &passages, &options, &bar)?;
    bar.finish();
    println!("questions\t{}", stats.questions);
    println!("segments_per_document\t{:.2}", stats.segments as f64 / stats.questions.max(1) as f64);
    println!("p1_model\t{:.4}", stats.precision(stats.selected_hits as f64));
    println!("p1_first\t{:.4}", stats.precision(stats.first_hits as f64));
    println!("p1_random\t{:.4}", stats.precision(stats.random_hits));
    if preselected {
        println!("best_recall\t{:.4}", stats.precision(stats.best_recalled as f64));
    }
    Ok(())
}
