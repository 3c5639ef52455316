-- Scheduling (`deliver_at`, `priority`, `expire_after`,
-- `max_wait_for_priority`).
-- - `events.priority` is the event's priority as given (shown);
-- `queue.priority` (migration 7) is what claims order by, raised for
-- an event that waited `max_wait_for_priority` (the starvation bound).
-- - Events delivered later wait in the queue as `scheduled` rows, out of
-- `queue_claim`, so claims never step over them; `queue_scheduled`
-- finds the ones that fell due (claims move them to `pending`) and the
-- next due time. Pending rows due later (retries, and delayed events
-- stored before this migration) move there too.
-- - `queue.ready_at` starts the expiry clock (`expire_after`): the first
-- due time, or the last replay. Rows queued before this migration
-- start it now.
-- - `mailroom.enqueue` gains optional trailing `deliver_at` and
-- `priority`; calls with the old arguments keep working.

    ALTER TABLE mailroom.events ADD COLUMN priority integer NOT NULL DEFAULT 0;
    ALTER TABLE mailroom.queue ADD COLUMN ready_at timestamptz NOT NULL DEFAULT now();
    ALTER TABLE mailroom.queue DROP CONSTRAINT queue_state_check;
    ALTER TABLE mailroom.queue ADD CONSTRAINT queue_state_check
        CHECK (state IN ('scheduled', 'pending', 'running', 'dead'));
    UPDATE mailroom.queue SET state = 'scheduled' WHERE state = 'pending' AND run_at > now();
    CREATE INDEX queue_scheduled ON mailroom.queue (topic, run_at) WHERE state = 'scheduled';

    DROP FUNCTION mailroom.enqueue(text, text, text, jsonb, text, integer);
    CREATE FUNCTION mailroom.enqueue_with_id(
        new_id uuid, topic text, type text, key text, payload jsonb,
        dedup_key text, max_attempts integer, deliver_at timestamptz, priority integer
    ) RETURNS uuid
    LANGUAGE sql VOLATILE AS $$
        WITH inserted AS (
            INSERT INTO mailroom.events (id, source, topic, dedup_key, key, type, status,
                                         max_attempts, next_attempt_at, received_at,
                                         content_type, payload, priority)
            VALUES ($1, 'outbox', $2, COALESCE($6, $1::text), $4, $3, 'pending',
                    GREATEST(COALESCE($7, 15), 1), GREATEST(COALESCE($8, clock_timestamp()), clock_timestamp()),
                    clock_timestamp(), 'application/json',
                    convert_to(COALESCE($5, 'null'::jsonb)::text, 'UTF8'), COALESCE($9, 0))
            ON CONFLICT (source, dedup_key) DO NOTHING
            RETURNING seq, topic, key, next_attempt_at, priority
        ), queued AS (
            INSERT INTO mailroom.queue (seq, topic, key, priority, run_at, ready_at, state)
            SELECT seq, topic, key, priority, next_attempt_at, next_attempt_at,
                   CASE WHEN $8 > clock_timestamp() THEN 'scheduled' ELSE 'pending' END
            FROM inserted
        )
        -- Delivered when (and only if) the caller's transaction commits.
        SELECT pg_notify('mailroom_events', inserted.topic) FROM inserted;

        SELECT e.id FROM mailroom.events e
        WHERE e.source = 'outbox' AND e.dedup_key = COALESCE($6, $1::text);
    $$;
    CREATE FUNCTION mailroom.enqueue(
        topic        text,
        type         text,
        key          text,
        payload      jsonb,
        dedup_key    text,
        max_attempts integer DEFAULT 15,
        deliver_at   timestamptz DEFAULT NULL,
        priority     integer DEFAULT 0
    ) RETURNS uuid
    LANGUAGE sql VOLATILE AS $$
        SELECT mailroom.enqueue_with_id(mailroom.uuid_v7(), $1, $2, $3, $4, $5, $6, $7, $8)
    $$;
