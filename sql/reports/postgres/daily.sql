-- Daily runs per processor (UTC days) by status, with the skips by reason and the runs a
-- guard would have skipped in shadow mode: the series of the HTML report's charts.
-- $1 period start, $2 period end (timestamptz), $3 processor or NULL for all.
SELECT
    processor_name,
    to_char((started_at AT TIME ZONE 'UTC')::date, 'YYYY-MM-DD') AS day,
    COUNT(*) FILTER (WHERE status = 'completed') AS completed,
    COUNT(*) FILTER (WHERE status = 'failed') AS failed,
    COUNT(*) FILTER (WHERE status = 'skipped') AS skipped,
    COUNT(*) FILTER (WHERE skip_reason = 'duplicate_content_hash') AS skipped_content_hash,
    COUNT(*) FILTER (WHERE skip_reason = 'time_window') AS skipped_time_window,
    COUNT(*) FILTER (WHERE would_skip_reason IS NOT NULL) AS would_skip
FROM processing_runs
WHERE started_at >= $1 AND started_at < $2
  AND ($3::text IS NULL OR processor_name = $3::text)
  -- `idem purge` records itself as a skipped run: not an invocation of the job
  AND (skip_reason IS NULL OR skip_reason <> 'purged')
GROUP BY processor_name, day
ORDER BY processor_name, day;
