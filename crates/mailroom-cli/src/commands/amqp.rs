//! The RabbitMQ side of the binary: `mailroom amqp declare`, and
//! what `serve` does with a configuration's [`AmqpPlan`]: declare `[amqp]`
//! before anything starts (a conflicting queue stops it), then run one
//! supervised connection per broker with its sources and handlers.

use super::load_config;
use crate::table::render;
use crate::{AmqpCommand, Cli};
use anyhow::{Context, Result, anyhow, bail};
use mailroom::Engine;
use mailroom::redact::url as redact;
use mailroom_amqp::{AmqpError, AmqpStatus, Broker, Declared, declare_at};
use mailroom_config::{AmqpPlan, Specs};
use std::time::Duration;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

/// How long a start-up or CLI declare may wait for the broker.
const DECLARE_TIMEOUT: Duration = Duration::from_secs(15);

/// How long `serve` holds dispatch back for its AMQP connections to come up.
pub(super) const CONNECT_GRACE: Duration = Duration::from_secs(5);

pub(super) async fn run(cli: &Cli, command: &AmqpCommand, json: bool) -> Result<()> {
    match command {
        AmqpCommand::Declare => declare(cli, json).await,
    }
}

/// Declares `[amqp]` and prints what exists.
async fn declare(cli: &Cli, json: bool) -> Result<()> {
    let config = load_config(cli)?;
    let plan = Specs::from_config(&config)?.amqp;
    let Some(url) = plan.url.as_deref() else {
        bail!(
            "{}: no [amqp] url: nothing to declare (the [amqp] table names the broker and its exchanges and queues)",
            config.origin
        );
    };
    if let Ok(broker) = Broker::parse(url) {
        broker.warn_if_unverified();
    }
    let declared = declare_once(url, &plan).await?;
    if json {
        outln!("{}", declared_json(url, &declared));
    } else {
        print_declared(url, &declared);
    }
    Ok(())
}

/// One declare of `plan`'s topology at `url`; `None`: no answer within
/// [`DECLARE_TIMEOUT`] (a broker that accepts TCP but never speaks).
async fn timed_declare(url: &str, plan: &AmqpPlan) -> Option<Result<Declared, AmqpError>> {
    tokio::time::timeout(DECLARE_TIMEOUT, declare_at(url, &plan.topology))
        .await
        .ok()
}

async fn declare_once(url: &str, plan: &AmqpPlan) -> Result<Declared> {
    let name = redact(url);
    timed_declare(url, plan)
        .await
        .ok_or_else(|| anyhow!("{name}: no answer from the broker within {DECLARE_TIMEOUT:?}"))?
        .with_context(|| format!("declaring [amqp] on {name}"))
}

/// `serve`'s declare before it starts anything. A refusal (a queue that
/// exists with other arguments, a missing exchange...) stops `serve`: the
/// operator must fix the config or the broker. An unreachable broker does
/// not: the connection declares it once the broker answers.
pub(super) async fn declare_before_serve(plan: &AmqpPlan, origin: &str) -> Result<()> {
    let Some(url) = plan.url.as_deref() else {
        return Ok(());
    };
    let name = redact(url);
    match timed_declare(url, plan).await {
        Some(Ok(d)) => {
            tracing::info!(connection = %name, exchanges = d.exchanges.len(), queues = d.queues.len(), bindings = d.bindings.len(), "[amqp] topology declared");
            Ok(())
        }
        Some(Err(e)) if e.is_refused() => Err(anyhow!(e)).with_context(|| {
            format!("{origin}: [amqp] on {name}: refused by the broker, so mailroom does not start")
        }),
        Some(Err(e)) => {
            tracing::warn!(connection = %name, error = %e, "cannot declare [amqp] yet; it is declared when the broker answers");
            Ok(())
        }
        None => {
            tracing::warn!(connection = %name, "the broker did not answer the [amqp] declare in time; it is declared when the broker answers");
            Ok(())
        }
    }
}

/// The running connections of a plan.
pub(super) struct Running {
    tasks: JoinSet<()>,
    stop: CancellationToken,
    statuses: Vec<AmqpStatus>,
}

impl Running {
    /// Waits until every connection is up, for at most `limit`: events
    /// already due should not be first attempted on a handler whose channel
    /// is still opening (a wasted attempt of their budget). A broker that
    /// stays down is logged by its connection; `serve` goes on.
    pub(super) async fn wait_up(&self, limit: Duration) {
        let deadline = tokio::time::Instant::now() + limit;
        while !self.statuses.iter().all(AmqpStatus::is_up) && tokio::time::Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Stops every connection (consumers cancel, deliveries in flight are
    /// stored and acked, unacked ones return to their queues) and waits.
    pub(super) async fn stop(mut self) {
        self.stop.cancel();
        while self.tasks.join_next().await.is_some() {}
    }
}

/// Starts one supervised connection per broker of `plan`, each with its
/// sources and handlers, and returns them with their `/readyz` entries.
/// The sources stop consuming at `intake` (SIGTERM: what is not yet
/// delivered stays in the queues); the connections run until
/// [`Running::stop`], so the AMQP handlers can finish publishing while the
/// engine drains.
pub(super) fn start(
    plan: &AmqpPlan,
    engine: &Engine,
    intake: &CancellationToken,
) -> Result<(Running, Vec<mailroom_server::Dependency>)> {
    let connections = plan
        .connections(engine)
        .context("cannot set up the AMQP connections")?;
    let stop = CancellationToken::new();
    let mut tasks = JoinSet::new();
    let mut dependencies = vec![];
    let mut statuses = vec![];
    for conn in connections {
        let status = conn.status();
        statuses.push(status.clone());
        dependencies.push(mailroom_server::Dependency {
            kind: "amqp",
            name: status.name().to_string(),
            up: std::sync::Arc::new(move || status.is_up()),
        });
        tasks.spawn(conn.intake_until(intake.clone()).run(stop.clone()));
    }
    let running = Running {
        tasks,
        stop,
        statuses,
    };
    Ok((running, dependencies))
}

fn print_declared(url: &str, d: &Declared) {
    outln!(
        "declared on {} (declaring again changes nothing)\n",
        redact(url)
    );
    let yes = |b: bool| if b { "yes" } else { "no" }.to_string();
    let rows: Vec<Vec<String>> = d
        .exchanges
        .iter()
        .map(|e| vec![e.name.clone(), e.kind.as_str().into(), yes(e.durable)])
        .collect();
    out!("{}", render(&["EXCHANGE", "KIND", "DURABLE"], &rows));
    let rows: Vec<Vec<String>> = d
        .queues
        .iter()
        .map(|q| {
            let args: Vec<String> = q
                .arguments
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            vec![
                q.name.clone(),
                yes(q.durable),
                q.messages.to_string(),
                q.consumers.to_string(),
                args.join(" "),
            ]
        })
        .collect();
    let headers = ["QUEUE", "DURABLE", "MESSAGES", "CONSUMERS", "ARGUMENTS"];
    out!("\n{}", render(&headers, &rows));
    let rows: Vec<Vec<String>> = d
        .bindings
        .iter()
        .map(|b| vec![b.exchange.clone(), b.routing_key.clone(), b.queue.clone()])
        .collect();
    out!(
        "\n{}",
        render(&["BINDING EXCHANGE", "ROUTING KEY", "QUEUE"], &rows)
    );
}

fn declared_json(url: &str, d: &Declared) -> serde_json::Value {
    let exchanges: Vec<_> = d
        .exchanges
        .iter()
        .map(|e| serde_json::json!({"name": e.name, "kind": e.kind.as_str(), "durable": e.durable}))
        .collect();
    let queues: Vec<_> = d
        .queues
        .iter()
        .map(|q| {
            let args: serde_json::Map<String, serde_json::Value> = q
                .arguments
                .iter()
                .map(|(k, v)| (k.clone(), v.clone().into()))
                .collect();
            serde_json::json!({"name": q.name, "durable": q.durable, "arguments": args,
                "messages": q.messages, "consumers": q.consumers})
        })
        .collect();
    let bindings: Vec<_> = d
        .bindings
        .iter()
        .map(|b| serde_json::json!({"exchange": b.exchange, "routing_key": b.routing_key, "queue": b.queue}))
        .collect();
    serde_json::json!({"url": redact(url), "exchanges": exchanges, "queues": queues, "bindings": bindings})
}
