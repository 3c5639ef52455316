-- Correlation through the outbox: `mailroom.enqueue` gains optional
-- trailing `correlation_id` and `causation_id`, stored in the event's
-- columns of the same names (which handlers are given). A follow-up that
-- names its cause (`causation_id`, the causing event's id) and no
-- correlation id keeps the cause's correlation id. Calls with the old
-- arguments keep working, and older builds never call the function with
-- the new ones, so builds of 15 still run against this schema.

    DROP FUNCTION mailroom.enqueue(text, text, text, jsonb, text, integer, timestamptz, integer);
    CREATE FUNCTION mailroom.enqueue_with_id(
        new_id uuid, topic text, type text, key text, payload jsonb,
        dedup_key text, max_attempts integer, deliver_at timestamptz, priority integer,
        correlation_id text, causation_id text
    ) RETURNS uuid
    LANGUAGE sql VOLATILE AS $$
        WITH inserted AS (
            INSERT INTO mailroom.events (id, source, topic, dedup_key, key, type, status,
                                         max_attempts, next_attempt_at, received_at,
                                         content_type, payload, priority,
                                         correlation_id, causation_id)
            VALUES ($1, 'outbox', $2, COALESCE($6, $1::text), $4, $3, 'pending',
                    GREATEST(COALESCE($7, 15), 1), GREATEST(COALESCE($8, clock_timestamp()), clock_timestamp()),
                    clock_timestamp(), 'application/json',
                    convert_to(COALESCE($5, 'null'::jsonb)::text, 'UTF8'), COALESCE($9, 0),
                    -- The cause's correlation id, found by its id (a
                    -- causation id that is not an event id finds none).
                    COALESCE($10, (SELECT c.correlation_id FROM mailroom.events c
                                   WHERE c.id = CASE WHEN $11 ~* '^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$'
                                                     THEN $11::uuid END)),
                    $11)
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
        topic          text,
        type           text,
        key            text,
        payload        jsonb,
        dedup_key      text,
        max_attempts   integer DEFAULT 15,
        deliver_at     timestamptz DEFAULT NULL,
        priority       integer DEFAULT 0,
        correlation_id text DEFAULT NULL,
        causation_id   text DEFAULT NULL
    ) RETURNS uuid
    LANGUAGE sql VOLATILE AS $$
        SELECT mailroom.enqueue_with_id(mailroom.uuid_v7(), $1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    $$;
