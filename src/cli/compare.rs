//! `longrank compare`: two runs side by side, per measure.

use std::path::PathBuf;

use longrank::eval::{self, Measure, Qrels};

use super::eval::EvalOptionArgs;

#[derive(clap::Args)]
pub struct CompareArgs {
    /// Measures in trec_eval's syntax [default: trec_eval's default set].
    #[arg(short = 'm', long = "measure")]
    measures: Vec<String>,
    #[command(flatten)]
    options: EvalOptionArgs,
    /// The baseline run (A).
    run_a: PathBuf,
    /// The run compared with it (B).
    run_b: PathBuf,
    /// The qrels judging both.
    qrels: PathBuf,
}

pub fn run(args: CompareArgs) -> anyhow::Result<()> {
    let measures = Measure::parse_all(&args.measures)?;
    let qrels = Qrels::read(&args.qrels)?;
    let a = eval::evaluate(&super::read_run(&args.run_a)?, &qrels, &measures, args.options.options());
    let b = eval::evaluate(&super::read_run(&args.run_b)?, &qrels, &measures, args.options.options());
    println!(
        "{:<22}  {:>6}  {:>8}  {:>8}  {:>8}  {:>8}  {:>11}",
        "measure", "topics", "A", "B", "B-A", "p", "win/tie/loss"
    );
    for c in eval::compare(&a, &b) {
        let p = match c.p_value {
            None => "-".to_string(),
            Some(p) if p < 1e-4 => "<0.0001".to_string(),
            Some(p) => format!("{p:.4}"),
        };
        let wtl = format!("{}/{}/{}", c.wins, c.ties, c.losses);
        println!(
            "{:<22}  {:>6}  {:>8.4}  {:>8.4}  {:>+8.4}  {:>8}  {:>11}",
            c.measure, c.topics, c.mean_a, c.mean_b, c.delta, p, wtl
        );
    }
    Ok(())
}
