//! Rows: inserting events (a group of them in one statement), reading one
//! with its history, and listing them a page at a time.

use super::{col, count, db, event_from_row, opt_ts, ts};
use crate::db::Db;
use mailroom_core::{
    Attempt, Delivery, Event, EventId, Inserted, KeyCursor, NewEvent, Result, StoreError,
};
use sqlx::{Postgres, Transaction};
use std::collections::{BTreeSet, HashMap};

/// Default and largest page of a listing.
pub(super) const DEFAULT_LIMIT: u32 = 100;
pub(super) const MAX_LIMIT: u32 = 1000;

/// Rows in queue order (`ord`), so the first of two same-key inserts wins;
/// each new event also gets its row in `mailroom.queue`.
const INSERT: &str = "
WITH inserted AS (
    INSERT INTO mailroom.events (id, source, topic, dedup_key, key, type, status, attempts,
        max_attempts, next_attempt_at, received_at, correlation_id, causation_id,
        content_type, payload, traceparent, priority, version)
    SELECT t.id::uuid, t.source, t.topic, t.dedup_key, t.key, t.type, 'pending', 0,
        t.max_attempts,
        COALESCE(timestamptz 'epoch' + t.due_at * interval '1 microsecond',
                 now() + COALESCE(t.due_in, 0) * interval '1 microsecond'),
        now(), t.correlation_id, t.causation_id, t.content_type, t.payload, t.traceparent,
        t.priority, t.version
    FROM UNNEST($1::text[], $2::text[], $3::text[], $4::text[], $5::text[], $6::text[],
                $7::text[], $8::text[], $9::text[], $10::bytea[], $11::int8[], $12::int8[],
                $13::int8[], $14::text[], $15::int4[], $16::text[])
         WITH ORDINALITY AS t(id, source, topic, dedup_key, key, type, correlation_id,
                              causation_id, content_type, payload, max_attempts, due_at,
                              due_in, traceparent, priority, version, ord)
    ORDER BY t.ord
    ON CONFLICT (source, dedup_key) DO NOTHING
    RETURNING seq, id::text, topic, key, next_attempt_at, priority
), queued AS (
    -- Due later: `scheduled`, out of the claims' way until due (migration 11).
    INSERT INTO mailroom.queue (seq, topic, key, priority, run_at, ready_at, state)
    SELECT seq, topic, key, priority, next_attempt_at, next_attempt_at,
           CASE WHEN next_attempt_at > now() THEN 'scheduled' ELSE 'pending' END
    FROM inserted
)
SELECT id, topic FROM inserted";

/// Inserts `events` in one transaction and announces their topics at its
/// commit; answers in the same order.
///
/// Duplicates: rows that did not come back from `RETURNING` were already
/// stored (by an earlier transaction, or by an earlier row of this very
/// batch: rows are inserted in queue order, so of two inserts of one key in
/// one batch the first wins and the second is its duplicate). Their stored
/// ids are read in the same transaction. `ON CONFLICT` waits for a
/// concurrent transaction inserting the same key to end, so the stored row
/// is committed and visible to that next statement.
pub(crate) async fn insert_batch(pool: &Db, events: &[&NewEvent]) -> Result<Vec<Inserted>> {
    const CTX: &str = "inserting events";
    for e in events {
        check_text(e)?;
    }
    let ids: Vec<String> = events.iter().map(|e| e.id.to_string()).collect();
    let mut tx = pool.begin().await.map_err(db(CTX))?;
    let mut fresh = BTreeSet::new();
    let mut topics = BTreeSet::new();
    for (id, topic) in insert_rows(&mut tx, events, &ids).await? {
        fresh.insert(id);
        topics.insert(topic);
    }
    let duplicates: Vec<&NewEvent> = events
        .iter()
        .zip(&ids)
        .filter(|(_, id)| !fresh.contains(*id))
        .map(|(e, _)| *e)
        .collect();
    let stored = stored_ids(&mut tx, &duplicates).await?;
    notify(&mut tx, topics).await?;
    let answers = answers(events, &ids, &fresh, &stored)?;
    tx.commit().await.map_err(db(CTX))?;
    Ok(answers)
}

/// Runs [`INSERT`]; returns the `(id, topic)` of each row it stored.
async fn insert_rows(
    tx: &mut Transaction<'_, Postgres>,
    events: &[&NewEvent],
    ids: &[String],
) -> Result<Vec<(String, String)>> {
    let text = |f: fn(&NewEvent) -> Option<&str>| -> Vec<Option<String>> {
        events.iter().map(|e| f(e).map(str::to_owned)).collect()
    };
    let payloads: Vec<Vec<u8>> = events.iter().map(|e| e.payload.to_vec()).collect();
    let budgets: Vec<i64> = events.iter().map(|e| i64::from(e.max_attempts)).collect();
    // Each event's first due time: an instant (µs since the epoch), or a
    // delay from the database's `now()`; neither means now.
    let (due_at, due_in): (Vec<Option<i64>>, Vec<Option<i64>>) = events
        .iter()
        .map(|e| match e.delivery {
            Delivery::Now => (None, None),
            Delivery::At(at) => (Some(micros_since_epoch(at)), None),
            Delivery::After(d) => (None, Some(super::micros(d))),
        })
        .unzip();
    sqlx::query_as(INSERT)
        .bind(ids)
        .bind(text(|e| Some(&e.source)))
        .bind(text(|e| Some(&e.topic)))
        .bind(text(|e| Some(&e.dedup_key)))
        .bind(text(|e| e.key.as_deref()))
        .bind(text(|e| e.event_type.as_deref()))
        .bind(text(|e| e.correlation_id.as_deref()))
        .bind(text(|e| e.causation_id.as_deref()))
        .bind(text(|e| e.content_type.as_deref()))
        .bind(payloads)
        .bind(budgets)
        .bind(due_at)
        .bind(due_in)
        .bind(text(|e| e.traceparent.as_deref()))
        .bind(events.iter().map(|e| e.priority).collect::<Vec<i32>>())
        .bind(text(|e| e.version.as_deref()))
        .fetch_all(&mut **tx)
        .await
        .map_err(db("inserting events"))
}

/// `at` as microseconds since the Unix epoch.
fn micros_since_epoch(at: jiff::Timestamp) -> i64 {
    at.as_microsecond()
}

/// The stored ids of `duplicates`, by (source, dedup key).
async fn stored_ids(
    tx: &mut Transaction<'_, Postgres>,
    duplicates: &[&NewEvent],
) -> Result<HashMap<(String, String), String>> {
    if duplicates.is_empty() {
        return Ok(HashMap::new());
    }
    let sources: Vec<String> = duplicates.iter().map(|e| e.source.clone()).collect();
    let dedup_keys: Vec<String> = duplicates.iter().map(|e| e.dedup_key.clone()).collect();
    let found: Vec<(String, String, String)> = sqlx::query_as(
        "SELECT e.source, e.dedup_key, e.id::text FROM mailroom.events e
         JOIN UNNEST($1::text[], $2::text[]) AS k(source, dedup_key)
           ON e.source = k.source AND e.dedup_key = k.dedup_key",
    )
    .bind(sources)
    .bind(dedup_keys)
    .fetch_all(&mut **tx)
    .await
    .map_err(db("inserting events"))?;
    Ok(found.into_iter().map(|(s, d, id)| ((s, d), id)).collect())
}

/// Announces `topics` at commit, to every instance listening, so idle
/// dispatchers wake without waiting for their poll.
async fn notify(tx: &mut Transaction<'_, Postgres>, topics: BTreeSet<String>) -> Result<()> {
    if topics.is_empty() {
        return Ok(());
    }
    sqlx::query("SELECT pg_notify($1, t) FROM UNNEST($2::text[]) AS t")
        .bind(crate::NOTIFY_CHANNEL)
        .bind(topics.into_iter().collect::<Vec<_>>())
        .execute(&mut **tx)
        .await
        .map_err(db("inserting events"))?;
    Ok(())
}

/// One answer per event: fresh ones are new, the others duplicates of
/// their stored row.
fn answers(
    events: &[&NewEvent],
    ids: &[String],
    fresh: &BTreeSet<String>,
    stored: &HashMap<(String, String), String>,
) -> Result<Vec<Inserted>> {
    events
        .iter()
        .zip(ids)
        .map(|(e, id)| {
            if fresh.contains(id) {
                return Ok(Inserted {
                    id: e.id,
                    duplicate: false,
                });
            }
            let Some(stored_id) = stored.get(&(e.source.clone(), e.dedup_key.clone())) else {
                // Deleted by retention between the two statements: let the caller retry.
                return Err(StoreError::Unavailable(format!(
                    "postgres: the stored event for dedup key {:?} vanished during the insert",
                    e.dedup_key
                )));
            };
            Ok(Inserted {
                id: EventId::parse_stored(stored_id)?,
                duplicate: true,
            })
        })
        .collect()
}

/// PostgreSQL `text` cannot hold NUL; refuse such input before it can fail a
/// whole group.
fn check_text(e: &NewEvent) -> Result<()> {
    let fields = [
        ("source", Some(e.source.as_str())),
        ("topic", Some(e.topic.as_str())),
        ("dedup key", Some(e.dedup_key.as_str())),
        ("key", e.key.as_deref()),
        ("type", e.event_type.as_deref()),
        ("correlation id", e.correlation_id.as_deref()),
        ("causation id", e.causation_id.as_deref()),
        ("version", e.version.as_deref()),
        ("traceparent", e.traceparent.as_deref()),
        ("content type", e.content_type.as_deref()),
    ];
    for (name, value) in fields {
        if value.is_some_and(|v| v.contains('\0')) {
            return Err(StoreError::Invalid(format!(
                "the event's {name} contains a NUL character"
            )));
        }
    }
    Ok(())
}

/// The attempt history of the event stored as `seq`, oldest first.
async fn history(pool: &Db, seq: i64) -> Result<Vec<Attempt>> {
    const CTX: &str = "reading attempt history";
    let rows = sqlx::query(concat!(
        "SELECT attempt, ",
        us!("started_at"),
        ", ",
        us!("finished_at"),
        ", outcome, error, worker
         FROM mailroom.attempts WHERE event_seq = $1 ORDER BY attempt"
    ))
    .bind(seq)
    .fetch_all(pool)
    .await
    .map_err(db(CTX))?;
    rows.iter()
        .map(|row| {
            let outcome: String = col(row, 3)?;
            Ok(Attempt {
                attempt: count(row, 0)?,
                started_at: ts(col(row, 1)?)?,
                finished_at: opt_ts(col(row, 2)?)?,
                outcome: outcome.parse().map_err(StoreError::Corrupt)?,
                error: col(row, 4)?,
                worker: col(row, 5)?,
            })
        })
        .collect()
}

/// One event without its history, with its `seq`.
pub(super) async fn event_by_id(pool: &Db, id: EventId) -> Result<Option<(i64, Event)>> {
    let row = sqlx::query(concat!(
        "SELECT ",
        event_cols!(),
        " FROM mailroom.events e WHERE e.id = $1::text::uuid"
    ))
    .bind(id.to_string())
    .fetch_optional(pool)
    .await
    .map_err(db("reading an event"))?;
    row.as_ref().map(event_from_row).transpose()
}

/// One event with its history.
pub(crate) async fn get(pool: &Db, id: EventId) -> Result<Option<Event>> {
    match event_by_id(pool, id).await? {
        None => Ok(None),
        Some((seq, mut event)) => {
            event.history = history(pool, seq).await?;
            Ok(Some(event))
        }
    }
}

/// The `seq` a listing cursor stands for.
pub(super) async fn cursor_seq(pool: &Db, KeyCursor(after_id): KeyCursor) -> Result<i64> {
    let seq: Option<i64> =
        sqlx::query_scalar("SELECT seq FROM mailroom.events WHERE id = $1::text::uuid")
            .bind(after_id.to_string())
            .fetch_optional(pool)
            .await
            .map_err(db("listing events"))?;
    seq.ok_or_else(|| StoreError::Invalid(format!("cursor {after_id} names no stored event")))
}
