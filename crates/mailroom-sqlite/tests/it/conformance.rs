//! The shared conformance suite, run against SQLite: every test gets a fresh
//! database file in its own temporary directory.
#![allow(clippy::unwrap_used)]

use mailroom_core::Store;
use mailroom_sqlite::{SqliteOptions, SqliteStore};

mailroom_conformance::suite!(async {
    let dir = tempfile::tempdir().unwrap();
    let store = SqliteStore::open(SqliteOptions::new(dir.path().join("mailroom.db"))).unwrap();
    store.migrate().await.unwrap();
    (store, dir)
});
