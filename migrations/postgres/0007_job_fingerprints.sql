-- What a job may run on: the fingerprint of the collection's index files it was submitted against, and the
-- weights hash of its model (NULL for first-stage pipelines). A replica serving another copy or model leaves
-- its topics to the others.
ALTER TABLE jobs ADD COLUMN fingerprint TEXT;
ALTER TABLE jobs ADD COLUMN weights TEXT;
