-- Event cursors (issue 12, seed 003): a named {last_timestamp, last_id} per namespace.
-- `position` encodes (timestamp, id) as lowercase hex whose byte order is the cursor's
-- order, so advancing is a text comparison (COLLATE "C"); `value` is
-- {"last_timestamp", "last_id"}.
CREATE TABLE IF NOT EXISTS event_cursors (
    namespace  TEXT NOT NULL,
    name       TEXT NOT NULL,
    position   TEXT COLLATE "C" NOT NULL,
    value      JSONB NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (namespace, name)
);
