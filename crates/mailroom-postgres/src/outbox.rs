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
//! Optional trailing arguments `correlation_id` and `causation_id` tie the
//! event to a flow: both are stored, and handlers are given them. A
//! follow-up event that names its cause (`causation_id => '<event id>'`)
//! and no correlation id keeps the cause's correlation id:
//!
//! ```sql
//! SELECT mailroom.enqueue('invoices', 'invoice.issued', 'customer-7',
//!                         '{"invoice": 9}'::jsonb, 'invoice-9',
//!                         causation_id => '01a2224c-ef3f-7e51-a135-4fe913eaff64');
//! ```
//!
//! Rust applications using sqlx call [`enqueue`] with `&mut *tx`
//! ([`enqueue_correlated`] for the ids).

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

/// Which flow an outbox event belongs to: the optional trailing
/// arguments `correlation_id` and `causation_id` of `mailroom.enqueue`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Correlation {
    /// The flow's id, given to handlers (`mailroom-correlation-id`) and
    /// published as AMQP's `correlation_id`. `None` with a causation id
    /// that names a stored event: that event's correlation id.
    pub correlation_id: Option<String>,
    /// The id of the event that caused this one.
    pub causation_id: Option<String>,
}

impl Correlation {
    /// A follow-up of the stored event `cause`: caused by it, in its
    /// correlation (looked up by the database as the event is written).
    pub fn follows(cause: Uuid) -> Self {
        Self {
            correlation_id: None,
            causation_id: Some(cause.to_string()),
        }
    }
}

/// [`enqueue_scheduled`] with a [`Correlation`]: calls
/// `mailroom.enqueue(topic, type, key, payload, dedup_key, max_attempts =>
/// NULL, deliver_at, priority, correlation_id, causation_id)`.
///
/// ```no_run
/// # async fn demo(pool: sqlx::PgPool, order_event: uuid::Uuid) -> Result<(), Box<dyn std::error::Error>> {
/// use mailroom_postgres::outbox::{Correlation, Scheduling, enqueue_correlated};
/// let mut tx = pool.begin().await?;
/// enqueue_correlated(
///     &mut *tx, "invoices", "invoice.issued", Some("customer-7"),
///     &serde_json::json!({"invoice": 9}), Some("invoice-9"),
///     Scheduling::default(), &Correlation::follows(order_event),
/// ).await?;
/// tx.commit().await?;
/// # Ok(()) }
/// ```
#[allow(clippy::too_many_arguments)]
pub async fn enqueue_correlated(
    conn: &mut sqlx::PgConnection,
    topic: &str,
    event_type: &str,
    key: Option<&str>,
    payload: &serde_json::Value,
    dedup_key: Option<&str>,
    scheduling: Scheduling,
    correlation: &Correlation,
) -> Result<Uuid> {
    let id: String = sqlx::query_scalar(
        "SELECT mailroom.enqueue($1, $2, $3, $4::text::jsonb, $5, NULL,
                                 $6::text::timestamptz, $7, $8, $9)::text",
    )
    .bind(topic)
    .bind(event_type)
    .bind(key)
    .bind(payload.to_string())
    .bind(dedup_key)
    .bind(scheduling.deliver_at.map(|t| t.to_string()))
    .bind(scheduling.priority)
    .bind(correlation.correlation_id.as_deref())
    .bind(correlation.causation_id.as_deref())
    .fetch_one(conn)
    .await
    .map_err(db("enqueueing an outbox event"))?;
    Ok(EventId::parse_stored(&id)?.0)
}
