//! The starvation bound (`max_wait_for_priority`): pending events that
//! waited that long behind higher priorities are raised to the top.

use crate::db::Db;
use crate::sql::{db, micros};
use mailroom_core::{ClaimRequest, Result};

/// The pending rows of topic `$1` below its highest priority that have
/// been due `$2` µs (`max_wait_for_priority`) take the highest priority in
/// the queue (their event keeps the priority it was given), so the next
/// claims take them, oldest first.
///
/// Index-driven like a claim: the priorities present are found one
/// `queue_claim` probe each (a skip scan, at most 100), and in each lower
/// one only its first `$3` rows in claim order are looked at, the oldest
/// arrivals, which are the ones waiting longest.
pub(crate) const RAISE_WAITING: &str = include_str!("sql/raise_waiting.sql");

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
