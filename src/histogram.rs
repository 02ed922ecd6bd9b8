//! Prometheus histograms: cumulative buckets, a count and a sum, in the text exposition format. The HTTP
//! latencies (`server::metrics`) and the model side (`model::serve`: batch sizes, tokens, inference and queue
//! times) keep theirs with it.

use std::fmt::Write;

/// Seconds, from half a millisecond to ten seconds.
pub const SECONDS: &[f64] = &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];
/// Counts in powers of two, 1 to 1024 (inputs per forward pass).
pub const COUNTS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0];
/// Padded tokens per forward pass, 128 to 131,072.
pub const TOKENS: &[f64] = &[128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0, 65536.0, 131072.0];

#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations at most each bound (not yet cumulative).
    buckets: Vec<u64>,
    count: u64,
    sum: f64,
}

impl Histogram {
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, buckets: vec![0; bounds.len()], count: 0, sum: 0.0 }
    }

    pub fn observe(&mut self, value: f64) {
        self.count += 1;
        self.sum += value;
        if let Some(i) = self.bounds.iter().position(|&b| value <= b) {
            self.buckets[i] += 1;
        }
    }

    /// Adds another histogram of the same bounds.
    pub fn merge(&mut self, other: &Histogram) {
        debug_assert_eq!(self.bounds, other.bounds);
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.sum += other.sum;
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    /// The series of `name{labels}`: cumulative `_bucket`s with `le`, then `_sum` and `_count`.
    pub fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        let mut cumulative = 0;
        for (bound, n) in self.bounds.iter().zip(&self.buckets) {
            cumulative += n;
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{bound}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", self.count);
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_merge_adds() {
        let mut h = Histogram::new(COUNTS);
        for v in [1.0, 3.0, 3.0, 2000.0] {
            h.observe(v);
        }
        let mut other = Histogram::new(COUNTS);
        other.observe(8.0);
        h.merge(&other);
        let mut out = String::new();
        h.render(&mut out, "x", "model=\"m\"");
        assert!(out.contains("x_bucket{model=\"m\",le=\"1\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{model=\"m\",le=\"4\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{model=\"m\",le=\"8\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{model=\"m\",le=\"1024\"} 4\n"), "{out}");
        assert!(out.contains("x_bucket{model=\"m\",le=\"+Inf\"} 5\n"), "{out}");
        assert!(out.contains("x_sum{model=\"m\"} 2015\n") && out.contains("x_count{model=\"m\"} 5\n"), "{out}");
    }
}
