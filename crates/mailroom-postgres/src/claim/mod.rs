//! The claim: how [`PostgresStore`](crate::PostgresStore) moves due events
//! to `running` under a lease, and the SQL it runs, in one place.
//!
//! This file is the orchestration: which path a claim takes, the state a
//! store keeps between claims (floors, sparse heads, the sequential
//! claimers, the last starvation raise) and the limits (`rate`,
//! `max_running`) around a claim. Each path has its file and its
//! statements, plain SQL in `sql/`, one file per statement (a sequential
//! statement and its `on_dead = skip` twin share one, in two parts: see
//! [`statement_around_dead!`]):
//!
//! - [`independent`]: topics without `per_key`, one statement a claim,
//!   from the topic's floor ([`floor`]) or its start;
//! - [`heads`]: sequential topics, heads of keys under the topic's claim
//!   lock, which its [`claimer`] connection holds across claims;
//! - [`raise`]: the starvation bound (`max_wait_for_priority`);
//! - [`due`]: the next time a claim could succeed.
//!
//! Why the statements are spelled as they are is told in
//! `docs/src/design/postgres.md` and `docs/src/design/sequential.md`; the
//! plan tests (`sql/plans.rs`) keep them so.

/// A sequential statement and its `on_dead = skip` twin from one source:
/// `sql/NAME.1.sql`, then `$dead`, then `sql/NAME.2.sql`. The statements
/// differ only where the parts meet: what lets a dead event of a key
/// pass (`" AND p.state <> 'dead'"`) for `on_dead = skip`, a space where
/// a dead event holds its key back.
macro_rules! statement_around_dead {
    ($name:literal, $dead:literal) => {
        concat!(
            include_str!(concat!("sql/", $name, ".1.sql")),
            $dead,
            include_str!(concat!("sql/", $name, ".2.sql")),
        )
    };
}

pub(crate) mod claimer;
pub(crate) mod due;
pub(crate) mod floor;
pub(crate) mod heads;
pub(crate) mod independent;
pub(crate) mod raise;

use crate::db::Db;
use crate::sql::{self, EVENT_COLS, col, db, event_from_row};
use crate::timeouts::{DATA_LIMIT, bounded};
use crate::vacuum::QueueVacuum;
use claimer::{Claimer, release_later};
use floor::{Floors, RESCAN};
use jiff::Timestamp;
use mailroom_core::{
    ClaimLimits, ClaimRequest, Claimed, FencingToken, LimitedClaim, OnDead, Result, StoreError,
};
use sqlx::PgPool;
use sqlx::postgres::PgRow;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

tokio::task_local! {
    /// Set while a claim runs ([`Claims::claim`]): the connections it
    /// takes are handed out without a ping if they were in use a moment
    /// ago (`PostgresStore::connect`).
    pub(crate) static CLAIMING: ();
}

/// Where a claim stands in a topic's claim order: (priority, seq).
pub(crate) type Position = (i32, i64);

/// A store's claims and what it keeps between them.
#[derive(Debug)]
pub(crate) struct Claims {
    /// Statements, through `url` (`db.rs`).
    pool: Db,
    /// Connections for the sequential claimers: to `direct_url` when there
    /// is one, else `pool`'s own.
    session: PgPool,
    /// Where claims of independent events start (`floor.rs`).
    floors: Floors,
    /// VACUUMs the queue after many claims (`vacuum.rs`).
    vacuum: Arc<QueueVacuum>,
    /// Sequential topics whose last claim found heads sparse among the
    /// pending events ([`heads::sparse_heads`]), with when a claim last
    /// looked for keyless events past the bound: their next claim walks
    /// [`heads::SPARSE_WINDOW`] pending events, not
    /// [`heads::SEQUENTIAL_WINDOW`], before looking up heads key by key,
    /// and keyless events once [`RESCAN`] has passed.
    sparse: Mutex<HashMap<String, Instant>>,
    /// One limited claim per topic at a time in this process, so waiting
    /// for the topic's locks (`max_running`'s advisory lock, the rate
    /// budget's row) holds one pool connection, not one per caller (the
    /// holder needs another for its claim).
    limited: Turns,
    /// Each sequential topic's claimer: its connection holding the topic's
    /// claim lock across claims (`claimer.rs`); one claim per topic at a
    /// time in this process, so waiting for the lock holds one connection,
    /// not one per caller (a crowd of pull workers).
    claimers: Turns<Claimer>,
    /// When each topic's claims last raised the events that waited
    /// `max_wait_for_priority` ([`raise::raise_waiting`]).
    raised: Mutex<HashMap<String, Instant>>,
}

impl Claims {
    pub(crate) fn new(pool: Db, session: PgPool, vacuum: Arc<QueueVacuum>) -> Self {
        Self {
            pool,
            session,
            floors: Floors::default(),
            vacuum,
            sparse: Mutex::default(),
            limited: Turns::default(),
            claimers: Turns::default(),
            raised: Mutex::default(),
        }
    }

    /// [`Store::claim`](mailroom_core::Store::claim).
    ///
    /// With `max_wait_for_priority`, events waiting that long behind higher
    /// priorities are raised first, at most every quarter of that bound (and
    /// every `RESCAN`): a low-priority event waits at most the bound plus
    /// that, and a claim of a topic without priorities pays one probe.
    /// Independent topics are claimed from a floor (`floor.rs`): an event
    /// that turns pending behind newer ones waits at most
    /// `RESCAN` longer, the latitude [`Store::claim`](mailroom_core::Store::claim) allows.
    ///
    /// A claim takes connections used a moment ago without the pool's
    /// ping (`connect`); if it fails, it runs again on pinged ones, so a
    /// connection that the server ended since its last use (a restart)
    /// costs a second try, not a failed claim. Trying again is safe: a
    /// claim that failed committed nothing, or, if its commit's answer was
    /// lost, left its events under leases that rescue ends.
    pub(crate) async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Claimed>> {
        if req.max == 0 {
            return Ok(Vec::new());
        }
        let claim = async {
            match CLAIMING.scope((), self.claim_once(req)).await {
                Ok(claimed) => Ok(claimed),
                Err(e) => {
                    tracing::debug!(error = %e, topic = %req.topic, "claim failed; trying again on pinged connections");
                    self.claim_once(req).await
                }
            }
        };
        let claimed = bounded(DATA_LIMIT, "claiming", claim).await?;
        self.vacuum.claimed(claimed.len());
        Ok(claimed)
    }

    /// One claim ([`Claims::claim`]).
    async fn claim_once(&self, req: &ClaimRequest) -> Result<Vec<Claimed>> {
        self.raise_waiting(req).await?;
        let claimed = match req.per_key {
            Some(on_dead) => self.claim_heads(req, on_dead).await?,
            None => self.claim_independent(req).await?,
        };
        Ok(claimed.into_iter().map(|(_, c)| c).collect())
    }

    /// A claim of independent events, from the topic's floor when it has
    /// one, then from its start for the rest if that came back short.
    async fn claim_independent(&self, req: &ClaimRequest) -> Result<Vec<(Position, Claimed)>> {
        let floors = &self.floors;
        let max = usize::try_from(req.max).unwrap_or(usize::MAX);
        let from = floors.start(&req.topic, Instant::now());
        let mut claimed = independent::claim_from(&self.pool, req, from).await?;
        let short = claimed.len() < max;
        if from.is_some() && short {
            let rest = ClaimRequest {
                max: req.max - u32::try_from(claimed.len()).unwrap_or(req.max),
                ..req.clone()
            };
            match independent::claim_from(&self.pool, &rest, None).await {
                Ok(older) => {
                    claimed.extend(older);
                    claimed.sort_unstable_by_key(|&((p, seq), _)| claim_order(p, seq));
                }
                // What the first walk took is committed and leased: hand it
                // out rather than leave it to lease rescue.
                Err(e) if !claimed.is_empty() => {
                    tracing::warn!(error = %e, topic = %req.topic, "claiming older events failed");
                }
                Err(e) => return Err(e),
            }
        }
        floors.record(
            &req.topic,
            from.is_none() || short,
            max,
            claimed.iter().map(|(at, _)| *at),
            Instant::now(),
        );
        Ok(claimed)
    }

    /// A claim of a sequential topic's heads, its walk bounded by what the
    /// topic's last claim found (see `sparse`).
    async fn claim_heads(
        &self,
        req: &ClaimRequest,
        on_dead: OnDead,
    ) -> Result<Vec<(Position, Claimed)>> {
        // First, so the walk's bound below is what the last claim found.
        let claimer = self
            .claimers
            .of_with(&req.topic, || Claimer::new(&req.topic));
        let mut turn = claimer.lock().await;
        let sparse = || self.sparse.lock().unwrap_or_else(PoisonError::into_inner);
        let started = Instant::now();
        let last_keyless = sparse().get(&req.topic).copied();
        let window = window_for(last_keyless.is_some());
        let keyless = last_keyless.is_none_or(|at| started.saturating_duration_since(at) >= RESCAN);
        let conn = turn.locked(&self.session).await?;
        let heads = match heads::claim_heads(conn, req, on_dead, window, keyless).await {
            Ok(heads) => heads,
            Err(e) => {
                turn.failed();
                return Err(e);
            }
        };
        match heads.failed {
            Some(e) => {
                turn.failed();
                if heads.claimed.is_empty() {
                    return Err(e);
                }
                tracing::warn!(error = %e, topic = %req.topic, "claiming more heads failed; handing out those claimed");
            }
            None => {
                if let Some(claims) = turn.claimed(heads.contended).await {
                    release_later(Arc::clone(&claimer), claims);
                }
            }
        }
        drop(turn);
        if heads.sparse {
            let at = match last_keyless {
                Some(at) if !keyless => at,
                _ => started,
            };
            sparse().insert(req.topic.clone(), at);
        } else {
            sparse().remove(&req.topic);
        }
        Ok(heads.claimed)
    }

    /// How far the next sequential claim of `topic` walks (see `sparse`).
    fn walk_window(&self, topic: &str) -> i64 {
        let sparse = self.sparse.lock().unwrap_or_else(PoisonError::into_inner);
        window_for(sparse.contains_key(topic))
    }

    /// Raises the events of `req`'s topic that waited its
    /// `max_wait_for_priority` ([`raise::raise_waiting`]), if the last
    /// time was long enough ago; after a raise the topic's next claim walks
    /// from its start (the raised events are older than its floor).
    async fn raise_waiting(&self, req: &ClaimRequest) -> Result<()> {
        let Some(max_wait) = req.max_wait_for_priority else {
            return Ok(());
        };
        let every = (max_wait / 4).clamp(Duration::from_millis(50), RESCAN);
        let now = Instant::now();
        {
            let mut raised = self.raised.lock().unwrap_or_else(|e| e.into_inner());
            match raised.get(&req.topic) {
                Some(at) if now.saturating_duration_since(*at) < every => return Ok(()),
                _ => raised.insert(req.topic.clone(), now),
            };
        }
        if raise::raise_waiting(&self.pool, req, max_wait).await? > 0 {
            self.floors.forget(&req.topic);
        }
        Ok(())
    }

    /// [`Store::claim_limited`](mailroom_core::Store::claim_limited): one
    /// claim within limits.
    ///
    /// One transaction per claim, which ends only after the claim
    /// committed: under `max_running`, the topic's advisory lock, then the
    /// count of its running events, so the next instance counts this
    /// claim; with a `rate`, the budget's row, locked from the take until
    /// the claim's stamp has settled the tokens
    /// (`sql::settle_tokens`), so grants and claims alternate across
    /// instances. The claim itself runs on its own connection(s). Dropped
    /// midway, the transaction rolls back and the locks go with it (and the
    /// tokens return to the budget).
    pub(crate) async fn claim_within(
        &self,
        req: &ClaimRequest,
        limits: ClaimLimits,
    ) -> Result<LimitedClaim> {
        const CTX: &str = "claiming within limits";
        let want = limits.rate.map_or(req.max, |r| req.max.min(r.grant()));
        let turn = self.limited.of(&req.topic);
        let _turn = turn.lock().await;
        let mut tx = self.pool.begin().await.map_err(db(CTX))?;
        let room = match limits.max_running {
            Some(max) => {
                max.saturating_sub(sql::lock_and_count_running(&mut tx, &req.topic).await?)
            }
            None => want,
        };
        let capped = room < want;
        if room == 0 || want == 0 {
            tx.commit().await.map_err(db(CTX))?;
            let claimed = Vec::new();
            return Ok(LimitedClaim::Claimed {
                claimed,
                asked: want,
                capped,
            });
        }
        let asked = match limits.rate {
            Some(rate) => {
                let grant = sql::take_tokens(&mut tx, &req.topic, rate, want.min(room)).await?;
                if grant.granted == 0 {
                    tx.commit().await.map_err(db(CTX))?;
                    return Ok(LimitedClaim::Wait(grant.wait));
                }
                grant.granted
            }
            None => want.min(room),
        };
        let claimed = self
            .claim(&ClaimRequest {
                max: asked,
                ..req.clone()
            })
            .await?;
        if let Some(rate) = limits.rate {
            let used = u32::try_from(claimed.len()).unwrap_or(asked);
            let at = claimed.iter().map(|c| c.lease_until).min().map(|until| {
                Timestamp::from_microsecond(until.as_microsecond() - sql::micros(req.lease))
                    .unwrap_or(until)
            });
            // The claim is committed: a failure here leaves its events
            // claimed, and the budget as it was before the take.
            if let Err(e) = sql::settle_tokens(&mut tx, &req.topic, rate, asked, used, at).await {
                tracing::warn!(error = %e, topic = %req.topic, "spending rate tokens failed");
            }
        }
        if let Err(e) = tx.commit().await {
            tracing::warn!(error = %e, topic = %req.topic, "ending a limited claim's transaction failed");
        }
        Ok(LimitedClaim::Claimed {
            claimed,
            asked,
            capped,
        })
    }

    /// [`Store::next_due`](mailroom_core::Store::next_due): the earliest
    /// due time of an event a claim could take, within the reach of the
    /// topic's next walk when it is sequential.
    pub(crate) async fn next_due(&self, req: &ClaimRequest) -> Result<Option<Timestamp>> {
        due::next_due(&self.pool, req, self.walk_window(&req.topic)).await
    }
}

/// One turn per topic at a time within this process: a caller waits
/// here, holding no pool connection, rather than at a database lock.
/// A turn may carry state of its own (`T`), kept from one turn to the next
/// (a sequential topic's claimer, `claimer.rs`).
#[derive(Debug)]
pub(crate) struct Turns<T = ()>(Mutex<HashMap<String, Arc<tokio::sync::Mutex<T>>>>);

impl<T> Default for Turns<T> {
    fn default() -> Self {
        Self(Mutex::default())
    }
}

impl<T> Turns<T> {
    /// `topic`'s turn (lock it to take it), its state made by `new` the
    /// first time.
    pub(crate) fn of_with(
        &self,
        topic: &str,
        new: impl FnOnce() -> T,
    ) -> Arc<tokio::sync::Mutex<T>> {
        let mut turns = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        turns
            .entry(topic.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Mutex::new(new())))
            .clone()
    }
}

impl Turns {
    /// `topic`'s turn (lock it to take it).
    fn of(&self, topic: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.of_with(topic, || ())
    }
}

/// The bound of a sequential claim's walk, shorter once heads are sparse.
fn window_for(sparse: bool) -> i64 {
    if sparse {
        heads::SPARSE_WINDOW
    } else {
        heads::SEQUENTIAL_WINDOW
    }
}

/// The sort key of claim order: highest priority first, then arrival.
pub(crate) fn claim_order(priority: i32, seq: i64) -> (std::cmp::Reverse<i32>, i64) {
    (std::cmp::Reverse(priority), seq)
}

/// Claimed rows (the events' columns, then the queue row's priority), in
/// claim order.
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

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{PostgresOptions, PostgresStore};
    use mailroom_core::Store;
    use sqlx::Connection;

    /// Every claim statement returns the events' columns as the shared
    /// event row lists them, which the claims decode by position.
    #[test]
    fn every_claim_statement_selects_the_shared_event_columns() {
        for statement in [
            independent::CLAIM_ANY,
            independent::CLAIM_FROM,
            heads::WALK,
            heads::WALK_SKIP_DEAD,
            heads::HEADS_BY_KEY,
            heads::HEADS_BY_KEY_SKIP_DEAD,
            heads::KEYLESS,
        ] {
            let select = format!("SELECT {}, p.priority FROM claimed e", sql::EVENT_SELECT);
            assert!(statement.contains(&select), "{statement}");
        }
    }

    fn heads_of(topic: &str, max: u32) -> ClaimRequest {
        ClaimRequest {
            topic: topic.into(),
            worker: "w".into(),
            max,
            lease: Duration::from_secs(30),
            per_key: Some(OnDead::Block),
            max_wait_for_priority: None,
            expire_after: None,
        }
    }

    /// 200 keys of 10 events each, stored round-robin: a claim of 256
    /// heads finds all 200 in a walk cut short, so heads are sparse. Once
    /// those are done, every pending event of the walk's first 64 is a
    /// head: the next claim, walking 64, is cut short of 256 too, but at
    /// that rate a walk of the whole bound would fill it, so the topic's
    /// claims walk the whole bound again.
    #[tokio::test]
    async fn a_topic_whose_heads_are_dense_again_walks_the_whole_bound() {
        let url = mailroom_testkit::fresh_postgres_db().await;
        let store = PostgresStore::connect(PostgresOptions::from_url(&url).unwrap())
            .await
            .unwrap();
        store.migrate().await.unwrap();
        let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
        sqlx::raw_sql(
            "WITH inserted AS (
                 INSERT INTO mailroom.events
                     (id, source, topic, dedup_key, key, status, max_attempts, next_attempt_at)
                 SELECT mailroom.uuid_v7(), 's', 't', g::text, 'k' || (g % 200), 'pending', 10, now()
                 FROM generate_series(0, 1999) g ORDER BY g
                 RETURNING seq, topic, key, next_attempt_at
             )
             INSERT INTO mailroom.queue (seq, topic, key, run_at, ready_at, state)
             SELECT seq, topic, key, next_attempt_at, next_attempt_at, 'pending' FROM inserted",
        )
        .execute(&mut conn)
        .await
        .unwrap();

        let first = store.claim(&heads_of("t", 256)).await.unwrap();
        assert_eq!(first.len(), 200);
        assert_eq!(store.claims().walk_window("t"), heads::SPARSE_WINDOW);

        sqlx::raw_sql(
            "DELETE FROM mailroom.queue WHERE state = 'running';
             UPDATE mailroom.events SET status = 'done' WHERE status = 'running';",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        let second = store.claim(&heads_of("t", 256)).await.unwrap();
        assert_eq!(second.len(), 200);
        assert_eq!(store.claims().walk_window("t"), heads::SEQUENTIAL_WINDOW);
    }
}
