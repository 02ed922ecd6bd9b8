//! Prometheus metrics: request counts and latency histograms per route, method and status, the size of
//! every collection, and the model side as text-embeddings-inference exposes it (queue, batch sizes and
//! tokens, inference and queue times, cache hits and misses, pairs computed). Rendered on `GET /metrics`.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use crate::histogram::{self, Histogram};
use crate::index::Catalog;
use crate::model::BatchStats;
use crate::rank::ModelStatus;

use super::query_log::Counts as QueryLogCounts;

#[derive(Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<(String, String, u16), Histogram>>,
}

impl Metrics {
    pub fn observe(&self, route: &str, method: &str, status: u16, latency: Duration) {
        let mut series = self.series.lock();
        let key = (route.to_string(), method.to_string(), status);
        series.entry(key).or_insert_with(|| Histogram::new(histogram::SECONDS)).observe(latency.as_secs_f64());
    }

    /// The Prometheus text exposition.
    /// This replica's identity, and its batch workers' counters labelled with its name.
    pub fn render_batch(
        &self,
        replica: &str,
        counters: &crate::scheduler::jobs::Counters,
        stranded: Option<i64>,
    ) -> String {
        let mut out = String::new();
        // The replica's name as a label every series of this target can be joined on (Prometheus's info idiom).
        let name = "longrank_replica_info";
        header(&mut out, name, "This replica's name (server.replica_id, else host:port) and version.", "gauge");
        let version = env!("CARGO_PKG_VERSION");
        let _ = writeln!(out, "{name}{{replica=\"{}\",version=\"{version}\"}} 1", escape(replica));
        let name = "longrank_batch_topics_total";
        header(&mut out, name, "Topics of batch jobs this replica's workers claimed, renewed the lease of, lost the lease of while running (expired), claimed again after another claim (retried), or had a commit refused for (fenced).", "counter");
        let events = [
            ("claimed", &counters.claimed),
            ("renewed", &counters.renewed),
            ("expired", &counters.expired),
            ("retried", &counters.retried),
            ("fenced", &counters.fenced),
        ];
        counter_series(&mut out, name, &format!("replica=\"{}\",event", escape(replica)), &events);
        if let Some(stranded) = stranded {
            let name = "longrank_batch_jobs_stranded";
            header(&mut out, name, "Unfinished batch jobs that no live replica can run (none serves the index files and model weights they were submitted against).", "gauge");
            let _ = writeln!(out, "{name} {stranded}");
        }
        out
    }

    /// What became of the searches handed to the query log, and how many wait for its writer.
    pub fn render_query_log(&self, counts: &QueryLogCounts, queued: usize) -> String {
        let mut out = String::new();
        let name = "longrank_query_log_entries_total";
        header(&mut out, name, "Searches handed to the query log: written, dropped with its queue full (server.query_log_queue), or dropped with their batch when the database refused it.", "counter");
        let outcomes = [
            ("written", &counts.written),
            ("dropped_full", &counts.dropped_full),
            ("dropped_failed", &counts.dropped_failed),
        ];
        counter_series(&mut out, name, "outcome", &outcomes);
        let name = "longrank_query_log_queued";
        header(&mut out, name, "Searches waiting for the query log's writer.", "gauge");
        let _ = writeln!(out, "{name} {queued}");
        out
    }

    pub fn render(&self, catalog: &Catalog, models: &[ModelStatus], waiting: usize, connections: usize) -> String {
        let mut out = String::new();
        let series = self.series.lock();
        let labels = |(route, method, status): &(String, String, u16)| {
            format!("route=\"{}\",method=\"{method}\",status=\"{status}\"", escape(route))
        };
        header(&mut out, "longrank_http_requests_total", "HTTP requests served.", "counter");
        for (key, h) in series.iter() {
            let _ = writeln!(out, "longrank_http_requests_total{{{}}} {}", labels(key), h.count());
        }
        header(&mut out, "longrank_http_request_duration_seconds", "Time to serve a request.", "histogram");
        for (key, h) in series.iter() {
            h.render(&mut out, "longrank_http_request_duration_seconds", &labels(key));
        }
        drop(series);
        let name = "longrank_requests_waiting";
        header(&mut out, name, "Requests waiting for a turn at the engine (server.max_concurrent_work).", "gauge");
        let _ = writeln!(out, "{name} {waiting}");
        let (gemm, library, threads) = crate::model::gemm_path();
        let name = "longrank_encoder_info";
        header(
            &mut out,
            name,
            "How the encoder's products run on the CPU (their last bits differ between paths).",
            "gauge",
        );
        let _ = writeln!(out, "{name}{{gemm=\"{gemm}\",library=\"{}\",threads=\"{threads}\"}} 1", escape(library));
        let name = "longrank_connections_open";
        header(&mut out, name, "Connections open (server.max_connections).", "gauge");
        let _ = writeln!(out, "{name} {connections}");
        let collections = catalog.all();
        header(&mut out, "longrank_collection_documents", "Live documents per collection.", "gauge");
        for c in &collections {
            let _ =
                writeln!(out, "longrank_collection_documents{{collection=\"{}\"}} {}", escape(c.name()), c.num_docs());
        }
        header(&mut out, "longrank_collection_size_bytes", "Index size on disk per collection.", "gauge");
        for c in &collections {
            let _ = writeln!(
                out,
                "longrank_collection_size_bytes{{collection=\"{}\"}} {}",
                escape(c.name()),
                c.size_bytes()
            );
        }

        // The model side, per configured model (loaded ones; the queue of every one).
        let name = "longrank_model_queue_inputs";
        header(&mut out, name, "Inputs waiting for the model.", "gauge");
        for m in models {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(&m.name), m.queued);
        }
        let loaded: Vec<(String, &BatchStats)> = models
            .iter()
            .filter_map(|m| Some((format!("model=\"{}\"", escape(&m.name)), m.batches.as_ref()?)))
            .collect();
        let counters: [Counter; 5] = [
            ("longrank_model_batches_total", "Forward passes.", |b| b.batches),
            ("longrank_model_shared_batches_total", "Forward passes that carried several requests' inputs.", |b| {
                b.shared
            }),
            ("longrank_model_pairs_total", "Pairs (or texts) the model computed.", |b| b.inputs),
            ("longrank_model_cache_hits_total", "Inputs answered without the model (caches, stored outputs).", |b| {
                b.cache_hits
            }),
            ("longrank_model_cache_misses_total", "Inputs the model had to compute.", |b| b.cache_misses),
        ];
        for (name, help, value) in counters {
            header(&mut out, name, help, "counter");
            for (labels, stats) in &loaded {
                let _ = writeln!(out, "{name}{{{labels}}} {}", value(stats));
            }
        }
        let histograms: [Histo; 4] = [
            ("longrank_model_batch_size", "Inputs per forward pass.", |b| &b.batch_size),
            ("longrank_model_batch_tokens", "Padded tokens per forward pass.", |b| &b.batch_tokens),
            ("longrank_model_inference_seconds", "Time of a forward pass.", |b| &b.inference_seconds),
            ("longrank_model_queue_seconds", "Time a request's inputs waited for their first pass.", |b| {
                &b.queue_seconds
            }),
        ];
        for (name, help, histogram) in histograms {
            header(&mut out, name, help, "histogram");
            for (labels, stats) in &loaded {
                histogram(stats).render(&mut out, name, labels);
            }
        }
        out
    }
}

/// A counter of the model side: its name, help text, and value.
type Counter = (&'static str, &'static str, fn(&BatchStats) -> u64);
/// A histogram of the model side.
type Histo = (&'static str, &'static str, fn(&BatchStats) -> &Histogram);

/// One line per (value of the last label, counter): `labels` ends with the last label's name.
fn counter_series(out: &mut String, name: &str, labels: &str, counters: &[(&str, &std::sync::atomic::AtomicU64)]) {
    for (value, count) in counters {
        let count = count.load(std::sync::atomic::Ordering::Relaxed);
        let _ = writeln!(out, "{name}{{{labels}=\"{value}\"}} {count}");
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

fn escape(label: &str) -> String {
    label.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative() {
        let m = Metrics::default();
        m.observe("/search", "GET", 200, Duration::from_millis(3));
        m.observe("/search", "GET", 200, Duration::from_millis(300));
        let dir = tempfile::tempdir().unwrap();
        let (catalog, _) = Catalog::open(dir.path()).unwrap();
        let text = m.render(&catalog, &[], 0, 0);
        assert!(text.contains("longrank_http_requests_total{route=\"/search\",method=\"GET\",status=\"200\"} 2"));
        assert!(text.contains("le=\"0.001\"} 0"));
        assert!(text.contains("le=\"0.005\"} 1"));
        assert!(text.contains("le=\"0.5\"} 2"));
        assert!(text.contains("le=\"+Inf\"} 2"));
    }
}
