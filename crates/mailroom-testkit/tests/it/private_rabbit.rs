//! `PrivateRabbit`: a node of the test's own, that stops and starts again on
//! the same port, and is gone after drop.

use mailroom_testkit::PrivateRabbit;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The node's `127.0.0.1:<port>`.
fn addr(url: &str) -> String {
    let rest = url.split_once('@').map_or(url, |(_, r)| r);
    rest.split('/').next().expect("host:port").to_string()
}

/// True if something on `addr` answers the AMQP 0-9-1 protocol header with
/// a method frame (`connection.start`).
fn speaks_amqp(addr: &str) -> bool {
    let Ok(mut s) = TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut first = [0u8; 1];
    s.write_all(b"AMQP\x00\x00\x09\x01").is_ok()
        && s.read_exact(&mut first).is_ok()
        && first[0] == 1
}

#[test]
fn private_node_stops_starts_on_the_same_port_and_is_removed_on_drop() {
    let rabbit = PrivateRabbit::start();
    let addr = addr(rabbit.url());
    assert!(speaks_amqp(&addr), "the new node does not answer on {addr}");
    rabbit.stop();
    assert!(!speaks_amqp(&addr), "a stopped node answered");
    rabbit.start_again();
    assert!(speaks_amqp(&addr), "the node did not come back on {addr}");
    drop(rabbit);
    assert!(!speaks_amqp(&addr), "the node outlived its drop");
}
