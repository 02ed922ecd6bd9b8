//! The `longrank` binary: parses the command line and hands each subcommand to its module in `cli`.

mod cli;

use clap::{Parser, Subcommand};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "longrank", version, about = "Search and re-ranking server for long documents")]
struct Cli {
    #[command(flatten)]
    global: cli::Global,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API and the web page.
    Serve(cli::serve::ServeArgs),
    /// Index documents into a collection (adds to it, replacing documents with the same docid).
    Index(cli::index::IndexArgs),
    /// List the collections, or delete one (`collections delete NAME`).
    Collections(cli::collections::CollectionsArgs),
    /// Search a collection and print a ranking table.
    Search(cli::search::SearchArgs),
    /// Run every topic of a topic file through a pipeline and write a TREC run (metrics when qrels are given).
    Batch(cli::batch::BatchArgs),
    /// Compute a bi-encoder's segment embeddings for a whole collection ahead of queries (resumable: what is
    /// stored already is skipped).
    Embed(cli::embed::EmbedArgs),
    /// Segment selection against gold passages: how often the model's best segment of the document holding
    /// a question's gold passage overlaps it (P@1), against the first segment and a random one.
    EvalSegments(cli::eval_segments::EvalSegmentsArgs),
    /// Evaluate a run against qrels, printing trec_eval's three columns.
    Eval(cli::eval::EvalArgs),
    /// Compare two runs: per measure the means, delta, paired t-test p-value and wins/ties/losses.
    Compare(cli::compare::CompareArgs),
    /// Make seeded k-fold topic splits (`qid<TAB>fold`), or print an existing split's sizes.
    Folds(cli::folds::FoldsArgs),
    /// Fine-tune a cross-encoder on a collection's judged queries: FirstP, all segments, BeST, or Co-BERT.
    Train(Box<cli::train::TrainArgs>),
    /// Benchmarks (not tests): search latency in process and over HTTP, cross-encoder throughput.
    Bench {
        #[command(subcommand)]
        what: cli::bench::BenchCommand,
    },
}

/// A failure is one line, `error: ` and the causes joined (never a backtrace, whatever `RUST_BACKTRACE` says:
/// these are the user's errors, a file or a value to fix), and exit status 1.
fn main() -> std::process::ExitCode {
    cli::init_process();
    match run(Cli::parse()) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// An error and its causes joined by `: `, a cause left out when what comes before already says it (an error
/// that quotes its source, as `path: {source}` does, would otherwise print it twice).
fn one_line(error: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in error.chain().map(|c| c.to_string()) {
        if line.contains(&cause) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&cause);
    }
    line
}

fn run(Cli { global: before, command }: Cli) -> anyhow::Result<()> {
    // The configuration with a subcommand's flags, those given before the subcommand filling in.
    let setup = |flags: &cli::Global| flags.clone().or(&before).config();
    match command {
        Command::Serve(args) => {
            let (config, _) = setup(&args.global)?;
            cli::serve::run(args, config)
        }
        Command::Index(args) => {
            let (config, _) = setup(&args.global)?;
            cli::index::run(args, config)
        }
        Command::Collections(args) => {
            let (config, _) = setup(&args.global)?;
            cli::collections::run(args, &config)
        }
        Command::Search(args) => {
            let (config, model) = setup(&args.global)?;
            cli::search::run(args, model, &config)
        }
        Command::Batch(args) => {
            let (config, model) = setup(&args.global)?;
            cli::batch::run(args, model, config)
        }
        Command::Embed(args) => {
            let (config, _) = setup(&args.global)?;
            cli::embed::run(args, &config)
        }
        Command::EvalSegments(args) => {
            let (config, _) = setup(&args.global)?;
            cli::eval_segments::run(args, &config)
        }
        Command::Eval(args) => cli::eval::run(args),
        Command::Compare(args) => cli::compare::run(args),
        Command::Folds(args) => cli::folds::run(args),
        Command::Train(args) => {
            let (config, _) = setup(&args.global)?;
            cli::train::run(*args, &config)
        }
        Command::Bench { what } => cli::bench::run(what, &before),
    }
}
