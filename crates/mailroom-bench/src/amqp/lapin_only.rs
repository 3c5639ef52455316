//! The broker's floor on this machine: lapin alone, no store.

use super::{Ctx, Meter, Phase, Route};
use anyhow::{Context, bail};
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use lapin::options::ConfirmSelectOptions;
use lapin::options::{BasicAckOptions, BasicPublishOptions};
use lapin::{BasicProperties, Confirmation};

/// The properties of every benchmark message: persistent, a `message_id`
/// (the inbound dedup key), JSON.
pub fn properties(message_id: String) -> BasicProperties {
    BasicProperties::default()
        .with_delivery_mode(2)
        .with_message_id(message_id.into())
        .with_content_type("application/json".into())
}

/// Publishes N messages to `route` with confirms, `mandatory`, pipelined:
/// every publish is sent, then every confirm awaited. Each message's
/// `message_id` is `m-<i>`. Timed as phase `name`.
pub async fn publish(ctx: &Ctx, route: &Route, name: &str) -> anyhow::Result<Phase> {
    let n = ctx.settings.messages;
    let body = crate::ingest::body(ctx.settings.body_size);
    let ch = ctx.channel().await?;
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .context("confirm.select")?;
    let options = BasicPublishOptions {
        mandatory: true,
        immediate: false,
    };
    let meter = Meter::start(ctx.broker_pid.as_deref());
    let mut confirms = Vec::with_capacity(usize::try_from(n).unwrap_or(0));
    for i in 0..n {
        let confirm = ch
            .basic_publish(
                route.exchange.as_str().into(),
                route.routing_key.as_str().into(),
                options,
                &body,
                properties(format!("m-{i}")),
            )
            .await
            .context("basic.publish")?;
        confirms.push(confirm);
    }
    await_routed(confirms).await?;
    let phase = meter.finish(name.to_string(), n, None);
    let _ = ch.close(200, "OK".into()).await;
    Ok(phase)
}

/// Consumes N messages from `queue` with `basic.qos(prefetch)`, acking
/// each one on its own (as mailroom's source does), and stores nothing.
pub async fn consume(ctx: &Ctx, queue: &str, prefetch: u16) -> anyhow::Result<Phase> {
    let n = ctx.settings.messages;
    let (ch, meter, mut consumer) = ctx.consumer(queue, prefetch).await?;
    // Acks go out concurrently with the next deliveries (as mailroom's
    // tasks send theirs), so the floor is not held back by awaiting each.
    let mut acks = FuturesUnordered::new();
    let mut got = 0;
    while got < n {
        tokio::select! {
            Some(sent) = acks.next() => {
                let sent: lapin::Result<bool> = sent;
                sent.context("basic.ack")?;
            }
            next = tokio::time::timeout(ctx.settings.timeout, consumer.next()) => {
                let delivery = next
                    .context("no delivery in time")?
                    .context("the consumer ended")?
                    .context("receiving")?;
                acks.push(async move { delivery.ack(BasicAckOptions::default()).await });
                got += 1;
            }
        }
    }
    while let Some(sent) = acks.next().await {
        sent.context("basic.ack")?;
    }
    let phase = meter.finish(
        format!("consume floor: lapin, prefetch {prefetch}"),
        n,
        None,
    );
    let _ = ch.close(200, "OK".into()).await;
    anyhow::ensure!(
        ctx.ready(queue).await? == 0,
        "{queue} is not empty after the consume floor"
    );
    Ok(phase)
}

/// Awaits each publisher confirm; fails unless every publish was acked and
/// routed (no `basic.return`).
pub(super) async fn await_routed(confirms: Vec<lapin::PublisherConfirm>) -> anyhow::Result<()> {
    for confirm in confirms {
        match confirm.await.context("awaiting a confirm")? {
            Confirmation::Ack(None) => {}
            other => bail!("publish not confirmed as routed: {other:?}"),
        }
    }
    Ok(())
}
