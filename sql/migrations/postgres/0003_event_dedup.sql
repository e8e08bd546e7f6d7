-- Event dedup (issue 11): the fingerprint of the payload a key was first seen with, the
-- decision of its first processing (JSONB), and when the key expires (NULL = never).
-- Existing rows keep NULLs: no fingerprint, no decision, never expiring.
ALTER TABLE event_keys ADD COLUMN IF NOT EXISTS fingerprint TEXT;
ALTER TABLE event_keys ADD COLUMN IF NOT EXISTS decision JSONB;
ALTER TABLE event_keys ADD COLUMN IF NOT EXISTS expires_at TIMESTAMPTZ;
