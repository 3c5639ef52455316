use crate::{connect, delete, unique};
use lapin::options::{
    BasicGetOptions, BasicPublishOptions, BasicRejectOptions, ConfirmSelectOptions,
    ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::FieldTable;
use lapin::{BasicProperties, Channel, ExchangeKind};
use mailroom_amqp::{AmqpError, ExchangeSpec, ExchangeType, QueueSpec, Topology, declare};
use std::time::Duration;

/// One topic exchange and one queue with TTL, max length and dead-lettering.
fn sample(base: &str) -> Topology {
    let mut queue =
        QueueSpec::new(format!("{base}.created")).bind(format!("{base}.events"), "x.created");
    queue.ttl = Some(Duration::from_secs(7 * 86400));
    queue.max_length = Some(10_000);
    queue.dead_letter = true;
    Topology {
        exchanges: vec![ExchangeSpec::new(
            format!("{base}.events"),
            ExchangeType::Topic,
        )],
        queues: vec![queue],
    }
}

async fn get_one(ch: &Channel, queue: &str) -> lapin::message::BasicGetMessage {
    for _ in 0..50 {
        if let Some(m) = ch
            .basic_get(queue.into(), BasicGetOptions::default())
            .await
            .expect("basic.get")
        {
            return m;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no message arrived in {queue}");
}

/// After a declare, a second client sees every exchange and queue (passive
/// declares), re-declaring the queue with the same arguments is accepted,
/// the binding routes, and a rejected message reaches `<queue>.dlq`.
#[tokio::test]
async fn a_second_client_sees_the_declared_topology() {
    let base = unique("topo");
    let topology = sample(&base);
    let conn = connect().await;
    let declared = declare(&conn.create_channel().await.expect("channel"), &topology)
        .await
        .expect("declare");
    let names: Vec<&str> = declared.exchanges.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(
        names,
        [format!("{base}.events"), format!("{base}.events.dlx")]
    );
    let queues: Vec<&str> = declared.queues.iter().map(|q| q.name.as_str()).collect();
    assert_eq!(
        queues,
        [format!("{base}.created.dlq"), format!("{base}.created")]
    );
    assert_eq!(declared.bindings.len(), 2);

    let other = connect().await;
    let ch = other.create_channel().await.expect("channel");
    let passive = ExchangeDeclareOptions {
        passive: true,
        ..Default::default()
    };
    for e in &names {
        ch.exchange_declare(
            (*e).into(),
            ExchangeKind::Direct,
            passive,
            FieldTable::default(),
        )
        .await
        .expect("exchange exists");
    }
    let passive = QueueDeclareOptions {
        passive: true,
        ..Default::default()
    };
    for q in &queues {
        ch.queue_declare((*q).into(), passive, FieldTable::default())
            .await
            .expect("queue exists");
    }
    let mut args = FieldTable::default();
    for (k, v) in topology.queues[0].arguments().expect("arguments") {
        args.insert(k.into(), v);
    }
    let same = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(queues[1].into(), same, args)
        .await
        .expect("same arguments accepted");

    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let confirm = ch
        .basic_publish(
            names[0].into(),
            "x.created".into(),
            BasicPublishOptions {
                mandatory: true,
                ..Default::default()
            },
            b"{}",
            BasicProperties::default(),
        )
        .await
        .expect("publish")
        .await
        .expect("confirm");
    assert!(
        confirm.is_ack() && confirm.take_message().is_none(),
        "routed by the binding"
    );
    let msg = get_one(&ch, queues[1]).await;
    msg.delivery
        .reject(BasicRejectOptions { requeue: false })
        .await
        .expect("reject");
    let dead = get_one(&ch, queues[0]).await;
    assert_eq!(dead.delivery.data, b"{}");

    delete(
        &other,
        &queues.iter().map(|q| q.to_string()).collect::<Vec<_>>(),
        &names.iter().map(|e| e.to_string()).collect::<Vec<_>>(),
    )
    .await;
}

/// Declaring the same topology twice changes nothing: same objects, and the
/// queue keeps its message.
#[tokio::test]
async fn declaring_twice_is_a_no_op() {
    let base = unique("twice");
    let topology = sample(&base);
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    let first = declare(&ch, &topology).await.expect("first declare");
    ch.basic_publish(
        format!("{base}.events").into(),
        "x.created".into(),
        BasicPublishOptions::default(),
        b"kept",
        BasicProperties::default(),
    )
    .await
    .expect("publish");
    tokio::time::sleep(Duration::from_millis(200)).await;
    let second = declare(&ch, &topology).await.expect("second declare");
    assert_eq!(first.exchanges, second.exchanges);
    assert_eq!(first.bindings, second.bindings);
    for (a, b) in first.queues.iter().zip(&second.queues) {
        assert_eq!((&a.name, &a.arguments), (&b.name, &b.arguments));
    }
    assert_eq!(second.queues[1].messages, 1, "the queue kept its message");

    let queues = [format!("{base}.created.dlq"), format!("{base}.created")];
    let exchanges = [format!("{base}.events"), format!("{base}.events.dlx")];
    delete(&conn, &queues, &exchanges).await;
}

/// A queue that already exists without a TTL makes the declare fail with an
/// error naming the queue and `x-message-ttl`.
#[tokio::test]
async fn a_conflicting_queue_is_named_with_its_argument() {
    let base = unique("conflict");
    let mut queue = QueueSpec::new(format!("{base}.q"));
    queue.ttl = Some(Duration::from_secs(60));
    let topology = Topology {
        exchanges: vec![],
        queues: vec![queue],
    };
    let conn = connect().await;
    let ch = conn.create_channel().await.expect("channel");
    let durable = QueueDeclareOptions {
        durable: true,
        ..Default::default()
    };
    ch.queue_declare(format!("{base}.q").into(), durable, FieldTable::default())
        .await
        .expect("pre-existing queue");

    let err = declare(&ch, &topology).await.expect_err("must conflict");
    match &err {
        AmqpError::Inequivalent {
            object,
            name,
            argument,
            ..
        } => {
            assert_eq!(
                (object.as_str(), name.as_str(), argument.as_str()),
                ("queue", format!("{base}.q").as_str(), "x-message-ttl")
            );
        }
        other => panic!("expected Inequivalent, got {other:?}"),
    }
    assert!(err.to_string().contains("x-message-ttl"), "{err}");

    delete(&conn, &[format!("{base}.q")], &[]).await;
}

/// Quorum, classic and stream queues with the arguments teams set reach the
/// broker: declaring twice changes nothing; a named dead-letter route takes
/// a rejected message to `<queue>.dlq` through the named exchange and
/// routing key; `overflow = reject-publish` nacks a publish into a full
/// queue; a queue declared again as another type is named with
/// `x-queue-type`.
#[tokio::test]
async fn queue_types_and_arguments_reach_the_broker() {
    use mailroom_amqp::{DeadLetterRoute, Overflow, QueueArgument, QueueType};
    let base = unique("types");
    let events = format!("{base}.events");
    let dead = format!("{base}.dead");
    let mut quorum = QueueSpec::new(format!("{base}.quorum")).bind(&events, "pay.*");
    quorum.queue_type = Some(QueueType::Quorum);
    quorum.delivery_limit = Some(3);
    quorum.dead_letter = true;
    quorum.dead_letter_route = DeadLetterRoute {
        exchange: Some(dead.clone()),
        routing_key: Some("payments".into()),
    };
    quorum.extra = vec![(
        "x-queue-leader-locator".into(),
        QueueArgument::Text("balanced".into()),
    )];
    let mut classic = QueueSpec::new(format!("{base}.classic"));
    classic.queue_type = Some(QueueType::Classic);
    classic.max_priority = Some(10);
    classic.max_length = Some(1);
    classic.overflow = Some(Overflow::RejectPublish);
    classic.auto_delete = true;
    let mut stream = QueueSpec::new(format!("{base}.stream"));
    stream.queue_type = Some(QueueType::Stream);
    let topology = Topology {
        exchanges: vec![
            ExchangeSpec::new(&events, ExchangeType::Topic),
            ExchangeSpec::new(&dead, ExchangeType::Topic),
        ],
        queues: vec![quorum.clone(), classic.clone(), stream],
    };
    let conn = connect().await;
    let declared = declare(&conn.create_channel().await.expect("channel"), &topology)
        .await
        .expect("declare");
    let names: Vec<&str> = declared.exchanges.iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, [events.as_str(), dead.as_str()], "no extra dlx");
    let q = declared
        .queues
        .iter()
        .find(|q| q.name == quorum.name)
        .expect("quorum declared");
    for arg in [
        ("x-queue-type", "quorum"),
        ("x-delivery-limit", "3"),
        ("x-dead-letter-exchange", dead.as_str()),
        ("x-dead-letter-routing-key", "payments"),
        ("x-queue-leader-locator", "balanced"),
    ] {
        assert!(
            q.arguments
                .contains(&(arg.0.to_string(), arg.1.to_string())),
            "{arg:?} in {:?}",
            q.arguments
        );
    }
    declare(&conn.create_channel().await.expect("channel"), &topology)
        .await
        .expect("declaring again changes nothing");

    // The named route: a rejected message reaches <queue>.dlq.
    let ch = conn.create_channel().await.expect("channel");
    ch.confirm_select(ConfirmSelectOptions::default())
        .await
        .expect("confirms");
    let publish = |exchange: String, key: String, body: &'static [u8]| {
        let ch = ch.clone();
        async move {
            ch.basic_publish(
                exchange.as_str().into(),
                key.as_str().into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default(),
            )
            .await
            .expect("publish")
            .await
            .expect("confirm")
        }
    };
    assert!(
        publish(events.clone(), "pay.card".into(), b"poison")
            .await
            .is_ack()
    );
    let m = get_one(&ch, &quorum.name).await;
    m.reject(BasicRejectOptions { requeue: false })
        .await
        .expect("reject");
    let dlq = get_one(&ch, &format!("{}.dlq", quorum.name)).await;
    assert_eq!(dlq.data, b"poison");
    assert_eq!(dlq.routing_key.as_str(), "payments");

    // reject-publish: the second message into a queue of one is nacked.
    let first = publish(String::new(), classic.name.clone(), b"1").await;
    let second = publish(String::new(), classic.name.clone(), b"2").await;
    assert!(first.is_ack(), "{first:?}");
    assert!(second.is_nack(), "{second:?}");

    // Another type for an existing queue is named, with its argument.
    let mut other = quorum.clone();
    other.queue_type = Some(QueueType::Classic);
    other.delivery_limit = None;
    let retyped = Topology {
        exchanges: vec![],
        queues: vec![QueueSpec {
            dead_letter: false,
            ..other
        }],
    };
    let err = declare(&conn.create_channel().await.expect("channel"), &retyped)
        .await
        .expect_err("another type conflicts");
    assert!(
        matches!(&err, AmqpError::Inequivalent { name, .. } if *name == quorum.name),
        "{err:?}"
    );
    delete(
        &conn,
        &[
            quorum.name.clone(),
            format!("{}.dlq", quorum.name),
            classic.name.clone(),
            format!("{base}.stream"),
        ],
        &[events, dead],
    )
    .await;
}
