-- Q2: wasted scheduled runs. Completed runs started by the scheduler that processed zero
-- records; the minutes wasted use each processor's average duration of its completed runs.
-- @since, @until period (TIMESTAMP), @job processor or NULL for all.
WITH p AS (SELECT @since AS since, @until AS until, @job AS job)
SELECT
    processor_name,
    COUNT(*) AS completed_runs,
    COUNTIF(trigger_source = 'scheduler') AS scheduled_runs,
    COUNTIF(trigger_source = 'scheduler' AND records_processed = 0) AS zero_change_runs,
    ROUND(AVG(duration_ms) / 1000.0, 3) AS avg_duration_seconds,
    ROUND(COUNTIF(trigger_source = 'scheduler' AND records_processed = 0)
        * AVG(duration_ms) / 60000.0, 2) AS minutes_wasted
FROM `{project}.{dataset}.processing_runs`, p
WHERE started_at >= p.since AND started_at < p.until
  AND status = 'completed'
  AND (p.job IS NULL OR processor_name = p.job)
GROUP BY processor_name
ORDER BY minutes_wasted DESC, processor_name;
