-- Event cursors (issue 12, seed 003): a named {last_timestamp, last_id} per namespace.
-- `position` encodes (timestamp, id) as lowercase hex whose byte order is the cursor's
-- order, so advancing is a text comparison; `value` is {"last_timestamp", "last_id"} as
-- JSON text; `updated_at` in microseconds since the Unix epoch.
CREATE TABLE IF NOT EXISTS event_cursors (
    namespace  TEXT NOT NULL,
    name       TEXT NOT NULL,
    position   TEXT NOT NULL,
    value      TEXT NOT NULL,
    updated_at INTEGER NOT NULL,
    PRIMARY KEY (namespace, name)
);
