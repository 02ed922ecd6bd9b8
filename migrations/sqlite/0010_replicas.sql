-- What each replica sharing the store serves, written by its heartbeat every second: jobs whose index files
-- and model weights no live replica serves are marked stranded (jobs.stranded_ms, since when), and failed
-- past batch.stranded_fail_after_ms. Cluster-wide settings (PUT /cluster/settings, one JSON document) override
-- the replicas' configuration without a restart.
CREATE TABLE replicas (
    id           TEXT PRIMARY KEY,
    fingerprints TEXT NOT NULL,          -- ",a,b,": the fingerprints of the collections it serves
    weights      TEXT NOT NULL,          -- ",a,b,": the weights hashes of its models
    started_at   TEXT NOT NULL,
    seen_ms      BIGINT NOT NULL         -- the store's clock at its last heartbeat
);

CREATE TABLE cluster_settings (
    id           BIGINT PRIMARY KEY CHECK (id = 1),
    value        TEXT NOT NULL,
    updated_at   TEXT NOT NULL
);

ALTER TABLE jobs ADD COLUMN stranded_ms BIGINT;
