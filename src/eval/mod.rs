//! Evaluation: TREC topics, qrels and runs (`formats`), trec_eval-exact measures (`measures`), paired
//! t-tests (`stats`), and run comparisons.

pub mod formats;
pub mod measures;
pub mod passages;
pub mod stats;
pub mod warnings;

use std::path::{Path, PathBuf};

use serde::Serialize;

pub use formats::{make_folds, read_folds, read_topics, PartialRun, Qrels, Run, Scored, Topic, TopicField};
pub use measures::{evaluate, EvalOptions, Evaluation, Measure};
pub use warnings::{Warning, WarningKind, Warnings};

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error("{}: {message}", path.display())]
    Io { path: PathBuf, message: String },
    #[error("{}:{line}: {message}", path.display())]
    Parse { path: PathBuf, line: usize, message: String },
    #[error("{0}")]
    Measure(String),
}

impl EvalError {
    pub fn parse(path: &Path, line: usize, message: &str) -> EvalError {
        EvalError::Parse { path: path.to_path_buf(), line, message: message.to_string() }
    }
}

/// One measure compared between two runs over the topics both were evaluated on.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Comparison {
    pub measure: String,
    pub topics: usize,
    pub mean_a: f64,
    pub mean_b: f64,
    /// mean_b - mean_a.
    pub delta: f64,
    /// Paired two-tailed t-test; null with fewer than two topics.
    pub p_value: Option<f64>,
    /// Topics where b beats a, ties, and where a beats b.
    pub wins: usize,
    pub ties: usize,
    pub losses: usize,
    /// Per-topic b - a, largest gain first.
    pub per_topic_delta: Vec<TopicDelta>,
}

/// One topic's b - a.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct TopicDelta {
    pub qid: String,
    pub delta: f64,
}

/// Compares two evaluations measure by measure (counts such as num_ret, and gm_map and gm_bpref, are skipped).
pub fn compare(a: &Evaluation, b: &Evaluation) -> Vec<Comparison> {
    let Some(names) = a.per_topic.values().next().map(|v| v.iter().map(|(m, _)| m.clone()).collect::<Vec<_>>()) else {
        return Vec::new();
    };
    names
        .into_iter()
        // Counts are not compared; gm_* per-topic values are logs (trec_eval), whose mean is no gm_* value.
        .filter(|m| !matches!(m.as_str(), "num_ret" | "num_rel" | "num_rel_ret") && !m.starts_with("gm_"))
        .map(|measure| {
            let (va, vb) = (a.topic_values(&measure), b.topic_values(&measure));
            let paired: Vec<(String, f64, f64)> =
                va.iter().filter_map(|(q, x)| vb.get(q).map(|y| (q.clone(), *x, *y))).collect();
            let n = paired.len();
            let mean = |f: &dyn Fn(&(String, f64, f64)) -> f64| {
                if n == 0 {
                    0.0
                } else {
                    paired.iter().map(f).sum::<f64>() / n as f64
                }
            };
            let (mean_a, mean_b) = (mean(&|p| p.1), mean(&|p| p.2));
            let xs: Vec<f64> = paired.iter().map(|p| p.1).collect();
            let ys: Vec<f64> = paired.iter().map(|p| p.2).collect();
            let mut per_topic_delta: Vec<TopicDelta> =
                paired.iter().map(|(q, x, y)| TopicDelta { qid: q.clone(), delta: y - x }).collect();
            per_topic_delta.sort_by(|x, y| y.delta.total_cmp(&x.delta).then_with(|| x.qid.cmp(&y.qid)));
            Comparison {
                topics: n,
                mean_a,
                mean_b,
                delta: mean_b - mean_a,
                p_value: stats::paired_t_test(&xs, &ys),
                wins: paired.iter().filter(|p| p.2 > p.1).count(),
                ties: paired.iter().filter(|p| p.2 == p.1).count(),
                losses: paired.iter().filter(|p| p.2 < p.1).count(),
                per_topic_delta,
                measure,
            }
        })
        .collect()
}
