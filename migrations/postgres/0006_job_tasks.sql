-- The topics of batch jobs still to run, one row each, claimed by workers of any replica with a lease (see
-- migrations/sqlite/0006_job_tasks.sql).
CREATE TABLE job_tasks (
    job_id       TEXT NOT NULL REFERENCES jobs (id) ON DELETE CASCADE,
    seq          BIGINT NOT NULL,
    attempt      BIGINT NOT NULL DEFAULT 0,
    owner        TEXT,
    lease_until  BIGINT,
    PRIMARY KEY (job_id, seq)
);
