//! `longrank bench`: benchmarks (not tests), printing `RESULT` lines like the peers of ../shared/bench.
//! `search`: query latency in process, one thread, top-k (what the tantivy-py and bm25s peers measure), then
//! `/search` over HTTP at several client concurrencies (any pipeline) against a server in this process.
//! `model`: cross-encoder pairs/s on the peers' workload (the PyTorch and onnxruntime peers).

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
    /// Pipeline and depth of the HTTP runs.
    pub pipeline: &'a str,
    pub depth: usize,
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
            // Models load before the server is ready, so no timed request pays for loading one.
            let prepare = |state: &AppState| {
                for (name, reason) in state.engine().models().load_all() {
                    eprintln!("model {name} unavailable: {reason}");
                }
                Ok(())
            };
            server::serve(state, |addr| tx.send(addr).expect("address"), prepare).await
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
    let (pipeline, depth) = (b.pipeline.to_string(), b.depth);
    for &clients in b.clients {
        let deadline = Instant::now() + Duration::from_secs_f64(b.seconds);
        let started = Instant::now();
        let mut handles = Vec::new();
        for c in 0..clients {
            let (url, queries, collection, k) = (url.clone(), queries.clone(), b.collection.to_string(), b.http_k);
            let pipeline = pipeline.clone();
            handles.push(std::thread::spawn(move || -> anyhow::Result<Vec<Duration>> {
                let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(60)).build();
                let mut lat = Vec::new();
                let mut i = c * 7919;
                while Instant::now() < deadline {
                    let body = serde_json::json!({"query": queries[i % queries.len()], "k": k, "collection": collection,
                        "pipeline": pipeline, "depth": depth.max(k)});
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
            &format!(
                "longrank-http collection={} pipeline={} k={} depth={} clients={clients}",
                b.collection,
                b.pipeline,
                b.http_k,
                b.depth.max(b.http_k)
            ),
            &mut latencies,
            started.elapsed(),
        );
    }
    println!("RESULT longrank-http peak_rss_mb={:.0} (server and clients)", peak_rss_mb());
    Ok(())
}

/// The peers' workload (../shared/bench/peers_common.py): one query, passages long enough that every pair
/// is cut on the passage side to exactly L word pieces.
const QUERY: &str = "how do rust web servers batch inference requests for transformer rerankers on cpu";
const DOC: &str = "Cross-encoders score a query and a candidate passage jointly: the two texts are \
    concatenated with separator tokens, passed through every transformer layer together, and the \
    representation of the classification token is projected to a single relevance score. This is \
    more accurate than comparing independent embeddings, but it costs a full forward pass for every \
    query-passage pair, so serving systems batch many pairs, pad them to a common length, and spend \
    most of their time in dense matrix multiplications inside attention and feed-forward blocks. \
    Throughput therefore depends on sequence length, on how much padding is wasted, on the number of \
    threads that the matrix kernels can use, and on the numeric precision of the weights.";

fn peer_docs(batch: usize) -> Vec<String> {
    let words: Vec<&str> = DOC.split_whitespace().collect();
    (0..batch)
        .map(|k| {
            let d: Vec<&str> = (0..6)
                .flat_map(|r| (0..words.len()).map(move |j| (j, r)))
                .map(|(j, r)| words[(j + 7 * k + r) % words.len()])
                .collect();
            d.join(" ")
        })
        .collect()
}

/// FLOPs of one pair at length `l` for MiniLM-L6 (the peers' `flops_per_pair`).
fn flops_per_pair(l: usize) -> f64 {
    let (h, i, n, l) = (384.0, 1536.0, 6.0, l as f64);
    n * (8.0 * l * h * h + 4.0 * l * h * i + 4.0 * l * l * h) + 2.0 * h * h + 2.0 * h
}

pub struct ModelBench<'a> {
    pub dir: &'a Path,
    pub lengths: &'a [usize],
    pub batches: &'a [usize],
    pub warmup: usize,
    pub reps: usize,
    pub int8: bool,
}

/// Cross-encoder pairs/s: the model's forward pass on pre-tokenized batches, as the peers time theirs. A
/// backbone without a classifier (the shipped MiniLM) gets a seeded `Linear(hidden, 1)` head, as the peers'
/// `num_labels=1` adds one: the arithmetic is the same.
pub fn model(b: ModelBench) -> anyhow::Result<()> {
    use candle_core::{DType, Device};
    use longrank::model::TrainableCrossEncoder;
    let mut model = TrainableCrossEncoder::init(b.dir, &Device::Cpu, DType::F32, 0)?.snapshot()?;
    if b.int8 {
        model.quantize()?;
    }
    let system = if b.int8 { "longrank-candle-int8" } else { "longrank-candle" };
    println!("longrank candle threads={}", candle_core::utils::get_num_threads());
    for &length in b.lengths {
        for &batch in b.batches {
            let inputs = peer_docs(batch)
                .iter()
                .map(|doc| model.encode(QUERY, doc, length, length))
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(short) = inputs.iter().find(|e| e.ids.len() != length) {
                bail!("a pair has {} word pieces, not {length}: the model's inputs are shorter", short.ids.len());
            }
            for _ in 0..b.warmup {
                model.score(&inputs)?;
            }
            let mut times: Vec<f64> = (0..b.reps.max(1))
                .map(|_| {
                    let t = Instant::now();
                    model.score(&inputs).map(|_| t.elapsed().as_secs_f64())
                })
                .collect::<Result<_, _>>()?;
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let gflops = flops_per_pair(length) * batch as f64 / 1e9;
            println!(
                "RESULT system={system} len={length} batch={batch} batch_s med={median:.4} \
                 pairs_per_s_med={:.2} pairs_per_s_best={:.2} gflops_med={:.1} rss_mb={:.0}",
                batch as f64 / median,
                batch as f64 / times[0],
                gflops / median,
                peak_rss_mb()
            );
        }
    }
    Ok(())
}

pub struct TrainBench<'a> {
    pub dir: &'a Path,
    pub length: usize,
    pub batch: usize,
    pub warmup: usize,
    pub steps: usize,
}

/// One training step as the PyTorch peer times it (`peers_torch.py train`): the peers' pairs, the first half
/// positives and the second negatives, pairwise hinge, backward, AdamW over every weight.
pub fn train(b: TrainBench) -> anyhow::Result<()> {
    use candle_core::{DType, Device};
    use longrank::model::TrainableCrossEncoder;
    use longrank::train::AdamW;
    let model = TrainableCrossEncoder::init(b.dir, &Device::Cpu, DType::F32, 0)?;
    let inputs = peer_docs(b.batch)
        .iter()
        .map(|doc| model.encode(QUERY, doc, b.length, b.length))
        .collect::<Result<Vec<_>, _>>()?;
    let mut optimizer = AdamW::new(model.variables(), 0.01)?;
    let half = b.batch / 2;
    let mut totals = Vec::new();
    for step in 0..b.warmup + b.steps.max(1) {
        let t0 = Instant::now();
        let scores = model.forward(&inputs)?;
        let loss = ((scores.narrow(0, half, half)? - scores.narrow(0, 0, half)?)? + 1.0)?.relu()?.mean_all()?;
        let loss_value = loss.to_scalar::<f32>()?;
        let t1 = Instant::now();
        let grads = loss.backward()?;
        let vars = model.variables();
        let grads: Vec<_> = vars
            .iter()
            .map(|(n, v)| grads.get(v.as_tensor()).cloned().with_context(|| format!("no gradient for {n}")))
            .collect::<anyhow::Result<_>>()?;
        let t2 = Instant::now();
        optimizer.step(&grads, 2e-5)?;
        let t3 = Instant::now();
        let secs = |a: Instant, b: Instant| (b - a).as_secs_f64();
        println!(
            "step {step} loss={loss_value:.5} fwd={:.3}s bwd={:.3}s adamw={:.3}s total={:.3}s",
            secs(t0, t1),
            secs(t1, t2),
            secs(t2, t3),
            secs(t0, t3)
        );
        if step >= b.warmup {
            totals.push(secs(t0, t3));
        }
    }
    totals.sort_by(f64::total_cmp);
    let median = totals[totals.len() / 2];
    println!(
        "RESULT system=longrank-candle-train len={} batch={} step_s min={:.3} med={median:.3} max={:.3} \
         approx_gflops_med={:.1} peak_rss_mb={:.0}",
        b.length,
        b.batch,
        totals[0],
        totals[totals.len() - 1],
        3.0 * flops_per_pair(b.length) * b.batch as f64 / 1e9 / median,
        peak_rss_mb()
    );
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
