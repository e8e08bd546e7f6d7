-- Q2 (seed 002): wasted scheduled runs. Completed runs started by the scheduler that
-- processed zero records; the minutes wasted are those runs times the average duration of
-- the processor's completed *scheduled* runs (a long backfill or manual run does not count),
-- and only when there are more than 5 of them (the seed's HAVING zero_change_runs > 5; the
-- row stays, with 0 minutes, so the other figures are still shown).
-- ?1 period start, ?2 period end (INTEGER microseconds since the epoch), ?3 processor or
-- NULL for all.
SELECT
    processor_name,
    COUNT(*) AS completed_runs,
    SUM(CASE WHEN trigger_source = 'scheduler' THEN 1 ELSE 0 END) AS scheduled_runs,
    SUM(CASE WHEN trigger_source = 'scheduler' AND records_processed = 0 THEN 1 ELSE 0 END)
        AS zero_change_runs,
    ROUND(AVG(CASE WHEN trigger_source = 'scheduler' THEN duration_ms END) / 1000.0, 3)
        AS avg_duration_seconds,
    CASE WHEN SUM(CASE WHEN trigger_source = 'scheduler' AND records_processed = 0 THEN 1 ELSE 0 END) > 5
        THEN ROUND(
            SUM(CASE WHEN trigger_source = 'scheduler' AND records_processed = 0 THEN 1 ELSE 0 END)
                * AVG(CASE WHEN trigger_source = 'scheduler' THEN duration_ms END) / 60000.0,
            2
        )
        ELSE 0.0
    END AS minutes_wasted
-- the covering index in processor order (migration 0004): no table reads, no sort by processor
FROM processing_runs INDEXED BY processing_runs_report
WHERE started_at >= ?1 AND started_at < ?2
  AND status = 'completed'
  AND (?3 IS NULL OR processor_name = ?3)
GROUP BY processor_name
ORDER BY minutes_wasted DESC, processor_name;
