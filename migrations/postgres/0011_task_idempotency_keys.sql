-- The client's Idempotency-Key of a collection write, and a digest of what the request asked (the route, its
-- parameters, an upload's bytes): a repeat answers the first task instead of queueing another.
ALTER TABLE tasks ADD COLUMN idempotency_key TEXT;
ALTER TABLE tasks ADD COLUMN request TEXT;
CREATE UNIQUE INDEX tasks_idempotency_key ON tasks (idempotency_key);
