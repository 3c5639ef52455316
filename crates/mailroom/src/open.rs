//! Opens the store a URL names: `sqlite://...` (embedded default) or,
//! when built with it, `postgres://...`.

use mailroom_core::{Store, StoreError};
use std::sync::Arc;

/// Opens (without migrating) the store at `url`.
pub async fn open_store(url: &str, group_commit: bool) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        #[cfg(feature = "sqlite")]
        {
            let mut opts = mailroom_sqlite::SqliteOptions::from_url(url)?;
            opts.group_commit = group_commit;
            let store = mailroom_sqlite::SqliteStore::open(opts)?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "sqlite"))]
        return Err(StoreError::Invalid(
            "this build has no SQLite support".into(),
        ));
    }
    if url.starts_with("postgres:") || url.starts_with("postgresql:") {
        #[cfg(feature = "postgres")]
        {
            let mut opts = mailroom_postgres::PostgresOptions::from_url(url)?;
            opts.group_commit = group_commit;
            let store = mailroom_postgres::PostgresStore::connect(opts).await?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = group_commit;
            return Err(StoreError::Invalid(
                "this build has no PostgreSQL support (enable the `postgres` feature)".into(),
            ));
        }
    }
    Err(StoreError::Invalid(format!(
        "unsupported store URL {:?}: expected sqlite://FILE or postgres://...",
        mailroom_core::redact::url(url)
    )))
}
