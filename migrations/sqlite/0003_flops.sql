-- What the model's passes cost each topic of a batch job (NULL for first-stage pipelines).
ALTER TABLE job_topics ADD COLUMN flops REAL;
