-- Q1: duplicate runs outside the time window. A completed run whose previous completed run
-- of the same processor and scope finished more than the window earlier; identical when it
-- processed as many records as that previous run.
-- @since, @until period (TIMESTAMP), @job processor or NULL for all, @window_seconds the
-- time window (FLOAT64). {project} and {dataset} are the store URL's validated ids.
WITH p AS (SELECT @since AS since, @until AS until, @job AS job, @window_seconds AS window_seconds),
runs AS (
    SELECT
        processor_name,
        started_at,
        records_processed,
        LAG(records_processed) OVER w AS prev_records_processed,
        LAG(finished_at) OVER w AS prev_finished_at
    FROM `{project}.{dataset}.processing_runs`, p
    WHERE started_at >= p.since AND started_at < p.until
      AND status = 'completed'
      AND (p.job IS NULL OR processor_name = p.job)
    WINDOW w AS (PARTITION BY processor_name, scope ORDER BY started_at)
)
SELECT
    processor_name,
    COUNT(*) AS duplicate_runs,
    ROUND(AVG(TIMESTAMP_DIFF(started_at, prev_finished_at, MICROSECOND) / 3600000000.0), 2)
        AS avg_hours_between_runs,
    COUNTIF(records_processed = prev_records_processed) AS identical_data_runs
FROM runs, p
WHERE prev_finished_at IS NOT NULL
  AND TIMESTAMP_DIFF(started_at, prev_finished_at, MICROSECOND) > p.window_seconds * 1000000
GROUP BY processor_name
ORDER BY duplicate_runs DESC, processor_name;
