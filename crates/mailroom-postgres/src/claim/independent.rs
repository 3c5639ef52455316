//! Claims of independent events (topics without `per_key`): one
//! statement, from the topic's floor ([`floor`](super::floor)) or its
//! start.
//!
//! Both statements lock the due pending queue rows they select with `FOR
//! UPDATE SKIP LOCKED`, so concurrent claimers (any number of instances)
//! pass over each other's rows instead of waiting or taking the same
//! event, and claim them and their events in the same statement:
//! the queue rows are moved with `= ANY(ARRAY(selection))`, not
//! `IN (selection)`, so the selection runs once and the rows are fetched
//! through the primary keys, in generic plans too; the events are
//! updated through `events_pkey` (status, attempt count — the new fencing
//! token —, lease, worker), a HOT update (`migrations/0007_queue.sql`).
//! The lease runs from the statement's start (`statement_timestamp()`).
//! `$1` lease (µs), `$2` worker, `$3` topic, `$4` most events, `$5`
//! expiry (µs or NULL). They return the events' columns, then each
//! row's priority.

use super::{Position, claimed_from_rows};
use crate::db::Db;
use crate::sql::{db, micros};
use mailroom_core::{ClaimRequest, Claimed, Result};

/// The whole topic: the due pending rows of topic `$3`, at most `$4`,
/// highest priority first, then in arrival order, not expired (`$5`); and
/// with them the due `scheduled` rows (events delivered later,
/// `queue_scheduled`), at most `$4` by due time, which the claim takes
/// straight to running. The two walks are merged in claim order: a sort of
/// at most `2 × $4` rows.
///
/// The topic is spelled `= ANY(ARRAY[$3])` and the rows ordered by
/// `(topic, -priority, seq)` so that only `queue_claim` yields that order,
/// whatever the statistics say (`docs/src/design/postgres.md`).
pub(crate) const CLAIM_ANY: &str = include_str!("sql/claim_any.sql");

/// From a floor (`floor.rs`), the claims of a topic whose claims keep
/// coming back full: its due pending rows from position (priority `$7`,
/// `seq` `$6`) on in claim order, past the rows earlier claims took, at
/// most `$4`; not expired (`$5`). One row comparison over `queue_claim`'s
/// columns, which starts the index walk there; a condition on `seq` alone
/// let the planner walk the primary key from the floor instead and sort
/// all it found.
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
/// every [`RESCAN`](super::floor::RESCAN) and right after a short claim:
/// so the claims of a busy topic, most of its claims, cost what they
/// cost before delayed delivery (no `queue_scheduled` probe, no sort),
/// and an event that fell due behind that backlog waits at most a second
/// longer, as a retry come due does.
pub(crate) const CLAIM_FROM: &str = include_str!("sql/claim_from.sql");

/// Claims independent events: the whole topic, or from `from` on (a
/// floor). Returns each claimed event with its position, in claim order.
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
