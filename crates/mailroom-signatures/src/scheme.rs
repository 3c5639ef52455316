//! The signature conventions mailroom understands: per scheme, the headers
//! read, the content signed and its algorithm (the book's webhook providers
//! guide, `docs/src/guides/webhooks.md`, lists them for users).

use std::fmt;
use std::str::FromStr;

use crate::error::UnknownName;

/// How a webhook source signs its requests.
///
/// All schemes work over the raw body bytes. The three timestamped ones
/// (`standard-webhooks`, `stripe`, `slack`) also reject a timestamp outside
/// the verifier's tolerance, in either direction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Scheme {
    /// [Standard Webhooks](https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md):
    /// headers `webhook-id`, `webhook-timestamp`, `webhook-signature` (or
    /// the `svix-` spellings), HMAC-SHA256 of `{id}.{timestamp}.{body}`
    /// keyed with the base64-decoded secret after `whsec_`; the signature
    /// header is a space-separated list of `v1,<base64>` entries.
    StandardWebhooks,
    /// [Stripe](https://docs.stripe.com/webhooks#verify-manually):
    /// `Stripe-Signature: t=<ts>,v1=<hex>[,v1=<hex>…]`, HMAC-SHA256 of
    /// `{t}.{body}` keyed with the whole `whsec_…` string as bytes.
    Stripe,
    /// [GitHub](https://docs.github.com/en/webhooks/using-webhooks/validating-webhook-deliveries):
    /// `X-Hub-Signature-256: sha256=<hex>`, HMAC-SHA256 of the body.
    GitHub,
    /// [Shopify](https://shopify.dev/docs/apps/build/webhooks/subscribe/https#step-5-verify-the-webhook):
    /// `X-Shopify-Hmac-Sha256: <base64>`, HMAC-SHA256 of the body.
    Shopify,
    /// [Slack](https://api.slack.com/authentication/verifying-requests-from-slack):
    /// `X-Slack-Request-Timestamp` and `X-Slack-Signature: v0=<hex>`,
    /// HMAC-SHA256 of `v0:{ts}:{body}` keyed with the signing secret.
    Slack,
    /// A shared token sent verbatim in a header (e.g. Asaas'
    /// `asaas-access-token`), compared in constant time with the secret.
    /// The body is not authenticated.
    Token {
        /// The header carrying the token (any case).
        header: String,
    },
    /// A generic HMAC-SHA256 of the body, for providers without a preset.
    Hmac {
        /// The header carrying the signature (any case).
        header: String,
        /// A literal the header value starts with before the signature,
        /// e.g. `sha256=`; `None` when the value is the bare signature.
        prefix: Option<String>,
        /// How the 32-byte MAC is written in the header.
        encoding: Encoding,
    },
}

impl Scheme {
    /// The scheme's configuration name (`standard-webhooks`, `stripe`,
    /// `github`, `shopify`, `slack`, `token`, `hmac`), also used in errors.
    pub fn name(&self) -> &'static str {
        match self {
            Self::StandardWebhooks => "standard-webhooks",
            Self::Stripe => "stripe",
            Self::GitHub => "github",
            Self::Shopify => "shopify",
            Self::Slack => "slack",
            Self::Token { .. } => "token",
            Self::Hmac { .. } => "hmac",
        }
    }

    /// Whether the scheme signs a timestamp, so the tolerance applies.
    pub fn is_timestamped(&self) -> bool {
        matches!(self, Self::StandardWebhooks | Self::Stripe | Self::Slack)
    }
}

impl fmt::Display for Scheme {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the generic [`Scheme::Hmac`] writes its 32-byte MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Encoding {
    /// 64 hexadecimal digits, either case.
    Hex,
    /// 44 characters of standard, padded base64 (RFC 4648 §4).
    Base64,
}

impl Encoding {
    /// The configuration name: `hex` or `base64`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Hex => "hex",
            Self::Base64 => "base64",
        }
    }
}

impl fmt::Display for Encoding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Encoding {
    type Err = UnknownName;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "hex" => Ok(Self::Hex),
            "base64" => Ok(Self::Base64),
            _ => Err(UnknownName {
                what: "encoding",
                name: s.to_owned(),
                expected: "hex, base64",
            }),
        }
    }
}
