//! The `longrank` command line: serve, index, search.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

mod bench;
mod train_cli;

use longrank::config::Config;
use longrank::corpus::{Corpus, Format, DEMO_JSONL};
use longrank::eval::{self, EvalOptions, Measure, Qrels, TopicField};
use longrank::index::{self, Catalog, OnError};
use longrank::model::Cancel;
use longrank::rank::batch::DEFAULT_BATCH_K;
use longrank::rank::{BatchParams, Engine, RankParams, SearchRequest};
use longrank::server::{self, AppState};
use longrank::store::Store;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[derive(Parser)]
#[command(name = "longrank", version, about = "Search and re-ranking server for long documents")]
struct Cli {
    /// Configuration file (default: ./config.toml when present).
    #[arg(long, global = true, env = "LONGRANK_CONFIG")]
    config: Option<PathBuf>,
    /// Data directory (overrides `data_dir`).
    #[arg(long, global = true)]
    data_dir: Option<PathBuf>,
    /// The default re-ranking model: a Hugging Face directory or hub id (overrides `model.path`; "" for none).
    #[arg(long, global = true)]
    model: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve the HTTP API and the web page.
    Serve {
        /// Address to listen on (overrides `server.addr`).
        #[arg(long)]
        addr: Option<String>,
    },
    /// Index documents into a collection (adds to it, replacing documents with the same docid).
    Index {
        #[arg(long)]
        collection: String,
        #[arg(long, value_enum, default_value_t = Format::Auto)]
        format: Format,
        /// What to do with a malformed document (overrides `index.on_error`).
        #[arg(long, value_enum)]
        on_error: Option<OnError>,
        /// Rebuild the collection from scratch (the old index serves until the new one is complete).
        #[arg(long)]
        replace: bool,
        /// Files or directories (walked recursively); `.gz` is read transparently.
        #[arg(required = true)]
        paths: Vec<PathBuf>,
    },
    /// Search a collection and print a ranking table.
    Search {
        #[arg(long)]
        collection: Option<String>,
        #[arg(short, long)]
        k: Option<i64>,
        #[arg(long)]
        pipeline: Option<String>,
        /// First-stage candidates the re-ranking pipelines re-score.
        #[arg(long)]
        depth: Option<i64>,
        /// Weight (0 to 1) of the min-max normalized first-stage score mixed into the re-ranked score.
        #[arg(long)]
        interpolate: Option<f32>,
        /// Print the response as JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(required = true)]
        query: Vec<String>,
    },
    /// Run every topic of a topic file through a pipeline and write a TREC run (metrics when qrels are given).
    Batch {
        #[arg(long)]
        collection: Option<String>,
        /// Topic file: TREC `<top>`, web-track XML or `qid<TAB>text`.
        #[arg(long)]
        topics: PathBuf,
        #[arg(long)]
        qrels: Option<PathBuf>,
        #[arg(long, value_enum, default_value_t = TopicField::Title)]
        field: TopicField,
        #[arg(long)]
        pipeline: Option<String>,
        #[arg(short, long, default_value_t = DEFAULT_BATCH_K)]
        k: i64,
        #[arg(long)]
        depth: Option<i64>,
        /// Weight (0 to 1) of the min-max normalized first-stage score mixed into the re-ranked score.
        #[arg(long)]
        interpolate: Option<f32>,
        /// Run tag (default `longrank-PIPELINE`).
        #[arg(long)]
        tag: Option<String>,
        /// Re-rank the candidates of this TREC run (an Anserini run, say) instead of BM25's.
        #[arg(long)]
        rerank: Option<PathBuf>,
        /// Measures printed when qrels are given (trec_eval syntax; default: trec_eval's default set).
        #[arg(short = 'm', long = "measure")]
        measures: Vec<String>,
        /// Keep the cross-encoder's (query, segment) outputs in the collection's `scores/` directory and read
        /// them from there (`store_scores` in configuration): runs with the same weights score each pair once.
        #[arg(long)]
        store_scores: bool,
        #[arg(long)]
        out: PathBuf,
    },
    /// Compute a bi-encoder's segment embeddings for a whole collection ahead of queries (resumable: what is
    /// stored already is skipped).
    Embed {
        #[arg(long)]
        collection: Option<String>,
        /// A model name from the configuration (default: the default model).
        #[arg(long = "name")]
        name: Option<String>,
    },
    /// Segment selection against gold passages: how often the model's best segment of the document holding
    /// a question's gold passage overlaps it (P@1), against the first segment and a random one.
    EvalSegments {
        #[arg(long)]
        collection: Option<String>,
        #[arg(long)]
        topics: PathBuf,
        /// Gold passages, `qid<TAB>docid<TAB>start<TAB>end` in UTF-8 byte offsets (passages.bytes.tsv).
        #[arg(long)]
        passages: PathBuf,
        #[arg(long, value_enum, default_value_t = TopicField::Title)]
        field: TopicField,
        /// The model, by configured name (default: the default model).
        #[arg(long = "name")]
        name: Option<String>,
    },
    /// Evaluate a run against qrels, printing trec_eval's three columns.
    Eval {
        /// Measures in trec_eval's syntax (`-m map -m P.5,10 -m ndcg_cut.10`, `official`, `all_trec`).
        #[arg(short = 'm', long = "measure")]
        measures: Vec<String>,
        #[command(flatten)]
        options: EvalArgs,
        /// Print every topic, not only `all`.
        #[arg(short = 'q')]
        per_topic: bool,
        run: PathBuf,
        qrels: PathBuf,
    },
    /// Compare two runs: per measure the means, delta, paired t-test p-value and wins/ties/losses.
    Compare {
        #[arg(short = 'm', long = "measure")]
        measures: Vec<String>,
        #[command(flatten)]
        options: EvalArgs,
        run_a: PathBuf,
        run_b: PathBuf,
        qrels: PathBuf,
    },
    /// Make seeded k-fold topic splits (`qid<TAB>fold`), or print an existing split's sizes.
    Folds {
        /// Topic file to split (any topic format).
        #[arg(long, conflicts_with = "read")]
        topics: Option<PathBuf>,
        #[arg(short, long, default_value_t = 5)]
        k: usize,
        #[arg(long, default_value_t = 42)]
        seed: u64,
        /// Where to write the split (default: standard output).
        #[arg(long)]
        out: Option<PathBuf>,
        /// An existing `qid<TAB>fold` file to read and summarize.
        #[arg(long)]
        read: Option<PathBuf>,
    },
    /// Fine-tune a cross-encoder on a collection's judged queries: FirstP, all segments, or BeST.
    Train(Box<train_cli::TrainArgs>),
    /// Benchmarks (not tests): search latency in process and over HTTP, cross-encoder throughput.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
}

/// trec_eval's options.
#[derive(clap::Args)]
struct EvalArgs {
    /// Average over every qrels topic, counting topics the run lacks as empty.
    #[arg(short = 'c')]
    complete: bool,
    /// Lowest grade that counts as relevant (TREC DL uses 2).
    #[arg(short = 'l', default_value_t = 1)]
    relevance_level: i32,
    /// Evaluate only the first N documents of each topic.
    #[arg(short = 'M')]
    max_docs: Option<usize>,
}

impl EvalArgs {
    fn options(&self) -> EvalOptions {
        EvalOptions { relevance_level: self.relevance_level, max_docs: self.max_docs, complete: self.complete }
    }
}

#[derive(Subcommand)]
enum BenchCommand {
    /// Query latency p50/p99 and queries/s: in process on one thread, then `/search` over HTTP.
    Search {
        #[arg(long)]
        collection: String,
        /// Queries, `qid<TAB>query` per line (cycled).
        #[arg(long)]
        topics: PathBuf,
        /// Results per query in process (the peers' setting).
        #[arg(short, long, default_value_t = 1000)]
        k: usize,
        /// Results per `/search` request over HTTP (titles and snippets included).
        #[arg(long, default_value_t = 10)]
        http_k: usize,
        /// Concurrent HTTP clients, one run each.
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        clients: Vec<usize>,
        /// Seconds per HTTP run.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// Pipeline of the HTTP runs (re-ranking ones use the configured model).
        #[arg(long, default_value = "bm25")]
        pipeline: String,
        /// First-stage candidates re-ranked per HTTP request.
        #[arg(long, default_value_t = 10)]
        depth: usize,
    },
    /// Cross-encoder pairs/s on the workload of ../shared/bench (same inputs as its PyTorch and
    /// onnxruntime peers).
    Model {
        /// A Hugging Face BERT directory (a head is added when it has none).
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, value_delimiter = ',', default_value = "128,256,512")]
        lengths: Vec<usize>,
        #[arg(long, value_delimiter = ',', default_value = "1,8,32")]
        batches: Vec<usize>,
        #[arg(long, default_value_t = 2)]
        warmup: usize,
        #[arg(long, default_value_t = 5)]
        reps: usize,
        /// int8 linear layers (as `quantize = "int8"` in configuration).
        #[arg(long)]
        int8: bool,
    },
    /// One training step (pairwise hinge, AdamW over every weight) on the workload of ../shared/bench, as
    /// its PyTorch peer (`peers_torch.py train`) times it.
    Train {
        /// A Hugging Face BERT directory (a head is added when it has none).
        #[arg(long)]
        dir: PathBuf,
        #[arg(long, default_value_t = 256)]
        length: usize,
        #[arg(long, default_value_t = 16)]
        batch: usize,
        #[arg(long, default_value_t = 1)]
        warmup: usize,
        #[arg(long, default_value_t = 4)]
        steps: usize,
    },
}

/// mimalloc's `mi_option_purge_delay` (mimalloc.h, v2; the -sys crate names no constant for it).
const MI_OPTION_PURGE_DELAY: libmimalloc_sys::mi_option_t = 15;

fn main() -> anyhow::Result<()> {
    // Freed memory is kept for reuse, never handed back to the kernel: a forward pass frees and re-allocates
    // tensors of tens of MB, and returning them made the kernel zero fresh pages for every pass (17 % of the
    // time in `clear_page_erms`, 20 % fewer pairs/s). The peak stays bounded by `max_batch_tokens`.
    // SAFETY: sets an option before any other thread runs; mimalloc reads options atomically.
    unsafe { libmimalloc_sys::mi_option_set(MI_OPTION_PURGE_DELAY, -1) };
    // Before any other thread starts, so that all of them inherit it.
    longrank::model::flush_subnormals();
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,tantivy=warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut config = Config::load(cli.config.as_deref())?;
    if let Some(dir) = cli.data_dir {
        config.data_dir = dir;
    }
    if let Some(model) = cli.model {
        config.model.path = model;
    }
    match cli.command {
        Command::Serve { addr } => {
            if let Some(addr) = addr {
                config.server.addr = addr;
            }
            serve(config)
        }
        Command::Index { collection, format, on_error, replace, paths } => {
            if let Some(on_error) = on_error {
                config.index.on_error = on_error;
            }
            let corpus = Corpus::open(&paths, format)?;
            let progress = std::io::IsTerminal::is_terminal(&std::io::stderr());
            let options = config.index.build_options(replace, progress);
            let report = index::build(&config.data_dir, &collection, &corpus, &options)?;
            println!(
                "collection {}: indexed {} documents, skipped {}, duplicates {}, {} files already indexed; \
                 {} documents in the collection ({:.1} s, {:.0} docs/s, {:.1} MB/s, peak RSS {:.0} MB)",
                report.collection,
                report.indexed,
                report.skipped,
                report.duplicates,
                report.files_already_indexed,
                report.documents_in_collection,
                report.elapsed_s,
                report.indexed as f64 / report.elapsed_s.max(1e-9),
                corpus.total_bytes() as f64 / 1e6 / report.elapsed_s.max(1e-9),
                bench::peak_rss_mb()
            );
            Ok(())
        }
        Command::Bench {
            what: BenchCommand::Search { collection, topics, k, http_k, clients, seconds, pipeline, depth },
        } => bench::search(bench::SearchBench {
            config,
            collection: &collection,
            topics: &topics,
            k,
            http_k,
            clients: &clients,
            seconds,
            pipeline: &pipeline,
            depth,
        }),
        Command::Bench { what: BenchCommand::Model { dir, lengths, batches, warmup, reps, int8 } } => {
            bench::model(bench::ModelBench { dir: &dir, lengths: &lengths, batches: &batches, warmup, reps, int8 })
        }
        Command::Bench { what: BenchCommand::Train { dir, length, batch, warmup, steps } } => {
            bench::train(bench::TrainBench { dir: &dir, length, batch, warmup, steps })
        }
        Command::Batch {
            collection,
            topics,
            qrels,
            field,
            pipeline,
            k,
            depth,
            interpolate,
            tag,
            rerank,
            measures,
            store_scores,
            out,
        } => {
            config.model.store_scores |= store_scores;
            let engine = open_engine(&config)?;
            let measures = Measure::parse_all(&measures)?;
            let qrels = qrels.map(|q| Qrels::read(&q)).transpose()?;
            let params =
                BatchParams { collection, pipeline, k: Some(k), depth, field, tag, interpolate, ..Default::default() };
            let rerank = rerank.map(|r| read_run(&r)).transpose()?;
            let plan = engine.plan_batch(&params, eval::read_topics(&topics)?, rerank)?;
            // An interrupted batch run again with the same command keeps its finished topics.
            let mut partial = eval::PartialRun::open(&out, &plan.tag)?;
            if !partial.run().topics.is_empty() {
                eprintln!("resuming: {} topics done", partial.run().topics.len());
            }
            let remaining: Vec<_> = plan.topics.iter().filter(|t| !partial.run().topics.contains_key(&t.qid)).collect();
            let bar = progress_bar(plan.topics.len() as u64, "topics")?;
            bar.set_position((plan.topics.len() - remaining.len()) as u64);
            let (mut flops, ran) = (None, remaining.len());
            for topic in remaining {
                let ranked = plan.run_topic(&engine, topic, &Cancel::default())?;
                flops = ranked.flops.map(|f| f + flops.unwrap_or(0.0)).or(flops);
                partial.push(&topic.qid, ranked.scored)?;
                bar.inc(1);
            }
            bar.finish_and_clear();
            if let Some(flops) = flops {
                // Over the topics run by this invocation (a resumed batch's earlier ones are not counted).
                eprintln!("model FLOPs: {:.4e} per topic ({flops:.4e} in all)", flops / ran as f64);
            }
            let (run, text) = partial.finish(&out)?;
            eprintln!("wrote {} topics to {}", run.topics.len(), out.display());
            if let Some(qrels) = qrels {
                for qid in qrels.topics.keys().filter(|q| !run.topics.contains_key(*q)) {
                    eprintln!("warning: qrels topic {qid} is not in the run");
                }
                let served = eval::Run::parse(&String::from_utf8_lossy(&text), &out)?;
                let evaluation = eval::evaluate(&served, &qrels, &measures, EvalOptions::default());
                print!("{}", evaluation.to_trec_eval(false, &run.tag));
            }
            Ok(())
        }
        Command::Train(args) => train_cli::run(*args, &config),
        Command::Embed { collection, name } => {
            let engine = open_engine(&config)?;
            let collection = engine.collection(collection.as_deref())?;
            let bar = progress_bar(collection.num_docs(), "documents")?;
            let (computed, stored) =
                engine.embed_collection(&collection, name.as_deref(), |done| bar.set_position(done))?;
            bar.finish_and_clear();
            println!("collection {}: {computed} segment embeddings computed, {stored} stored", collection.name());
            Ok(())
        }
        Command::EvalSegments { collection, topics, passages, field, name } => {
            let engine = open_engine(&config)?;
            let collection = engine.collection(collection.as_deref())?;
            let topics = eval::read_topics(&topics)?;
            let passages = eval::passages::read_passages(&passages)?;
            let options =
                engine.options(RankParams { pipeline: Some("maxp"), model: name.as_deref(), ..Default::default() })?;
            let bar = progress_bar(topics.len() as u64, "topics")?;
            let stats = engine.evaluate_selection(&collection, &topics, field, &passages, &options, |done| {
                bar.set_position(done as u64)
            })?;
            bar.finish_and_clear();
            println!("questions\t{}", stats.questions);
            println!("segments_per_document\t{:.2}", stats.segments as f64 / stats.questions.max(1) as f64);
            println!("p1_model\t{:.4}", stats.precision(stats.selected_hits as f64));
            println!("p1_first\t{:.4}", stats.precision(stats.first_hits as f64));
            println!("p1_random\t{:.4}", stats.precision(stats.random_hits));
            Ok(())
        }
        Command::Eval { measures, options, per_topic, run, qrels } => {
            let measures = Measure::parse_all(&measures)?;
            let run = read_run(&run)?;
            let evaluation = eval::evaluate(&run, &Qrels::read(&qrels)?, &measures, options.options());
            print!("{}", evaluation.to_trec_eval(per_topic, &run.tag));
            Ok(())
        }
        Command::Compare { measures, options, run_a, run_b, qrels } => {
            let measures = Measure::parse_all(&measures)?;
            let qrels = Qrels::read(&qrels)?;
            let a = eval::evaluate(&read_run(&run_a)?, &qrels, &measures, options.options());
            let b = eval::evaluate(&read_run(&run_b)?, &qrels, &measures, options.options());
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
        Command::Folds { topics, k, seed, out, read } => {
            if let Some(path) = read {
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
            let Some(topics) = topics else { bail!("give --topics FILE to make folds, or --read FILE") };
            let qids: Vec<String> = eval::read_topics(&topics)?.into_iter().map(|t| t.qid).collect();
            let folds = eval::make_folds(&qids, k, seed);
            let text: String = folds.iter().map(|(q, f)| format!("{q}\t{f}\n")).collect();
            match out {
                Some(path) => write_file(&path, &text)?,
                None => print!("{text}"),
            }
            Ok(())
        }
        Command::Search { collection, k, pipeline, depth, interpolate, json, query } => {
            let engine = open_engine(&config)?;
            let query = query.join(" ");
            let request = SearchRequest { query, k, depth, collection, pipeline, interpolate, ..Default::default() };
            let response = engine.search(request, &Cancel::default())?;
            let mut out = std::io::stdout().lock();
            if json {
                serde_json::to_writer_pretty(&mut out, &response)?;
                writeln!(out)?;
            } else {
                writeln!(out, "{:>4}  {:>9}  {:<24}  title", "rank", "score", "docid")?;
                for hit in &response.results {
                    writeln!(out, "{:>4}  {:>9.4}  {:<24}  {}", hit.rank, hit.score, hit.docid, hit.title)?;
                }
            }
            Ok(())
        }
    }
}

/// Reads a run, printing its warnings (duplicate docids) to stderr.
fn read_run(path: &Path) -> anyhow::Result<eval::Run> {
    let run = eval::Run::read(path)?;
    for warning in &run.warnings {
        eprintln!("warning: {warning}");
    }
    Ok(run)
}

/// The engine over the data directory; models load when a pipeline first needs one.
fn open_engine(config: &Config) -> anyhow::Result<Engine> {
    let (catalog, failures) = Catalog::open(&config.data_dir)?;
    for failure in failures {
        tracing::warn!("{failure}");
    }
    Ok(Engine::new(Arc::new(catalog), config))
}

/// A terminal progress bar over `len` things (hidden when stderr is not a terminal).
fn progress_bar(len: u64, what: &str) -> anyhow::Result<indicatif::ProgressBar> {
    let bar = if std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        indicatif::ProgressBar::new(len)
    } else {
        indicatif::ProgressBar::hidden()
    };
    bar.set_style(indicatif::ProgressStyle::with_template(&format!(
        "{{bar:40}} {{pos}}/{{len}} {what}, {{per_sec}}, ETA {{eta}}"
    ))?);
    Ok(bar)
}

fn serve(config: Config) -> anyhow::Result<()> {
    let (catalog, failures) = Catalog::open(&config.data_dir)
        .with_context(|| format!("opening the data directory {}", config.data_dir.display()))?;
    for failure in &failures {
        tracing::warn!("collection not served: {failure}");
    }
    let catalog = Arc::new(catalog);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(async move {
        let database = config.database_path();
        let store = Store::open(&database).await.with_context(|| format!("opening {}", database.display()))?;
        let state = AppState::new(config, catalog, store);
        let on_listening = |addr| {
            println!("longrank listening on http://{addr}");
            let _ = std::io::stdout().flush();
        };
        server::serve(state, on_listening, prepare).await
    })
}

/// Loads the models, and indexes the demo collection on first start when the data directory holds no
/// collection at all (it never shadows a user's collections). A model that cannot be loaded is reported once
/// and left unavailable: the first-stage pipelines serve regardless, never a made-up score.
fn prepare(state: &AppState) -> anyhow::Result<()> {
    let config = state.config();
    for (name, reason) in state.engine().models().load_all() {
        tracing::warn!("model {name} is unavailable, its re-ranking pipelines answer 503 (bm25 serves): {reason}");
    }
    let catalog = state.engine().catalog();
    if !config.server.demo_when_empty || !catalog.is_empty() {
        return Ok(());
    }
    tracing::info!("no collection in {}: indexing the demo collection", config.data_dir.display());
    let source = config.data_dir.join("demo-source").join("demo.jsonl");
    write_file(&source, DEMO_JSONL)?;
    let corpus = Corpus::open(&[source], Format::Jsonl)?;
    let report = index::build(&config.data_dir, "demo", &corpus, &config.index.build_options(false, false))?;
    if report.indexed == 0 {
        bail!("the demo collection indexed no documents");
    }
    catalog.refresh("demo")?;
    Ok(())
}

fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
