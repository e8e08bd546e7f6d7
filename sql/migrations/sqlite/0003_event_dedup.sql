-- Event dedup (issue 11): the fingerprint of the payload a key was first seen with, the
-- decision of its first processing (JSON text), and when the key expires (INTEGER
-- microseconds since the Unix epoch, like every SQLite instant; NULL = never). Existing
-- rows keep NULLs: no fingerprint, no decision, never expiring.
ALTER TABLE event_keys ADD COLUMN fingerprint TEXT;
ALTER TABLE event_keys ADD COLUMN decision TEXT;
ALTER TABLE event_keys ADD COLUMN expires_at INTEGER;
