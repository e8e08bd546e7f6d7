-- Event keys leave half of each heap page free (fillfactor 50), so the update that confirms
-- a pending mark (`idem gate`: decision and expiry, neither indexed) is a HOT update: the
-- new row version goes on the same page and neither index gets an entry. With full pages
-- every confirmation went to another page and added an entry to the primary key and to
-- `event_keys_first_seen`: the confirming statements cost the server about twice as much,
-- and both indexes grew by a dead entry per key until vacuumed. The dead versions of
-- confirmed rows are pruned within their page and the space is reused, so the table grows
-- little (200 k confirmed keys: 94 MB instead of 87 MB). Only the storage parameter
-- changes: existing pages are not rewritten, pages filled from now on keep the space.
ALTER TABLE event_keys SET (fillfactor = 50);
