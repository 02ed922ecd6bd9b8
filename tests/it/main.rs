//! Integration tests: one binary, one shared harness (`common`).

mod batch;
mod browser;
mod cli;
mod clients;
mod collections;
mod common;
mod corpus;
mod decoders;
mod docker;
mod docs;
mod ecosystem;
mod eval;
mod families;
mod first_stage;
mod fixtures;
mod fuzz;
mod gpu;
mod indexing;
mod model;
mod objects;
mod preselect;
mod replicas;
mod scoring;
mod server;
mod serving;
mod train;
