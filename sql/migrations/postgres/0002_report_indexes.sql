-- idem report: Q1 (`reports/postgres/duplicates.sql`) reads completed runs in
-- (processor, scope, start) order with the previous run's end and records. This partial
-- covering index holds exactly those, so Q1 is an index-only scan in window order instead
-- of an index scan visiting the heap in random order. Only completed runs enter it:
-- skipped and failed runs (the guards' skip path) cost nothing more to record.
CREATE INDEX IF NOT EXISTS processing_runs_completed
    ON processing_runs (processor_name, scope, started_at)
    INCLUDE (finished_at, records_processed)
    WHERE status = 'completed';
