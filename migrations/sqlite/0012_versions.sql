-- Collection versions published to the object store (store.objects): each committed version's manifest (its
-- files with their SHA-256, JSON), the objects it lists, and every object uploaded with the store's clock when
-- a publish last relied on it (garbage collection spares objects a publish is about to list).
CREATE TABLE versions (
    id           INTEGER PRIMARY KEY AUTOINCREMENT,
    collection   TEXT NOT NULL,
    fingerprint  TEXT NOT NULL,          -- the index fingerprint; empty: the collection was deleted
    manifest     TEXT NOT NULL,
    created_ms   INTEGER NOT NULL
);
CREATE INDEX versions_by_collection ON versions (collection, id);

CREATE TABLE version_objects (
    version_id   INTEGER NOT NULL REFERENCES versions (id) ON DELETE CASCADE,
    sha256       TEXT NOT NULL,
    PRIMARY KEY (version_id, sha256)
);
CREATE INDEX version_objects_by_object ON version_objects (sha256);

CREATE TABLE objects (
    sha256       TEXT PRIMARY KEY,
    bytes        INTEGER NOT NULL,
    used_ms      INTEGER NOT NULL
);

-- The object store the versions are in (store.objects): one per database, so that a replica configured with
-- another is refused rather than told of objects it cannot find.
CREATE TABLE object_store (
    id           BIGINT PRIMARY KEY CHECK (id = 1),
    url          TEXT NOT NULL
);

-- The replica that writes the cluster's collections (the holder of PostgreSQL's advisory lock on the writer
-- key, released when its connection closes), and the URL the others forward uploads to.
CREATE TABLE cluster_writer (
    id           BIGINT PRIMARY KEY CHECK (id = 1),
    replica      TEXT NOT NULL,
    url          TEXT NOT NULL,
    since_ms     BIGINT NOT NULL
);
