//! `longrank bench`: benchmarks (not tests), printing `RESULT` lines like the peers of ../shared/bench.
//! `search`: query latency in process, one thread, top-k (what the tantivy-py and bm25s peers measure), then
//! `/search` over HTTP at several client concurrencies (any pipeline) against a server in this process.
//! `model`: cross-encoder pairs/s on the peers' workload (the PyTorch and onnxruntime peers).
//! `dense`: the dense first stage's exact search against its vector index at several collection sizes.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use longrank::config::Config;
use longrank::index::Catalog;
use longrank::preselect::Preselect;
use longrank::server::{self, AppState};

#[derive(clap::Subcommand)]
pub enum BenchCommand {
    /// Query latency p50/p99 and queries/s: in process on one thread, then `/search` over HTTP.
    Search(SearchBench),
    /// Cross-encoder pairs/s on the workload of ../shared/bench (same inputs as its PyTorch and onnxruntime
    /// peers).
    Model(ModelBench),
    /// One training step (pairwise hinge, AdamW over every weight) on the workload of ../shared/bench, as its
    /// PyTorch peer (`peers_torch.py train`) times it.
    Train(TrainBench),
    /// The dense first stage at scale: exact search and the vector index over synthetic segment vectors drawn
    /// around real ones (query time, recall of exact search's documents, index build time, size, memory).
    Dense(DenseBench),
}

/// `before`: the configuration flags given before `bench`.
pub fn run(command: BenchCommand, before: &super::Global) -> anyhow::Result<()> {
    match command {
        BenchCommand::Search(b) => {
            let (config, _) = b.global.clone().or(before).config()?;
            search(b, config)
        }
        BenchCommand::Model(b) => model(b),
        BenchCommand::Train(b) => train(b),
        BenchCommand::Dense(b) => dense(b),
    }
}

#[derive(clap::Args)]
pub struct SearchBench {
    #[command(flatten)]
    pub global: super::Global,
    /// The collection to query.
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
    /// First stage of the HTTP runs: `bm25`, `dense` or `hybrid` (`first_stage`).
    #[arg(long, default_value = "bm25")]
    first_stage: String,
    /// The HTTP requests' `preselect`, as JSON (`'{"selector": "bm25", "per_doc": 2}'`)
    /// [default: none, the server's `[model.preselect]`].
    #[arg(long, value_parser = longrank::rank::json_arg::<Preselect>, value_name = "JSON")]
    preselect: Option<Preselect>,
    /// A running server to load instead (`http://HOST:PORT`): no in-process runs, no server of its own
    /// [default: none].
    #[arg(long)]
    url: Option<String>,
    /// The process id of the `--url` server: its resident memory is sampled during each run (the peak) and
    /// `--settle` seconds after the last [default: none].
    #[arg(long)]
    pid: Option<u32>,
    /// Seconds after the last run before the settled memory sample (with `--pid`).
    #[arg(long, default_value_t = 60.0)]
    settle: f64,
}

fn search(b: SearchBench, config: Config) -> anyhow::Result<()> {
    let queries: Vec<String> = longrank::eval::read_topics(&b.topics)?.into_iter().map(|t| t.title).collect();
    let base = match &b.url {
        Some(url) => url.trim_end_matches('/').to_string(),
        None => {
            in_process(&b, &config, &queries)?;
            format!("http://{}", start_server(&b, config)?)
        }
    };
    let url = format!("{base}/search");
    let (pipeline, depth, first_stage) = (b.pipeline.to_string(), b.depth, b.first_stage.clone());
    let preselect = b.preselect.as_ref().map(serde_json::to_value).transpose()?;
    // Resident memory, and of it the heap (the rest is mapped index files: page cache).
    let memory = |pid: u32| format!("rss_mb={:.0} heap_mb={:.0}", rss_mb(pid, "VmRSS:"), rss_mb(pid, "RssAnon:"));
    if let Some(pid) = b.pid {
        println!("RESULT server pid={pid} before_load {}", memory(pid));
    }
    for &clients in &b.clients {
        let deadline = Instant::now() + Duration::from_secs_f64(b.seconds);
        let sampler = b.pid.map(|pid| std::thread::spawn(move || peak_rss_until(pid, deadline)));
        let started = Instant::now();
        let mut handles = Vec::new();
        for c in 0..clients {
            let (url, queries, collection, k) = (url.clone(), queries.clone(), b.collection.clone(), b.http_k);
            let (pipeline, preselect, first_stage) = (pipeline.clone(), preselect.clone(), first_stage.clone());
            handles.push(std::thread::spawn(move || -> anyhow::Result<(Vec<Duration>, usize)> {
                let agent = ureq::AgentBuilder::new().timeout(Duration::from_secs(300)).build();
                let (mut lat, mut refused) = (Vec::new(), 0);
                let mut i = c * 7919;
                while Instant::now() < deadline {
                    let mut body = serde_json::json!({"query": queries[i % queries.len()], "k": k,
                        "collection": collection, "pipeline": pipeline, "depth": depth.max(k),
                        "first_stage": first_stage});
                    if let Some(preselect) = &preselect {
                        body["preselect"] = preselect.clone();
                    }
                    let t = Instant::now();
                    match agent.post(&url).send_json(body) {
                        Ok(answer) => {
                            answer.into_string()?;
                            lat.push(t.elapsed());
                        }
                        // Refused at capacity: counted, and the client backs off as Retry-After asks.
                        Err(ureq::Error::Status(429 | 503, answer)) => {
                            refused += 1;
                            let wait = answer.header("retry-after").and_then(|s| s.parse().ok()).unwrap_or(1);
                            std::thread::sleep(Duration::from_secs(wait).min(deadline - Instant::now().min(deadline)));
                        }
                        Err(e) => return Err(e.into()),
                    }
                    i += 1;
                }
                Ok((lat, refused))
            }));
        }
        let (mut latencies, mut refused) = (Vec::new(), 0);
        for h in handles {
            let (lat, r) = h.join().map_err(|_| anyhow::anyhow!("client panicked"))??;
            latencies.extend(lat);
            refused += r;
        }
        let what = format!(
            "longrank-http collection={} first_stage={} pipeline={} preselect={} k={} depth={} clients={clients} \
             refused={refused}",
            b.collection,
            b.first_stage,
            b.pipeline,
            preselect.as_ref().map_or("default".to_string(), |p| p.to_string()),
            b.http_k,
            b.depth.max(b.http_k)
        );
        report(&what, &mut latencies, started.elapsed());
        if let Some(sampler) = sampler {
            let peak = sampler.join().map_err(|_| anyhow::anyhow!("sampler panicked"))?;
            println!("RESULT server pid={} clients={clients} peak_rss_mb={peak:.0}", b.pid.unwrap_or_default());
        }
    }
    match b.pid {
        Some(pid) => {
            std::thread::sleep(Duration::from_secs_f64(b.settle));
            println!("RESULT server pid={pid} settled_after_s={} {}", b.settle, memory(pid));
        }
        None if b.url.is_none() => {
            println!("RESULT longrank-http peak_rss_mb={:.0} (server and clients)", peak_rss_mb())
        }
        None => {}
    }
    Ok(())
}

/// In process, one thread: warm up once, then time every topic.
fn in_process(b: &SearchBench, config: &Config, queries: &[String]) -> anyhow::Result<()> {
    let (catalog, _) = Catalog::open(&config.data_dir)?;
    let collection = catalog.get(&b.collection)?;
    for q in queries {
        collection.snapshot().search(q, b.k, config.bm25)?;
    }
    let mut latencies = Vec::with_capacity(queries.len());
    let started = Instant::now();
    for q in queries {
        let t = Instant::now();
        collection.snapshot().search(q, b.k, config.bm25)?;
        latencies.push(t.elapsed());
    }
    report(&format!("longrank-index collection={} k={}", b.collection, b.k), &mut latencies, started.elapsed());
    // Before the HTTP runs, whose client threads live in this process too.
    println!("RESULT longrank-index peak_rss_mb={:.0}", peak_rss_mb());
    Ok(())
}

/// A server in this process, ready; its address.
fn start_server(b: &SearchBench, mut config: Config) -> anyhow::Result<std::net::SocketAddr> {
    let (catalog, _) = Catalog::open(&config.data_dir)?;
    let catalog = Arc::new(catalog);
    config.server.addr = "127.0.0.1:0".into();
    config.limits.max_k = config.limits.max_k.max(b.http_k);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("runtime");
        let served = runtime.block_on(async move {
            let state = AppState::new(config.clone(), catalog, super::open_store(&config).await?, None);
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
    Ok(addr)
}

/// A process's resident memory, sampled every 20 ms until `deadline`: the highest seen, MB.
fn peak_rss_until(pid: u32, deadline: Instant) -> f64 {
    let mut peak: f64 = 0.0;
    while Instant::now() < deadline {
        peak = peak.max(rss_mb(pid, "VmRSS:"));
        std::thread::sleep(Duration::from_millis(20));
    }
    peak
}

/// A `/proc/PID/status` memory line (`VmRSS:`, `VmHWM:`), MB.
fn rss_mb(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| s.lines().find(|l| l.starts_with(field)).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()))
        .map_or(0.0, |kb: f64| kb / 1024.0)
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

#[derive(clap::Args)]
pub struct ModelBench {
    /// A Hugging Face cross-encoder directory of any family, or a BERT backbone (a head is added when it has
    /// none).
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
    /// int8 linear layers (as `quantize = "int8"` in configuration; CPU only).
    #[arg(long)]
    int8: bool,
    /// `cpu`, `cuda` or `cuda:N`, as `model.device`.
    #[arg(long, default_value = "cpu")]
    device: String,
    /// `f32`, `f16`, `bf16` or `auto` (f16 on a GPU, f32 on the CPU), as `model.dtype`.
    #[arg(long, default_value = "auto")]
    dtype: String,
    /// Also score a check batch at the first length (pairs shorter than it, padded, and longer ones, truncated)
    /// as one batch and write its word pieces and scores to this JSON file, for another system to score the
    /// same inputs [default: none].
    #[arg(long, value_name = "FILE")]
    check: Option<PathBuf>,
}

/// What `bench model --check` writes: the inputs, as word pieces, and the model's scores of them.
#[derive(serde::Serialize)]
struct CheckBatch {
    device: String,
    dtype: String,
    length: usize,
    ids: Vec<Vec<u32>>,
    type_ids: Vec<Vec<u32>>,
    /// The whole batch in one forward pass (padded to its longest pair).
    scores: Vec<f32>,
}

/// The check batch's documents: from one word to more than the input holds, so that with the query cut to half
/// the input some pairs are padded and some truncated.
fn check_docs() -> Vec<String> {
    let words: Vec<&str> = DOC.split_whitespace().collect();
    [1, 3, 9, 17, 40, 64, 100, 250, 400, 800]
        .iter()
        .enumerate()
        .map(|(k, &n)| (0..n).map(|j| words[(j * 5 + k) % words.len()]).collect::<Vec<_>>().join(" "))
        .collect()
}

/// Cross-encoder pairs/s: the model's forward pass on pre-tokenized batches, as the peers time theirs. A
/// sequence classifier of any family loads as it is served; a BERT backbone without a classifier (the shipped
/// MiniLM) gets a seeded `Linear(hidden, 1)` head, as the peers' `num_labels=1` adds one: the arithmetic is
/// the same.
fn model(b: ModelBench) -> anyhow::Result<()> {
    use candle_core::{DType, Device};
    use longrank::model::{self, CrossEncoder, TrainableEncoder};
    let device = model::device(&b.device)?;
    let dtype = model::dtype(&b.dtype, &device)?;
    let headless = || TrainableEncoder::init(&b.dir, &Device::Cpu, DType::F32, 0)?.snapshot_on(&device, dtype);
    // When neither loads, the classifier's reason is the one to read.
    let mut scorer = CrossEncoder::load(&b.dir, &device, dtype, None).or_else(|first| headless().map_err(|_| first))?;
    if b.int8 {
        scorer.quantize()?;
    }
    let system = if b.int8 { "longrank-candle-int8" } else { "longrank-candle" };
    let dtype_name = format!("{dtype:?}").to_lowercase();
    println!(
        "longrank candle device={} dtype={dtype_name} threads={}",
        b.device,
        candle_core::utils::get_num_threads()
    );
    if let (Some(path), Some(&length)) = (&b.check, b.lengths.first()) {
        let inputs = check_docs()
            .iter()
            .map(|doc| scorer.encode(QUERY, doc, length, length / 2))
            .collect::<Result<Vec<_>, _>>()?;
        let check = CheckBatch {
            device: b.device.clone(),
            dtype: dtype_name.clone(),
            length,
            scores: scorer.score(&inputs)?,
            ids: inputs.iter().map(|e| e.ids.clone()).collect(),
            type_ids: inputs.iter().map(|e| e.type_ids.clone()).collect(),
        };
        std::fs::write(path, serde_json::to_vec(&check)?).with_context(|| format!("writing {}", path.display()))?;
    }
    for &length in &b.lengths {
        for &batch in &b.batches {
            // The peers' documents, repeated past `length` of the model's tokens so that long inputs fill up
            // whatever the tokenizer. Each input is computed whole, as the peers compute theirs: a decoder's
            // prompt prefix, which serving computes once per query, is computed for every pair here.
            let inputs = peer_docs(batch)
                .iter()
                .map(|doc| {
                    let copies = length.div_ceil(scorer.count_tokens(doc)?.max(1));
                    let encoded = scorer.encode(QUERY, &[doc.as_str()].repeat(copies + 1).join(" "), length, length)?;
                    Ok(model::Encoded { shared_prefix: 0, ..encoded })
                })
                .collect::<Result<Vec<_>, model::ModelError>>()?;
            if let Some(short) = inputs.iter().find(|e| e.ids.len() != length) {
                bail!("a pair has {} word pieces, not {length}: the model's inputs are shorter", short.ids.len());
            }
            for _ in 0..b.warmup {
                scorer.score(&inputs)?;
            }
            let mut times: Vec<f64> = (0..b.reps.max(1))
                .map(|_| {
                    let t = Instant::now();
                    scorer.score(&inputs).map(|_| t.elapsed().as_secs_f64())
                })
                .collect::<Result<_, _>>()?;
            times.sort_by(f64::total_cmp);
            let median = times[times.len() / 2];
            let gflops = scorer.pair_flops(length) * batch as f64 / 1e9;
            println!(
                "RESULT system={system} len={length} batch={batch} batch_s med={median:.4} \
                 pairs_per_s_med={:.2} pairs_per_s_best={:.2} gflops_med={:.1} rss_mb={:.0} device={} \
                 dtype={dtype_name}",
                batch as f64 / median,
                batch as f64 / times[0],
                gflops / median,
                peak_rss_mb(),
                b.device,
            );
        }
    }
    Ok(())
}

#[derive(clap::Args)]
pub struct TrainBench {
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
    /// `cpu`, `cuda` or `cuda:N`, as `model.device` (training is in f32).
    #[arg(long, default_value = "cpu")]
    device: String,
    /// Drop as `longrank train --dropout` does (each step's masks seeded by its number), as the PyTorch peer
    /// trains (in `train()` mode).
    #[arg(long)]
    dropout: bool,
}

/// One training step as the PyTorch peer times it (`peers_torch.py train`): the peers' pairs, the first half
/// positives and the second negatives, pairwise hinge, backward, AdamW over every weight.
fn train(b: TrainBench) -> anyhow::Result<()> {
    use candle_core::DType;
    use longrank::model::TrainableEncoder;
    use longrank::train::AdamW;
    super::memory::keep_freed_memory();
    let device = longrank::model::device(&b.device)?;
    let model = TrainableEncoder::init(&b.dir, &device, DType::F32, 0)?;
    let pair_flops = model.snapshot()?.pair_flops(b.length);
    let inputs = peer_docs(b.batch)
        .iter()
        .map(|doc| model.encode(QUERY, doc, b.length, b.length))
        .collect::<Result<Vec<_>, _>>()?;
    let mut optimizer = AdamW::new(model.variables(), 0.01)?;
    let half = b.batch / 2;
    let mut totals = Vec::new();
    for step in 0..b.warmup + b.steps.max(1) {
        let t0 = Instant::now();
        if b.dropout {
            model.dropout().start(step as u64);
        }
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
         approx_gflops_med={:.1} peak_rss_mb={:.0} device={}",
        b.length,
        b.batch,
        totals[0],
        totals[totals.len() - 1],
        3.0 * pair_flops * b.batch as f64 / 1e9 / median,
        peak_rss_mb(),
        b.device,
    );
    Ok(())
}

#[derive(clap::Args)]
pub struct DenseBench {
    /// Real segment embeddings to draw around: a vector file `longrank embed` wrote
    /// (`collections/NAME/embeddings/MODEL.f32`).
    #[arg(long)]
    vectors: PathBuf,
    /// Their dimensions.
    #[arg(long, default_value_t = 384)]
    dims: usize,
    /// Collection sizes, in segments.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000,1000000")]
    segments: Vec<usize>,
    /// Segments per document.
    #[arg(long, default_value_t = 4)]
    per_doc: usize,
    /// Queries per size.
    #[arg(long, default_value_t = 200)]
    queries: usize,
    /// Other queries run first each way, unmeasured: the graph and the vectors are mapped files, resident as
    /// touched, so a server's first queries after opening a collection pay its page faults and later ones do not.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Documents per query (the first stage's depth).
    #[arg(short, long, default_value_t = 100)]
    k: usize,
    /// Keep each size's vectors and index in `DIR/SEGMENTS/`, and take them from there when a run left them
    /// whole (the build is the slow part: about 40 minutes a million segments here); by default they go to a
    /// temporary directory, removed after.
    #[arg(long, value_name = "DIR")]
    keep: Option<PathBuf>,
}

/// Segment i is real vector i, and past the real ones, real vector i (cycled) mixed with a random other
/// (weight 0.2 to 0.8) plus seeded noise of length 0.05: distinct vectors that keep the structure of real
/// embeddings (Gaussian noise alone, of any useful size, fills all 384 dimensions and makes every collection
/// of a million look random). Queries are such mixtures too, not in the collection.
fn dense(b: DenseBench) -> anyhow::Result<()> {
    use longrank::model::{Neighbours, VectorFile};
    use longrank::rank::SegmentVectors;
    let bytes = std::fs::read(&b.vectors).with_context(|| b.vectors.display().to_string())?;
    let real: Vec<f32> = bytes.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().expect("4 bytes"))).collect();
    let (dims, reals) = (b.dims, real.len() / b.dims);
    anyhow::ensure!(
        reals > 0 && real.len().is_multiple_of(dims),
        "{}: not {dims}-dimensional vectors",
        b.vectors.display()
    );
    let sigma = 0.05 / (dims as f64).sqrt();
    // Each vector from its own stream: the same at every collection size.
    let draw = |i: usize| -> Vec<f32> {
        let v = &real[(i % reals) * dims..(i % reals + 1) * dims];
        if i < reals {
            return v.to_vec();
        }
        let mut rng = longrank::rng::Rng::stream(17, i as u64);
        let other = rng.below(reals);
        let weight = 0.2 + 0.6 * rng.uniform() as f32;
        let w = &real[other * dims..(other + 1) * dims];
        v.iter().zip(w).map(|(x, y)| x + weight * y + (sigma * rng.normal()) as f32).collect()
    };
    // Streams no collection size reaches.
    let queries: Vec<Vec<f32>> = (0..b.queries).map(|q| draw((1 << 40) + q * 7919)).collect();
    let warmup: Vec<Vec<f32>> = (0..b.warmup).map(|q| draw((1 << 41) + q * 7919)).collect();
    for &segments in &b.segments {
        let dir = match &b.keep {
            Some(keep) => keep.join(segments.to_string()),
            None => std::env::temp_dir().join(format!("longrank-bench-dense-{}", std::process::id())),
        };
        let file = Arc::new(VectorFile::open(&dir, "bench-f32", dims)?);
        for i in file.records()? as usize..segments {
            file.append(i as u64, &draw(i))?;
        }
        let started = Instant::now();
        let (added, _) = Neighbours::update(&file, "bench", 0, &|_| {})?;
        // A kept index already whole: no build measured.
        let build_s = if added > 0 { started.elapsed().as_secs_f64() } else { f64::NAN };
        let index_mb = std::fs::metadata(dir.join("bench-f32.usearch"))?.len() as f64 / 1e6;
        let documents = segments / b.per_doc;
        let records: Vec<u64> = (0..(documents * b.per_doc) as u64).collect();
        let starts: Vec<usize> = (0..=documents).map(|d| d * b.per_doc).collect();
        let docs = || (0..documents).map(|d| (tantivy::DocAddress::new(0, d as u32), format!("{d:08}"))).collect();
        // Resident memory each way takes once its queries ran, from what was resident once the memory freed
        // before had gone back to the kernel: all of it (the index's graph and the vectors are mapped files,
        // resident as touched, and the kernel's to drop), and the heap alone.
        let rss = || {
            super::memory::release_thread_memory();
            (rss_mb(std::process::id(), "VmRSS:"), rss_mb(std::process::id(), "RssAnon:"))
        };
        let (before, mut index_ms, mut answers) = (rss(), vec![], vec![]);
        let index = SegmentVectors::new(&file, "bench", records.clone(), starts.clone(), docs(), 0)?;
        for query in &warmup {
            index.search(query, b.k)?;
        }
        for query in &queries {
            let started = Instant::now();
            answers.push(index.search(query, b.k)?);
            index_ms.push(started.elapsed());
        }
        let grown = |before: (f64, f64)| {
            let after = rss();
            (after.0 - before.0, after.1 - before.1)
        };
        let index_rss = grown(before);
        let (before, mut exact_ms, mut found) = (rss(), vec![], 0);
        let exact = SegmentVectors::new(&file, "bench", records, starts, docs(), usize::MAX)?;
        for query in &warmup {
            exact.search(query, b.k)?;
        }
        for (query, got) in queries.iter().zip(&answers) {
            let started = Instant::now();
            let want = exact.search(query, b.k)?;
            exact_ms.push(started.elapsed());
            let got: std::collections::HashSet<_> = got.iter().map(|h| &h.docid).collect();
            found += want.iter().filter(|h| got.contains(&h.docid)).count();
        }
        let exact_rss = grown(before);
        drop((index, exact, file));
        if b.keep.is_none() {
            std::fs::remove_dir_all(&dir)?;
        }
        let p50 = |times: &mut Vec<Duration>| {
            times.sort();
            times[times.len() / 2].as_secs_f64() * 1e3
        };
        println!(
            "RESULT dense segments={segments} documents={documents} k={} build_s={build_s:.1} index_mb={index_mb:.0} \
             exact_p50_ms={:.2} index_p50_ms={:.2} recall_at_k={:.4} exact_rss_mb={:.0} exact_heap_mb={:.0} \
             index_rss_mb={:.0} index_heap_mb={:.0}",
            b.k,
            p50(&mut exact_ms),
            p50(&mut index_ms),
            found as f64 / (b.k.min(documents) * queries.len()) as f64,
            exact_rss.0,
            exact_rss.1,
            index_rss.0,
            index_rss.1,
        );
    }
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
    rss_mb(std::process::id(), "VmHWM:")
}
