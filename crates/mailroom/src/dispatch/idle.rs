//! Sleeping between claims, shared by every topic loop: until the next due
//! time the store reports, a wake-up, or the polling fallback.

use jiff::Timestamp;
use mailroom_core::{ClaimRequest, Store};
use std::time::Duration;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

/// The shortest sleep before a claim, so a due time a hair away does not
/// spin the loop.
const MIN_SLEEP: Duration = Duration::from_millis(5);

/// How long from `now` until `at`; zero once it has passed.
pub(crate) fn until(at: Timestamp, now: Timestamp) -> Duration {
    let ms = at.as_millisecond() - now.as_millisecond();
    Duration::from_millis(u64::try_from(ms).unwrap_or(0))
}

/// How long a loop whose last claim came back short may sleep before
/// claiming `req` again: until the next due time the store reports (at
/// least [`MIN_SLEEP`]), at most `poll`, which also stands for "nothing
/// pending"; `on_error` when the store cannot tell.
pub(super) async fn until_due(
    store: &dyn Store,
    req: &ClaimRequest,
    poll: Duration,
    on_error: Duration,
) -> Duration {
    match store.next_due(req).await {
        Ok(Some(due)) => until(due, Timestamp::now()).clamp(MIN_SLEEP, poll),
        Ok(None) => poll,
        Err(_) => on_error,
    }
}

/// Sleeps for `d` or until `wake` is notified (a wake-up sent while nobody
/// waited is remembered). Returns `false` if `shutdown` came first.
pub(super) async fn nap(wake: &Notify, d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = wake.notified() => true,
        () = tokio::time::sleep(d) => true,
        () = shutdown.cancelled() => false,
    }
}

/// Sleeps for `d`. Returns `false` if `shutdown` came first.
pub(crate) async fn sleep(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = shutdown.cancelled() => false,
    }
}
