//! Errors a [`Store`](crate::Store) reports.

/// `Result` with [`StoreError`] as the default error.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;

/// What went wrong in a store operation.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The store could not be reached or could not commit. Nothing from the
    /// failed operation was made durable, so intake must answer 503 / nack.
    #[error("store unavailable: {0}")]
    Unavailable(String),
    /// The group-commit queue is full; the caller should shed load (503 with
    /// `Retry-After`) rather than wait without bound.
    #[error("store overloaded: the write queue is full")]
    Overloaded,
    /// A completion, nack or extension carried a fencing token that is no
    /// longer the event's current one: its lease expired and the event was
    /// rescued or claimed again.
    #[error("stale fencing token: the lease was lost")]
    StaleToken,
    /// No event has that id.
    #[error("no such event")]
    NotFound,
    /// The event is not in a state that allows the operation (for example,
    /// replaying an event that is running).
    #[error("conflict: {0}")]
    Conflict(String),
    /// The event's payload was dropped by retention (its row stays for
    /// deduplication), so it cannot be processed again: replaying it would
    /// hand its handler an empty body.
    #[error("event {0} cannot be replayed: its payload was purged by retention")]
    Purged(crate::EventId),
    /// Stored data could not be decoded. Reported, never silently skipped.
    #[error("corrupt stored data: {0}")]
    Corrupt(String),
    /// The input was refused before it reached the database (for example, an
    /// unknown status name in a filter).
    #[error("invalid request: {0}")]
    Invalid(String),
    /// The database's schema is one this build cannot run against: older
    /// (its migrations not applied yet) or newer and incompatible. Nothing
    /// was changed.
    #[error("{}", .0.explain())]
    Schema(crate::SchemaVersion),
}
