//! `LISTEN mailroom_events`, re-broadcast in process.
//!
//! One connection per store (its own one-connection pool, so it never takes
//! a slot claims need) listens; every notification's payload — the topic
//! that has new events — goes to a [`broadcast`] channel that any number of
//! dispatchers subscribe to. If the connection drops, [`PgListener`]
//! reconnects and listens again on the next receive; notifications sent
//! meanwhile are lost, which is why dispatchers keep a polling fallback.
//! After a reconnect every subscriber gets [`ANY_TOPIC`], so nobody sleeps
//! through events that arrived while the connection was down.
//! A connection frozen by the network (no error, no data) is found by a
//! `SELECT 1` after [`PROBE_AFTER`] of quiet, bounded by `PING_LIMIT`; one
//! that does not answer is dropped and a new one listens.

use crate::NOTIFY_CHANNEL;
use crate::sql::db;
use mailroom_core::Result;
use sqlx::postgres::{PgConnectOptions, PgListener, PgPoolOptions};
use std::time::Duration;
use tokio::sync::broadcast;
use tokio::task::JoinHandle;

/// Sent to subscribers when notifications may have been missed (after the
/// listening connection was re-established): "look at every topic".
pub const ANY_TOPIC: &str = "*";

/// Topics buffered per subscriber before a slow one starts missing some
/// (it then sees `RecvError::Lagged` and should look at every topic).
const CAPACITY: usize = 1024;

/// How long the listening connection may stay quiet before it is probed
/// with a `SELECT 1`: a connection frozen by the network (packets dropped,
/// no RST) never errs, it just never delivers again.
pub(crate) const PROBE_AFTER: Duration = Duration::from_secs(5);

/// Connects, runs `LISTEN`, and spawns the task that forwards notifications.
pub(crate) async fn start(
    connect: PgConnectOptions,
    acquire_timeout: Duration,
) -> Result<(broadcast::Sender<String>, JoinHandle<()>)> {
    let listener = listen(&connect, acquire_timeout).await?;
    let (tx, _) = broadcast::channel(CAPACITY);
    let task = tokio::spawn(forward(connect, listener, tx.clone(), acquire_timeout));
    Ok((tx, task))
}

/// A listener on a connection of its own (a one-connection pool, so it
/// never takes a slot claims need), within `limit` (connect and `LISTEN`).
///
/// Each listener gets a new pool: a dropped `PgListener` runs `UNLISTEN *`
/// on its connection before giving it back, with no time limit, so a
/// listener dropped because its connection froze keeps its pool's only
/// slot until TCP gives up on that connection.
async fn listen(connect: &PgConnectOptions, limit: Duration) -> Result<PgListener> {
    const CTX: &str = "listening for notifications";
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(limit)
        .after_release(crate::timeouts::after_release)
        .connect_lazy_with(connect.clone());
    let connect = async {
        let mut listener = PgListener::connect_with(&pool).await.map_err(db(CTX))?;
        listener.ignore_pool_close_event(true);
        listener.listen(NOTIFY_CHANNEL).await.map_err(db(CTX))?;
        Ok(listener)
    };
    crate::timeouts::bounded(limit, CTX, connect).await
}

/// Whether the listener's connection answers a `SELECT 1` within
/// [`PING_LIMIT`](crate::timeouts::PING_LIMIT).
async fn answers(listener: &mut PgListener) -> bool {
    let probe = sqlx::query("SELECT 1").execute(&mut *listener);
    matches!(
        tokio::time::timeout(crate::timeouts::PING_LIMIT, probe).await,
        Ok(Ok(_))
    )
}

/// Forwards notifications to `sender`; reconnects when the connection is
/// lost or stops answering.
async fn forward(
    connect: PgConnectOptions,
    mut listener: PgListener,
    sender: broadcast::Sender<String>,
    limit: Duration,
) {
    let mut healthy = true;
    loop {
        // `try_recv` is cancel-safe: a partly read message stays buffered.
        let received = match tokio::time::timeout(PROBE_AFTER, listener.try_recv()).await {
            Ok(received) => received,
            Err(_) if answers(&mut listener).await => continue,
            Err(_) => {
                tracing::warn!(
                    "postgres LISTEN connection did not answer a probe within {} s; reconnecting",
                    crate::timeouts::PING_LIMIT.as_secs()
                );
                drop(listener);
                listener = reconnect(&connect, limit).await;
                Ok(None)
            }
        };
        match received {
            Ok(Some(n)) => {
                // No receivers is fine: nobody is idle right now.
                let _ = sender.send(n.payload().to_owned());
            }
            Ok(None) => {
                // The connection was lost and (eagerly) re-established.
                tracing::info!("postgres LISTEN connection re-established");
                let _ = sender.send(ANY_TOPIC.to_owned());
            }
            Err(e) => {
                if healthy {
                    tracing::warn!(error = %e, "postgres LISTEN connection lost; retrying");
                }
                healthy = false;
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        }
        if !healthy {
            healthy = true;
            let _ = sender.send(ANY_TOPIC.to_owned());
        }
    }
}

/// A new listener, trying every second until one connects.
async fn reconnect(connect: &PgConnectOptions, limit: Duration) -> PgListener {
    loop {
        match listen(connect, limit).await {
            Ok(listener) => return listener,
            Err(e) => {
                tracing::debug!(error = %e, "postgres LISTEN connection not back yet");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
