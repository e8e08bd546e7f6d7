-- Effectiveness: the share of invocations the content hash and the time window prevented,
-- and the seconds saved at each processor's average duration of its completed runs.
-- ?1 period start, ?2 period end (INTEGER microseconds since the epoch), ?3 processor or
-- NULL for all.
SELECT
    processor_name,
    COUNT(*) AS total_invocations,
    SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END) AS completed_runs,
    SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed_runs,
    SUM(CASE WHEN status = 'skipped' THEN 1 ELSE 0 END) AS skipped_runs,
    SUM(CASE WHEN mode = 'shadow' THEN 1 ELSE 0 END) AS shadow_runs,
    SUM(CASE WHEN skip_reason = 'duplicate_content_hash' THEN 1 ELSE 0 END) AS hash_prevented,
    SUM(CASE WHEN skip_reason = 'time_window' THEN 1 ELSE 0 END) AS window_prevented,
    ROUND(100.0 * SUM(CASE WHEN skip_reason = 'duplicate_content_hash' THEN 1 ELSE 0 END)
        / COUNT(*), 1) AS hash_prevention_pct,
    ROUND(100.0 * SUM(CASE WHEN skip_reason = 'time_window' THEN 1 ELSE 0 END)
        / COUNT(*), 1) AS window_prevention_pct,
    ROUND(AVG(CASE WHEN status = 'completed' THEN duration_ms END) / 1000.0, 3)
        AS avg_completed_seconds,
    ROUND(SUM(CASE WHEN skip_reason = 'duplicate_content_hash' THEN 1 ELSE 0 END)
        * AVG(CASE WHEN status = 'completed' THEN duration_ms END) / 1000.0, 1)
        AS hash_seconds_saved,
    ROUND(SUM(CASE WHEN skip_reason = 'time_window' THEN 1 ELSE 0 END)
        * AVG(CASE WHEN status = 'completed' THEN duration_ms END) / 1000.0, 1)
        AS window_seconds_saved,
    MIN(started_at) AS first_run_at,
    MAX(started_at) AS last_run_at
-- the covering index in processor order (migration 0004): no table reads, no sort by processor
FROM processing_runs INDEXED BY processing_runs_report
WHERE started_at >= ?1 AND started_at < ?2
  AND (?3 IS NULL OR processor_name = ?3)
  -- `idem purge` records itself as a skipped run: not an invocation of the job
  AND (skip_reason IS NULL OR skip_reason <> 'purged')
GROUP BY processor_name
ORDER BY processor_name;
