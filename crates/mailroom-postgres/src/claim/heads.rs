//! Claims of sequential topics: the heads of keys, under the topic's
//! claim lock.
//!
//! The head rule ("no earlier open event of the key, none running") reads
//! *other* rows, which row locks alone cannot protect: two transactions
//! could each see "nothing of key K is running" on their own snapshots and
//! claim two different events of K (e.g. a replayed earlier event and the
//! next one). So the claims of a sequential topic take turns: the
//! connection holds the topic's claim lock for its session
//! ([`claimer`](super::claimer), a session-level advisory lock, waited
//! for), taken before [`claim_heads`], and each statement here commits on
//! its own. Their READ COMMITTED snapshots are taken after the lock was
//! granted, so they see every claim of the topic that committed before
//! (the previous holder's committed before it let go), and no other claim
//! of the topic commits until the lock is let go.
//!
//! A head test is two probes of the queue row `e`: no earlier open event
//! of its key that is not running (pending, scheduled, or dead under
//! `on_dead = block`), one probe of `queue_keys`, which holds no running
//! row (migration 14); and no event of its key running, one probe of
//! `queue_running`. The rows that pass are claimed in the same statement,
//! if they are still pending, spelled `COALESCE(e.state, '') =
//! 'pending'` so that it does not match `queue_claim`'s predicate: with
//! that, the planner could fetch the rows by `seq` through `queue_claim`,
//! walking the topic's whole index once per row (630 ms for 1,024 rows of
//! a 15,000-event backlog) instead of one probe of the primary key each.
//! The claims' statements return the events' columns, then each row's
//! priority; the lease (from `statement_timestamp()`: a claim that waited
//! for the lock keeps its whole lease) and the worker are their last two
//! parameters.

use super::{Position, claim_order, claimed_from_rows};
use crate::sql::{EVENT_COLS, col, db, micros};
use mailroom_core::{ClaimRequest, OnDead, Result, StoreError};
use sqlx::PgConnection;
use sqlx::postgres::PgRow;

/// Sequential topics: moves the `scheduled` queue rows of topic `$1`
/// that fell due to `pending` (at most 1,000 per claim; `queue_scheduled`).
/// Scheduled rows are not in `queue_claim`, so a backlog of events
/// delivered later costs claims nothing. (Claims of independent events
/// take due scheduled rows directly.) A claim runs it in its first
/// statement ([`WALK`]), whose walk does not see the rows it moves; a
/// claim that moved any runs that statement again, which does.
pub(crate) const PROMOTE: &str = include_str!("sql/promote.sql");

/// Claims the heads of keys among the first `$3` pending rows of topic
/// `$1` in claim order, at most `$2`, under the topic's claim lock. `$4`
/// expiry (µs or NULL), `$5` lease (µs), `$6` worker.
///
/// It first moves the scheduled rows that fell due to pending
/// ([`PROMOTE`], in the same statement: one round trip less per claim
/// than a statement of its own). The walk reads the topic's first `$3`
/// pending rows at most, in claim order: with a few keys and deep
/// backlogs almost every pending event waits behind its key's head, and
/// an unbounded walk would test them all on every claim. Its rows are
/// tested as they come: due, not expired, the head rule, until `$2`
/// pass. The walk is a subquery under the `LIMIT`, so a claim of 256
/// heads reads and tests about as many rows, not the whole walk; no
/// `ORDER BY`: the walk is in claim order already, and a sort or a hash
/// join would test every row of the walk before the first comes out
/// (`docs/src/design/sequential.md`).
///
/// Returns the claimed events (a single row of NULLs when none), each row
/// followed by whether the bound cut the walk short of `$2` heads (more
/// pending events lie past it: [`HEADS_BY_KEY`] then looks for the heads
/// of the keys the walk did not reach; counted by a second walk, only when
/// the claim is short), whether it moved scheduled rows that fell due to
/// pending, and whether another session waits for the topic's claim lock
/// (`pg_locks`: the lock's two keys are `classid` and `objid`, `objsubid`
/// 2 for the two-key form; the class spelled as
/// [`CLAIM_LOCK_CLASS`](super::claimer::CLAIM_LOCK_CLASS)): the claimer
/// then lets go of it at once instead of holding it for its next claim. A
/// waiter's statement holds a snapshot while it waits, which keeps VACUUM
/// and pruning from the rows every claim and completion leaves behind
/// meanwhile: holding the lock for 100 ms against a waiting instance cost
/// two instances 1.46× the database CPU per event.
pub(crate) const WALK: &str = statement_around_dead!("walk", " ");
/// [`WALK`] for `on_dead = skip`: a dead event of a key does not hold
/// back the events after it.
pub(crate) const WALK_SKIP_DEAD: &str = statement_around_dead!("walk", " AND p.state <> 'dead'");

/// Past the walk's bound: claims the heads of keys that are due and not
/// expired (`$3`), in arrival order, at most `$2`. `$1` topic, `$4` lease,
/// `$5` worker. The heads the walk claimed before it in the same
/// transaction run now, so their keys have no head here.
///
/// The keys of the topic that have open events other than running ones
/// are found in key order, one index probe each (a "skip scan" of
/// `queue_keys`, at most 10,000 keys, so a topic with very many keys
/// costs a bounded walk: keys past it are reached once earlier ones have
/// no open events), and each key's head: its first such event (pending,
/// scheduled or dead), kept if it is pending and nothing of its key runs.
/// Spelled (`= ANY` for the topic, a range `>= key AND <= key` for the
/// key) so that only `queue_keys (topic, key, seq)` yields the orders
/// asked for, whatever the statistics say (`docs/src/design/sequential.md`).
pub(crate) const HEADS_BY_KEY: &str = statement_around_dead!("heads_by_key", " ");
/// [`HEADS_BY_KEY`] for `on_dead = skip`: dead events are no key's head.
pub(crate) const HEADS_BY_KEY_SKIP_DEAD: &str =
    statement_around_dead!("heads_by_key", " AND f.state <> 'dead'");

/// Past the walk's bound: claims due keyless events (independent; only the
/// outbox can store them in a sequential topic), at most `$2`, not expired
/// (`$3`), under the topic's claim lock. `$1` topic, `$4` lease, `$5`
/// worker. It walks every pending event of the topic, so a claim runs it
/// at most once per [`RESCAN`](super::floor::RESCAN) while the topic's
/// heads are sparse: without it, a keyless event behind a blocked key's
/// deep backlog would never come within the walk's bound.
pub(crate) const KEYLESS: &str = include_str!("sql/keyless.sql");

/// Pending events a sequential claim's walk tests at most (its bound).
pub(crate) const SEQUENTIAL_WINDOW: i64 = 1024;
/// The bound right after a walk that it cut short: the topic's heads are
/// sparse among its pending events (few keys, deep backlogs), so most of
/// them come from [`HEADS_BY_KEY`] and a long walk would mostly test
/// events waiting behind their key's head.
pub(crate) const SPARSE_WINDOW: i64 = 64;

/// Claims heads of keys on `conn`, which holds the topic's claim lock.
///
/// Only claims make events `running`, and every claim of a sequential
/// topic runs under its lock, so two running events of one key can never
/// coexist, across any number of connections and instances.
/// Completions, replays and rescues only make a key less busy and need no
/// lock. Keyless events are independent; the lock covers them too.
///
/// The claim is one statement ([`WALK`]): a walk of the pending events in
/// claim order, bounded by `window` ([`SEQUENTIAL_WINDOW`] or
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
        OnDead::Block => (WALK, HEADS_BY_KEY),
        OnDead::Skip => (WALK_SKIP_DEAD, HEADS_BY_KEY_SKIP_DEAD),
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
    pub(crate) claimed: Vec<(Position, mailroom_core::Claimed)>,
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

/// What one run of [`WALK`] did.
struct Walked {
    claimed: Vec<(Position, mailroom_core::Claimed)>,
    /// The bound cut the walk short of the heads asked for.
    cut_short: bool,
    /// It moved scheduled rows that fell due to pending, which its walk
    /// did not see.
    promoted: bool,
    /// Another session waits for the topic's claim lock.
    contended: bool,
}

/// Runs `sql` ([`WALK`] or [`WALK_SKIP_DEAD`]) for up to `max` heads
/// within `window`.
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
    claimed: &mut Vec<(Position, mailroom_core::Claimed)>,
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

#[cfg(test)]
mod tests {
    /// The walks' contention test names the claim lock's class, so the
    /// claimer learns of the sessions waiting for that lock and no other.
    #[test]
    fn the_contention_test_names_the_claim_lock() {
        let oid = format!("{}::oid", super::super::claimer::CLAIM_LOCK_CLASS);
        for walk in [super::WALK, super::WALK_SKIP_DEAD] {
            assert!(walk.contains(&oid));
        }
    }

    /// Heads are sparse when a walk of the whole bound at the rate found
    /// would not fill the claim.
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
