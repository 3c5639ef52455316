//! Test helpers for mailroom's integration tests against real servers.
//!
//! `./scripts/test.sh` (or `scripts/services.sh up`) starts a throwaway
//! PostgreSQL 15 and a private RabbitMQ node and exports:
//!
//! * [`POSTGRES_URL_VAR`] = `postgres://postgres@127.0.0.1:<port>/postgres`
//!   (a superuser, so tests may `CREATE DATABASE`);
//! * [`AMQP_URL_VAR`] = `amqp://guest:guest@127.0.0.1:<port>/%2f`;
//! * [`POSTGRES_TLS_URL_VAR`] = `postgres://postgres@localhost:<port>/postgres`,
//!   a second PostgreSQL that accepts only TLS (its certificate and CA in
//!   [`TLS_DIR_VAR`]; the role `mailroom` logs in with `client.pem`);
//! * [`PGBOUNCER_URL_VAR`] = `postgres://postgres@127.0.0.1:<port>/postgres`,
//!   PgBouncer in transaction mode in front of the first PostgreSQL, passing
//!   every database name through ([`pgbouncer_url`]).
//!
//! Both helpers **panic** when their variable is missing: a test that needs
//! a server must fail, never silently skip, when the server is not there.
//!
//! A test that must stop or crash-restart PostgreSQL uses a
//! [`PrivatePostgres`] cluster of its own instead, never the shared server;
//! one that must stop and start RabbitMQ uses a [`PrivateRabbit`] node.
//! A test of a frozen network (packets held or dropped, connections left
//! open) puts a [`FreezeProxy`] between the client and the server.
//!
//! A test of a real `mailroom` process uses the [`harness`]: the process
//! itself, a recording handler endpoint, and the checker of what it did.
//!
//! ```no_run
//! # async fn demo() {
//! let url = mailroom_testkit::fresh_postgres_db().await;
//! // connect your store to `url`: an empty database nobody else uses
//! let amqp = mailroom_testkit::amqp_url();
//! # let _ = (url, amqp);
//! # }
//! ```

use sqlx::Connection as _;

mod freeze;
pub mod harness;
mod private_pg;
mod private_rabbit;
pub use freeze::{Freeze, FreezeProxy};
pub use private_pg::PrivatePostgres;
pub use private_rabbit::PrivateRabbit;

/// Environment variable holding the admin URL of the test PostgreSQL server.
pub const POSTGRES_URL_VAR: &str = "MAILROOM_TEST_POSTGRES_URL";
/// Environment variable holding the URL of the test RabbitMQ broker.
pub const AMQP_URL_VAR: &str = "MAILROOM_TEST_AMQP_URL";
/// Environment variable holding the admin URL (no `sslmode`) of the test
/// PostgreSQL server that accepts only TLS connections.
pub const POSTGRES_TLS_URL_VAR: &str = "MAILROOM_TEST_POSTGRES_TLS_URL";
/// Environment variable naming the directory of the test CA and
/// certificates (`ca.pem`, `other-ca.pem`, `server.pem`/`.key`,
/// `expired.pem`/`.key`, `client.pem`/`.key`).
pub const TLS_DIR_VAR: &str = "MAILROOM_TEST_TLS_DIR";
/// Environment variable holding the URL of the test PgBouncer
/// (transaction mode, in front of the test PostgreSQL server).
pub const PGBOUNCER_URL_VAR: &str = "MAILROOM_TEST_PGBOUNCER_URL";

fn required_env(var: &str) -> String {
    match std::env::var(var) {
        Ok(v) if !v.trim().is_empty() => v,
        _ => panic!(
            "{var} is not set: this test needs a real server. \
             Run the tests with ./scripts/test.sh (it starts PostgreSQL and RabbitMQ \
             and exports {POSTGRES_URL_VAR} / {AMQP_URL_VAR}), or start them with \
             `scripts/services.sh up` and `eval \"$(scripts/services.sh env)\"`."
        ),
    }
}

/// The admin URL of the test PostgreSQL server (`MAILROOM_TEST_POSTGRES_URL`).
///
/// # Panics
/// If the variable is not set.
pub fn postgres_admin_url() -> String {
    required_env(POSTGRES_URL_VAR)
}

/// The URL of the test RabbitMQ broker (`MAILROOM_TEST_AMQP_URL`).
///
/// # Panics
/// If the variable is not set.
pub fn amqp_url() -> String {
    required_env(AMQP_URL_VAR)
}

/// Environment variable holding the test broker's TLS URL.
pub const AMQPS_URL_VAR: &str = "MAILROOM_TEST_AMQPS_URL";

/// The test broker's TLS listener (`MAILROOM_TEST_AMQPS_URL`,
/// `amqps://guest:guest@localhost:<port>/%2f`): its certificate is
/// `server.pem` of [`tls_dir`], signed by `ca.pem`.
///
/// # Panics
/// If the variable is not set.
pub fn amqps_url() -> String {
    required_env(AMQPS_URL_VAR)
}

/// The admin URL of the TLS-only test PostgreSQL server
/// (`MAILROOM_TEST_POSTGRES_TLS_URL`), without TLS parameters: add them.
///
/// # Panics
/// If the variable is not set.
pub fn postgres_tls_admin_url() -> String {
    required_env(POSTGRES_TLS_URL_VAR)
}

/// The directory of the test CA and certificates (`MAILROOM_TEST_TLS_DIR`).
///
/// # Panics
/// If the variable is not set.
pub fn tls_dir() -> std::path::PathBuf {
    required_env(TLS_DIR_VAR).into()
}

/// `url` with `params` (`name=value&...`) appended to its query string.
pub fn with_params(url: &str, params: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{params}")
}

/// Like [`fresh_postgres_db`], on the TLS-only server: a new database and
/// its URL with `sslmode=verify-full&sslrootcert=<tls dir>/ca.pem`.
///
/// # Panics
/// If `MAILROOM_TEST_POSTGRES_TLS_URL` or `MAILROOM_TEST_TLS_DIR` is not
/// set, or the server cannot be reached, or `CREATE DATABASE` fails.
pub async fn fresh_postgres_tls_db() -> String {
    let ca = tls_dir().join("ca.pem");
    let admin = with_params(
        &postgres_tls_admin_url(),
        &format!("sslmode=verify-full&sslrootcert={}", ca.display()),
    );
    create_db(&admin).await
}

/// The database of `db_url` (a [`fresh_postgres_db`]) reached through the
/// test PgBouncer in transaction mode (`MAILROOM_TEST_PGBOUNCER_URL`).
///
/// # Panics
/// If the variable is not set.
pub fn pgbouncer_url(db_url: &str) -> String {
    let bouncer = required_env(PGBOUNCER_URL_VAR);
    let server = bouncer
        .rsplit_once('/')
        .map_or(bouncer.as_str(), |(s, _)| s);
    let database = db_url.rsplit('/').next().unwrap_or("postgres");
    format!("{server}/{database}")
}

/// Creates a new, empty, uniquely named database on the test PostgreSQL
/// server and returns its URL. Databases are not dropped: the server is
/// thrown away at the end of the run.
///
/// # Panics
/// If `MAILROOM_TEST_POSTGRES_URL` is not set, or the server cannot be
/// reached, or `CREATE DATABASE` fails.
pub async fn fresh_postgres_db() -> String {
    create_db(&postgres_admin_url()).await
}

/// A new database on the server `admin` names; its URL.
async fn create_db(admin: &str) -> String {
    let name = format!("mailroom_test_{}", uuid::Uuid::now_v7().simple());
    let mut conn = sqlx::PgConnection::connect(admin)
        .await
        .unwrap_or_else(|e| panic!("connecting to {admin}: {e}"));
    // The name is ours (prefix + hex), so quoting is enough.
    sqlx::raw_sql(sqlx::AssertSqlSafe(format!("CREATE DATABASE \"{name}\"")))
        .execute(&mut conn)
        .await
        .unwrap_or_else(|e| panic!("CREATE DATABASE {name} on {admin}: {e}"));
    // Closing is best effort; the database already exists.
    let _ = conn.close().await;
    with_database(admin, &name)
}

/// `url` with its database (path) replaced by `db`, keeping any query string.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let authority_start = base.find("://").map_or(0, |i| i + 3);
    let path_start = base[authority_start..]
        .find('/')
        .map_or(base.len(), |i| authority_start + i);
    let mut out = format!("{}/{db}", &base[..path_start]);
    if let Some(q) = query {
        out.push('?');
        out.push_str(q);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{required_env, with_database};

    #[test]
    #[should_panic(expected = "MAILROOM_TEST_NEVER_SET_BY_ANYONE is not set")]
    fn missing_env_panics_instead_of_skipping() {
        let _ = required_env("MAILROOM_TEST_NEVER_SET_BY_ANYONE");
    }

    #[test]
    fn replaces_database_in_url() {
        assert_eq!(
            with_database("postgres://postgres@127.0.0.1:5432/postgres", "x"),
            "postgres://postgres@127.0.0.1:5432/x"
        );
        assert_eq!(
            with_database("postgres://u:p@h:1/postgres?sslmode=disable", "x"),
            "postgres://u:p@h:1/x?sslmode=disable"
        );
        assert_eq!(with_database("postgres://h:1", "x"), "postgres://h:1/x");
    }
}
