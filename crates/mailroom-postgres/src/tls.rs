//! PostgreSQL over TLS with libpq's connection parameters: `sslmode`,
//! `sslrootcert`, `sslcert`, `sslkey` in a `postgres://` URL.
//!
//! sqlx does the handshake (rustls, aws-lc-rs); this module holds what
//! libpq users expect of those parameters beyond it:
//!
//! - the files a URL names are read when it is parsed, so a wrong path or a
//!   file without certificates is a configuration error, not a connection
//!   that fails later;
//! - `sslmode=require` with a CA file verifies the certificate as
//!   `verify-ca` does (libpq); `sslrootcert=system` means the system's
//!   roots and implies `verify-full` (libpq 16); `sslmode=allow`, which
//!   sqlx treats as `disable`, is refused rather than silently weakened;
//! - connection failures name TLS and say which parameter fixes them
//!   ([`describe`]);
//! - a store that does not verify the server's certificate on a network
//!   connection says so in a warning ([`log_mode`]).

use mailroom_core::StoreError;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::{AlertDescription, CertificateError};
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use std::fmt::Write as _;

/// The TLS parameters of a URL, percent-decoded, the last of each kept
/// (as sqlx does); the aliases sqlx also reads count.
#[derive(Debug, Default)]
struct Params {
    mode: Option<String>,
    root_cert: Option<String>,
    cert: Option<String>,
    key: Option<String>,
}

impl Params {
    fn of(url: &str) -> Result<Self, StoreError> {
        let mut p = Self::default();
        let query = url.split_once('?').map_or("", |(_, q)| q);
        let query = query.split_once('#').map_or(query, |(q, _)| q);
        for pair in query.split('&').filter(|s| !s.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            let slot = match decode(k)?.as_str() {
                "sslmode" | "ssl-mode" => &mut p.mode,
                "sslrootcert" | "ssl-root-cert" | "ssl-ca" => &mut p.root_cert,
                "sslcert" | "ssl-cert" => &mut p.cert,
                "sslkey" | "ssl-key" => &mut p.key,
                _ => continue,
            };
            *slot = Some(decode(v)?);
        }
        Ok(p)
    }
}

/// `%XX` and `+` decoding of a query component.
fn decode(s: &str) -> Result<String, StoreError> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'%' => {
                let hex = s
                    .get(i + 1..i + 3)
                    .and_then(|h| u8::from_str_radix(h, 16).ok());
                let Some(b) = hex else {
                    return Err(StoreError::Invalid(format!(
                        "postgres URL: bad percent-encoding in {s:?}"
                    )));
                };
                out.push(b);
                i += 3;
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            b => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8(out)
        .map_err(|_| StoreError::Invalid(format!("postgres URL: {s:?} is not UTF-8")))
}

/// The URL to hand to sqlx: `sslrootcert=system` removed (sqlx would read
/// a file called `system`; without a CA file it verifies against the
/// system's roots, which is what `system` means).
pub(crate) fn for_sqlx(url: &str) -> Result<String, StoreError> {
    let Some((base, query)) = url.split_once('?') else {
        return Ok(url.to_owned());
    };
    let mut kept = Vec::new();
    for pair in query.split('&').filter(|s| !s.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let root = matches!(
            decode(k)?.as_str(),
            "sslrootcert" | "ssl-root-cert" | "ssl-ca"
        );
        if !(root && decode(v)? == "system") {
            kept.push(pair);
        }
    }
    Ok(if kept.is_empty() {
        base.to_owned()
    } else {
        format!("{base}?{}", kept.join("&"))
    })
}

/// Checks the URL's TLS parameters and applies libpq's rules to the
/// options sqlx parsed from it (see the module's documentation).
pub(crate) fn apply(url: &str, connect: PgConnectOptions) -> Result<PgConnectOptions, StoreError> {
    let p = Params::of(url)?;
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    if let Some(mode) = &p.mode {
        if mode.eq_ignore_ascii_case("allow") {
            return Err(StoreError::Invalid(
                "postgres URL: sslmode=allow is not supported: use sslmode=prefer (TLS when the \
                 server offers it) or disable"
                    .into(),
            ));
        }
    }
    let system = p.root_cert.as_deref() == Some("system");
    let root_cert = p.root_cert.clone().or_else(|| env("PGSSLROOTCERT"));
    let mut connect = connect;
    if system {
        match p.mode.as_deref().map(str::to_ascii_lowercase).as_deref() {
            None => connect = connect.ssl_mode(PgSslMode::VerifyFull),
            Some("verify-full") => {}
            Some(other) => {
                return Err(StoreError::Invalid(format!(
                    "postgres URL: sslrootcert=system needs sslmode=verify-full, not sslmode={other} \
                     (the system's roots vouch for host names)"
                )));
            }
        }
    } else if let Some(path) = &root_cert {
        read_certs("sslrootcert", path)?;
        if matches!(connect.get_ssl_mode(), PgSslMode::Require) {
            // libpq: "if a root CA file is present, verify the certificate
            // in the same way as if verify-ca was specified".
            connect = connect.ssl_mode(PgSslMode::VerifyCa);
        }
    }
    let cert = p.cert.or_else(|| env("PGSSLCERT"));
    let key = p.key.or_else(|| env("PGSSLKEY"));
    match (&cert, &key) {
        (Some(cert), Some(key)) => {
            read_certs("sslcert", cert)?;
            let pem = read("sslkey", key)?;
            PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
                StoreError::Invalid(format!(
                    "postgres URL: sslkey {key:?} holds no usable private key ({e})"
                ))
            })?;
        }
        (None, None) => {}
        _ => {
            return Err(StoreError::Invalid(
                "postgres URL: a client certificate needs both sslcert and sslkey".into(),
            ));
        }
    }
    if matches!(connect.get_ssl_mode(), PgSslMode::Disable) && (cert.is_some() || system) {
        return Err(StoreError::Invalid(
            "postgres URL: sslmode=disable with sslcert or sslrootcert=system: \
             those take effect only over TLS"
                .into(),
        ));
    }
    Ok(connect)
}

fn read(param: &str, path: &str) -> Result<Vec<u8>, StoreError> {
    std::fs::read(path).map_err(|e| {
        StoreError::Invalid(format!("postgres URL: cannot read {param} {path:?}: {e}"))
    })
}

fn read_certs(param: &str, path: &str) -> Result<(), StoreError> {
    let pem = read(param, path)?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&pem).collect();
    match certs {
        Ok(certs) if !certs.is_empty() => Ok(()),
        Ok(_) => Err(StoreError::Invalid(format!(
            "postgres URL: {param} {path:?} holds no PEM certificate"
        ))),
        Err(e) => Err(StoreError::Invalid(format!(
            "postgres URL: {param} {path:?} is not valid PEM ({e})"
        ))),
    }
}

/// True for a host the connection does not leave this machine to reach.
fn is_local(connect: &PgConnectOptions) -> bool {
    connect.get_socket().is_some()
        || matches!(
            connect.get_host(),
            "localhost" | "127.0.0.1" | "::1" | "[::1]"
        )
        || connect.get_host().starts_with('/')
}

/// Logs how the store's connections are protected: a warning when they
/// cross a network without verifying the server's certificate (`prefer`,
/// the default, and `require` without a CA file), a debug line otherwise.
pub(crate) fn log_mode(connect: &PgConnectOptions) {
    let host = connect.get_host();
    let unverified = match connect.get_ssl_mode() {
        PgSslMode::Prefer | PgSslMode::Allow => Some("prefer"),
        PgSslMode::Require => Some("require"),
        PgSslMode::Disable if !is_local(connect) => {
            tracing::warn!(
                host,
                "postgres: sslmode=disable: connections to the database are not encrypted"
            );
            return;
        }
        _ => None,
    };
    match unverified {
        Some(mode) if !is_local(connect) => tracing::warn!(
            host,
            "postgres: sslmode={mode}: the server's certificate is not verified, so the \
             connection is encrypted but the server is not authenticated; set \
             sslmode=verify-full (with sslrootcert=<your provider's CA bundle>) to verify it"
        ),
        _ => tracing::debug!(host, sslmode = ?connect.get_ssl_mode(), "postgres TLS settings"),
    }
}

/// A connection error as users should read it: TLS failures name TLS, the
/// reason, and the URL parameter that fixes them; a server that refuses
/// plain connections or wants a client certificate says so. Other errors
/// are sqlx's text.
pub(crate) fn describe(e: &sqlx::Error) -> String {
    let mut out = e.to_string();
    if let Some(tls) = rustls_error(e) {
        out = format!("TLS handshake failed: {tls}");
        let hint = match tls {
            rustls::Error::InvalidCertificate(c) => match c {
                CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                    "the server's certificate is not signed by a CA this client trusts: set \
                     sslrootcert to the CA certificate (bundle) that signed it, e.g. your \
                     provider's; without sslrootcert the system's roots are used"
                }
                CertificateError::NotValidForName
                | CertificateError::NotValidForNameContext { .. } => {
                    "the server's certificate does not name the host in the URL: connect by a \
                     name the certificate lists (sslmode=verify-full checks it), or use \
                     sslmode=verify-ca to check only the CA"
                }
                CertificateError::Expired | CertificateError::ExpiredContext { .. } => {
                    "the server's certificate has expired: the server needs a renewed one"
                }
                CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                    "the server's certificate is not valid yet: check this machine's clock"
                }
                _ => "check the server's certificate and sslrootcert",
            },
            rustls::Error::AlertReceived(
                AlertDescription::BadCertificate
                | AlertDescription::UnknownCA
                | AlertDescription::CertificateRequired
                | AlertDescription::CertificateExpired
                | AlertDescription::CertificateUnknown,
            ) => "the server refused this client's certificate: check sslcert and sslkey",
            _ => "check sslmode and the server's TLS settings",
        };
        let _ = write!(out, " ({hint})");
        return out;
    }
    match e {
        sqlx::Error::Tls(inner) => {
            out = format!("TLS: {inner}");
            if inner.to_string().contains("does not support TLS") {
                out.push_str(
                    " (this sslmode needs TLS and the server did not offer it: enable ssl on \
                     the server, or set sslmode=prefer to connect without it)",
                );
            }
        }
        sqlx::Error::Database(d) if d.code().as_deref() == Some("28000") => {
            let msg = d.message();
            let hint = if msg.contains("no encryption") {
                Some(
                    "the server accepts only TLS connections (pg_hba.conf hostssl): set \
                     sslmode=verify-full with sslrootcert, or sslmode=require",
                )
            } else if msg.contains("requires a valid client certificate") {
                Some("the server wants a TLS client certificate: set sslcert and sslkey")
            } else if msg.contains("certificate authentication failed") {
                Some("the client certificate's common name (CN) must be the user name")
            } else {
                None
            };
            if let Some(hint) = hint {
                let _ = write!(out, " ({hint})");
            }
        }
        _ => {}
    }
    out
}

/// The rustls error somewhere in `e`'s chain: sqlx reports a failed
/// handshake as an I/O error that wraps it.
fn rustls_error(e: &sqlx::Error) -> Option<&rustls::Error> {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = next {
        if let Some(tls) = err.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // io::Error's `source` skips the error it wraps: look at it first.
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if let Some(tls) = io.get_ref().and_then(|i| i.downcast_ref::<rustls::Error>()) {
                return Some(tls);
            }
        }
        next = err.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::str::FromStr;

    fn opts(url: &str) -> Result<PgConnectOptions, StoreError> {
        apply(
            url,
            PgConnectOptions::from_str(&for_sqlx(url)?)
                .map_err(|e| StoreError::Invalid(e.to_string()))?,
        )
    }

    fn pem_dir() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    /// A self-made certificate is enough for the parse-time checks (they
    /// read PEM; they do not verify).
    const CERT: &str = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";

    /// The parameters are read with their aliases, percent-decoded.
    #[test]
    fn params_are_read_decoded_with_aliases() {
        let p = Params::of(
            "postgres://h/db?sslmode=verify-full&ssl-ca=%2Ftmp%2Fa+b.pem&sslcert=c&sslkey=k",
        )
        .unwrap();
        assert_eq!(p.mode.as_deref(), Some("verify-full"));
        assert_eq!(p.root_cert.as_deref(), Some("/tmp/a b.pem"));
        assert_eq!(
            (p.cert.as_deref(), p.key.as_deref()),
            (Some("c"), Some("k"))
        );
        assert!(Params::of("postgres://h/db?sslrootcert=%zz").is_err());
    }

    /// `sslrootcert=system` means the system's roots with verify-full, and
    /// refuses a weaker mode instead of ignoring it.
    #[test]
    fn sslrootcert_system_means_verify_full_on_the_system_roots() {
        let url = "postgres://db.example.com/app?sslrootcert=system&application_name=x";
        assert_eq!(
            for_sqlx(url).unwrap(),
            "postgres://db.example.com/app?application_name=x"
        );
        assert!(matches!(
            opts(url).unwrap().get_ssl_mode(),
            PgSslMode::VerifyFull
        ));
        let weak = opts("postgres://h/db?sslrootcert=system&sslmode=require").unwrap_err();
        assert!(
            weak.to_string().contains("needs sslmode=verify-full"),
            "{weak}"
        );
    }

    /// A CA file that cannot be read, or holds no certificate, is a
    /// configuration error naming the parameter; `require` with a CA
    /// verifies it as `verify-ca` (libpq).
    #[test]
    fn ca_files_are_checked_and_require_with_a_ca_verifies_it() {
        let dir = pem_dir();
        let missing = opts("postgres://h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem")
            .unwrap_err();
        assert!(
            missing.to_string().contains("cannot read sslrootcert"),
            "{missing}"
        );
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate").unwrap();
        let e = opts(&format!("postgres://h/db?sslrootcert={}", empty.display())).unwrap_err();
        assert!(e.to_string().contains("holds no PEM certificate"), "{e}");
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, CERT).unwrap();
        let o = opts(&format!(
            "postgres://h/db?sslmode=require&sslrootcert={}",
            ca.display()
        ));
        assert!(matches!(o.unwrap().get_ssl_mode(), PgSslMode::VerifyCa));
        let o = opts("postgres://h/db?sslmode=require").unwrap();
        assert!(matches!(o.get_ssl_mode(), PgSslMode::Require));
    }

    /// sslcert and sslkey go together; allow is refused; prefer is the
    /// default.
    #[test]
    fn client_certificates_need_both_files_and_allow_is_refused() {
        let e = opts("postgres://h/db?sslmode=require&sslcert=/tmp/c.pem").unwrap_err();
        assert!(e.to_string().contains("both sslcert and sslkey"), "{e}");
        let e = opts("postgres://h/db?sslmode=allow").unwrap_err();
        assert!(
            e.to_string().contains("sslmode=allow is not supported"),
            "{e}"
        );
        if std::env::var_os("PGSSLMODE").is_none() {
            assert!(matches!(
                opts("postgres://h/db").unwrap().get_ssl_mode(),
                PgSslMode::Prefer
            ));
        }
    }
}
