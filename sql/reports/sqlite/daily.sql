-- Daily runs per processor (UTC days) by status, with the skips by reason and the runs a
-- guard would have skipped in shadow mode: the series of the HTML report's charts.
-- ?1 period start, ?2 period end (INTEGER microseconds since the epoch), ?3 processor or
-- NULL for all.
SELECT
    processor_name,
    -- the day's text once per group, not per run: grouped by the day's number
    date(MIN(started_at) / 1000000, 'unixepoch') AS day,
    SUM(CASE WHEN status = 'completed' THEN 1 ELSE 0 END) AS completed,
    SUM(CASE WHEN status = 'failed' THEN 1 ELSE 0 END) AS failed,
    SUM(CASE WHEN status = 'skipped' THEN 1 ELSE 0 END) AS skipped,
    SUM(CASE WHEN skip_reason = 'duplicate_content_hash' THEN 1 ELSE 0 END) AS skipped_content_hash,
    SUM(CASE WHEN skip_reason = 'time_window' THEN 1 ELSE 0 END) AS skipped_time_window,
    SUM(CASE WHEN would_skip_reason IS NOT NULL THEN 1 ELSE 0 END) AS would_skip
-- the covering index in processor order (migration 0004): no table reads, no sort by processor
FROM processing_runs INDEXED BY processing_runs_report
WHERE started_at >= ?1 AND started_at < ?2
  AND (?3 IS NULL OR processor_name = ?3)
  -- `idem purge` records itself as a skipped run: not an invocation of the job
  AND (skip_reason IS NULL OR skip_reason <> 'purged')
GROUP BY processor_name, started_at / 86400000000
ORDER BY processor_name, day;
