//! # mailroom-conformance
//!
//! The one test suite every [`Store`] backend must pass, so
//! SQLite and PostgreSQL keep the same semantics.
//!
//! - [`suite!`]: expands to one `#[test]` per conformance test, each running
//!   on a fresh store from the factory you give it, on a two-worker
//!   multi-threaded Tokio runtime.
//! - [`Fixture`]: what the factory returns — a store, plus anything that must
//!   live as long as the test (a temp dir, a throw-away database).
//! - [`tests`]: the tests themselves, as plain async functions of a store,
//!   for backends that want to call them another way.
//!
//! A backend's test file holds one line of it; the SQLite one
//! (`crates/mailroom-sqlite/tests/conformance.rs`, compiled and run) is:
//!
//! ```text
//! mailroom_conformance::suite!(async {
//!     let dir = tempfile::tempdir().unwrap();
//!     let store = SqliteStore::open(SqliteOptions::new(dir.path().join("t.db"))).unwrap();
//!     store.migrate().await.unwrap();
//!     (store, dir)
//! });
//! ```

use mailroom_core::{NewEvent, Store};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

pub mod tests;

/// What a suite factory produces: a fresh, migrated store and whatever keeps
/// it alive. Dropped at the end of the test (store first for tuples).
pub trait Fixture: Send + 'static {
    /// The store under test.
    fn store(&self) -> Arc<dyn Store>;
}

impl<S: Store> Fixture for Arc<S> {
    fn store(&self) -> Arc<dyn Store> {
        Arc::clone(self) as Arc<dyn Store>
    }
}

impl<S: Store + Clone, G: Send + 'static> Fixture for (S, G) {
    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.0.clone())
    }
}

/// Longest a single conformance test may run before it counts as hung.
pub const TEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Runs one conformance test on a fresh fixture, on a two-worker
/// multi-threaded runtime (the shape `#[tokio::test(flavor = "multi_thread",
/// worker_threads = 2)]` builds), failing it if it hangs.
pub fn run<X, Fut, T, TFut>(factory: Fut, test: T)
where
    X: Fixture,
    Fut: Future<Output = X>,
    T: FnOnce(Arc<dyn Store>) -> TFut,
    TFut: Future<Output = ()>,
{
    #[allow(clippy::expect_used)]
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("building the test runtime");
    runtime.block_on(async {
        let fixture = factory.await;
        let store = fixture.store();
        let outcome = tokio::time::timeout(TEST_TIMEOUT, test(store)).await;
        drop(fixture);
        assert!(
            outcome.is_ok(),
            "conformance test timed out after {TEST_TIMEOUT:?}"
        );
    });
}

/// A fresh event for topic `topic` with dedup key `dedup` and ordering key `key`.
pub fn event(topic: &str, dedup: &str, key: Option<&str>) -> NewEvent {
    NewEvent {
        id: mailroom_core::EventId::new(),
        source: "test".into(),
        topic: topic.into(),
        dedup_key: dedup.into(),
        key: key.map(Into::into),
        event_type: Some("thing.happened".into()),
        correlation_id: None,
        causation_id: None,
        traceparent: None,
        content_type: Some("application/json".into()),
        payload: bytes::Bytes::from(format!("{{\"dedup\":\"{dedup}\"}}")),
        max_attempts: 3,
        delivery: mailroom_core::Delivery::Now,
        priority: 0,
    }
}

/// Expands to one `#[test]` per conformance test. `$factory` is an
/// expression (typically an `async` block) evaluated once per test that
/// yields a [`Fixture`] holding a fresh, migrated store.
#[macro_export]
macro_rules! suite {
    ($factory:expr) => {
        $crate::suite!(@tests $factory;
            insert_then_get_round_trips_every_field,
            duplicate_is_answered_with_the_same_id,
            concurrent_duplicates_store_exactly_one_event,
            migrate_is_idempotent,
            a_migrated_schema_reads_current_and_migrates_to_nothing,
            unknown_ids_are_not_found,
            claim_respects_due_time_and_max,
            claim_takes_oldest_arrival_first,
            concurrent_claimers_never_share_an_event,
            stale_token_is_rejected_after_rescue_and_reclaim,
            complete_many_applies_each_item_on_its_own_token,
            complete_and_claim_records_before_it_claims,
            extend_needs_the_current_token,
            rescue_counts_the_attempt_as_lease_expired,
            rescue_sends_an_exhausted_event_dead,
            retry_is_due_after_the_delay_on_the_store_clock,
            history_records_every_attempt,
            replay_gives_a_fresh_budget_and_attempts_keep_counting,
            replay_of_a_running_event_conflicts,
            replay_matching_replays_only_matching_non_running_events,
            replay_of_a_purged_event_is_refused,
            replay_matching_skips_and_counts_purged_events,
            skip_only_from_dead,
            delivered_later_events_are_not_claimed_before_due,
            a_delayed_event_behind_due_ones_is_claimed_once_due,
            claims_take_higher_priority_first,
            a_backlog_of_low_then_high_events_starts_the_high_ones_first,
            a_low_priority_event_waits_at_most_max_wait_behind_higher_ones,
            a_delayed_head_holds_back_its_key_until_due,
            expired_events_are_not_run_and_replay_restarts_their_clock,
            cancel_withdraws_a_pending_event_until_it_is_replayed,
            cancel_refuses_running_and_finished_events,
            cancel_matching_takes_only_matching_pending_events,
            per_key_cancelled_head_lets_the_next_go,
            per_key_claims_one_at_a_time_in_arrival_order,
            per_key_dead_head_blocks_with_block,
            per_key_dead_head_lets_the_next_go_with_skip,
            per_key_keys_run_in_parallel_and_keyless_events_are_independent,
            per_key_never_runs_two_events_of_one_key,
            next_due_reports_the_earliest_claimable_time,
            list_filters_and_pages_newest_first,
            stats_count_statuses_oldest_pending_and_blocked_keys,
            attempt_window_counts_recent_attempts_and_the_longest_running,
            purge_drops_payloads_but_keeps_dedup,
            purge_deletes_rows_past_the_dedup_window,
            search_filters_on_error_text_and_time_and_counts_matches,
            throughput_counts_received_and_finished_per_minute,
            stats_counters_match_a_full_count_after_a_mixed_workload,
            rate_budget_holds_one_grant_and_refills_at_the_rate,
            concurrent_takers_share_one_rate_budget,
            capped_claims_keep_running_events_within_max_running,
            a_topic_pause_lasts_its_time_and_is_only_lengthened,
        );
    };
    (@tests $factory:expr; $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                $crate::run($factory, $crate::tests::$name);
            }
        )*
    };
}
