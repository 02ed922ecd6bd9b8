//! The command line, one module per subcommand; `main.rs` parses and dispatches. What several subcommands
//! share lives here: the configuration with the global flags applied, the engine, and reading runs.

pub mod batch;
pub mod bench;
pub mod collections;
pub mod compare;
pub mod embed;
pub mod eval;
pub mod eval_segments;
pub mod folds;
pub mod index;
pub mod memory;
pub mod progress;
pub mod search;
pub mod serve;
pub mod train;
pub mod writer;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::Context;
use longrank::config::Config;
use longrank::eval::Run;
use longrank::index::Catalog;
use longrank::rank::Engine;
use longrank::replication::Replication;
use longrank::store::{Store, WriterLease};

/// The flags of the subcommands that read the configuration and the data directory (not `eval`, `compare`,
/// `folds`), after the subcommand or before it (`longrank --model DIR search …`).
#[derive(clap::Args, Clone, Default)]
pub struct Global {
    /// Configuration file [default: ./config.toml when present].
    #[arg(long, env = "LONGRANK_CONFIG")]
    pub config: Option<PathBuf>,
    /// Data directory [default: `data_dir` of the configuration].
    #[arg(long)]
    pub data_dir: Option<PathBuf>,
    /// The re-ranking model: a configured name (`default`, or one of `[model.named]`: `model` of the ranking
    /// parameters), or a Hugging Face directory or hub id, which becomes the default model ("" for none)
    /// [default: `model.path` of the configuration].
    #[arg(long)]
    pub model: Option<String>,
}

impl Global {
    /// These flags, then those given before the subcommand for the ones not given here.
    pub fn or(self, before: &Global) -> Global {
        Global {
            config: self.config.or_else(|| before.config.clone()),
            data_dir: self.data_dir.or_else(|| before.data_dir.clone()),
            model: self.model.or_else(|| before.model.clone()),
        }
    }

    /// The configuration (defaults < file < environment), then these flags; and the model `--model` names when
    /// it names a configured one.
    pub fn config(&self) -> anyhow::Result<(Config, Option<String>)> {
        let mut config = Config::load(self.config.as_deref())?;
        if let Some(dir) = &self.data_dir {
            config.data_dir = dir.clone();
        }
        let configured = |m: &str| {
            (m == longrank::rank::DEFAULT_MODEL && !config.model.path.is_empty()) || config.model.named.contains_key(m)
        };
        match &self.model {
            Some(name) if configured(name) => return Ok((config, Some(name.clone()))),
            Some(source) => config.model.path = source.clone(),
            None => {}
        }
        Ok((config, None))
    }
}

/// Process-wide settings, before any other thread starts (so that all of them inherit them).
pub fn init_process() {
    // Library errors capture no backtrace (candle attaches one to its errors when RUST_BACKTRACE is set, and
    // their messages reach clients, `/pipelines` and the logs: stack frames and build paths must not). Panics
    // still follow RUST_BACKTRACE. No other thread runs yet to read the environment meanwhile.
    std::env::set_var("RUST_LIB_BACKTRACE", "0");
    memory::set_purge_delay();
    longrank::model::flush_subnormals();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info,tantivy=warn".into()),
        )
        .with_writer(std::io::stderr)
        // Colour codes only for a terminal: logs piped to a file or another program stay plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// Reads a run, printing its warnings (duplicate docids) to stderr.
pub fn read_run(path: &Path) -> anyhow::Result<Run> {
    let run = Run::read(path)?;
    for warning in run.warnings.list() {
        eprintln!("warning: {}: {}", path.display(), warning.message);
    }
    Ok(run)
}

/// The engine over the data directory; models load when a pipeline first needs one.
pub fn open_engine(config: &Config) -> anyhow::Result<Engine> {
    let (catalog, failures) = Catalog::open(&config.data_dir)?;
    for failure in failures {
        tracing::warn!("{failure}");
    }
    Ok(Engine::new(Arc::new(catalog), config))
}

/// The store the configuration names (`[store] url`, else SQLite in the data directory), migrated.
pub async fn open_store(config: &Config) -> anyhow::Result<Store> {
    let url = config.store_url();
    Store::connect(&url).await.with_context(|| format!("opening the store {}", longrank::config::redact_url(&url)))
}

/// The runtime of a command that reaches the store or the object store: a worker thread of its own, since
/// `Replication`'s blocking calls reach it from the command's thread (a current-thread runtime's
/// `Handle::block_on` drives no I/O).
pub fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    Ok(tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?)
}

/// How a command that writes a collection reaches a cluster whose collections travel through an object store.
pub enum Cluster {
    /// No server writes them: this command does, holding the writer's lock while it runs, and publishes.
    Publish(Replication, WriterLease),
    /// A server does (one writer at a time): the command sends it the work over HTTP.
    Writer(writer::WriterClient),
}

/// The cluster the configuration names (`store.objects`), if any; refused without PostgreSQL.
pub fn cluster(config: &Config, runtime: &tokio::runtime::Runtime) -> anyhow::Result<Option<Cluster>> {
    if config.store.objects.is_empty() {
        return Ok(None);
    }
    runtime.block_on(async {
        let store = open_store(config).await?;
        let Some(replication) = Replication::open(&config.store, &store).await? else { return Ok(None) };
        let process = format!("longrank {} (pid {})", std::env::args().nth(1).unwrap_or_default(), std::process::id());
        if let Some(lease) = store.try_writer_lease(&process, "").await? {
            return Ok(Some(Cluster::Publish(replication, lease)));
        }
        match store.writer().await? {
            Some((_, url)) if !url.is_empty() => Ok(Some(Cluster::Writer(writer::WriterClient::new(url, config)))),
            Some((process, _)) => {
                anyhow::bail!("{process} writes this cluster's collections now: run again when it ends")
            }
            None => anyhow::bail!("the cluster's writer changes hands: run again in a second"),
        }
    })
}

/// Publishes collection `name` of the data directory as a new version (none when nothing changed), saying so.
pub fn publish(replication: &Replication, config: &Config, name: &str) -> anyhow::Result<()> {
    let p = replication.publish(&config.data_dir.join("collections"), name)?;
    match p.unchanged {
        true => println!("version {} unchanged in {}", p.version, replication.objects_url()),
        false => println!(
            "published version {} to {}: {} files, {} uploaded ({:.1} MB)",
            p.version,
            replication.objects_url(),
            p.files,
            p.uploaded_files,
            p.uploaded_bytes as f64 / 1e6
        ),
    }
    Ok(())
}

pub fn write_file(path: &Path, text: &str) -> anyhow::Result<()> {
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).with_context(|| format!("creating {}", parent.display()))?;
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}
