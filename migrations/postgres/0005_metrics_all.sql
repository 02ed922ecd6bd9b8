-- A job's mean metrics ({"all": {...}}) beside the whole, so lists read them without JSON functions.
ALTER TABLE jobs ADD COLUMN metrics_all TEXT;
