-- Shadow measurement: runs in shadow mode by the guard that would have skipped them (NULL:
-- none would), with their own processing time, which a skip would have saved.
-- $1 period start, $2 period end (timestamptz), $3 processor or NULL for all.
SELECT
    processor_name,
    would_skip_reason,
    COUNT(*) AS runs,
    SUM(duration_ms)::bigint AS duration_ms
FROM processing_runs
WHERE started_at >= $1 AND started_at < $2
  AND mode = 'shadow'
  AND ($3::text IS NULL OR processor_name = $3::text)
GROUP BY processor_name, would_skip_reason
ORDER BY processor_name, would_skip_reason;
