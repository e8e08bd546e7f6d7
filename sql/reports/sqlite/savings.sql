-- Q3: potential content hash savings. The same processor and scope completed more than
-- once on one day (UTC): every run after the first could have been prevented; with a
-- standard deviation of records processed below ?4 the content was very likely identical.
-- ?1 period start, ?2 period end (INTEGER microseconds since the epoch), ?3 processor or
-- NULL for all, ?4 the largest standard deviation of records processed that counts as
-- identical content.
WITH candidates AS (
    SELECT
        processor_name,
        scope,
        -- the UTC day's number (the same days as date(), without formatting each run's)
        started_at / 86400000000 AS run_day,
        COUNT(*) AS runs_same_day,
        -- sample variance (SQLite has no STDDEV)
        (SUM(records_processed * 1.0 * records_processed)
            - SUM(records_processed * 1.0) * SUM(records_processed * 1.0) / COUNT(records_processed))
            / NULLIF(COUNT(records_processed) - 1, 0) AS data_variance
    -- the partial index of completed runs (migration 0002) holds every column read here
    FROM processing_runs INDEXED BY processing_runs_completed
    WHERE started_at >= ?1 AND started_at < ?2
      AND status = 'completed'
      AND (?3 IS NULL OR processor_name = ?3)
    GROUP BY processor_name, scope, run_day
    HAVING COUNT(*) > 1
)
SELECT
    processor_name,
    COUNT(*) AS dates_with_duplicates,
    SUM(runs_same_day - 1) AS potential_prevented_runs,
    SUM(CASE WHEN data_variance < ?4 * ?4 THEN runs_same_day - 1 ELSE 0 END)
        AS high_confidence_prevents
FROM candidates
GROUP BY processor_name
ORDER BY potential_prevented_runs DESC, processor_name;
