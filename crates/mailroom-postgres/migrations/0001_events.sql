-- Events, their attempt history, and the outbox function.

    CREATE TABLE mailroom.events (
        seq             bigserial   PRIMARY KEY,          -- arrival order
        id              uuid        NOT NULL UNIQUE,      -- UUIDv7
        source          text        NOT NULL,
        topic           text        NOT NULL,
        dedup_key       text        NOT NULL,
        key             text,
        type            text,
        status          text        NOT NULL
                        CHECK (status IN ('pending', 'running', 'done', 'dead', 'skipped')),
        attempts        bigint      NOT NULL DEFAULT 0,   -- also the current fencing token
        max_attempts    bigint      NOT NULL,
        next_attempt_at timestamptz,                      -- set while pending
        received_at     timestamptz NOT NULL DEFAULT now(),
        lease_until     timestamptz,                      -- set while running
        started_at      timestamptz,                      -- start of the current/last attempt
        worker          text,                             -- worker of the current/last attempt
        correlation_id  text,
        causation_id    text,
        content_type    text,
        payload         bytea,                            -- NULL once retention dropped it
        last_error      text,
        UNIQUE (source, dedup_key)
    );
    -- Claims walk one topic's pending events in arrival order.
    CREATE INDEX events_claim ON mailroom.events (topic, seq) WHERE status = 'pending';
    -- Sequential topics: the open events of a key, to find its head and
    -- whether it is running.
    CREATE INDEX events_open_keys ON mailroom.events (topic, key, seq)
        WHERE key IS NOT NULL AND status IN ('pending', 'running', 'dead');
    -- Lease rescue.
    CREATE INDEX events_running ON mailroom.events (lease_until) WHERE status = 'running';
    -- Listings filtered by topic, newest first.
    CREATE INDEX events_topic_seq ON mailroom.events (topic, seq);
    -- Retention walks finished events by age.
    CREATE INDEX events_finished ON mailroom.events (received_at)
        WHERE status IN ('done', 'skipped', 'dead');

    CREATE TABLE mailroom.attempts (
        event_seq   bigint      NOT NULL,                 -- events.seq
        attempt     bigint      NOT NULL,                 -- 1-based, keeps counting across replays
        started_at  timestamptz NOT NULL,
        finished_at timestamptz,
        outcome     text        NOT NULL
                    CHECK (outcome IN ('done', 'retry', 'dead', 'lease_expired')),
        error       text,
        worker      text,
        PRIMARY KEY (event_seq, attempt)
    );

    -- A UUIDv7 (RFC 9562) from the database clock. PostgreSQL 15 has no
    -- uuidv7(): take a random v4 UUID, overwrite its first 48 bits with the
    -- Unix time in milliseconds, and turn version 4 (0100) into 7 (0111) by
    -- setting two bits of byte 6 (set_bit counts from each byte's low bit).
    -- The variant bits of the v4 stay as they are, which v7 shares.
    CREATE FUNCTION mailroom.uuid_v7() RETURNS uuid
    LANGUAGE sql VOLATILE AS $$
        SELECT encode(
            set_bit(set_bit(
                overlay(uuid_send(gen_random_uuid())
                        PLACING substring(int8send(floor(extract(epoch FROM clock_timestamp()) * 1000)::bigint) FROM 3)
                        FROM 1 FOR 6),
                52, 1), 53, 1),
            'hex')::uuid
    $$;

    -- The outbox: call it inside the application's own transaction,
    -- next to its business write. The event is committed (and the
    -- notification sent) with that transaction, or not at all. A repeated
    -- dedup_key returns the stored event's id and changes nothing; a NULL
    -- dedup_key means "never a duplicate" (the new id is used).
    --
    -- Plain SQL functions, not PL/pgSQL, so nothing depends on a procedural
    -- language being installed and loadable. The work is split in two so the
    -- id generated once by the caller (an argument, evaluated once) can be
    -- used by both statements of the inner function: a VOLATILE SQL function
    -- takes a fresh snapshot per statement, so the lookup sees a duplicate's
    -- row even when a concurrent transaction committed it while the INSERT
    -- waited on it (ON CONFLICT waits for that transaction to end).
    CREATE FUNCTION mailroom.enqueue_with_id(
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
            RETURNING topic
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
        max_attempts integer DEFAULT 15
    ) RETURNS uuid
    LANGUAGE sql VOLATILE AS $$
        SELECT mailroom.enqueue_with_id(mailroom.uuid_v7(), $1, $2, $3, $4, $5, $6)
    $$;
