-- The work still to do moves to a narrow table of its own, so the
-- database does far less per drained event (docs/src/design/postgres.md,
-- "The queue table").
-- - `mailroom.queue` holds one row per open event: pending, running, or
-- dead with a key (a dead head blocks its key under `on_dead =
-- block`). Claims walk its `queue_claim` index; a completion deletes
-- the row (or sends it back to pending for a retry). `priority` and
-- `run_at` (the due time) are there for scheduling: claims take the
-- highest priority first, then arrival order, among due rows.
-- - `mailroom.events` stays the durable record operators query: every
-- column, `status` included, is kept current. None of its
-- indexes mentions a column a claim or a completion changes, and
-- `fillfactor` leaves room on each page, so both updates are HOT (no
-- index entry). Its status-keyed partial indexes go; listings by
-- topic read `events_topic_seq`, retention `events_received`.
-- - The outbox function writes the queue row too.

    CREATE TABLE mailroom.queue (
        seq      bigint      PRIMARY KEY,                -- events.seq
        topic    text        NOT NULL,
        key      text,
        priority integer     NOT NULL DEFAULT 0,         -- higher first
        run_at   timestamptz NOT NULL,                   -- due time while pending
        state    text        NOT NULL CHECK (state IN ('pending', 'running', 'dead'))
    ) WITH (
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_cost_delay = 0
    );
    INSERT INTO mailroom.queue (seq, topic, key, run_at, state)
    SELECT seq, topic, key, COALESCE(next_attempt_at, received_at), status
    FROM mailroom.events
    WHERE status IN ('pending', 'running') OR (status = 'dead' AND key IS NOT NULL);
    -- Claims: due pending rows of a topic, highest priority, then arrival.
    -- `-priority`, not `priority DESC`: every column ascending, so a claim
    -- can start from a position (topic, -priority, seq) as one row
    -- comparison (the floor, `floor.rs`).
    CREATE INDEX queue_claim ON mailroom.queue (topic, (-priority), seq)
        WHERE state = 'pending';
    -- Sequential topics: the open events of a key in arrival order (heads).
    CREATE INDEX queue_keys ON mailroom.queue (topic, key, seq) WHERE key IS NOT NULL;
    -- "Is an event of this key running?", and lease rescue's list.
    CREATE INDEX queue_running ON mailroom.queue (topic, key) WHERE state = 'running';

    DROP INDEX mailroom.events_claim;
    DROP INDEX mailroom.events_open_keys;
    DROP INDEX mailroom.events_running;
    DROP INDEX mailroom.events_running_keys;
    DROP INDEX mailroom.events_listing;
    DROP INDEX mailroom.events_finished;
    CREATE INDEX events_topic_seq ON mailroom.events (topic, seq);
    CREATE INDEX events_received ON mailroom.events (received_at);
    -- Room for the new versions a claim and a completion write, so they
    -- stay on their page (HOT). Applies to pages written from now on.
    ALTER TABLE mailroom.events SET (fillfactor = 50);

    CREATE OR REPLACE FUNCTION mailroom.enqueue_with_id(
        new_id uuid, topic text, type text, key text, payload jsonb,
        dedup_key text, max_attempts integer
    ) RETURNS uuid
    LANGUAGE sql VOLATILE AS $$
        WITH inserted AS (
            INSERT INTO mailroom.events (id, source, topic, dedup_key, key, type, status,
                                         max_attempts, next_attempt_at, received_at,
                                         content_type, payload)
            VALUES ($1, 'outbox', $2, COALESCE($6, $1::text), $4, $3, 'pending',
                    GREATEST(COALESCE($7, 15), 1), clock_timestamp(), clock_timestamp(),
                    'application/json', convert_to(COALESCE($5, 'null'::jsonb)::text, 'UTF8'))
            ON CONFLICT (source, dedup_key) DO NOTHING
            RETURNING seq, topic, key, next_attempt_at
        ), queued AS (
            INSERT INTO mailroom.queue (seq, topic, key, run_at, state)
            SELECT seq, topic, key, next_attempt_at, 'pending' FROM inserted
        )
        -- Delivered when (and only if) the caller's transaction commits.
        SELECT pg_notify('mailroom_events', inserted.topic) FROM inserted;

        SELECT e.id FROM mailroom.events e
        WHERE e.source = 'outbox' AND e.dedup_key = COALESCE($6, $1::text);
    $$;
