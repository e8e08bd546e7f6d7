-- Q2: wasted scheduled runs. Completed runs started by the scheduler that processed zero
-- records; the minutes wasted use each processor's average duration of its completed runs.
-- ?1 period start, ?2 period end (INTEGER microseconds since the epoch), ?3 processor or
-- NULL for all.
SELECT
    processor_name,
    COUNT(*) AS completed_runs,
    SUM(CASE WHEN trigger_source = 'scheduler' THEN 1 ELSE 0 END) AS scheduled_runs,
    SUM(CASE WHEN trigger_source = 'scheduler' AND records_processed = 0 THEN 1 ELSE 0 END)
        AS zero_change_runs,
    ROUND(AVG(duration_ms) / 1000.0, 3) AS avg_duration_seconds,
    ROUND(
        SUM(CASE WHEN trigger_source = 'scheduler' AND records_processed = 0 THEN 1 ELSE 0 END)
            * AVG(duration_ms) / 60000.0,
        2
    ) AS minutes_wasted
-- the covering index in processor order (migration 0004): no table reads, no sort by processor
FROM processing_runs INDEXED BY processing_runs_report
WHERE started_at >= ?1 AND started_at < ?2
  AND status = 'completed'
  AND (?3 IS NULL OR processor_name = ?3)
GROUP BY processor_name
ORDER BY minutes_wasted DESC, processor_name;
