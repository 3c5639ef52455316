-- An event changes status twice on its way to done; keep each change
-- cheap. A row is in an index whose WHERE names its status only while it
-- has that status, so a status change moves just the entries of the two
-- statuses involved. events_claim held every row under its status, and
-- events_open_keys every open one, so each change used to move both.
-- Claims now walk pending rows only, in arrival order; for sequential
-- topics that walk also finds each key's head (its first pending row),
-- so pending rows need no per-key index, whose entries landed on a
-- different page for every key. Running and dead rows of a key have
-- their own indexes. `stats` counts each status from its index
-- (done = all − the others).

    DROP INDEX events_claim;
    DROP INDEX events_open_keys;
    CREATE INDEX events_pending ON events (topic, seq, next_attempt_at, key)
        WHERE status = 'pending';
    CREATE INDEX events_dead_keys ON events (topic, key, seq)
        WHERE key IS NOT NULL AND status = 'dead';
    -- Every event by topic (and seq, the rowid): per-topic totals and listings.
    CREATE INDEX events_topic ON events (topic);
    CREATE INDEX events_settled ON events (topic, status) WHERE status IN ('dead', 'skipped');
