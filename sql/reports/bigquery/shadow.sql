-- Shadow measurement: runs in shadow mode by the guard that would have skipped them (NULL:
-- none would), with their own processing time, which a skip would have saved.
-- @since, @until period (TIMESTAMP), @job processor or NULL for all.
WITH p AS (SELECT @since AS since, @until AS until, @job AS job)
SELECT
    processor_name,
    would_skip_reason,
    COUNT(*) AS runs,
    SUM(duration_ms) AS duration_ms
FROM `{project}.{dataset}.processing_runs`, p
WHERE started_at >= p.since AND started_at < p.until
  AND mode = 'shadow'
  AND (p.job IS NULL OR processor_name = p.job)
GROUP BY processor_name, would_skip_reason
ORDER BY processor_name, would_skip_reason;
