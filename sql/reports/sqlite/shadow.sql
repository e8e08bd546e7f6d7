-- Shadow measurement: runs in shadow mode by the guard that would have skipped them (NULL:
-- none would), with their own processing time, which a skip would have saved.
-- ?1 period start, ?2 period end (INTEGER microseconds since the epoch), ?3 processor or
-- NULL for all.
SELECT
    processor_name,
    would_skip_reason,
    COUNT(*) AS runs,
    SUM(duration_ms) AS duration_ms
-- the covering index in processor order (migration 0004): no table reads, no sort by processor
FROM processing_runs INDEXED BY processing_runs_report
WHERE started_at >= ?1 AND started_at < ?2
  AND mode = 'shadow'
  AND (?3 IS NULL OR processor_name = ?3)
GROUP BY processor_name, would_skip_reason
ORDER BY processor_name, would_skip_reason;
