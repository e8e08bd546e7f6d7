-- Storage of processing_keys per processor: keys, distinct keys, content keys (those
-- written in the period say the content hash is on), oldest and newest key, and an
-- estimate of the bytes the rows take.
-- ?1 period start, ?2 period end (INTEGER microseconds since the epoch), ?3 processor or
-- NULL for all, ?4 the oldest keys counted (`idem report` passes the period's start or five
-- weeks back, whichever is earlier; 0 with --all-keys): the report costs its period.
SELECT
    processor_name,
    COUNT(*) AS total_keys,
    COUNT(DISTINCT processing_key) AS unique_keys,
    SUM(CASE WHEN kind = 'content' THEN 1 ELSE 0 END) AS content_keys,
    SUM(CASE WHEN kind = 'content' AND processed_at >= ?1 AND processed_at < ?2 THEN 1 ELSE 0 END)
        AS content_keys_in_period,
    MIN(CASE WHEN kind = 'content' THEN processed_at END) AS oldest_content_key_at,
    MIN(processed_at) AS oldest_key_at,
    MAX(processed_at) AS newest_key_at,
    SUM(48 + LENGTH(processing_key) + LENGTH(kind) + LENGTH(processor_name) + LENGTH(scope)
        + LENGTH(scope_date) + COALESCE(LENGTH(metadata), 0) + LENGTH(run_id))
        AS estimated_bytes
-- The processed_at index, not the processor one (which would read every key in
-- processor order): only the keys since ?4 are read.
FROM processing_keys INDEXED BY processing_keys_processed_at
WHERE processed_at >= ?4 AND (?3 IS NULL OR processor_name = ?3)
GROUP BY processor_name
ORDER BY processor_name;
