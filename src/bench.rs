//! `longrank bench`: first-stage benchmarks (not tests). Query latency in process, one thread, top-k (what
//! the tantivy-py and bm25s peers of ../shared/bench measure), then `/search` over HTTP at several client
//! concurrencies against a server started in this process. Prints `RESULT` lines like the peers.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use longrank::config::Config;
use longrank::index::Catalog;
use longrank::server::{self, AppState};
use longrank::store::Store;

pub struct SearchBench<'a> {
    pub config: Config,
    pub collection: &'a str,
    pub topics: &'a Path,
    pub k: usize,
    pub http_k: usize,
    pub clients: &'a [usize],
    pub seconds: f64,
}

pub fn search(b: SearchBench) -> anyhow::Result<()> {
    let queries: Vec<String> = longrank::eval::read_topics(b.topics)?.into_iter().map(|t| t.title).collect();
    let (catalog, _) = Catalog::open(&b.config.data_dir)?;
    let catalog = Arc::new(catalog);
    let collection = catalog.get(b.collection)?;
    let params = b.config.bm25;

    // In process, one thread: warm up once, then time every topic.
    for q in &queries {
        collection.search(q, b.k, params)?;
    }
    let mut latencies = Vec::with_capacity(queries.len());
    let started = Instant::now();
    for q in &queries {
        let t = Instant::now();
        collection.search(q, b.k, params)?;
        latencies.push(t.elapsed());
    }
    report(&format!("longrank-index collection={} k={}", b.collection, b.k), &mut latencies, started.elapsed());
    // Before the HTTP runs, whose client threads live in this process too.
    println!("RESULT longrank-index peak_rss_mb={:.0}", peak_rss_mb());

    // Over HTTP, against a server in this process.
    let mut config = b.config.clone();
    config.server.addr = "127.0.0.1:0".into();
    config.limits.max_k = config.limits.max_k.max(b.http_k);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
        let served = runtime.block_on(async move {
            let state = AppState::new(config.clone(), catalog, Store::open(&config.database_path()).await?);
            server::serve(state, |addr| tx.send(addr).expect("address"), |_| Ok(())).await
        });
        if let Err(e) = served {
            eprintln!("bench server failed: {e:#}");
        }
    });
    let addr = rx.recv_timeout(Duration::from_secs(30)).context("bench server did not start")?;
    let health = format!("http://{addr}/health");
    let ready = Instant::now() + Duration::from_secs(30);
    while ureq::get(&health).call().is_err() {
        if Instant::now() > ready {
            bail!("bench server never became ready");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let url = format!("http://{addr}/search");
    for &clients in b.clients {
        let deadline = Instant::now() + Duration::from_secs_f64(b.seconds);
        let started = Instant::now();
        let mut handles = Vec::new();
        for c in 0..clients {
            let (url, queries, collection, k) = (url.clone(), queries.clone(), b.collection.to_string(), b.http_k);
            handles.push(std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
                let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).build();
                let mut lat = Vec::new();
                let mut i = c * 7919;
                while Instant::now() < deadline {
                    let body =
                        serde_json::json!({"query": queries[i % queries.len()], "k": k, "collection": collection});
                    let t = Instant::now();
                    agent.post(&url).send_json(body)?.into_string()?;
                    lat.push(t.elapsed());
                    i += 1;
                }
                Ok(lat)
            }));
        }
        let mut latencies = Vec::new();
        for h in handles {
            latencies.extend(h.join().map_err(|_| anyhow::anyhow!("client panicked"))??);
        }
        report(
            &format!("longrank-http collection={} k={} clients={clients}", b.collection, b.http_k),
            &mut latencies,
            started.elapsed(),
        );
    }
    println!("RESULT longrank-http peak_rss_mb={:.0} (server and clients)", peak_rss_mb());
    Ok(())
}

fn report(what: &str, latencies: &mut [Duration], wall: Duration) {
    if latencies.is_empty() {
        println!("RESULT {what} requests=0");
        return;
    }
    latencies.sort();
    let pct = |p: f64| latencies[((latencies.len() - 1) as f64 * p).round() as usize].as_secs_f64() * 1e3;
    println!(
        "RESULT {what} requests={} p50_ms={:.2} p99_ms={:.2} qps={:.0}",
        latencies.len(),
        pct(0.5),
        pct(0.99),
        latencies.len() as f64 / wall.as_secs_f64()
    );
}

/// The process's peak resident set size (VmHWM), in MB.
pub fn peak_rss_mb() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0)
}
