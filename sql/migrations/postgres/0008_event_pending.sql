-- Pending marks (`idem gate`, docs/events.md) kept once per batch instead of on every key.
-- A batch's keys are inserted with their real expiry and `pending` naming the batch's row
-- here; confirming the batch (its records are out) deletes that one row, instead of an
-- update of every key. A key whose batch row is here is pending (a replay whose decision
-- is `marker`) until `deadline`, then expired (taken over as new); a key whose batch row
-- is gone was confirmed. Cleanup deletes a dead batch's keys, then its row. With no key
-- updated any more, event keys fill their pages again (fillfactor back to the default
-- 100, set to 50 by 0007 for the updates): half the pages to write per key.
CREATE TABLE IF NOT EXISTS event_pending (
    id         BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    namespace  TEXT COLLATE "C" NOT NULL,
    marker     TEXT        NOT NULL,
    first_seen TIMESTAMPTZ NOT NULL,
    deadline   TIMESTAMPTZ NOT NULL
);
CREATE INDEX IF NOT EXISTS event_pending_marker ON event_pending (namespace, marker);
ALTER TABLE event_keys ADD COLUMN IF NOT EXISTS pending BIGINT;
ALTER TABLE event_keys RESET (fillfactor);
