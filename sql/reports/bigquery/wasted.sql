-- Q2 (seed 002): wasted scheduled runs. Completed runs started by the scheduler that
-- processed zero records; the minutes wasted are those runs times the average duration of
-- the processor's completed *scheduled* runs (a long backfill or manual run does not count),
-- and only when there are more than 5 of them (the seed's HAVING zero_change_runs > 5; the
-- row stays, with 0 minutes, so the other figures are still shown).
-- @since, @until period (TIMESTAMP), @job processor or NULL for all.
WITH p AS (SELECT @since AS since, @until AS until, @job AS job)
SELECT
    processor_name,
    COUNT(*) AS completed_runs,
    COUNTIF(trigger_source = 'scheduler') AS scheduled_runs,
    COUNTIF(trigger_source = 'scheduler' AND records_processed = 0) AS zero_change_runs,
    ROUND(AVG(IF(trigger_source = 'scheduler', duration_ms, NULL)) / 1000.0, 3)
        AS avg_duration_seconds,
    IF(COUNTIF(trigger_source = 'scheduler' AND records_processed = 0) > 5,
        ROUND(COUNTIF(trigger_source = 'scheduler' AND records_processed = 0)
            * AVG(IF(trigger_source = 'scheduler', duration_ms, NULL)) / 60000.0, 2),
        0.0) AS minutes_wasted
FROM `{project}.{dataset}.processing_runs`, p
WHERE started_at >= p.since AND started_at < p.until
  AND status = 'completed'
  AND (p.job IS NULL OR processor_name = p.job)
GROUP BY processor_name
ORDER BY minutes_wasted DESC, processor_name;
