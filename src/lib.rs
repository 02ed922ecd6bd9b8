//! longrank: search and re-ranking for long documents.
//!
//! Data flows one way: `server` -> `rank` (the pipeline) -> `index` (BM25 over tantivy); `corpus` reads
//! collections for the indexer. See ARCHITECTURE.md.

pub mod config;
pub mod corpus;
pub mod eval;
pub mod index;
pub mod jobs;
pub mod model;
pub mod rank;
pub mod rng;
pub mod segment;
pub mod server;
pub mod store;
pub mod train;
