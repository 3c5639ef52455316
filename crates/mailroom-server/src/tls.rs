//! HTTPS on the server's own listener: the certificate and key of
//! `[tls] cert_file` and `key_file`, served to every new handshake and
//! replaced by [`ServerTls::reload`] (the binary calls it on `SIGHUP`)
//! without touching the connections already open.
//!
//! A renewed pair that does not load (unreadable, not PEM, key not the
//! certificate's) is refused and the current one kept, so a botched
//! renewal never takes the listener down.

use mailroom::tls::{self as pem, PemError};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use sha2::{Digest as _, Sha256};
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};

/// Why a certificate and key were refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TlsError {
    /// A file is missing, unreadable, not PEM, or the key is not the
    /// certificate's (`key` is `cert_file` or `key_file`).
    #[error("tls.{key}: {source}")]
    File {
        /// The `[tls]` key of the file at fault.
        key: &'static str,
        /// What is wrong with it.
        source: PemError,
    },
    /// rustls refused the configuration.
    #[error("tls: cannot build the TLS configuration: {0}")]
    Config(#[from] rustls::Error),
}

/// The listener's TLS: one rustls configuration whose certificate can be
/// replaced while serving.
pub struct ServerTls {
    cert_file: PathBuf,
    key_file: PathBuf,
    current: Arc<Current>,
    acceptor: tokio_rustls::TlsAcceptor,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls")
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .field("sha256", &self.fingerprint())
            .finish()
    }
}

/// The certificate every new handshake gets.
#[derive(Debug)]
struct Current(RwLock<Arc<CertifiedKey>>);

impl ResolvesServerCert for Current {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        // A poisoned lock only means a panic while swapping one Arc.
        Some(
            self.0
                .read()
                .unwrap_or_else(PoisonError::into_inner)
                .clone(),
        )
    }
}

impl ServerTls {
    /// Reads and checks `cert_file` (PEM, the leaf first, then its chain)
    /// and `key_file` (its PEM private key).
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, TlsError> {
        let key = read_pair(cert_file, key_file)?;
        let current = Arc::new(Current(RwLock::new(Arc::new(key))));
        let mut config = rustls::ServerConfig::builder_with_provider(pem::provider())
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_cert_resolver(current.clone());
        // The listener speaks HTTP/1.1 only.
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Self {
            cert_file: cert_file.to_path_buf(),
            key_file: key_file.to_path_buf(),
            current,
            acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(config)),
        })
    }

    /// Re-reads both files; on success new handshakes get the new
    /// certificate (open connections keep theirs), else the current one
    /// stays and the error says why.
    pub fn reload(&self) -> Result<(), TlsError> {
        let key = read_pair(&self.cert_file, &self.key_file)?;
        *self
            .current
            .0
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(key);
        Ok(())
    }

    /// SHA-256 of the certificate served now (DER, lowercase hex): what
    /// `openssl x509 -noout -fingerprint -sha256` prints, without colons.
    pub fn fingerprint(&self) -> String {
        let key = self
            .current
            .0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        key.cert
            .first()
            .map(|leaf| hex::encode(Sha256::digest(leaf.as_ref())))
            .unwrap_or_default()
    }

    /// The certificate file.
    pub fn cert_file(&self) -> &Path {
        &self.cert_file
    }

    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        self.acceptor.clone()
    }
}

fn read_pair(cert_file: &Path, key_file: &Path) -> Result<CertifiedKey, TlsError> {
    let at = |key| move |source| TlsError::File { key, source };
    let (_, certs) = pem::read_certs(cert_file).map_err(at("cert_file"))?;
    let (_, key) = pem::read_key(key_file).map_err(at("key_file"))?;
    pem::certified_key(cert_file, certs, key_file, key).map_err(at("key_file"))
}
