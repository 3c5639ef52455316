//! Several `mailroom serve` processes on one PostgreSQL database, one of
//! them `kill -9`ed twice under load: the guarantees hold
//! across instances — exactly one stored event per dedup key, at-least-once
//! delivery, one delivery of an event at a time, per-key order.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use support::{Delivery, Receiver, Serve, rand_below, write_config};

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
lease = "3s"
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

/// One client: sends its share of the requests round-robin over the
/// instances, each event retried (same id, same body) until answered 200.
async fn client(
    requests: usize,
    c: usize,
    http: reqwest::Client,
    urls: Arc<RwLock<Vec<String>>>,
    acks: Arc<Mutex<Acks>>,
    acked: Arc<AtomicUsize>,
    retries: Arc<AtomicU64>,
) {
    let mut counters = [0u64; KEYS_PER_CLIENT];
    let mut sent: Vec<(String, String)> = Vec::new(); // (dedup key, body)
    let mut rr = c;
    for (i, _) in (c..requests).step_by(CLIENTS).enumerate() {
        let repeat = i % DUP_EVERY == DUP_EVERY - 1 && !sent.is_empty();
        let (id, body) = if repeat {
            sent[rand_below(sent.len() as u64) as usize].clone()
        } else {
            let j = i % KEYS_PER_CLIENT;
            let id = format!("c{c}-{i}");
            let body = format!(
                r#"{{"id":"{id}","k":"k{c}-{j}","n":{},"pad":"{}"}}"#,
                counters[j],
                "x".repeat(64)
            );
            counters[j] += 1;
            (id, body)
        };
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
            sent.push((id, body));
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

/// For one event: its deliveries never overlap in time.
fn check_no_overlap(deliveries: &[Delivery]) {
    let mut by_event: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for d in deliveries {
        by_event.entry(&d.event_id).or_default().push(d);
    }
    for (id, mut ds) in by_event {
        ds.sort_by_key(|d| d.start);
        for w in ds.windows(2) {
            assert!(
                w[1].start >= w[0].end,
                "two deliveries of event {id} overlap: {:?} and {:?}",
                w[0],
                w[1]
            );
        }
    }
}

/// For one key, in delivery start order: counters never go back, and event
/// n starts only after every earlier event of the key has completed a
/// delivery. A repeated delivery of the same event is allowed.
fn check_key_order(key: &str, mut ds: Vec<&Delivery>) {
    ds.sort_by_key(|d| d.start);
    // First successful completion of each counter.
    let mut first_done: BTreeMap<u64, Duration> = BTreeMap::new();
    for d in ds.iter().filter(|d| d.completed) {
        let n = d.n.expect("counter");
        let e = first_done.entry(n).or_insert(d.end);
        *e = (*e).min(d.end);
    }
    let max_n = first_done.keys().next_back().copied().unwrap_or(0);
    for n in 0..=max_n {
        assert!(
            first_done.contains_key(&n),
            "key {key}: event #{n} never completed a delivery but #{max_n} did"
        );
    }
    let mut highest = 0u64;
    let mut earlier_done = Duration::ZERO; // latest first completion of counters < current
    let mut prefix: BTreeMap<u64, Duration> = BTreeMap::new();
    for (n, end) in &first_done {
        prefix.insert(*n, earlier_done);
        earlier_done = earlier_done.max(*end);
    }
    for d in &ds {
        let n = d.n.expect("counter");
        assert!(
            n >= highest,
            "key {key}: event #{n} delivered after #{highest} had started: {d:?}"
        );
        highest = n;
        let must_wait = prefix.get(&n).copied().unwrap_or(Duration::ZERO);
        assert!(
            d.start >= must_wait,
            "key {key}: event #{n} started at {:?}, before event #{} finished at {must_wait:?}",
            d.start,
            n.saturating_sub(1)
        );
    }
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
    let receiver = Receiver::start(2_000).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let config_path = write_config(dir.path(), &config(&receiver.url, direct_url));

    // All three start at once: migrations run under the migration lock.
    let instances: Vec<Serve> = {
        let (path, url) = (config_path.clone(), db_url.clone());
        tokio::task::spawn_blocking(move || {
            std::thread::scope(|s| {
                let hs: Vec<_> = (0..INSTANCES)
                    .map(|_| s.spawn(|| Serve::start(&path, &url)))
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
    let mut killed_problems: Vec<(String, usize)> = Vec::new();

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
        let (old, problems) = {
            let mut inst = instances.lock().expect("lock");
            inst[VICTIM].kill9();
            (inst[VICTIM].base.clone(), inst[VICTIM].problem_summary())
        };
        kills += 1;
        killed_problems.extend(problems);
        let (path, url) = (config_path.clone(), db_url.clone());
        let fresh = tokio::task::spawn_blocking(move || Serve::start(&path, &url))
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

    // 1. Exactly one stored event per acknowledged dedup key, with the id
    //    every answer named; and nothing stored that was never acknowledged.
    let rows: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT dedup_key, id::text, source FROM mailroom.events WHERE topic = 'orders'",
    )
    .fetch_all(&pool)
    .await
    .expect("rows");
    let acks = std::mem::take(&mut *acks.lock().expect("lock"));
    let mut stored: HashMap<&str, Vec<&str>> = HashMap::new();
    for (dedup, id, source) in &rows {
        assert_eq!(source, "load");
        stored.entry(dedup).or_default().push(id);
    }
    assert_eq!(
        acks.ids.len(),
        unique,
        "every unique event was acknowledged"
    );
    for (dedup, id) in &acks.ids {
        match stored.get(dedup.as_str()).map(Vec::as_slice) {
            Some([one]) => assert_eq!(one, id, "{dedup}: stored id differs from the answer"),
            Some(many) => panic!("{dedup} stored {} times", many.len()),
            None => panic!("acknowledged {dedup} ({id}) was lost"),
        }
    }
    assert_eq!(rows.len(), unique, "stored events that nobody acknowledged");

    // 2. Every stored event was delivered (and completed) at least once.
    let deliveries = receiver.deliveries();
    let completed: HashSet<&str> = deliveries
        .iter()
        .filter(|d| d.completed)
        .map(|d| d.event_id.as_str())
        .collect();
    for (dedup, id) in &acks.ids {
        assert!(
            completed.contains(id.as_str()),
            "{dedup} ({id}) never delivered"
        );
    }
    for d in &deliveries {
        assert_eq!(
            acks.ids.get(&d.dedup_key),
            Some(&d.event_id),
            "stray delivery {d:?}"
        );
    }

    // 3. No two deliveries of one event at the same time.
    check_no_overlap(&deliveries);

    // 4. Per-key order.
    let mut by_key: HashMap<&str, Vec<&Delivery>> = HashMap::new();
    for d in &deliveries {
        by_key.entry(&d.key).or_default().push(d);
    }
    assert_eq!(by_key.len(), CLIENTS * KEYS_PER_CLIENT);
    for (key, ds) in by_key {
        check_key_order(key, ds);
    }

    let cut_short = deliveries.iter().filter(|d| !d.completed).count();
    let mut problems = killed_problems;
    for s in instances.lock().expect("lock").iter() {
        problems.extend(s.problem_summary());
    }
    eprintln!(
        "cluster: {requests} requests to {INSTANCES} instances from {CLIENTS} clients: \
         {unique} events + {} duplicates (all answered duplicate=true), {kills} kill -9s; \
         client retries {}; ingest {:.1}s ({:.0} req/s), drain after load {:.1}s, total {:.1}s; \
         deliveries {} of which redeliveries {} (cut short by a kill: {cut_short}); \
         keys {}",
        acks.dup_answers,
        retries.load(Ordering::Relaxed),
        load_time.as_secs_f64(),
        requests as f64 / load_time.as_secs_f64(),
        drain_time.as_secs_f64(),
        t0.elapsed().as_secs_f64(),
        deliveries.len(),
        deliveries.len() - completed.len(),
        CLIENTS * KEYS_PER_CLIENT,
    );
    eprintln!("instance WARN/ERROR log lines: {problems:?}");
}
