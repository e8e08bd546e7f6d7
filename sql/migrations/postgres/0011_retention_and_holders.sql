-- Keys carry their own retention (issue 37): `keep_until` is when the guards of the job
-- that wrote a key stop needing it (its processing instant plus the longest window of
-- the guards that read keys of its kind; year 9999 for a window too long to add). A
-- cleanup deletes a key only once that has passed and the key is older than `keep`, so
-- it needs no job file to know a window (an `idem exec` job has none). Keys written
-- before this version keep NULL: cleanup treats them as it did, by `keep` and the windows
-- of the job files it is shown.
ALTER TABLE processing_keys ADD COLUMN IF NOT EXISTS keep_until TIMESTAMPTZ;
CREATE INDEX IF NOT EXISTS processing_keys_keep_until ON processing_keys (keep_until);
-- Runs from their start (issue 37): a claim records the claiming host and process and a
-- renewal its time, so a lease not released says who runs the scope and their last
-- heartbeat (`idem runs`, `idem status`: running, or abandoned once it expired).
ALTER TABLE processing_leases ADD COLUMN IF NOT EXISTS renewed_at TIMESTAMPTZ;
ALTER TABLE processing_leases ADD COLUMN IF NOT EXISTS holder_host TEXT;
ALTER TABLE processing_leases ADD COLUMN IF NOT EXISTS holder_pid BIGINT;
