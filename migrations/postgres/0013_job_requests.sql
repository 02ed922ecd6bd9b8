-- A digest of what a keyed POST /batch asked (its parameters and files), as tasks keep one (0011): a repeat of
-- the Idempotency-Key is compared by digest, one scheme for jobs and tasks. Jobs keyed before this have none.
ALTER TABLE jobs ADD COLUMN request TEXT;
