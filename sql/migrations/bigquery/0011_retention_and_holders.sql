-- Keys carry their own retention (issue 37): `keep_until` is when the guards of the job
-- that wrote a key stop needing it (its processing instant plus the longest window of
-- the guards that read keys of its kind; 9999-12-31 for a window too long to add). A
-- cleanup deletes a key only once that has passed and the key is older than `keep`, so
-- it needs no job file to know a window (an `idem exec` job has none). Keys written
-- before this version keep NULL: cleanup treats them as it did, by `keep` and the windows
-- of the job files it is shown. A partition expiration on processing_keys still drops
-- whole days regardless (docs/bigquery.md).
-- Runs from their start (issue 37): a claim records the claiming host and process and a
-- renewal its time, so a lease not released says who runs the scope and their last
-- heartbeat (`idem runs`, `idem status`: running, or abandoned once it expired). On the
-- sixteen lease shards (0009); the schema-1 `processing_leases` is no longer written. One
-- column per statement: the emulator takes one ALTER command per statement.
ALTER TABLE `{project}.{dataset}.processing_leases_00` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_00` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_00` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_01` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_01` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_01` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_02` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_02` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_02` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_03` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_03` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_03` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_04` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_04` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_04` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_05` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_05` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_05` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_06` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_06` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_06` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_07` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_07` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_07` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_08` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_08` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_08` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_09` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_09` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_09` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_10` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_10` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_10` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_11` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_11` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_11` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_12` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_12` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_12` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_13` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_13` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_13` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_14` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_14` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_14` ADD COLUMN IF NOT EXISTS holder_pid INT64;
ALTER TABLE `{project}.{dataset}.processing_leases_15` ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMP;
ALTER TABLE `{project}.{dataset}.processing_leases_15` ADD COLUMN IF NOT EXISTS holder_host STRING;
ALTER TABLE `{project}.{dataset}.processing_leases_15` ADD COLUMN IF NOT EXISTS holder_pid INT64;
-- Last: `processing_keys.keep_until` is the marker of this version (the schema check reads
-- it), so it is added only once everything above is in place.
ALTER TABLE `{project}.{dataset}.processing_keys` ADD COLUMN IF NOT EXISTS keep_until TIMESTAMP;
