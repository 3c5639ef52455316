//! `mailroom events list|show`: read events, newest first, or one with its
//! attempt history.

use super::{FilterExt, load_config, offline_engine};
use crate::table::{clip, render};
use crate::{Cli, EventsCommand};
use anyhow::{Context, Result};
use mailroom::answer::{EventList, EventObject};
use mailroom::operate::KeyCursor;
use mailroom::operate::ListFilter;
use mailroom::redact::escape_controls;
use mailroom::{Engine, Event};

pub(super) async fn run(cli: &Cli, command: &EventsCommand, json: bool) -> Result<()> {
    let engine = offline_engine(&load_config(cli)?).await?;
    match command {
        EventsCommand::List {
            filter,
            limit,
            cursor,
        } => {
            let chosen = filter.to_list_filter(None)?;
            let filter = ListFilter {
                limit: (*limit).clamp(1, 1000),
                cursor: cursor
                    .as_deref()
                    .map(str::parse)
                    .transpose()?
                    .map(KeyCursor),
                ..chosen
            };
            list(&engine, &filter, json).await
        }
        EventsCommand::Show { id } => show(&engine, id, json).await,
    }
}

async fn list(engine: &Engine, filter: &ListFilter, json: bool) -> Result<()> {
    let page = engine.operator().list(filter).await?;
    if json {
        outln!("{}", serde_json::to_string(&EventList::new(&page))?);
        return Ok(());
    }
    let next = page.next_cursor.map(|c| c.0);
    let rows: Vec<Vec<String>> = page.events.iter().map(list_row).collect();
    out!(
        "{}",
        render(
            &[
                "ID",
                "TOPIC",
                "STATUS",
                "ATTEMPTS",
                "KEY",
                "TYPE",
                "RECEIVED (UTC)",
                "LAST ERROR"
            ],
            &rows
        )
    );
    if let Some(n) = next {
        outln!("(more: --cursor {n})");
    }
    Ok(())
}

fn list_row(e: &Event) -> Vec<String> {
    vec![
        e.id.to_string(),
        e.topic.clone(),
        e.status.to_string(),
        format!("{}/{}", e.attempts, e.max_attempts),
        e.key.clone().unwrap_or_default(),
        e.event_type.clone().unwrap_or_default(),
        e.received_at.strftime("%Y-%m-%d %H:%M:%S").to_string(),
        clip(e.last_error.as_deref().unwrap_or(""), 60),
    ]
}

async fn show(engine: &Engine, id: &str, json: bool) -> Result<()> {
    let event = engine
        .operator()
        .get(id.parse()?)
        .await?
        .with_context(|| format!("no event {id}"))?;
    if json {
        outln!("{}", serde_json::to_string(&EventObject::full(&event))?);
    } else {
        show_fields(&event);
        show_history(&event);
    }
    Ok(())
}

fn show_fields(e: &Event) {
    // Stored values may hold control characters (events stored before they
    // were refused, error text of receivers): printed escaped.
    let opt = |o: &Option<String>| {
        o.as_deref()
            .map_or_else(|| "-".into(), |v| escape_controls(v).into_owned())
    };
    outln!("id              {}", e.id);
    outln!("status          {}", e.status);
    outln!("topic           {}", e.topic);
    outln!("source          {}", e.source);
    outln!("dedup key       {}", escape_controls(&e.dedup_key));
    outln!("key             {}", opt(&e.key));
    outln!("type            {}", opt(&e.event_type));
    outln!("priority        {}", e.priority);
    outln!("attempts        {} of {}", e.attempts, e.max_attempts);
    outln!("received at     {}", e.received_at);
    if let Some(t) = e.next_attempt_at {
        outln!("next attempt at {t}");
    }
    outln!("correlation id  {}", opt(&e.correlation_id));
    outln!("content type    {}", opt(&e.content_type));
    outln!("last error      {}", opt(&e.last_error));
    match &e.payload {
        None => outln!("payload         (purged by retention)"),
        Some(p) => outln!("payload         {}", clip(&String::from_utf8_lossy(p), 200)),
    }
}

fn show_history(e: &Event) {
    if e.history.is_empty() {
        return;
    }
    outln!();
    let rows: Vec<Vec<String>> = e
        .history
        .iter()
        .map(|a| {
            vec![
                a.attempt.to_string(),
                a.started_at.strftime("%H:%M:%S%.3f").to_string(),
                a.finished_at
                    .map(|t| t.strftime("%H:%M:%S%.3f").to_string())
                    .unwrap_or_default(),
                a.outcome.as_str().to_string(),
                a.worker.clone().unwrap_or_default(),
                clip(a.error.as_deref().unwrap_or(""), 70),
            ]
        })
        .collect();
    out!(
        "{}",
        render(
            &[
                "ATTEMPT", "STARTED", "FINISHED", "OUTCOME", "WORKER", "ERROR"
            ],
            &rows
        )
    );
}
