-- Scheduling: priorities, events delivered later kept out
-- of the claims' way, and the expiry clock.
-- - `priority`: claims take higher first. Most events keep the default
-- 0, so only the others have entries in `events_ranked`; claims of a
-- topic without any walk `events_pending` alone, as before.
-- - `held_until`: the due time of an event delivered later (deliver_at,
-- delay), NULL once a claim has found it due. It is the second column
-- of `events_pending`, so the rows still held sort after the due ones
-- (NULLs first): a claim walks `held_until IS NULL` in arrival order
-- and never steps over the backlog of held rows, and the rows that
-- fall due are one range (`held_until <= now`) of the same index.
-- Rows stored under schema 5 with a later due time keep NULL and are
-- claimed when due, as before.
-- - `ready_at`: when the expiry clock (`expire_after`) started: the
-- first due time, or the last replay; NULL (rows stored before) means
-- `received_at`.

    ALTER TABLE events ADD COLUMN priority INTEGER NOT NULL DEFAULT 0;
    ALTER TABLE events ADD COLUMN held_until INTEGER;
    ALTER TABLE events ADD COLUMN ready_at INTEGER;
    DROP INDEX events_pending;
    CREATE INDEX events_pending ON events (topic, held_until, seq, next_attempt_at, priority, key)
        WHERE status = 'pending';
    CREATE INDEX events_ranked ON events (topic, priority DESC, seq)
        WHERE status = 'pending' AND priority <> 0 AND held_until IS NULL;
    -- Sequential topics: a held event holds back the later events of its key.
    CREATE INDEX events_held_keys ON events (topic, key, seq)
        WHERE held_until IS NOT NULL AND key IS NOT NULL;
