//! The operators' door ([`Engine::operator`](crate::Engine::operator)):
//! what the HTTP API, the dashboard and the CLI do through an engine: read
//! events and numbers, replay, skip, cancel, purge, evaluate the alerts.
//! Every write wakes the topic it touched. The types these operations take
//! and answer are here too.

use crate::answer::{LimitsAnswer, RATE_WINDOW, Rates, StatsAnswer, TopicAnswer};
use crate::shared::Shared;
use jiff::Timestamp;
use mailroom_core::{AlertRules, Event, EventId, Retention, Status, StoreError};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use crate::answer::CancelReport;
pub use mailroom_core::{
    Alert, AlertKind, AttemptWindow, EventSearch, KeyCursor, ListFilter, Page, PurgeReport,
    ReplayReport, Throughput, TopicStats,
};

/// What operators do with one engine. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Operator {
    shared: Arc<Shared>,
}

impl Operator {
    pub(crate) fn new(shared: Arc<Shared>) -> Self {
        Self { shared }
    }

    /// One event with its attempt history.
    pub async fn get(&self, id: EventId) -> Result<Option<Event>, StoreError> {
        self.shared.store.get(id).await
    }

    /// Events matching `filter`, newest first.
    pub async fn list(&self, filter: &ListFilter) -> Result<Page, StoreError> {
        self.shared.store.list(filter).await
    }

    /// Events matching `search` (error text, time range besides the list
    /// filters), newest first.
    pub async fn search(&self, search: &EventSearch) -> Result<Page, StoreError> {
        self.shared.store.search(search).await
    }

    /// How long `topic` stays paused by a handler's 429 + `Retry-After`
    /// if it is (as the store knows it: on SQLite, only the
    /// process that saw the 429 does).
    pub async fn paused_for(&self, topic: &str) -> Result<Option<Duration>, StoreError> {
        self.shared.store.paused_for(topic).await
    }

    /// How many events match `search`.
    pub async fn count(&self, search: &EventSearch) -> Result<u64, StoreError> {
        self.shared.store.count(search).await
    }

    /// Per topic and minute over the last `window`: received, done, failed.
    pub async fn throughput(&self, window: Duration) -> Result<Vec<Throughput>, StoreError> {
        self.shared.store.throughput(window).await
    }

    /// Whether the store answers (readiness).
    pub async fn ready(&self) -> Result<(), StoreError> {
        self.shared.store.now().await.map(drop)
    }

    /// The retention windows maintenance applies.
    pub fn retention(&self) -> Retention {
        self.shared.retention
    }

    /// Drops the payloads of finished events received more than
    /// `older_than` ago, and deletes the rows past both that and the dedup
    /// window (so a purge never ends deduplication early).
    pub async fn purge(&self, older_than: Duration) -> Result<PurgeReport, StoreError> {
        self.shared
            .store
            .purge(Retention {
                done: older_than,
                dead: older_than,
                dedup: self.shared.retention.dedup.max(older_than),
            })
            .await
    }

    /// Replays one event with the topic's fresh attempt budget. An event
    /// whose payload retention purged is refused with
    /// [`StoreError::Purged`]: its handler would get an empty body.
    pub async fn replay(&self, id: EventId) -> Result<Event, StoreError> {
        let event = self
            .shared
            .store
            .get(id)
            .await?
            .ok_or(StoreError::NotFound)?;
        let budget = self.budget(&event.topic);
        let replayed = self.shared.store.replay(id, budget).await?;
        self.shared.wake(&replayed.topic);
        Ok(replayed)
    }

    /// Replays every matching event (per topic, each with its own budget),
    /// leaving (and counting) those whose payload retention purged.
    pub async fn replay_matching(&self, filter: &ListFilter) -> Result<ReplayReport, StoreError> {
        let topics: Vec<String> = match &filter.topic {
            Some(t) => vec![t.clone()],
            None => self
                .shared
                .store
                .stats()
                .await?
                .into_iter()
                .map(|s| s.topic)
                .collect(),
        };
        let mut total = ReplayReport::default();
        for t in topics {
            let mut f = filter.clone();
            f.topic = Some(t.clone());
            let report = self
                .shared
                .store
                .replay_matching(&f, self.budget(&t))
                .await?;
            total.replayed += report.replayed;
            total.skipped_purged += report.skipped_purged;
            self.shared.wake(&t);
        }
        Ok(total)
    }

    /// Replays every event matching `search` a page (its `limit`) at a
    /// time, the replays of a page concurrently (so the store groups
    /// them), calling `progress` after each page: what a bulk replay that
    /// shows its progress runs (the dashboard's, the CLI's). The listing is
    /// walked by cursor, so an event that cannot be replayed is passed, not
    /// met again. Stops at the first store failure; what was replayed
    /// before stays replayed, and running the same search again replays
    /// the rest.
    pub async fn replay_each(
        &self,
        mut search: EventSearch,
        mut progress: impl FnMut(&ReplayProgress),
    ) -> Result<ReplayProgress, StoreError> {
        let mut done = ReplayProgress::default();
        loop {
            let page = self.search(&search).await?;
            let mut set = tokio::task::JoinSet::new();
            for id in page.events.iter().map(|e| e.id) {
                let operator = self.clone();
                set.spawn(async move { operator.replay(id).await.map(drop) });
            }
            while let Some(outcome) = set.join_next().await {
                match outcome {
                    Ok(Ok(())) => done.replayed += 1,
                    Ok(Err(StoreError::Purged(_))) => done.purged += 1,
                    // Running, or gone (retention) since the page was read.
                    Ok(Err(StoreError::Conflict(_) | StoreError::NotFound)) | Err(_) => {
                        done.changed += 1;
                    }
                    Ok(Err(e)) => return Err(e),
                }
            }
            progress(&done);
            match page.next_cursor {
                Some(c) => search.filter.cursor = Some(c),
                None => return Ok(done),
            }
        }
    }

    /// Per-topic numbers, with `blocked_keys` counted only where a dead head
    /// really blocks its key (sequential topics with `on_dead = "block"`):
    /// the store cannot know a topic's mode.
    pub async fn stats(&self) -> Result<Vec<TopicStats>, StoreError> {
        self.shared.stats().await
    }

    /// Per topic, the attempts that finished in the last `window` (how many,
    /// how many failed, p95) and the longest one still running.
    pub async fn recent_attempts(
        &self,
        window: Duration,
    ) -> Result<Vec<AttemptWindow>, StoreError> {
        self.shared.store.attempt_window(window).await
    }

    /// The alert thresholds this engine evaluates.
    pub fn alert_rules(&self) -> &AlertRules {
        &self.shared.alerts
    }

    /// The alerts firing now, evaluated from the store's current numbers
    /// (the same on every instance sharing the store).
    pub async fn alerts(&self) -> Result<Vec<Alert>, StoreError> {
        crate::maintenance::current_alerts(self.shared.store.as_ref(), &self.shared.alerts, None)
            .await
    }

    /// [`Operator::alerts`] over `stats` just read with [`Operator::stats`], so a
    /// caller showing both reads them once.
    pub async fn alerts_from(&self, stats: &[TopicStats]) -> Result<Vec<Alert>, StoreError> {
        crate::maintenance::current_alerts(
            self.shared.store.as_ref(),
            &self.shared.alerts,
            Some(stats),
        )
        .await
    }

    /// Skips a dead event so its key unblocks.
    pub async fn skip(&self, id: EventId) -> Result<Event, StoreError> {
        let e = self.shared.store.skip(id).await?;
        self.shared.wake(&e.topic);
        Ok(e)
    }

    /// Cancels a pending event: it becomes `cancelled` and is
    /// never run unless replayed. A running one is a conflict.
    pub async fn cancel(&self, id: EventId) -> Result<Event, StoreError> {
        let e = self.shared.store.cancel(id).await?;
        // A cancelled head of a sequential key lets the next event go.
        self.shared.wake(&e.topic);
        Ok(e)
    }

    /// Cancels every pending event matching `filter` (its status aside),
    /// or with `dry_run` only counts them.
    pub async fn cancel_matching(
        &self,
        filter: &ListFilter,
        dry_run: bool,
    ) -> Result<CancelReport, StoreError> {
        let pending = ListFilter {
            status: Some(mailroom_core::Status::Pending),
            ..filter.clone()
        };
        let preview = EventSearch {
            filter: pending.clone(),
            ..EventSearch::default()
        };
        let matching = self.shared.store.count(&preview).await?;
        if dry_run || matching == 0 {
            return Ok(CancelReport {
                matching,
                cancelled: 0,
            });
        }
        let cancelled = self.shared.store.cancel_matching(&pending).await?;
        match &filter.topic {
            Some(t) => self.shared.wake(t),
            None => self
                .shared
                .topics
                .values()
                .for_each(|t| t.wake.notify_one()),
        }
        Ok(CancelReport {
            matching,
            cancelled,
        })
    }

    /// `topic`'s limits with `running` events and `attempts_per_second`
    /// lately; `None` when it has no limits and is not paused. Reads the
    /// pause only of topics with a built-in handler (the only ones a 429
    /// pauses).
    pub async fn limits_answer(
        &self,
        topic: &str,
        running: u64,
        attempts_per_second: Option<f64>,
    ) -> Result<Option<LimitsAnswer>, StoreError> {
        let spec = self.shared.topic(topic);
        let paused = if self.shared.has_handler(topic) {
            self.paused_for(topic).await?
        } else {
            None
        };
        let limited = spec.is_some_and(|s| s.is_limited());
        if !limited && paused.is_none() {
            return Ok(None);
        }
        Ok(Some(LimitsAnswer {
            rate: spec.and_then(|s| s.rate).map(|r| r.to_string()),
            attempts_per_second: attempts_per_second
                .filter(|_| spec.is_some_and(|s| s.rate.is_some())),
            max_running: spec.and_then(|s| s.max_running),
            running,
            paused_seconds: paused.map(|d| d.as_secs_f64()),
        }))
    }

    /// The numbers of `GET /v1/stats` and `mailroom status`: [`Operator::stats`],
    /// recent attempts and alerts read once, at `now`.
    pub async fn stats_answer(&self, now: Timestamp) -> Result<StatsAnswer, StoreError> {
        let stats = self.stats().await?;
        let alerts = self.alerts_from(&stats).await?;
        let windows = self.recent_attempts(RATE_WINDOW).await?;
        let mut by_name: BTreeMap<String, TopicStats> = self
            .shared
            .topics
            .keys()
            .map(|name| (name.clone(), TopicStats::default()))
            .collect();
        by_name.extend(stats.into_iter().map(|s| (s.topic.clone(), s)));
        let mut topics: Vec<TopicAnswer> = by_name
            .into_iter()
            .map(|(name, s)| TopicAnswer {
                mode: self.shared.topic(&name).map_or("single", |t| t.mode.name()),
                handler: if self.shared.has_handler(&name) {
                    "built-in"
                } else {
                    "pull"
                },
                counts: Status::ALL
                    .iter()
                    .map(|st| (st.as_str(), s.count(*st)))
                    .collect(),
                oldest_pending_age_seconds: s.oldest_pending_age(now).map(|d| d.as_secs_f64()),
                blocked_keys: s.blocked_keys,
                rates: Rates::new(windows.iter().find(|w| w.topic == name)),
                limits: None,
                topic: name,
            })
            .collect();
        for t in &mut topics {
            let lately = t.rates.done_per_second + t.rates.failed_per_second;
            let running = t.count(Status::Running);
            t.limits = self.limits_answer(&t.topic, running, Some(lately)).await?;
        }
        Ok(StatsAnswer { topics, alerts })
    }

    fn budget(&self, topic: &str) -> u32 {
        self.shared
            .topics
            .get(topic)
            .map(|t| t.spec.retry.max_attempts)
            .unwrap_or(mailroom_core::RetryPolicy::default().max_attempts)
    }
}

/// What [`Operator::replay_each`] has done so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ReplayProgress {
    /// Events sent back to pending.
    pub replayed: u64,
    /// Events left as they were: retention dropped their payload.
    pub purged: u64,
    /// Events that changed since they were listed (running, or deleted).
    pub changed: u64,
}

impl ReplayProgress {
    /// Events handled, whatever became of them.
    pub fn handled(&self) -> u64 {
        self.replayed + self.purged + self.changed
    }
}
