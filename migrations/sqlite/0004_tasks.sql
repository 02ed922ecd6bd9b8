-- Tasks that write collections (create, add documents, delete documents, delete), applied one at a time in id
-- order. An upload's file is stored in the data directory's uploads/ before its task row is written.

CREATE TABLE tasks (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    collection   TEXT NOT NULL,
    kind         TEXT NOT NULL,          -- create_collection, add_documents, delete_documents, delete_collection
    status       TEXT NOT NULL,          -- queued, running, succeeded, failed, cancelled
    input        TEXT NOT NULL,          -- JSON: what the task applies (an upload's file and format, docids)
    read         INTEGER NOT NULL DEFAULT 0,
    indexed      INTEGER NOT NULL DEFAULT 0,
    skipped      INTEGER NOT NULL DEFAULT 0,
    deleted      INTEGER NOT NULL DEFAULT 0,
    errors       TEXT NOT NULL DEFAULT '[]',  -- JSON: the first problems met, each with its position
    error        TEXT,                   -- why a failed task failed
    cancel_requested INTEGER NOT NULL DEFAULT 0,  -- a running task asked to stop (kept across a stop)
    enqueued_at  TEXT NOT NULL,
    started_at   TEXT,
    finished_at  TEXT
);

CREATE INDEX tasks_status ON tasks (status, id);
CREATE INDEX tasks_collection ON tasks (collection, id);
