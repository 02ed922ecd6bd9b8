//! `longrank folds`: seeded k-fold topic splits, or the sizes of an existing split.

use std::path::PathBuf;

use anyhow::bail;
use longrank::eval;

#[derive(clap::Args)]
pub struct FoldsArgs {
    /// Topic file to split (any topic format); either this or --read.
    #[arg(long, conflicts_with = "read", value_name = "FILE")]
    topics: Option<PathBuf>,
    /// Folds.
    #[arg(short, long, default_value_t = 5)]
    k: usize,
    /// Seed of the split.
    #[arg(long, default_value_t = 42)]
    seed: u64,
    /// Where to write the split [default: standard output].
    #[arg(long, value_name = "FILE")]
    out: Option<PathBuf>,
    /// An existing `qid<TAB>fold` file to read and summarize; either this or --topics.
    #[arg(long, value_name = "FILE")]
    read: Option<PathBuf>,
}

pub fn run(args: FoldsArgs) -> anyhow::Result<()> {
    if let Some(path) = args.read {
        let folds = eval::read_folds(&path)?;
        let mut sizes = std::collections::BTreeMap::new();
        for fold in folds.values() {
            *sizes.entry(*fold).or_insert(0usize) += 1;
        }
        for (fold, n) in sizes {
            println!("fold {fold}\t{n} topics");
        }
        return Ok(());
    }
    let Some(topics) = args.topics else { bail!("give --topics FILE to make folds, or --read FILE") };
    let qids: Vec<String> = eval::read_topics(&topics)?.into_iter().map(|t| t.qid).collect();
    let folds = eval::make_folds(&qids, args.k, args.seed);
    let text: String = folds.iter().map(|(q, f)| format!("{q}\t{f}\n")).collect();
    match args.out {
        Some(path) => super::write_file(&path, &text)?,
        None => print!("{text}"),
    }
    Ok(())
}
