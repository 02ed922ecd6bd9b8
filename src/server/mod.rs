//! The HTTP server: axum router, shared state (`state`), middleware, OpenAPI, and hyper's accept loop. Handlers
//! are thin; the work happens in `rank::Engine`, on blocking threads so the async runtime never waits on an
//! index, and in the background services of `scheduler`.

mod access;
mod admission;
mod compat;
mod connections;
mod deadline;
mod decode;
mod error;
mod forward;
mod metrics;
mod middleware;
mod openapi;
mod query_log;
mod routes;
mod state;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use axum::routing::{delete, get, post};
use axum::Router;
use utoipa_swagger_ui::SwaggerUi;

pub use error::{ApiError, ErrorBody};
pub use openapi::ApiDoc;
pub use state::AppState;

/// The routes, grouped by what they need of a key (`access::Access`), behind the one layer stack.
pub fn router(state: AppState) -> Router {
    use routes::{batch, cluster, collections, compat, documents, pipelines, rerank, search, system, tasks, web};
    let open = Router::new()
        .route("/health", get(system::health))
        .route("/", get(web::index))
        .route("/static/{name}", get(web::static_file))
        .merge(
            SwaggerUi::new("/docs").external_url_unchecked("/openapi.json", openapi::document(&state.config().limits)),
        );
    let read = Router::new()
        .route("/search", get(search::get_search).post(search::post_search))
        .route("/rerank", post(rerank::rerank))
        .route(self::compat::paths::COHERE_V2, post(compat::cohere_v2))
        .route(self::compat::paths::COHERE_V1, post(compat::v1))
        .route(self::compat::paths::TEI, post(compat::tei))
        .route(self::compat::paths::TEI_EMBED, post(compat::tei_embed))
        .route(self::compat::paths::OPENAI_EMBEDDINGS, post(compat::openai_embeddings))
        .route("/documents/{docid}", get(documents::get_document))
        .route("/collections", get(collections::list_collections))
        .route("/pipelines", get(pipelines::list_pipelines))
        .route("/batch", get(batch::list))
        .route("/batch/compare", get(batch::compare))
        .route("/batch/{id}", get(batch::get))
        .route("/batch/{id}/run", get(batch::run_file))
        .route("/tasks", get(tasks::list))
        .route("/tasks/{id}", get(tasks::get))
        .route("/cluster", get(cluster::get));
    let admin = Router::new()
        .route("/batch", post(batch::submit))
        .route("/batch/{id}", delete(batch::cancel))
        .route("/tasks/{id}", delete(tasks::cancel))
        .route("/cluster/settings", axum::routing::put(cluster::put_settings))
        .route("/collections/{name}", axum::routing::put(collections::create).delete(collections::delete))
        // An upload: bounded by `limits.max_upload_bytes` and by no request timeout (`middleware::is_upload`).
        .route("/collections/{name}/documents", post(collections::add_documents))
        .route("/collections/{name}/documents/delete", post(collections::delete_documents))
        .route("/collections/{name}/documents/{docid}", delete(collections::delete_document))
        .route("/collections/{name}/embeddings", post(collections::embed));
    middleware::layers(open, read, admin, state)
}

/// Serves until SIGINT or SIGTERM, letting in-flight requests finish. `on_listening` gets the bound
/// address (the port may have been 0); `prepare` runs on a blocking thread before the server is ready
/// (opening or creating indexes) while `/health` already answers 503.
pub async fn serve(
    state: AppState,
    on_listening: impl FnOnce(SocketAddr),
    prepare: impl FnOnce(&AppState) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<()> {
    let addr = &state.config().server.addr;
    let listener = listen(addr).await.with_context(|| format!("listening on {addr} (server.addr)"))?;
    let addr = listener.local_addr()?;
    state.bound(addr);
    on_listening(addr);
    let app = router(state.clone());
    let preparing = state.clone();
    tokio::spawn(async move {
        let prepared = tokio::task::spawn_blocking({
            let state = preparing.clone();
            move || prepare(&state)
        })
        .await;
        match prepared {
            Ok(Ok(())) => {
                // Before any upload can arrive: the tasks' start removes uploads no task needs.
                if let Err(e) =
                    preparing.tasks().start(preparing.replica(), preparing.advertised_url(), preparing.services()).await
                {
                    tracing::error!("starting the tasks: {e}");
                }
                preparing.set_ready();
                follow_data_dir(preparing.clone());
                // The heartbeat first: replicas see what this one serves before its workers claim.
                preparing.cluster().start(preparing.replica(), preparing.services()).await;
                if let Err(e) = preparing.jobs().start(preparing.replica(), preparing.services()).await {
                    tracing::error!("starting the batch workers: {e}");
                }
            }
            Ok(Err(e)) => tracing::error!("start-up failed, staying unready: {e:#}"),
            Err(e) => tracing::error!("start-up panicked, staying unready: {e}"),
        }
    });
    let served = accept(listener, app, &state).await;
    // The background services call into the runtime: they end their tick in hand before it goes.
    let services = state.services().clone();
    let _ = tokio::task::spawn_blocking(move || services.stop()).await;
    served
}

/// A listener whose backlog holds a burst of new clients (the kernel caps it at `net.core.somaxconn`; the
/// standard library asks for 128).
async fn listen(addr: &str) -> std::io::Result<tokio::net::TcpListener> {
    const BACKLOG: u32 = 4096;
    let mut last = None;
    for addr in tokio::net::lookup_host(addr).await? {
        let socket = match addr {
            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
        };
        socket.set_reuseaddr(true)?;
        match socket.bind(addr).and_then(|()| socket.listen(BACKLOG)) {
            Ok(listener) => return Ok(listener),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no address to listen on")))
}

/// Keeps the catalog in step with the data directory (`Catalog::sync`), every `server.catalog_poll_ms`, as a
/// background service: a blocking task every second woke the runtime's idle blocking threads in turn, each
/// before its keep-alive ran out, so none ever ended and the memory a load left in their heaps stayed. A
/// replica that pulls its collections from an object store pulls first (`Replication::follow`), and collects
/// garbage each minute (or each half `store.retention_ms`, when shorter).
fn follow_data_dir(state: AppState) {
    let every = state.config().server.catalog_poll_ms;
    if every == 0 {
        return;
    }
    // Garbage each minute, or each half retention time when that is shorter (never more often than a poll).
    let collect_ms = (state.config().store.retention_ms / 2).min(60_000).max(every);
    let collect_every = collect_ms / every;
    let services = state.services().clone();
    services.spawn("catalog-sync", Duration::from_millis(every), move |tick| {
        let catalog = state.engine().catalog();
        if let Some(replication) = state.replication() {
            replication.follow(catalog.root(), tick, collect_every, crate::scheduler::cluster::LIVE_MS);
        }
        let changes = catalog.sync();
        if !changes.is_empty() {
            let (added, replaced, removed) = (&changes.added, &changes.replaced, &changes.removed);
            tracing::info!(?added, ?replaced, ?removed, "collections changed in the data directory");
            for (name, reason) in &changes.failed {
                tracing::warn!("collection {name} could not be opened: {reason}");
            }
        }
    });
}

/// Serves connections until SIGINT or SIGTERM, then lets those open finish. hyper directly, for what
/// `axum::serve` does not set: at most `max_connections` open, the one idle longest closed to make room
/// (`connections`), and one that sends no request headers within `header_read_timeout_ms` (idle keep-alive ones
/// included) closed too.
async fn accept(listener: tokio::net::TcpListener, app: Router, state: &AppState) -> anyhow::Result<()> {
    use hyper_util::rt::{TokioIo, TokioTimer};
    let (config, connections) = (&state.config().server, state.connection_slots());
    let graceful = hyper_util::server::graceful::GracefulShutdown::new();
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(Duration::from_millis(config.header_read_timeout_ms.max(1)))
        .max_headers(middleware::HYPER_MAX_HEADERS);
    let shutdown = shutdown_signal();
    tokio::pin!(shutdown);
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors, say: wait a moment rather than spin.
                    tracing::warn!("accept: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            _ = &mut shutdown => break,
        };
        // Room is made once there is a client to take it (a slot kept waiting would be taken from it).
        let slot = tokio::select! {
            slot = connections.slot() => Arc::new(slot),
            _ = &mut shutdown => break,
        };
        let service = {
            let (app, slot) = (app.clone(), slot.clone());
            hyper::service::service_fn(move |request: axum::extract::Request<hyper::body::Incoming>| {
                let (mut app, busy) = (app.clone(), slot.busy());
                async move {
                    let response = tower::Service::call(&mut app, request).await?;
                    Ok::<_, std::convert::Infallible>(
                        response.map(|body| axum::body::Body::new(connections::Tracked { body, _busy: busy })),
                    )
                }
            })
        };
        let connection = graceful.watch(http.serve_connection(TokioIo::new(stream), service));
        tokio::spawn(async move {
            match slot.serve(connection).await {
                Some(Err(e)) => tracing::debug!("connection: {e}"),
                None => tracing::debug!("connection closed to make room for a new one"),
                Some(Ok(())) => {}
            }
        });
    }
    drop(listener);
    graceful.shutdown().await;
    Ok(())
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = terminate => {},
    }
    tracing::info!("shutting down: finishing in-flight requests");
}
