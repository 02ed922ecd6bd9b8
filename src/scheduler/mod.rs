//! The server's background services, apart from HTTP (as meilisearch keeps its index scheduler): batch jobs
//! (`jobs`: a topic at a time from the store's queue, shared by replicas) and collection tasks (`tasks`: index
//! builds, uploads, deletions, one at a time per collection) and the replicas' view of each other (`cluster`:
//! heartbeats, stranded jobs, cluster-wide settings). Routes submit to them and read their state; they
//! run on the engine and the store.

pub mod cluster;
pub mod jobs;
pub mod tasks;
