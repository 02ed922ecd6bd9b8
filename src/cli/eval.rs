//! `longrank eval`: trec_eval's three columns for a run against qrels.

use std::path::PathBuf;

use longrank::eval::{self, EvalOptions, Measure, Qrels};

/// trec_eval's options, shared with `compare`.
#[derive(clap::Args)]
pub struct EvalOptionArgs {
    /// Average over every qrels topic, counting topics the run lacks as empty (trec_eval -c).
    #[arg(short = 'c')]
    complete: bool,
    /// Lowest grade that counts as relevant (TREC DL uses 2).
    #[arg(short = 'l', default_value_t = 1)]
    relevance_level: i32,
    /// Evaluate only the first N documents of each topic (trec_eval -M) [default: every document].
    #[arg(short = 'M')]
    max_docs: Option<usize>,
}

impl EvalOptionArgs {
    pub fn options(&self) -> EvalOptions {
        EvalOptions { relevance_level: self.relevance_level, max_docs: self.max_docs, complete: self.complete }
    }
}

#[derive(clap::Args)]
pub struct EvalArgs {
    /// Measures in trec_eval's syntax (`-m map -m P.5,10 -m ndcg_cut.10`, `official`, `all_trec`)
    /// [default: trec_eval's default set].
    #[arg(short = 'm', long = "measure")]
    measures: Vec<String>,
    #[command(flatten)]
    options: EvalOptionArgs,
    /// Print every topic, not only `all`.
    #[arg(short = 'q')]
    per_topic: bool,
    /// The run (TREC format).
    run: PathBuf,
    /// The qrels (TREC format).
    qrels: PathBuf,
}

pub fn run(args: EvalArgs) -> anyhow::Result<()> {
    let measures = Measure::parse_all(&args.measures)?;
    let run = super::read_run(&args.run)?;
    let evaluation = eval::evaluate(&run, &Qrels::read(&args.qrels)?, &measures, args.options.options());
    print!("{}", evaluation.to_trec_eval(args.per_topic, &run.tag));
    Ok(())
}
