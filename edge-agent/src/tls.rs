//! The bench's trust in the registry (docs/install-edge-agent.md "TLS"):
//! `[registry] ca_file`, a PEM file of the CA certificates to trust instead
//! of the system's, for MQTT over TLS (`mqtt_tls = true`, through
//! rumqttc's rustls transport) and for an `https://` `base_url` (artifact
//! uploads and clock samples, through reqwest). rustls 0.23 with the
//! aws-lc-rs provider, as reqwest and rumqttc already use.

use std::path::Path;
use std::sync::Arc;

use tokio_rustls::rustls;
use tokio_rustls::rustls::pki_types::pem::PemObject;
use tokio_rustls::rustls::pki_types::CertificateDer;

/// The CA certificates of `ca_file` (PEM, one or more `CERTIFICATE`
/// blocks), checked as rustls trust anchors.
///
/// Errors: the file cannot be read, holds no certificate, or one that
/// cannot be a trust anchor; the message names the file.
pub fn read_ca_file(ca_file: &Path) -> Result<Vec<CertificateDer<'static>>, String> {
    let bytes =
        std::fs::read(ca_file).map_err(|e| format!("cannot read {}: {e}", ca_file.display()))?;
    let certs = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("{} is not a PEM certificate file: {e}", ca_file.display()))?;
    if certs.is_empty() {
        return Err(format!(
            "{} holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            ca_file.display()
        ));
    }
    let mut roots = rustls::RootCertStore::empty();
    for c in &certs {
        if let Ok((_, parsed)) = x509_parser::parse_x509_certificate(c.as_ref()) {
            if let Ok(Some(bc)) = parsed.basic_constraints() {
                if !bc.value.ca {
                    return Err(format!(
                        "{}: the certificate of `{}` cannot be a CA (basicConstraints CA:FALSE): give the CA's certificate, not the registry's",
                        ca_file.display(),
                        parsed.subject()
                    ));
                }
            }
        }
        roots.add(c.clone()).map_err(|e| {
            format!(
                "{}: a certificate cannot be trusted as a CA: {e}",
                ca_file.display()
            )
        })?;
    }
    Ok(certs)
}

/// The rustls client configuration of the MQTT link: trusting the
/// certificates of `ca_file`, or the system's CA certificates when `None`.
///
/// Errors: as [`read_ca_file`]; with no file, the system has no CA
/// certificate at all (on Debian: install `ca-certificates`).
pub fn mqtt_client_config(ca_file: Option<&Path>) -> Result<Arc<rustls::ClientConfig>, String> {
    let mut roots = rustls::RootCertStore::empty();
    match ca_file {
        Some(path) => {
            for c in read_ca_file(path)? {
                roots
                    .add(c)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            let (added, _) = roots.add_parsable_certificates(found.certs);
            if added == 0 {
                return Err(
                    "the system has no CA certificates (install ca-certificates, or set registry.ca_file)"
                        .into(),
                );
            }
        }
    }
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The certificates of `ca_file` for the HTTP clients, which then trust
/// only them ([`trusting`]); `None` without a file (the system's CAs).
///
/// Errors: as [`read_ca_file`].
pub fn http_trust(ca_file: Option<&Path>) -> Result<Option<Vec<reqwest::Certificate>>, String> {
    let Some(path) = ca_file else {
        return Ok(None);
    };
    read_ca_file(path)?
        .iter()
        .map(|c| reqwest::Certificate::from_der(c.as_ref()))
        .collect::<Result<Vec<_>, _>>()
        .map(Some)
        .map_err(|e| format!("{}: {e}", path.display()))
}

/// `builder` trusting only `certs` when given (from [`http_trust`]),
/// else the system's CAs (reqwest's default).
pub fn trusting(
    builder: reqwest::ClientBuilder,
    certs: Option<&[reqwest::Certificate]>,
) -> reqwest::ClientBuilder {
    match certs {
        Some(c) => builder.tls_certs_only(c.to_vec()),
        None => builder,
    }
}
