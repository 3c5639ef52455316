//! Signed webhooks of the three most common schemes, each sent twice over
//! real HTTP: stored once, both answered 200 with one id.

use super::support::{Server, problem, start};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use mailroom::{Field, SourceSpec, TopicSpec};
use mailroom_server::ServerOptions;
use mailroom_signatures::{DEFAULT_TOLERANCE, Scheme, Verifier};
use serde_json::Value;
use sha2::Sha256;

fn hmac(key: &[u8], parts: &[&[u8]]) -> Vec<u8> {
    let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("any key length");
    for p in parts {
        mac.update(p);
    }
    mac.finalize().into_bytes().to_vec()
}

fn now() -> String {
    jiff::Timestamp::now().as_second().to_string()
}

async fn server(source: SourceSpec) -> Server {
    let topic = source.topic.clone();
    start(
        |_| {},
        |b| b.topic(TopicSpec::new(topic)).source(source),
        ServerOptions::default(),
    )
    .await
}

/// Sends the same signed request twice and checks: both 200 with one id, the
/// first new and the second a duplicate, one event stored.
async fn twice_stored_once(s: &Server, source: &str, headers: &[(&str, &str)], body: &str) {
    let mut ids = Vec::new();
    for (i, duplicate) in [false, true].into_iter().enumerate() {
        let resp = s.webhook(source, headers, body).await;
        assert_eq!(resp.status(), 200, "attempt {i}");
        let v: Value = resp.json().await.expect("json");
        assert_eq!(v["duplicate"], duplicate, "attempt {i}: {v}");
        ids.push(v["id"].as_str().expect("id").to_owned());
    }
    assert_eq!(ids[0], ids[1]);
    let stored = s.stored(source).await;
    assert_eq!(stored.len(), 1);
    assert_eq!(stored[0].id.to_string(), ids[0]);
    assert_eq!(stored[0].payload.as_deref(), Some(body.as_bytes()));
}

/// A Stripe-signed event (`Stripe-Signature: t=..,v1=..`, dedup key `/id`)
/// sent twice is stored once, and a tampered copy gets 401.
#[tokio::test]
async fn stripe_signed_event_sent_twice_is_stored_once() {
    let secret = "whsec_hardening_stripe";
    let mut source = SourceSpec::new("stripe", "stripe");
    source.id = vec![Field::Json("/id".into())];
    source.event_type = Some(Field::Json("/type".into()));
    source.verifier =
        Some(Verifier::new(Scheme::Stripe, [secret], DEFAULT_TOLERANCE).expect("verifier"));
    let s = server(source).await;
    let body = r#"{"id":"evt_1NqZ","type":"payment_intent.succeeded","data":{"object":{}}}"#;
    let t = now();
    let sig = hex::encode(hmac(
        secret.as_bytes(),
        &[t.as_bytes(), b".", body.as_bytes()],
    ));
    let header = format!("t={t},v1={sig}");
    twice_stored_once(&s, "stripe", &[("stripe-signature", &header)], body).await;
    assert_eq!(
        s.stored("stripe").await[0].event_type.as_deref(),
        Some("payment_intent.succeeded")
    );

    let tampered = body.replace("succeeded", "failed");
    let resp = s
        .webhook("stripe", &[("stripe-signature", &header)], &tampered)
        .await;
    problem(resp, 401).await;
    assert_eq!(s.stored("stripe").await.len(), 1);
}

/// A GitHub-signed delivery (`X-Hub-Signature-256`, dedup key
/// `X-GitHub-Delivery`) sent twice is stored once.
#[tokio::test]
async fn github_signed_delivery_sent_twice_is_stored_once() {
    let secret = "It's a Secret to Everybody";
    let mut source = SourceSpec::new("github", "github");
    source.id = vec![Field::Header("x-github-delivery".into())];
    source.event_type = Some(Field::Header("x-github-event".into()));
    source.verifier =
        Some(Verifier::new(Scheme::GitHub, [secret], DEFAULT_TOLERANCE).expect("verifier"));
    let s = server(source).await;
    let body = r#"{"zen":"Keep it logically awesome.","hook_id":1}"#;
    let sig = format!(
        "sha256={}",
        hex::encode(hmac(secret.as_bytes(), &[body.as_bytes()]))
    );
    twice_stored_once(
        &s,
        "github",
        &[
            ("x-hub-signature-256", &sig),
            ("x-github-delivery", "72d3162e-cc78-11e3-81ab-4c9367dc0958"),
            ("x-github-event", "ping"),
        ],
        body,
    )
    .await;
    assert_eq!(
        s.stored("github").await[0].dedup_key,
        "72d3162e-cc78-11e3-81ab-4c9367dc0958"
    );
}

/// A Standard-Webhooks-signed message (`webhook-id`, `webhook-timestamp`,
/// `webhook-signature: v1,<base64>`) sent twice is stored once under its
/// `webhook-id`.
#[tokio::test]
async fn standard_webhooks_message_sent_twice_is_stored_once() {
    let key = b"hardening-standard-webhooks-key!";
    let secret = format!(
        "whsec_{}",
        base64::engine::general_purpose::STANDARD.encode(key)
    );
    let mut source = SourceSpec::new("sw", "sw");
    source.verifier = Some(
        Verifier::new(
            Scheme::StandardWebhooks,
            [secret.as_str()],
            DEFAULT_TOLERANCE,
        )
        .expect("verifier"),
    );
    let s = server(source).await;
    let body = r#"{"type":"invoice.paid","data":{"amount":100}}"#;
    let id = "msg_2KWPBgLlAfxdpx2AI54pPJ85f4W";
    let ts = now();
    let sig = base64::engine::general_purpose::STANDARD.encode(hmac(
        key,
        &[id.as_bytes(), b".", ts.as_bytes(), b".", body.as_bytes()],
    ));
    let sig = format!("v1,{sig}");
    twice_stored_once(
        &s,
        "sw",
        &[
            ("webhook-id", id),
            ("webhook-timestamp", &ts),
            ("webhook-signature", &sig),
        ],
        body,
    )
    .await;
    assert_eq!(s.stored("sw").await[0].dedup_key, id);
}
