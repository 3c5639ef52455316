//! [`PrivatePostgres`]: a throwaway PostgreSQL 15 cluster that one test owns
//! outright, so it may stop, crash-restart or break it without disturbing
//! the shared server of `./scripts/test.sh` that other tests use.
//!
//! It mirrors `scripts/lib/services.sh`: `initdb` (trust auth, superuser
//! `postgres`), `pg_ctl start` on a free loopback port with the unix socket
//! inside the data directory, `fsync` and `synchronous_commit` on. As root
//! the server runs as the `postgres` user (`runuser -u postgres --`), which
//! owns the data directory. Binaries come from `$MR_PG_BIN`, default
//! `/usr/lib/postgresql/15/bin` (scripts/test.sh installs them).
//!
//! The methods block (they run `pg_ctl` and wait for it): from async code
//! call them through `tokio::task::spawn_blocking`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

/// A PostgreSQL cluster of its own, stopped and deleted on drop.
#[derive(Debug)]
pub struct PrivatePostgres {
    root: PathBuf,
    data_dir: PathBuf,
    port: u16,
    url: String,
    as_root: bool,
}

fn pg_bin(name: &str) -> PathBuf {
    let dir = std::env::var("MR_PG_BIN").unwrap_or_else(|_| "/usr/lib/postgresql/15/bin".into());
    Path::new(&dir).join(name)
}

pub(crate) fn is_root() -> bool {
    Command::new("id")
        .arg("-u")
        .output()
        .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

/// A loopback port nobody listens on right now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free loopback port: {e}"))
}

fn describe(out: &Output) -> String {
    format!(
        "{}\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

impl PrivatePostgres {
    /// Creates and starts a new cluster; its URL is
    /// `postgres://postgres@127.0.0.1:<port>/postgres` (superuser, trust).
    ///
    /// # Panics
    /// If the PostgreSQL binaries are missing or the server does not start
    /// (the message carries the server log).
    pub fn start() -> Self {
        let as_root = is_root();
        // The `postgres` user must be able to reach the directory: not $TMPDIR
        // (which may be under /root) when we are root.
        let base = if as_root {
            PathBuf::from("/tmp")
        } else {
            std::env::temp_dir()
        };
        let root = base.join(format!(
            "mailroom-private-pg-{}",
            uuid::Uuid::now_v7().simple()
        ));
        let data_dir = root.join("data");
        std::fs::create_dir_all(&root)
            .unwrap_or_else(|e| panic!("creating {}: {e}", root.display()));
        let mut pg = Self {
            root,
            data_dir,
            port: 0,
            url: String::new(),
            as_root,
        };
        if as_root {
            let out = Command::new("chown")
                .arg("postgres:")
                .arg(&pg.root)
                .output()
                .unwrap_or_else(|e| panic!("chown: {e}"));
            assert!(out.status.success(), "chown postgres: {}", describe(&out));
        }
        pg.initdb();
        // A free port may be taken between our probe and the server's bind:
        // try a few.
        for attempt in 1..=3 {
            pg.port = free_port();
            match pg.pg_ctl_start() {
                Ok(()) => {
                    pg.url = format!("postgres://postgres@127.0.0.1:{}/postgres", pg.port);
                    return pg;
                }
                Err(e) if attempt == 3 => panic!("private PostgreSQL did not start: {e}"),
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
        unreachable!("the loop returns or panics")
    }

    /// A fresh cluster in the data directory: superuser `postgres`, trust
    /// authentication, UTF-8, no fsync of the initial files.
    fn initdb(&self) {
        let initdb = self.run(
            &pg_bin("initdb"),
            &[
                "-D".as_ref(),
                self.data_dir.as_os_str(),
                "-U".as_ref(),
                "postgres".as_ref(),
                "--auth=trust".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--locale=C.UTF-8".as_ref(),
                "--no-sync".as_ref(),
            ],
        );
        assert!(initdb.status.success(), "initdb: {}", describe(&initdb));
    }

    /// `postgres://postgres@127.0.0.1:<port>/postgres`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The cluster's data directory (also holds its unix socket and `server.log`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// `pg_ctl restart -m immediate`: every connection is cut at once, the
    /// server crash-recovers and listens again on the same port. Returns
    /// when it accepts connections.
    ///
    /// # Panics
    /// If the restart fails.
    pub fn restart_immediate(&self) {
        let out = self.pg_ctl(&["restart", "-m", "immediate"]);
        assert!(
            out.status.success(),
            "pg_ctl restart: {}\n{}",
            describe(&out),
            self.log_tail()
        );
    }

    /// `pg_ctl stop -m immediate`: the server is gone (connections cut, port
    /// closed) until [`start_again`](Self::start_again).
    ///
    /// # Panics
    /// If the stop fails.
    pub fn stop_immediate(&self) {
        let out = self.pg_ctl(&["stop", "-m", "immediate"]);
        assert!(out.status.success(), "pg_ctl stop: {}", describe(&out));
    }

    /// Starts the stopped server again on the same port and waits until it
    /// accepts connections.
    ///
    /// # Panics
    /// If it does not start.
    pub fn start_again(&self) {
        self.pg_ctl_start()
            .unwrap_or_else(|e| panic!("private PostgreSQL did not start again: {e}"));
    }

    fn pg_ctl_start(&self) -> Result<(), String> {
        let out = self.pg_ctl(&["start"]);
        if out.status.success() {
            Ok(())
        } else {
            Err(format!("{}\n{}", describe(&out), self.log_tail()))
        }
    }

    fn server_options(&self) -> String {
        format!(
            "-c listen_addresses=127.0.0.1 -p {} -c unix_socket_directories='{}' \
             -c fsync=on -c synchronous_commit=on -c max_connections=200 \
             -c log_min_messages=warning",
            self.port,
            self.data_dir.display()
        )
    }

    /// `pg_ctl <verb> -D data -l log -w -t 60 -o <options>`.
    fn pg_ctl(&self, verb: &[&str]) -> Output {
        let log = self.root.join("server.log");
        let opts = self.server_options();
        let mut args: Vec<&std::ffi::OsStr> = verb.iter().map(|v| v.as_ref()).collect();
        args.extend([
            "-D".as_ref(),
            self.data_dir.as_os_str(),
            "-l".as_ref(),
            log.as_os_str(),
            "-w".as_ref(),
            "-t".as_ref(),
            "60".as_ref(),
            "-o".as_ref(),
            opts.as_ref(),
        ]);
        self.run(&pg_bin("pg_ctl"), &args)
    }

    /// Runs `program args` (as `postgres` when we are root).
    fn run(&self, program: &Path, args: &[&std::ffi::OsStr]) -> Output {
        let mut cmd = if self.as_root {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(program);
            c
        } else {
            Command::new(program)
        };
        // The server must not inherit our stdout/stderr pipes (the test
        // harness would wait for them): pg_ctl -l sends its output to the log.
        cmd.args(args)
            .stdin(std::process::Stdio::null())
            .output()
            .unwrap_or_else(|e| panic!("running {}: {e}", program.display()))
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(self.root.join("server.log")).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        let from = lines.len().saturating_sub(40);
        format!("server.log (tail):\n{}", lines[from..].join("\n"))
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // Best effort: the server may already be stopped.
        if self.data_dir.join("postmaster.pid").exists() {
            let _ = self.pg_ctl(&["stop", "-m", "immediate"]);
        }
        let _ = std::fs::remove_dir_all(&self.root);
    }
}
