//! TLS for the registry (docs/install-registry.md "TLS"): the server side
//! of the HTTPS listener ([`crate::http_server`]) and of the embedded
//! broker's gate ([`crate::broker_gate`]), and the client side of the
//! registry's MQTT client on an external broker ([`crate::mqtt`]).
//!
//! rustls 0.23 with the aws-lc-rs provider, the one reqwest and rumqttc
//! already use. Certificates and keys are PEM files read once at start:
//! rotating them means restarting the registry.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Why a certificate, key or CA file cannot be used. `Display` names the
/// file and what is wrong with it; the caller adds the key it came from.
#[derive(Debug, thiserror::Error)]
pub enum TlsFileError {
    /// The file cannot be read (missing, not allowed).
    #[error("cannot read {path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    /// The file holds no PEM `CERTIFICATE` block, or a broken one.
    #[error("{path} holds no usable PEM certificate{}", in_parens(.detail))]
    NoCertificate { path: String, detail: String },
    /// The file holds no PEM private key (PKCS#8, PKCS#1 or SEC1).
    #[error("{path} holds no usable PEM private key{}", in_parens(.detail))]
    NoKey { path: String, detail: String },
    /// The certificate and the key do not make a server identity (the key
    /// is not the certificate's, or of a kind rustls cannot sign with).
    #[error("{cert} and {key} do not go together: {reason}")]
    Mismatch {
        cert: String,
        key: String,
        reason: String,
    },
    /// A certificate of a CA file is not a CA certificate rustls accepts.
    #[error("{path}: a certificate cannot be trusted as a CA: {reason}")]
    BadCa { path: String, reason: String },
    /// The server's certificate (the file's first) is outside its
    /// validity period now: clients would refuse it.
    #[error("{path}: the certificate {what} (UTC); clients refuse it")]
    OutOfValidity { path: String, what: String },
}

fn in_parens(d: &str) -> String {
    if d.is_empty() {
        String::new()
    } else {
        format!(" ({d})")
    }
}

fn shown(p: &Path) -> String {
    p.display().to_string()
}

/// Every certificate of the PEM file at `path`, in file order.
///
/// Errors: unreadable file, or no certificate in it.
pub fn read_certificates(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsFileError> {
    let bytes = std::fs::read(path).map_err(|source| TlsFileError::Read {
        path: shown(path),
        source,
    })?;
    let certs: Result<Vec<_>, _> = CertificateDer::pem_slice_iter(&bytes).collect();
    match certs {
        Ok(c) if !c.is_empty() => Ok(c),
        Ok(_) => Err(TlsFileError::NoCertificate {
            path: shown(path),
            detail: String::new(),
        }),
        Err(e) => Err(TlsFileError::NoCertificate {
            path: shown(path),
            detail: e.to_string(),
        }),
    }
}

/// Whether `cert` (from the file at `path`) is valid now: not before its
/// `notBefore`, not after its `notAfter`.
///
/// Errors: [`TlsFileError::OutOfValidity`] naming the date; a certificate
/// whose fields cannot be read is [`TlsFileError::NoCertificate`].
fn check_validity(path: &Path, cert: &CertificateDer<'_>) -> Result<(), TlsFileError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|e| {
        TlsFileError::NoCertificate {
            path: shown(path),
            detail: e.to_string(),
        }
    })?;
    let validity = parsed.validity();
    let now = x509_parser::time::ASN1Time::now();
    let what = if now > validity.not_after {
        format!("expired on {}", validity.not_after)
    } else if now < validity.not_before {
        format!("is not valid before {}", validity.not_before)
    } else {
        return Ok(());
    };
    Err(TlsFileError::OutOfValidity {
        path: shown(path),
        what,
    })
}

/// The private key of the PEM file at `path` (the first one).
///
/// Errors: unreadable file, or no key in it.
fn read_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsFileError> {
    let bytes = std::fs::read(path).map_err(|source| TlsFileError::Read {
        path: shown(path),
        source,
    })?;
    PrivateKeyDer::from_pem_slice(&bytes).map_err(|e| TlsFileError::NoKey {
        path: shown(path),
        detail: match e {
            rustls::pki_types::pem::Error::NoItemsFound => String::new(),
            other => other.to_string(),
        },
    })
}

/// A server configuration from a certificate chain (`cert`, PEM, the
/// server's certificate first) and its private key (`key`, PEM), for
/// TLS 1.2 and 1.3 without client certificates. `alpn`: the protocols
/// offered (e.g. `http/1.1`), empty for none.
///
/// Errors: a file cannot be read or parsed, or the key is not the
/// certificate's; the message names the file.
pub fn server_config(
    cert: &Path,
    key: &Path,
    alpn: &[&[u8]],
) -> Result<Arc<rustls::ServerConfig>, TlsFileError> {
    let chain = read_certificates(cert)?;
    check_validity(cert, &chain[0])?;
    let private = read_key(key)?;
    let n_certs = chain.len();
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .and_then(|b| b.with_no_client_auth().with_single_cert(chain, private))
        .map_err(|e| TlsFileError::Mismatch {
            cert: shown(cert),
            key: shown(key),
            reason: if n_certs > 1 {
                format!("{e}; the file holds {n_certs} certificates: the server's own must come first, then its issuers")
            } else {
                e.to_string()
            },
        })?;
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(Arc::new(config))
}

/// A client configuration trusting the CA certificates of the PEM file
/// `ca_file`, or the system's CA certificates when `None` (TLS 1.2 and
/// 1.3, no client certificate).
///
/// Errors: the file cannot be read or holds no CA certificate; with no
/// file, the system has no CA certificate at all (on Debian: install
/// `ca-certificates`).
pub fn client_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, TlsFileError> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for cert in read_certificates(path)? {
                roots.add(cert).map_err(|e| TlsFileError::BadCa {
                    path: shown(path),
                    reason: e.to_string(),
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(TlsFileError::NoCertificate {
                    path: "the system's CA store".into(),
                    detail: found
                        .errors
                        .first()
                        .map(ToString::to_string)
                        .unwrap_or_else(|| "install ca-certificates or set a ca_file".into()),
                });
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| TlsFileError::BadCa {
            path: ca_file.map(shown).unwrap_or_default(),
            reason: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}
