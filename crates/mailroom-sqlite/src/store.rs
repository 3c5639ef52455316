//! [`SqliteStore`]: the [`Store`] trait over one SQLite file.

use crate::connection::open_connection;
use crate::options::SqliteOptions;
use crate::reader::ReadPool;
use crate::sql::{self, db, now_ms};
use crate::writer::{WhenFull, Writer};
use jiff::Timestamp;
use mailroom_core::{
    AttemptWindow, ClaimLimits, ClaimRequest, Claimed, Completion, Event, EventId, EventSearch,
    FencingToken, Inserted, LimitedClaim, ListFilter, Migrated, NewEvent, Page, PurgeReport,
    ReplayReport, Result, Retention, SchemaVersion, Store, StoreError, Throughput, TopicStats,
};
use rusqlite::Connection;
use std::sync::Arc;
use std::time::Duration;

/// The embedded store: one SQLite file in WAL mode with `synchronous=FULL`,
/// one writer thread that groups concurrent writes into shared commits, and
/// a small pool of read connections.
///
/// Cheap to clone; the writer thread stops (after finishing queued writes)
/// when the last clone is dropped, and that drop waits for it to close the
/// file (at most one group transaction). Call [`Store::migrate`] once before use.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    writer: Writer,
    reads: Arc<ReadPool>,
    throttle: crate::throttle::Throttle,
}

impl SqliteStore {
    /// Opens (creating if needed) the database file and starts the writer
    /// thread. Does not migrate: call [`Store::migrate`].
    pub fn open(opts: SqliteOptions) -> Result<SqliteStore> {
        opts.validate()?;
        let conn = open_connection(&opts.path, opts.busy_timeout, false)?;
        let writer = Writer::start(conn, &opts)?;
        let reads = Arc::new(ReadPool::new(
            opts.path.clone(),
            opts.busy_timeout,
            opts.readers,
        ));
        Ok(SqliteStore {
            inner: Arc::new(Inner {
                writer,
                reads,
                throttle: crate::throttle::Throttle::default(),
            }),
        })
    }

    /// Write transactions committed by this handle's writer thread so far;
    /// with group commit, far fewer than the writes it carried.
    pub fn commits(&self) -> u64 {
        self.inner.writer.commits()
    }

    async fn write<F, T>(&self, when_full: WhenFull, work: F) -> Result<T>
    where
        F: FnOnce(&Connection, i64) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        // The clock is read on the writer thread, when the write runs.
        self.inner
            .writer
            .call(when_full, move |conn| work(conn, now_ms()))
            .await
    }

    async fn read<F, T>(&self, work: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        self.inner.reads.run(work).await
    }
}

#[async_trait::async_trait]
impl Store for SqliteStore {
    async fn migrate(&self) -> Result<Migrated> {
        self.write(WhenFull::Wait, crate::schema::migrate).await
    }

    async fn schema(&self) -> Result<SchemaVersion> {
        self.read(crate::schema::version).await
    }

    async fn insert(&self, event: NewEvent) -> Result<Inserted> {
        self.write(WhenFull::Shed, move |c, now| sql::insert(c, &event, now))
            .await
    }

    async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Claimed>> {
        if req.max == 0 {
            return Ok(Vec::new());
        }
        let req = req.clone();
        self.write(WhenFull::Wait, move |c, now| sql::claim(c, &req, now))
            .await
    }

    async fn complete(
        &self,
        id: EventId,
        token: FencingToken,
        completion: Completion,
    ) -> Result<()> {
        self.write(WhenFull::Shed, move |c, now| {
            sql::complete(c, id, token, &completion, now)
        })
        .await
    }

    /// One writer job for the whole set, applied set-based
    /// (`sql::complete_many`): no per-event queue message, savepoint or
    /// statement. A stale or unknown item fails alone (it writes nothing); any
    /// other error fails the job, whose savepoint then undoes all of it.
    async fn complete_many(
        &self,
        items: Vec<(EventId, FencingToken, Completion)>,
    ) -> Vec<Result<()>> {
        let n = items.len();
        let outcome = self
            .write(WhenFull::Shed, move |c, now| {
                sql::complete_many(c, &items, now)
            })
            .await;
        outcome.unwrap_or_else(|e| failed_all(n, e))
    }

    async fn extend(&self, id: EventId, token: FencingToken, lease: Duration) -> Result<Timestamp> {
        self.write(WhenFull::Wait, move |c, now| {
            sql::extend(c, id, token, lease, now)
        })
        .await
    }

    async fn rescue_expired(&self) -> Result<u64> {
        self.write(WhenFull::Wait, sql::rescue_expired).await
    }

    async fn fold_counters(&self) -> Result<()> {
        self.write(WhenFull::Wait, sql::prune_traffic).await
    }

    /// Counts, takes tokens and claims in one writer transaction: SQLite's
    /// write lock makes the count and claim atomic even for several
    /// processes on the file, and the writer thread orders this process's
    /// takes and claims alike (the rate budget is per process).
    async fn claim_limited(&self, req: &ClaimRequest, limits: ClaimLimits) -> Result<LimitedClaim> {
        let (req, inner) = (req.clone(), self.inner.clone());
        self.write(WhenFull::Wait, move |c, now| {
            claim_within(c, &inner.throttle, req, limits, now)
        })
        .await
    }

    fn shares_commits(&self) -> bool {
        true
    }

    /// One writer job, so one commit: the outcomes applied set-based (as
    /// `complete_many`), then the claim in a savepoint of its own, so a
    /// failed claim leaves the outcomes recorded. It waits for room in the
    /// writer's queue as a claim does.
    async fn complete_and_claim(
        &self,
        done: Vec<(EventId, FencingToken, Completion)>,
        req: &ClaimRequest,
        limits: Option<ClaimLimits>,
    ) -> (Vec<Result<()>>, Result<LimitedClaim>) {
        let n = done.len();
        let (req, inner) = (req.clone(), self.inner.clone());
        let outcome = self
            .write(WhenFull::Wait, move |c, now| {
                let recorded = if done.is_empty() {
                    Vec::new()
                } else {
                    sql::complete_many(c, &done, now)?
                };
                let claimed = in_savepoint(c, || match limits {
                    Some(limits) => claim_within(c, &inner.throttle, req, limits, now),
                    None => claim_plain(c, &req, now),
                });
                Ok((recorded, claimed))
            })
            .await;
        outcome.unwrap_or_else(|e| {
            let text = e.to_string();
            (failed_all(n, e), Err(StoreError::Unavailable(text)))
        })
    }

    async fn expire(&self, topic: &str, expire_after: Duration, limit: u32) -> Result<u64> {
        let topic = topic.to_owned();
        self.write(WhenFull::Wait, move |c, now| {
            sql::expire(c, &topic, expire_after, limit, now)
        })
        .await
    }

    async fn pause_topic(&self, topic: &str, pause: Duration) -> Result<Timestamp> {
        Ok(self.inner.throttle.pause(topic, pause))
    }

    async fn paused_for(&self, topic: &str) -> Result<Option<Duration>> {
        Ok(self.inner.throttle.paused_for(topic))
    }

    async fn next_due(&self, req: &ClaimRequest) -> Result<Option<Timestamp>> {
        let req = req.clone();
        self.read(move |c| sql::next_due(c, &req, now_ms())).await
    }

    async fn get(&self, id: EventId) -> Result<Option<Event>> {
        self.read(move |c| sql::get(c, id)).await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Page> {
        let filter = filter.clone();
        self.read(move |c| sql::list(c, &filter)).await
    }

    async fn replay(&self, id: EventId, budget: u32) -> Result<Event> {
        self.write(WhenFull::Wait, move |c, now| {
            sql::replay(c, id, budget, now)
        })
        .await
    }

    async fn replay_matching(&self, filter: &ListFilter, budget: u32) -> Result<ReplayReport> {
        let filter = filter.clone();
        self.write(WhenFull::Wait, move |c, now| {
            sql::replay_matching(c, &filter, budget, now)
        })
        .await
    }

    async fn skip(&self, id: EventId) -> Result<Event> {
        self.write(WhenFull::Wait, move |c, _| sql::skip(c, id))
            .await
    }

    async fn cancel(&self, id: EventId) -> Result<Event> {
        self.write(WhenFull::Wait, move |c, _| sql::cancel(c, id))
            .await
    }

    async fn cancel_matching(&self, filter: &ListFilter) -> Result<u64> {
        let filter = filter.clone();
        self.write(WhenFull::Wait, move |c, _| sql::cancel_matching(c, &filter))
            .await
    }

    async fn stats(&self) -> Result<Vec<TopicStats>> {
        self.read(sql::stats).await
    }

    async fn attempt_window(&self, window: Duration) -> Result<Vec<AttemptWindow>> {
        self.read(move |c| sql::attempt_window(c, window)).await
    }

    async fn search(&self, search: &EventSearch) -> Result<Page> {
        let search = search.clone();
        self.read(move |c| sql::search(c, &search)).await
    }

    async fn count(&self, search: &EventSearch) -> Result<u64> {
        let search = search.clone();
        self.read(move |c| sql::count(c, &search)).await
    }

    async fn throughput(&self, window: Duration) -> Result<Vec<Throughput>> {
        self.read(move |c| sql::throughput(c, window)).await
    }

    async fn purge(&self, retention: Retention) -> Result<PurgeReport> {
        // Bounded steps, each its own write, so intake keeps flowing meanwhile.
        let now = now_ms();
        let mut total = PurgeReport::default();
        let mut from = 0;
        loop {
            let (step, next) = self
                .write(WhenFull::Wait, move |c, _| {
                    sql::purge_step(c, &retention, now, from)
                })
                .await?;
            total.payloads_dropped += step.payloads_dropped;
            total.rows_deleted += step.rows_deleted;
            match next {
                Some(next) => from = next,
                None => return Ok(total),
            }
        }
    }

    async fn now(&self) -> Result<Timestamp> {
        Ok(Timestamp::now())
    }
}

/// `topic`'s running events, in the writer's transaction.
fn count_running(c: &Connection, topic: &str) -> Result<u32> {
    let running: i64 = c
        .prepare_cached(
            "SELECT count(*) FROM events INDEXED BY events_running
             WHERE topic = ?1 AND status = 'running'",
        )
        .and_then(|mut st| st.query_row([topic], |r| r.get(0)))
        .map_err(db("counting running events"))?;
    Ok(u32::try_from(running).unwrap_or(u32::MAX))
}

/// The results of `n` writes that failed together: `e` for the first, the
/// store unavailable for the others, with `e`'s text.
fn failed_all(n: usize, e: StoreError) -> Vec<Result<()>> {
    let text = e.to_string();
    let mut all = vec![Err(e)];
    all.extend((1..n).map(|_| Err(StoreError::Unavailable(text.clone()))));
    all.truncate(n);
    all
}

/// Runs `work` in a savepoint of its own inside the writer's transaction:
/// undone alone if it fails.
fn in_savepoint<T>(c: &Connection, work: impl FnOnce() -> Result<T>) -> Result<T> {
    c.execute_batch("SAVEPOINT claim")
        .map_err(db("opening a claim savepoint"))?;
    let result = work();
    let end = if result.is_ok() {
        "RELEASE claim"
    } else {
        "ROLLBACK TO claim; RELEASE claim"
    };
    c.execute_batch(end)
        .map_err(db("closing a claim savepoint"))?;
    result
}

/// `req` claimed with no limits, as [`Store::claim`] answers within
/// [`Store::complete_and_claim`].
fn claim_plain(c: &Connection, req: &ClaimRequest, now: i64) -> Result<LimitedClaim> {
    let claimed = if req.max == 0 {
        Vec::new()
    } else {
        sql::claim(c, req, now)?
    };
    Ok(LimitedClaim::Claimed {
        claimed,
        asked: req.max,
        capped: false,
    })
}

/// Counts, takes tokens and claims `req` within `limits`, in the writer's
/// transaction (see [`Store::claim_limited`]).
fn claim_within(
    c: &Connection,
    throttle: &crate::throttle::Throttle,
    req: ClaimRequest,
    limits: ClaimLimits,
    now: i64,
) -> Result<LimitedClaim> {
    let want = limits.rate.map_or(req.max, |r| req.max.min(r.grant()));
    let room = match limits.max_running {
        Some(max) => max.saturating_sub(count_running(c, &req.topic)?),
        None => want,
    };
    let capped = room < want;
    if room == 0 || want == 0 {
        let claimed = Vec::new();
        return Ok(LimitedClaim::Claimed {
            claimed,
            asked: want,
            capped,
        });
    }
    let Some(rate) = limits.rate else {
        let req = ClaimRequest {
            max: want.min(room),
            ..req
        };
        let claimed = sql::claim(c, &req, now)?;
        return Ok(LimitedClaim::Claimed {
            claimed,
            asked: req.max,
            capped,
        });
    };
    let grant = throttle.take(&req.topic, rate, want.min(room));
    if grant.granted == 0 {
        return Ok(LimitedClaim::Wait(grant.wait));
    }
    let asked = grant.granted;
    let claimed = sql::claim(
        c,
        &ClaimRequest {
            max: asked,
            ..req.clone()
        },
        now,
    );
    let used = claimed
        .as_ref()
        .map_or(0, |c| u32::try_from(c.len()).unwrap_or(asked));
    // Tokens for events that were not there are not spent.
    throttle.give_back(&req.topic, rate, asked - used);
    Ok(LimitedClaim::Claimed {
        claimed: claimed?,
        asked,
        capped,
    })
}
