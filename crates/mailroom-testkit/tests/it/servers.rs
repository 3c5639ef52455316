//! Proves the servers that ./scripts/test.sh provides are really there.
//! These tests fail (never skip) when the environment variables are missing.

use sqlx::Connection as _;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

#[tokio::test]
async fn postgres_fresh_database_answers_select_1() {
    let url = mailroom_testkit::fresh_postgres_db().await;
    let mut conn = sqlx::PgConnection::connect(&url)
        .await
        .expect("connect to the fresh database");
    let (one, db): (i32, String) = sqlx::query_as("SELECT 1, current_database()")
        .fetch_one(&mut conn)
        .await
        .expect("SELECT 1");
    assert_eq!(one, 1);
    assert!(db.starts_with("mailroom_test_"), "unexpected database {db}");
    conn.close().await.expect("close");
}

#[tokio::test]
async fn postgres_fresh_databases_are_distinct() {
    let a = mailroom_testkit::fresh_postgres_db().await;
    let b = mailroom_testkit::fresh_postgres_db().await;
    assert_ne!(a, b);
}

#[tokio::test]
async fn amqp_broker_answers_protocol_header_with_connection_start() {
    let url = mailroom_testkit::amqp_url();
    // amqp://user:pass@host:port/vhost -> host:port
    let authority = url
        .split_once("://")
        .map_or(url.as_str(), |(_, rest)| rest)
        .split('/')
        .next()
        .unwrap_or_default();
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    let mut stream = tokio::net::TcpStream::connect(host_port)
        .await
        .unwrap_or_else(|e| panic!("connect to AMQP broker at {host_port}: {e}"));
    stream
        .write_all(b"AMQP\x00\x00\x09\x01")
        .await
        .expect("send protocol header");
    // Frame header: type (1 = method), channel (u16), size (u32); then the
    // method payload starts with class id 10 (connection), method id 10 (start).
    let mut frame = [0u8; 11];
    tokio::time::timeout(
        std::time::Duration::from_secs(10),
        stream.read_exact(&mut frame),
    )
    .await
    .expect("broker answered within 10 s")
    .expect("read Connection.Start frame");
    assert_eq!(frame[0], 1, "expected a method frame, got {frame:?}");
    assert_eq!(u16::from_be_bytes([frame[1], frame[2]]), 0, "channel 0");
    assert_eq!(
        (
            u16::from_be_bytes([frame[7], frame[8]]),
            u16::from_be_bytes([frame[9], frame[10]])
        ),
        (10, 10),
        "expected Connection.Start (10, 10)"
    );
}
