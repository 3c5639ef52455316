//! A fake [`Store`] for tests of what shutdown waits for.

use mailroom_core::{
    AttemptWindow, ClaimLimits, ClaimRequest, Claimed, Completion, Event, EventId, FencingToken,
    Inserted, LimitedClaim, ListFilter, NewEvent, Page, PurgeReport, ReplayReport, Retention,
    Store, StoreError, Timestamp, TopicStats,
};
use std::time::Duration;

/// A store whose long operations never end: retention (a purge over a
/// huge backlog) and statistics (counting a huge table). Migrations, the
/// clock and the rest of maintenance answer at once; the hot path fails.
#[derive(Debug)]
pub(crate) struct Stalled;

type R<T> = Result<T, StoreError>;

fn down<T>() -> R<T> {
    Err(StoreError::Unavailable("not in this test".into()))
}

#[async_trait::async_trait]
impl Store for Stalled {
    async fn migrate(&self) -> R<mailroom_core::Migrated> {
        down()
    }
    async fn schema(&self) -> R<mailroom_core::SchemaVersion> {
        down()
    }
    async fn now(&self) -> R<Timestamp> {
        Ok(Timestamp::now())
    }
    async fn insert(&self, _: NewEvent) -> R<Inserted> {
        down()
    }
    async fn claim(&self, _: &ClaimRequest) -> R<Vec<Claimed>> {
        down()
    }
    async fn complete(&self, _: EventId, _: FencingToken, _: Completion) -> R<()> {
        down()
    }
    async fn extend(&self, _: EventId, _: FencingToken, _: Duration) -> R<Timestamp> {
        down()
    }
    async fn next_due(&self, _: &ClaimRequest) -> R<Option<Timestamp>> {
        down()
    }
    async fn claim_limited(&self, _: &ClaimRequest, _: ClaimLimits) -> R<LimitedClaim> {
        down()
    }
    async fn pause_topic(&self, _: &str, _: Duration) -> R<Timestamp> {
        down()
    }
    async fn paused_for(&self, _: &str) -> R<Option<Duration>> {
        down()
    }
    async fn get(&self, _: EventId) -> R<Option<Event>> {
        down()
    }
    async fn list(&self, _: &ListFilter) -> R<Page> {
        down()
    }
    async fn search(&self, _: &mailroom_core::EventSearch) -> R<Page> {
        down()
    }
    async fn count(&self, _: &mailroom_core::EventSearch) -> R<u64> {
        down()
    }
    async fn throughput(&self, _: Duration) -> R<Vec<mailroom_core::Throughput>> {
        down()
    }
    async fn stats(&self) -> R<Vec<TopicStats>> {
        std::future::pending().await
    }
    async fn replay(&self, _: EventId, _: u32) -> R<Event> {
        down()
    }
    async fn replay_matching(&self, _: &ListFilter, _: u32) -> R<ReplayReport> {
        down()
    }
    async fn skip(&self, _: EventId) -> R<Event> {
        down()
    }
    async fn cancel(&self, _: EventId) -> R<Event> {
        down()
    }
    async fn cancel_matching(&self, _: &ListFilter) -> R<u64> {
        down()
    }
    async fn expire(&self, _: &str, _: Duration, _: u32) -> R<u64> {
        Ok(0)
    }
    async fn rescue_expired(&self) -> R<u64> {
        Ok(0)
    }
    async fn fold_counters(&self) -> R<()> {
        Ok(())
    }
    async fn purge(&self, _: Retention) -> R<PurgeReport> {
        std::future::pending().await
    }
    async fn attempt_window(&self, _: Duration) -> R<Vec<AttemptWindow>> {
        Ok(vec![])
    }
}
