//! [`FreezeProxy`]: a TCP proxy between a client and a server that can
//! freeze the traffic the way a dead NAT or a failed-over load balancer
//! does, leaving every connection open and sending no RST:
//!
//! - [`Freeze::Hold`]: nothing is read or written on either side; bytes
//!   wait in the kernels' buffers and flow again, late, after
//!   [`FreezeProxy::heal`] (packets held, TCP retransmitting until the path
//!   is back). New connections are accepted and wait for the heal.
//! - [`Freeze::Drop`]: every byte of every connection open during the
//!   freeze is swallowed, for good: after the heal those connections stay
//!   open and silent (a NAT mapping or a balancer's connection table that
//!   is gone). Connections opened after the heal work.
//!
//! A client sees no error in either case: only its own time limits end
//! its waits. Connections opened while the traffic is dropped are dead too.

use std::io;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;

/// What the proxy does with the traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Freeze {
    /// Forwards both ways.
    Open,
    /// Holds every byte until the heal.
    Hold,
    /// Swallows every byte; the connections open now never carry data again.
    Drop,
}

/// A proxy on a free loopback port to `upstream`; stops (closing every
/// connection) when dropped.
#[derive(Debug)]
pub struct FreezeProxy {
    addr: SocketAddr,
    mode: watch::Sender<Freeze>,
    task: tokio::task::JoinHandle<()>,
}

impl FreezeProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards to `upstream`
    /// (`host:port`).
    pub async fn start(upstream: &str) -> io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (mode, watching) = watch::channel(Freeze::Open);
        let task = tokio::spawn(accept(listener, upstream.to_owned(), watching));
        Ok(Self { addr, mode, task })
    }

    /// The port clients connect to.
    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// `url` with its `host:port` (after `@`, or after `://` when there is
    /// no user) replaced by this proxy's address.
    pub fn url_for(&self, url: &str) -> String {
        let Some((scheme, rest)) = url.split_once("://") else {
            return url.to_owned();
        };
        let (user, host_on) = match rest.rfind('@') {
            Some(at) => (&rest[..=at], &rest[at + 1..]),
            None => ("", rest),
        };
        let tail = host_on.find(['/', '?']).map_or("", |i| &host_on[i..]);
        format!("{scheme}://{user}{}{tail}", self.addr)
    }

    /// Freezes the traffic (`Hold` or `Drop`), or heals it (`Open`).
    pub fn set(&self, mode: Freeze) {
        self.mode.send_replace(mode);
    }

    /// Lets traffic flow again: held bytes are delivered; connections that
    /// saw a `Drop` stay dead.
    pub fn heal(&self) {
        self.set(Freeze::Open);
    }
}

impl Drop for FreezeProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn accept(listener: TcpListener, upstream: String, mode: watch::Receiver<Freeze>) {
    // Aborted with the accept task, the connections end with the proxy.
    let mut connections = JoinSet::new();
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let _ = client.set_nodelay(true);
        connections.spawn(connection(client, upstream.clone(), mode.clone()));
        while connections.try_join_next().is_some() {}
    }
}

/// One client connection: waits out a hold, connects upstream, then pumps
/// both ways until either side closes.
async fn connection(client: TcpStream, upstream: String, mut mode: watch::Receiver<Freeze>) {
    let dead = Arc::new(AtomicBool::new(false));
    let (client_rx, client_tx) = client.into_split();
    loop {
        let now = *mode.borrow_and_update();
        match now {
            Freeze::Open => break,
            Freeze::Drop => {
                dead.store(true, Ordering::SeqCst);
                break;
            }
            Freeze::Hold => {}
        }
        if mode.changed().await.is_err() {
            return;
        }
    }
    if dead.load(Ordering::SeqCst) {
        // Swallows the client's bytes and never answers.
        swallow(client_rx).await;
        let _keep_open = client_tx;
        std::future::pending::<()>().await;
        return;
    }
    let Ok(server) = TcpStream::connect(&upstream).await else {
        return;
    };
    let _ = server.set_nodelay(true);
    let (server_rx, server_tx) = server.into_split();
    let up = pump(client_rx, server_tx, mode.clone(), dead.clone());
    let down = pump(server_rx, client_tx, mode, dead);
    tokio::join!(up, down);
}

/// Reads `from` until it closes, discarding everything.
async fn swallow(mut from: OwnedReadHalf) {
    let mut buf = vec![0u8; 16 * 1024];
    while matches!(from.read(&mut buf).await, Ok(n) if n > 0) {}
}

/// Copies `from` to `to` while the proxy is open; waits while it holds;
/// swallows for good once it dropped. At the end of `from`, closes `to`
/// (unless the connection is dead: a dead path passes no FIN either).
async fn pump(
    mut from: OwnedReadHalf,
    mut to: OwnedWriteHalf,
    mut mode: watch::Receiver<Freeze>,
    dead: Arc<AtomicBool>,
) {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if dead.load(Ordering::SeqCst) {
            swallow(from).await;
            let _keep_open = to;
            std::future::pending::<()>().await;
            return;
        }
        let now = *mode.borrow_and_update();
        match now {
            Freeze::Open => {}
            Freeze::Hold => {
                if mode.changed().await.is_err() {
                    return;
                }
                continue;
            }
            Freeze::Drop => {
                dead.store(true, Ordering::SeqCst);
                continue;
            }
        }
        let n = tokio::select! {
            read = from.read(&mut buf) => match read {
                Ok(n) if n > 0 => n,
                _ => {
                    let _ = to.shutdown().await;
                    return;
                }
            },
            _ = mode.changed() => continue,
        };
        // The mode may have changed during the read: what was read obeys it.
        loop {
            let now = *mode.borrow_and_update();
            match now {
                Freeze::Open => break,
                Freeze::Drop => {
                    dead.store(true, Ordering::SeqCst);
                    break;
                }
                Freeze::Hold => {
                    if mode.changed().await.is_err() {
                        return;
                    }
                }
            }
        }
        if dead.load(Ordering::SeqCst) {
            continue;
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buf).await {
                        if n == 0 || s.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        addr
    }

    async fn round_trip(s: &mut TcpStream, within: Duration) -> bool {
        let ask = async {
            s.write_all(b"ping").await.unwrap();
            let mut got = [0u8; 4];
            s.read_exact(&mut got).await.is_ok() && &got == b"ping"
        };
        tokio::time::timeout(within, ask).await.unwrap_or(false)
    }

    /// A hold delays the bytes of open connections until the heal; a drop
    /// kills the connections open during it for good, while new ones work
    /// after the heal; no connection is closed by either.
    #[tokio::test]
    async fn hold_delays_and_drop_kills_open_connections_without_closing_them() {
        let proxy = FreezeProxy::start(&echo().await.to_string()).await.unwrap();
        let at = format!("127.0.0.1:{}", proxy.port());
        let mut held = TcpStream::connect(&at).await.unwrap();
        assert!(round_trip(&mut held, Duration::from_secs(5)).await);

        proxy.set(Freeze::Hold);
        held.write_all(b"late").await.unwrap();
        let mut got = [0u8; 4];
        let read = tokio::time::timeout(Duration::from_millis(300), held.read_exact(&mut got));
        assert!(read.await.is_err(), "bytes flowed during a hold");
        proxy.heal();
        tokio::time::timeout(Duration::from_secs(5), held.read_exact(&mut got))
            .await
            .expect("held bytes were not delivered after the heal")
            .unwrap();
        assert_eq!(&got, b"late");

        proxy.set(Freeze::Drop);
        assert!(!round_trip(&mut held, Duration::from_millis(300)).await);
        proxy.heal();
        assert!(
            !round_trip(&mut held, Duration::from_millis(300)).await,
            "a dropped connection carried data after the heal"
        );
        let mut fresh = TcpStream::connect(&at).await.unwrap();
        assert!(round_trip(&mut fresh, Duration::from_secs(5)).await);
    }

    /// URLs are pointed at the proxy, keeping user, path and query.
    #[tokio::test]
    async fn urls_point_at_the_proxy() {
        let proxy = FreezeProxy::start("127.0.0.1:1").await.unwrap();
        let p = proxy.port();
        assert_eq!(
            proxy.url_for("postgres://u:pw@10.0.0.1:5432/db?sslmode=disable"),
            format!("postgres://u:pw@127.0.0.1:{p}/db?sslmode=disable")
        );
        assert_eq!(
            proxy.url_for("amqp://h:5672/%2f"),
            format!("amqp://127.0.0.1:{p}/%2f")
        );
    }
}
