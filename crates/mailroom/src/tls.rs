//! PEM files for TLS, read and checked the same way wherever mailroom takes
//! them: the HTTP handlers' `ca_file`, `client_cert` and `client_key`, and
//! the server's own `[tls] cert_file` and `key_file`. Every error names the
//! file; callers add the configuration key.
//!
//! TLS runs on rustls with the aws-lc-rs provider ([`provider`]).

use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use std::path::Path;
use std::sync::Arc;

/// Why a PEM file was refused.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PemError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Read {
        /// The path as it was configured.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file holds no `CERTIFICATE` block.
    #[error("{file}: no PEM certificate (-----BEGIN CERTIFICATE-----) found")]
    NoCertificate {
        /// The path as it was configured.
        file: String,
    },
    /// The file holds no private key block.
    #[error("{file}: no PEM private key (PKCS#8, PKCS#1 or SEC1) found")]
    NoKey {
        /// The path as it was configured.
        file: String,
    },
    /// The PEM text or what it encodes is malformed.
    #[error("{file}: {reason}")]
    Malformed {
        /// The path as it was configured.
        file: String,
        /// What is wrong.
        reason: String,
    },
    /// The private key is not the certificate's.
    #[error("{key_file} does not match the certificate in {cert_file}: {reason}")]
    Mismatch {
        /// The certificate file.
        cert_file: String,
        /// The key file.
        key_file: String,
        /// rustls's reason.
        reason: String,
    },
}

/// The crypto provider of every TLS config mailroom builds: aws-lc-rs,
/// never a process-wide default another library may have installed.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A PEM file's bytes and the certificates it holds (at least one, in
/// file order: a leaf first, then its chain).
pub fn read_certs(path: &Path) -> Result<(Vec<u8>, Vec<CertificateDer<'static>>), PemError> {
    let file = path.display().to_string();
    let pem = read(path)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PemError::Malformed {
            file: file.clone(),
            reason: format!("not valid PEM: {e}"),
        })?;
    if certs.is_empty() {
        return Err(PemError::NoCertificate { file });
    }
    Ok((pem, certs))
}

/// A PEM file's bytes and the (first) private key it holds.
pub fn read_key(path: &Path) -> Result<(Vec<u8>, PrivateKeyDer<'static>), PemError> {
    let file = path.display().to_string();
    let pem = read(path)?;
    match PrivateKeyDer::from_pem_slice(&pem) {
        Ok(key) => Ok((pem, key)),
        Err(rustls_pki_types::pem::Error::NoItemsFound) => Err(PemError::NoKey { file }),
        Err(e) => Err(PemError::Malformed {
            file,
            reason: format!("not valid PEM: {e}"),
        }),
    }
}

/// Checks that every certificate of a CA file can serve as a trust anchor.
pub fn check_ca(path: &Path, certs: &[CertificateDer<'static>]) -> Result<(), PemError> {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots.add(cert.clone()).map_err(|e| PemError::Malformed {
            file: path.display().to_string(),
            reason: format!("not a usable CA certificate: {e}"),
        })?;
    }
    Ok(())
}

/// The chain of `cert_file` with the key of `key_file`, checked to belong
/// together (the key's public half is the leaf certificate's).
pub fn certified_key(
    cert_file: &Path,
    certs: Vec<CertificateDer<'static>>,
    key_file: &Path,
    key: PrivateKeyDer<'static>,
) -> Result<CertifiedKey, PemError> {
    CertifiedKey::from_der(certs, key, &provider()).map_err(|e| PemError::Mismatch {
        cert_file: cert_file.display().to_string(),
        key_file: key_file.display().to_string(),
        reason: e.to_string(),
    })
}

fn read(path: &Path) -> Result<Vec<u8>, PemError> {
    std::fs::read(path).map_err(|source| PemError::Read {
        file: path.display().to_string(),
        source,
    })
}
