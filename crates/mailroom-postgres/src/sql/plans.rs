//! The query plans of the statements whose spelling `docs/perf/postgres.md`
//! explains: each test asks PostgreSQL how it would run them on a backlog,
//! under the statistics that once misled it.
#![allow(clippy::unwrap_used)]

use super::claims::{
    CLAIM_ANY, HEADS_BY_KEY, HEADS_BY_KEY_SKIP_DEAD, KEY_LOCK_CLASS, SEQUENTIAL_WINDOW,
};
use super::completions::COMPLETE_MANY;
use super::rows::LIST_TOPIC;
use sqlx::Row;
use sqlx::postgres::PgArguments;
use sqlx::query::QueryScalar;
use sqlx::{Connection as _, PgConnection, Postgres};

/// `EXPLAIN` of one of our own constant statements: nothing to inject.
fn explain(sql: &str) -> QueryScalar<'static, Postgres, String, PgArguments> {
    sqlx::query_scalar(sqlx::AssertSqlSafe(format!("EXPLAIN {sql}")))
}

/// The plan of `query` (an [`explain`] with its arguments bound), as text.
async fn plan(
    conn: &mut PgConnection,
    query: QueryScalar<'_, Postgres, String, PgArguments>,
) -> String {
    query.fetch_all(conn).await.unwrap().join("\n")
}

/// A fresh database holding a backlog of 20,000 pending events of
/// topic `t` (256-byte payloads) spread over `keys` keys, and a
/// connection to it.
async fn backlog(keys: u32) -> PgConnection {
    let url = mailroom_testkit::fresh_postgres_db().await;
    let store = crate::PostgresStore::connect(crate::PostgresOptions::from_url(&url).unwrap())
        .await
        .unwrap();
    mailroom_core::Store::migrate(&store).await.unwrap();
    let mut conn = PgConnection::connect(&url).await.unwrap();
    sqlx::query(
        "INSERT INTO mailroom.events
             (id, source, topic, dedup_key, key, status, max_attempts, next_attempt_at, payload)
         SELECT mailroom.uuid_v7(), 's', 't', g::text, 'k' || (g % $1), 'pending', 10, now(),
                convert_to(repeat('x', 256), 'UTF8')
         FROM generate_series(1, 20000) g",
    )
    .bind(i64::from(keys))
    .execute(&mut conn)
    .await
    .unwrap();
    conn
}

/// A [`backlog`] with statistics taken while every row is pending (an
/// ANALYZE during a backlog), the ones that misled the planner before.
async fn analysed_backlog(keys: u32) -> PgConnection {
    let mut conn = backlog(keys).await;
    sqlx::query("ANALYZE mailroom.events")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// Marks the first 19,000 events of a [`backlog`] done, as a drain
/// would have, without new statistics.
async fn finish_most(conn: &mut PgConnection) {
    sqlx::query(
        "UPDATE mailroom.events SET status = 'done', next_attempt_at = NULL
         WHERE seq <= 19000",
    )
    .execute(conn)
    .await
    .unwrap();
}

/// The generic plan of `sql` (the one a prepared statement switches to
/// after five runs), its parameters declared as `types` and given as
/// the SQL literals `args`.
async fn generic_plan(conn: &mut PgConnection, sql: &str, types: &str, args: &str) -> String {
    let prepare = format!("SET plan_cache_mode = force_generic_plan; PREPARE q({types}) AS {sql}");
    sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
        .execute(&mut *conn)
        .await
        .unwrap();
    let plan =
        sqlx::query_scalar::<_, String>(sqlx::AssertSqlSafe(format!("EXPLAIN EXECUTE q({args})")))
            .fetch_all(&mut *conn)
            .await
            .unwrap()
            .join("\n");
    sqlx::raw_sql("DEALLOCATE q; RESET plan_cache_mode")
        .execute(&mut *conn)
        .await
        .unwrap();
    plan
}

/// Statistics taken while every row was pending (an ANALYZE during a
/// backlog), then most rows finished: claims still find pending rows
/// through `events_claim`, neither walking another index over the
/// finished ones nor scanning the table, in custom and generic plans.
#[tokio::test]
async fn claims_walk_the_pending_index_whatever_the_statistics_say() {
    let mut conn = analysed_backlog(50).await;
    for moment in ["all pending", "most finished"] {
        if moment == "most finished" {
            finish_most(&mut conn).await;
        }
        let single = |from: i64| {
            explain(CLAIM_ANY)
                .bind(30_000_000_i64)
                .bind("w")
                .bind("t")
                .bind(100_i64)
                .bind(from)
        };
        let sequential = |sql| {
            explain(sql)
                .bind("t")
                .bind(100_i64)
                .bind(KEY_LOCK_CLASS)
                .bind(SEQUENTIAL_WINDOW)
        };
        let block = claim_candidates!(head_block!());
        let skip = claim_candidates!(head_skip!());
        let mut plans = vec![
            ("single", plan(&mut conn, single(0)).await),
            (
                "single, from a floor",
                plan(&mut conn, single(15_000)).await,
            ),
            ("sequential", plan(&mut conn, sequential(block)).await),
            (
                "sequential, on_dead = skip",
                plan(&mut conn, sequential(skip)).await,
            ),
        ];
        for (name, from) in [
            ("single, generic plan", 0),
            ("from a floor, generic", 15_000),
        ] {
            let args = format!("30000000, 'w', 't', 100, {from}");
            let types = "int8, text, text, int8, int8";
            plans.push((name, generic_plan(&mut conn, CLAIM_ANY, types, &args).await));
        }
        for (name, sql) in [
            ("sequential, generic plan", block),
            ("skip, generic plan", skip),
        ] {
            let generic = generic_plan(
                &mut conn,
                sql,
                "text, int8, int4, int8",
                "'t', 100, 1, 1024",
            )
            .await;
            plans.push((name, generic));
        }
        for (name, plan) in plans {
            assert!(
                plan.contains("using events_claim on events") && !plan.contains("Seq Scan"),
                "{moment}, {name}: the claim does not read events_claim alone:\n{plan}"
            );
        }
    }
}

/// Past the walk's bound, sequential claims and their next due time
/// visit keys and heads through `events_open_keys` (a handful of probes
/// per key), never by scanning the table or walking the pending events:
/// in custom and generic plans, with statistics taken while every row
/// was pending, at the start of a 10-key backlog and after most of it.
#[tokio::test]
async fn heads_by_key_probe_the_open_keys_index() {
    let mut conn = analysed_backlog(10).await;
    let by_key = [
        ("heads by key", HEADS_BY_KEY),
        ("heads by key, on_dead = skip", HEADS_BY_KEY_SKIP_DEAD),
    ];
    let next_due = [
        ("next due", next_due_by_key!("")),
        (
            "next due, on_dead = skip",
            next_due_by_key!("AND f.status <> 'dead'"),
        ),
    ];
    for moment in ["all pending", "most finished"] {
        if moment == "most finished" {
            finish_most(&mut conn).await;
        }
        let mut plans = Vec::new();
        for (name, sql) in by_key {
            let custom = explain(sql)
                .bind("t")
                .bind(100_i64)
                .bind(vec![1_i64])
                .bind(KEY_LOCK_CLASS);
            plans.push((name, plan(&mut conn, custom).await));
            let args = "'t', 100, '{1}', 1";
            let types = "text, int8, int8[], int4";
            plans.push((name, generic_plan(&mut conn, sql, types, args).await));
        }
        for (name, sql) in next_due {
            let custom = explain(sql).bind("t").bind(SEQUENTIAL_WINDOW);
            plans.push((name, plan(&mut conn, custom).await));
            let generic = generic_plan(&mut conn, sql, "text, int8", "'t', 1024").await;
            plans.push((name, generic));
        }
        for (name, plan) in plans {
            let probes = plan.matches("using events_open_keys on events").count();
            assert!(
                probes >= 3 && !plan.contains("Seq Scan"),
                "{moment}, {name}: keys and heads are not probed in events_open_keys:\n{plan}"
            );
        }
    }
}

/// A completion group finds its rows by id (or among the few running
/// ones), never through an index that grows with the finished events,
/// nor by scanning the table: in custom and generic plans, with
/// statistics taken while every row was pending, at the start of the
/// drain and after most of it. With `events_listing` holding running
/// rows too (migration 5), both plans walked it.
#[tokio::test]
async fn completions_find_their_rows_without_walking_finished_ones() {
    let mut conn = analysed_backlog(50).await;
    for moment in ["start", "most finished"] {
        let (first, last) = match moment {
            "start" => (1, 64),
            _ => (19_001, 19_064),
        };
        sqlx::query(
            "UPDATE mailroom.events SET status = 'done', next_attempt_at = NULL
             WHERE seq < $1",
        )
        .bind(first)
        .execute(&mut conn)
        .await
        .unwrap();
        let ids: Vec<String> = sqlx::query_scalar(
            "UPDATE mailroom.events
             SET status = 'running', attempts = 1, next_attempt_at = NULL,
                 lease_until = now() + interval '30 seconds', started_at = now()
             WHERE seq BETWEEN $1 AND $2 RETURNING id::text",
        )
        .bind(first)
        .bind(last)
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let n = ids.len();
        let custom = explain(COMPLETE_MANY)
            .bind(ids.clone())
            .bind(vec![1_i64; n])
            .bind(vec!["done"; n])
            .bind(vec![0_i64; n])
            .bind(vec![None::<String>; n])
            .bind(vec!["done"; n]);
        let custom = plan(&mut conn, custom).await;
        // Our own UUIDs and constants: nothing to inject.
        let array = |items: String, ty: &str| format!("'{{{items}}}'::{ty}[]");
        let args = [
            array(ids.join(","), "text"),
            array(vec!["1"; n].join(","), "int8"),
            array(vec!["done"; n].join(","), "text"),
            array(vec!["0"; n].join(","), "int8"),
            array(vec!["NULL"; n].join(","), "text"),
            array(vec!["done"; n].join(","), "text"),
        ]
        .join(", ");
        let types = "text[], int8[], text[], int8[], text[], text[]";
        let generic = generic_plan(&mut conn, COMPLETE_MANY, types, &args).await;
        for (name, plan) in [("custom", custom), ("generic", generic)] {
            assert!(
                (plan.contains("using events_id_key on events") || plan.contains("events_running"))
                    && !plan.contains("events_listing")
                    && !plan.contains("Seq Scan on events"),
                "{moment}, {name} plan: the completion walks finished events:\n{plan}"
            );
        }
    }
}

/// Listing one topic reads its pending events from `events_claim`, its
/// running ones from `events_running` and the finished ones from
/// `events_listing`, instead of walking the other topics' events.
#[tokio::test]
async fn topic_listings_read_three_partial_indexes() {
    let mut conn = backlog(50).await;
    // A rare topic among the backlog of `t`: a tenth of it running, 40%
    // finished, the rest pending, interleaved.
    sqlx::query(
        "INSERT INTO mailroom.events (id, source, topic, dedup_key, status, max_attempts)
         SELECT mailroom.uuid_v7(), 'r', 'rare', g::text,
                CASE WHEN g % 10 = 0 THEN 'running' WHEN g % 2 = 0 THEN 'done'
                     ELSE 'pending' END, 10
         FROM generate_series(1, 300) g",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    sqlx::query("ANALYZE mailroom.events")
        .execute(&mut conn)
        .await
        .unwrap();
    let query = explain(LIST_TOPIC)
        .bind("rare")
        .bind(None::<String>)
        .bind(None::<String>)
        .bind(None::<i64>)
        .bind(101_i64);
    let plan = plan(&mut conn, query).await;
    assert!(
        plan.contains("Index Scan Backward using events_claim")
            && plan.contains("events_running")
            && plan.contains("Index Scan Backward using events_listing")
            && !plan.contains("Seq Scan"),
        "{plan}"
    );
    // And the merged page is the newest 101 events of the topic.
    let page: Vec<i64> = sqlx::query(LIST_TOPIC)
        .bind("rare")
        .bind(None::<String>)
        .bind(None::<String>)
        .bind(None::<i64>)
        .bind(101_i64)
        .fetch_all(&mut conn)
        .await
        .unwrap()
        .iter()
        .map(|row| row.get(0))
        .collect();
    let expected: Vec<i64> = sqlx::query_scalar(
        "SELECT seq FROM mailroom.events WHERE topic = 'rare' ORDER BY seq DESC LIMIT 101",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(page, expected);
}

/// A new table under its first backlog (no statistics yet): the second
/// step of a sequential claim finds its candidates by `seq` through the
/// primary key, not by filtering every pending row of the topic, and
/// nothing in it scans the table.
#[tokio::test]
async fn sequential_recheck_finds_candidates_by_seq_without_statistics() {
    let mut conn = backlog(1000).await;
    let seqs: Vec<i64> = (1..=120).collect();
    for sql in [claim_locked!(head_block!()), claim_locked!(head_skip!())] {
        let query = explain(sql)
            .bind(30_000_000_i64)
            .bind("w")
            .bind(seqs.clone());
        let plan = plan(&mut conn, query).await;
        assert!(
            !plan.contains("events_claim"),
            "the re-check reads the pending index:\n{plan}"
        );
        // "Is any event of this key running?" reads an index too (the
        // planner may hash the running events once per statement).
        assert!(
            !plan.contains("Seq Scan"),
            "the re-check scans the table:\n{plan}"
        );
    }
}
