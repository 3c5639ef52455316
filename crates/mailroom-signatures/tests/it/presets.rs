//! Provider presets.

use mailroom_signatures::{DEFAULT_TOLERANCE, Field, Preset, Scheme, Verifier};

/// Every preset parses from its configuration name and prints back to it;
/// unknown names are refused with the list of known ones.
#[test]
fn presets_parse_from_their_names() {
    for (name, preset) in [
        ("stripe", Preset::Stripe),
        ("github", Preset::GitHub),
        ("shopify", Preset::Shopify),
        ("slack", Preset::Slack),
        ("asaas", Preset::Asaas),
        ("standard-webhooks", Preset::StandardWebhooks),
    ] {
        assert_eq!(name.parse::<Preset>(), Ok(preset));
        assert_eq!(preset.to_string(), name);
    }
    let err = "GitHub".parse::<Preset>().expect_err("case matters");
    assert!(err.to_string().contains("standard-webhooks"), "{err}");
}

/// Each preset reads the dedup key and the event type where its provider
/// puts them (Stripe's `/id` and `/type`, GitHub's delivery and event
/// headers, ...).
#[test]
fn presets_locate_dedup_key_and_type() {
    use Field::{Header, Json};
    let expect: [(Preset, &[Field], Option<Field>); 6] = [
        (Preset::Stripe, &[Json("/id")], Some(Json("/type"))),
        (
            Preset::GitHub,
            &[Header("x-github-delivery")],
            Some(Header("x-github-event")),
        ),
        (
            Preset::Shopify,
            &[Header("x-shopify-event-id"), Header("x-shopify-webhook-id")],
            Some(Header("x-shopify-topic")),
        ),
        (Preset::Slack, &[Json("/event_id"), Field::BodySha256], None),
        (Preset::Asaas, &[Json("/id")], Some(Json("/event"))),
        (
            Preset::StandardWebhooks,
            &[Header("webhook-id"), Header("svix-id")],
            Some(Json("/type")),
        ),
    ];
    for (preset, dedup, ty) in expect {
        assert_eq!(preset.dedup(), dedup, "{preset}");
        assert_eq!(preset.event_type(), ty, "{preset}");
    }
}

/// Asaas is the token scheme on `asaas-access-token`; every other preset
/// maps to its namesake scheme.
#[test]
fn presets_choose_their_scheme() {
    assert_eq!(
        Preset::Asaas.scheme(),
        Scheme::Token {
            header: "asaas-access-token".into()
        }
    );
    assert_eq!(Preset::Stripe.scheme(), Scheme::Stripe);
    assert_eq!(Preset::GitHub.scheme(), Scheme::GitHub);
    assert_eq!(Preset::Shopify.scheme(), Scheme::Shopify);
    assert_eq!(Preset::Slack.scheme(), Scheme::Slack);
    assert_eq!(Preset::StandardWebhooks.scheme(), Scheme::StandardWebhooks);
}

/// Every preset's scheme builds a verifier, and every header name a preset
/// points at is a valid lower-case `http::HeaderName`.
#[test]
fn presets_are_usable() {
    for preset in Preset::ALL {
        let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
        Verifier::new(preset.scheme(), [secret], DEFAULT_TOLERANCE).expect("builds");
        for field in preset.dedup().iter().chain(preset.event_type().as_ref()) {
            if let Field::Header(name) = field {
                let parsed = http::HeaderName::from_bytes(name.as_bytes()).expect("valid");
                assert_eq!(parsed.as_str(), *name, "{preset}: lower-case");
            }
            if let Field::Json(pointer) = field {
                assert!(pointer.starts_with('/'), "{preset}: {pointer}");
            }
        }
    }
}
