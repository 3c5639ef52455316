//! The schema, as an ordered list of migrations, and the lock that lets
//! several instances start at once.
//!
//! Operators query these tables (schema `mailroom`; `mailroom.events` keeps
//! at least `id`, `source`, `topic`, `dedup_key`, `key`, `type`, `status`,
//! `attempts` and `received_at`), so columns are named plainly and times
//! are `timestamptz`.

use crate::sql::db;
use mailroom_core::{Migrated, Result, SchemaVersion, StoreError};
use sqlx::{PgConnection, PgPool};

/// Key of the transaction-scoped advisory lock migrations run under
/// (`pg_advisory_xact_lock`): the ASCII of "mailroom" read as a number, so it
/// is unlikely to meet an application's own advisory locks.
const MIGRATION_LOCK: i64 = 0x6d61_696c_726f_6f6d;

/// Migration `n` is `MIGRATIONS[n - 1]`. Append only; never edit a shipped one.
const MIGRATIONS: &[&str] = &[
    // 1: events, their attempt history, and the outbox function.
    r#"
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
    "#,
    // 2: leases for electing the one instance that runs maintenance.
    r#"
    CREATE TABLE mailroom.leaders (
        role        text        PRIMARY KEY,              -- e.g. 'maintenance'
        holder      text        NOT NULL,                 -- the instance's worker name
        lease_until timestamptz NOT NULL
    );
    "#,
    // 3: "is any event of this key running?" (the head rule of sequential
    // topics) as one index seek, instead of walking every open event of the
    // key through the heap: claims of sequential topics were ~40 ms each.
    // And vacuum this queue table early: every finished event leaves dead
    // entries in the partial indexes that head checks must step over until
    // vacuum removes them (the usual advice for job tables).
    r#"
    CREATE INDEX events_running_keys ON mailroom.events (topic, key) WHERE status = 'running';
    ALTER TABLE mailroom.events SET (
        autovacuum_vacuum_scale_factor = 0.01,
        autovacuum_vacuum_threshold = 1000,
        autovacuum_vacuum_cost_delay = 0
    );
    "#,
    // 4: the attempts of the last minutes, for the failure_rate and
    // processing_time alerts. History rows are appended in finished_at
    // order, which a BRIN index summarises for almost nothing per insert.
    r#"
    CREATE INDEX attempts_finished ON mailroom.attempts USING brin (finished_at);
    "#,
    // 5: claims that only `events_claim` can serve, and one index entry
    // less per claim of a keyless event.
    // - `events_topic_seq (topic, seq)` could serve claims as well as
    //   `events_claim` does: with statistics taken while every row was
    //   pending the two tie, the planner took it, and each claim then
    //   stepped over every finished row of the topic. Listings by topic now
    //   read pending events from `events_claim` and the others from
    //   `events_listing`, which a claim (`status = 'pending'`) cannot use.
    // - `events_running_keys` only serves keyed events (its lookups compare
    //   `key`), but took an entry for every keyless claim too.
    r#"
    DROP INDEX mailroom.events_topic_seq;
    CREATE INDEX events_listing ON mailroom.events (topic, seq) WHERE status <> 'pending';
    DROP INDEX mailroom.events_running_keys;
    CREATE INDEX events_running_keys ON mailroom.events (topic, key)
        WHERE status = 'running' AND key IS NOT NULL;
    "#,
    // 6: `events_listing` holds finished events only. A running event
    // satisfied its `status <> 'pending'`, so every statement looking for
    // running events (a completion's `status = 'running'`, the head rule's
    // "is one of this key running?") could be planned as a walk of it, over
    // every finished event. Completions were: with statistics taken while
    // the events were pending, the index looked empty, and the cached plan
    // then scanned a growing index on every completion (8 ms per group of
    // 64 after 50,000 events, against 0.8 ms). It also took an entry at
    // every claim that no listing needed. Listings by topic read running
    // events (few: at most the topics' concurrency) through
    // `events_running`.
    r#"
    DROP INDEX mailroom.events_listing;
    CREATE INDEX events_listing ON mailroom.events (topic, seq)
        WHERE status IN ('done', 'dead', 'skipped');
    "#,
    // 7: the work still to do moves to a narrow table of its own, so the
    // database does far less per drained event (docs/src/design/postgres.md,
    // "The queue table").
    // - `mailroom.queue` holds one row per open event: pending, running, or
    //   dead with a key (a dead head blocks its key under `on_dead =
    //   block`). Claims walk its `queue_claim` index; a completion deletes
    //   the row (or sends it back to pending for a retry). `priority` and
    //   `run_at` (the due time) are there for scheduling: claims take the
    //   highest priority first, then arrival order, among due rows.
    // - `mailroom.events` stays the durable record operators query: every
    //   column, `status` included, is kept current. None of its
    //   indexes mentions a column a claim or a completion changes, and
    //   `fillfactor` leaves room on each page, so both updates are HOT (no
    //   index entry). Its status-keyed partial indexes go; listings by
    //   topic read `events_topic_seq`, retention `events_received`.
    // - The outbox function writes the queue row too.
    r#"
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
    "#,
    // 8: the statuses `cancelled` (withdrawn by an operator) and
    // `expired` (older than the topic's expire_after): final like dead.
    r#"
    ALTER TABLE mailroom.events DROP CONSTRAINT events_status_check;
    ALTER TABLE mailroom.events ADD CONSTRAINT events_status_check CHECK
        (status IN ('pending', 'running', 'done', 'dead', 'skipped', 'cancelled', 'expired'));
    "#,
    // 9: the W3C traceparent received with an event, forwarded (as a child)
    // to its handler calls. NULL without one, and for outbox rows
    // (`mailroom.enqueue` does not take one).
    r#"
    ALTER TABLE mailroom.events ADD COLUMN traceparent text;
    "#,
    // 10: scheduling limits (`rate`, `max_running`), one row per limited
    // or paused topic: the rate budget every instance takes grants from (a token
    // bucket refilled on the database clock, holding at most one grant) and
    // the pause a handler's 429 + Retry-After asked for.
    r#"
    CREATE TABLE mailroom.topic_limits (
        topic        text             PRIMARY KEY,
        tokens       double precision NOT NULL DEFAULT 0,
        refilled_at  timestamptz      NOT NULL DEFAULT clock_timestamp(),
        paused_until timestamptz
    );

    -- Takes up to `want` whole tokens from the topic's budget after
    -- refilling it by the time since the last take (at `per_second`, capped
    -- at `cap`). The clock is read after the row lock, so a take that
    -- waited for another sees the time it really runs at.
    CREATE FUNCTION mailroom.take_tokens(
        p_topic text, per_second double precision, cap double precision, want integer,
        OUT granted integer, OUT wait_ms bigint
    ) LANGUAGE plpgsql VOLATILE AS $$
    DECLARE
        have double precision;
        since timestamptz;
        t timestamptz;
    BEGIN
        INSERT INTO mailroom.topic_limits (topic, tokens, refilled_at)
        VALUES (p_topic, cap, clock_timestamp())
        ON CONFLICT (topic) DO NOTHING;
        SELECT l.tokens, l.refilled_at INTO have, since
        FROM mailroom.topic_limits l WHERE l.topic = p_topic FOR UPDATE;
        t := clock_timestamp();
        have := LEAST(cap, have + per_second * GREATEST(0, EXTRACT(EPOCH FROM t - since)::double precision));
        granted := GREATEST(0, LEAST(want, floor(have)))::integer;
        UPDATE mailroom.topic_limits
        SET tokens = have - granted, refilled_at = GREATEST(t, since)
        WHERE topic = p_topic;
        wait_ms := CASE WHEN granted > 0 THEN 0
                   ELSE GREATEST(1, ceil((LEAST(want, cap) - have) / per_second * 1000))::bigint END;
    END;
    $$;
    "#,
    // 11: scheduling (`deliver_at`, `priority`, `expire_after`,
    // `max_wait_for_priority`).
    // - `events.priority` is the event's priority as given (shown);
    //   `queue.priority` (migration 7) is what claims order by, raised for
    //   an event that waited `max_wait_for_priority` (the starvation bound).
    // - Events delivered later wait in the queue as `scheduled` rows, out of
    //   `queue_claim`, so claims never step over them; `queue_scheduled`
    //   finds the ones that fell due (claims move them to `pending`) and the
    //   next due time. Pending rows due later (retries, and delayed events
    //   stored before this migration) move there too.
    // - `queue.ready_at` starts the expiry clock (`expire_after`): the first
    //   due time, or the last replay. Rows queued before this migration
    //   start it now.
    // - `mailroom.enqueue` gains optional trailing `deliver_at` and
    //   `priority`; calls with the old arguments keep working.
    r#"
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
    "#,
    // 12: the dashboard's numbers without scans (the overview in
    // under 100 ms with 1,000,000 events stored), kept by triggers so they
    // are exact whichever statement changes a status (intake, the outbox
    // function, claims, completions, replay, skip, cancel, expiry, rescue,
    // retention), and cheap for the drain (docs/src/design/README.md, "The
    // dashboard's numbers are kept, not counted"):
    // - Statement-level triggers with transition tables: one trigger call
    //   per statement, and the writer and the completer group many events
    //   into one statement, so a group commit adds one change row per
    //   topic and status it touched, not one per event.
    // - The change rows are only ever inserted (`count_changes`,
    //   `traffic_changes`): no row that every instance updates, so
    //   completions of several instances never wait on each other for a
    //   counter. Readers add them to the folded totals (`counts`,
    //   `traffic`) in one snapshot; maintenance folds them every period.
    // - `traffic`: per topic and minute (seconds since the epoch / 60),
    //   events received (by `received_at`) and attempts finished, done or
    //   failed: an attempt finishes exactly when its event leaves
    //   `running`, so that change counts it, in the minute it commits.
    // - `dead_letters`: the dead events, so their page and count walk them
    //   only. An index on `events` keyed by status would make every claim
    //   and completion of `events` a non-HOT update.
    // - `queue_dead`: the dead heads of keys, for the blocked-key count,
    //   which walked the whole queue; only a dying event writes an entry.
    // The triggers come first: creating them locks `events` against
    // writes until this migration commits, so the backfill is exact.
    r#"
    CREATE TABLE mailroom.counts (
        topic  text   NOT NULL,
        status text   NOT NULL,
        n      bigint NOT NULL,
        PRIMARY KEY (topic, status)
    );
    CREATE TABLE mailroom.count_changes (
        topic  text   NOT NULL,
        status text   NOT NULL,
        n      bigint NOT NULL
    ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
    CREATE TABLE mailroom.traffic (
        topic    text   NOT NULL,
        minute   bigint NOT NULL,
        received bigint NOT NULL DEFAULT 0,
        done     bigint NOT NULL DEFAULT 0,
        failed   bigint NOT NULL DEFAULT 0,
        PRIMARY KEY (topic, minute)
    );
    CREATE TABLE mailroom.traffic_changes (
        topic    text   NOT NULL,
        minute   bigint NOT NULL,
        received bigint NOT NULL DEFAULT 0,
        done     bigint NOT NULL DEFAULT 0,
        failed   bigint NOT NULL DEFAULT 0
    ) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);
    CREATE TABLE mailroom.dead_letters (
        seq   bigint PRIMARY KEY,                       -- events.seq
        topic text   NOT NULL
    );
    CREATE INDEX dead_letters_topic ON mailroom.dead_letters (topic, seq);
    CREATE INDEX queue_dead ON mailroom.queue (topic, key, seq) WHERE state = 'dead';

    CREATE FUNCTION mailroom.count_inserted() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM inserted) THEN
            RETURN NULL;
        END IF;
        WITH counted AS (
            INSERT INTO mailroom.count_changes (topic, status, n)
            SELECT topic, status, count(*) FROM inserted GROUP BY 1, 2
        ), buried AS (
            INSERT INTO mailroom.dead_letters (seq, topic)
            SELECT seq, topic FROM inserted WHERE status = 'dead'
        )
        INSERT INTO mailroom.traffic_changes (topic, minute, received)
        SELECT topic, floor(extract(epoch FROM received_at) / 60)::int8, count(*)
        FROM inserted GROUP BY 1, 2;
        RETURN NULL;
    END $$;
    CREATE FUNCTION mailroom.count_updated() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM new_rows) THEN
            RETURN NULL;
        END IF;
        WITH changed AS MATERIALIZED (
            SELECT a.seq, a.topic, b.status AS was, a.status AS became
            FROM old_rows b JOIN new_rows a ON a.seq = b.seq
            WHERE a.status <> b.status
        ), counted AS (
            INSERT INTO mailroom.count_changes (topic, status, n)
            SELECT topic, status, sum(n) FROM (
                SELECT topic, was AS status, -1 AS n FROM changed
                UNION ALL
                SELECT topic, became, 1 FROM changed
            ) c GROUP BY 1, 2 HAVING sum(n) <> 0
        ), finished AS (
            INSERT INTO mailroom.traffic_changes (topic, minute, done, failed)
            SELECT topic, floor(extract(epoch FROM now()) / 60)::int8,
                   count(*) FILTER (WHERE became = 'done'), count(*) FILTER (WHERE became <> 'done')
            FROM changed WHERE was = 'running' GROUP BY topic
        ), buried AS (
            INSERT INTO mailroom.dead_letters (seq, topic)
            SELECT seq, topic FROM changed WHERE became = 'dead'
        )
        DELETE FROM mailroom.dead_letters d USING changed c
        WHERE d.seq = c.seq AND c.was = 'dead';
        RETURN NULL;
    END $$;
    CREATE FUNCTION mailroom.count_deleted() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM deleted) THEN
            RETURN NULL;
        END IF;
        WITH counted AS (
            INSERT INTO mailroom.count_changes (topic, status, n)
            SELECT topic, status, -count(*) FROM deleted GROUP BY 1, 2
        )
        DELETE FROM mailroom.dead_letters d USING deleted g
        WHERE d.seq = g.seq AND g.status = 'dead';
        RETURN NULL;
    END $$;
    CREATE TRIGGER events_counted AFTER INSERT ON mailroom.events
        REFERENCING NEW TABLE AS inserted
        FOR EACH STATEMENT EXECUTE FUNCTION mailroom.count_inserted();
    CREATE TRIGGER events_recounted AFTER UPDATE ON mailroom.events
        REFERENCING OLD TABLE AS old_rows NEW TABLE AS new_rows
        FOR EACH STATEMENT EXECUTE FUNCTION mailroom.count_updated();
    CREATE TRIGGER events_uncounted AFTER DELETE ON mailroom.events
        REFERENCING OLD TABLE AS deleted
        FOR EACH STATEMENT EXECUTE FUNCTION mailroom.count_deleted();

    INSERT INTO mailroom.counts (topic, status, n)
    SELECT topic, status, count(*) FROM mailroom.events GROUP BY 1, 2;
    INSERT INTO mailroom.traffic (topic, minute, received)
    SELECT topic, floor(extract(epoch FROM received_at) / 60)::int8, count(*)
    FROM mailroom.events WHERE received_at >= now() - interval '2 hours' GROUP BY 1, 2;
    INSERT INTO mailroom.traffic (topic, minute, done, failed)
    SELECT e.topic, floor(extract(epoch FROM a.finished_at) / 60)::int8,
           count(*) FILTER (WHERE a.outcome = 'done'), count(*) FILTER (WHERE a.outcome <> 'done')
    FROM mailroom.attempts a JOIN mailroom.events e ON e.seq = a.event_seq
    WHERE a.finished_at >= now() - interval '2 hours' GROUP BY 1, 2
    ON CONFLICT (topic, minute) DO UPDATE SET done = EXCLUDED.done, failed = EXCLUDED.failed;
    INSERT INTO mailroom.dead_letters (seq, topic)
    SELECT seq, topic FROM mailroom.events WHERE status = 'dead';
    "#,
    // 13: the update trigger of migration 12, cheaper for the drain's two
    // statements. Its join of the old and new rows (which event left
    // which status) is only needed when an attempt ends beside other
    // changes, or an event dies or leaves `dead`. A claim (nothing was
    // running or dead, nothing dies) records the net change per topic and
    // status, which the old and new rows give without a join; a completion
    // that kills nothing (every event was running, none is running or dead
    // now) also records each event as a finished attempt, again from the
    // new rows alone. The trigger's share of the claim and completion
    // statements' time was about 30 % (pg_stat_statements over a `single`
    // drain; docs/src/design/README.md).
    r#"
    CREATE OR REPLACE FUNCTION mailroom.count_updated() RETURNS trigger
    LANGUAGE plpgsql AS $$
    BEGIN
        IF NOT EXISTS (SELECT 1 FROM new_rows) THEN
            RETURN NULL;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM old_rows WHERE status IN ('running', 'dead'))
           AND NOT EXISTS (SELECT 1 FROM new_rows WHERE status = 'dead') THEN
            INSERT INTO mailroom.count_changes (topic, status, n)
            SELECT topic, status, sum(n) FROM (
                SELECT topic, status, -1 AS n FROM old_rows
                UNION ALL
                SELECT topic, status, 1 FROM new_rows
            ) c GROUP BY 1, 2 HAVING sum(n) <> 0;
            RETURN NULL;
        END IF;
        IF NOT EXISTS (SELECT 1 FROM old_rows WHERE status <> 'running')
           AND NOT EXISTS (SELECT 1 FROM new_rows WHERE status IN ('running', 'dead')) THEN
            WITH counted AS (
                INSERT INTO mailroom.count_changes (topic, status, n)
                SELECT topic, status, sum(n) FROM (
                    SELECT topic, status, -1 AS n FROM old_rows
                    UNION ALL
                    SELECT topic, status, 1 FROM new_rows
                ) c GROUP BY 1, 2 HAVING sum(n) <> 0
            )
            INSERT INTO mailroom.traffic_changes (topic, minute, done, failed)
            SELECT topic, floor(extract(epoch FROM now()) / 60)::int8,
                   count(*) FILTER (WHERE status = 'done'), count(*) FILTER (WHERE status <> 'done')
            FROM new_rows GROUP BY topic;
            RETURN NULL;
        END IF;
        WITH changed AS MATERIALIZED (
            SELECT a.seq, a.topic, b.status AS was, a.status AS became
            FROM old_rows b JOIN new_rows a ON a.seq = b.seq
            WHERE a.status <> b.status
        ), counted AS (
            INSERT INTO mailroom.count_changes (topic, status, n)
            SELECT topic, status, sum(n) FROM (
                SELECT topic, was AS status, -1 AS n FROM changed
                UNION ALL
                SELECT topic, became, 1 FROM changed
            ) c GROUP BY 1, 2 HAVING sum(n) <> 0
        ), finished AS (
            INSERT INTO mailroom.traffic_changes (topic, minute, done, failed)
            SELECT topic, floor(extract(epoch FROM now()) / 60)::int8,
                   count(*) FILTER (WHERE became = 'done'), count(*) FILTER (WHERE became <> 'done')
            FROM changed WHERE was = 'running' GROUP BY topic
        ), buried AS (
            INSERT INTO mailroom.dead_letters (seq, topic)
            SELECT seq, topic FROM changed WHERE became = 'dead'
        )
        DELETE FROM mailroom.dead_letters d USING changed c
        WHERE d.seq = c.seq AND c.was = 'dead';
        RETURN NULL;
    END $$;
    "#,
    // 14: `queue_keys` leaves out running rows. A claim (pending to
    // running) then adds no entry to it, and a completion (which deletes a
    // running row) leaves no dead entry in it: the head probes of
    // sequential claims step over one dead entry per finished event of
    // their key instead of two. A running event of the key is found by
    // `queue_running`, which every head test probes anyway
    // (docs/src/design/sequential.md).
    r#"
    DROP INDEX mailroom.queue_keys;
    CREATE INDEX queue_keys ON mailroom.queue (topic, key, seq)
        WHERE key IS NOT NULL AND state <> 'running';
    "#,
    // 15: each recorded version says which older builds still run against
    // the schema it made (`compatible_from`; NULL: only builds that know
    // it), so a build that meets a newer schema than its own knows whether
    // to run (a rolling upgrade) or to refuse (`SchemaVersion`).
    r#"
    ALTER TABLE mailroom.schema_migrations ADD COLUMN compatible_from bigint;
    "#,
];

/// The migration that added `schema_migrations.compatible_from`.
const COMPATIBLE_FROM_COLUMN: usize = 15;

/// Migrations that builds which do not know them still run against: the
/// version, and the oldest build version that runs against the schema it
/// makes (recorded as `compatible_from`). A migration not listed needs a
/// build that knows it. Only migrations that older builds cannot notice
/// qualify: a new table or index they do not use, a nullable column or one
/// with a default that their statements do not name, a function they do
/// not call; never a dropped or renamed object, a tightened constraint or
/// a changed function that older builds call. Tested by
/// `tests::compatibility_marks_name_older_builds_only`.
const COMPATIBLE_FROM: &[(usize, u32)] = &[
    // Builds of 14 never read the column.
    (15, 14),
];

/// Applies the missing migrations in one transaction that first takes
/// [`MIGRATION_LOCK`]: a second instance starting at the same time waits for
/// the lock, then finds nothing left to do. The lock ends with the
/// transaction, so a crash cannot leave it held. A schema newer than this
/// build's is left as it is (and refused unless compatible). A schema that
/// needs nothing is found so without any DDL, so a role that may only use
/// the schema's objects can call this too.
pub(crate) async fn migrate(pool: &PgPool) -> Result<Migrated> {
    migrate_to(pool, MIGRATIONS.len()).await
}

/// [`migrate`], up to migration `last` (tests fill older schemas with it).
pub(crate) async fn migrate_to(pool: &PgPool, last: usize) -> Result<Migrated> {
    const CTX: &str = "migrating the schema";
    let seen = read_version(pool, version_of(last)).await?;
    if seen.database >= seen.build {
        seen.require_runnable()?;
        return Ok(Migrated {
            from: seen.database,
            schema: seen,
        });
    }
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    sqlx::query("SELECT pg_advisory_xact_lock($1)")
        .bind(MIGRATION_LOCK)
        .execute(&mut *tx)
        .await
        .map_err(db(CTX))?;
    sqlx::raw_sql(
        "CREATE SCHEMA IF NOT EXISTS mailroom;
         CREATE TABLE IF NOT EXISTS mailroom.schema_migrations (
             version    bigint      PRIMARY KEY,
             applied_at timestamptz NOT NULL DEFAULT clock_timestamp()
         );",
    )
    .execute(&mut *tx)
    .await
    .map_err(db(CTX))?;
    let found = recorded(&mut tx, version_of(last)).await?;
    if found.database >= found.build {
        // Current, or newer: nothing to apply; a newer schema this build
        // cannot use is refused before anything else runs.
        found.require_runnable()?;
        tx.commit().await.map_err(db(CTX))?;
        return Ok(Migrated {
            from: found.database,
            schema: found,
        });
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().take(last) {
        let version = index + 1;
        if version_of(version) <= found.database {
            continue;
        }
        sqlx::raw_sql(*migration)
            .execute(&mut *tx)
            .await
            .map_err(db("applying a schema migration"))?;
        let record = match compatible_from(version).filter(|_| version >= COMPATIBLE_FROM_COLUMN) {
            Some(floor) => sqlx::query(
                "INSERT INTO mailroom.schema_migrations (version, compatible_from)
                     VALUES ($1, $2)",
            )
            .bind(i64::from(version_of(version)))
            .bind(i64::from(floor)),
            None => sqlx::query("INSERT INTO mailroom.schema_migrations (version) VALUES ($1)")
                .bind(i64::from(version_of(version))),
        };
        record.execute(&mut *tx).await.map_err(db(CTX))?;
        tracing::info!(version, "applied PostgreSQL schema migration");
    }
    let schema = recorded(&mut tx, version_of(last)).await?;
    tx.commit().await.map_err(db(CTX))?;
    Ok(Migrated {
        from: found.database,
        schema,
    })
}

/// The schema's version, read without changing anything
/// ([`Store::schema`](mailroom_core::Store::schema)).
pub(crate) async fn version(pool: &PgPool) -> Result<SchemaVersion> {
    read_version(pool, version_of(MIGRATIONS.len())).await
}

/// [`version`], against a build that knows `build` migrations.
async fn read_version(pool: &PgPool, build: u32) -> Result<SchemaVersion> {
    const CTX: &str = "reading the schema version";
    let mut conn = pool.acquire().await.map_err(db(CTX))?;
    let exists: bool =
        sqlx::query_scalar("SELECT to_regclass('mailroom.schema_migrations') IS NOT NULL")
            .fetch_one(&mut *conn)
            .await
            .map_err(db(CTX))?;
    if !exists {
        return Ok(SchemaVersion {
            database: 0,
            compatible_from: 0,
            build,
        });
    }
    recorded(&mut conn, build).await
}

/// The newest recorded migration and its `compatible_from` (a column older
/// schemas lack: read through the row's JSON, where it is simply absent).
async fn recorded(conn: &mut PgConnection, build: u32) -> Result<SchemaVersion> {
    const CTX: &str = "reading the schema version";
    let row: Option<(i64, Option<i64>)> = sqlx::query_as(
        "SELECT version, (to_jsonb(m) ->> 'compatible_from')::bigint
         FROM mailroom.schema_migrations m ORDER BY version DESC LIMIT 1",
    )
    .fetch_optional(&mut *conn)
    .await
    .map_err(db(CTX))?;
    let (database, floor) = row.unwrap_or((0, None));
    let database = u32::try_from(database)
        .map_err(|_| StoreError::Corrupt(format!("schema version {database} out of range")))?;
    let compatible_from = floor
        .and_then(|f| u32::try_from(f).ok())
        .map_or(database, |f| f.min(database));
    Ok(SchemaVersion {
        database,
        compatible_from,
        build,
    })
}

/// The SQL an owner of schema `mailroom` runs so that `role` can run
/// mailroom without changing the schema: use the schema, read and write its
/// tables, take its sequences' numbers, call its functions, and the same
/// for what later migrations create (default privileges of the role that
/// runs it, the one that migrates). `mailroom migrate --print-grants`
/// prints it; docs/src/guides/operations.md, "Migrations and least privilege".
pub fn grants(role: &str) -> String {
    let role = format!("\"{}\"", role.replace('"', "\"\""));
    format!(
        "-- Run as the role that owns schema mailroom (the one `mailroom migrate` uses),\n\
         -- after `mailroom migrate`. {role} also needs LOGIN and CONNECT on the database.\n\
         GRANT USAGE ON SCHEMA mailroom TO {role};\n\
         GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA mailroom TO {role};\n\
         GRANT USAGE ON ALL SEQUENCES IN SCHEMA mailroom TO {role};\n\
         GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA mailroom TO {role};\n\
         -- What later migrations create, run by this same role, gets the same rights.\n\
         ALTER DEFAULT PRIVILEGES IN SCHEMA mailroom\n    \
             GRANT SELECT, INSERT, UPDATE, DELETE ON TABLES TO {role};\n\
         ALTER DEFAULT PRIVILEGES IN SCHEMA mailroom GRANT USAGE ON SEQUENCES TO {role};\n\
         ALTER DEFAULT PRIVILEGES IN SCHEMA mailroom GRANT EXECUTE ON FUNCTIONS TO {role};\n"
    )
}

/// Migration `n`'s number as recorded (`n` is at most a few dozen).
fn version_of(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The oldest build version that runs against the schema migration
/// `version` makes, when older than the migration itself.
fn compatible_from(version: usize) -> Option<u32> {
    COMPATIBLE_FROM
        .iter()
        .find(|(v, _)| *v == version)
        .map(|(_, floor)| *floor)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::{MIGRATIONS, migrate_to};
    use crate::{PostgresOptions, PostgresStore};
    use mailroom_core::{ClaimRequest, EventId, OnDead, Status, Store, StoreError};
    use sqlx::PgPool;
    use std::time::Duration;

    /// Events in every status as schema 6 stored them, with their attempt
    /// history: in topic `t` (sequential) `p1` pending head of k1, `r1`
    /// running (lease expired) on k2 after a retry, `x1` dead head of k3
    /// with `x2` pending behind it, `s1` skipped on k4; keyless `d1` done
    /// and `f1` pending, retrying in an hour.
    const SCHEMA_6_EVENTS: &str = "
        INSERT INTO mailroom.events (id, source, topic, dedup_key, key, type, status, attempts,
            max_attempts, next_attempt_at, received_at, lease_until, started_at, worker,
            content_type, payload, last_error)
        SELECT mailroom.uuid_v7(), 'test', 't', d, k, 'thing.happened', s, a, 3,
               CASE s WHEN 'pending' THEN now() + due * interval '1 hour' END,
               now() - (10 - n) * interval '1 minute',
               CASE s WHEN 'running' THEN now() - interval '1 minute' END,
               CASE WHEN a > 0 THEN now() - interval '2 minutes' END,
               CASE WHEN a > 0 THEN 'w1' END,
               'application/json', convert_to('{\"n\":' || n || '}', 'UTF8'),
               CASE WHEN a > 1 OR s IN ('dead', 'skipped') THEN 'boom' END
        FROM (VALUES (1, 'p1', 'k1', 'pending', 0, 0), (2, 'r1', 'k2', 'running', 2, 0),
                     (3, 'd1', NULL, 'done', 1, 0), (4, 'x1', 'k3', 'dead', 2, 0),
                     (5, 'x2', 'k3', 'pending', 0, 0), (6, 's1', 'k4', 'skipped', 1, 0),
                     (7, 'f1', NULL, 'pending', 1, 1))
             AS v(n, d, k, s, a, due)
        ORDER BY n;
        INSERT INTO mailroom.attempts (event_seq, attempt, started_at, finished_at, outcome, error, worker)
        SELECT e.seq, h.attempt, now() - interval '5 minutes', now() - interval '4 minutes',
               h.outcome, h.error, 'w1'
        FROM mailroom.events e
        JOIN (VALUES ('r1', 1, 'retry', 'boom'), ('d1', 1, 'done', NULL),
                     ('x1', 1, 'retry', 'boom'), ('x1', 2, 'dead', 'boom'),
                     ('s1', 1, 'dead', 'boom'), ('f1', 1, 'retry', 'boom'))
             AS h(dedup_key, attempt, outcome, error) ON h.dedup_key = e.dedup_key;";

    /// Every row of `table` as JSON, in key order.
    async fn rows(pool: &PgPool, table: &str) -> Vec<serde_json::Value> {
        let sql = format!("SELECT to_jsonb(r)::text FROM {table} r ORDER BY 1");
        let texts: Vec<String> = sqlx::query_scalar(sqlx::AssertSqlSafe(sql))
            .fetch_all(pool)
            .await
            .unwrap();
        texts
            .iter()
            .map(|t| serde_json::from_str(t).unwrap())
            .collect()
    }

    async fn id_of(pool: &PgPool, dedup_key: &str) -> EventId {
        let id: String =
            sqlx::query_scalar("SELECT id::text FROM mailroom.events WHERE dedup_key = $1")
                .bind(dedup_key)
                .fetch_one(pool)
                .await
                .unwrap();
        EventId::parse_stored(&id).unwrap()
    }

    /// A fresh database migrated up to `version`, and a store on it (which
    /// migrates no further until asked).
    async fn at_schema(version: usize) -> (PgPool, PostgresStore) {
        let url = mailroom_testkit::fresh_postgres_db().await;
        let pool = PgPool::connect(&url).await.unwrap();
        migrate_to(&pool, version).await.unwrap();
        let store = PostgresStore::connect(PostgresOptions::from_url(&url).unwrap())
            .await
            .unwrap();
        (pool, store)
    }

    /// A database filled by the schema before the queue table (events in
    /// every status, history, dedup keys) is migrated: every event and
    /// attempt is intact, duplicates of keys stored before are still
    /// answered with the stored id, and the open events are claimed,
    /// rescued and blocked as before.
    #[tokio::test]
    async fn the_queue_migration_carries_events_history_and_dedup_keys_forward() {
        let (pool, store) = at_schema(6).await;
        sqlx::raw_sql(SCHEMA_6_EVENTS).execute(&pool).await.unwrap();
        let (events, attempts) = (
            rows(&pool, "mailroom.events").await,
            rows(&pool, "mailroom.attempts").await,
        );
        assert_eq!((events.len(), attempts.len()), (7, 6));

        store.migrate().await.unwrap();
        let mut after = rows(&pool, "mailroom.events").await;
        // Columns of later migrations start NULL (9: traceparent) or at
        // their default (11: priority 0).
        for row in &mut after {
            let added = row.as_object_mut().and_then(|r| r.remove("traceparent"));
            assert_eq!(added, Some(serde_json::Value::Null));
            let added = row.as_object_mut().and_then(|r| r.remove("priority"));
            assert_eq!(added, Some(serde_json::json!(0)));
        }
        assert_eq!(after, events);
        assert_eq!(rows(&pool, "mailroom.attempts").await, attempts);
        let x1 = store.get(id_of(&pool, "x1").await).await.unwrap().unwrap();
        assert_eq!(
            (x1.status, x1.attempts, x1.history.len()),
            (Status::Dead, 2, 2)
        );

        for dedup in ["p1", "r1", "d1", "x1", "s1"] {
            let again = mailroom_conformance::event("t", dedup, None);
            let answer = store.insert(again).await.unwrap();
            assert!(answer.duplicate, "{dedup} was stored again");
            assert_eq!(answer.id, id_of(&pool, dedup).await);
        }

        let req = ClaimRequest {
            topic: "t".into(),
            worker: "w2".into(),
            max: 10,
            lease: Duration::from_secs(30),
            per_key: Some(OnDead::Block),
            max_wait_for_priority: None,
            expire_after: None,
        };
        let claimed = |c: Vec<mailroom_core::Claimed>| -> Vec<String> {
            c.into_iter().map(|c| c.event.dedup_key).collect()
        };
        // k2 runs, k3's dead head blocks x2, f1 is not due.
        assert_eq!(claimed(store.claim(&req).await.unwrap()), ["p1"]);
        assert_eq!(store.rescue_expired().await.unwrap(), 1);
        let r1 = store.claim(&req).await.unwrap();
        assert_eq!(r1[0].token.0, 3, "r1's attempts keep counting");
        assert_eq!(claimed(r1), ["r1"]);
        store.skip(id_of(&pool, "x1").await).await.unwrap();
        assert_eq!(claimed(store.claim(&req).await.unwrap()), ["x2"]);
        assert!(store.claim(&req).await.unwrap().is_empty());
    }

    /// The counters of migration 12 start from the rows already stored: a
    /// database of schema 6 (events in every status, their history) migrates
    /// to stats, dead letters, blocked keys and traffic that count them.
    #[tokio::test]
    async fn the_counters_migration_counts_the_events_already_stored() {
        let (pool, store) = at_schema(6).await;
        sqlx::raw_sql(SCHEMA_6_EVENTS).execute(&pool).await.unwrap();
        store.migrate().await.unwrap();
        let stats = store.stats().await.unwrap();
        assert_eq!(stats.len(), 1);
        let t = &stats[0];
        let counts: Vec<(&str, u64)> = Status::ALL
            .iter()
            .map(|s| (s.as_str(), t.count(*s)))
            .filter(|(_, n)| *n > 0)
            .collect();
        assert_eq!(
            counts,
            [
                ("pending", 3),
                ("running", 1),
                ("done", 1),
                ("dead", 1),
                ("skipped", 1)
            ]
        );
        assert_eq!(t.blocked_keys, 1, "k3's dead head");
        let p1 = store.get(id_of(&pool, "p1").await).await.unwrap().unwrap();
        assert_eq!(t.oldest_pending, Some(p1.received_at));
        let dead = mailroom_core::EventSearch {
            filter: mailroom_core::ListFilter {
                status: Some(Status::Dead),
                ..mailroom_core::ListFilter::default()
            },
            ..mailroom_core::EventSearch::default()
        };
        assert_eq!(store.count(&dead).await.unwrap(), 1);
        let traffic = store.throughput(Duration::from_secs(3600)).await.unwrap();
        let sum = traffic.iter().fold((0, 0, 0), |(r, d, f), t| {
            (r + t.received, d + t.done, f + t.failed)
        });
        assert_eq!(sum, (7, 1, 5), "received, attempts done, attempts failed");
    }

    /// Stats counters and traffic as the database counts them itself.
    async fn counted(store: &PostgresStore, pool: &PgPool) {
        let full: Vec<(String, i64)> =
            sqlx::query_as("SELECT status, count(*) FROM mailroom.events GROUP BY 1 ORDER BY 1")
                .fetch_all(pool)
                .await
                .unwrap();
        let stats = store.stats().await.unwrap();
        let counters: Vec<(String, i64)> = Status::ALL
            .iter()
            .map(|s| (s.as_str().to_owned(), stats[0].count(*s) as i64))
            .filter(|(_, n)| *n > 0)
            .collect::<std::collections::BTreeMap<_, _>>()
            .into_iter()
            .collect();
        assert_eq!(counters, full, "counters by status");
        let (done, failed): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE outcome = 'done'), count(*) FILTER (WHERE outcome <> 'done')
             FROM mailroom.attempts",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        let traffic = store.throughput(Duration::from_secs(3600)).await.unwrap();
        let sum = traffic
            .iter()
            .fold((0, 0), |(d, f), t| (d + t.done, f + t.failed));
        assert_eq!(sum, (done as u64, failed as u64), "traffic: done, failed");
    }

    /// Migration 13 replaces the counters' update trigger: events claimed
    /// under schema 12 and finished under 13 (done, retried, dead, rescued)
    /// leave the counters, the dead letters and the traffic exact.
    #[tokio::test]
    async fn the_cheaper_counter_trigger_keeps_counting_events_claimed_before_it() {
        use mailroom_core::Completion;
        let (pool, store) = at_schema(12).await;
        for i in 0..8 {
            let e = mailroom_conformance::event("t", &format!("e{i}"), None);
            store.insert(e).await.unwrap();
        }
        let req = |max, lease| ClaimRequest {
            topic: "t".into(),
            worker: "w".into(),
            max,
            lease,
            per_key: None,
            max_wait_for_priority: None,
            expire_after: None,
        };
        let before = store.claim(&req(6, Duration::from_secs(30))).await.unwrap();
        store
            .complete(before[0].event.id, before[0].token, Completion::Done)
            .await
            .unwrap();
        counted(&store, &pool).await;

        store.migrate().await.unwrap();
        let ends = [
            Completion::Done,
            Completion::Retry {
                delay: Duration::ZERO,
                error: "busy".into(),
            },
            Completion::Dead {
                error: "boom".into(),
            },
        ];
        for (c, end) in before[1..4].iter().zip(ends) {
            store.complete(c.event.id, c.token, end).await.unwrap();
        }
        counted(&store, &pool).await;
        let short = store
            .claim(&req(2, Duration::from_millis(1)))
            .await
            .unwrap();
        assert_eq!(short.len(), 2);
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(store.rescue_expired().await.unwrap(), 2);
        store.replay(before[3].event.id, 3).await.unwrap();
        counted(&store, &pool).await;
        let dead: i64 = sqlx::query_scalar("SELECT count(*) FROM mailroom.dead_letters")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(dead, 0, "the replayed dead event left the dead letters");
    }

    /// Migration 14 rebuilds `queue_keys` without running rows: events of
    /// a key claimed under schema 13 (one running, one dead under
    /// `on_dead = block`, one pending behind each) keep their key's order
    /// and the blocked-key count after it, and the index holds the open
    /// events that do not run, and only those.
    #[tokio::test]
    async fn queue_keys_without_running_rows_keeps_keys_claimed_before_it() {
        use mailroom_core::Completion;
        let (pool, store) = at_schema(13).await;
        for (dedup, key) in [("a1", "a"), ("b1", "b"), ("a2", "a"), ("b2", "b")] {
            let e = mailroom_conformance::event("t", dedup, Some(key));
            store.insert(e).await.unwrap();
        }
        let req = ClaimRequest {
            topic: "t".into(),
            worker: "w".into(),
            max: 10,
            lease: Duration::from_secs(30),
            per_key: Some(OnDead::Block),
            max_wait_for_priority: None,
            expire_after: None,
        };
        let claimed = |c: &[mailroom_core::Claimed]| -> Vec<String> {
            c.iter().map(|c| c.event.dedup_key.clone()).collect()
        };
        let heads = store.claim(&req).await.unwrap();
        assert_eq!(claimed(&heads), ["a1", "b1"]);
        let dead = Completion::Dead {
            error: "boom".into(),
        };
        store
            .complete(heads[1].event.id, heads[1].token, dead)
            .await
            .unwrap();

        store.migrate().await.unwrap();
        let indexed: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_indexes
             WHERE indexname = 'queue_keys' AND indexdef LIKE '%state <> %running%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        assert_eq!(indexed, 1, "queue_keys leaves out running rows");
        assert!(
            store.claim(&req).await.unwrap().is_empty(),
            "a1 runs and b1's dead head blocks b"
        );
        assert_eq!(store.stats().await.unwrap()[0].blocked_keys, 1);
        store
            .complete(heads[0].event.id, heads[0].token, Completion::Done)
            .await
            .unwrap();
        assert_eq!(claimed(&store.claim(&req).await.unwrap()), ["a2"]);
        store.skip(heads[1].event.id).await.unwrap();
        assert_eq!(store.stats().await.unwrap()[0].blocked_keys, 0);
        assert_eq!(claimed(&store.claim(&req).await.unwrap()), ["b2"]);
    }

    /// The compatibility marks only ever name older builds, and only on
    /// migrations that record them (the column exists from
    /// `COMPATIBLE_FROM_COLUMN` on).
    #[test]
    fn compatibility_marks_name_older_builds_only() {
        use super::{COMPATIBLE_FROM, COMPATIBLE_FROM_COLUMN, MIGRATIONS};
        for &(version, floor) in COMPATIBLE_FROM {
            assert!(version >= COMPATIBLE_FROM_COLUMN && version <= MIGRATIONS.len());
            assert!((floor as usize) < version, "{version} marked from {floor}");
        }
    }

    /// A newer build meets an older schema: `schema()` reports it behind
    /// (what `[store] migrate = "never"` refuses, naming `mailroom
    /// migrate` and both versions) without changing it; two instances
    /// migrating at once (`auto`) apply the missing migration exactly once
    /// under the advisory lock, and both then run on the current schema.
    #[tokio::test]
    async fn a_newer_build_refuses_or_migrates_an_older_schema() {
        let (pool, store) = at_schema(14).await;
        let before = store.schema().await.unwrap();
        assert_eq!(
            (before.database, before.build),
            (14, MIGRATIONS.len() as u32)
        );
        assert_eq!(before.fit(), mailroom_core::SchemaFit::Behind);
        let refusal = before.require_runnable().unwrap_err().to_string();
        assert!(refusal.contains("mailroom migrate"), "{refusal}");
        assert!(refusal.contains("version 14"), "{refusal}");
        assert_eq!(
            store.schema().await.unwrap(),
            before,
            "reading changed nothing"
        );

        let same_db = (*pool.connect_options()).clone();
        let other = PostgresStore::connect(PostgresOptions::new(same_db))
            .await
            .unwrap();
        let (a, b) = tokio::join!(store.migrate(), other.migrate());
        let (a, b) = (a.unwrap(), b.unwrap());
        let applied: Vec<bool> = vec![a.applied(), b.applied()];
        assert_eq!(applied.iter().filter(|x| **x).count(), 1, "{a:?} {b:?}");
        for m in [a, b] {
            assert_eq!(m.schema.fit(), mailroom_core::SchemaFit::Current, "{m:?}");
        }
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM mailroom.schema_migrations")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(rows, MIGRATIONS.len() as i64);
    }

    /// An older build meets a newer schema (faked by recording a higher
    /// version): a newer migration not marked compatible is refused by
    /// both `schema()` and `migrate()`, naming both versions, and nothing
    /// changes; once marked compatible with this build, the build runs
    /// against it and `migrate()` applies nothing.
    #[tokio::test]
    async fn an_older_build_refuses_a_newer_schema_unless_marked_compatible() {
        let (pool, store) = at_schema(MIGRATIONS.len()).await;
        let build = MIGRATIONS.len() as i64;
        sqlx::query("INSERT INTO mailroom.schema_migrations (version) VALUES ($1)")
            .bind(build + 2)
            .execute(&pool)
            .await
            .unwrap();
        let newer = store.schema().await.unwrap();
        assert_eq!(newer.fit(), mailroom_core::SchemaFit::TooNew, "{newer:?}");
        let err = store.migrate().await.unwrap_err();
        assert!(matches!(err, StoreError::Schema(_)), "{err:?}");
        let msg = err.to_string();
        assert!(msg.contains(&format!("version {}", build + 2)), "{msg}");
        assert!(msg.contains(&format!("version {build}")), "{msg}");
        assert!(msg.contains("upgrade"), "{msg}");
        assert_eq!(
            store.schema().await.unwrap(),
            newer,
            "refusing changed nothing"
        );

        sqlx::query(
            "UPDATE mailroom.schema_migrations SET compatible_from = $1 WHERE version = $2",
        )
        .bind(build)
        .bind(build + 2)
        .execute(&pool)
        .await
        .unwrap();
        let compatible = store.schema().await.unwrap();
        assert_eq!(compatible.fit(), mailroom_core::SchemaFit::NewerCompatible);
        assert!(compatible.require_runnable().is_ok());
        let m = store.migrate().await.unwrap();
        assert!(!m.applied());
        assert_eq!((m.from, m.schema), (compatible.database, compatible));
        // ... and it works on it.
        let e = mailroom_conformance::event("t", "after", None);
        assert!(!store.insert(e).await.unwrap().duplicate);
    }
}
