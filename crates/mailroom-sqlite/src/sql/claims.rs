//! Claims: moving due pending events to `running` under a lease, for
//! independent topics (highest priority first, then arrival) and
//! sequential ones (the heads of keys, found by one walk), and the next
//! time a claim could succeed.
//!
//! Scheduling (schema migration 6): an event delivered later is
//! *held* (`held_until`) until a claim of its topic finds it due and
//! releases it ([`release_held`]); held rows sort after the others in
//! `events_pending`, so no claim walks them. Events with a priority other
//! than 0 also have an entry in `events_ranked`; a topic without any is
//! claimed by one walk of `events_pending` in arrival order, as before.

use super::{after, before, col, db, opt_ts, query_events, ts};
use jiff::Timestamp;
use mailroom_core::{ClaimRequest, Claimed, FencingToken, OnDead, Result, StoreError};
use rusqlite::types::ValueRef;
use rusqlite::{Connection, OptionalExtension, Row};
use std::collections::{HashMap, HashSet};

/// "Not expired": `?6` is the expiry cutoff (NULL without `expire_after`).
macro_rules! unexpired {
    () => {
        "(?6 IS NULL OR COALESCE(e.ready_at, e.received_at) > ?6)"
    };
}

/// Independent events of a topic whose claimable events all have priority
/// 0, oldest first. Claims name their index (`INDEXED BY events_pending`),
/// so no claim walks the finished events of its topic, statistics or not
/// (`docs/src/design/sqlite.md`).
const CLAIM_ANY: &str = concat!(
    "UPDATE events
     SET status = 'running', attempts = attempts + 1, lease_until = ?1,
         started_at = ?2, worker = ?3, next_attempt_at = NULL
     WHERE seq IN (
         SELECT e.seq FROM events e INDEXED BY events_pending
         WHERE e.topic = ?4 AND e.status = 'pending' AND e.held_until IS NULL
           AND e.next_attempt_at <= ?2 AND ",
    unexpired!(),
    " ORDER BY e.seq LIMIT ?5)
     RETURNING ",
    event_cols!()
);

/// Chosen events (heads of keys; ranked picks), by `seq` in a JSON array.
const CLAIM_SEQS: &str = concat!(
    "UPDATE events
     SET status = 'running', attempts = attempts + 1, lease_until = ?1,
         started_at = ?2, worker = ?3, next_attempt_at = NULL
     WHERE seq IN (SELECT value FROM json_each(?4)) AND status = 'pending'
     RETURNING ",
    event_cols!()
);

/// The held events of topic `?1` due at `?2`, at most 4,096 per claim,
/// become claimable: one range of `events_pending`.
const RELEASE_HELD: &str = "
    UPDATE events SET held_until = NULL
    WHERE seq IN (SELECT e.seq FROM events e INDEXED BY events_pending
                  WHERE e.topic = ?1 AND e.status = 'pending' AND e.held_until <= ?2
                  ORDER BY e.held_until LIMIT 4096)";

/// Releases the held events of `topic` that are due at `now`.
fn release_held(conn: &Connection, topic: &str, now: i64) -> Result<()> {
    conn.prepare_cached(RELEASE_HELD)
        .map_err(db("releasing events delivered later"))?
        .execute((topic, now))
        .map_err(db("releasing events delivered later"))?;
    Ok(())
}

/// Whether `topic` has claimable pending events with a priority other than 0.
fn has_ranked(conn: &Connection, topic: &str) -> Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM events e INDEXED BY events_ranked
             WHERE e.topic = ?1 AND e.status = 'pending' AND e.priority <> 0
               AND e.held_until IS NULL)",
    )
    .map_err(db("claiming events"))?
    .query_row([topic], |r| r.get(0))
    .map_err(db("claiming events"))
}

/// The claim order of a topic with priorities, as four bounded index walks
/// (`?1` topic, `?2` now, `?3` limit, `?6` expiry cutoff, `?7` the
/// starvation cutoff, now − `max_wait_for_priority`):
const RANKED: [&str; 4] = [
    // 1. The oldest arrivals (the first `?3` in `events_pending`) due since
    //    the starvation cutoff, whatever their priority.
    concat!(
        "SELECT e.seq FROM events e
         WHERE e.seq IN (SELECT w.seq FROM events w INDEXED BY events_pending
                         WHERE w.topic = ?1 AND w.status = 'pending' AND w.held_until IS NULL
                         ORDER BY w.seq LIMIT ?3)
           AND e.next_attempt_at <= ?7 AND ",
        unexpired!(),
        " ORDER BY e.seq"
    ),
    // 2. Priorities above 0, highest first, then arrival.
    concat!(
        "SELECT e.seq FROM events e INDEXED BY events_ranked
         WHERE e.topic = ?1 AND e.status = 'pending' AND e.priority <> 0 AND e.priority > 0
           AND e.held_until IS NULL AND e.next_attempt_at <= ?2 AND ",
        unexpired!(),
        " ORDER BY e.priority DESC, e.seq LIMIT ?3"
    ),
    // 3. Priority 0, in arrival order.
    concat!(
        "SELECT e.seq FROM events e INDEXED BY events_pending
         WHERE e.topic = ?1 AND e.status = 'pending' AND e.held_until IS NULL
           AND e.priority = 0 AND e.next_attempt_at <= ?2 AND ",
        unexpired!(),
        " ORDER BY e.seq LIMIT ?3"
    ),
    // 4. Priorities below 0, highest first.
    concat!(
        "SELECT e.seq FROM events e INDEXED BY events_ranked
         WHERE e.topic = ?1 AND e.status = 'pending' AND e.priority <> 0 AND e.priority < 0
           AND e.held_until IS NULL AND e.next_attempt_at <= ?2 AND ",
        unexpired!(),
        " ORDER BY e.priority DESC, e.seq LIMIT ?3"
    ),
];

/// Up to `max` events of a topic with priorities, in claim order
/// ([`RANKED`]). Without `max_wait_for_priority` the first walk finds
/// nothing (its cutoff is before every due time).
fn ranked_seqs(
    conn: &Connection,
    req: &ClaimRequest,
    now: i64,
    expiry: Option<i64>,
) -> Result<Vec<i64>> {
    const CTX: &str = "claiming events";
    let max = usize::try_from(req.max).unwrap_or(usize::MAX);
    let starved = req
        .max_wait_for_priority
        .map_or(i64::MIN, |w| before(now, w));
    let mut seqs = Vec::new();
    let mut seen = HashSet::new();
    for sql in RANKED {
        if seqs.len() >= max {
            break;
        }
        let mut stmt = conn.prepare_cached(sql).map_err(db(CTX))?;
        // Each statement numbers its parameters as above and binds those up
        // to the highest it uses (`?4`, `?5` are unused).
        let params: [&dyn rusqlite::ToSql; 7] = [
            &req.topic,
            &now,
            &req.max,
            &None::<i64>,
            &None::<i64>,
            &expiry,
            &starved,
        ];
        let used = stmt.parameter_count().min(params.len());
        let found = stmt
            .query_map(&params[..used], |r| r.get::<_, i64>(0))
            .map_err(db(CTX))?;
        for seq in found {
            let seq = seq.map_err(db(CTX))?;
            if seqs.len() < max && seen.insert(seq) {
                seqs.push(seq);
            }
        }
    }
    Ok(seqs)
}

/// The head rule of sequential topics, as one walk over a topic's pending
/// rows in arrival order (the covering index `events_pending`, rows not
/// held). A keyed row is its key's head if it is the first pending row of
/// that key the walk meets and no held event of its key came before it; a
/// head may start if no event of its key is running and, with `on_dead =
/// "block"`, no earlier event of its key is dead. Keyless rows are
/// independent. `visit(seq, next_attempt_at)` sees each head that may start
/// (due or not) and each keyless row, oldest first, and returns whether to
/// go on. The writer thread is the only writer, so the claim that follows
/// sees the same rows. Per-key order wins over priority: heads are visited
/// in arrival order whatever their priority.
fn walk_heads(
    conn: &Connection,
    topic: &str,
    on_dead: OnDead,
    mut visit: impl FnMut(i64, i64) -> Result<bool>,
) -> Result<()> {
    const CTX: &str = "finding the heads of keys";
    let running = running_keys(conn, topic)?;
    let held = HeldKeys::of(conn, topic)?;
    let mut dead_before = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM events
                 WHERE topic = ?1 AND key = ?2 AND key IS NOT NULL
                   AND status = 'dead' AND seq < ?3)",
        )
        .map_err(db(CTX))?;
    let mut seen: HashSet<String> = HashSet::new();
    let mut stmt = conn
        .prepare_cached(
            "SELECT seq, key, next_attempt_at FROM events INDEXED BY events_pending
             WHERE topic = ?1 AND status = 'pending' AND held_until IS NULL ORDER BY seq",
        )
        .map_err(db(CTX))?;
    let mut rows = stmt.query([topic]).map_err(db(CTX))?;
    while let Some(row) = rows.next().map_err(db(CTX))? {
        let seq: i64 = col(row, 0)?;
        let next: i64 = col::<Option<i64>>(row, 2)?.unwrap_or(0);
        if let Some(key) = key_col(row, 1)? {
            // Only the first pending row of a key is its head.
            if !seen.insert(key.to_owned()) || running.contains(key) || held.before(key, seq)? {
                continue;
            }
            if on_dead == OnDead::Block
                && dead_before
                    .query_row((topic, key, seq), |r| r.get::<_, bool>(0))
                    .map_err(db(CTX))?
            {
                continue;
            }
        }
        if !visit(seq, next)? {
            break;
        }
    }
    Ok(())
}

/// The held events of a sequential topic's keys: a held event holds back
/// the later events of its key (one probe of `events_held_keys` per head,
/// only when the topic has held keyed events at all).
struct HeldKeys<'c> {
    conn: &'c Connection,
    topic: &'c str,
    any: bool,
}

impl<'c> HeldKeys<'c> {
    fn of(conn: &'c Connection, topic: &'c str) -> Result<Self> {
        let any = conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM events INDEXED BY events_held_keys
                     WHERE topic = ?1 AND held_until IS NOT NULL AND key IS NOT NULL)",
            )
            .map_err(db("finding the heads of keys"))?
            .query_row([topic], |r| r.get(0))
            .map_err(db("finding the heads of keys"))?;
        Ok(Self { conn, topic, any })
    }

    /// Whether a held event of `key` came before `seq`.
    fn before(&self, key: &str, seq: i64) -> Result<bool> {
        if !self.any {
            return Ok(false);
        }
        self.conn
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM events INDEXED BY events_held_keys
                     WHERE topic = ?1 AND key = ?2 AND seq < ?3
                       AND held_until IS NOT NULL AND key IS NOT NULL)",
            )
            .map_err(db("finding the heads of keys"))?
            .query_row((self.topic, key, seq), |r| r.get(0))
            .map_err(db("finding the heads of keys"))
    }
}

/// The keys of `topic` that have a running event.
fn running_keys(conn: &Connection, topic: &str) -> Result<HashSet<String>> {
    const CTX: &str = "finding the heads of keys";
    let mut stmt = conn
        .prepare_cached(
            "SELECT DISTINCT key FROM events
             WHERE topic = ?1 AND status = 'running' AND key IS NOT NULL",
        )
        .map_err(db(CTX))?;
    let rows = stmt.query_map([topic], |r| r.get(0)).map_err(db(CTX))?;
    rows.collect::<rusqlite::Result<_>>().map_err(db(CTX))
}

/// Column `i` of `row` as a key, borrowed from the row.
fn key_col<'r>(row: &'r Row<'_>, i: usize) -> Result<Option<&'r str>> {
    match row.get_ref(i).map_err(db("finding the heads of keys"))? {
        ValueRef::Null => Ok(None),
        value => value
            .as_str()
            .map(Some)
            .map_err(|e| StoreError::Corrupt(format!("events.key: {e}"))),
    }
}

/// Whether pending event `seq` has expired at `cutoff` (its expiry clock
/// started at or before it).
fn expired(conn: &Connection, seq: i64, cutoff: Option<i64>) -> Result<bool> {
    let Some(cutoff) = cutoff else {
        return Ok(false);
    };
    let started: Option<i64> = conn
        .prepare_cached("SELECT COALESCE(ready_at, received_at) FROM events WHERE seq = ?1")
        .map_err(db("claiming events"))?
        .query_row([seq], |r| r.get(0))
        .optional()
        .map_err(db("claiming events"))?;
    Ok(started.is_some_and(|t| t <= cutoff))
}

/// The expiry cutoff of `req` at `now`: events whose clock started at or
/// before it have expired.
fn expiry_cutoff(req: &ClaimRequest, now: i64) -> Option<i64> {
    req.expire_after.map(|d| before(now, d))
}

/// The due heads of keys (and keyless events) of a sequential topic, at
/// most `req.max`, not expired.
fn head_seqs(conn: &Connection, req: &ClaimRequest, on_dead: OnDead, now: i64) -> Result<Vec<i64>> {
    let max = usize::try_from(req.max).unwrap_or(usize::MAX);
    let cutoff = expiry_cutoff(req, now);
    let mut heads: Vec<i64> = Vec::new();
    walk_heads(conn, &req.topic, on_dead, |seq, next| {
        if next <= now && !expired(conn, seq, cutoff)? {
            heads.push(seq);
        }
        Ok(heads.len() < max)
    })?;
    Ok(heads)
}

/// `seqs` as the JSON array [`CLAIM_SEQS`] reads.
fn json_seqs(seqs: &[i64]) -> String {
    let list: Vec<String> = seqs.iter().map(i64::to_string).collect();
    format!("[{}]", list.join(","))
}

/// Moves up to `req.max` due pending events (for sequential topics, heads
/// of keys) to `running` under a lease ending `req.lease` after `now`, in
/// claim order, and counts them: the held events now due are released
/// first.
pub(crate) fn claim(conn: &Connection, req: &ClaimRequest, now: i64) -> Result<Vec<Claimed>> {
    const CTX: &str = "claiming events";
    let lease_until = after(now, req.lease);
    release_held(conn, &req.topic, now)?;
    let expiry = expiry_cutoff(req, now);
    let chosen = match req.per_key {
        None if !has_ranked(conn, &req.topic)? => None,
        None => Some(ranked_seqs(conn, req, now, expiry)?),
        Some(on_dead) => Some(head_seqs(conn, req, on_dead, now)?),
    };
    let rows = match &chosen {
        None => query_events(
            conn,
            CLAIM_ANY,
            &[
                &lease_until,
                &now,
                &req.worker,
                &req.topic,
                &req.max,
                &expiry,
            ],
            CTX,
        )?,
        Some(seqs) if seqs.is_empty() => return Ok(Vec::new()),
        Some(seqs) => query_events(
            conn,
            CLAIM_SEQS,
            &[&lease_until, &now, &req.worker, &json_seqs(seqs)],
            CTX,
        )?,
    };
    // The trigger leaves pending → running to the claims (migration 8).
    super::count_moved(conn, &req.topic, super::Moved::Claimed, rows.len())?;
    // RETURNING comes in no particular order: hand them out in claim order.
    let order: HashMap<i64, usize> = chosen
        .iter()
        .flatten()
        .enumerate()
        .map(|(i, seq)| (*seq, i))
        .collect();
    let mut rows = rows;
    rows.sort_unstable_by_key(|(seq, _)| (order.get(seq).copied().unwrap_or(0), *seq));
    let until = ts(lease_until)?;
    Ok(rows
        .into_iter()
        .map(|(_, event)| Claimed {
            token: FencingToken(event.attempts),
            lease_until: until,
            event,
        })
        .collect())
}

/// The earliest due time of an event a claim could take: among the rows
/// not held (not expired), and the first held one.
pub(crate) fn next_due(
    conn: &Connection,
    req: &ClaimRequest,
    now: i64,
) -> Result<Option<Timestamp>> {
    const CTX: &str = "finding the next due event";
    let cutoff = expiry_cutoff(req, now);
    let due: Option<i64> = match req.per_key {
        None => conn
            .prepare_cached(
                "SELECT MIN(e.next_attempt_at) FROM events e INDEXED BY events_pending
                 WHERE e.topic = ?1 AND e.status = 'pending' AND e.held_until IS NULL
                   AND (?2 IS NULL OR COALESCE(e.ready_at, e.received_at) > ?2)",
            )
            .map_err(db(CTX))?
            .query_row((&req.topic, cutoff), |r| r.get(0))
            .map_err(db(CTX))?,
        Some(on_dead) => {
            let mut earliest: Option<i64> = None;
            walk_heads(conn, &req.topic, on_dead, |seq, next| {
                if !expired(conn, seq, cutoff)? {
                    earliest = Some(earliest.map_or(next, |e| e.min(next)));
                }
                Ok(true)
            })?;
            earliest
        }
    };
    let held: Option<i64> = conn
        .prepare_cached(
            "SELECT MIN(e.held_until) FROM events e INDEXED BY events_pending
             WHERE e.topic = ?1 AND e.status = 'pending' AND e.held_until IS NOT NULL",
        )
        .map_err(db(CTX))?
        .query_row([&req.topic], |r| r.get(0))
        .map_err(db(CTX))?;
    let earliest = match (due, held) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    opt_ts(earliest)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rusqlite::StatementStatus;
    use std::time::Duration;

    /// A claim binds a new `now` and `LIMIT` every time; with the planner
    /// stability guarantee set by `open_connection`, its cached statement is
    /// compiled once, not once per claim.
    #[test]
    fn claims_are_not_recompiled_per_call() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::connection::open_connection(
            &dir.path().join("t.db"),
            Duration::from_secs(1),
            false,
        )
        .unwrap();
        crate::schema::migrate(&conn, 0).unwrap();
        for (i, max) in [5u32, 7, 100, 1].into_iter().enumerate() {
            let req = ClaimRequest {
                topic: "t".into(),
                worker: "w".into(),
                max,
                lease: Duration::from_secs(30),
                per_key: None,
                max_wait_for_priority: None,
                expire_after: None,
            };
            claim(&conn, &req, 1_000 + i64::try_from(i).unwrap()).unwrap();
        }
        let stmt = conn.prepare_cached(CLAIM_ANY).unwrap();
        assert_eq!(stmt.get_status(StatementStatus::RePrepare), 0);
    }

    /// The claim path's statements walk their indexes in claim order: no
    /// temporary B-tree (a sort of what they found), no scan of the table,
    /// and the held rows' minimum is one probe (`EXPLAIN QUERY PLAN`).
    #[test]
    fn claims_walk_indexes_in_claim_order_without_sorting() {
        let dir = tempfile::tempdir().unwrap();
        let conn = crate::connection::open_connection(
            &dir.path().join("t.db"),
            Duration::from_secs(1),
            false,
        )
        .unwrap();
        crate::schema::migrate(&conn, 0).unwrap();
        let held_min = "SELECT MIN(e.held_until) FROM events e INDEXED BY events_pending
             WHERE e.topic = ?1 AND e.status = 'pending' AND e.held_until IS NOT NULL";
        let mut statements = vec![
            ("claim", CLAIM_ANY.to_owned()),
            ("release", RELEASE_HELD.to_owned()),
            ("held min", held_min.to_owned()),
        ];
        statements.extend(RANKED.iter().map(|s| ("ranked", (*s).to_owned())));
        for (name, sql) in statements {
            let mut stmt = conn.prepare(&format!("EXPLAIN QUERY PLAN {sql}")).unwrap();
            let mut rows = stmt.raw_query();
            let mut plan = Vec::new();
            while let Some(row) = rows.next().unwrap() {
                plan.push(row.get::<_, String>(3).unwrap());
            }
            let plan = plan.join("\n");
            assert!(
                !plan.contains("TEMP B-TREE")
                    && !plan.contains("SCAN events\n")
                    && !plan.ends_with("SCAN events")
                    && (plan.contains("events_pending") || plan.contains("events_ranked")),
                "{name}:\n{sql}\n{plan}"
            );
        }
    }
}
