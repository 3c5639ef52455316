//! Claims: moving due pending events to `running` under a lease, for
//! independent topics (one statement) and sequential ones (heads of keys,
//! under per-key advisory locks), and the next time a claim could succeed.

use super::{EVENT_COLS, col, db, event_from_row, micros, opt_ts};
use jiff::Timestamp;
use mailroom_core::{ClaimRequest, Claimed, FencingToken, OnDead, Result, StoreError};
use sqlx::postgres::PgRow;
use sqlx::{PgPool, Postgres, Transaction};

/// Advisory-lock class (first half of the two-key form) of the per-key claim
/// locks, so they never meet the migration lock or an application's locks.
pub(super) const KEY_LOCK_CLASS: i32 = 0x6d72_6b79; // "mrky"

/// The other half of the head rule: no event of the key of queue row `e`
/// runs, one probe of `queue_running`. Step 1 tests it to pick candidates;
/// step 2 ([`claim_locked!`]) tests it again on a snapshot taken after the
/// key's lock was granted, so it sees every claim of the key that
/// committed ([`claim_heads`]).
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
/// its step 1 ([`claim_candidates!`]), whose walk does not see the rows it
/// moves; a claim that moved any runs step 1 again, which does.
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
/// ([`claim_rows!`]). `= ANY(ARRAY(selection))`, not `IN (selection)`, so
/// the selection runs once and the rows are fetched through the primary
/// keys, in generic plans too (`docs/perf/postgres.md`).
macro_rules! claim_update {
    ($selection:expr) => {
        claim_rows!(concat!(
            "UPDATE mailroom.queue q SET state = 'running'
             WHERE q.seq = ANY(ARRAY(",
            $selection,
            ")) RETURNING q.seq, q.priority"
        ))
    };
}

/// Claims the queue rows that `$picked` (an `UPDATE` of `mailroom.queue`
/// to `running`, returning `seq` and `priority`) moved, and their events
/// with them (status, attempt count — the new fencing token —, lease,
/// worker): the event's update is HOT (`schema.rs`, migration 7). `$1`
/// lease (µs), `$2` worker; the selection's own parameters follow.
/// Returns the events' columns and each row's priority.
macro_rules! claim_rows {
    ($picked:expr) => {
        concat!(
            "WITH picked AS (",
            $picked,
            "), claimed AS (
                 UPDATE mailroom.events e
                 SET status = 'running', attempts = e.attempts + 1,
                     lease_until = now() + $1 * interval '1 microsecond',
                     started_at = now(), worker = $2, next_attempt_at = NULL
                 WHERE e.seq = ANY(ARRAY(SELECT seq FROM picked))
                 RETURNING e.*
             )
             SELECT ",
            event_cols!(),
            ", p.priority FROM claimed e JOIN picked p ON p.seq = e.seq"
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
/// whatever the statistics say (`docs/perf/postgres.md`).
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
/// entries of claimed rows (`docs/perf/postgres.md`).
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
/// newest version when `FOR UPDATE` waited for or skipped a concurrent
/// claim. Spelled so that it does not match `queue_claim`'s predicate
/// (`state = 'pending'`): with that, the planner could fetch the rows by
/// `seq` through `queue_claim`, whose `seq` is its last column, walking
/// the topic's whole index once per row (630 ms for 1,024 rows of a
/// 15,000-event backlog) instead of one probe of the primary key each.
macro_rules! pending_by_seq {
    () => {
        "COALESCE(e.state, '') = 'pending'"
    };
}

/// The walk of a sequential claim ([`claim_candidates!`]): the first
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

/// Sequential topics, step 1: the candidate heads (on this statement's
/// snapshot), each of whose key we now hold. `$1` topic, `$2` max, `$3`
/// lock class, `$4` window, `$5` expiry (µs or NULL).
///
/// The walk ([`walk!`]) reads the topic's first `$4` pending rows at most,
/// in claim order: with a few keys and deep backlogs almost every pending
/// event waits behind its key's head, and an unbounded walk would test
/// them all on every claim. Its rows are tested as they come: due, not
/// expired, first open event of their key that does not run
/// ([`first_of_key!`]) and nothing of their key running
/// ([`none_running!`]) on the walk's copy, and then the key's lock is tried
/// (`pg_try_advisory_xact_lock`, not waited for: a key another claim
/// holds is passed over), until `$2` are taken. The `CASE` tries the lock
/// only for a row that passed the tests, so a claim holds the locks of
/// the keys it takes and of no other. The walk is a subquery under the
/// `LIMIT`, so a claim of 256 heads reads and tests about as many rows,
/// not the whole walk; no `ORDER BY`: the walk is in claim order already,
/// and a sort or a hash join would test every row of the walk before the
/// first comes out (`docs/perf/postgres.md`).
///
/// No row lock for a keyed row: the key's lock keeps every other claim
/// off the key's events, and step 2 ([`claim_locked!`]) re-reads each row
/// and claims it only if it is still pending. A keyless candidate (only
/// the outbox stores them in a sequential topic) has no key: its row is
/// locked instead (`FOR UPDATE SKIP LOCKED`, passed over if another claim
/// holds it), as [`KEYLESS`] locks the ones it finds, so no claim's step 2
/// waits on a keyless row another claim holds while that one waits on it.
///
/// Returns whether the bound cut the walk short of `$2` heads (more
/// pending events lie past it: [`HEADS_BY_KEY`] then looks for the heads
/// of the keys the walk did not reach; counted by a second walk, only when
/// the claim is short), the candidates' `seq`s, and whether it moved
/// scheduled rows that fell due to pending ([`PROMOTE`], first, in the
/// same statement: one round trip less per claim than a statement of its
/// own).
macro_rules! claim_candidates {
    ($head:expr) => {
        concat!(
            "WITH promoted AS (",
            promote!(),
            " RETURNING s.seq
             ), candidates AS MATERIALIZED (
                 SELECT e.seq FROM (",
            walk!("$4"),
            ") e
                 WHERE CASE WHEN e.run_at <= now() AND ",
            unexpired!("e", "$5"),
            " AND ",
            $head,
            " AND ",
            none_running!(),
            "
                            THEN CASE WHEN e.key IS NULL
                                      THEN EXISTS (SELECT 1 FROM mailroom.queue k
                                                   WHERE k.seq = e.seq AND COALESCE(k.state, '') = 'pending'
                                                   FOR UPDATE SKIP LOCKED)
                                      ELSE pg_try_advisory_xact_lock($3, hashtext($1 || chr(31) || e.key))
                                      END
                            ELSE false END
                 LIMIT $2
             )
             SELECT CASE WHEN cardinality(l.seqs) < $2
                         THEN (SELECT count(*) FROM (",
            walk!("$4"),
            ") n) >= $4
                         ELSE false END,
                    l.seqs,
                    EXISTS (SELECT 1 FROM promoted)
             FROM (SELECT ARRAY(SELECT c.seq FROM candidates c ORDER BY c.seq) AS seqs) l"
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
/// asked for, whatever the statistics say (`docs/perf/postgres.md`).
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

/// Sequential topics, step 1 past the walk's bound: the heads of keys
/// ([`heads_by_key!`]) that are due, minus the `seq`s the walk already
/// took (`$3`), in arrival order, each taken if its key's lock is granted
/// (tried as they come, up to `$2`), as the walk's are. `$1` topic, `$2`
/// max, `$4` lock class, `$5` expiry.
///
/// No row lock, as in the walk ([`claim_candidates!`]): a claim that
/// locked a head's row before trying its key's lock held the rows of keys
/// another instance's claim had taken until it committed, and that claim's
/// step 2 waited for it (two instances draining one sequential topic
/// together ran at under half of one's rate, and a claim waiting on another
/// that waited on it was ended after `deadlock_timeout`).
macro_rules! claim_heads_by_key {
    ($dead:literal) => {
        concat!(
            heads_by_key!($dead, "10000"),
            ", candidates AS MATERIALIZED (
                 SELECT e.seq, e.key FROM mailroom.queue e
                 WHERE e.seq = ANY(ARRAY(SELECT h.seq FROM heads h WHERE h.run_at <= now()
                                         AND ",
            unexpired!("h", "$5"),
            "))
                   AND NOT (e.seq = ANY($3)) AND ",
            pending_by_seq!(),
            "
                 ORDER BY e.seq)
             SELECT c.seq FROM candidates c
             WHERE pg_try_advisory_xact_lock($4, hashtext($1 || chr(31) || c.key))
             LIMIT $2"
        )
    };
}
pub(super) const HEADS_BY_KEY: &str = claim_heads_by_key!("");
pub(super) const HEADS_BY_KEY_SKIP_DEAD: &str = claim_heads_by_key!("AND f.state <> 'dead'");

/// Sequential topics, step 1 past the walk's bound: due keyless events
/// (independent; only the outbox can store them in a sequential topic),
/// minus the `seq`s already taken (`$3`). `$1` topic, `$2` max, `$4`
/// expiry. It walks
/// every pending event of the topic, so a claim runs it at most once per
/// [`RESCAN`](crate::floor::RESCAN) while the topic's heads are sparse:
/// without it, a keyless event behind a blocked key's deep backlog would
/// never come within the walk's bound.
pub(super) const KEYLESS: &str = concat!(
    "SELECT e.seq FROM mailroom.queue e
     WHERE e.topic = ANY(ARRAY[$1::text]) AND e.state = 'pending'
       AND e.run_at <= now() AND e.key IS NULL AND NOT (e.seq = ANY($3)) AND ",
    unexpired!("e", "$4"),
    " ORDER BY e.topic, -e.priority, e.seq LIMIT $2 FOR UPDATE OF e SKIP LOCKED"
);

/// Pending events a sequential claim's walk tests at most (its bound).
pub(crate) const SEQUENTIAL_WINDOW: i64 = 1024;
/// The bound right after a walk that it cut short: the topic's heads are
/// sparse among its pending events (few keys, deep backlogs), so most of
/// them come from [`HEADS_BY_KEY`] and a long walk would mostly test
/// events waiting behind their key's head.
pub(crate) const SPARSE_WINDOW: i64 = 64;

/// Sequential topics, step 2: claim the candidates (`$3`) that are still
/// pending, still the first open event of their key (`$first`,
/// [`first_of_key!`]) and of whose key nothing runs ([`none_running!`]),
/// on a snapshot taken after the key locks were granted ([`claim_heads`]).
///
/// The rows are found by `seq` alone, through the primary key, and
/// updated where they are found, with the rule as the update's condition;
/// repeating the claim's conditions here invites a walk of the pending
/// index (`docs/perf/postgres.md`). A row that another transaction
/// changes meanwhile (an operator's cancel) is waited for and tested again
/// on its new version.
/// "No earlier open event" is tested again because an event stored with
/// an earlier `seq` may have become visible since step 1 (another
/// instance's insert that committed late): without it, two instances
/// taking concurrent requests for one key ran more of them out of arrival
/// order (5 and 8 inversions among 2,000 events, against 1 and 3).
macro_rules! claim_locked {
    ($first:expr) => {
        claim_rows!(concat!(
            "UPDATE mailroom.queue e SET state = 'running'
             WHERE e.seq = ANY($3) AND ",
            pending_by_seq!(),
            " AND ",
            $first,
            " AND ",
            none_running!(),
            " RETURNING e.seq, e.priority"
        ))
    };
}

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
    pool: &PgPool,
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
    pool: &PgPool,
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
/// of K (e.g. a replayed earlier event and the next one). So a claim of a
/// keyed event is made under a transaction-scoped advisory lock on (topic,
/// key):
///
/// 1. pick the candidate heads and `pg_try_advisory_xact_lock` each key; a
///    key another claim holds is skipped (not waited for). One statement
///    walks the pending events in arrival order, up to a bound; when the
///    bound cut it short of `max` heads, a second one finds the heads of
///    the other keys, one key at a time (`HEADS_BY_KEY`);
/// 2. in a *second* statement — whose READ COMMITTED snapshot is taken after
///    the locks were granted, so it sees every claim of those keys that
///    committed before (a transaction's effects are visible before its locks
///    are released) — claim the candidates still pending, still the first
///    open event of their key, and of whose key nothing runs.
///
/// Only claims make events `running`, and every claim of key K holds K's
/// lock until it commits, so two running events of one key can never
/// coexist, across any number of connections and instances. Completions,
/// replays and rescues only make a key less busy and need no lock. Keyless
/// events are independent and rely on their row locks (`FOR UPDATE SKIP
/// LOCKED`, in the walk and in [`KEYLESS`]) alone. A hash collision between two keys
/// only makes one claim skip a key for a moment.
///
/// `window` bounds the walk ([`SEQUENTIAL_WINDOW`] or [`SPARSE_WINDOW`]);
/// past it, `keyless` also looks for keyless events ([`KEYLESS`]). Also
/// returns whether the topic's heads are sparse ([`sparse_heads`]).
pub(crate) async fn claim_heads(
    pool: &PgPool,
    req: &ClaimRequest,
    on_dead: OnDead,
    window: i64,
    keyless: bool,
) -> Result<(Vec<(Position, Claimed)>, bool)> {
    const CTX: &str = "claiming events";
    let (pick, by_key, take) = match on_dead {
        OnDead::Block => (
            claim_candidates!(first_block!()),
            HEADS_BY_KEY,
            claim_locked!(first_block!()),
        ),
        OnDead::Skip => (
            claim_candidates!(first_skip!()),
            HEADS_BY_KEY_SKIP_DEAD,
            claim_locked!(first_skip!()),
        ),
    };
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    let (mut seqs, mut cut_short, promoted) = walk_candidates(&mut tx, req, pick, window).await?;
    if promoted {
        // The rows it moved to pending are visible to the next statement;
        // its locks stay (released at commit), and its candidates come
        // back in this one's.
        (seqs, cut_short, _) = walk_candidates(&mut tx, req, pick, window).await?;
    }
    let sparse = cut_short && sparse_heads(seqs.len(), req.max, window);
    if cut_short {
        more_candidates(&mut tx, by_key, req, &mut seqs, true).await?;
        if keyless {
            more_candidates(&mut tx, KEYLESS, req, &mut seqs, false).await?;
        }
    }
    if seqs.is_empty() {
        // Commits what step 1 promoted (scheduled rows due).
        tx.commit().await.map_err(db(CTX))?;
        return Ok((Vec::new(), sparse));
    }
    let rows = sqlx::query(take)
        .bind(micros(req.lease))
        .bind(&req.worker)
        .bind(&seqs)
        .fetch_all(&mut *tx)
        .await
        .map_err(db(CTX))?;
    tx.commit().await.map_err(db(CTX))?;
    Ok((claimed_from_rows(&rows)?, sparse))
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

/// Step 1, the bounded walk ([`claim_candidates!`] as `pick`): the
/// candidates' `seq`s, whether the bound cut the walk short of `req.max`
/// heads, and whether it promoted scheduled rows its walk did not see.
async fn walk_candidates(
    tx: &mut Transaction<'_, Postgres>,
    req: &ClaimRequest,
    pick: &'static str,
    window: i64,
) -> Result<(Vec<i64>, bool, bool)> {
    let max = i64::from(req.max);
    let (cut_short, seqs, promoted): (bool, Vec<i64>, bool) = sqlx::query_as(pick)
        .bind(&req.topic)
        .bind(max)
        .bind(KEY_LOCK_CLASS)
        .bind(window)
        .bind(req.expire_after.map(micros))
        .fetch_one(&mut **tx)
        .await
        .map_err(db("claiming events"))?;
    let found = i64::try_from(seqs.len()).unwrap_or(max);
    Ok((seqs, cut_short && found < max, promoted))
}

/// Step 1 past the walk's bound: adds to `seqs` what `sql` ([`HEADS_BY_KEY`]
/// or [`KEYLESS`]) finds, up to `req.max` in all; `locks` binds the key
/// lock class the heads' statements take.
async fn more_candidates(
    tx: &mut Transaction<'_, Postgres>,
    sql: &'static str,
    req: &ClaimRequest,
    seqs: &mut Vec<i64>,
    locks: bool,
) -> Result<()> {
    let max = i64::from(req.max);
    let found = i64::try_from(seqs.len()).unwrap_or(max);
    if found >= max {
        return Ok(());
    }
    let mut query = sqlx::query_scalar(sql)
        .bind(&req.topic)
        .bind(max - found)
        .bind(&*seqs);
    if locks {
        query = query.bind(KEY_LOCK_CLASS);
    }
    query = query.bind(req.expire_after.map(micros));
    let more: Vec<i64> = query
        .fetch_all(&mut **tx)
        .await
        .map_err(db("claiming events"))?;
    seqs.extend(more);
    Ok(())
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
/// (`docs/perf/postgres.md`). Scheduled rows count by their due time.
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
/// came back short because other claims held the keys it reached (another
/// instance's, in flight) asks for the next due time at once, and the
/// answer is "now".
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
    pool: &PgPool,
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
    #![allow(clippy::unwrap_used)]
    use super::*;
    use sqlx::{Connection, PgConnection};

    /// The first open event of key `k1` in a `plans::backlog`.
    async fn head_of_k1(conn: &mut PgConnection) -> i64 {
        sqlx::query_scalar("SELECT min(seq) FROM mailroom.queue WHERE key = 'k1'")
            .fetch_one(conn)
            .await
            .unwrap()
    }

    /// Step 1's walk (`on_dead = block`) for up to 1,000 heads of topic
    /// `t` in `tx`: the candidates' `seq`s.
    async fn walk_in(tx: &mut sqlx::PgTransaction<'_>) -> Vec<i64> {
        let (_, seqs, _): (bool, Vec<i64>, bool) =
            sqlx::query_as(claim_candidates!(first_block!()))
                .bind("t")
                .bind(1000_i64)
                .bind(KEY_LOCK_CLASS)
                .bind(SEQUENTIAL_WINDOW)
                .bind(None::<i64>)
                .fetch_one(&mut **tx)
                .await
                .unwrap();
        seqs
    }

    /// Whether a third session can lock queue row `seq` at once.
    async fn unlocked(url: &str, seq: i64) -> bool {
        let mut conn = PgConnection::connect(url).await.unwrap();
        sqlx::query("SELECT seq FROM mailroom.queue WHERE seq = $1 FOR UPDATE NOWAIT")
            .bind(seq)
            .fetch_optional(&mut conn)
            .await
            .is_ok()
    }

    /// A claim's step 1 (the walk, and the lookup by key past it) passes
    /// over a head whose key another claim holds without locking its row:
    /// a row held until this claim commits would stop the other claim's
    /// step 2, which claims it. (Both statements locked the rows of their
    /// candidates before trying their keys' locks, and two instances
    /// draining one sequential topic waited on each other.)
    #[tokio::test]
    async fn step_one_leaves_the_rows_of_keys_another_claim_holds_unlocked() {
        let (url, mut holder) = super::super::plans::backlog_at(1000).await;
        let head = head_of_k1(&mut holder).await;
        let mut held = holder.begin().await.unwrap();
        sqlx::query("SELECT pg_advisory_xact_lock($1, hashtext('t' || chr(31) || 'k1'))")
            .bind(KEY_LOCK_CLASS)
            .execute(&mut *held)
            .await
            .unwrap();

        let mut claimer = PgConnection::connect(&url).await.unwrap();
        let mut tx = claimer.begin().await.unwrap();
        let seqs = walk_in(&mut tx).await;
        assert!(!seqs.contains(&head) && !seqs.is_empty());
        assert!(unlocked(&url, head).await, "the walk locked k1's head");
        tx.rollback().await.unwrap();

        let mut tx = claimer.begin().await.unwrap();
        let by_key: Vec<i64> = sqlx::query_scalar(HEADS_BY_KEY)
            .bind("t")
            .bind(1000_i64)
            .bind(Vec::<i64>::new())
            .bind(KEY_LOCK_CLASS)
            .bind(None::<i64>)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
        assert_eq!(by_key.len(), 999);
        assert!(!by_key.contains(&head));
        assert!(
            unlocked(&url, head).await,
            "the lookup by key locked k1's head"
        );
        tx.rollback().await.unwrap();
        held.rollback().await.unwrap();
    }

    /// A keyless candidate of the walk (the outbox can store one in a
    /// sequential topic) has no key lock to hold: its row is locked
    /// instead, and the keyed candidates' rows are not.
    #[tokio::test]
    async fn step_one_locks_the_rows_of_keyless_candidates_only() {
        let (url, mut conn) = super::super::plans::backlog_at(1000).await;
        let keyless: i64 = sqlx::query_scalar(
            "WITH k AS (UPDATE mailroom.queue SET key = NULL
                        WHERE seq = (SELECT min(seq) + 5 FROM mailroom.queue) RETURNING seq)
             UPDATE mailroom.events e SET key = NULL FROM k WHERE e.seq = k.seq RETURNING e.seq",
        )
        .fetch_one(&mut conn)
        .await
        .unwrap();
        let keyed = head_of_k1(&mut conn).await;
        let mut tx = conn.begin().await.unwrap();
        let seqs = walk_in(&mut tx).await;
        assert!(seqs.contains(&keyless) && seqs.contains(&keyed));
        assert!(
            !unlocked(&url, keyless).await,
            "the keyless candidate is not locked"
        );
        assert!(unlocked(&url, keyed).await, "a keyed candidate is locked");
        tx.rollback().await.unwrap();
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
