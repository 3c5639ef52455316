//! The schema, as an ordered list of migrations, and the lock that lets
//! several instances start at once.
//!
//! Operators query these tables (schema `mailroom`; `mailroom.events` keeps
//! at least `id`, `source`, `topic`, `dedup_key`, `key`, `type`, `status`,
//! `attempts` and `received_at`), so columns are named plainly and times
//! are `timestamptz`.

use crate::sql::db;
use mailroom_core::{Migrated, Migrations, Result, SchemaVersion};
use sqlx::{PgConnection, PgPool};

/// Key of the transaction-scoped advisory lock migrations run under
/// (`pg_advisory_xact_lock`): the ASCII of "mailroom" read as a number, so it
/// is unlikely to meet an application's own advisory locks.
const MIGRATION_LOCK: i64 = 0x6d61_696c_726f_6f6d;

/// Migration `n` is `MIGRATIONS[n - 1]`, a `.sql` file of `migrations/`
/// that says what it does and why. Append only; never edit a shipped one
/// (PostgreSQL keeps a function's body as written).
const MIGRATIONS: &[&str] = &[
    include_str!("../migrations/0001_events.sql"),
    include_str!("../migrations/0002_leaders.sql"),
    include_str!("../migrations/0003_running_keys.sql"),
    include_str!("../migrations/0004_attempts_finished.sql"),
    include_str!("../migrations/0005_claim_indexes.sql"),
    include_str!("../migrations/0006_listing_finished.sql"),
    include_str!("../migrations/0007_queue.sql"),
    include_str!("../migrations/0008_cancelled_expired.sql"),
    include_str!("../migrations/0009_traceparent.sql"),
    include_str!("../migrations/0010_topic_limits.sql"),
    include_str!("../migrations/0011_scheduling.sql"),
    include_str!("../migrations/0012_counters.sql"),
    include_str!("../migrations/0013_cheaper_counter_trigger.sql"),
    include_str!("../migrations/0014_queue_keys_not_running.sql"),
    include_str!("../migrations/0015_compatible_from.sql"),
    include_str!("../migrations/0016_outbox_correlation.sql"),
    include_str!("../migrations/0017_event_version.sql"),
];

/// The migrations' count and compatibility marks (see
/// [`Migrations::compatible`]; tested by
/// `tests::compatibility_marks_name_older_builds_only`).
const SCHEMA: Migrations = Migrations {
    count: MIGRATIONS.len(),
    // Migration 15 added `schema_migrations.compatible_from`.
    compatible_from_column: 15,
    compatible: &[
        // Builds of 14 never read the column.
        (15, 14),
        // New optional arguments of `mailroom.enqueue`; builds of 15 call
        // it with the old ones.
        (16, 15),
        // A nullable column older builds never name.
        (17, 15),
    ],
};

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
    let seen = read_version(pool, Migrations::number(last)).await?;
    if let Some(done) = seen.nothing_to_apply()? {
        return Ok(done);
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
    let found = recorded(&mut tx, Migrations::number(last)).await?;
    // Current, or newer: nothing to apply; a newer schema this build
    // cannot use is refused before anything else runs.
    if let Some(done) = found.nothing_to_apply()? {
        tx.commit().await.map_err(db(CTX))?;
        return Ok(done);
    }
    for (index, migration) in MIGRATIONS.iter().enumerate().take(last) {
        let version = index + 1;
        if Migrations::number(version) <= found.database {
            continue;
        }
        sqlx::raw_sql(*migration)
            .execute(&mut *tx)
            .await
            .map_err(db("applying a schema migration"))?;
        let record = match SCHEMA.compatible_from(version) {
            Some(floor) => sqlx::query(
                "INSERT INTO mailroom.schema_migrations (version, compatible_from)
                     VALUES ($1, $2)",
            )
            .bind(i64::from(Migrations::number(version)))
            .bind(i64::from(floor)),
            None => sqlx::query("INSERT INTO mailroom.schema_migrations (version) VALUES ($1)")
                .bind(i64::from(Migrations::number(version))),
        };
        record.execute(&mut *tx).await.map_err(db(CTX))?;
        tracing::info!(version, "applied PostgreSQL schema migration");
    }
    let schema = recorded(&mut tx, Migrations::number(last)).await?;
    tx.commit().await.map_err(db(CTX))?;
    Ok(Migrated {
        from: found.database,
        schema,
    })
}

/// The schema's version, read without changing anything
/// ([`Store::schema`](mailroom_core::Store::schema)).
pub(crate) async fn version(pool: &PgPool) -> Result<SchemaVersion> {
    read_version(pool, SCHEMA.build()).await
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
        return Ok(SchemaVersion::empty(build));
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
    SchemaVersion::recorded(row, build)
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
    /// migrates no further until asked). This build's statements name
    /// `events.version` (migration 17), so an older schema that this
    /// build's store writes to and claims from gets the column as that
    /// migration adds it.
    async fn at_schema(version: usize) -> (PgPool, PostgresStore) {
        let url = mailroom_testkit::fresh_postgres_db().await;
        let pool = PgPool::connect(&url).await.unwrap();
        migrate_to(&pool, version).await.unwrap();
        if version < 17 {
            sqlx::raw_sql(include_str!("../migrations/0017_event_version.sql"))
                .execute(&pool)
                .await
                .unwrap();
        }
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
    /// migrations that record them (the column exists from migration 15 on).
    #[test]
    fn compatibility_marks_name_older_builds_only() {
        assert_eq!(super::SCHEMA.check(), Ok(()));
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
