//! The dispatcher: one loop per topic that claims due events and runs their
//! attempts, and one maintenance loop per engine.
//!
//! A topic loop never polls on a fixed tick. It claims as many events as it
//! has free slots; when fewer come back, it sleeps until the earliest of: a
//! wake-up (an intake commit or a finished attempt calls
//! [`Notify::notify_one`], which is remembered if nobody is waiting yet), the
//! next due time the store reports, or the polling fallback (`poll`, 1 s by
//! default — it catches writes made by other processes, such as a CLI replay).

pub(crate) mod batch;

use crate::handler::SharedHandler;
use crate::topology::TopicSpec;
use futures::FutureExt;
use mailroom_core::{
    Alert, AlertKind, AlertRules, ClaimRequest, Claimed, Outcome, Result, Store, StoreError,
    TopicStats,
};
use std::collections::HashMap;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument, debug, error, info_span, warn};

/// Most events claimed in one store round trip.
const MAX_CLAIM: u32 = 256;

/// Everything a topic loop needs.
#[derive(Debug)]
pub(crate) struct TopicRuntime {
    pub spec: TopicSpec,
    pub handler: Option<SharedHandler>,
    pub wake: Notify,
}

impl TopicRuntime {
    fn claim_request(&self, worker: &str, max: u32) -> ClaimRequest {
        ClaimRequest {
            topic: self.spec.name.clone(),
            worker: worker.to_string(),
            max,
            lease: self.spec.lease,
            per_key: self.spec.mode.per_key(),
        }
    }
}

/// Runs one topic until `shutdown`, then waits for attempts in flight (each
/// is bounded by the topic's timeout, so this ends).
pub(crate) async fn run_topic(
    store: Arc<dyn Store>,
    topic: Arc<TopicRuntime>,
    handler: SharedHandler,
    worker: String,
    poll: Duration,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(topic.spec.concurrency as usize));
    let attempts = TaskTracker::new();
    let mut store_backoff = Duration::from_millis(50);
    loop {
        if shutdown.is_cancelled() {
            break;
        }
        let free = slots.available_permits() as u32;
        if free == 0 {
            // Full: wait for one attempt to end.
            tokio::select! {
                permit = slots.clone().acquire_owned() => drop(permit),
                () = shutdown.cancelled() => break,
            }
            continue;
        }
        let want = free.min(MAX_CLAIM);
        let req = topic.claim_request(&worker, want);
        let claimed = match store.claim(&req).await {
            Ok(c) => {
                store_backoff = Duration::from_millis(50);
                c
            }
            Err(e) => {
                warn!(topic = %topic.spec.name, error = %e, "claim failed; retrying");
                tokio::select! {
                    () = tokio::time::sleep(store_backoff) => {}
                    () = shutdown.cancelled() => break,
                }
                store_backoff = (store_backoff * 2).min(Duration::from_secs(5));
                continue;
            }
        };
        let got = claimed.len() as u32;
        for c in claimed {
            let Ok(permit) = slots.clone().try_acquire_owned() else {
                // Cannot happen (we claimed at most `free`); release the lease
                // rather than run over the concurrency bound.
                let _ = store
                    .complete(
                        c.event.id,
                        c.token,
                        mailroom_core::Completion::Retry {
                            delay: Duration::ZERO,
                            error: "released: no free slot".into(),
                        },
                    )
                    .await;
                continue;
            };
            let store = store.clone();
            let topic = topic.clone();
            let handler = handler.clone();
            attempts.spawn(async move {
                run_attempt(&*store, &topic, &*handler, c).await;
                drop(permit);
            });
        }
        if got == want {
            continue;
        }
        // Fewer than asked: nothing more is due right now. Sleep until woken,
        // until the next due time, or until the polling fallback.
        let until = match store.next_due(&req).await {
            Ok(Some(due)) => {
                let ms = due.as_millisecond() - jiff::Timestamp::now().as_millisecond();
                Duration::from_millis(u64::try_from(ms).unwrap_or(0))
                    .clamp(Duration::from_millis(5), poll)
            }
            Ok(None) => poll,
            Err(_) => store_backoff,
        };
        tokio::select! {
            () = topic.wake.notified() => {}
            () = tokio::time::sleep(until) => {}
            () = shutdown.cancelled() => break,
        }
    }
    attempts.close();
    attempts.wait().await;
}

/// One attempt: handler under timeout (panics caught), outcome resolved by the
/// retry policy, completion stored with the claim's fencing token.
async fn run_attempt(
    store: &dyn Store,
    topic: &TopicRuntime,
    handler: &dyn crate::handler::Handler,
    c: Claimed,
) {
    let event = &c.event;
    let span = info_span!("attempt", event_id = %event.id, topic = %event.topic,
        attempt = event.attempts, correlation_id = event.correlation_id.as_deref().unwrap_or(""));
    async {
        let started = Instant::now();
        let outcome = match tokio::time::timeout(
            topic.spec.timeout,
            AssertUnwindSafe(handler.handle(event)).catch_unwind(),
        )
        .await
        {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Outcome::retry("handler panicked"),
            Err(_) => Outcome::retry(format!(
                "timed out after {}",
                mailroom_core::duration::format(topic.spec.timeout)
            )),
        };
        let elapsed = started.elapsed();
        let spread = rand::random::<f64>() * 2.0 - 1.0;
        let completion = outcome.resolve(event.attempts, event.max_attempts, &topic.spec.retry, spread);
        record_outcome(event, &completion, Some(elapsed));
        match store.complete(event.id, c.token, completion).await {
            Ok(()) => {}
            Err(StoreError::StaleToken) => {
                warn!("outcome discarded: the lease was lost and the event was handed to another worker");
            }
            Err(e) => {
                // The lease will expire and the event will be rescued.
                error!(error = %e, "could not record the outcome; the event will be retried after its lease");
            }
        }
        topic.wake.notify_one();
    }
    .instrument(span)
    .await;
}

/// Counts, times and logs an attempt's outcome (inside the attempt's span).
/// `elapsed` is `None` for a pull worker's verdict: its handler ran outside
/// the process, so only the worker knows how long it took.
pub(crate) fn record_outcome(
    event: &mailroom_core::Event,
    completion: &mailroom_core::Completion,
    elapsed: Option<Duration>,
) {
    let label = match completion {
        mailroom_core::Completion::Done => "done",
        mailroom_core::Completion::Retry { .. } => "retry",
        mailroom_core::Completion::Dead { .. } => "dead",
    };
    metrics::counter!("mailroom_events_processed_total", "topic" => event.topic.clone(), "outcome" => label).increment(1);
    if let Some(elapsed) = elapsed {
        metrics::histogram!("mailroom_processing_duration_seconds", "topic" => event.topic.clone())
            .record(elapsed.as_secs_f64());
    }
    match completion {
        mailroom_core::Completion::Done => {
            debug!(event_id = %event.id, elapsed_ms = elapsed.map(|e| e.as_millis() as u64), "done")
        }
        mailroom_core::Completion::Retry { delay, error } => {
            warn!(event_id = %event.id, topic = %event.topic, error = %error, retry_in_ms = delay.as_millis() as u64, "attempt failed; will retry");
        }
        mailroom_core::Completion::Dead { error } => {
            error!(event_id = %event.id, topic = %event.topic, error = %error, "event is dead: operator action needed (replay or skip)");
        }
    }
}

/// Wakes topic loops when the store announces commits from any instance.
pub(crate) async fn run_notifications(
    mut stream: mailroom_core::TopicStream,
    topics: std::collections::HashMap<String, Arc<TopicRuntime>>,
    shutdown: CancellationToken,
) {
    use futures::StreamExt;
    loop {
        tokio::select! {
            next = stream.next() => match next {
                // "*": notifications may have been missed (the listener
                // reconnected, or we fell behind): wake every topic.
                Some(topic) if topic == "*" => topics.values().for_each(|t| t.wake.notify_one()),
                Some(topic) => {
                    if let Some(t) = topics.get(&topic) {
                        t.wake.notify_one();
                    }
                }
                None => break,
            },
            () = shutdown.cancelled() => break,
        }
    }
}

/// What the maintenance loop looks after.
pub(crate) struct Maintenance {
    pub store: Arc<dyn Store>,
    pub topics: Vec<Arc<TopicRuntime>>,
    pub retention: mailroom_core::Retention,
    pub alerts: AlertRules,
    /// How often the elected instance evaluates `alerts`.
    pub alert_every: Duration,
    pub period: Duration,
    pub worker: String,
}

/// The alerts firing now: `rules` over `stats` (read from the store when
/// `None`) and, if a rule needs them, the store's recent attempts.
pub(crate) async fn current_alerts(
    store: &dyn Store,
    rules: &AlertRules,
    stats: Option<&[TopicStats]>,
) -> Result<Vec<Alert>> {
    if !rules.any() {
        return Ok(Vec::new());
    }
    let read;
    let stats = match stats {
        Some(stats) => stats,
        None => {
            read = store.stats().await?;
            &read
        }
    };
    let windows = if rules.needs_window() {
        store
            .attempt_window(mailroom_core::alert::ALERT_WINDOW)
            .await?
    } else {
        Vec::new()
    };
    Ok(mailroom_core::alert::evaluate(rules, stats, &windows))
}

/// Logs the alerts that started or stopped firing since `firing` (which it
/// updates), and sets `mailroom_alert_firing{topic,alert}` to 1 or 0.
fn report_alerts(now: Vec<Alert>, firing: &mut HashMap<(String, AlertKind), Alert>) {
    let mut next = HashMap::with_capacity(now.len());
    for alert in now {
        let key = (alert.topic.clone(), alert.kind);
        if !firing.contains_key(&key) {
            warn!(
                topic = %alert.topic,
                alert = alert.kind.as_str(),
                value = alert.value,
                threshold = alert.threshold,
                "alert firing: {}",
                alert.message
            );
        }
        metrics::gauge!("mailroom_alert_firing", "topic" => alert.topic.clone(), "alert" => alert.kind.as_str())
            .set(1.0);
        next.insert(key, alert);
    }
    for ((topic, kind), old) in firing.drain() {
        if !next.contains_key(&(topic.clone(), kind)) {
            tracing::info!(
                topic = %topic,
                alert = kind.as_str(),
                "alert resolved: {}",
                old.message
            );
            metrics::gauge!("mailroom_alert_firing", "topic" => topic, "alert" => kind.as_str())
                .set(0.0);
        }
    }
    *firing = next;
}

/// Lease rescue on a short period; alerts every `alert_every`; retention
/// less often. With several instances on one database, only the holder of
/// the `maintenance` lease (renewed every period, expiring after a few)
/// does the work.
pub(crate) async fn run_maintenance(m: Maintenance, shutdown: CancellationToken) {
    let Maintenance {
        store,
        topics,
        retention,
        alerts,
        alert_every,
        period,
        worker,
    } = m;
    let mut last_purge: Option<Instant> = None;
    let mut last_alerts: Option<Instant> = None;
    let mut firing = HashMap::new();
    let ttl = (period * 5).max(Duration::from_secs(5));
    loop {
        match store.try_lead("maintenance", &worker, ttl).await {
            Ok(true) => {}
            Ok(false) => {
                // Another instance reports alerts now; forget ours, so
                // that taking over later logs what is still firing.
                firing.clear();
                tokio::select! {
                    () = tokio::time::sleep(period) => {}
                    () = shutdown.cancelled() => break,
                }
                continue;
            }
            Err(e) => {
                warn!(error = %e, "maintenance election failed");
                tokio::select! {
                    () = tokio::time::sleep(period) => {}
                    () = shutdown.cancelled() => break,
                }
                continue;
            }
        }
        match store.rescue_expired().await {
            Ok(0) => {}
            Ok(n) => {
                warn!(
                    rescued = n,
                    "expired leases rescued; their events will be retried"
                );
                for t in &topics {
                    t.wake.notify_one();
                }
            }
            Err(e) => warn!(error = %e, "lease rescue failed"),
        }
        if last_purge.is_none_or(|t| t.elapsed() > Duration::from_secs(3600)) {
            match store.purge(retention).await {
                Ok(r) if r.payloads_dropped + r.rows_deleted > 0 => {
                    tracing::info!(
                        payloads_dropped = r.payloads_dropped,
                        rows_deleted = r.rows_deleted,
                        "retention applied"
                    );
                }
                Ok(_) => {}
                Err(e) => warn!(error = %e, "retention failed"),
            }
            last_purge = Some(Instant::now());
        }
        if alerts.any() && last_alerts.is_none_or(|t| t.elapsed() >= alert_every) {
            match current_alerts(store.as_ref(), &alerts, None).await {
                Ok(now) => report_alerts(now, &mut firing),
                Err(e) => warn!(error = %e, "alert evaluation failed"),
            }
            last_alerts = Some(Instant::now());
        }
        tokio::select! {
            () = tokio::time::sleep(period) => {}
            () = shutdown.cancelled() => break,
        }
    }
}
