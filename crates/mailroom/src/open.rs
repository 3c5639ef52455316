//! Opens the store a URL names: `sqlite://...` (embedded default) or,
//! when built with it, `postgres://...`.

use mailroom_core::{Store, StoreError};
use std::sync::Arc;

/// Opens (without migrating) the store at `url`.
pub async fn open_store(url: &str, group_commit: bool) -> Result<Arc<dyn Store>, StoreError> {
    open_store_with(url, None, group_commit).await
}

/// [`open_store`], with PostgreSQL's `direct_url`: a direct connection to
/// the database when `url` is a connection pooler in transaction mode
/// (session work goes there, everything else to `url`). Refused for SQLite.
pub async fn open_store_with(
    url: &str,
    direct_url: Option<&str>,
    group_commit: bool,
) -> Result<Arc<dyn Store>, StoreError> {
    if url.starts_with("sqlite:") {
        if direct_url.is_some() {
            return Err(StoreError::Invalid(
                "direct_url is for PostgreSQL; a sqlite:// store has no pooler".into(),
            ));
        }
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
            if let Some(direct) = direct_url {
                opts = opts.with_direct_url(direct)?;
            }
            opts.group_commit = group_commit;
            let store = mailroom_postgres::PostgresStore::connect(opts).await?;
            return Ok(Arc::new(store));
        }
        #[cfg(not(feature = "postgres"))]
        {
            let _ = (group_commit, direct_url);
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
