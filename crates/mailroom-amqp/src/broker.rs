//! Where a connection goes: an `amqp://` or `amqps://` URL read once, with
//! RabbitMQ's TLS query parameters
//! (<https://www.rabbitmq.com/docs/uri-query-parameters>) turned into a
//! rustls client configuration on the aws-lc-rs provider:
//!
//! * `cacertfile=PATH`: the CA certificates (PEM) that sign the broker's
//!   certificate; without it, the system's roots;
//! * `certfile=PATH` and `keyfile=PATH`: a client certificate (PEM chain)
//!   and its private key (PEM), both or neither;
//! * `server_name_indication=NAME`: the name sent in SNI and checked in the
//!   broker's certificate instead of the URL's host (`disable`: no SNI, the
//!   host is still checked);
//! * `verify=verify_peer` (the default) or `verify=verify_none`: no check of
//!   the broker's certificate at all, which [`AmqpConnection`](crate::AmqpConnection)
//!   logs as a warning when it starts.
//!
//! Files are read when the URL is read, so a missing CA file or an
//! unreadable key stops the start with an error naming the parameter and
//! the file. lapin gets the parsed URL (it ignores these parameters) and
//! the TLS stream this module opens.

use crate::error::{AmqpError, Result};
use lapin::tcp::{AMQPUriTcpExt, RustlsConnector, TLSConfig};
use lapin::uri::{AMQPScheme, AMQPUri};
use lapin::{Connection, ConnectionProperties};
use mailroom::redact::url as redact;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::{ClientConfig, DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use std::path::Path;
use std::sync::Arc;

/// The query parameters read here; lapin reads the others (`heartbeat`,
/// `connection_timeout`, `frame_max`, `channel_max`, `auth_mechanism`).
const TLS_PARAMETERS: [&str; 5] = [
    "cacertfile",
    "certfile",
    "keyfile",
    "server_name_indication",
    "verify",
];

/// A broker URL, read and checked: host, credentials and vhost for lapin,
/// and for `amqps://` the TLS client configuration.
#[derive(Clone)]
pub struct Broker {
    name: String,
    uri: AMQPUri,
    tls: Option<Tls>,
}

#[derive(Clone)]
struct Tls {
    connector: RustlsConnector,
    /// The name checked in the broker's certificate (and sent in SNI).
    server_name: String,
    verify: bool,
}

impl std::fmt::Debug for Broker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The name only: the parsed URI holds the password.
        f.debug_struct("Broker")
            .field("name", &self.name)
            .field("tls", &self.tls.is_some())
            .finish_non_exhaustive()
    }
}

impl Broker {
    /// Reads `url` (`amqp://user:password@host:port/vhost`, or `amqps://`
    /// with the TLS parameters above), reading the files it names.
    ///
    /// # Errors
    /// [`AmqpError::Invalid`] for a URL that is not AMQP, a TLS parameter
    /// on `amqp://`, an unknown `verify` value, a file that cannot be read
    /// or holds no certificate or key (the message names the parameter and
    /// the file).
    pub fn parse(url: &str) -> Result<Self> {
        let name = redact(url);
        let invalid = |why: String| AmqpError::Invalid(format!("{name}: {why}"));
        let parsed = url::Url::parse(url).map_err(|e| invalid(format!("not an AMQP URL: {e}")))?;
        let tls = match parsed.scheme() {
            "amqp" => false,
            "amqps" => true,
            other => return Err(invalid(format!("{other}:// is not amqp:// or amqps://"))),
        };
        let host = match parsed.host() {
            Some(url::Host::Domain(d)) => d.to_string(),
            Some(url::Host::Ipv4(ip)) => ip.to_string(),
            Some(url::Host::Ipv6(ip)) => ip.to_string(),
            None => return Err(invalid("no host".into())),
        };
        let mut uri: AMQPUri = url.parse().map_err(|e: String| invalid(e))?;
        // lapin's parser takes an IP address for `localhost`.
        uri.authority.host = host.clone();
        let param = |key: &str| {
            parsed
                .query_pairs()
                .find(|(k, _)| k == key)
                .map(|(_, v)| v.into_owned())
        };
        if !tls {
            if let Some(key) = TLS_PARAMETERS.iter().find(|k| param(k).is_some()) {
                return Err(invalid(format!(
                    "{key} is a TLS parameter: TLS needs an amqps:// URL"
                )));
            }
            return Ok(Self {
                name,
                uri,
                tls: None,
            });
        }
        let verify = match param("verify").as_deref() {
            None | Some("verify_peer") => true,
            Some("verify_none") => false,
            Some(other) => {
                return Err(invalid(format!(
                    "verify={other}: expected verify_peer or verify_none"
                )));
            }
        };
        let (server_name, sni) = match param("server_name_indication") {
            Some(n) if n == "disable" => (host, false),
            Some(n) => (n, true),
            None => (host, true),
        };
        ServerName::try_from(server_name.as_str())
            .map_err(|e| invalid(format!("{server_name:?} is not a valid server name: {e}")))?;
        let identity = match (param("certfile"), param("keyfile")) {
            (Some(cert), Some(key)) => Some((certificates("certfile", &cert)?, private_key(&key)?)),
            (None, None) => None,
            (Some(_), None) => return Err(invalid("certfile without keyfile".into())),
            (None, Some(_)) => return Err(invalid("keyfile without certfile".into())),
        };
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let builder = ClientConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| invalid(format!("TLS: {e}")))?;
        let builder = if verify {
            let mut roots = RootCertStore::empty();
            match param("cacertfile") {
                Some(path) => {
                    let (added, _) =
                        roots.add_parsable_certificates(certificates("cacertfile", &path)?);
                    if added == 0 {
                        return Err(invalid(format!(
                            "cacertfile={path}: no usable CA certificate in it"
                        )));
                    }
                }
                None => {
                    let native = rustls_native_certs::load_native_certs();
                    roots.add_parsable_certificates(native.certs);
                    if roots.is_empty() {
                        return Err(invalid(format!(
                            "no cacertfile and no system CA certificates to check the broker's \
                             certificate with ({} errors loading them)",
                            native.errors.len()
                        )));
                    }
                }
            }
            builder.with_root_certificates(roots)
        } else {
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(NoVerification(provider)))
        };
        let mut config = match identity {
            Some((chain, key)) => builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| invalid(format!("certfile and keyfile do not make a pair: {e}")))?,
            None => builder.with_no_client_auth(),
        };
        config.enable_sni = sni;
        Ok(Self {
            name,
            uri,
            tls: Some(Tls {
                connector: RustlsConnector::from(config),
                server_name,
                verify,
            }),
        })
    }

    /// The URL without its user and password: logs, metric labels, `/readyz`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// An `amqps://` URL.
    pub fn is_tls(&self) -> bool {
        self.tls.is_some()
    }

    /// False only for `amqps://...?verify=verify_none`: the broker's
    /// certificate is not checked.
    pub fn verifies_peer(&self) -> bool {
        self.tls.as_ref().is_none_or(|t| t.verify)
    }

    /// Logs a warning naming the connection if its broker's certificate is
    /// not checked; true if it did.
    pub fn warn_if_unverified(&self) -> bool {
        if self.verifies_peer() {
            return false;
        }
        tracing::warn!(
            connection = %self.name,
            "TLS certificate verification is off for this connection (verify=verify_none): \
             anyone on the network path can impersonate the broker"
        );
        true
    }

    /// Opens an AMQP connection: TCP to the URL's host, for `amqps://` the
    /// TLS handshake (a failure says why, e.g. `invalid peer certificate:
    /// UnknownIssuer`), then the AMQP handshake.
    pub(crate) async fn connect(
        &self,
        properties: ConnectionProperties,
    ) -> lapin::Result<Connection> {
        let runtime = lapin::runtime::default_runtime()?;
        let Some(tls) = self.tls.clone() else {
            return Connection::connect_uri_with_runtime(self.uri.clone(), properties, runtime)
                .await;
        };
        Connection::connector(
            self.uri.clone(),
            runtime,
            async move |uri: AMQPUri, runtime| {
                let mut tcp = uri;
                tcp.scheme = AMQPScheme::AMQP;
                let plain = tcp
                    .connect_with_config_async(TLSConfig::default(), &runtime)
                    .await?;
                let stream = plain
                    .into_rustls(&tls.connector, &tls.server_name)
                    .await
                    .map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("TLS handshake with {}: {e}", tls.server_name),
                        )
                    })?;
                Ok(stream)
            },
            properties,
        )
        .await
    }
}

/// The certificates (PEM) in the file at `path`, given as `key`.
fn certificates(key: &str, path: &str) -> Result<Vec<CertificateDer<'static>>> {
    let pem = read(key, path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<std::result::Result<Vec<_>, _>>()
        .map_err(|e| AmqpError::Invalid(format!("{key}={path}: not PEM certificates: {e}")))?;
    if certs.is_empty() {
        return Err(AmqpError::Invalid(format!(
            "{key}={path}: no certificate in it (PEM expected)"
        )));
    }
    Ok(certs)
}

/// The private key (PEM: PKCS#8, PKCS#1 or SEC1) in the file at `path`.
fn private_key(path: &str) -> Result<PrivateKeyDer<'static>> {
    let pem = read("keyfile", path)?;
    PrivateKeyDer::from_pem_slice(&pem)
        .map_err(|e| AmqpError::Invalid(format!("keyfile={path}: no private key in it: {e}")))
}

fn read(key: &str, path: &str) -> Result<Vec<u8>> {
    std::fs::read(Path::new(path))
        .map_err(|e| AmqpError::Invalid(format!("{key}={path}: cannot read it: {e}")))
}

/// `verify=verify_none`: any certificate is accepted; the handshake's
/// signatures are still checked, so the session is at least with the holder
/// of the certificate's key.
#[derive(Debug)]
struct NoVerification(Arc<CryptoProvider>);

impl ServerCertVerifier for NoVerification {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refusal(url: &str) -> String {
        match Broker::parse(url) {
            Err(e) => e.to_string(),
            Ok(b) => panic!("{url} accepted: {b:?}"),
        }
    }

    /// Plain URLs need no files; an IP address stays that address (lapin's
    /// own parser would connect to `localhost`).
    #[test]
    fn plain_urls_keep_their_host() {
        let b = Broker::parse("amqp://guest:secret@127.0.0.1:5672/%2f").expect("plain");
        assert!(!b.is_tls() && b.verifies_peer());
        assert_eq!(b.uri.authority.host, "127.0.0.1");
        assert_eq!(b.name(), "amqp://127.0.0.1:5672/%2f");
        assert!(!format!("{b:?}").contains("secret"));
    }

    /// Bad TLS parameters stop the start with the parameter and the file
    /// named, never the password.
    #[test]
    fn bad_tls_parameters_are_refused_by_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not pem").expect("write");
        let empty = empty.display();
        let cases = [
            (
                "amqps://u:secret@h/%2f?cacertfile=/nonexistent/ca.pem".to_string(),
                "cacertfile=/nonexistent/ca.pem: cannot read it",
            ),
            (
                format!("amqps://u:secret@h/%2f?cacertfile={empty}"),
                "no certificate in it",
            ),
            (
                format!("amqps://u:secret@h/%2f?certfile={empty}&keyfile=/nonexistent/k"),
                "no certificate in it",
            ),
            (
                "amqps://u:secret@h/%2f?verify=maybe".to_string(),
                "verify=maybe: expected verify_peer or verify_none",
            ),
            (
                "amqps://u:secret@h/%2f?certfile=/x.pem".to_string(),
                "certfile without keyfile",
            ),
            (
                "amqp://u:secret@h/%2f?cacertfile=/x.pem".to_string(),
                "cacertfile is a TLS parameter: TLS needs an amqps:// URL",
            ),
            ("http://h/".to_string(), "is not amqp:// or amqps://"),
        ];
        for (url, expected) in cases {
            let e = refusal(&url);
            assert!(e.contains(expected), "{url}: {e}");
            assert!(!e.contains("secret"), "{url}: {e}");
        }
    }

    /// `verify=verify_none` is known, so the connection can warn about it.
    #[test]
    fn verify_none_is_reported() {
        let b = Broker::parse("amqps://h:5671/%2f?verify=verify_none").expect("verify_none");
        assert!(b.is_tls() && !b.verifies_peer());
        assert!(b.warn_if_unverified());
    }
}
