//! The transactional outbox: write an event in the application's
//! own transaction, next to its business write.
//!
//! SQL clients call the function directly:
//!
//! ```sql
//! BEGIN;
//! UPDATE accounts SET ... ;
//! SELECT mailroom.enqueue('payments', 'payment.created', 'customer-7',
//!                         '{"amount": 42}'::jsonb, 'payment-123');
//! COMMIT;
//! ```
//!
//! The event (source `outbox`, content type `application/json`, 15 attempts
//! unless a sixth argument `max_attempts` says otherwise) is stored as
//! `pending` and a notification wakes the dispatchers — both only when the
//! transaction commits. A repeated `dedup_key` returns the stored id; a
//! NULL one never deduplicates. Nothing checks the event against its
//! topic's rules at insert time: a NULL `key` in a sequential topic makes an
//! independent event, run outside every key's order (intake would have
//! refused it).
//!
//! Rust applications using sqlx call [`enqueue`] with `&mut *tx`.

use crate::sql::db;
use mailroom_core::{EventId, Result};
use uuid::Uuid;

/// Calls `mailroom.enqueue(topic, type, key, payload, dedup_key)` on `conn`
/// — typically `&mut *tx` of the application's own
/// [`sqlx::Transaction`], so the event commits or rolls back with it.
/// Returns the id of the stored event (the earlier one for a repeated
/// `dedup_key`).
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
/// let mut tx = pool.begin().await?;
/// // ... the application's own writes on &mut *tx ...
/// let payload = serde_json::json!({"amount": 42});
/// mailroom_postgres::outbox::enqueue(
///     &mut *tx, "payments", "payment.created", Some("customer-7"), &payload, Some("payment-123"),
/// ).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
pub async fn enqueue(
    conn: &mut sqlx::PgConnection,
    topic: &str,
    event_type: &str,
    key: Option<&str>,
    payload: &serde_json::Value,
    dedup_key: Option<&str>,
) -> Result<Uuid> {
    let id: String =
        sqlx::query_scalar("SELECT mailroom.enqueue($1, $2, $3, $4::text::jsonb, $5)::text")
            .bind(topic)
            .bind(event_type)
            .bind(key)
            .bind(payload.to_string())
            .bind(dedup_key)
            .fetch_one(conn)
            .await
            .map_err(db("enqueueing an outbox event"))?;
    Ok(EventId::parse_stored(&id)?.0)
}

/// When and in which order an outbox event runs: the optional
/// trailing arguments `deliver_at` and `priority` of `mailroom.enqueue`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Scheduling {
    /// Not run before this instant (`None`: now).
    pub deliver_at: Option<jiff::Timestamp>,
    /// Claim order within the topic: higher first (default 0).
    pub priority: i32,
}

/// [`enqueue`] with [`Scheduling`]: calls `mailroom.enqueue(topic, type,
/// key, payload, dedup_key, max_attempts => NULL, deliver_at, priority)`
/// (a NULL budget means the default, 15 attempts).
pub async fn enqueue_scheduled(
    conn: &mut sqlx::PgConnection,
    topic: &str,
    event_type: &str,
    key: Option<&str>,
    payload: &serde_json::Value,
    dedup_key: Option<&str>,
    scheduling: Scheduling,
) -> Result<Uuid> {
    let id: String = sqlx::query_scalar(
        "SELECT mailroom.enqueue($1, $2, $3, $4::text::jsonb, $5, NULL,
                                 $6::text::timestamptz, $7)::text",
    )
    .bind(topic)
    .bind(event_type)
    .bind(key)
    .bind(payload.to_string())
    .bind(dedup_key)
    .bind(scheduling.deliver_at.map(|t| t.to_string()))
    .bind(scheduling.priority)
    .fetch_one(conn)
    .await
    .map_err(db("enqueueing an outbox event"))?;
    Ok(EventId::parse_stored(&id)?.0)
}
