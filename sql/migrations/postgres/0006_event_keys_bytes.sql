-- Event keys compare as bytes (COLLATE "C"). Under a database locale such as C.UTF-8 or
-- en_US.UTF-8, every comparison in the primary key went through the locale (strcoll):
-- about a fifth of the server's time marking a batch of fresh keys, for an order nobody
-- reads (keys are looked up by equality, which is the same in both). Only the collation
-- changes: the table is not rewritten, its primary key is rebuilt (on a large table that
-- takes a while, under an exclusive lock: run `idem migrate` at a quiet moment). Processes
-- of an older idem still running against the database fail statements they prepared
-- before (Postgres: "cached plan must not change result type") until their connections
-- are replaced: stop them for the migration, or restart them after it.
ALTER TABLE event_keys
    ALTER COLUMN namespace TYPE TEXT COLLATE "C",
    ALTER COLUMN event_key TYPE TEXT COLLATE "C";
