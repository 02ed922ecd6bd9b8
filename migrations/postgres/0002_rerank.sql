-- Batch jobs that re-rank the candidates of a given run keep that run, so they can resume after a restart.
ALTER TABLE jobs ADD COLUMN rerank TEXT;
