//! `longrank serve`: the HTTP API and the web page.

use std::io::Write;
use std::sync::Arc;

use anyhow::{bail, Context};
use longrank::config::Config;
use longrank::corpus::{Corpus, Format, DEMO_JSONL};
use longrank::index::{self, Catalog};
use longrank::progress::Silent;
use longrank::replication::Replication;
use longrank::server::{self, AppState};

use super::memory;

#[derive(clap::Args)]
pub struct ServeArgs {
    #[command(flatten)]
    pub global: super::Global,
    /// Address to listen on; port 0 picks a free one [default: `server.addr` of the configuration].
    #[arg(long)]
    addr: Option<String>,
}

pub fn run(args: ServeArgs, mut config: Config) -> anyhow::Result<()> {
    if let Some(addr) = args.addr {
        config.server.addr = addr;
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        // A blocking thread ending after a load (idle for tokio's keep-alive) hands back the memory it freed;
        // left to the allocator's abandoned segments, it was kept for good. The workers do once a load is over.
        .on_thread_stop(memory::release_thread_memory)
        .on_thread_unpark(memory::on_worker_unpark)
        .on_thread_park(memory::on_worker_park)
        .build()?;
    runtime.block_on(async move {
        tokio::spawn(memory::return_memory_after_load());
        let store = super::open_store(&config).await?;
        let replication = Replication::open(&config.store, &store).await?;
        // Servers sharing a store are replicas: each serves its copy of the collections, never writing it,
        // unless it pulls its copy from the object store (then it alone writes it).
        let open = match (store.shared(), &replication) {
            (true, None) => Catalog::open_read_only,
            _ => Catalog::open,
        };
        let (catalog, failures) = open(&config.data_dir)
            .with_context(|| format!("opening the data directory {}", config.data_dir.display()))?;
        for failure in &failures {
            tracing::warn!("collection not served: {failure}");
        }
        let catalog = Arc::new(catalog);
        let state = AppState::new(config, catalog, store, replication);
        let on_listening = |addr| {
            println!("longrank listening on http://{addr}");
            let _ = std::io::stdout().flush();
        };
        server::serve(state, on_listening, prepare).await
    })
}

/// Loads the models, pulls the collections from the object store when there is one, and indexes the demo collection on first start when the data directory holds no
/// collection at all (it never shadows a user's collections). A model that cannot be loaded is reported once
/// and left unavailable: the first-stage pipelines serve regardless, never a made-up score.
fn prepare(state: &AppState) -> anyhow::Result<()> {
    let config = state.config();
    let (gemm, library, threads) = longrank::model::gemm_path();
    tracing::info!(gemm, library, threads, "the encoder's products on the CPU: {gemm}, {threads} threads");
    for (name, reason) in state.engine().models().load_all() {
        tracing::warn!("model {name} is unavailable, its re-ranking pipelines are refused (bm25 serves): {reason}");
    }
    let catalog = state.engine().catalog();
    if let Some(replication) = state.replication() {
        // Every collection of the object store before readiness: a replica started empty serves them all.
        tracing::info!("pulling the collections' newest versions from {}", replication.objects_url());
        replication.pull_logged(catalog.root())?;
        catalog.sync();
    }
    // Fingerprints hash every index file once (then only new ones): before readiness, not in a request.
    let _ = state.engine().fingerprints();
    if !config.server.demo_when_empty || !catalog.is_empty() || state.jobs().store().shared() {
        return Ok(());
    }
    tracing::info!("no collection in {}: indexing the demo collection", config.data_dir.display());
    let source = config.data_dir.join("demo-source").join("demo.jsonl");
    super::write_file(&source, DEMO_JSONL)?;
    let corpus = Corpus::open(&[source], Format::Jsonl)?;
    let report = index::build(&config.data_dir, "demo", &corpus, &config.index.build_options(false), &Silent)?;
    if report.indexed == 0 {
        bail!("the demo collection indexed no documents");
    }
    catalog.refresh("demo")?;
    Ok(())
}
