//! Feeds arbitrary headers and bodies to `mailroom::intake::build_event`, the
//! step that reads the dedup key, type and ordering key of a webhook, then to
//! `mailroom::accept::check`, the topic's rules every door applies, with
//! sources that read them from headers, from JSON pointers, through the
//! default chain (`webhook-id`, `Idempotency-Key`, `/id`, SHA-256 of the
//! body), and into sequential topics (with and without a default key).
//!
//! Invariants checked: it never panics; an accepted event has a non-empty
//! dedup key of at most `MAX_FIELD_LEN` bytes, keys and types within that
//! bound too, and the payload is the body byte for byte. Rate strings
//! (`rate_limit = "..."`) are parsed from the body as well.
//!
//! Input format (as the `verify` target): `name: value` header lines until an
//! empty line; the rest is the body. Lines end with `\n`.
#![no_main]

use std::sync::LazyLock;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue};
use libfuzzer_sys::fuzz_target;
use mailroom::accept::{MAX_FIELD_LEN, check};
use mailroom::intake::build_event;
use mailroom::spec::RateLimit;
use mailroom::{Field, Mode, SourceSpec, TopicSpec};

static CASES: LazyLock<Vec<(SourceSpec, TopicSpec)>> = LazyLock::new(|| {
    let mut by_header = SourceSpec::new("h", "t");
    by_header.id = vec![Field::Header("x-event-id".into())];
    by_header.event_type = Some(Field::Header("x-event-type".into()));
    by_header.key = Some(Field::Header("x-key".into()));

    let mut by_pointer = SourceSpec::new("j", "t");
    by_pointer.id = vec![
        Field::Json("/data/id".into()),
        Field::Json("/id".into()),
        Field::BodySha256,
    ];
    by_pointer.event_type = Some(Field::Json("/type".into()));
    by_pointer.key = Some(Field::Json("/data/customer".into()));

    let mut whole_doc = SourceSpec::new("w", "t");
    whole_doc.id = vec![Field::Json(String::new())];
    whole_doc.event_type = Some(Field::Json("/a~1b/~0c/0".into()));

    let default_chain = SourceSpec::new("d", "t");
    let sequential = |default_key: Option<&str>| {
        let mut t = TopicSpec::new("seq")
            .mode(Mode::Sequential {
                on_dead: Default::default(),
            })
            .key(Field::Json("/customer".into()));
        t.default_key = default_key.map(str::to_owned);
        t
    };
    vec![
        (by_header, TopicSpec::new("t")),
        (by_pointer.clone(), TopicSpec::new("t")),
        (whole_doc, TopicSpec::new("t")),
        (default_chain.clone(), TopicSpec::new("t")),
        (default_chain.clone(), sequential(None)),
        (by_pointer, sequential(Some("none"))),
        (default_chain, sequential(Some("none"))),
    ]
});

fn parse(data: &[u8]) -> (HeaderMap, &[u8]) {
    let mut rest = data;
    let mut headers = HeaderMap::new();
    while let Some(at) = rest.iter().position(|&b| b == b'\n') {
        let (line, r) = rest.split_at(at);
        rest = &r[1..];
        if line.is_empty() {
            break;
        }
        let Some(colon) = line.iter().position(|&b| b == b':') else {
            continue;
        };
        let (name, value) = line.split_at(colon);
        let value = value[1..].strip_prefix(b" ").unwrap_or(&value[1..]);
        if let (Ok(name), Ok(value)) =
            (HeaderName::from_bytes(name), HeaderValue::from_bytes(value))
        {
            headers.append(name, value);
        }
    }
    (headers, rest)
}

fuzz_target!(|data: &[u8]| {
    let (headers, body) = parse(data);
    let body = Bytes::copy_from_slice(body);
    for (source, topic) in CASES.iter() {
        let Ok(event) = build_event(source, topic, &headers, body.clone()) else {
            continue;
        };
        // The topic's rules (the same on every door) bound what is stored.
        let Ok(event) = check(topic, event) else {
            continue;
        };
        assert!(!event.dedup_key.is_empty(), "empty dedup key");
        assert!(event.dedup_key.len() <= MAX_FIELD_LEN, "dedup key too long");
        for v in [&event.key, &event.event_type].into_iter().flatten() {
            assert!(v.len() <= MAX_FIELD_LEN, "field too long: {}", v.len());
        }
        if matches!(topic.mode, Mode::Sequential { .. }) {
            assert!(event.key.is_some(), "sequential event without a key");
        }
        assert_eq!(event.payload, body);
        assert_eq!(event.topic, topic.name);
    }
    if let Ok(text) = std::str::from_utf8(&body) {
        if let Ok(r) = text.parse::<RateLimit>() {
            assert!(r.requests >= 1 && !r.per.is_zero());
        }
    }
});
