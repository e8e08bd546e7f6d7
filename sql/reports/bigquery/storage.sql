-- Storage of processing_keys per processor: keys, distinct keys, content keys (those
-- written in the period say the content hash is on), oldest and newest key, and an
-- estimate of the bytes the rows take (BigQuery's logical sizes: 8 per INT64 and
-- TIMESTAMP, 2 + length per STRING and JSON, 8 per DATE).
-- @since, @until period (TIMESTAMP), @job processor or NULL for all, @keys_since the oldest
-- keys counted (`idem report` passes the period's start or five weeks back, whichever is
-- earlier; the Unix epoch with --all-keys): the report costs (and scans) its period.
WITH p AS (SELECT @since AS since, @until AS until, @job AS job)
SELECT
    processor_name,
    COUNT(*) AS total_keys,
    COUNT(DISTINCT processing_key) AS unique_keys,
    COUNTIF(kind = 'content') AS content_keys,
    COUNTIF(kind = 'content' AND processed_at >= p.since AND processed_at < p.until)
        AS content_keys_in_period,
    UNIX_MICROS(MIN(IF(kind = 'content', processed_at, NULL))) AS oldest_content_key_at,
    UNIX_MICROS(MIN(processed_at)) AS oldest_key_at,
    UNIX_MICROS(MAX(processed_at)) AS newest_key_at,
    SUM(24 + 2 * 6 + LENGTH(processing_key) + LENGTH(kind) + LENGTH(processor_name)
        + LENGTH(scope) + LENGTH(run_id) + COALESCE(LENGTH(TO_JSON_STRING(metadata)), 0))
        AS estimated_bytes
FROM `{project}.{dataset}.processing_keys`, p
WHERE processed_at >= @keys_since AND (p.job IS NULL OR processor_name = p.job)
GROUP BY processor_name
ORDER BY processor_name;
