-- Q3: potential content hash savings. The same processor and scope completed more than
-- once on one day (UTC): every run after the first could have been prevented; with a
-- standard deviation of records processed below $4 the content was very likely identical.
-- $1 period start, $2 period end (timestamptz), $3 processor or NULL for all, $4 the
-- largest standard deviation of records processed that counts as identical content.
WITH candidates AS (
    SELECT
        processor_name,
        scope,
        (started_at AT TIME ZONE 'UTC')::date AS run_date,
        COUNT(*) AS runs_same_day,
        STDDEV_SAMP(records_processed) AS data_stddev
    FROM processing_runs
    WHERE started_at >= $1 AND started_at < $2
      AND status = 'completed'
      AND ($3::text IS NULL OR processor_name = $3::text)
    GROUP BY processor_name, scope, run_date
    HAVING COUNT(*) > 1
)
SELECT
    processor_name,
    COUNT(*) AS dates_with_duplicates,
    SUM(runs_same_day - 1)::bigint AS potential_prevented_runs,
    SUM(CASE WHEN data_stddev < $4::float8 THEN runs_same_day - 1 ELSE 0 END)::bigint
        AS high_confidence_prevents
FROM candidates
GROUP BY processor_name
ORDER BY potential_prevented_runs DESC, processor_name;
