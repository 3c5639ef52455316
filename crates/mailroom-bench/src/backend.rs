//! Where a run stores its events: a SQLite file in a temporary directory, or
//! a fresh PostgreSQL database created for the run (`CREATE DATABASE` on the
//! server of `--store`) and dropped afterwards.

use crate::procfs;
use anyhow::{Context, bail};
use mailroom::Store;
use mailroom::redact::url as redact;
use mailroom_postgres::{PostgresOptions, PostgresStore};
use mailroom_sqlite::{SqliteOptions, SqliteStore};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// What `--store` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Backend {
    /// A SQLite file in a fresh temporary directory.
    Sqlite,
    /// A fresh database on the PostgreSQL server of this URL (whose own
    /// database is only used to create and drop it).
    Postgres {
        /// The server's URL (a role with CREATEDB).
        admin_url: String,
    },
}

impl Backend {
    /// Reads `--store`: `sqlite` or a PostgreSQL URL.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s == "sqlite" {
            Ok(Self::Sqlite)
        } else if s.starts_with("postgres:") || s.starts_with("postgresql:") {
            database_name(s)?;
            Ok(Self::Postgres {
                admin_url: s.to_owned(),
            })
        } else {
            Err(format!(
                "expected `sqlite` or postgres://user@host:port/db, got {:?}",
                redact(s)
            ))
        }
    }

    /// `sqlite` or `postgres`, for reports.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Sqlite => "sqlite",
            Self::Postgres { .. } => "postgres",
        }
    }

    /// Creates the fresh store for one run.
    pub async fn fresh(&self) -> anyhow::Result<Fresh> {
        match self {
            Self::Sqlite => {
                let dir = tempfile::tempdir().context("creating a temporary directory")?;
                let path = dir.path().join("mailroom.db");
                Ok(Fresh {
                    url: format!("sqlite://{}", path.display()),
                    kind: FreshKind::Sqlite { _dir: dir },
                })
            }
            Self::Postgres { admin_url } => {
                static SEQ: AtomicU64 = AtomicU64::new(0);
                let name = format!("{}{}", own_prefix(), SEQ.fetch_add(1, Ordering::Relaxed));
                let mut admin = PgConnection::connect(admin_url)
                    .await
                    .with_context(|| format!("connecting to {}", redact(admin_url)))?;
                // `name` is ours: letters, digits and underscores.
                sqlx::query(sqlx::AssertSqlSafe(format!("CREATE DATABASE {name}")))
                    .execute(&mut admin)
                    .await
                    .with_context(|| format!("CREATE DATABASE {name}"))?;
                let _ = admin.close().await;
                Ok(Fresh {
                    url: with_database(admin_url, &name)?,
                    kind: FreshKind::Postgres {
                        admin_url: admin_url.clone(),
                        name,
                    },
                })
            }
        }
    }
}

/// One run's store: its URL, and what to clean up afterwards.
#[derive(Debug)]
pub struct Fresh {
    /// The store's URL (`sqlite://...` or `postgres://...`).
    pub url: String,
    kind: FreshKind,
}

#[derive(Debug)]
enum FreshKind {
    /// Removed with its SQLite file when dropped.
    Sqlite {
        _dir: tempfile::TempDir,
    },
    Postgres {
        admin_url: String,
        name: String,
    },
}

impl Fresh {
    /// Whether it is a PostgreSQL database.
    pub fn is_postgres(&self) -> bool {
        matches!(self.kind, FreshKind::Postgres { .. })
    }

    /// Opens one mailroom instance's store on it (each call: its own
    /// connections, writer and, on PostgreSQL, its own pool and listener).
    pub async fn open(&self, group_commit: bool) -> anyhow::Result<Opened> {
        open_url(&self.url, group_commit).await
    }

    /// Server-side counters of the database (PostgreSQL only): committed
    /// transactions and rows fetched/updated, from `pg_stat_database`.
    pub async fn server_stats(&self) -> Option<ServerStats> {
        let FreshKind::Postgres { name, .. } = &self.kind else {
            return None;
        };
        let mut c = PgConnection::connect(&self.url).await.ok()?;
        // Counters are flushed by each backend at most once a second.
        let _ = sqlx::query("SELECT pg_stat_force_next_flush()")
            .execute(&mut c)
            .await;
        let row: (i64, i64) = sqlx::query_as(
            "SELECT xact_commit, tup_updated FROM pg_stat_database WHERE datname = $1",
        )
        .bind(name)
        .fetch_one(&mut c)
        .await
        .ok()?;
        let _ = c.close().await;
        Some(ServerStats {
            xact_commit: u64::try_from(row.0).unwrap_or(0),
            tup_updated: u64::try_from(row.1).unwrap_or(0),
        })
    }

    /// Drops the PostgreSQL database (the SQLite directory goes with `self`).
    pub async fn cleanup(self) -> anyhow::Result<()> {
        if let FreshKind::Postgres { admin_url, name } = &self.kind {
            let mut admin = PgConnection::connect(admin_url).await?;
            sqlx::query(sqlx::AssertSqlSafe(format!(
                "DROP DATABASE IF EXISTS {name} WITH (FORCE)"
            )))
            .execute(&mut admin)
            .await
            .with_context(|| format!("DROP DATABASE {name}"))?;
            let _ = admin.close().await;
        }
        Ok(())
    }
}

/// Counters of one PostgreSQL database (`pg_stat_database`).
#[derive(Debug, Clone, Copy, Default)]
pub struct ServerStats {
    /// Transactions committed.
    pub xact_commit: u64,
    /// Rows updated.
    pub tup_updated: u64,
}

impl ServerStats {
    /// The counts since `before`.
    pub fn since(self, before: Self) -> Self {
        Self {
            xact_commit: self.xact_commit.saturating_sub(before.xact_commit),
            tup_updated: self.tup_updated.saturating_sub(before.tup_updated),
        }
    }
}

/// An opened store, with the backend's own commit counter.
#[derive(Debug, Clone)]
pub enum Opened {
    /// A SQLite store.
    Sqlite(SqliteStore),
    /// A PostgreSQL store.
    Postgres(PostgresStore),
}

impl Opened {
    /// The opened store.
    pub fn store(&self) -> Arc<dyn Store> {
        match self {
            Self::Sqlite(s) => Arc::new(s.clone()),
            Self::Postgres(s) => Arc::new(s.clone()),
        }
    }

    /// Closes a PostgreSQL pool (its backends exit, which also flushes
    /// their statistics to `pg_stat_database`).
    pub async fn close(&self) {
        if let Self::Postgres(s) = self {
            s.pool().close().await;
        }
    }

    /// SQLite: every write transaction of the writer thread. PostgreSQL: the
    /// insert writer's transactions only (claims and completions are counted
    /// by [`Fresh::server_stats`]).
    pub fn commits(&self) -> u64 {
        match self {
            Self::Sqlite(s) => s.commits(),
            Self::Postgres(s) => s.commits(),
        }
    }
}

/// Opens `sqlite://FILE` or `postgres://...` (the child `__serve` uses this).
pub async fn open_url(url: &str, group_commit: bool) -> anyhow::Result<Opened> {
    if url.starts_with("sqlite:") {
        let mut opts = SqliteOptions::from_url(url)?;
        opts.group_commit = group_commit;
        Ok(Opened::Sqlite(
            SqliteStore::open(opts).context("opening the SQLite store")?,
        ))
    } else {
        let mut opts = PostgresOptions::from_url(url)?;
        opts.group_commit = group_commit;
        Ok(Opened::Postgres(
            PostgresStore::connect(opts)
                .await
                .context("connecting to PostgreSQL")?,
        ))
    }
}

/// Events stored for `topic`, read through a short-lived connection.
pub async fn count_events(url: &str, topic: &str) -> anyhow::Result<u64> {
    let stats = if url.starts_with("sqlite:") {
        let store = SqliteStore::open(SqliteOptions::from_url(url)?)?;
        Store::stats(&store).await?
    } else {
        let mut opts = PostgresOptions::from_url(url)?;
        opts.listen = false;
        let store = PostgresStore::connect(opts).await?;
        Store::stats(&store).await?
    };
    Ok(stats
        .iter()
        .filter(|t| t.topic == topic)
        .flat_map(|t| t.counts.values())
        .sum())
}

/// Checks that the server of `admin_url` answers (before a long run).
pub async fn ping(admin_url: &str) -> anyhow::Result<String> {
    let pool = PgPoolOptions::new()
        .max_connections(1)
        .acquire_timeout(Duration::from_secs(5))
        .connect(admin_url)
        .await
        .with_context(|| format!("connecting to {}", redact(admin_url)))?;
    let v: String = sqlx::query_scalar("SHOW server_version")
        .fetch_one(&pool)
        .await?;
    pool.close().await;
    Ok(v)
}

/// The database name in a postgres URL's path.
fn database_name(url: &str) -> Result<String, String> {
    let rest = url
        .split_once("://")
        .map(|(_, r)| r)
        .ok_or_else(|| format!("{:?} is not a URL", redact(url)))?;
    let rest = rest.split(['?', '#']).next().unwrap_or_default();
    Ok(rest
        .split_once('/')
        .map(|(_, db)| db.to_owned())
        .unwrap_or_default())
}

/// `url` with its database replaced by `db` (query string kept).
pub fn with_database(url: &str, db: &str) -> anyhow::Result<String> {
    let Some((scheme, rest)) = url.split_once("://") else {
        bail!("{:?} is not a URL", redact(url));
    };
    let (before_query, query) = match rest.find('?') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    let authority = before_query.split('/').next().unwrap_or_default();
    Ok(format!("{scheme}://{authority}/{db}{query}"))
}

/// The prefix of every database this process creates.
fn own_prefix() -> String {
    format!("mailroom_bench_{}_", std::process::id())
}

/// CPU time so far of the PostgreSQL server processes of this machine that
/// work for this benchmark, by kind: client backends connected to one of its
/// databases ("pg backends"), and the server's shared processes (postmaster,
/// WAL writer, checkpointer...; shared with whoever else uses the server).
/// Backends of other databases are left out. Benchmarks run next to the
/// database, so this is its share of the cores.
pub fn postgres_cpu() -> BTreeMap<String, Duration> {
    let mut out = BTreeMap::new();
    for p in postgres_processes() {
        if let Some(kind) = p.kind {
            *out.entry(kind).or_insert(Duration::ZERO) += p.cpu;
        }
    }
    out
}

/// One PostgreSQL server process of [`postgres_processes`].
#[derive(Debug, Clone)]
pub struct PgProcess {
    /// The process id.
    pub pid: u32,
    /// What it is (see [`postgres_cpu`]); `None` for another database's
    /// backend, or a child process that has not set its title yet.
    pub kind: Option<String>,
    /// CPU time so far.
    pub cpu: Duration,
}

/// The PostgreSQL server processes of this machine, each with what it is
/// and its CPU time so far.
pub fn postgres_processes() -> Vec<PgProcess> {
    let prefix = own_prefix();
    let mut out = Vec::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for entry in dir.flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(comm) = std::fs::read_to_string(format!("/proc/{pid}/comm")) else {
            continue;
        };
        if !comm.starts_with("postgres") {
            continue;
        }
        // The command line says what the process is ("postgres: walwriter",
        // "postgres: postgres db 127.0.0.1(1234) idle").
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let cmdline = String::from_utf8_lossy(&cmdline).replace('\0', " ");
        let mut kind = postgres_kind(cmdline.trim(), &prefix);
        // A child forked a moment ago still has the postmaster's command
        // line: the postmaster is the one whose parent is not PostgreSQL.
        if kind.as_deref() == Some("postmaster")
            && procfs::parent_comm(pid).is_some_and(|c| c.starts_with("postgres"))
        {
            kind = None;
        }
        if let Some(cpu) = procfs::process_cpu(&pid.to_string()) {
            out.push(PgProcess { pid, kind, cpu });
        }
    }
    out
}

/// What a PostgreSQL process is; `None` for other databases' backends.
fn postgres_kind(cmdline: &str, own_prefix: &str) -> Option<String> {
    let Some(rest) = cmdline.strip_prefix("postgres: ") else {
        return Some("postmaster".into());
    };
    // "postgres: USER DB HOST(PORT) STATE" for client backends.
    let words: Vec<&str> = rest.split_whitespace().collect();
    // "postgres: autovacuum worker DB": vacuuming this benchmark's tables is
    // part of its work; other databases' is not.
    if let Some(db) = rest.strip_prefix("autovacuum worker ") {
        return db
            .trim()
            .starts_with(own_prefix)
            .then(|| "pg autovacuum".into());
    }
    if words.len() >= 3 && words[2].contains('(') {
        return words[1]
            .starts_with(own_prefix)
            .then(|| "pg backends".into());
    }
    Some(format!("pg {rest}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_urls() {
        assert_eq!(Backend::parse("sqlite"), Ok(Backend::Sqlite));
        assert!(Backend::parse("mysql://x").is_err());
        assert_eq!(
            with_database("postgres://u:p@h:5432/postgres?sslmode=disable", "b1").unwrap(),
            "postgres://u:p@h:5432/b1?sslmode=disable"
        );
        assert_eq!(
            with_database("postgres://h", "b1").unwrap(),
            "postgres://h/b1"
        );
        assert_eq!(
            postgres_kind("postgres: walwriter", "b_").as_deref(),
            Some("pg walwriter")
        );
        assert_eq!(
            postgres_kind("postgres: postgres b_1 127.0.0.1(5555) idle", "b_").as_deref(),
            Some("pg backends")
        );
        assert_eq!(
            postgres_kind("postgres: postgres other 127.0.0.1(5555) idle", "b_"),
            None
        );
        assert_eq!(
            postgres_kind("postgres: autovacuum worker b_1", "b_").as_deref(),
            Some("pg autovacuum")
        );
        assert_eq!(
            postgres_kind("postgres: autovacuum worker other", "b_"),
            None
        );
    }
}
