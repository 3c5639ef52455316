//! Reading events a page at a time: listings (by topic, status, key) and
//! an operator's searches (error text, time range, dead letters), and
//! their counts.

use super::rows::{DEFAULT_LIMIT, MAX_LIMIT, cursor_seq};
use super::{col, db, events_from_rows};
use crate::db::Db;
use mailroom_core::{Event, EventSearch, ListFilter, Page, Result, Status};

/// A page of events, newest first: the primary key walked backwards.
/// `$1` topic (NULL here), `$2` status, `$3` key, `$4` before this seq, `$5` limit.
const LIST_ALL: &str = concat!(
    "SELECT ",
    event_cols!(),
    " FROM mailroom.events e
     WHERE ($1::text IS NULL OR e.topic = $1)
       AND ($2::text IS NULL OR e.status = $2)
       AND ($3::text IS NULL OR e.key = $3)
       AND ($4::int8 IS NULL OR e.seq < $4)
     ORDER BY e.seq DESC LIMIT $5"
);

/// The same for one topic, read backwards from `events_topic_seq`. The
/// topic is spelled `= ANY(ARRAY[$1])` and the rows ordered by `(topic,
/// seq)` so that only that index yields the order, whatever the
/// statistics say: the primary key walked backwards would step over every
/// other topic's events (`docs/src/design/postgres.md`, "Listing one topic").
pub(super) const LIST_TOPIC: &str = concat!(
    "SELECT ",
    event_cols!(),
    " FROM mailroom.events e
     WHERE e.topic = ANY(ARRAY[$1::text])
       AND ($2::text IS NULL OR e.status = $2)
       AND ($3::text IS NULL OR e.key = $3)
       AND ($4::int8 IS NULL OR e.seq < $4)
     ORDER BY e.topic DESC, e.seq DESC LIMIT $5"
);

/// Events matching `filter`, newest first, a page at a time.
pub(crate) async fn list(pool: &Db, filter: &ListFilter) -> Result<Page> {
    const CTX: &str = "listing events";
    if filter.status == Some(Status::Dead) {
        let search = EventSearch {
            filter: filter.clone(),
            ..EventSearch::default()
        };
        return walk(pool, &search).await;
    }
    let limit = match filter.limit {
        0 => DEFAULT_LIMIT,
        n => n.min(MAX_LIMIT),
    };
    let after_seq = match filter.cursor {
        None => None,
        Some(cursor) => Some(cursor_seq(pool, cursor).await?),
    };
    // One row more than the page tells whether another page follows.
    let sql = if filter.topic.is_some() {
        LIST_TOPIC
    } else {
        LIST_ALL
    };
    let rows = sqlx::query(sql)
        .bind(filter.topic.as_deref())
        .bind(filter.status.map(Status::as_str))
        .bind(filter.key.as_deref())
        .bind(after_seq)
        .bind(i64::from(limit) + 1)
        .fetch_all(pool)
        .await
        .map_err(db(CTX))?;
    let events: Vec<Event> = events_from_rows(&rows)?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    Ok(Page::from_overfetch(events, limit))
}

/// The conditions of a search ($1..$6), on events aliased `e`.
macro_rules! search_where {
    () => {
        "($1::text IS NULL OR e.topic = $1)
    AND ($2::text IS NULL OR e.status = $2)
    AND ($3::text IS NULL OR e.key = $3)
    AND ($4::text IS NULL OR strpos(e.last_error, $4) > 0)
    AND ($5::int8 IS NULL OR e.received_at >= timestamptz 'epoch' + $5 * interval '1 microsecond')
    AND ($6::int8 IS NULL OR e.received_at < timestamptz 'epoch' + $6 * interval '1 microsecond')"
    };
}

fn bind_search<'q>(
    q: sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments>,
    s: &'q EventSearch,
) -> sqlx::query::Query<'q, sqlx::Postgres, sqlx::postgres::PgArguments> {
    q.bind(s.filter.topic.as_deref())
        .bind(s.filter.status.map(Status::as_str))
        .bind(s.filter.key.as_deref())
        .bind(s.error_contains.as_deref())
        .bind(s.received_from.map(|t| t.as_microsecond()))
        .bind(s.received_until.map(|t| t.as_microsecond()))
}

/// The dead letters matching a search (`$2` is `'dead'`), walked back
/// from `mailroom.dead_letters` (schema migration 12), so a page and a
/// count read the dead events only, however many others are stored.
macro_rules! dead_letters {
    () => {
        " FROM mailroom.dead_letters d JOIN mailroom.events e ON e.seq = d.seq
         WHERE ($1::text IS NULL OR d.topic = $1) AND "
    };
}

/// Events matching `search`, newest first. Dead letters are read from
/// their own table; otherwise, without an error or time filter it is the
/// plain listing ([`list`], planned per index); with one, a walk back
/// by `seq` that the filters keep short.
pub(crate) async fn search(pool: &Db, search: &EventSearch) -> Result<Page> {
    if search.filter.status != Some(Status::Dead) && !search.narrows_list() {
        return list(pool, &search.filter).await;
    }
    walk(pool, search).await
}

/// [`search`] as a walk back by `seq`: over the dead letters for dead
/// events, over every event otherwise.
async fn walk(pool: &Db, search: &EventSearch) -> Result<Page> {
    const CTX: &str = "searching events";
    let dead = search.filter.status == Some(Status::Dead);
    let limit = match search.filter.limit {
        0 => DEFAULT_LIMIT,
        n => n.min(MAX_LIMIT),
    };
    let after_seq = match search.filter.cursor {
        None => None,
        Some(cursor) => Some(cursor_seq(pool, cursor).await?),
    };
    let sql = if dead {
        concat!(
            "SELECT ",
            event_cols!(),
            dead_letters!(),
            search_where!(),
            " AND ($7::int8 IS NULL OR d.seq < $7) ORDER BY d.seq DESC LIMIT $8"
        )
    } else {
        concat!(
            "SELECT ",
            event_cols!(),
            " FROM mailroom.events e WHERE ",
            search_where!(),
            " AND ($7::int8 IS NULL OR e.seq < $7) ORDER BY e.seq DESC LIMIT $8"
        )
    };
    let rows = bind_search(sqlx::query(sql), search)
        .bind(after_seq)
        .bind(i64::from(limit) + 1)
        .fetch_all(pool)
        .await
        .map_err(db(CTX))?;
    let events = events_from_rows(&rows)?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    Ok(Page::from_overfetch(events, limit))
}

/// How many events match `search`.
pub(crate) async fn count_matching(pool: &Db, search: &EventSearch) -> Result<u64> {
    let sql = if search.filter.status == Some(Status::Dead) {
        concat!("SELECT count(*)", dead_letters!(), search_where!())
    } else {
        concat!(
            "SELECT count(*) FROM mailroom.events e WHERE ",
            search_where!()
        )
    };
    let row: (i64,) = bind_search(sqlx::query(sql), search)
        .fetch_one(pool)
        .await
        .map_err(db("counting events"))
        .and_then(|r| Ok((col(&r, 0)?,)))?;
    Ok(row.0.unsigned_abs())
}
