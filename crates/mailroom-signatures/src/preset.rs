//! Provider presets: the scheme a provider signs with, and where its dedup
//! key and event type live (the defaults of a source's `id` and `type`).

use std::fmt;
use std::str::FromStr;

use crate::error::UnknownName;
use crate::scheme::Scheme;

/// Where a value lives in a webhook request.
///
/// Header names are lower-case, as [`http::HeaderName`] spells them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Field {
    /// The value of this request header.
    Header(&'static str),
    /// The string or number at this JSON pointer ([RFC 6901](https://www.rfc-editor.org/rfc/rfc6901))
    /// in the body parsed as JSON.
    Json(&'static str),
    /// The SHA-256 of the raw body, hex-encoded: always present, so it ends
    /// a fallback list (the dedup key of last resort).
    BodySha256,
}

/// A provider whose conventions mailroom knows, selected in configuration
/// by name (`stripe`, `github`, `shopify`, `slack`, `asaas`,
/// `standard-webhooks`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Preset {
    /// Stripe: [`Scheme::Stripe`]; the event object's `/id` is stable across
    /// retries, `/type` is e.g. `invoice.paid`.
    Stripe,
    /// GitHub: [`Scheme::GitHub`]; `X-GitHub-Delivery` is a GUID kept on
    /// redelivery, `X-GitHub-Event` is e.g. `push`.
    GitHub,
    /// Shopify: [`Scheme::Shopify`]; `X-Shopify-Event-Id` is the same on
    /// every retry of one event (older deliveries only carry
    /// `X-Shopify-Webhook-Id`), `X-Shopify-Topic` is e.g. `orders/create`.
    Shopify,
    /// Slack: [`Scheme::Slack`]. The Events API puts a stable `/event_id` in
    /// its JSON body (retries repeat it, adding `X-Slack-Retry-Num`); slash
    /// commands and interactivity send form-encoded bodies without any id,
    /// so those fall back to the body's SHA-256 (a repeat of the exact body
    /// is a duplicate). No event type is extracted, because the location
    /// differs between the Events API (`/event/type`), interactivity and
    /// commands; configure `type` explicitly if needed.
    Slack,
    /// [Asaas](https://docs.asaas.com/docs/receba-eventos-do-asaas-no-seu-endpoint-de-webhook):
    /// [`Scheme::Token`] in `asaas-access-token`; `/id` identifies the
    /// event, `/event` is e.g. `PAYMENT_RECEIVED`.
    Asaas,
    /// Any [Standard Webhooks](https://www.standardwebhooks.com/) sender
    /// (Svix, Clerk, Resend, …): `webhook-id` is the spec's idempotency key,
    /// `/type` its event type.
    StandardWebhooks,
}

impl Preset {
    /// Every preset, in documentation order.
    pub const ALL: [Preset; 6] = [
        Self::Stripe,
        Self::GitHub,
        Self::Shopify,
        Self::Slack,
        Self::Asaas,
        Self::StandardWebhooks,
    ];

    /// The configuration name.
    pub fn name(self) -> &'static str {
        match self {
            Self::Stripe => "stripe",
            Self::GitHub => "github",
            Self::Shopify => "shopify",
            Self::Slack => "slack",
            Self::Asaas => "asaas",
            Self::StandardWebhooks => "standard-webhooks",
        }
    }

    /// The signature scheme the provider uses.
    pub fn scheme(self) -> Scheme {
        match self {
            Self::Stripe => Scheme::Stripe,
            Self::GitHub => Scheme::GitHub,
            Self::Shopify => Scheme::Shopify,
            Self::Slack => Scheme::Slack,
            Self::Asaas => Scheme::Token {
                header: "asaas-access-token".to_owned(),
            },
            Self::StandardWebhooks => Scheme::StandardWebhooks,
        }
    }

    /// Where the dedup key lives, as candidates tried in order: the first
    /// one present in the request (header sent, or body is JSON with a
    /// string or number at the pointer) is the key. When none is present
    /// the request has no dedup key, and intake answers 400.
    pub fn dedup(self) -> &'static [Field] {
        match self {
            Self::Stripe | Self::Asaas => &[Field::Json("/id")],
            Self::GitHub => &[Field::Header("x-github-delivery")],
            Self::Shopify => &[
                Field::Header("x-shopify-event-id"),
                Field::Header("x-shopify-webhook-id"),
            ],
            Self::Slack => &[Field::Json("/event_id"), Field::BodySha256],
            Self::StandardWebhooks => &[Field::Header("webhook-id"), Field::Header("svix-id")],
        }
    }

    /// Where the event type lives, if the provider sends one in a fixed
    /// place.
    pub fn event_type(self) -> Option<Field> {
        match self {
            Self::Stripe | Self::StandardWebhooks => Some(Field::Json("/type")),
            Self::GitHub => Some(Field::Header("x-github-event")),
            Self::Shopify => Some(Field::Header("x-shopify-topic")),
            Self::Slack => None,
            Self::Asaas => Some(Field::Json("/event")),
        }
    }
}

impl fmt::Display for Preset {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Preset {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| UnknownName {
                what: "preset",
                name: s.to_owned(),
                expected: "stripe, github, shopify, slack, asaas, standard-webhooks",
            })
    }
}
