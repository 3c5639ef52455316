//! Read deadlines: a sender trickling one byte per second is cut off, while
//! other requests are served normally.

use super::support::{Gate, Server, start};
use mailroom::{SourceSpec, TopicSpec};
use mailroom_server::ServerOptions;
use mailroom_server::shedding::Limits;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

async fn server() -> Server {
    start(
        |_| {},
        |b| {
            b.topic(TopicSpec::new("t"))
                .source(SourceSpec::new("src", "t"))
        },
        ServerOptions {
            limits: Limits {
                header_read_timeout: Duration::from_secs(1),
                body_read_timeout: Duration::from_secs(1),
                ..Limits::default()
            },
            ..ServerOptions::default()
        },
    )
    .await
}

/// Writes `head` at once, then `trickle` one byte per second, while reading;
/// returns what the server sent and when it closed the connection.
async fn slow_send(s: &Server, head: &str, trickle: &[u8]) -> (String, Duration) {
    let started = Instant::now();
    let stream = TcpStream::connect(s.addr).await.expect("connect");
    let (mut rd, mut wr) = stream.into_split();
    wr.write_all(head.as_bytes()).await.expect("write head");
    let trickle = trickle.to_vec();
    let writer = tokio::spawn(async move {
        for b in trickle {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if wr.write_all(&[b]).await.is_err() {
                break;
            }
        }
        // Keep the write half open so only the server can end the exchange.
        tokio::time::sleep(Duration::from_secs(30)).await;
    });
    let mut got = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(10), async {
        let mut buf = [0u8; 1024];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => got.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    writer.abort();
    assert!(read.is_ok(), "the server never closed the slow connection");
    (
        String::from_utf8_lossy(&got).into_owned(),
        started.elapsed(),
    )
}

/// Checks that a normal request is served quickly while a slow one is held.
async fn served_meanwhile(s: &Server, id: &str) {
    tokio::time::sleep(Duration::from_millis(300)).await;
    let t = Instant::now();
    let resp = s.webhook("src", &[("webhook-id", id)], "{}").await;
    assert_eq!(resp.status(), 200);
    assert!(t.elapsed() < Duration::from_secs(1), "{:?}", t.elapsed());
}

/// Headers sent at one byte per second: the connection is closed by the
/// header read timeout (1 s here) long before the headers could finish, and
/// a normal request is served meanwhile.
#[tokio::test]
async fn a_slow_header_sender_is_cut_off() {
    let s = server().await;
    let head = "POST /webhooks/src HTTP/1.1\r\nhost: localhost\r\n";
    let trickle = b"x-slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let (slow, ()) = tokio::join!(slow_send(&s, head, trickle), served_meanwhile(&s, "n1"));
    let (answer, took) = slow;
    assert!(took < Duration::from_secs(5), "closed after {took:?}");
    assert!(!answer.contains(" 200 "), "{answer}");
    assert!(s.stored("t").await.iter().all(|e| e.dedup_key == "n1"));
}

/// A body sent at one byte per second: 408 problem+json once the body
/// deadline (1 s here) passes, nothing stored from it, and a normal request
/// is served meanwhile.
#[tokio::test]
async fn a_slow_body_sender_gets_408() {
    let s = server().await;
    let head = "POST /webhooks/src HTTP/1.1\r\nhost: localhost\r\nwebhook-id: slow\r\ncontent-length: 40\r\n\r\n{";
    let trickle = [b' '; 39];
    let (slow, ()) = tokio::join!(slow_send(&s, head, &trickle), served_meanwhile(&s, "n2"));
    let (answer, took) = slow;
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("application/problem+json"), "{answer}");
    assert!(took < Duration::from_secs(5), "answered after {took:?}");
    let stored = s.stored("t").await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].dedup_key, "n2");
}

/// A request that never ends (its insert held at a gate: the view of a
/// client stalled mid-body, or one that never reads its answer) does not
/// hold the shutdown: after `shutdown_grace` its connection is closed, and
/// its sender, answered nothing, sees an error (so it retries).
#[tokio::test]
async fn a_request_that_never_ends_does_not_hold_the_shutdown() {
    let gate = Arc::new(Gate::default());
    let s = start(
        |w| w.gate = Some(gate.clone()),
        |b| {
            b.topic(TopicSpec::new("t"))
                .source(SourceSpec::new("src", "t"))
        },
        ServerOptions {
            limits: Limits {
                shutdown_grace: Duration::from_secs(1),
                ..Limits::default()
            },
            ..ServerOptions::default()
        },
    )
    .await;
    let (http, url) = (s.http.clone(), s.url("/webhooks/src"));
    let held = tokio::spawn(async move {
        http.post(url)
            .header("webhook-id", "held")
            .body("{}")
            .send()
            .await
    });
    tokio::time::timeout(Duration::from_secs(10), gate.entered.notified())
        .await
        .expect("the insert reaches the gate");
    let took = s.stop().await;
    assert!(took < Duration::from_secs(4), "the shutdown took {took:?}");
    let answer = held.await.expect("client task");
    assert!(answer.is_err(), "the held request was answered: {answer:?}");
    gate.open();
}
