//! Claims: moving due pending events to `running` under a lease, for
//! independent topics (one statement) and sequential ones (heads of keys,
//! under the topic's claim lock), and the next time a claim could succeed.

use super::{EVENT_COLS, col, db, event_from_row, micros, opt_ts};
use crate::db::Db;
use jiff::Timestamp;
use mailroom_core::{ClaimRequest, Claimed, FencingToken, OnDead, Result, StoreError};
use sqlx::PgConnection;
use sqlx::postgres::PgRow;

/// Advisory-lock class (first half of the two-key form) of a sequential
/// topic's claim lock, the second half `hashtext(topic)`
/// (`claimer.rs`), so it never meets the migration lock, `max_running`'s
/// lock or an application's locks.
pub(crate) const CLAIM_LOCK_CLASS: i32 = 0x6d72_6374; // "mrct"

/// How long a session holding a topic's claim lock may sit idle before
/// PostgreSQL ends it (`idle_session_timeout`, `claimer.rs`): an instance
/// stopped between two claims (paused, cut off) would otherwise stop
/// every instance's claims of the topic until its connection died. A
/// claimer lets go of the lock within milliseconds of its last claim
/// (`RELEASE_IDLE`, 5 ms), so a second is 200 times what a live one
/// needs; with 10 s, two instances' deliveries stood still for 10 s when
/// one was stopped with `SIGSTOP` while it held the lock.
pub(crate) const CLAIM_IDLE_LIMIT: &str = "1s";

/// The other half of the head rule: no event of the key of queue row `e`
/// runs, one probe of `queue_running`.
macro_rules! none_running {
    () => {
        "(e.key IS NULL OR NOT EXISTS (SELECT 1 FROM mailroom.queue r
             WHERE r.topic = e.topic AND r.key = e.key AND r.state = 'running'))"
    };
}

/// The first half of the head rule: no earlier open event of its key that
/// is not running (pending, scheduled, or dead under `on_dead = block`),
/// one probe of `queue_keys`, which holds no running row (migration 14).
/// Every head test pairs it with [`none_running!`], which covers the
/// running ones, whatever their `seq`.
macro_rules! first_of_key {
    ($blocking:literal) => {
        concat!(
            "(e.key IS NULL OR NOT EXISTS (SELECT 1 FROM mailroom.queue p
                 WHERE p.topic = e.topic AND p.key = e.key AND p.key IS NOT NULL
                   AND p.state <> 'running' AND p.seq < e.seq ",
            $blocking,
            "))"
        )
    };
}
macro_rules! first_block {
    () => {
        first_of_key!("")
    };
}
macro_rules! first_skip {
    () => {
        first_of_key!("AND p.state <> 'dead'")
    };
}

/// Sequential topics: moves the `scheduled` queue rows of topic `$1`
/// that fell due to `pending` (at most 1,000 per claim; `queue_scheduled`).
/// Scheduled rows are not in `queue_claim`, so a backlog of events
/// delivered later costs claims nothing. (Claims of independent events
/// take due scheduled rows directly, [`CLAIM_ANY`].) A claim runs it in
/// its first statement ([`claim_walk!`]), whose walk does not see the rows
/// it moves; a claim that moved any runs that statement again, which does.
macro_rules! promote {
    () => {
        "UPDATE mailroom.queue s SET state = 'pending'
         WHERE s.seq = ANY(ARRAY(
             SELECT d.seq FROM mailroom.queue d
             WHERE d.topic = ANY(ARRAY[$1::text]) AND d.state = 'scheduled' AND d.run_at <= now()
             ORDER BY d.topic, d.run_at LIMIT 1000 FOR UPDATE SKIP LOCKED))
           AND s.state = 'scheduled'"
    };
}
pub(super) const PROMOTE: &str = promote!();

/// "Queue row `$row` has not expired": `$param` is `expire_after` in µs,
/// NULL without it. The expiry clock starts at `ready_at` (migration 11).
macro_rules! unexpired {
    ($row:literal, $param:literal) => {
        concat!(
            "(",
            $param,
            "::int8 IS NULL OR ",
            $row,
            ".ready_at > now() - ",
            $param,
            " * interval '1 microsecond')"
        )
    };
}

/// Moves the queue rows whose `seq` the selection yields to `running`
/// ([`claim_rows!`], lease `$1`, worker `$2`). `= ANY(ARRAY(selection))`, not `IN (selection)`, so
/// the selection runs once and the rows are fetched through the primary
/// keys, in generic plans too (`docs/src/design/postgres.md`).
macro_rules! claim_update {
    ($selection:expr) => {
        claim_rows!(
            concat!(
                "UPDATE mailroom.queue q SET state = 'running'
             WHERE q.seq = ANY(ARRAY(",
                $selection,
                ")) RETURNING q.seq, q.priority"
            ),
            "$1",
            "$2"
        )
    };
}

/// Claims the queue rows that `$picked` (an `UPDATE` of `mailroom.queue`
/// to `running`, returning `seq` and `priority`) moved, and their events
/// with them (status, attempt count — the new fencing token —, lease,
/// worker): the event's update is HOT (`migrations/0007_queue.sql`). `$lease`
/// is the lease's parameter (µs), `$worker` the worker's.
/// Returns the events' columns and each row's priority ([`claimed!`]).
macro_rules! claim_rows {
    ($picked:expr, $lease:literal, $worker:literal) => {
        concat!(
            "WITH ",
            claim_ctes!($picked, $lease, $worker),
            " ",
            claimed!()
        )
    };
}

/// The two CTEs of [`claim_rows!`], `picked` and `claimed`, for a
/// statement with CTEs of its own before them. The lease runs from the
/// statement's start (`statement_timestamp()`), not the transaction's
/// (`now()`): a sequential claim's transaction may have waited for its
/// topic's lock first ([`claim_heads`]), and a lease counted from before
/// that wait would end earlier than the engine reckons.
macro_rules! claim_ctes {
    ($picked:expr, $lease:literal, $worker:literal) => {
        concat!(
            "picked AS (",
            $picked,
            "), claimed AS (
                 UPDATE mailroom.events e
                 SET status = 'running', attempts = e.attempts + 1,
                     lease_until = statement_timestamp() + ",
            $lease,
            " * interval '1 microsecond',
                     started_at = statement_timestamp(), worker = ",
            $worker,
            ", next_attempt_at = NULL
                 WHERE e.seq = ANY(ARRAY(SELECT seq FROM picked))
                 RETURNING e.*
             )"
        )
    };
}

/// What [`claim_ctes!`] claimed: the events' columns, then each row's
/// priority.
macro_rules! claimed {
    () => {
        concat!(
            "SELECT ",
            event_cols!(),
            ", p.priority FROM claimed e JOIN picked p ON p.seq = e.seq"
        )
    };
}

/// Claims the queue rows of topic `$1` whose `seq` the selection yields,
/// if they are still pending (a row an operator's cancel changed meanwhile
/// is waited for and tested again on its new version), with their events
/// ([`claim_ctes!`]; lease `$lease`, worker `$worker`). Sequential claims
/// run under the topic's claim lock ([`claim_heads`]): no row lock.
macro_rules! claim_heads_in {
    ($selection:expr, $lease:literal, $worker:literal) => {
        claim_ctes!(
            concat!(
                "UPDATE mailroom.queue e SET state = 'running'
                 WHERE e.seq = ANY(ARRAY(",
                $selection,
                ")) AND ",
                pending_by_seq!(),
                " RETURNING e.seq, e.priority"
            ),
            $lease,
            $worker
        )
    };
}

/// Independent events, the whole topic: the due pending rows of topic
/// `$3`, at most `$4`, highest priority first, then in arrival order, not
/// expired (`$5`); and with them the due `scheduled` rows (events
/// delivered later, `queue_scheduled`), at most `$4` by due time, which
/// the claim takes straight to running. The two walks are merged in claim
/// order: a sort of at most `2 × $4` rows. `FOR UPDATE SKIP LOCKED` makes
/// concurrent claimers (any number of instances) pass over each other's
/// rows instead of waiting or taking the same event.
///
/// The topic is spelled `= ANY(ARRAY[$3])` and the rows ordered by
/// `(topic, -priority, seq)` so that only `queue_claim` yields that order,
/// whatever the statistics say (`docs/src/design/postgres.md`).
pub(super) const CLAIM_ANY: &str = claim_update!(concat!(
    "WITH due_pending AS (
         SELECT c.seq, c.priority FROM mailroom.queue c
         WHERE c.topic = ANY(ARRAY[$3::text]) AND c.state = 'pending'
           AND c.run_at <= now() AND ",
    unexpired!("c", "$5"),
    " ORDER BY c.topic, -c.priority, c.seq LIMIT $4 FOR UPDATE SKIP LOCKED
     ), due_scheduled AS (
         SELECT d.seq, d.priority FROM mailroom.queue d
         WHERE d.topic = ANY(ARRAY[$3::text]) AND d.state = 'scheduled'
           AND d.run_at <= now() AND ",
    unexpired!("d", "$5"),
    " ORDER BY d.topic, d.run_at LIMIT $4 FOR UPDATE SKIP LOCKED
     )
     SELECT u.seq FROM (SELECT * FROM due_pending UNION ALL SELECT * FROM due_scheduled) u
     ORDER BY -u.priority, u.seq LIMIT $4"
));

/// Independent events from a floor (`floor.rs`), the claims of a topic
/// whose claims keep coming back full: its due pending rows from position
/// (priority `$7`, `seq` `$6`) on in claim order, past the rows earlier
/// claims took, at most `$4`; not expired (`$5`). One row comparison over
/// `queue_claim`'s columns, which starts the index walk there; a
/// condition on `seq` alone let the planner walk the primary key from
/// the floor instead and sort all it found.
///
/// Rows of a higher priority than the floor's (`due_higher`) come before
/// it in claim order: they are walked from the topic's start up to the
/// floor's priority, so an urgent event that arrives during a backlog is
/// taken by the next claim, and the walk from the floor takes only what
/// they leave of `$4`. So the two walks need no merge: every row of the
/// first comes before every row of the second. Without priorities the
/// first is empty and reads one index page: its bound is spelled
/// `-priority < -$7`, a bound btree stops at. The row comparison
/// `(topic, -priority) < ($3, -$7)` it replaced is not one (PostgreSQL 15
/// ends a walk on a row comparison's first column only): every claim
/// from a floor walked the topic's whole pending backlog, with the dead
/// entries of claimed rows (`docs/src/design/postgres.md`).
///
/// Events delivered later (`scheduled` rows) that fell due are left to
/// the claims of the whole topic ([`CLAIM_ANY`]), which come at least
/// every [`RESCAN`](crate::floor::RESCAN) and right after a short claim:
/// so the claims of a busy topic, most of its claims, cost what they
/// cost before delayed delivery (no `queue_scheduled` probe, no sort),
/// and an event that fell due behind that backlog waits at most a second
/// longer, as a retry come due does.
pub(super) const CLAIM_FROM: &str = claim_update!(concat!(
    "WITH due_higher AS (
         SELECT h.seq FROM mailroom.queue h
         WHERE h.topic = ANY(ARRAY[$3::text]) AND h.state = 'pending'
           AND -h.priority < -$7 AND h.run_at <= now() AND ",
    unexpired!("h", "$5"),
    " ORDER BY h.topic, -h.priority, h.seq LIMIT $4 FOR UPDATE SKIP LOCKED
     ), due_pending AS (
         SELECT c.seq FROM mailroom.queue c
         WHERE c.topic = ANY(ARRAY[$3::text]) AND c.state = 'pending'
           AND c.run_at <= now() AND ",
    unexpired!("c", "$5"),
    " AND (c.topic, -c.priority, c.seq) >= ($3, -$7, $6)
         ORDER BY c.topic, -c.priority, c.seq
         LIMIT $4 - (SELECT count(*) FROM due_higher) FOR UPDATE SKIP LOCKED
     )
     SELECT seq FROM due_higher UNION ALL SELECT seq FROM due_pending"
));

/// "Row `e` is pending", for rows found by `seq`: checked again on the
/// newest version when the claim's update waited for a concurrent change
/// of the row (an operator's cancel). Spelled so that it does not match `queue_claim`'s predicate
/// (`state = 'pending'`): with that, the planner could fetch the rows by
/// `seq` through `queue_claim`, whose `seq` is its last column, walking
/// the topic's whole index once per row (630 ms for 1,024 rows of a
/// 15,000-event backlog) instead of one probe of the primary key each.
macro_rules! pending_by_seq {
    () => {
        "COALESCE(e.state, '') = 'pending'"
    };
}

/// The walk of a sequential claim ([`claim_walk!`]): the first
/// `$limit` pending rows of topic `$1` in claim order, read as far as the
/// rows above it ask. The next due time looks at what the next walk
/// reaches through it too ([`DUE_HEAD_IN_WALK`], [`next_due_by_key!`]).
macro_rules! walk {
    ($limit:literal) => {
        concat!(
            "SELECT w.seq, w.topic, w.key, w.run_at, w.ready_at FROM mailroom.queue w
             WHERE w.topic = ANY(ARRAY[$1::text]) AND w.state = 'pending'
             ORDER BY w.topic, -w.priority, w.seq LIMIT ",
            $limit
        )
    };
}

/// "Another session waits for topic `$1`'s claim lock" (`pg_locks`: the
/// lock's two keys are `classid` and `objid`, `objsubid` 2 for the
/// two-key form; the class spelled as [`CLAIM_LOCK_CLASS`]): the claimer
/// then lets go of it at once instead of holding it for its next claim
/// (`claimer.rs`). A waiter's statement holds a snapshot while it waits,
/// which keeps VACUUM and pruning from the rows every claim and
/// completion leaves behind meanwhile: holding the lock for 100 ms against
/// a waiting instance cost two instances 1.46× the database CPU per event.
macro_rules! contended {
    () => {
        "EXISTS (SELECT 1 FROM pg_locks l
                 WHERE l.locktype = 'advisory' AND l.classid = 1836213108::oid
                   AND l.objid = hashtext($1)::oid AND l.objsubid = 2 AND NOT l.granted)"
    };
}

/// Sequential topics: claims the heads of keys among the first `$3`
/// pending rows of topic `$1` in claim order, at most `$2`, under the
/// topic's claim lock ([`claim_heads`]). `$4` expiry (µs or NULL), `$5`
/// lease (µs), `$6` worker.
///
/// The walk ([`walk!`]) reads the topic's first `$3` pending rows at most,
/// in claim order: with a few keys and deep backlogs almost every pending
/// event waits behind its key's head, and an unbounded walk would test
/// them all on every claim. Its rows are tested as they come: due, not
/// expired, first open event of their key that does not run
/// ([`first_of_key!`]) and nothing of their key running
/// ([`none_running!`]), until `$2` pass. The walk is a subquery under the
/// `LIMIT`, so a claim of 256 heads reads and tests about as many rows,
/// not the whole walk; no `ORDER BY`: the walk is in claim order already,
/// and a sort or a hash join would test every row of the walk before the
/// first comes out (`docs/src/design/sequential.md`). The rows that passed are
/// claimed in the same statement ([`claim_heads_in!`]).
///
/// Returns the claimed events ([`claimed!`]; a single row of NULLs when
/// none), each row followed by whether the bound cut the walk short of
/// `$2` heads (more pending events lie past it: [`HEADS_BY_KEY`] then
/// looks for the heads of the keys the walk did not reach; counted by a
/// second walk, only when the claim is short) and whether it moved
/// scheduled rows that fell due to pending ([`PROMOTE`], first, in the
/// same statement: one round trip less per claim than a statement of its
/// own).
macro_rules! claim_walk {
    ($head:expr) => {
        concat!(
            "WITH promoted AS (",
            promote!(),
            " RETURNING s.seq
             ), candidates AS MATERIALIZED (
                 SELECT e.seq FROM (",
            walk!("$3"),
            ") e
                 WHERE e.run_at <= now() AND ",
            unexpired!("e", "$4"),
            " AND ",
            $head,
            " AND ",
            none_running!(),
            "
                 LIMIT $2
             ), ",
            claim_heads_in!("SELECT c.seq FROM candidates c", "$5", "$6"),
            ", flags AS (
                 SELECT CASE WHEN (SELECT count(*) FROM candidates) < $2
                             THEN (SELECT count(*) FROM (",
            walk!("$3"),
            ") n) >= $3
                             ELSE false END AS cut_short,
                        EXISTS (SELECT 1 FROM promoted) AS promoted,
                        ",
            contended!(),
            " AS contended
             )
             SELECT c.*, f.cut_short, f.promoted, f.contended
             FROM flags f LEFT JOIN (",
            claimed!(),
            ") c ON true"
        )
    };
}

/// The keys of a sequential topic that have open events other than
/// running ones, in key order, one index probe each (a "skip scan" of
/// `queue_keys`), and each key's head: its first such event (pending,
/// scheduled or dead; `$dead` drops dead ones for `OnDead::Skip`), kept if
/// it is pending and nothing of its key runs (a key whose only open event
/// runs has no head to claim).
/// Columns `seq`, `key`, `run_at`. `$1` topic; `$keys` the most keys
/// visited, so a topic with very many keys costs a bounded walk (keys past
/// it are reached once earlier ones have no open events).
///
/// Spelled (`= ANY` for the topic, a range `>= key AND <= key` for the
/// key) so that only `queue_keys (topic, key, seq)` yields the orders
/// asked for, whatever the statistics say (`docs/src/design/sequential.md`).
macro_rules! heads_by_key {
    ($dead:literal, $keys:literal) => {
        concat!(
            "WITH RECURSIVE keys (key, n) AS (
                 (SELECT k.key, 1 FROM mailroom.queue k
                  WHERE k.topic = ANY(ARRAY[$1::text]) AND k.key IS NOT NULL
                    AND k.state <> 'running'
                  ORDER BY k.topic, k.key LIMIT 1)
                 UNION ALL
                 SELECT next.key, keys.n + 1
                 FROM keys CROSS JOIN LATERAL (
                     SELECT k.key FROM mailroom.queue k
                     WHERE k.topic = ANY(ARRAY[$1::text]) AND k.key > keys.key
                       AND k.key IS NOT NULL AND k.state <> 'running'
                     ORDER BY k.topic, k.key LIMIT 1) next
                 WHERE keys.n < ",
            $keys,
            "
             ), heads AS (
                 SELECT h.seq, h.key, h.run_at, h.ready_at
                 FROM keys CROSS JOIN LATERAL (
                     SELECT f.seq, f.key, f.state, f.run_at, f.ready_at FROM mailroom.queue f
                     WHERE f.topic = ANY(ARRAY[$1::text]) AND f.key IS NOT NULL
                       AND f.state <> 'running'
                       AND f.key >= keys.key AND f.key <= keys.key ",
            $dead,
            "
                     ORDER BY f.topic, f.key, f.seq LIMIT 1) h
                 WHERE h.state = 'pending'
                   AND NOT EXISTS (SELECT 1 FROM mailroom.queue r
                       WHERE r.topic = $1 AND r.key = keys.key AND r.state = 'running')
             )"
        )
    };
}

/// Sequential topics, past the walk's bound: claims the heads of keys
/// ([`heads_by_key!`]) that are due and not expired (`$3`), in arrival
/// order, at most `$2`, under the topic's claim lock ([`claim_heads`]).
/// `$1` topic, `$4` lease, `$5` worker. The heads the walk claimed before
/// it in the same transaction run now, so their keys have no head here.
macro_rules! claim_heads_by_key {
    ($dead:literal) => {
        concat!(
            heads_by_key!($dead, "10000"),
            ", ",
            claim_heads_in!(
                concat!(
                    "SELECT h.seq FROM heads h WHERE h.run_at <= now() AND ",
                    unexpired!("h", "$3"),
                    " ORDER BY h.seq LIMIT $2"
                ),
                "$4",
                "$5"
            ),
            " ",
            claimed!()
        )
    };
}
pub(super) const HEADS_BY_KEY: &str = claim_heads_by_key!("");
pub(super) const HEADS_BY_KEY_SKIP_DEAD: &str = claim_heads_by_key!("AND f.state <> 'dead'");

/// Sequential topics, past the walk's bound: claims due keyless events
/// (independent; only the outbox can store them in a sequential topic),
/// at most `$2`, not expired (`$3`), under the topic's claim lock. `$1`
/// topic, `$4` lease, `$5` worker. It walks every pending event of the
/// topic, so a claim runs it at most once per
/// [`RESCAN`](crate::floor::RESCAN) while the topic's heads are sparse:
/// without it, a keyless event behind a blocked key's deep backlog would
/// never come within the walk's bound.
pub(super) const KEYLESS: &str = concat!(
    "WITH ",
    claim_heads_in!(
        concat!(
            "SELECT k.seq FROM mailroom.queue k
             WHERE k.topic = ANY(ARRAY[$1::text]) AND k.state = 'pending'
               AND k.run_at <= now() AND k.key IS NULL AND ",
            unexpired!("k", "$3"),
            " ORDER BY k.topic, -k.priority, k.seq LIMIT $2"
        ),
        "$4",
        "$5"
    ),
    " ",
    claimed!()
);

/// Pending events a sequential claim's walk tests at most (its bound).
pub(crate) const SEQUENTIAL_WINDOW: i64 = 1024;
/// The bound right after a walk that it cut short: the topic's heads are
/// sparse among its pending events (few keys, deep backlogs), so most of
/// them come from [`HEADS_BY_KEY`] and a long walk would mostly test
/// events waiting behind their key's head.
pub(crate) const SPARSE_WINDOW: i64 = 64;

/// The starvation bound (`max_wait_for_priority`, `$2` µs): the pending
/// rows of topic `$1` below its highest priority that have been due that
/// long take the highest priority in the queue (their event keeps the
/// priority it was given), so the next claims take them, oldest first.
///
/// Index-driven like a claim: the priorities present are found one
/// `queue_claim` probe each (a skip scan, at most 100), and in each lower
/// one only its first `$3` rows in claim order are looked at, the oldest
/// arrivals, which are the ones waiting longest.
pub(super) const RAISE_WAITING: &str = "
    WITH RECURSIVE levels (p, n) AS (
        (SELECT -c.priority, 1 FROM mailroom.queue c
         WHERE c.topic = ANY(ARRAY[$1::text]) AND c.state = 'pending'
         ORDER BY c.topic, -c.priority LIMIT 1)
        UNION ALL
        SELECT nx.p, levels.n + 1 FROM levels CROSS JOIN LATERAL (
            SELECT -c.priority AS p FROM mailroom.queue c
            WHERE c.topic = ANY(ARRAY[$1::text]) AND c.state = 'pending'
              AND -c.priority > levels.p
            ORDER BY c.topic, -c.priority LIMIT 1) nx
        WHERE levels.n < 100
    ), waiting AS (
        SELECT x.seq FROM levels CROSS JOIN LATERAL (
            SELECT w.seq, w.run_at FROM mailroom.queue w
            WHERE w.topic = ANY(ARRAY[$1::text]) AND w.state = 'pending'
              AND -w.priority = levels.p
            ORDER BY w.topic, -w.priority, w.seq LIMIT $3) x
        WHERE levels.n > 1 AND x.run_at <= now() - $2 * interval '1 microsecond'
    ), locked AS (
        SELECT q.seq FROM mailroom.queue q
        WHERE q.seq = ANY(ARRAY(SELECT seq FROM waiting)) AND q.state = 'pending'
        FOR UPDATE SKIP LOCKED
    )
    UPDATE mailroom.queue q SET priority = -(SELECT p FROM levels WHERE n = 1)
    WHERE q.seq = ANY(ARRAY(SELECT seq FROM locked))";

/// Rows of each lower priority [`RAISE_WAITING`] looks at.
const RAISE_WINDOW: i64 = 1000;

/// Runs [`RAISE_WAITING`] for `req`'s topic; how many rows it raised.
pub(crate) async fn raise_waiting(
    pool: &Db,
    req: &ClaimRequest,
    max_wait: std::time::Duration,
) -> Result<u64> {
    let raised = sqlx::query(RAISE_WAITING)
        .bind(&req.topic)
        .bind(micros(max_wait))
        .bind(RAISE_WINDOW)
        .execute(pool)
        .await
        .map_err(db("raising events that waited max_wait_for_priority"))?;
    Ok(raised.rows_affected())
}

/// Where a claim stands in a topic's claim order: (priority, seq).
pub(crate) type Position = (i32, i64);

/// Claims independent events (no `per_key`): the whole topic, or from
/// `from` on (a floor, `floor.rs`). Returns each claimed event with its
/// position, in claim order.
pub(crate) async fn claim_from(
    pool: &Db,
    req: &ClaimRequest,
    from: Option<Position>,
) -> Result<Vec<(Position, Claimed)>> {
    let query = match from {
        None => sqlx::query(CLAIM_ANY),
        Some(_) => sqlx::query(CLAIM_FROM),
    }
    .bind(micros(req.lease))
    .bind(&req.worker)
    .bind(&req.topic)
    .bind(i64::from(req.max))
    .bind(req.expire_after.map(micros));
    let query = match from {
        None => query,
        Some((priority, seq)) => query.bind(seq).bind(priority),
    };
    let rows = query.fetch_all(pool).await.map_err(db("claiming events"))?;
    claimed_from_rows(&rows)
}

/// Claims heads of keys, for sequential topics. The head rule ("no earlier
/// open event of the key, none running") reads *other* rows, which row
/// locks alone cannot protect: two transactions could each see "nothing of
/// key K is running" on their own snapshots and claim two different events
/// of K (e.g. a replayed earlier event and the next one). So the claims of
/// a sequential topic take turns: `conn` holds the topic's claim lock for
/// its session (`claimer.rs`, a session-level advisory lock, waited for),
/// taken before this call, and each statement here commits on its own.
/// Their READ COMMITTED snapshots are taken after the lock was granted, so
/// they see every claim of the topic that committed before (the previous
/// holder's committed before it let go), and no other claim of the topic
/// commits until the lock is let go.
///
/// Only claims make events `running`, and every claim of a sequential
/// topic runs under its lock, so two running events of one key can never
/// coexist, across any number of connections and instances.
/// Completions, replays and rescues only make a key less busy and need no
/// lock. Keyless events are independent; the lock covers them too.
///
/// The claim is one statement ([`claim_walk!`]): a walk of the pending
/// events in claim order, bounded by `window` ([`SEQUENTIAL_WINDOW`] or
/// [`SPARSE_WINDOW`]), that tests the head rule and claims the heads it
/// finds. It runs again if it promoted scheduled rows its snapshot did not
/// see. When the bound cut it short of `max` heads, [`HEADS_BY_KEY`] claims
/// the heads of the other keys, one key at a time, and, when `keyless`,
/// [`KEYLESS`] the keyless events.
///
/// A statement after the first that fails leaves what the earlier ones
/// claimed committed and leased: it is handed out rather than left to
/// lease rescue, with the error beside it (the caller drops the
/// connection).
pub(crate) async fn claim_heads(
    conn: &mut PgConnection,
    req: &ClaimRequest,
    on_dead: OnDead,
    window: i64,
    keyless: bool,
) -> Result<Heads> {
    let (walk, by_key) = match on_dead {
        OnDead::Block => (claim_walk!(first_block!()), HEADS_BY_KEY),
        OnDead::Skip => (claim_walk!(first_skip!()), HEADS_BY_KEY_SKIP_DEAD),
    };
    let walked = walk_and_claim(conn, req, walk, window, req.max).await?;
    let mut heads = Heads {
        sparse: walked.cut_short && sparse_heads(walked.claimed.len(), req.max, window),
        claimed: walked.claimed,
        contended: walked.contended,
        failed: None,
    };
    let mut cut_short = walked.cut_short;
    let left = req.max.saturating_sub(len_u32(&heads.claimed));
    if walked.promoted && left > 0 {
        // The rows it moved to pending are visible to the next statement.
        match walk_and_claim(conn, req, walk, window, left).await {
            Ok(again) => {
                heads.claimed.extend(again.claimed);
                cut_short = again.cut_short;
                heads.sparse = cut_short && sparse_heads(heads.claimed.len(), req.max, window);
            }
            Err(e) => return Ok(heads.failing(e)),
        }
    }
    if cut_short {
        if let Err(e) = claim_more(conn, by_key, req, &mut heads.claimed).await {
            return Ok(heads.failing(e));
        }
        if keyless {
            if let Err(e) = claim_more(conn, KEYLESS, req, &mut heads.claimed).await {
                return Ok(heads.failing(e));
            }
        }
    }
    Ok(heads.sorted())
}

/// What [`claim_heads`] claimed.
#[derive(Debug)]
pub(crate) struct Heads {
    /// The claimed events with their positions, in claim order.
    pub(crate) claimed: Vec<(Position, Claimed)>,
    /// The topic's heads are sparse ([`sparse_heads`]).
    pub(crate) sparse: bool,
    /// Another session waits for the topic's claim lock.
    pub(crate) contended: bool,
    /// A statement after the first failed with this.
    pub(crate) failed: Option<StoreError>,
}

impl Heads {
    fn failing(mut self, e: StoreError) -> Self {
        self.failed = Some(e);
        self.sorted()
    }

    fn sorted(mut self) -> Self {
        self.claimed
            .sort_unstable_by_key(|&((priority, seq), _)| claim_order(priority, seq));
        self
    }
}

/// `v.len()` as a `u32` (a claim's length, at most its `max`).
fn len_u32<T>(v: &[T]) -> u32 {
    u32::try_from(v.len()).unwrap_or(u32::MAX)
}

/// What one run of [`claim_walk!`] did.
struct Walked {
    claimed: Vec<(Position, Claimed)>,
    /// The bound cut the walk short of the heads asked for.
    cut_short: bool,
    /// It moved scheduled rows that fell due to pending, which its walk
    /// did not see.
    promoted: bool,
    /// Another session waits for the topic's claim lock ([`contended!`]).
    contended: bool,
}

/// Runs `sql` ([`claim_walk!`]) for up to `max` heads within `window`.
async fn walk_and_claim(
    conn: &mut PgConnection,
    req: &ClaimRequest,
    sql: &'static str,
    window: i64,
    max: u32,
) -> Result<Walked> {
    let rows = sqlx::query(sql)
        .bind(&req.topic)
        .bind(i64::from(max))
        .bind(window)
        .bind(req.expire_after.map(micros))
        .bind(micros(req.lease))
        .bind(&req.worker)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("claiming events"))?;
    let first = rows
        .first()
        .ok_or_else(|| StoreError::Corrupt("a sequential claim returned no row".into()))?;
    let cut_short: bool = col(first, EVENT_COLS + 1)?;
    let promoted: bool = col(first, EVENT_COLS + 2)?;
    let contended: bool = col(first, EVENT_COLS + 3)?;
    // With nothing claimed, the one row is the flags' alone.
    let rows: Vec<PgRow> = rows
        .into_iter()
        .filter(|row| matches!(col::<Option<i64>>(row, 0), Ok(Some(_))))
        .collect();
    Ok(Walked {
        claimed: claimed_from_rows(&rows)?,
        cut_short,
        promoted,
        contended,
    })
}

/// Past the walk's bound: adds to `claimed` what `sql` ([`HEADS_BY_KEY`] or
/// [`KEYLESS`]) claims, up to `req.max` in all.
async fn claim_more(
    conn: &mut PgConnection,
    sql: &'static str,
    req: &ClaimRequest,
    claimed: &mut Vec<(Position, Claimed)>,
) -> Result<()> {
    let left = req.max.saturating_sub(len_u32(claimed));
    if left == 0 {
        return Ok(());
    }
    let rows = sqlx::query(sql)
        .bind(&req.topic)
        .bind(i64::from(left))
        .bind(req.expire_after.map(micros))
        .bind(micros(req.lease))
        .bind(&req.worker)
        .fetch_all(&mut *conn)
        .await
        .map_err(db("claiming events"))?;
    claimed.extend(claimed_from_rows(&rows)?);
    Ok(())
}

/// Whether a walk of `window` pending events that found `found` heads,
/// fewer than the `max` asked for, shows the topic's heads sparse: at that
/// rate a walk of the whole bound ([`SEQUENTIAL_WINDOW`]) would come back
/// short too. The next claim then walks [`SPARSE_WINDOW`] events and looks
/// up the rest key by key ([`HEADS_BY_KEY`]); once a short walk finds
/// heads densely enough again, claims walk the whole bound, and need no
/// lookup by key at all when they fill. (Judging by "cut short" alone
/// kept a topic sparse for good: a walk of [`SPARSE_WINDOW`] events is
/// cut short of any claim larger than that. A drain of 1,000 keys fell
/// into it when its keys were briefly all busy, and each claim then
/// looked up every key: 19 ms a claim instead of 9.6.)
pub(crate) fn sparse_heads(found: usize, max: u32, window: i64) -> bool {
    let found = i64::try_from(found).unwrap_or(i64::MAX);
    found.saturating_mul(SEQUENTIAL_WINDOW) < i64::from(max).saturating_mul(window)
}

/// The sort key of claim order: highest priority first, then arrival.
pub(crate) fn claim_order(priority: i32, seq: i64) -> (std::cmp::Reverse<i32>, i64) {
    (std::cmp::Reverse(priority), seq)
}

/// Claimed rows (`claim_update!`'s), in claim order.
fn claimed_from_rows(rows: &[PgRow]) -> Result<Vec<(Position, Claimed)>> {
    let mut claimed = rows
        .iter()
        .map(|row| {
            let (seq, event) = event_from_row(row)?;
            let priority: i32 = col(row, EVENT_COLS)?;
            Ok(((priority, seq), event))
        })
        .collect::<Result<Vec<_>>>()?;
    // RETURNING comes in no particular order.
    claimed.sort_unstable_by_key(|&((priority, seq), _)| claim_order(priority, seq));
    claimed
        .into_iter()
        .map(|(seq, event)| {
            let lease_until = event.lease_until.ok_or_else(|| {
                StoreError::Corrupt(format!("claimed event {} has no lease", event.id))
            })?;
            let claimed = Claimed {
                token: FencingToken(event.attempts),
                lease_until,
                event,
            };
            Ok((seq, claimed))
        })
        .collect()
}

/// Independent events: the earliest due time of a pending row that has not
/// expired (`$2`), or of a scheduled one (`queue_scheduled`).
pub(super) const NEXT_DUE: &str = concat!(
    "SELECT (extract(epoch FROM LEAST(
         (SELECT MIN(e.run_at) FROM mailroom.queue e
          WHERE e.topic = $1 AND e.state = 'pending' AND ",
    unexpired!("e", "$2"),
    "),
         (SELECT MIN(s.run_at) FROM mailroom.queue s
          WHERE s.topic = $1 AND s.state = 'scheduled'))) * 1000000)::int8"
);

/// Sequential topics: the earliest due time among the keys' heads
/// ([`heads_by_key!`]) and the keyless pending events among the first `$2`
/// pending ones, the part of the topic the next claim's walk reaches (`$2`
/// is that walk's bound), so it never walks the whole backlog; neither
/// expired (`$3`). A keyless event past the bound cannot be claimed until
/// the walk reaches it, so it does not count here either
/// (`docs/src/design/sequential.md`). Scheduled rows count by their due time.
macro_rules! next_due_by_key {
    ($dead:literal) => {
        concat!(
            heads_by_key!($dead, "10000"),
            " SELECT ",
            us!("MIN(t.due)"),
            " FROM (
                 SELECT heads.run_at AS due FROM heads WHERE ",
            unexpired!("heads", "$3"),
            "
                 UNION ALL
                 SELECT w.run_at FROM (",
            walk!("$2"),
            ") w
                 WHERE w.key IS NULL AND ",
            unexpired!("w", "$3"),
            "
                 UNION ALL
                 SELECT s.run_at FROM (
                     SELECT d.run_at FROM mailroom.queue d
                     WHERE d.topic = ANY(ARRAY[$1::text]) AND d.state = 'scheduled'
                     ORDER BY d.topic, d.run_at LIMIT 1) s) t"
        )
    };
}

/// Sequential topics: the database's time if a head that is due lies
/// among the first `$2` pending events of topic `$1` in claim order (the
/// next walk's reach; the first open event of its key, nothing of its key
/// running, not expired (`$3`)), NULL otherwise. It stops at the first
/// such head, where [`next_due_by_key!`] looks up every key: a claim that
/// came back short asks for the next due time at once, and when keys it
/// found running have finished since, the answer is "now".
macro_rules! due_head_in_walk {
    ($head:expr) => {
        concat!(
            "SELECT CASE WHEN EXISTS (SELECT 1 FROM (",
            walk!("$2"),
            ") e
               WHERE e.run_at <= now() AND ",
            unexpired!("e", "$3"),
            " AND ",
            $head,
            " AND ",
            none_running!(),
            ") THEN ",
            us!("now()"),
            " END"
        )
    };
}
pub(super) const DUE_HEAD_IN_WALK: &str = due_head_in_walk!(first_block!());
pub(super) const DUE_HEAD_IN_WALK_SKIP_DEAD: &str = due_head_in_walk!(first_skip!());

/// The earliest due time of an event a claim could take; `window` is the
/// bound of a sequential topic's next walk (unused for other topics). A
/// sequential topic's is "now" when a due head lies within that walk
/// ([`DUE_HEAD_IN_WALK`]), and looked up key by key otherwise.
pub(crate) async fn next_due(
    pool: &Db,
    req: &ClaimRequest,
    window: i64,
) -> Result<Option<Timestamp>> {
    if let Some(on_dead) = req.per_key {
        let quick = match on_dead {
            OnDead::Block => DUE_HEAD_IN_WALK,
            OnDead::Skip => DUE_HEAD_IN_WALK_SKIP_DEAD,
        };
        let now: Option<i64> = sqlx::query_scalar(quick)
            .bind(&req.topic)
            .bind(window)
            .bind(req.expire_after.map(micros))
            .fetch_one(pool)
            .await
            .map_err(db("finding the next due event"))?;
        if now.is_some() {
            return opt_ts(now);
        }
    }
    let sql = match req.per_key {
        None => NEXT_DUE,
        Some(OnDead::Block) => next_due_by_key!(""),
        Some(OnDead::Skip) => next_due_by_key!("AND f.state <> 'dead'"),
    };
    let mut query = sqlx::query_scalar(sql).bind(&req.topic);
    if req.per_key.is_some() {
        query = query.bind(window);
    }
    query = query.bind(req.expire_after.map(micros));
    let due: Option<i64> = query
        .fetch_one(pool)
        .await
        .map_err(db("finding the next due event"))?;
    opt_ts(due)
}

#[cfg(test)]
mod tests {
    /// The contention test names the claim lock's class.
    #[test]
    fn the_contention_test_names_the_claim_lock() {
        let oid = format!("{}::oid", super::CLAIM_LOCK_CLASS);
        assert!(contended!().contains(&oid));
    }

    #[test]
    fn heads_are_sparse_when_the_whole_bound_would_not_fill_the_claim() {
        use super::{SEQUENTIAL_WINDOW as FULL, SPARSE_WINDOW as SHORT, sparse_heads};
        assert!(sparse_heads(200, 256, FULL));
        assert!(!sparse_heads(256, 256, FULL));
        // 1 in 4 of a short walk's events are heads: 256 in the whole bound.
        assert!(!sparse_heads(16, 256, SHORT));
        assert!(sparse_heads(15, 256, SHORT));
        assert!(sparse_heads(0, 1, SHORT));
    }
}
