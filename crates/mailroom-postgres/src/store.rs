//! [`PostgresStore`]: the [`Store`] trait over one PostgreSQL database.

use crate::claim::{CLAIMING, Claims};
use crate::completer::Completer;
use crate::db::Db;
use crate::options::PostgresOptions;
use crate::sql::{self, db};
use crate::timeouts::{ADMIN_LIMIT, DATA_LIMIT, LONG_LIMIT, bounded};
use crate::vacuum::QueueVacuum;
use crate::writer::Writer;
use jiff::Timestamp;
use mailroom_core::StoreError;
use mailroom_core::{
    AttemptWindow, ClaimLimits, ClaimRequest, Claimed, Completion, Event, EventId, EventSearch,
    FencingToken, Inserted, LimitedClaim, ListFilter, Migrated, NewEvent, Page, PurgeReport,
    ReplayReport, Result, Retention, SchemaVersion, Store, Throughput, TopicStats, TopicStream,
};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

/// How recently a pooled connection must have been in use for a claim to
/// take it without the pool's ping (`PostgresStore::connect`).
const UNPINGED_WITHIN: Duration = Duration::from_secs(1);

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
    /// The claims and what they keep between them (`claim/`).
    claims: Claims,
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
        let claims = Claims::new(pool.clone(), session.clone(), vacuum);
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                session,
                writer,
                completer,
                notify,
                listener,
                claims,
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

    /// The store's claims, for their tests.
    #[cfg(test)]
    pub(crate) fn claims(&self) -> &Claims {
        &self.inner.claims
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

    async fn claim(&self, req: &ClaimRequest) -> Result<Vec<Claimed>> {
        self.inner.claims.claim(req).await
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

    async fn claim_limited(&self, req: &ClaimRequest, limits: ClaimLimits) -> Result<LimitedClaim> {
        bounded(
            DATA_LIMIT,
            "claiming within limits",
            self.inner.claims.claim_within(req, limits),
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
            self.inner.claims.next_due(req),
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
}
