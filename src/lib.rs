//! longrank: search and re-ranking for long documents. Data flows one way: `server` (and the CLI) -> `rank`
//! (the pipeline) -> `index` (BM25 over tantivy), `segment`, `model` (candle BERT); `train` fine-tunes models
//! through the same `rank` and `model` paths. ARCHITECTURE.md has a row for every file.
//!
//! | module | concept |
//! |---|---|
//! | `config` | settings, each declared once with its default |
//! | `corpus` | collections on disk: streaming readers of TREC SGML, GOV2 web bundles, JSONL, TSV |
//! | `index` | the first stage: tantivy indexes analyzed as Anserini does, BM25 and RM3 |
//! | `segment` | cutting documents into segments a model reads |
//! | `preselect` | which segments the model reads: a cheap selector's choice per candidate and per query |
//! | `model` | BERT-class models: loading, encoders, Co-BERT's heads, CPU kernels, serving queues |
//! | `rank` | the pipeline: parameters, validation, retrieval, re-ranking, batch runs |
//! | `eval` | topics, qrels, runs, trec_eval's measures, comparisons |
//! | `store` | the database (SQLite or PostgreSQL) of jobs, their topics' leases, tasks, the query log and collection versions |
//! | `replication` | collections through the object store: the writer's election, versions published, pulled by replicas, collected |
//! | `scheduler` | the server's background services: batch jobs and collection tasks |
//! | `server` | HTTP: routes, decoding, errors, middleware, metrics, OpenAPI |
//! | `train` | fine-tuning: FirstP, all segments, BeST, Co-BERT, a learned segment selector |
//! | `progress` | how long jobs report progress |
//! | `cancel` | cancelling work whose requester is gone or whose deadline passed |
//! | `hooks` | test hooks that hold the process at named points |
//! | `service` | every background service run one way: a loop on a thread of its own, woken by its period or a bell, stopped and joined at shutdown |
//! | `hash` | stable hashes (FNV-1a) for cache keys and fingerprints |
//! | `histogram` | Prometheus histograms for the server's and the model's metrics |
//! | `rng` | seeded random streams |
//! | `timestamp` | RFC 3339 timestamps |

pub mod cancel;
pub mod config;
pub mod corpus;
pub mod eval;
pub mod hash;
pub mod histogram;
pub mod hooks;
pub mod index;
pub mod model;
pub mod preselect;
pub mod progress;
pub mod rank;
pub mod replication;
pub mod rng;
pub mod scheduler;
pub mod segment;
pub mod server;
pub mod service;
pub mod store;
pub mod timestamp;
pub mod train;

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::path::Path;

    /// Rows of a Markdown table whose first cell is code: the code.
    fn first_cells(text: &str) -> BTreeSet<String> {
        text.lines()
            .filter_map(|l| l.trim_start_matches("//! ").strip_prefix("| `"))
            .filter_map(|l| l.split_once('`').map(|(cell, _)| cell.to_string()))
            .collect()
    }

    fn sources(dir: &Path, root: &Path, out: &mut BTreeSet<String>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                sources(&path, root, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.insert(path.strip_prefix(root).unwrap().to_string_lossy().replace('\\', "/"));
            }
        }
    }

    #[test]
    fn layout_tables_match_the_tree() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut files = BTreeSet::new();
        sources(&root.join("src"), root, &mut files);
        let architecture = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
        assert_eq!(first_cells(&architecture), files, "ARCHITECTURE.md's layout table against src/");
        let modules: BTreeSet<String> = include_str!("lib.rs")
            .lines()
            .filter_map(|l| l.strip_prefix("pub mod ")?.strip_suffix(';').map(String::from))
            .collect();
        assert_eq!(first_cells(include_str!("lib.rs")), modules, "lib.rs's table against its modules");
    }
}
