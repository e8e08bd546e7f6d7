-- Storage of processing_keys per processor: keys, distinct keys, content keys (those
-- written in the period say the content hash is on), oldest and newest key, and an
-- estimate of the bytes the rows take (pg_column_size of each row).
-- $1 period start, $2 period end (timestamptz), $3 processor or NULL for all, $4 the oldest
-- keys counted (`idem report` passes the period's start or five weeks back, whichever is
-- earlier; the Unix epoch with --all-keys): the report costs its period.
SELECT
    processor_name,
    COUNT(*) AS total_keys,
    COUNT(DISTINCT processing_key) AS unique_keys,
    COUNT(*) FILTER (WHERE kind = 'content') AS content_keys,
    COUNT(*) FILTER (WHERE kind = 'content' AND processed_at >= $1 AND processed_at < $2)
        AS content_keys_in_period,
    (EXTRACT(EPOCH FROM MIN(processed_at) FILTER (WHERE kind = 'content')) * 1000000)::bigint
        AS oldest_content_key_at,
    (EXTRACT(EPOCH FROM MIN(processed_at)) * 1000000)::bigint AS oldest_key_at,
    (EXTRACT(EPOCH FROM MAX(processed_at)) * 1000000)::bigint AS newest_key_at,
    SUM(pg_column_size(k.*))::bigint AS estimated_bytes
FROM processing_keys AS k
WHERE processed_at >= $4 AND ($3::text IS NULL OR processor_name = $3::text)
GROUP BY processor_name
ORDER BY processor_name;
