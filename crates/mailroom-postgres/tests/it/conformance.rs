//! The shared conformance suite, run against PostgreSQL: every test gets a
//! fresh database on the server `./scripts/test.sh` starts.
#![allow(clippy::unwrap_used)]

use mailroom_core::Store;
use mailroom_postgres::{PostgresOptions, PostgresStore};

mailroom_conformance::suite!(async {
    let url = mailroom_testkit::fresh_postgres_db().await;
    let mut opts = PostgresOptions::from_url(&url).unwrap();
    opts.pool_size = 8;
    let store = PostgresStore::connect(opts).await.unwrap();
    store.migrate().await.unwrap();
    std::sync::Arc::new(store)
});
