//! Several `mailroom serve` processes on one PostgreSQL database, one of
//! them `kill -9`ed twice under load: the guarantees hold
//! across instances — exactly one stored event per dedup key, at-least-once
//! delivery, one delivery of an event at a time, per-key order — as the
//! fault matrix's checker (`mailroom_testkit::harness::check`) judges them.

use crate::support::{self, Serve, rand_below, write_config};
use mailroom_testkit::harness::check::{self, Expect};
use mailroom_testkit::harness::{Ack, Outcome, Recorder, store};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Requests sent, duplicates included.
const REQUESTS: usize = 30_000;
/// Requests sent through PgBouncer: the same run, shorter (10,000 took
/// 169 s on a loaded 2-core machine, debug build).
const POOLED_REQUESTS: usize = 6_000;
/// Every `DUP_EVERY`-th request of a client repeats one of its earlier events.
const DUP_EVERY: usize = 10;
const CLIENTS: usize = 32;
/// Each client owns its keys, so a key's events arrive in counter order.
const KEYS_PER_CLIENT: usize = 8;
const INSTANCES: usize = 3;
/// The instance that is killed and restarted.
const VICTIM: usize = 2;
const KILLS: usize = 2;
/// The topic's lease, in seconds.
const LEASE_SECS: u64 = 3;

/// The instances' config; `direct_url` when their store URL is PgBouncer.
fn config(receiver: &str, direct_url: Option<&str>) -> String {
    let store = direct_url.map_or(String::new(), |d| {
        format!("[store]\ndirect_url = \"{d}\"\n")
    });
    format!(
        r#"
{store}
[[source]]
name = "load"
topic = "orders"
id = {{ json = "/id" }}

[[topic]]
name = "orders"
mode = "sequential"
key = "/k"
concurrency = 32
timeout = "2s"
lease = "{LEASE_SECS}s"
retry = {{ max_attempts = 50, base = "100ms", max_delay = "1s" }}
handler = {{ http = {{ url = "{receiver}" }} }}
"#
    )
}

/// What the clients saw.
#[derive(Debug, Default)]
struct Acks {
    /// dedup key → event id answered (always the same one).
    ids: HashMap<String, String>,
    /// dedup keys answered `"duplicate": false` (at most once each).
    fresh: HashSet<String>,
    /// Intentional repeats answered `"duplicate": true`.
    dup_answers: usize,
}

/// One event a client sent.
#[derive(Debug, Clone)]
struct Sent {
    /// Its dedup key.
    id: String,
    body: String,
    /// Its ordering key and its counter there.
    key: String,
    n: u64,
}

/// One client: sends its share of the requests round-robin over the
/// instances, each event retried (same id, same body) until answered 200;
/// every answer is recorded for the checker.
#[allow(clippy::too_many_arguments)]
async fn client(
    requests: usize,
    c: usize,
    http: reqwest::Client,
    urls: Arc<RwLock<Vec<String>>>,
    acks: Arc<Mutex<Acks>>,
    acked: Arc<AtomicUsize>,
    retries: Arc<AtomicU64>,
    rec: Recorder,
) {
    let mut counters = [0u64; KEYS_PER_CLIENT];
    let mut sent: Vec<Sent> = Vec::new();
    let mut rr = c;
    for (i, _) in (c..requests).step_by(CLIENTS).enumerate() {
        let repeat = i % DUP_EVERY == DUP_EVERY - 1 && !sent.is_empty();
        let event = if repeat {
            sent[rand_below(sent.len() as u64) as usize].clone()
        } else {
            let j = i % KEYS_PER_CLIENT;
            let id = format!("c{c}-{i}");
            let key = format!("k{c}-{j}");
            let n = counters[j];
            let body = format!(
                r#"{{"id":"{id}","k":"{key}","n":{n},"pad":"{}"}}"#,
                "x".repeat(64)
            );
            counters[j] += 1;
            Sent { id, body, key, n }
        };
        let (id, body) = (event.id.clone(), event.body.clone());
        let sent_at = rec.now();
        let give_up = Instant::now() + Duration::from_secs(60);
        let answer = loop {
            assert!(Instant::now() < give_up, "event {id} not accepted in 60 s");
            rr += 1;
            let base = {
                let u = urls.read().expect("lock");
                u[rr % u.len()].clone()
            };
            match http
                .post(format!("{base}/webhooks/load"))
                .header("content-type", "application/json")
                .body(body.clone())
                .send()
                .await
            {
                Ok(r) if r.status() == 200 => match r.json::<serde_json::Value>().await {
                    Ok(v) => break v,
                    // Cut off mid-answer by a kill: the event may be stored; repeat.
                    Err(_) => retries.fetch_add(1, Ordering::Relaxed),
                },
                Ok(r) if r.status() == 503 => retries.fetch_add(1, Ordering::Relaxed),
                Ok(r) => panic!(
                    "unexpected answer {} for {id}: {:?}",
                    r.status(),
                    r.text().await
                ),
                // A killed instance: connection refused or reset.
                Err(_) => retries.fetch_add(1, Ordering::Relaxed),
            };
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        let event_id = answer["id"].as_str().expect("id").to_owned();
        let duplicate = answer["duplicate"].as_bool().expect("duplicate");
        let at = rec.now();
        rec.lock().acks.push(Ack {
            dedup_key: id.clone(),
            event_id: event_id.clone(),
            duplicate,
            key: Some(event.key.clone()),
            seq: event.n,
            sent_at,
            at,
        });
        let mut a = acks.lock().expect("lock");
        if let Some(prev) = a.ids.insert(id.clone(), event_id.clone()) {
            assert_eq!(prev, event_id, "{id} was answered with two event ids");
        }
        if repeat {
            assert!(
                duplicate,
                "repeat of acknowledged {id} answered duplicate=false"
            );
            a.dup_answers += 1;
        } else {
            if !duplicate {
                assert!(
                    a.fresh.insert(id.clone()),
                    "{id} answered duplicate=false twice"
                );
            }
            sent.push(event);
            acked.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// Unique events among the requests (the rest repeat earlier ones).
fn unique_events(requests: usize) -> usize {
    (0..CLIENTS)
        .map(|c| (c..requests).step_by(CLIENTS).len())
        .map(|n| n - n / DUP_EVERY)
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_on_one_database_survive_kill_9() {
    let db_url = mailroom_testkit::fresh_postgres_db().await;
    cluster(REQUESTS, &db_url, None).await;
}

/// The same through PgBouncer in transaction mode, each instance's session
/// work (LISTEN, the sequential topic's claim locks, migrations) on its
/// `direct_url`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_through_pgbouncer_survive_kill_9() {
    let direct = mailroom_testkit::fresh_postgres_db().await;
    let pooler = mailroom_testkit::pgbouncer_url(&direct);
    cluster(POOLED_REQUESTS, &pooler, Some(&direct)).await;
}

/// Three instances on `db_url` (and `direct_url`) under `requests`, one
/// of them killed twice; checks what the module's comment says.
async fn cluster(requests: usize, db_url: &str, direct_url: Option<&str>) {
    let t0 = Instant::now();
    let db_url = db_url.to_owned();
    // Calls take up to 2 ms, so that overlapping runs would show.
    let (receiver, rec) = crate::support::receiver(Duration::from_millis(2)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = write_config(dir.path(), &config(&receiver.url, direct_url));

    // All three start at once: migrations run under the migration lock.
    let instances: Vec<Serve> = {
        let (path, url) = (config_path.clone(), db_url.clone());
        tokio::task::spawn_blocking(move || {
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..INSTANCES)
                    .map(|_| s.spawn(|| support::serve(&path, &url)))
                    .collect();
                hs.into_iter().map(|h| h.join().expect("start")).collect()
            })
        })
        .await
        .expect("start instances")
    };
    let urls = Arc::new(RwLock::new(
        instances.iter().map(|s| s.base.clone()).collect::<Vec<_>>(),
    ));
    let instances = Arc::new(Mutex::new(instances));
    let mut killed_problems: Vec<String> = Vec::new();

    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(20))
        .pool_max_idle_per_host(CLIENTS)
        .build()
        .expect("client");
    let acks: Arc<Mutex<Acks>> = Arc::default();
    let acked = Arc::new(AtomicUsize::new(0));
    let retries = Arc::new(AtomicU64::new(0));
    let t_load = Instant::now();
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            tokio::spawn(client(
                requests,
                c,
                http.clone(),
                urls.clone(),
                acks.clone(),
                acked.clone(),
                retries.clone(),
                rec.clone(),
            ))
        })
        .collect();

    // Kill the victim (SIGKILL) at 1/3 and 2/3 of the load; restart it at
    // once on a new port and keep sending to it.
    let unique = unique_events(requests);
    let mut kills = 0;
    for k in 1..=KILLS {
        let at = unique * k / (KILLS + 1);
        while acked.load(Ordering::Relaxed) < at {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // A kill lasts until the process is reaped: until then it may call
        // handlers whose success it never commits.
        let (old, problems) = {
            let mut inst = instances.lock().expect("lock");
            let from = rec.now();
            inst[VICTIM].kill9();
            rec.disrupted_between(from, rec.now());
            (inst[VICTIM].base.clone(), inst[VICTIM].problem_summary())
        };
        kills += 1;
        killed_problems.extend(problems);
        let (path, url) = (config_path.clone(), db_url.clone());
        let fresh = tokio::task::spawn_blocking(move || support::serve(&path, &url))
            .await
            .expect("restart");
        eprintln!(
            "kill #{k} at {} acknowledged events ({:.1}s): {old} -> {}",
            acked.load(Ordering::Relaxed),
            t_load.elapsed().as_secs_f64(),
            fresh.base
        );
        urls.write().expect("lock")[VICTIM] = fresh.base.clone();
        instances.lock().expect("lock")[VICTIM] = fresh;
    }
    for c in clients {
        c.await.expect("client task");
    }
    let load_time = t_load.elapsed();

    // Drain: every stored event reaches `done` (leases of the killed
    // instance expire after 3 s and are rescued by the maintenance leader).
    let pool = sqlx::PgPool::connect(direct_url.unwrap_or(&db_url))
        .await
        .expect("connect");
    let drain_time = support::wait_all_done(
        &pool,
        Duration::from_secs(120),
        "still not done after 120 s",
    )
    .await;
    // Deliveries in flight at the last check have ended by now.
    tokio::time::sleep(Duration::from_millis(100)).await;

    // Every instance is still running.
    {
        let mut inst = instances.lock().expect("lock");
        for (i, s) in inst.iter_mut().enumerate() {
            assert!(s.alive(), "instance {i} died");
        }
    }

    // Exactly one stored event per acknowledged dedup key, with the id
    // every answer named, each done by a successful call; never two runs of
    // an event at once, none again after a success but where a kill may
    // lost it or its lease had expired; per-key order: the fault matrix's checker.
    let rows = store::rows(direct_url.unwrap_or(&db_url))
        .await
        .expect("rows");
    let record = rec.snapshot();
    // On a loaded machine a completion's commit can outlive the 3-s lease,
    // and the event runs again once it expired (at least once), never at once.
    let expect = Expect {
        sequential: ["orders".to_owned()].into(),
        lease: Some(Duration::from_secs(LEASE_SECS)),
        ..Expect::default()
    };
    let verdict = check::check(&record, &rows, &expect);
    assert!(
        verdict.lost == 0 && verdict.duplicates == 0 && verdict.order == 0,
        "{verdict:#?}"
    );
    // And nothing stored that was never acknowledged, nor delivered.
    let acks = std::mem::take(&mut *acks.lock().expect("lock"));
    assert_eq!(
        acks.ids.len(),
        unique,
        "every unique event was acknowledged"
    );
    assert_eq!(rows.len(), unique, "stored events that nobody acknowledged");
    let ids: HashSet<&str> = acks.ids.values().map(String::as_str).collect();
    let stray: Vec<_> = record
        .calls
        .iter()
        .filter(|c| !ids.contains(c.event_id.as_str()))
        .collect();
    assert!(stray.is_empty(), "deliveries of unknown events: {stray:?}");
    let keys: HashSet<&str> = rows.iter().filter_map(|r| r.key.as_deref()).collect();
    assert_eq!(keys.len(), CLIENTS * KEYS_PER_CLIENT);

    let completed: HashSet<&str> = record
        .calls
        .iter()
        .filter(|c| c.outcome == Outcome::Succeeded)
        .map(|c| c.event_id.as_str())
        .collect();
    let cut_short = record.calls.len()
        - record
            .calls
            .iter()
            .filter(|c| c.outcome == Outcome::Succeeded)
            .count();
    let mut problems = killed_problems;
    for s in instances.lock().expect("lock").iter() {
        problems.extend(s.problem_summary());
    }
    eprintln!(
        "cluster: {requests} requests to {INSTANCES} instances from {CLIENTS} clients: \
         {unique} events + {} duplicates (all answered duplicate=true), {kills} kill -9s; \
         client retries {}; ingest {:.1}s ({:.0} req/s), drain after load {:.1}s, total {:.1}s; \
         deliveries {} of which redeliveries {} (cut short by a kill: {cut_short}, \
         run again after a kill or an expired lease: {}); keys {}",
        acks.dup_answers,
        retries.load(Ordering::Relaxed),
        load_time.as_secs_f64(),
        requests as f64 / load_time.as_secs_f64(),
        drain_time.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        record.calls.len(),
        record.calls.len() - completed.len(),
        verdict.excused,
        CLIENTS * KEYS_PER_CLIENT,
    );
    eprintln!("instance WARN/ERROR log lines: {problems:?}");
}
