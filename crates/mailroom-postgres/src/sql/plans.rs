//! The query plans of the hot statements, whose spelling
//! `docs/src/design/postgres.md` explains: each test asks PostgreSQL how it would
//! run them on a backlog, under the statistics that once misled it. Claims
//! walk the narrow `mailroom.queue` alone and reach `mailroom.events` only
//! through its keys; nothing scans either table.
#![allow(clippy::unwrap_used)]

use super::completions::COMPLETE_MANY;
use super::maintenance::RESCUE;
use super::search::LIST_TOPIC;
use crate::claim::due::{
    DUE_HEAD_IN_WALK, DUE_HEAD_IN_WALK_SKIP_DEAD, NEXT_DUE, NEXT_DUE_BY_KEY,
    NEXT_DUE_BY_KEY_SKIP_DEAD,
};
use crate::claim::heads::{
    HEADS_BY_KEY, HEADS_BY_KEY_SKIP_DEAD, KEYLESS, PROMOTE, SEQUENTIAL_WINDOW, WALK, WALK_SKIP_DEAD,
};
use crate::claim::independent::{CLAIM_ANY, CLAIM_FROM};
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
        "WITH inserted AS (
             INSERT INTO mailroom.events
                 (id, source, topic, dedup_key, key, status, max_attempts, next_attempt_at, payload)
             SELECT mailroom.uuid_v7(), 's', 't', g::text, 'k' || (g % $1), 'pending', 10, now(),
                    convert_to(repeat('x', 256), 'UTF8')
             FROM generate_series(1, 20000) g
             RETURNING seq, topic, key, next_attempt_at
         )
         INSERT INTO mailroom.queue (seq, topic, key, run_at, state)
         SELECT seq, topic, key, next_attempt_at, 'pending' FROM inserted",
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
    sqlx::raw_sql("ANALYZE mailroom.events; ANALYZE mailroom.queue")
        .execute(&mut conn)
        .await
        .unwrap();
    conn
}

/// Marks the events of a [`backlog`] before `seq` done, as a drain would
/// have (their queue rows gone), without new statistics.
async fn finish_before(conn: &mut PgConnection, seq: i64) {
    sqlx::query(
        "WITH done AS (
             UPDATE mailroom.events SET status = 'done', next_attempt_at = NULL
             WHERE seq < $1 RETURNING seq
         )
         DELETE FROM mailroom.queue WHERE seq IN (SELECT seq FROM done)",
    )
    .bind(seq)
    .execute(conn)
    .await
    .unwrap();
}

/// Marks the first 19,000 events of a [`backlog`] done.
async fn finish_most(conn: &mut PgConnection) {
    finish_before(conn, 19_001).await;
}

/// Whether `plan` reads `mailroom.events` only through `index` (or not at
/// all; updating its rows is not reading it) and scans no table.
fn events_only_through(plan: &str, index: &str) -> bool {
    let bitmap = format!("Bitmap Index Scan on {index}");
    !plan.contains("Seq Scan")
        && plan
            .lines()
            .filter(|line| line.contains("Scan") && line.contains(" on events"))
            .all(|line| {
                line.contains(index)
                    || (line.contains("Bitmap Heap Scan") && plan.contains(&bitmap))
            })
}

/// Whether every scan of `index` in `plan` starts from a topic (rows found
/// by `seq` through an index whose `seq` is its last column walk the whole
/// topic once per row).
fn walks_by_topic(plan: &str, index: &str) -> bool {
    let lines: Vec<&str> = plan.lines().collect();
    lines.windows(2).all(|pair| {
        !pair[0].contains(&format!("using {index}"))
            || !pair[1].contains("Index Cond")
            || pair[1].contains("topic")
    })
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
/// backlog), then most rows finished: claims find pending rows through
/// `queue_claim` and their events through `events_pkey`, neither walking
/// another index over the finished ones nor scanning a table, in custom
/// and generic plans.
#[tokio::test]
async fn claims_walk_the_queue_index_whatever_the_statistics_say() {
    let mut conn = analysed_backlog(50).await;
    for moment in ["all pending", "most finished"] {
        if moment == "most finished" {
            finish_most(&mut conn).await;
        }
        let single = explain(CLAIM_ANY)
            .bind(30_000_000_i64)
            .bind("w")
            .bind("t")
            .bind(100_i64)
            .bind(None::<i64>);
        let from_floor = explain(CLAIM_FROM)
            .bind(30_000_000_i64)
            .bind("w")
            .bind("t")
            .bind(100_i64)
            .bind(Some(3_600_000_000_i64))
            .bind(19_500_i64)
            .bind(0_i32);
        let sequential = |sql| {
            explain(sql)
                .bind("t")
                .bind(100_i64)
                .bind(SEQUENTIAL_WINDOW)
                .bind(Some(3_600_000_000_i64))
                .bind(30_000_000_i64)
                .bind("w")
        };
        let block = WALK;
        let skip = WALK_SKIP_DEAD;
        let mut plans = vec![
            ("single", plan(&mut conn, single).await),
            ("single, from a floor", plan(&mut conn, from_floor).await),
            ("sequential", plan(&mut conn, sequential(block)).await),
            (
                "sequential, on_dead = skip",
                plan(&mut conn, sequential(skip)).await,
            ),
        ];
        let args = "30000000, 'w', 't', 100, 3600000000";
        let types = "int8, text, text, int8, int8";
        let generic = generic_plan(&mut conn, CLAIM_ANY, types, args).await;
        plans.push(("single, generic plan", generic));
        let args = "30000000, 'w', 't', 100, NULL, 19500, 0";
        let types = "int8, text, text, int8, int8, int8, int4";
        let generic = generic_plan(&mut conn, CLAIM_FROM, types, args).await;
        plans.push(("from a floor, generic", generic));
        for (name, sql) in [
            ("sequential, generic plan", block),
            ("skip, generic plan", skip),
        ] {
            let generic = generic_plan(
                &mut conn,
                sql,
                "text, int8, int8, int8, int8, text",
                "'t', 100, 1024, NULL, 30000000, 'w'",
            )
            .await;
            plans.push((name, generic));
        }
        // Keyless events of a sequential topic (once a second at most,
        // while its heads are sparse): all keyed here, so the planner may
        // read the queue whole, and `events` only by the claimed rows' keys.
        let keyless = explain(KEYLESS)
            .bind("t")
            .bind(100_i64)
            .bind(None::<i64>)
            .bind(30_000_000_i64)
            .bind("w");
        let keyless = plan(&mut conn, keyless).await;
        assert!(
            !keyless.contains("Seq Scan on events") && keyless.contains("events_pkey"),
            "{moment}, keyless:\n{keyless}"
        );
        for (name, plan) in plans {
            assert!(
                plan.contains("using queue_claim on queue")
                    && events_only_through(&plan, "events_pkey"),
                "{moment}, {name}: the claim does not walk queue_claim alone:\n{plan}"
            );
            assert!(
                walks_by_topic(&plan, "queue_claim"),
                "{moment}, {name}: rows found by seq through queue_claim:\n{plan}"
            );
            let floor = name.contains("floor");
            assert!(
                !name.starts_with("single")
                    || floor
                    || plan.contains("using queue_scheduled on queue"),
                "{moment}, {name}: scheduled rows are not found through queue_scheduled:\n{plan}"
            );
            // Claims from a floor, most claims of a busy topic, cost what
            // they did before delayed delivery: one walk of the pending
            // rows and the higher-priority probe, neither a probe of the
            // scheduled rows nor a sort of what the walks found.
            assert!(
                !floor || !(plan.contains("queue_scheduled") || plan.contains("Sort")),
                "{moment}, {name}: a claim from a floor probes scheduled rows or sorts:\n{plan}"
            );
        }
    }
}

/// Index pages the node `name` of a JSON `EXPLAIN (ANALYZE, BUFFERS)`
/// (a CTE's subplan) read, with its children.
fn pages_of(node: &serde_json::Value, name: &str) -> Option<u64> {
    if node["Subplan Name"] == name {
        let hit = node["Shared Hit Blocks"].as_u64().unwrap_or(0);
        return Some(hit + node["Shared Read Blocks"].as_u64().unwrap_or(0));
    }
    node["Plans"]
        .as_array()?
        .iter()
        .find_map(|child| pages_of(child, name))
}

/// A claim from a floor near the end of a 20,000-event backlog looks for
/// rows of a higher priority than the floor's (none here) in a page or
/// two of `queue_claim`, not by walking the topic's whole backlog (a row
/// comparison as the walk's upper bound did: btree does not stop at it).
#[tokio::test]
async fn a_claim_from_a_floor_does_not_walk_the_backlog_for_higher_priorities() {
    let mut conn = analysed_backlog(50).await;
    let mut tx = sqlx::Connection::begin(&mut conn).await.unwrap();
    let analysed = sqlx::query(sqlx::AssertSqlSafe(format!(
        "EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {CLAIM_FROM}"
    )))
    .bind(30_000_000_i64)
    .bind("w")
    .bind("t")
    .bind(100_i64)
    .bind(None::<i64>)
    .bind(19_500_i64)
    .bind(0_i32)
    .fetch_one(&mut *tx)
    .await
    .unwrap();
    tx.rollback().await.unwrap();
    // A `json` column; its binary form is its text.
    let analysed: String = analysed.try_get_unchecked(0).unwrap();
    let analysed: serde_json::Value = serde_json::from_str(&analysed).unwrap();
    let pages = pages_of(&analysed[0]["Plan"], "CTE due_higher").unwrap();
    assert!(
        pages <= 4,
        "{pages} pages read looking for higher priorities"
    );
}

/// Past the walk's bound, sequential claims and their next due time
/// visit keys and heads through `queue_keys` (a handful of probes
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
        ("next due", NEXT_DUE_BY_KEY),
        ("next due, on_dead = skip", NEXT_DUE_BY_KEY_SKIP_DEAD),
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
                .bind(None::<i64>)
                .bind(30_000_000_i64)
                .bind("w");
            plans.push((name, plan(&mut conn, custom).await));
            let args = "'t', 100, 3600000000, 30000000, 'w'";
            let types = "text, int8, int8, int8, text";
            plans.push((name, generic_plan(&mut conn, sql, types, args).await));
        }
        for (name, sql) in next_due {
            let custom = explain(sql)
                .bind("t")
                .bind(SEQUENTIAL_WINDOW)
                .bind(None::<i64>);
            plans.push((name, plan(&mut conn, custom).await));
            let types = "text, int8, int8";
            let generic = generic_plan(&mut conn, sql, types, "'t', 1024, NULL").await;
            plans.push((name, generic));
        }
        for (name, plan) in plans {
            let probes = plan.matches("using queue_keys on queue").count();
            assert!(
                probes >= 3
                    && events_only_through(&plan, "events_pkey")
                    && walks_by_topic(&plan, "queue_claim"),
                "{moment}, {name}: keys and heads are not probed in queue_keys:\n{plan}"
            );
        }
    }
}

/// A sequential topic's quick answer to "when is the next event due?"
/// walks the pending index in claim order and stops at the first due
/// head: one row of a backlog of 1,000 keys (every pending event a head,
/// none running), custom and generic plans. An aggregate over the walk
/// would read its whole bound.
#[tokio::test]
async fn the_quick_next_due_stops_at_the_first_head() {
    let mut conn = analysed_backlog(1000).await;
    for sql in [DUE_HEAD_IN_WALK, DUE_HEAD_IN_WALK_SKIP_DEAD] {
        for generic in [false, true] {
            let mut tx = sqlx::Connection::begin(&mut conn).await.unwrap();
            let mode = if generic {
                "force_generic_plan"
            } else {
                "force_custom_plan"
            };
            sqlx::raw_sql(sqlx::AssertSqlSafe(format!(
                "SET LOCAL plan_cache_mode = {mode}; PREPARE q(text, int8, int8) AS {sql}"
            )))
            .execute(&mut *tx)
            .await
            .unwrap();
            let row = sqlx::query(sqlx::AssertSqlSafe(format!(
                "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE q('t', {SEQUENTIAL_WINDOW}, NULL)"
            )))
            .fetch_one(&mut *tx)
            .await
            .unwrap();
            // A `json` column; its binary form is its text.
            let analysed: String = row.try_get_unchecked(0).unwrap();
            sqlx::raw_sql("DEALLOCATE q")
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.rollback().await.unwrap();
            let analysed: serde_json::Value = serde_json::from_str(&analysed).unwrap();
            let walked = sum_on(&analysed[0]["Plan"], "queue_claim", "Actual Rows");
            assert_eq!(walked, 1, "generic {generic}: {walked} pending rows walked");
        }
    }
}

/// A completion group finds its rows by id (or among the few running
/// ones), never through an index that grows with the finished events,
/// nor by scanning a table: in custom and generic plans, with statistics
/// taken while every row was pending, at the start of the drain and after
/// most of it. With `events_listing` holding running rows too (migration
/// 5), both plans walked it.
#[tokio::test]
async fn completions_find_their_rows_without_walking_finished_ones() {
    let mut conn = analysed_backlog(50).await;
    for moment in ["start", "most finished"] {
        let (first, last) = match moment {
            "start" => (1, 64),
            _ => (19_001, 19_064),
        };
        finish_before(&mut conn, first).await;
        let ids: Vec<String> = sqlx::query_scalar(
            "WITH running AS (
                 UPDATE mailroom.events
                 SET status = 'running', attempts = 1, next_attempt_at = NULL,
                     lease_until = now() + interval '30 seconds', started_at = now()
                 WHERE seq BETWEEN $1 AND $2 RETURNING seq, id::text
             ), moved AS (
                 UPDATE mailroom.queue SET state = 'running'
                 WHERE seq IN (SELECT seq FROM running)
             )
             SELECT id FROM running",
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
                plan.contains("using events_id_key on events") && !plan.contains("Seq Scan"),
                "{moment}, {name} plan: the completion walks finished events:\n{plan}"
            );
        }
    }
}

/// Listing one topic reads `events_topic_seq` backwards, instead of
/// walking the other topics' events.
#[tokio::test]
async fn topic_listings_read_the_topic_index() {
    let mut conn = backlog(50).await;
    // A rare topic among the backlog of `t`, in every status.
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
        plan.contains("Index Scan Backward using events_topic_seq") && !plan.contains("Seq Scan"),
        "{plan}"
    );
    // And the page is the newest 101 events of the topic.
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

/// A new table under its first backlog (no statistics yet): a sequential
/// claim finds its candidates by walking the pending index and claims
/// them by `seq` through the primary key, not by filtering every pending
/// row of the topic, and nothing in it scans the table.
#[tokio::test]
async fn sequential_claims_find_their_rows_by_seq_without_statistics() {
    let mut conn = backlog(1000).await;
    for sql in [WALK, WALK_SKIP_DEAD] {
        let query = explain(sql)
            .bind("t")
            .bind(256_i64)
            .bind(SEQUENTIAL_WINDOW)
            .bind(None::<i64>)
            .bind(30_000_000_i64)
            .bind("w");
        let plan = plan(&mut conn, query).await;
        assert!(
            walks_by_topic(&plan, "queue_claim") && !plan.contains("Seq Scan"),
            "the candidates are found by walking the pending index:\n{plan}"
        );
        assert!(
            plan.contains("on queue_pkey") && events_only_through(&plan, "events_pkey"),
            "the candidates' rows are not claimed through the primary keys:\n{plan}"
        );
    }
}

/// Sums `field` (`Actual Loops`, `Actual Rows`) over the nodes reading
/// `index` in a JSON `EXPLAIN (ANALYZE)` plan node and its children (a
/// subplan's probes run one loop each).
fn sum_on(node: &serde_json::Value, index: &str, field: &str) -> u64 {
    let own = if node["Index Name"] == index {
        node[field].as_u64().unwrap_or(0)
    } else {
        0
    };
    let children = node["Plans"].as_array().map_or(0, |plans| {
        plans.iter().map(|child| sum_on(child, index, field)).sum()
    });
    own + children
}

/// A sequential claim's walk (`sql`, [`WALK`]) asking for `max`
/// heads, run in a transaction rolled back after, its custom plan or its
/// generic one: its head-rule probes of `queue_keys`, the rows it walked
/// in `queue_claim`, and its scans of the queue's primary key.
async fn head_probes(
    conn: &mut PgConnection,
    sql: &str,
    max: i64,
    generic: bool,
) -> (u64, u64, u64) {
    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
    let analysed: String = if generic {
        let prepare = format!(
            "SET LOCAL plan_cache_mode = force_generic_plan;
             PREPARE q(text, int8, int8, int8, int8, text) AS {sql}"
        );
        sqlx::raw_sql(sqlx::AssertSqlSafe(prepare))
            .execute(&mut *tx)
            .await
            .unwrap();
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE q('t', {max}, {SEQUENTIAL_WINDOW}, \
             NULL, 30000000, 'w')"
        )))
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        sqlx::raw_sql("DEALLOCATE q")
            .execute(&mut *tx)
            .await
            .unwrap();
        row.try_get_unchecked(0).unwrap()
    } else {
        let row = sqlx::query(sqlx::AssertSqlSafe(format!(
            "EXPLAIN (ANALYZE, FORMAT JSON) {sql}"
        )))
        .bind("t")
        .bind(max)
        .bind(SEQUENTIAL_WINDOW)
        .bind(None::<i64>)
        .bind(30_000_000_i64)
        .bind("w")
        .fetch_one(&mut *tx)
        .await
        .unwrap();
        // A `json` column; its binary form is its text.
        row.try_get_unchecked(0).unwrap()
    };
    tx.rollback().await.unwrap();
    let analysed: serde_json::Value = serde_json::from_str(&analysed).unwrap();
    let plan = &analysed[0]["Plan"];
    (
        sum_on(plan, "queue_keys", "Actual Loops"),
        sum_on(plan, "queue_claim", "Actual Rows"),
        sum_on(plan, "queue_pkey", "Actual Loops"),
    )
}

/// A sequential claim walks and tests the topic's pending rows in claim
/// order and stops at the heads it asked for: 100 heads among the first
/// 1,000 pending events (1,000 keys, every event a head) cost 100 rows of
/// `queue_claim` and 100 probes of `queue_keys`, not the walk's whole
/// bound (1,024: a sort or a hash of the walk's rows tests them all
/// before the first comes out), and one scan of the queue's primary key,
/// which fetches the rows it claims all at once (a probe per row would be
/// a scan each); without statistics and with them, custom and generic
/// plans.
#[tokio::test]
async fn a_sequential_claim_tests_only_the_rows_it_takes() {
    for analysed in [false, true] {
        let mut conn = if analysed {
            analysed_backlog(1000).await
        } else {
            backlog(1000).await
        };
        for (name, sql) in [
            ("on_dead = block", WALK),
            ("on_dead = skip", WALK_SKIP_DEAD),
        ] {
            for generic in [false, true] {
                let (probes, walked, by_seq) = head_probes(&mut conn, sql, 100, generic).await;
                let case = format!("{name}, statistics {analysed}, generic {generic}");
                assert!(
                    (100..=110).contains(&probes),
                    "{case}: {probes} head probes for 100 heads"
                );
                assert!(
                    (100..=110).contains(&walked),
                    "{case}: {walked} pending rows walked for 100 heads"
                );
                assert_eq!(by_seq, 1, "{case}: {by_seq} scans of the primary key");
            }
        }
    }
}

/// The other statements of the hot path: the next due time of an
/// independent topic reads the queue alone (its pending rows: the same
/// work as before the queue table, and only when a claim came back
/// short), lease rescue lists the running rows from `queue_running` and
/// reads `events` only by its primary key; with statistics taken during a
/// backlog and most of it finished since.
#[tokio::test]
async fn next_due_and_rescue_read_the_queue_indexes() {
    let mut conn = analysed_backlog(50).await;
    finish_most(&mut conn).await;
    let next_due = explain(NEXT_DUE).bind("t").bind(None::<i64>);
    let next_due = plan(&mut conn, next_due).await;
    let generic = generic_plan(&mut conn, NEXT_DUE, "text, int8", "'t', 3600000000").await;
    for plan in [next_due, generic] {
        assert!(
            !plan.contains(" on events") && plan.contains("using queue_scheduled on queue"),
            "{plan}"
        );
    }
    let promote = plan(&mut conn, explain(PROMOTE).bind("t")).await;
    assert!(
        promote.contains("using queue_scheduled on queue") && !promote.contains(" on events"),
        "{promote}"
    );
    let rescue = plan(&mut conn, explain(RESCUE)).await;
    assert!(
        rescue.contains("queue_running") && events_only_through(&rescue, "events_pkey"),
        "{rescue}"
    );
}
