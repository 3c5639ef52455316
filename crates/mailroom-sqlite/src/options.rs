//! How to open a store: [`SqliteOptions`], built in code or from a `sqlite:` URL.

use mailroom_core::StoreError;
use std::path::PathBuf;
use std::time::Duration;

/// Settings of a [`SqliteStore`](crate::SqliteStore).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SqliteOptions {
    /// The database file (created if missing).
    pub path: PathBuf,
    /// Share one commit (one fsync) among every write waiting in the queue.
    /// `false` commits each write on its own; only benchmarks want that.
    pub group_commit: bool,
    /// Most writes grouped into one transaction.
    pub max_batch: usize,
    /// Writes that may wait for the writer thread; beyond this, inserts and
    /// completions fail fast with [`StoreError::Overloaded`].
    pub queue_capacity: usize,
    /// Read connections (get, list, stats, next_due).
    pub readers: usize,
    /// How long a connection waits for another process holding the write
    /// lock (e.g. the `mailroom` CLI replaying) before giving up.
    pub busy_timeout: Duration,
}

impl SqliteOptions {
    /// Defaults for the database file at `path`.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        Self {
            path: path.into(),
            group_commit: true,
            max_batch: 512,
            queue_capacity: 8192,
            readers: 4,
            busy_timeout: Duration::from_secs(5),
        }
    }

    /// Defaults for the file named by a store URL: `sqlite://mailroom.db`
    /// (relative), `sqlite:///abs/path.db` (absolute) or `sqlite:relative.db`.
    /// A query string (`?mode=rwc`) is ignored. In-memory databases are
    /// refused: the writer and the readers must share one file.
    pub fn from_url(url: &str) -> Result<Self, StoreError> {
        let rest = url
            .strip_prefix("sqlite:")
            .ok_or_else(|| StoreError::Invalid(format!("not a sqlite URL: {url:?}")))?;
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let path = rest.split('?').next().unwrap_or_default();
        if path.is_empty() {
            return Err(StoreError::Invalid(format!(
                "sqlite URL {url:?} names no file (try sqlite://mailroom.db)"
            )));
        }
        if path == ":memory:" || path.starts_with("file::memory:") {
            return Err(StoreError::Invalid(
                "in-memory SQLite is not supported: mailroom needs a file shared by its connections"
                    .into(),
            ));
        }
        Ok(Self::new(path))
    }

    pub(crate) fn validate(&self) -> Result<(), StoreError> {
        if self.max_batch == 0 || self.queue_capacity == 0 || self.readers == 0 {
            return Err(StoreError::Invalid(
                "sqlite options: max_batch, queue_capacity and readers must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_name_relative_and_absolute_files() {
        let p = |u: &str| SqliteOptions::from_url(u).map(|o| o.path);
        assert_eq!(p("sqlite://mailroom.db").ok(), Some("mailroom.db".into()));
        assert_eq!(p("sqlite:///abs/path.db").ok(), Some("/abs/path.db".into()));
        assert_eq!(p("sqlite:relative.db").ok(), Some("relative.db".into()));
        assert_eq!(
            p("sqlite://data/m.db?mode=rwc").ok(),
            Some("data/m.db".into())
        );
        assert!(p("postgres://x/y").is_err());
        assert!(p("sqlite://").is_err());
        assert!(p("sqlite::memory:").is_err());
    }

    #[test]
    fn defaults_match_the_documentation() {
        let o = SqliteOptions::new("x.db");
        assert!(o.group_commit);
        assert_eq!((o.max_batch, o.queue_capacity, o.readers), (512, 8192, 4));
        assert_eq!(o.busy_timeout, Duration::from_secs(5));
    }
}
