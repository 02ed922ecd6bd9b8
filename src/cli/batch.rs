//! `longrank batch`: every topic of a topic file through a pipeline, as a TREC run, with trec_eval's metrics
//! when qrels are given. The run resumes after an interruption (finished topics kept in `OUT.partial`), and
//! `OUT.provenance.json` records how it was made, as an HTTP job's provenance does.

use std::path::PathBuf;

use longrank::config::Config;
use longrank::eval::{self, EvalOptions, Measure, Qrels};
use longrank::model::Cancel;
use longrank::rank::BatchParams;

use super::progress::Bar;

#[derive(clap::Args)]
pub struct BatchArgs {
    #[command(flatten)]
    pub global: super::Global,
    #[command(flatten)]
    params: BatchParams,
    /// Topic file: TREC `<top>`, web-track XML or `qid<TAB>text`.
    #[arg(long, value_name = "FILE")]
    topics: PathBuf,
    /// TREC qrels (`qid 0 docid grade`): metrics are printed when given [default: none, no metrics].
    #[arg(long, value_name = "FILE")]
    qrels: Option<PathBuf>,
    /// A TREC run whose candidates a re-ranking pipeline re-ranks instead of BM25's (an Anserini run, say)
    /// [default: none, the first stage's candidates].
    #[arg(long, value_name = "FILE")]
    rerank: Option<PathBuf>,
    /// Measures printed when qrels are given (trec_eval syntax) [default: trec_eval's default set].
    #[arg(short = 'm', long = "measure")]
    measures: Vec<String>,
    /// Keep the cross-encoder's (query, segment) outputs in the collection's `scores/` directory and read
    /// them from there (`model.store_scores` in configuration): runs with the same weights score each pair once.
    #[arg(long)]
    store_scores: bool,
    /// The run file to write.
    #[arg(long, value_name = "FILE")]
    out: PathBuf,
}

/// `model`: the configured model `--model` names, if it names one.
pub fn run(mut args: BatchArgs, model: Option<String>, mut config: Config) -> anyhow::Result<()> {
    args.params.params.model = model;
    config.model.store_scores |= args.store_scores;
    let engine = super::open_engine(&config)?;
    let measures = Measure::parse_all(&args.measures)?;
    let qrels = args.qrels.as_deref().map(Qrels::read).transpose()?;
    let rerank = args.rerank.as_deref().map(super::read_run).transpose()?;
    let plan = engine.plan_batch(&args.params, eval::read_topics(&args.topics)?, rerank)?;
    let out = &args.out;
    let provenance = serde_json::to_string_pretty(&plan.provenance(&engine, &config.recorded()))?;
    super::write_file(&provenance_path(out), &(provenance + "\n"))?;
    // An interrupted batch run again with the same command keeps its finished topics.
    let mut partial = eval::PartialRun::open(out, &plan.tag)?;
    if !partial.run().topics.is_empty() {
        eprintln!("resuming: {} topics done", partial.run().topics.len());
    }
    let remaining: Vec<_> = plan.topics.iter().filter(|t| !partial.run().topics.contains_key(&t.qid)).collect();
    let bar = Bar::counting(plan.topics.len() as u64, "topics");
    longrank::progress::Progress::set(&bar, (plan.topics.len() - remaining.len()) as u64, "");
    let (mut flops, mut pairs, mut segments, ran) = (None, 0, 0, remaining.len());
    for topic in remaining {
        let ranked = plan.run_topic(&engine, topic, &Cancel::default())?;
        flops = ranked.flops.map(|f| f + flops.unwrap_or(0.0)).or(flops);
        (pairs, segments) = (pairs + ranked.pairs, segments + ranked.segments);
        partial.push(&topic.qid, ranked.scored)?;
        bar.inc();
    }
    bar.finish();
    // Over the topics run by this invocation (a resumed batch's earlier ones are not counted).
    if let Some(flops) = flops {
        eprintln!("model FLOPs: {:.4e} per topic ({flops:.4e} in all)", flops / ran as f64);
    }
    if segments > 0 {
        let per_topic = |n: usize| n as f64 / ran as f64;
        eprintln!("model pairs: {:.1} per topic, of {:.1} segments seen", per_topic(pairs), per_topic(segments));
    }
    let order: Vec<&str> = plan.topics.iter().map(|t| t.qid.as_str()).collect();
    let (run, text) = partial.finish(out, &order)?;
    eprintln!("wrote {} topics to {}", run.topics.len(), out.display());
    for warning in run.batch_warnings(&order, qrels.as_ref()).list() {
        eprintln!("warning: {}", warning.message);
    }
    if let Some(qrels) = qrels {
        let served = eval::Run::parse(&String::from_utf8_lossy(&text), out)?;
        let evaluation = eval::evaluate(&served, &qrels, &measures, EvalOptions::default());
        print!("{}", evaluation.to_trec_eval(false, &run.tag));
    }
    Ok(())
}

/// Where a run's provenance goes: beside it, `OUT.provenance.json`.
fn provenance_path(out: &std::path::Path) -> PathBuf {
    let mut name = out.as_os_str().to_owned();
    name.push(".provenance.json");
    PathBuf::from(name)
}
