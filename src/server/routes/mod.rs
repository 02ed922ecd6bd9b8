//! One thin handler file per API: parse, call the engine once, map the result.

pub mod batch;
pub mod collections;
pub mod compat;
pub mod documents;
pub mod pipelines;
pub mod rerank;
pub mod search;
pub mod system;
pub mod tasks;
pub mod web;
