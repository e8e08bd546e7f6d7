-- idem report: Q1 (`reports/sqlite/duplicates.sql`) reads completed runs in
-- (processor, scope, start) order with the previous run's end and records. This partial
-- index holds exactly those, so Q1 is one ordered pass over it with no sort and no table
-- reads. Only completed runs enter it: skipped and failed runs (the guards' skip path)
-- cost nothing more to record.
CREATE INDEX IF NOT EXISTS processing_runs_completed
    ON processing_runs (processor_name, scope, started_at, finished_at, records_processed, status)
    WHERE status = 'completed';
