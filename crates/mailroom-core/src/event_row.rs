//! A stored event as both stores select it: one list of columns, in one
//! order, and one decoding of a row into an [`Event`].
//!
//! Each store spells the list in its own SQL (its time columns converted
//! to its stored unit) and checks in a test that the spelling names
//! [`EVENT_COLUMNS`] in order; it reads a row through [`EventRow`], which
//! turns its column types into Rust ones, and [`decode`] builds the event.

use crate::{Event, EventId, Result, StoreError};
use bytes::Bytes;
use jiff::Timestamp;

/// One column of a stored event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventColumn {
    /// `seq`: arrival order, the store's own key.
    Seq,
    /// `id`.
    Id,
    /// `source`.
    Source,
    /// `topic`.
    Topic,
    /// `dedup_key`.
    DedupKey,
    /// `key`.
    Key,
    /// `type`.
    Type,
    /// `status`.
    Status,
    /// `attempts`.
    Attempts,
    /// `max_attempts`.
    MaxAttempts,
    /// `next_attempt_at`.
    NextAttemptAt,
    /// `received_at`.
    ReceivedAt,
    /// `correlation_id`.
    CorrelationId,
    /// `causation_id`.
    CausationId,
    /// `content_type`.
    ContentType,
    /// `payload`.
    Payload,
    /// `last_error`.
    LastError,
    /// `lease_until`.
    LeaseUntil,
    /// `traceparent`.
    Traceparent,
    /// `priority`.
    Priority,
    /// `version`.
    Version,
}

/// The columns every statement returning events selects, in this order.
pub const EVENT_COLUMNS: [EventColumn; 21] = {
    use EventColumn::*;
    [
        Seq,
        Id,
        Source,
        Topic,
        DedupKey,
        Key,
        Type,
        Status,
        Attempts,
        MaxAttempts,
        NextAttemptAt,
        ReceivedAt,
        CorrelationId,
        CausationId,
        ContentType,
        Payload,
        LastError,
        LeaseUntil,
        Traceparent,
        Priority,
        Version,
    ]
};

impl EventColumn {
    /// Its position in a selected row (0-based).
    pub fn index(self) -> usize {
        self as usize
    }

    /// Its name in the stores' `events` tables.
    pub fn name(self) -> &'static str {
        use EventColumn::*;
        match self {
            Seq => "seq",
            Id => "id",
            Source => "source",
            Topic => "topic",
            DedupKey => "dedup_key",
            Key => "key",
            Type => "type",
            Status => "status",
            Attempts => "attempts",
            MaxAttempts => "max_attempts",
            NextAttemptAt => "next_attempt_at",
            ReceivedAt => "received_at",
            CorrelationId => "correlation_id",
            CausationId => "causation_id",
            ContentType => "content_type",
            Payload => "payload",
            LastError => "last_error",
            LeaseUntil => "lease_until",
            Traceparent => "traceparent",
            Priority => "priority",
            Version => "version",
        }
    }
}

/// One selected row of [`EVENT_COLUMNS`], read in Rust types; a value the
/// store cannot read is [`StoreError::Corrupt`], naming the column.
pub trait EventRow {
    /// A text column (`NULL` is an error).
    fn text(&self, column: EventColumn) -> Result<String>;
    /// A text column that may be `NULL`.
    fn opt_text(&self, column: EventColumn) -> Result<Option<String>>;
    /// An integer column.
    fn integer(&self, column: EventColumn) -> Result<i64>;
    /// An instant that may be `NULL`, in the store's stored unit.
    fn opt_instant(&self, column: EventColumn) -> Result<Option<Timestamp>>;
    /// The payload's bytes, `None` once purged.
    fn bytes(&self, column: EventColumn) -> Result<Option<Bytes>>;
}

/// Decodes a row of [`EVENT_COLUMNS`]; returns its `seq` too. The history
/// is left empty (single-event reads fill it).
pub fn decode(row: &impl EventRow) -> Result<(i64, Event)> {
    use EventColumn::*;
    let id = row.text(Id)?;
    let event = Event {
        id: EventId::parse_stored(&id)?,
        source: row.text(Source)?,
        topic: row.text(Topic)?,
        dedup_key: row.text(DedupKey)?,
        key: row.opt_text(Key)?,
        event_type: row.opt_text(Type)?,
        status: row.text(Status)?.parse().map_err(StoreError::Corrupt)?,
        attempts: count(row, Attempts)?,
        max_attempts: count(row, MaxAttempts)?,
        next_attempt_at: row.opt_instant(NextAttemptAt)?,
        received_at: row
            .opt_instant(ReceivedAt)?
            .ok_or_else(|| null(ReceivedAt))?,
        correlation_id: row.opt_text(CorrelationId)?,
        causation_id: row.opt_text(CausationId)?,
        version: row.opt_text(Version)?,
        content_type: row.opt_text(ContentType)?,
        payload: row.bytes(Payload)?,
        last_error: row.opt_text(LastError)?,
        lease_until: row.opt_instant(LeaseUntil)?,
        traceparent: row.opt_text(Traceparent)?,
        priority: {
            let p = row.integer(Priority)?;
            i32::try_from(p).map_err(|_| out_of_range(Priority, p))?
        },
        history: Vec::new(),
    };
    Ok((row.integer(Seq)?, event))
}

/// A count column (attempts) as `u32`.
fn count(row: &impl EventRow, column: EventColumn) -> Result<u32> {
    let n = row.integer(column)?;
    u32::try_from(n).map_err(|_| out_of_range(column, n))
}

fn out_of_range(column: EventColumn, n: i64) -> StoreError {
    StoreError::Corrupt(format!("events column {}: {n} out of range", column.name()))
}

fn null(column: EventColumn) -> StoreError {
    StoreError::Corrupt(format!("events column {}: NULL", column.name()))
}

/// The column names of a store's select list, in order: the list split at
/// commas outside parentheses, each item's last qualified name, or the
/// item itself when bare, without a cast (`e.seq` is `seq`, `e.id::text` is
/// `id`, `(extract(epoch FROM e.received_at) * 1000000)::int8` is
/// `received_at`). Stores check theirs against
/// [`EVENT_COLUMNS`] with it.
pub fn selected_names(select_list: &str) -> Vec<String> {
    let mut items = Vec::new();
    let (mut depth, mut start) = (0i32, 0);
    for (i, c) in select_list.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                items.push(&select_list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    items.push(&select_list[start..]);
    items
        .into_iter()
        .map(|item| {
            let item = item.trim();
            let qualified = item
                .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == '.'))
                .rfind(|w| w.contains('.') && w.starts_with(|c: char| c.is_alphabetic()));
            let name = qualified.unwrap_or_else(|| item.split("::").next().unwrap_or(item));
            name.rsplit('.').next().unwrap_or(name).to_owned()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    /// The positions are the list's order and the names are the tables'.
    #[test]
    fn columns_are_numbered_in_the_selected_order() {
        for (i, c) in EVENT_COLUMNS.iter().enumerate() {
            assert_eq!(c.index(), i, "{c:?}");
        }
        assert_eq!(EVENT_COLUMNS[0].name(), "seq");
        assert_eq!(EVENT_COLUMNS[19].name(), "priority");
        assert_eq!(EVENT_COLUMNS[20].name(), "version");
    }

    /// Select lists read as their column names, whether bare, qualified,
    /// cast or converted by an expression.
    #[test]
    fn select_lists_read_as_column_names() {
        assert_eq!(
            selected_names(
                "e.seq, e.id::text, (extract(epoch FROM e.next_attempt_at) * 1000000)::int8, \
                 e.priority"
            ),
            ["seq", "id", "next_attempt_at", "priority"]
        );
        assert_eq!(
            selected_names("seq, id, lease_until, traceparent"),
            ["seq", "id", "lease_until", "traceparent"]
        );
    }

    struct Fake(Vec<Option<&'static str>>);

    impl EventRow for Fake {
        fn text(&self, c: EventColumn) -> Result<String> {
            self.opt_text(c)?.ok_or_else(|| null(c))
        }
        fn opt_text(&self, c: EventColumn) -> Result<Option<String>> {
            Ok(self.0[c.index()].map(str::to_owned))
        }
        fn integer(&self, c: EventColumn) -> Result<i64> {
            Ok(self.text(c)?.parse().unwrap())
        }
        fn opt_instant(&self, c: EventColumn) -> Result<Option<Timestamp>> {
            Ok(self.0[c.index()].map(|t| t.parse().unwrap()))
        }
        fn bytes(&self, c: EventColumn) -> Result<Option<Bytes>> {
            Ok(self.0[c.index()].map(|t| Bytes::from(t.as_bytes())))
        }
    }

    fn row() -> Vec<Option<&'static str>> {
        vec![
            Some("7"),
            Some("0190a0b4-7c2e-7d3a-9b1f-3c2d1e0f4a5b"),
            Some("github"),
            Some("t"),
            Some("d1"),
            Some("k"),
            None,
            Some("pending"),
            Some("2"),
            Some("5"),
            Some("2026-01-01T00:00:00Z"),
            Some("2025-12-31T23:59:00Z"),
            Some("corr"),
            None,
            Some("application/json"),
            Some("{}"),
            Some("boom"),
            None,
            None,
            Some("-3"),
            Some("2.1"),
        ]
    }

    /// Each column lands in its field; out-of-range counts and a missing
    /// `received_at` are refused as corrupt rather than wrapped or invented.
    #[test]
    fn a_row_decodes_into_its_event_and_bad_values_are_corrupt() {
        let (seq, e) = decode(&Fake(row())).unwrap();
        assert_eq!(seq, 7);
        assert_eq!((e.source.as_str(), e.topic.as_str()), ("github", "t"));
        assert_eq!((e.key.as_deref(), e.event_type), (Some("k"), None));
        assert_eq!((e.attempts, e.max_attempts, e.priority), (2, 5, -3));
        assert_eq!(e.status, crate::Status::Pending);
        assert_eq!(e.payload.as_deref(), Some(&b"{}"[..]));
        assert_eq!(e.correlation_id.as_deref(), Some("corr"));
        assert_eq!(e.version.as_deref(), Some("2.1"));
        assert_eq!(e.last_error.as_deref(), Some("boom"));
        assert_eq!(e.received_at.to_string(), "2025-12-31T23:59:00Z");
        assert!(e.lease_until.is_none() && e.history.is_empty());

        let mut negative = row();
        negative[EventColumn::Attempts.index()] = Some("-1");
        let err = decode(&Fake(negative)).unwrap_err().to_string();
        assert!(err.contains("attempts"), "{err}");
        let mut missing = row();
        missing[EventColumn::ReceivedAt.index()] = None;
        assert!(matches!(
            decode(&Fake(missing)),
            Err(StoreError::Corrupt(_))
        ));
    }
}
