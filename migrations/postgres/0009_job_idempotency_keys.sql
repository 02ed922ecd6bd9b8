-- The client's Idempotency-Key of a POST /batch: a repeat with the same key (a client's or a proxy's retry)
-- answers the first job instead of creating another. Kept as long as the job is.
ALTER TABLE jobs ADD COLUMN idempotency_key TEXT;
CREATE UNIQUE INDEX jobs_idempotency_key ON jobs (idempotency_key);
