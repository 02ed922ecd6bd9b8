//! The server's shared state: configuration, the engine, the background services, admission and connection
//! slots, metrics; and the one way a handler runs engine work (`AppState::run`: admitted, on a blocking thread,
//! cancelled when the request goes away or its deadline passes).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{admission, connections, deadline, metrics, query_log, ApiError};
use crate::config::Config;
use crate::index::Catalog;
use crate::model::Cancel;
use crate::rank::{
    EmbedRequest, Embeddings, Engine, RankError, RerankRequest, RerankResponse, SearchRequest, SearchResponse,
};
use crate::replication::Replication;
use crate::scheduler::cluster::Cluster;
use crate::scheduler::jobs::Jobs;
use crate::scheduler::tasks;
use crate::store::Store;

#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    config: Config,
    engine: Arc<Engine>,
    jobs: Arc<Jobs>,
    tasks: Arc<tasks::Tasks>,
    metrics: metrics::Metrics,
    ready: AtomicBool,
    /// The address the server listens on, once bound.
    bound: std::sync::OnceLock<SocketAddr>,
    admission: admission::Admission,
    connections: connections::Connections,
    replication: Option<Replication>,
    query_log: query_log::QueryLog,
    services: crate::service::Services,
    /// The replicas as this one sees them, and the cluster-wide settings in force.
    cluster: Arc<Cluster>,
}

impl AppState {
    pub fn new(config: Config, catalog: Arc<Catalog>, store: Store, replication: Option<Replication>) -> AppState {
        let engine = Arc::new(Engine::new(catalog, &config));
        let tasks = tasks::Tasks::new(engine.clone(), store.clone(), &config, replication.clone());
        let services = crate::service::Services::default();
        let (keep, bound) = (config.server.query_log_entries, config.server.query_log_queue);
        let query_log = query_log::QueryLog::start(&store, keep, bound, &services);
        let cluster = Arc::new(Cluster::new(engine.clone(), store.clone(), config.batch.clone()));
        let jobs = Jobs::new(engine.clone(), store, config.clone(), cluster.clone());
        let admission = admission::Admission::new(
            config.server.concurrent_work(),
            config.server.max_waiting_requests,
            Duration::from_millis(config.server.request_timeout_ms),
        );
        let inner = Inner {
            admission,
            connections: connections::Connections::new(config.server.max_connections),
            config,
            engine,
            jobs,
            tasks,
            metrics: metrics::Metrics::default(),
            ready: AtomicBool::new(false),
            bound: std::sync::OnceLock::new(),
            replication,
            query_log,
            services,
            cluster,
        };
        AppState { inner: Arc::new(inner) }
    }

    pub fn jobs(&self) -> &Arc<Jobs> {
        &self.inner.jobs
    }

    pub fn cluster(&self) -> &Arc<Cluster> {
        &self.inner.cluster
    }

    pub fn tasks(&self) -> &Arc<tasks::Tasks> {
        &self.inner.tasks
    }

    /// The object store this replica pulls its collections from, if any.
    pub fn replication(&self) -> Option<&Replication> {
        self.inner.replication.as_ref()
    }

    /// Runs a search and hands it to the query log (which never slows a search: see `query_log`).
    pub(super) async fn search(&self, request: SearchRequest) -> Result<SearchResponse, ApiError> {
        let response = self.run(move |engine, cancel| engine.search(request, cancel)).await?;
        self.inner.query_log.log(query_log::Entry {
            query: response.query.clone(),
            collection: response.collection.clone(),
            pipeline: response.pipeline.name(),
            latency_ms: response.took_ms,
            results: response.results.len() as i64,
        });
        Ok(response)
    }

    /// The background services (`service`), stopped when the server stops.
    pub fn services(&self) -> &crate::service::Services {
        &self.inner.services
    }

    pub(super) fn query_log(&self) -> &query_log::QueryLog {
        &self.inner.query_log
    }

    /// Re-ranks the client's candidates (`/rerank` and its compatible forms).
    pub(super) async fn rerank(&self, request: RerankRequest) -> Result<RerankResponse, ApiError> {
        self.run(move |engine, cancel| engine.rerank_documents(request, cancel)).await
    }

    /// Embeds the client's texts (`/embed`, `/v1/embeddings`).
    pub(super) async fn embed(&self, request: EmbedRequest) -> Result<Embeddings, ApiError> {
        self.run(move |engine, cancel| engine.embed(request, cancel)).await
    }

    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub fn engine(&self) -> &Engine {
        &self.inner.engine
    }

    /// The engine, to move onto a blocking thread.
    pub fn engine_arc(&self) -> Arc<Engine> {
        self.inner.engine.clone()
    }

    pub(super) fn metrics(&self) -> &metrics::Metrics {
        &self.inner.metrics
    }

    /// Whether the server listens on a loopback address only (else writes need an admin key, and the host
    /// check accepts any host unless `allowed_hosts` lists some).
    pub fn loopback(&self) -> bool {
        self.inner.bound.get().is_some_and(|addr| addr.ip().is_loopback())
    }

    /// The URL other replicas reach this one at (forwarded uploads): `server.advertise_url`, else the address
    /// it listens on.
    pub fn advertised_url(&self) -> String {
        match &self.inner.config.server.advertise_url {
            url if url.is_empty() => {
                format!("http://{}", self.inner.bound.get().map(|a| a.to_string()).unwrap_or_default())
            }
            url => url.trim_end_matches('/').to_string(),
        }
    }

    /// This replica's name: `server.replica_id`, else the address it listens on.
    pub fn replica(&self) -> String {
        match &self.inner.config.server.replica_id {
            id if id.is_empty() => self.inner.bound.get().map(|a| a.to_string()).unwrap_or_default(),
            id => id.clone(),
        }
    }

    /// Requests waiting for a turn at the engine.
    pub fn waiting(&self) -> usize {
        self.inner.admission.waiting()
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.inner.connections.open()
    }

    /// The connection slots the accept loop hands out.
    pub(super) fn connection_slots(&self) -> &connections::Connections {
        &self.inner.connections
    }

    /// Records the address the server listens on.
    pub(super) fn bound(&self, addr: SocketAddr) {
        let _ = self.inner.bound.set(addr);
    }

    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    pub fn set_ready(&self) {
        self.inner.ready.store(true, Ordering::Release);
    }

    /// Runs engine work on a blocking thread. When the request goes away first (the client disconnected, or
    /// it timed out), the work is told through its `Cancel`, and its queued model inputs are dropped.
    pub(super) async fn run<T: Send + 'static>(
        &self,
        work: impl FnOnce(&Engine, &Cancel) -> Result<T, RankError> + Send + 'static,
    ) -> Result<T, ApiError> {
        struct CancelOnDrop(Cancel);
        impl Drop for CancelOnDrop {
            fn drop(&mut self) {
                self.0.cancel();
            }
        }
        // The request's deadline, from its arrival, travels with its work: admission and the model's queue
        // refuse what would time out.
        let timeout = Duration::from_millis(self.config().server.request_timeout_ms);
        let deadline = deadline::deadline().unwrap_or_else(|| Instant::now() + timeout);
        let permit = self.inner.admission.admit(deadline).await?;
        let state = self.clone();
        let guard = CancelOnDrop(Cancel::until(deadline));
        let cancel = guard.0.clone();
        let result = tokio::task::spawn_blocking(move || {
            let result = work(state.engine(), &cancel);
            if result.is_ok() {
                permit.finished();
            }
            result
        })
        .await;
        drop(guard);
        match result {
            Ok(result) => {
                result.map_err(|e| ApiError::of_work(e, Instant::now() >= deadline, timeout.as_millis() as u64))
            }
            Err(e) => Err(ApiError::internal(format!("worker failed: {e}"))),
        }
    }
}
