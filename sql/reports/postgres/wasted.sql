-- Q2 (seed 002): wasted scheduled runs. Completed runs started by the scheduler that
-- processed zero records; the minutes wasted are those runs times the average duration of
-- the processor's completed *scheduled* runs (a long backfill or manual run does not count),
-- and only when there are more than 5 of them (the seed's HAVING zero_change_runs > 5; the
-- row stays, with 0 minutes, so the other figures are still shown).
-- $1 period start, $2 period end (timestamptz), $3 processor or NULL for all.
SELECT
    processor_name,
    COUNT(*) AS completed_runs,
    COUNT(*) FILTER (WHERE trigger_source = 'scheduler') AS scheduled_runs,
    COUNT(*) FILTER (WHERE trigger_source = 'scheduler' AND records_processed = 0)
        AS zero_change_runs,
    ROUND(AVG(duration_ms) FILTER (WHERE trigger_source = 'scheduler') / 1000.0, 3)::float8
        AS avg_duration_seconds,
    CASE WHEN COUNT(*) FILTER (WHERE trigger_source = 'scheduler' AND records_processed = 0) > 5
        THEN ROUND(
            COUNT(*) FILTER (WHERE trigger_source = 'scheduler' AND records_processed = 0)
                * AVG(duration_ms) FILTER (WHERE trigger_source = 'scheduler') / 60000.0,
            2
        )::float8
        ELSE 0.0::float8
    END AS minutes_wasted
FROM processing_runs
WHERE started_at >= $1 AND started_at < $2
  AND status = 'completed'
  AND ($3::text IS NULL OR processor_name = $3::text)
GROUP BY processor_name
ORDER BY minutes_wasted DESC, processor_name;
