//! A small pool of read connections, used from `spawn_blocking`.
//!
//! In WAL mode readers never wait for the writer, and each read transaction
//! sees the last committed state.

use mailroom_core::{Result, StoreError};
use rusqlite::Connection;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Semaphore;

pub(crate) struct ReadPool {
    path: PathBuf,
    busy_timeout: Duration,
    idle: Mutex<Vec<Connection>>,
    permits: Semaphore,
}

impl std::fmt::Debug for ReadPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadPool")
            .field("path", &self.path)
            .field("available", &self.permits.available_permits())
            .finish_non_exhaustive()
    }
}

impl ReadPool {
    pub(crate) fn new(path: PathBuf, busy_timeout: Duration, size: usize) -> Self {
        Self {
            path,
            busy_timeout,
            idle: Mutex::new(Vec::with_capacity(size)),
            permits: Semaphore::new(size),
        }
    }

    fn take(&self) -> Result<Connection> {
        let idle = self
            .idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        match idle {
            Some(conn) => Ok(conn),
            None => crate::connection::open_connection(&self.path, self.busy_timeout, true),
        }
    }

    fn put(&self, conn: Connection) {
        self.idle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(conn);
    }

    /// Runs `read` inside one read transaction on a pooled connection.
    pub(crate) async fn run<F, T>(self: &Arc<Self>, read: F) -> Result<T>
    where
        F: FnOnce(&Connection) -> Result<T> + Send + 'static,
        T: Send + 'static,
    {
        let _permit = self
            .permits
            .acquire()
            .await
            .map_err(|_| StoreError::Unavailable("sqlite read pool closed".into()))?;
        let pool = Arc::clone(self);
        tokio::task::spawn_blocking(move || {
            let mut conn = pool.take()?;
            let result = match conn.transaction() {
                Ok(tx) => {
                    let result = read(&tx);
                    // A read transaction has nothing to keep; ending it frees the snapshot.
                    drop(tx);
                    result
                }
                Err(e) => Err(crate::sql::db("starting a read transaction")(e)),
            };
            pool.put(conn);
            result
        })
        .await
        .map_err(|e| StoreError::Unavailable(format!("sqlite read task failed: {e}")))?
    }
}
