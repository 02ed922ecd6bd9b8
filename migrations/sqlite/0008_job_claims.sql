-- When a topic of the job was first and last claimed (the database's milliseconds since the epoch): workers
-- claim from the job claimed longest ago, so running jobs share the workers round-robin instead of the oldest
-- holding them all; the first claim dates the job's start, for its ETA.
ALTER TABLE jobs ADD COLUMN claimed_ms BIGINT;
ALTER TABLE jobs ADD COLUMN started_ms BIGINT;
