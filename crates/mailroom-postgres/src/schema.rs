//! The schema, as an ordered list of migrations, and the lock that lets
//! several instances start at once.
//!
//! Operators query these tables (SPEC §12 "PostgreSQL layout"), so columns
//! are named plainly and times are `timestamptz`.

use crate::sql::db;
use mailroom_core::Result;
use sqlx::PgPool;

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

    -- The outbox (SPEC §6): call it inside the application's own transaction,
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
];

/// Applies the missing migrations in one transaction that first takes
/// [`MIGRATION_LOCK`]: a second instance starting at the same time waits for
/// the lock, then finds nothing left to do. The lock ends with the
/// transaction, so a crash cannot leave it held.
pub(crate) async fn migrate(pool: &PgPool) -> Result<()> {
    const CTX: &str = "migrating the schema";
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
    let current: i64 =
        sqlx::query_scalar("SELECT COALESCE(MAX(version), 0) FROM mailroom.schema_migrations")
            .fetch_one(&mut *tx)
            .await
            .map_err(db(CTX))?;
    for (index, migration) in MIGRATIONS.iter().enumerate() {
        let version = i64::try_from(index).unwrap_or(i64::MAX).saturating_add(1);
        if version <= current {
            continue;
        }
        sqlx::raw_sql(*migration)
            .execute(&mut *tx)
            .await
            .map_err(db("applying a schema migration"))?;
        sqlx::query("INSERT INTO mailroom.schema_migrations (version) VALUES ($1)")
            .bind(version)
            .execute(&mut *tx)
            .await
            .map_err(db(CTX))?;
        tracing::info!(version, "applied PostgreSQL schema migration");
    }
    tx.commit().await.map_err(db(CTX))?;
    Ok(())
}
