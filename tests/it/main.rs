//! Integration tests: one binary, one shared harness (`common`).

mod batch;
mod browser;
mod cli;
mod clients;
mod common;
mod corpus;
mod eval;
mod fixtures;
mod indexing;
mod model;
mod scoring;
mod server;
mod serving;
mod train;
