-- Pending marks (`idem gate`, docs/events.md) kept once per batch, as on Postgres (0008):
-- a batch's keys are inserted with their real expiry and `pending` naming the batch's row
-- here; confirming the batch deletes that one row instead of updating every key. A key
-- whose batch row is here is pending (a replay whose decision is `marker`) until
-- `deadline`, then expired (taken over as new); a key whose batch row is gone was
-- confirmed. AUTOINCREMENT: a deleted batch's id is never given again, so a confirmed
-- key never names a later batch. Times in microseconds since the epoch, as event_keys.
CREATE TABLE IF NOT EXISTS event_pending (
    id         INTEGER PRIMARY KEY AUTOINCREMENT,
    namespace  TEXT    NOT NULL,
    marker     TEXT    NOT NULL,
    first_seen INTEGER NOT NULL,
    deadline   INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS event_pending_marker ON event_pending (namespace, marker);
ALTER TABLE event_keys ADD COLUMN pending INTEGER;
