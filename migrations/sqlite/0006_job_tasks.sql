-- The topics of batch jobs still to run, one row each, claimed by workers of any replica with a lease: `owner`
-- (a replica id) holds it until `lease_until` (ms since the epoch, the database's clock) and renews it while it
-- works; `attempt` counts the claims, so a commit under an older attempt is refused. A topic's commit deletes
-- its row and writes its run lines to job_topics in one transaction.
CREATE TABLE job_tasks (
    job_id       TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq          INTEGER NOT NULL,
    attempt      INTEGER NOT NULL DEFAULT 0,
    owner        TEXT,
    lease_until  INTEGER,
    PRIMARY KEY (job_id, seq)
);

-- Jobs left unfinished by an older version: their topics not yet run.
WITH RECURSIVE s(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM s WHERE n + 1 < (SELECT MAX(total) FROM jobs))
INSERT INTO job_tasks (job_id, seq)
SELECT j.id, s.n FROM jobs j JOIN s ON s.n < j.total
WHERE j.status IN ('queued', 'running')
  AND NOT EXISTS (SELECT 1 FROM job_topics t WHERE t.job_id = j.id AND t.seq = s.n);
