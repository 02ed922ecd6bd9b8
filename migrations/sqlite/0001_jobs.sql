-- Batch jobs, their runs (one row per finished topic, so a job resumes from its last finished topic), and
-- the query log.

CREATE TABLE jobs (
    id          TEXT PRIMARY KEY,
    status      TEXT NOT NULL,          -- queued, running, done, failed, cancelled, interrupted
    created_at  TEXT NOT NULL,          -- RFC 3339
    updated_at  TEXT NOT NULL,
    params      TEXT NOT NULL,          -- JSON: the batch parameters as given
    topics      TEXT NOT NULL,          -- the topic file's content
    qrels       TEXT,                   -- the qrels file's content, when given
    provenance  TEXT NOT NULL,          -- JSON: effective configuration, index, model, version
    total       INTEGER NOT NULL,       -- topics to run
    warnings    TEXT NOT NULL DEFAULT '[]',
    metrics     TEXT,                   -- JSON: {all: {...}, per_topic: {...}}
    error       TEXT
);

CREATE INDEX jobs_created ON jobs (created_at);

CREATE TABLE job_topics (
    job_id  TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq     INTEGER NOT NULL,           -- the topic's position in the topic file
    qid     TEXT NOT NULL,
    run     TEXT NOT NULL,              -- the topic's lines of the TREC run file
    PRIMARY KEY (job_id, seq)
);

CREATE TABLE query_log (
    id          INTEGER PRIMARY KEY,
    at          TEXT NOT NULL,
    query       TEXT NOT NULL,
    collection  TEXT,
    pipeline    TEXT NOT NULL,
    latency_ms  REAL NOT NULL,
    results     INTEGER NOT NULL
);
