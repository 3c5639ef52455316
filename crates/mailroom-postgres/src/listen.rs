//! `LISTEN mailroom_events`, re-broadcast in process.
//!
//! One connection per store (its own one-connection pool, so it never takes
//! a slot claims need) listens; every notification's payload — the topic
//! that has new events — goes to a [`broadcast`] channel that any number of
//! dispatchers subscribe to. If the connection drops, [`PgListener`]
//! reconnects and listens again on the next receive; notifications sent
//! meanwhile are lost, which is why dispatchers keep a polling fallback
//! (SPEC §11). After a reconnect every subscriber gets [`ANY_TOPIC`], so
//! nobody sleeps through events that arrived while the connection was down.

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

/// Connects, runs `LISTEN`, and spawns the task that forwards notifications.
pub(crate) async fn start(
    connect: PgConnectOptions,
    acquire_timeout: Duration,
) -> Result<(broadcast::Sender<String>, JoinHandle<()>)> {
    const CTX: &str = "listening for notifications";
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .min_connections(0)
        .idle_timeout(None)
        .max_lifetime(None)
        .acquire_timeout(acquire_timeout)
        .connect_lazy_with(connect);
    let mut listener = PgListener::connect_with(&pool).await.map_err(db(CTX))?;
    listener.ignore_pool_close_event(true);
    listener.listen(NOTIFY_CHANNEL).await.map_err(db(CTX))?;
    let (tx, _) = broadcast::channel(CAPACITY);
    let sender = tx.clone();
    let task = tokio::spawn(async move {
        let mut healthy = true;
        loop {
            match listener.try_recv().await {
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
    });
    Ok((tx, task))
}
