//! [`PostgresStore`]: the [`Store`] trait over one PostgreSQL database.

use crate::claimer::{Claimer, release_later};
use crate::completer::Completer;
use crate::db::Db;
use crate::floor::{Floors, RESCAN};
use crate::options::PostgresOptions;
use crate::sql::{self, db};
use crate::timeouts::{ADMIN_LIMIT, DATA_LIMIT, LONG_LIMIT, bounded};
use crate::vacuum::QueueVacuum;
use crate::writer::Writer;
use jiff::Timestamp;
use mailroom_core::StoreError;
use mailroom_core::{
    AttemptWindow, ClaimLimits, ClaimRequest, Claimed, Completion, Event, EventId, EventSearch,
    FencingToken, Inserted, LimitedClaim, ListFilter, Migrated, NewEvent, OnDead, Page,
    PurgeReport, ReplayReport, Result, Retention, SchemaVersion, Store, Throughput, TopicStats,
    TopicStream,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

/// How recently a pooled connection must have been in use for a claim to
/// take it without the pool's ping (`PostgresStore::connect`).
const UNPINGED_WITHIN: Duration = Duration::from_secs(1);

tokio::task_local! {
    /// Set while a claim runs ([`Store::claim`]): the connections it takes
    /// are handed out without a ping if they were in use a moment ago.
    static CLAIMING: ();
}

/// The scale-out store: a connection pool to a database that any number of
/// mailroom instances share, a group-commit task for inserts, and a `LISTEN`
/// connection that wakes subscribers when events arrive.
///
/// Cheap to clone. The background tasks stop when the last clone is dropped.
/// Call [`Store::migrate`] once before use (safe to run from several
/// instances at once). Must be created inside a Tokio runtime.
#[derive(Debug, Clone)]
pub struct PostgresStore {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    /// Statements, through `url` (`db.rs`).
    pool: Db,
    /// Connections for session work (claim locks, migrations): to
    /// `direct_url` when there is one, else `pool`'s own.
    session: PgPool,
    writer: Writer,
    /// `None` without group commit: each completion is its own statement.
    completer: Option<Completer>,
    notify: broadcast::Sender<String>,
    listener: Option<JoinHandle<()>>,
    /// Where claims of independent events start (`floor.rs`).
    floors: Floors,
    /// VACUUMs the queue after many claims (`vacuum.rs`).
    vacuum: Arc<QueueVacuum>,
    /// Sequential topics whose last claim found heads sparse among the
    /// pending events (`sql::sparse_heads`), with when a claim last looked
    /// for keyless events past the bound: their next claim walks
    /// [`sql::SPARSE_WINDOW`] pending events, not [`sql::SEQUENTIAL_WINDOW`],
    /// before looking up heads key by key, and keyless events once
    /// [`RESCAN`] has passed.
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
    /// `max_wait_for_priority` ([`sql::raise_waiting`]).
    raised: Mutex<HashMap<String, Instant>>,
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(task) = self.listener.take() {
            task.abort();
        }
    }
}

impl PostgresStore {
    /// Connects (checking that the database answers), starts the insert
    /// task and, unless disabled, the `LISTEN` connection. Does not migrate:
    /// call [`Store::migrate`]. A database that is down gives
    /// [`StoreError::Unavailable`](mailroom_core::StoreError::Unavailable);
    /// once connected, the pool reconnects by itself after outages.
    ///
    /// With [`PostgresOptions::direct`], session work connects there and
    /// statements through `connect` run as a transaction-mode pooler needs
    /// (`db.rs`). Without it, a `connect` that turns out to be such a
    /// pooler is refused ([`StoreError::Invalid`], naming `direct_url`).
    pub async fn connect(opts: PostgresOptions) -> Result<Self> {
        opts.validate()?;
        crate::tls::log_mode(&opts.connect);
        if let Some(direct) = &opts.direct {
            crate::tls::log_mode(direct);
        }
        let pooled = opts.direct.is_some();
        // Durability does not depend on the server's default (nothing is acknowledged before a durable commit):
        // a direct connection sets it at startup; through a pooler, which
        // would refuse or drop that startup option, each transaction sets
        // it (`db.rs`), and nothing else at startup needs the pooler's
        // `ignore_startup_parameters` (not even sqlx's `extra_float_digits`).
        let direct = opts
            .direct
            .clone()
            .unwrap_or_else(|| opts.connect.clone())
            .options([("synchronous_commit", "on")])
            .options(crate::timeouts::session_settings())
            .application_name("mailroom");
        let connect = if pooled {
            opts.connect
                .clone()
                .application_name("mailroom")
                .extra_float_digits(None)
                .statement_cache_capacity(0)
        } else {
            direct.clone()
        };
        let pool = PgPoolOptions::new()
            .max_connections(opts.pool_size)
            .acquire_timeout(opts.acquire_timeout)
            // sqlx pings a pooled connection before handing it out (and
            // again, in the background, when it goes back): a round trip
            // in front of each claim, on a topic loop's critical path. A
            // claim skips it for a connection in use less than
            // UNPINGED_WITHIN ago, and is tried again on pinged
            // connections if it fails (`Store::claim`). Everything else
            // keeps the ping: an insert or a group of outcomes that failed
            // on a connection the server ended (a restart) would fail its
            // callers, who cannot all be retried as safely.
            .test_before_acquire(false)
            .before_acquire(|conn, meta| {
                Box::pin(async move {
                    if meta.idle_for < UNPINGED_WITHIN && CLAIMING.try_with(|()| ()).is_ok() {
                        return Ok(true);
                    }
                    // A connection that fails its ping, or does not
                    // answer it in time, is closed and another one handed
                    // out (or opened).
                    Ok(crate::timeouts::answers(conn).await)
                })
            })
            .after_release(crate::timeouts::after_release)
            .connect_with(connect)
            .await
            .map_err(|e| refused_startup(e, pooled))?;
        let session = if pooled {
            // Taken out of it (`detach`) by claimers, so its size bounds
            // only how many are opened at once.
            let session = PgPoolOptions::new()
                .max_connections(opts.pool_size)
                .min_connections(0)
                .acquire_timeout(opts.acquire_timeout)
                .connect_with(direct.clone())
                .await
                .map_err(db("connecting to direct_url"))?;
            refuse_different_databases(&pool, &session).await?;
            session
        } else {
            refuse_transaction_pooler(&pool).await?;
            pool.clone()
        };
        let pool = Db::new(pool, pooled);
        let (notify, listener) = if opts.listen {
            let (tx, task) = crate::listen::start(direct, opts.acquire_timeout).await?;
            (tx, Some(task))
        } else {
            (broadcast::channel(1).0, None)
        };
        let group = if opts.group_commit { opts.max_batch } else { 1 };
        let writer = Writer::start(pool.clone(), group, opts.queue_capacity);
        let completer = opts
            .group_commit
            .then(|| Completer::start(pool.clone(), opts.max_batch, opts.queue_capacity));
        // On the direct connection: its role check is a prepared statement.
        let vacuum = QueueVacuum::new(session.clone(), opts.vacuum_queue_every);
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                session,
                writer,
                completer,
                notify,
                listener,
                floors: Floors::default(),
                vacuum,
                sparse: Mutex::default(),
                limited: Turns::default(),
                claimers: Turns::default(),
                raised: Mutex::default(),
            }),
        })
    }

    /// Insert transactions committed by this handle so far; with group
    /// commit, far fewer than the inserts they carried.
    pub fn commits(&self) -> u64 {
        self.inner.writer.commits()
    }

    /// Topics with new events, as `NOTIFY mailroom_events` reports them
    /// from any instance or outbox transaction ([`ANY_TOPIC`](crate::ANY_TOPIC)
    /// after the listening connection was re-established). Nothing arrives
    /// if the store was opened with `listen = false`.
    pub fn subscribe(&self) -> broadcast::Receiver<String> {
        self.inner.notify.subscribe()
    }

    /// The connection pool, for applications that want to run their own
    /// transactions (e.g. [`outbox::enqueue`](crate::outbox::enqueue)) on
    /// the same database. Through a pooler ([`PostgresOptions::direct`]),
    /// its connections reach the pooler: run statements there in
    /// transactions.
    pub fn pool(&self) -> &PgPool {
        self.inner.pool.pool()
    }

    /// A transaction on [`pool`](Self::pool), for the application's own
    /// writes and [`outbox::enqueue`](crate::outbox::enqueue): through a
    /// transaction-mode pooler ([`PostgresOptions::direct`]) it starts as
    /// the store's own do (`synchronous_commit = on`, no other client's
    /// prepared statements left on its server connection).
    pub async fn begin(&self) -> Result<sqlx::Transaction<'static, sqlx::Postgres>> {
        self.inner
            .pool
            .begin()
            .await
            .map_err(db("beginning a transaction"))
    }

    fn pool_ref(&self) -> &Db {
        &self.inner.pool
    }

    /// A claim of a sequential topic's heads, its walk bounded by what the
    /// topic's last claim found (see `sparse`).
    async fn claim_heads(
        &self,
        req: &ClaimRequest,
        on_dead: OnDead,
    ) -> Result<Vec<(sql::Position, Claimed)>> {
        // First, so the walk's bound below is what the last claim found.
        let claimer = self
            .inner
            .claimers
            .of_with(&req.topic, || Claimer::new(&req.topic));
        let mut turn = claimer.lock().await;
        let sparse = || {
            self.inner
                .sparse
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
        };
        let started = Instant::now();
        let last_keyless = sparse().get(&req.topic).copied();
        let window = window_for(last_keyless.is_some());
        let keyless = last_keyless.is_none_or(|at| started.saturating_duration_since(at) >= RESCAN);
        let conn = turn.locked(&self.inner.session).await?;
        let heads = match sql::claim_heads(conn, req, on_dead, window, keyless).await {
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
        let sparse = self
            .inner
            .sparse
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        window_for(sparse.contains_key(topic))
    }

    /// One claim within limits ([`Store::claim_limited`], which bounds
    /// it in time).
    async fn claim_within(&self, req: &ClaimRequest, limits: ClaimLimits) -> Result<LimitedClaim> {
        const CTX: &str = "claiming within limits";
        let want = limits.rate.map_or(req.max, |r| req.max.min(r.grant()));
        let turn = self.inner.limited.of(&req.topic);
        let _turn = turn.lock().await;
        let mut tx = self.pool_ref().begin().await.map_err(db(CTX))?;
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

    /// One claim ([`Store::claim`]).
    async fn claim_once(&self, req: &ClaimRequest) -> Result<Vec<Claimed>> {
        self.raise_waiting(req).await?;
        let claimed = match req.per_key {
            Some(on_dead) => self.claim_heads(req, on_dead).await?,
            None => self.claim_independent(req).await?,
        };
        Ok(claimed.into_iter().map(|(_, c)| c).collect())
    }

    /// Raises the events of `req`'s topic that waited its
    /// `max_wait_for_priority` ([`sql::raise_waiting`]), if the last time
    /// was long enough ago; after a raise the topic's next claim walks from
    /// its start (the raised events are older than its floor).
    async fn raise_waiting(&self, req: &ClaimRequest) -> Result<()> {
        let Some(max_wait) = req.max_wait_for_priority else {
            return Ok(());
        };
        let every = (max_wait / 4).clamp(Duration::from_millis(50), RESCAN);
        let now = Instant::now();
        {
            let mut raised = self.inner.raised.lock().unwrap_or_else(|e| e.into_inner());
            match raised.get(&req.topic) {
                Some(at) if now.saturating_duration_since(*at) < every => return Ok(()),
                _ => raised.insert(req.topic.clone(), now),
            };
        }
        if sql::raise_waiting(self.pool_ref(), req, max_wait).await? > 0 {
            self.inner.floors.forget(&req.topic);
        }
        Ok(())
    }

    /// A claim of independent events, from the topic's floor when it has
    /// one, then from its start for the rest if that came back short.
    async fn claim_independent(&self, req: &ClaimRequest) -> Result<Vec<(sql::Position, Claimed)>> {
        let floors = &self.inner.floors;
        let max = usize::try_from(req.max).unwrap_or(usize::MAX);
        let from = floors.start(&req.topic, Instant::now());
        let mut claimed = sql::claim_from(self.pool_ref(), req, from).await?;
        let short = claimed.len() < max;
        if from.is_some() && short {
            let rest = ClaimRequest {
                max: req.max - u32::try_from(claimed.len()).unwrap_or(req.max),
                ..req.clone()
            };
            match sql::claim_from(self.pool_ref(), &rest, None).await {
                Ok(older) => {
                    claimed.extend(older);
                    claimed.sort_unstable_by_key(|&((p, seq), _)| sql::claim_order(p, seq));
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
}

/// What connecting to `url` failed with. A pooler that refuses
/// mailroom's startup parameters (PgBouncer answers "unsupported startup
/// parameter" to `options` and `extra_float_digits` unless its
/// `ignore_startup_parameters` lists them) is one without `direct_url`:
/// mailroom sends neither through a pooler.
fn refused_startup(e: sqlx::Error, pooled: bool) -> StoreError {
    match &e {
        sqlx::Error::Database(d)
            if !pooled && d.message().contains("unsupported startup parameter") =>
        {
            StoreError::Invalid(format!(
                "postgres: connecting: {e}: the url is a connection pooler (PgBouncer); \
                 set [store] direct_url to a direct connection to the same database, \
                 and mailroom sends the pooler no such parameter"
            ))
        }
        _ => db("connecting")(e),
    }
}

/// Refuses a `pool` whose connections are a transaction-mode pooler's
/// (see [`PostgresStore::connect`]), where a client connection has no
/// database session of its own between transactions: one client
/// connection that meets another server session after another client's
/// transaction took one, or whose session that other client gets, is not
/// a session of its own. PgBouncer hands the most recently released server
/// connection out first, so the other client meets the first one's
/// session, once the pooler has released it ([`PROBE_PAUSE`]); a few
/// rounds leave nothing to chance. Simple-protocol statements: they work
/// through any pooler.
async fn refuse_transaction_pooler(pool: &PgPool) -> Result<()> {
    const CTX: &str = "checking for a transaction-mode pooler";
    async fn pid(conn: &mut sqlx::PgConnection) -> Result<i32> {
        let row = sqlx::raw_sql("SELECT pg_backend_pid()")
            .fetch_one(conn)
            .await
            .map_err(db(CTX))?;
        row.try_get(0).map_err(db(CTX))
    }
    let mut first = pool.acquire().await.map_err(db(CTX))?;
    let mut other = pool.acquire().await.map_err(db(CTX))?;
    for _ in 0..PROBE_ROUNDS {
        let before = pid(&mut first).await?;
        tokio::time::sleep(PROBE_PAUSE).await;
        let mut tx = sqlx::Connection::begin(&mut *other)
            .await
            .map_err(db(CTX))?;
        let theirs = pid(&mut tx).await?;
        let after = pid(&mut first).await?;
        tx.rollback().await.map_err(db(CTX))?;
        if theirs == before || after != before {
            return Err(StoreError::Invalid(
                "postgres: the url's connections do not keep their database session between \
                 transactions: it is a connection pooler in transaction mode (e.g. PgBouncer \
                 with pool_mode = transaction), through which LISTEN wake-ups and the \
                 sequential topics' claim locks would be lost; set [store] direct_url to a \
                 direct connection to the same database"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// Refuses a `direct_url` (`session`) that reaches another database than
/// the pooler (`pool`): migrations, `LISTEN` and the sequential topics'
/// claims would run there while events are written through the pooler, so
/// the service would start and never see its own events. A database is
/// told by its name, its oid and its server's start time (readable by any
/// role, unlike the cluster's system identifier). Simple-protocol
/// statements: they work through any pooler.
async fn refuse_different_databases(pool: &PgPool, session: &PgPool) -> Result<()> {
    const CTX: &str = "checking that url and direct_url reach one database";
    const WHICH: &str = "SELECT current_database()::text, \
         (SELECT oid FROM pg_database WHERE datname = current_database())::int8, \
         pg_postmaster_start_time()::text";
    async fn which(pool: &PgPool) -> Result<(String, i64, String)> {
        let row = sqlx::raw_sql(WHICH)
            .fetch_one(pool)
            .await
            .map_err(db(CTX))?;
        Ok((
            row.try_get(0).map_err(db(CTX))?,
            row.try_get(1).map_err(db(CTX))?,
            row.try_get(2).map_err(db(CTX))?,
        ))
    }
    let (pooled, direct) = (which(pool).await?, which(session).await?);
    if pooled == direct {
        return Ok(());
    }
    Err(StoreError::Invalid(format!(
        "postgres: url and direct_url reach different databases: through url, database \
         \"{}\" (oid {}) of a server started at {}; through direct_url, database \"{}\" \
         (oid {}) of a server started at {}. direct_url must reach the database the \
         pooler serves: migrations, LISTEN and sequential claims run there",
        pooled.0, pooled.1, pooled.2, direct.0, direct.1, direct.2
    )))
}

/// Rounds of [`refuse_transaction_pooler`]'s check.
const PROBE_ROUNDS: usize = 3;

/// How long [`refuse_transaction_pooler`] lets a pooler take to release a
/// server connection after its client has read the answer.
const PROBE_PAUSE: Duration = Duration::from_millis(10);

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
        sql::SPARSE_WINDOW
    } else {
        sql::SEQUENTIAL_WINDOW
    }
}

#[async_trait::async_trait]
impl Store for PostgresStore {
    async fn migrate(&self) -> Result<Migrated> {
        bounded(
            LONG_LIMIT,
            "migrating",
            crate::schema::migrate(&self.inner.session),
        )
        .await
    }

    async fn schema(&self) -> Result<SchemaVersion> {
        bounded(
            ADMIN_LIMIT,
            "reading the schema version",
            crate::schema::version(&self.inner.session),
        )
        .await
    }

    async fn insert(&self, event: NewEvent) -> Result<Inserted> {
        self.inner.writer.insert(event).await
    }

    /// With `max_wait_for_priority`, events waiting that long behind higher
    /// priorities are raised first, at most every quarter of that bound (and
    /// every `RESCAN`): a low-priority event waits at most the bound plus
    /// that, and a claim of a topic without priorities pays one probe.
    /// Independent topics are claimed from a floor (`floor.rs`): an event
    /// that turns pending behind newer ones waits at most
    /// `RESCAN` longer, the latitude [`Store::claim`] allows.
    ///
    /// A claim takes connections used a moment ago without the pool's
    /// ping (`connect`); if it fails, it runs again on pinged ones, so a
    /// connection that the server ended since its last use (a restart)
    /// costs a second try, not a failed claim. Trying again is safe: a
    /// claim that failed committed nothing, or, if its commit's answer was
    /// lost, left its events under leases that rescue ends.
    async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Claimed>> {
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
        self.inner.vacuum.claimed(claimed.len());
        Ok(claimed)
    }

    async fn complete(
        &self,
        id: EventId,
        token: FencingToken,
        completion: Completion,
    ) -> Result<()> {
        match &self.inner.completer {
            Some(completer) => completer.complete(id, token, completion).await,
            None => {
                bounded(
                    DATA_LIMIT,
                    "completing",
                    sql::complete(self.pool_ref(), id, token, &completion),
                )
                .await
            }
        }
    }

    async fn extend(&self, id: EventId, token: FencingToken, lease: Duration) -> Result<Timestamp> {
        bounded(
            DATA_LIMIT,
            "extending a lease",
            sql::extend(self.pool_ref(), id, token, lease),
        )
        .await
    }

    async fn rescue_expired(&self) -> Result<u64> {
        bounded(
            ADMIN_LIMIT,
            "rescuing expired leases",
            sql::rescue_expired(self.pool_ref()),
        )
        .await
    }

    async fn fold_counters(&self) -> Result<()> {
        bounded(
            ADMIN_LIMIT,
            "folding counters",
            sql::fold_counters(self.pool_ref()),
        )
        .await
    }

    /// One transaction per claim, which ends only after the claim
    /// committed: under `max_running`, the topic's advisory lock, then the
    /// count of its running events, so the next instance counts this
    /// claim; with a `rate`, the budget's row, locked from the take until
    /// the claim's stamp has settled the tokens
    /// (`sql::settle_tokens`), so grants and claims alternate across
    /// instances. The claim itself runs on its own connection(s). Dropped
    /// midway, the transaction rolls back and the locks go with it (and the
    /// tokens return to the budget).
    async fn claim_limited(&self, req: &ClaimRequest, limits: ClaimLimits) -> Result<LimitedClaim> {
        bounded(
            DATA_LIMIT,
            "claiming within limits",
            self.claim_within(req, limits),
        )
        .await
    }

    async fn pause_topic(&self, topic: &str, pause: Duration) -> Result<Timestamp> {
        bounded(
            DATA_LIMIT,
            "pausing a topic",
            sql::pause_topic(self.pool_ref(), topic, pause),
        )
        .await
    }

    async fn paused_for(&self, topic: &str) -> Result<Option<Duration>> {
        bounded(
            DATA_LIMIT,
            "reading a topic's pause",
            sql::paused_for(self.pool_ref(), topic),
        )
        .await
    }

    async fn expire(&self, topic: &str, expire_after: Duration, limit: u32) -> Result<u64> {
        bounded(
            ADMIN_LIMIT,
            "expiring events",
            sql::expire(self.pool_ref(), topic, expire_after, limit),
        )
        .await
    }

    async fn next_due(&self, req: &ClaimRequest) -> Result<Option<Timestamp>> {
        bounded(
            DATA_LIMIT,
            "finding the next due time",
            sql::next_due(self.pool_ref(), req, self.walk_window(&req.topic)),
        )
        .await
    }

    async fn get(&self, id: EventId) -> Result<Option<Event>> {
        bounded(
            DATA_LIMIT,
            "reading an event",
            sql::get(self.pool_ref(), id),
        )
        .await
    }

    async fn list(&self, filter: &ListFilter) -> Result<Page> {
        bounded(
            ADMIN_LIMIT,
            "listing events",
            sql::list(self.pool_ref(), filter),
        )
        .await
    }

    async fn replay(&self, id: EventId, budget: u32) -> Result<Event> {
        bounded(
            ADMIN_LIMIT,
            "replaying an event",
            sql::replay(self.pool_ref(), id, budget),
        )
        .await
    }

    async fn replay_matching(&self, filter: &ListFilter, budget: u32) -> Result<ReplayReport> {
        bounded(
            LONG_LIMIT,
            "replaying events",
            sql::replay_matching(self.pool_ref(), filter, budget),
        )
        .await
    }

    async fn skip(&self, id: EventId) -> Result<Event> {
        bounded(
            ADMIN_LIMIT,
            "skipping an event",
            sql::skip(self.pool_ref(), id),
        )
        .await
    }

    async fn cancel(&self, id: EventId) -> Result<Event> {
        bounded(
            ADMIN_LIMIT,
            "cancelling an event",
            sql::cancel(self.pool_ref(), id),
        )
        .await
    }

    async fn cancel_matching(&self, filter: &ListFilter) -> Result<u64> {
        bounded(
            LONG_LIMIT,
            "cancelling events",
            sql::cancel_matching(self.pool_ref(), filter),
        )
        .await
    }

    async fn attempt_window(&self, window: Duration) -> Result<Vec<AttemptWindow>> {
        bounded(
            ADMIN_LIMIT,
            "reading attempts",
            sql::attempt_window(self.pool_ref(), window),
        )
        .await
    }

    async fn search(&self, search: &EventSearch) -> Result<Page> {
        bounded(
            ADMIN_LIMIT,
            "searching events",
            sql::search(self.pool_ref(), search),
        )
        .await
    }

    async fn count(&self, search: &EventSearch) -> Result<u64> {
        bounded(
            ADMIN_LIMIT,
            "counting events",
            sql::count_matching(self.pool_ref(), search),
        )
        .await
    }

    async fn throughput(&self, window: Duration) -> Result<Vec<Throughput>> {
        bounded(
            ADMIN_LIMIT,
            "reading throughput",
            sql::throughput(self.pool_ref(), window),
        )
        .await
    }

    async fn stats(&self) -> Result<Vec<TopicStats>> {
        bounded(ADMIN_LIMIT, "reading stats", sql::stats(self.pool_ref())).await
    }

    async fn purge(&self, retention: Retention) -> Result<PurgeReport> {
        bounded(
            LONG_LIMIT,
            "applying retention",
            sql::purge(self.pool_ref(), retention),
        )
        .await
    }

    async fn now(&self) -> Result<Timestamp> {
        bounded(DATA_LIMIT, "reading the clock", sql::now(self.pool_ref())).await
    }

    /// The topics `LISTEN mailroom_events` reports, from every instance and
    /// outbox transaction; [`ANY_TOPIC`](crate::ANY_TOPIC) when some may
    /// have been missed (reconnect, or this subscriber lagged behind).
    fn notifications(&self) -> Option<TopicStream> {
        self.inner.listener.as_ref()?;
        let stream = futures::stream::unfold(self.subscribe(), |mut rx| async move {
            match rx.recv().await {
                Ok(topic) => Some((topic, rx)),
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    Some((crate::ANY_TOPIC.to_owned(), rx))
                }
                Err(broadcast::error::RecvError::Closed) => None,
            }
        });
        Some(Box::pin(stream))
    }

    async fn try_lead(&self, role: &str, holder: &str, ttl: Duration) -> Result<bool> {
        bounded(
            ADMIN_LIMIT,
            "electing a leader",
            sql::try_lead(self.pool_ref(), role, holder, ttl),
        )
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use mailroom_core::Store;
    use sqlx::Connection;

    /// The check behind the refusal of a transaction-mode pooler without
    /// `direct_url`, on a pooler that accepts mailroom's startup
    /// parameters (one whose `ignore_startup_parameters` lists them, or
    /// another pooler): PgBouncer in transaction mode is refused, the
    /// database itself is not.
    #[tokio::test]
    async fn a_pooler_in_transaction_mode_is_told_from_a_database_session() {
        let direct = mailroom_testkit::fresh_postgres_db().await;
        let pooler = mailroom_testkit::pgbouncer_url(&direct);
        let pool = |url: &str| {
            let opts: sqlx::postgres::PgConnectOptions = url.parse().unwrap();
            PgPoolOptions::new()
                .max_connections(4)
                .connect_lazy_with(opts.extra_float_digits(None))
        };
        refuse_transaction_pooler(&pool(&direct)).await.unwrap();
        for _ in 0..20 {
            match refuse_transaction_pooler(&pool(&pooler)).await {
                Err(StoreError::Invalid(why)) => assert!(why.contains("direct_url"), "{why}"),
                other => panic!("PgBouncer in transaction mode not refused: {other:?}"),
            }
        }
    }

    /// A `direct_url` that reaches another database than the pooler's is
    /// refused at connect, naming both; the same database through both is
    /// taken.
    #[tokio::test]
    async fn a_direct_url_to_another_database_than_the_poolers_is_refused() {
        let served = mailroom_testkit::fresh_postgres_db().await;
        let other = mailroom_testkit::fresh_postgres_db().await;
        let pooler = mailroom_testkit::pgbouncer_url(&served);
        let connect = |direct: &str| {
            let mut opts = PostgresOptions::new(pooler.parse().unwrap());
            opts.direct = Some(direct.parse().unwrap());
            PostgresStore::connect(opts)
        };
        match connect(&other).await {
            Err(StoreError::Invalid(why)) => {
                let name = |url: &str| url.rsplit('/').next().unwrap().to_owned();
                assert!(why.contains("different databases"), "{why}");
                assert!(
                    why.contains(&name(&served)) && why.contains(&name(&other)),
                    "{why}"
                );
            }
            Err(e) => panic!("refused for another reason: {e}"),
            Ok(_) => panic!("a direct_url to another database was taken"),
        }
        connect(&served).await.unwrap();
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
        assert_eq!(store.walk_window("t"), sql::SPARSE_WINDOW);

        sqlx::raw_sql(
            "DELETE FROM mailroom.queue WHERE state = 'running';
             UPDATE mailroom.events SET status = 'done' WHERE status = 'running';",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        let second = store.claim(&heads_of("t", 256)).await.unwrap();
        assert_eq!(second.len(), 200);
        assert_eq!(store.walk_window("t"), sql::SEQUENTIAL_WINDOW);
    }
}
