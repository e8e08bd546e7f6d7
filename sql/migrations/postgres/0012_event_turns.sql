-- The order a gate's batches mark their keys in (`idem gate`, docs/events.md): one row per
-- row of batches (a gate's batches in input order), holding the last place in it whose
-- keys were marked. A batch whose turn has not come yet marks its keys only when the place
-- just before its own is the last marked, checked and moved in the transaction of its
-- marks, so batches can mark side by side and still in input order. Rows live as long as
-- the gate's run; the cleanup job deletes those untouched for longer than its cut-off.
CREATE TABLE IF NOT EXISTS event_turns (
    row_id    TEXT        NOT NULL PRIMARY KEY,
    place     BIGINT      NOT NULL,
    marked_at TIMESTAMPTZ NOT NULL
);
