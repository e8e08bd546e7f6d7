-- Event dedup (issue 11): the fingerprint of the payload a key was first seen with, the
-- decision of its first processing (JSON text), and when the key expires (NULL = never).
-- Existing rows keep NULLs: no fingerprint, no decision, never expiring.
ALTER TABLE `{project}.{dataset}.event_keys` ADD COLUMN IF NOT EXISTS fingerprint STRING;
ALTER TABLE `{project}.{dataset}.event_keys` ADD COLUMN IF NOT EXISTS decision STRING;
ALTER TABLE `{project}.{dataset}.event_keys` ADD COLUMN IF NOT EXISTS expires_at TIMESTAMP;
