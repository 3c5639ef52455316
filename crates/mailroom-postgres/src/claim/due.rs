//! The next time a claim could succeed ([`Store::next_due`](mailroom_core::Store::next_due)).

use crate::db::Db;
use crate::sql::{db, micros, opt_ts};
use jiff::Timestamp;
use mailroom_core::{ClaimRequest, OnDead, Result};

/// Independent events: the earliest due time of a pending row of topic
/// `$1` that has not expired (`$2`), or of a scheduled one
/// (`queue_scheduled`).
pub(crate) const NEXT_DUE: &str = include_str!("sql/next_due.sql");

/// Sequential topics: the earliest due time among the keys' heads (found
/// as [`HEADS_BY_KEY`](super::heads::HEADS_BY_KEY) finds them) and the
/// keyless pending events among the first `$2` pending ones, the part of
/// the topic the next claim's walk reaches (`$2` is that walk's bound),
/// so it never walks the whole backlog; neither expired (`$3`). A keyless
/// event past the bound cannot be claimed until the walk reaches it, so
/// it does not count here either (`docs/src/design/sequential.md`).
/// Scheduled rows count by their due time.
pub(crate) const NEXT_DUE_BY_KEY: &str = statement_around_dead!("next_due_by_key", " ");
/// [`NEXT_DUE_BY_KEY`] for `on_dead = skip`: a dead event is no key's head.
pub(crate) const NEXT_DUE_BY_KEY_SKIP_DEAD: &str =
    statement_around_dead!("next_due_by_key", " AND f.state <> 'dead'");

/// Sequential topics: the database's time if a head that is due lies
/// among the first `$2` pending events of topic `$1` in claim order (the
/// next walk's reach; the first open event of its key, nothing of its key
/// running, not expired (`$3`)), NULL otherwise. It stops at the first
/// such head, where [`NEXT_DUE_BY_KEY`] looks up every key: a claim that
/// came back short asks for the next due time at once, and when keys it
/// found running have finished since, the answer is "now".
pub(crate) const DUE_HEAD_IN_WALK: &str = statement_around_dead!("due_head_in_walk", " ");
/// [`DUE_HEAD_IN_WALK`] for `on_dead = skip`.
pub(crate) const DUE_HEAD_IN_WALK_SKIP_DEAD: &str =
    statement_around_dead!("due_head_in_walk", " AND p.state <> 'dead'");

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
        Some(OnDead::Block) => NEXT_DUE_BY_KEY,
        Some(OnDead::Skip) => NEXT_DUE_BY_KEY_SKIP_DEAD,
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
