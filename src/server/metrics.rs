//! Prometheus metrics: request counts and latency histograms per route, method and status, and the size
//! of every collection. Kept small and dependency-free; rendered on `GET /metrics`.

use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use crate::index::Catalog;
use crate::model::BatchStats;
use crate::rank::ModelStatus;

/// Latency bucket bounds, seconds.
const BUCKETS: [f64; 14] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

#[derive(Default)]
struct Series {
    buckets: [u64; BUCKETS.len()],
    count: u64,
    sum: f64,
}

#[derive(Default)]
pub struct Metrics {
    series: Mutex<BTreeMap<(String, String, u16), Series>>,
}

impl Metrics {
    pub fn observe(&self, route: &str, method: &str, status: u16, latency: Duration) {
        let secs = latency.as_secs_f64();
        let mut series = self.series.lock();
        let s = series.entry((route.to_string(), method.to_string(), status)).or_default();
        s.count += 1;
        s.sum += secs;
        for (bucket, bound) in s.buckets.iter_mut().zip(BUCKETS) {
            if secs <= bound {
                *bucket += 1;
            }
        }
    }

    /// The Prometheus text exposition.
    pub fn render(&self, catalog: &Catalog, models: &[ModelStatus]) -> String {
        let mut out = String::new();
        let series = self.series.lock();
        out.push_str("# HELP longrank_http_requests_total HTTP requests served.\n");
        out.push_str("# TYPE longrank_http_requests_total counter\n");
        for ((route, method, status), s) in series.iter() {
            let _ = writeln!(
                out,
                "longrank_http_requests_total{{route=\"{}\",method=\"{method}\",status=\"{status}\"}} {}",
                escape(route),
                s.count
            );
        }
        out.push_str("# HELP longrank_http_request_duration_seconds Time to serve a request.\n");
        out.push_str("# TYPE longrank_http_request_duration_seconds histogram\n");
        for ((route, method, status), s) in series.iter() {
            let labels = format!("route=\"{}\",method=\"{method}\",status=\"{status}\"", escape(route));
            for (bound, n) in BUCKETS.iter().zip(s.buckets) {
                let _ = writeln!(out, "longrank_http_request_duration_seconds_bucket{{{labels},le=\"{bound}\"}} {n}");
            }
            let _ = writeln!(out, "longrank_http_request_duration_seconds_bucket{{{labels},le=\"+Inf\"}} {}", s.count);
            let _ = writeln!(out, "longrank_http_request_duration_seconds_sum{{{labels}}} {}", s.sum);
            let _ = writeln!(out, "longrank_http_request_duration_seconds_count{{{labels}}} {}", s.count);
        }
        drop(series);
        out.push_str("# HELP longrank_collection_documents Live documents per collection.\n");
        out.push_str("# TYPE longrank_collection_documents gauge\n");
        let collections = catalog.all();
        for c in &collections {
            let _ =
                writeln!(out, "longrank_collection_documents{{collection=\"{}\"}} {}", escape(c.name()), c.num_docs());
        }
        out.push_str("# HELP longrank_collection_size_bytes Index size on disk per collection.\n");
        out.push_str("# TYPE longrank_collection_size_bytes gauge\n");
        for c in &collections {
            let _ = writeln!(
                out,
                "longrank_collection_size_bytes{{collection=\"{}\"}} {}",
                escape(c.name()),
                c.size_bytes()
            );
        }
        let counters: [Counter; 3] = [
            ("longrank_model_batches_total", "Forward passes per model.", |b| b.batches),
            ("longrank_model_batch_inputs_total", "Inputs the forward passes carried.", |b| b.inputs),
            (
                "longrank_model_shared_batches_total",
                "Forward passes that carried the inputs of several requests.",
                |b| b.shared,
            ),
        ];
        for (name, help, value) in counters {
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter");
            for m in models {
                if let Some(stats) = &m.batches {
                    let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", escape(&m.name), value(stats));
                }
            }
        }
        out
    }
}

/// A counter of the model side: its name, help text, and value.
type Counter = (&'static str, &'static str, fn(&BatchStats) -> u64);

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
        let text = m.render(&catalog, &[]);
        assert!(text.contains("longrank_http_requests_total{route=\"/search\",method=\"GET\",status=\"200\"} 2"));
        assert!(text.contains("le=\"0.001\"} 0"));
        assert!(text.contains("le=\"0.005\"} 1"));
        assert!(text.contains("le=\"0.5\"} 2"));
        assert!(text.contains("le=\"+Inf\"} 2"));
    }
}
