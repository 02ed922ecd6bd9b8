-- A job's mean metrics ({"all": {...}}) beside the whole, so lists read them without JSON functions (the same
-- query then serves PostgreSQL).
ALTER TABLE jobs ADD COLUMN metrics_all TEXT;
UPDATE jobs SET metrics_all = json_object('all', json(json_extract(metrics, '$.all'))) WHERE metrics IS NOT NULL;
