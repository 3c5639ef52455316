//! `PrivatePostgres`: a cluster of the test's own, that survives a
//! crash-restart and a stop/start, and is deleted on drop.

use mailroom_testkit::PrivatePostgres;
use sqlx::Connection as _;

async fn select_one(url: &str) -> i32 {
    let mut conn = sqlx::PgConnection::connect(url).await.expect("connect");
    let one: i32 = sqlx::query_scalar("SELECT 1")
        .fetch_one(&mut conn)
        .await
        .expect("SELECT 1");
    let _ = conn.close().await;
    one
}

#[tokio::test]
async fn private_cluster_restarts_and_is_removed_on_drop() {
    let pg = tokio::task::spawn_blocking(PrivatePostgres::start)
        .await
        .expect("start");
    let url = pg.url().to_owned();
    let data_dir = pg.data_dir().to_owned();
    assert_eq!(select_one(&url).await, 1);

    let pg = tokio::task::spawn_blocking(move || {
        pg.restart_immediate();
        pg
    })
    .await
    .expect("restart");
    assert_eq!(select_one(&url).await, 1);

    let pg = tokio::task::spawn_blocking(move || {
        pg.stop_immediate();
        pg
    })
    .await
    .expect("stop");
    assert!(
        sqlx::PgConnection::connect(&url).await.is_err(),
        "connected to a stopped server"
    );
    let pg = tokio::task::spawn_blocking(move || {
        pg.start_again();
        pg
    })
    .await
    .expect("start again");
    assert_eq!(select_one(&url).await, 1);

    tokio::task::spawn_blocking(move || drop(pg))
        .await
        .expect("drop");
    assert!(!data_dir.exists(), "{} left behind", data_dir.display());
    assert!(sqlx::PgConnection::connect(&url).await.is_err());
}
