-- Daily runs per processor (UTC days) by status, with the skips by reason and the runs a
-- guard would have skipped in shadow mode: the series of the HTML report's charts.
-- @since, @until period (TIMESTAMP), @job processor or NULL for all.
WITH p AS (SELECT @since AS since, @until AS until, @job AS job)
SELECT
    processor_name,
    FORMAT_DATE('%Y-%m-%d', DATE(started_at)) AS day,
    COUNTIF(status = 'completed') AS completed,
    COUNTIF(status = 'failed') AS failed,
    COUNTIF(status = 'skipped') AS skipped,
    COUNTIF(skip_reason = 'duplicate_content_hash') AS skipped_content_hash,
    COUNTIF(skip_reason = 'time_window') AS skipped_time_window,
    COUNTIF(would_skip_reason IS NOT NULL) AS would_skip
FROM `{project}.{dataset}.processing_runs`, p
WHERE started_at >= p.since AND started_at < p.until
  AND (p.job IS NULL OR processor_name = p.job)
  -- `idem purge` records itself as a skipped run: not an invocation of the job
  AND (skip_reason IS NULL OR skip_reason <> 'purged')
GROUP BY processor_name, day
ORDER BY processor_name, day;
