-- Effectiveness: the share of invocations the content hash and the time window prevented,
-- and the seconds saved at each processor's average duration of its completed runs.
-- $1 period start, $2 period end (timestamptz), $3 processor or NULL for all.
SELECT
    processor_name,
    COUNT(*) AS total_invocations,
    COUNT(*) FILTER (WHERE status = 'completed') AS completed_runs,
    COUNT(*) FILTER (WHERE status = 'failed') AS failed_runs,
    COUNT(*) FILTER (WHERE status = 'skipped') AS skipped_runs,
    COUNT(*) FILTER (WHERE mode = 'shadow') AS shadow_runs,
    COUNT(*) FILTER (WHERE skip_reason = 'duplicate_content_hash') AS hash_prevented,
    COUNT(*) FILTER (WHERE skip_reason = 'time_window') AS window_prevented,
    ROUND(100.0 * COUNT(*) FILTER (WHERE skip_reason = 'duplicate_content_hash')
        / COUNT(*), 1)::float8 AS hash_prevention_pct,
    ROUND(100.0 * COUNT(*) FILTER (WHERE skip_reason = 'time_window')
        / COUNT(*), 1)::float8 AS window_prevention_pct,
    ROUND(AVG(duration_ms) FILTER (WHERE status = 'completed') / 1000.0, 3)::float8
        AS avg_completed_seconds,
    ROUND(COUNT(*) FILTER (WHERE skip_reason = 'duplicate_content_hash')
        * AVG(duration_ms) FILTER (WHERE status = 'completed') / 1000.0, 1)::float8
        AS hash_seconds_saved,
    ROUND(COUNT(*) FILTER (WHERE skip_reason = 'time_window')
        * AVG(duration_ms) FILTER (WHERE status = 'completed') / 1000.0, 1)::float8
        AS window_seconds_saved,
    (EXTRACT(EPOCH FROM MIN(started_at)) * 1000000)::bigint AS first_run_at,
    (EXTRACT(EPOCH FROM MAX(started_at)) * 1000000)::bigint AS last_run_at
FROM processing_runs
WHERE started_at >= $1 AND started_at < $2
  AND ($3::text IS NULL OR processor_name = $3::text)
  -- `idem purge` records itself as a skipped run: not an invocation of the job
  AND (skip_reason IS NULL OR skip_reason <> 'purged')
GROUP BY processor_name
ORDER BY processor_name;
