-- Effectiveness: the share of invocations the content hash and the time window prevented,
-- and the seconds saved at each processor's average duration of its completed runs.
-- @since, @until period (TIMESTAMP), @job processor or NULL for all.
WITH p AS (SELECT @since AS since, @until AS until, @job AS job)
SELECT
    processor_name,
    COUNT(*) AS total_invocations,
    COUNTIF(status = 'completed') AS completed_runs,
    COUNTIF(status = 'failed') AS failed_runs,
    COUNTIF(status = 'skipped') AS skipped_runs,
    COUNTIF(mode = 'shadow') AS shadow_runs,
    COUNTIF(skip_reason = 'duplicate_content_hash') AS hash_prevented,
    COUNTIF(skip_reason = 'time_window') AS window_prevented,
    ROUND(100.0 * COUNTIF(skip_reason = 'duplicate_content_hash') / COUNT(*), 1)
        AS hash_prevention_pct,
    ROUND(100.0 * COUNTIF(skip_reason = 'time_window') / COUNT(*), 1) AS window_prevention_pct,
    ROUND(AVG(IF(status = 'completed', duration_ms, NULL)) / 1000.0, 3) AS avg_completed_seconds,
    ROUND(COUNTIF(skip_reason = 'duplicate_content_hash')
        * AVG(IF(status = 'completed', duration_ms, NULL)) / 1000.0, 1) AS hash_seconds_saved,
    ROUND(COUNTIF(skip_reason = 'time_window')
        * AVG(IF(status = 'completed', duration_ms, NULL)) / 1000.0, 1) AS window_seconds_saved,
    UNIX_MICROS(MIN(started_at)) AS first_run_at,
    UNIX_MICROS(MAX(started_at)) AS last_run_at
FROM `{project}.{dataset}.processing_runs`, p
WHERE started_at >= p.since AND started_at < p.until
  AND (p.job IS NULL OR processor_name = p.job)
  -- `idem purge` records itself as a skipped run: not an invocation of the job
  AND (skip_reason IS NULL OR skip_reason <> 'purged')
GROUP BY processor_name
ORDER BY processor_name;
