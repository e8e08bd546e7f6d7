-- Q3: potential content hash savings. The same processor and scope completed more than
-- once on one day (UTC): every run after the first could have been prevented; with a
-- standard deviation of records processed below @max_stddev the content was very likely
-- identical.
-- @since, @until period (TIMESTAMP), @job processor or NULL for all, @max_stddev FLOAT64.
WITH p AS (SELECT @since AS since, @until AS until, @job AS job, @max_stddev AS max_stddev),
candidates AS (
    SELECT
        processor_name,
        scope,
        DATE(started_at) AS run_date,
        COUNT(*) AS runs_same_day,
        STDDEV_SAMP(records_processed) AS data_stddev
    FROM `{project}.{dataset}.processing_runs`, p
    WHERE started_at >= p.since AND started_at < p.until
      AND status = 'completed'
      AND (p.job IS NULL OR processor_name = p.job)
    GROUP BY processor_name, scope, run_date
    HAVING COUNT(*) > 1
)
SELECT
    processor_name,
    COUNT(*) AS dates_with_duplicates,
    SUM(runs_same_day - 1) AS potential_prevented_runs,
    SUM(IF(data_stddev < p.max_stddev, runs_same_day - 1, 0)) AS high_confidence_prevents
FROM candidates, p
GROUP BY processor_name
ORDER BY potential_prevented_runs DESC, processor_name;
