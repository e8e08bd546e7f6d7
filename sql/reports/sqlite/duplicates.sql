-- Q1: duplicate runs outside the time window. A completed run whose previous completed run
-- of the same processor and scope finished more than the window earlier; identical when it
-- processed as many records as that previous run.
-- ?1 period start, ?2 period end (INTEGER microseconds since the epoch), ?3 processor or
-- NULL for all, ?4 the time window in microseconds.
WITH runs AS (
    SELECT
        processor_name,
        started_at,
        records_processed,
        LAG(records_processed) OVER w AS prev_records_processed,
        LAG(finished_at) OVER w AS prev_finished_at
    FROM processing_runs
    -- `+started_at`: not the started_at index (then a sort), but one ordered pass over
    -- the partial index processing_runs_completed (migration 0002), in window order.
    WHERE +started_at >= ?1 AND +started_at < ?2
      AND status = 'completed'
      AND (?3 IS NULL OR processor_name = ?3)
    WINDOW w AS (PARTITION BY processor_name, scope ORDER BY started_at)
)
SELECT
    processor_name,
    COUNT(*) AS duplicate_runs,
    ROUND(AVG((started_at - prev_finished_at) / 3600000000.0), 2) AS avg_hours_between_runs,
    SUM(CASE WHEN records_processed = prev_records_processed THEN 1 ELSE 0 END)
        AS identical_data_runs
FROM runs
WHERE prev_finished_at IS NOT NULL
  AND started_at - prev_finished_at > ?4
GROUP BY processor_name
ORDER BY duplicate_runs DESC, processor_name;
