//! Serving a loaded model: `queue` (one inference thread per model, batching every request's inputs by a
//! padded-token budget), `served` (pairs in, scores out, through caches), `vectors` (model outputs kept on
//! disk per collection), `neighbours` (an approximate nearest-neighbour index over stored vectors).

pub mod neighbours;
pub mod queue;
pub mod served;
pub mod vectors;
