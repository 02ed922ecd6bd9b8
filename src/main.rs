//! The `longrank` command line: serve, index, search.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

mod bench;

use longrank::config::Config;
use longrank::corpus::{Corpus, Format, DEMO_JSONL};
use longrank::index::{self, Catalog, OnError};
use longrank::rank::{Engine, SearchRequest};
use longrank::server::{self, AppState};

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
        /// Print the response as JSON instead of a table.
        #[arg(long)]
        json: bool,
        #[arg(required = true)]
        query: Vec<String>,
    },
    /// Benchmarks (not tests): BM25 query latency in process and over HTTP.
    Bench {
        #[command(subcommand)]
        what: BenchCommand,
    },
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
    },
}

fn main() -> anyhow::Result<()> {
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
        Command::Bench { what: BenchCommand::Search { collection, topics, k, http_k, clients, seconds } } => {
            bench::search(bench::SearchBench {
                config,
                collection: &collection,
                topics: &topics,
                k,
                http_k,
                clients: &clients,
                seconds,
            })
        }
        Command::Search { collection, k, pipeline, json, query } => {
            let engine = open_engine(&config)?;
            let request = SearchRequest { query: query.join(" "), k, collection, pipeline, ..Default::default() };
            let response = engine.search(request)?;
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

fn open_engine(config: &Config) -> anyhow::Result<Engine> {
    let (catalog, failures) = Catalog::open(&config.data_dir)?;
    for failure in failures {
        tracing::warn!("{failure}");
    }
    Ok(Engine::new(Arc::new(catalog), config.limits.clone(), config.bm25, &config.default_collection))
}

fn serve(config: Config) -> anyhow::Result<()> {
    let (catalog, failures) = Catalog::open(&config.data_dir)
        .with_context(|| format!("opening the data directory {}", config.data_dir.display()))?;
    for failure in &failures {
        tracing::warn!("collection not served: {failure}");
    }
    let catalog = Arc::new(catalog);
    let state = AppState::new(config, catalog);
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    runtime.block_on(server::serve(
        state,
        |addr| {
            println!("longrank listening on http://{addr}");
            let _ = std::io::stdout().flush();
        },
        prepare,
    ))
}

/// Indexes the demo collection on first start, when the data directory holds no collection at all (it
/// never shadows a user's collections).
fn prepare(state: &AppState) -> anyhow::Result<()> {
    let config = state.config();
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
