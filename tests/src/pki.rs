//! A throwaway CA and a server certificate it signed, for HTTPS and MQTT
//! over TLS in the tests and benchmarks (docs/install-registry.md "TLS").

use std::path::PathBuf;

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, IsCa, KeyPair, KeyUsagePurpose,
};

use crate::bench::LabTls;

/// PEM files in a temporary directory of their own (removed on drop):
/// `ca.pem` (the CA), `server.pem` and `server.key` (a certificate for
/// `127.0.0.1` and `localhost` signed by that CA, and its PKCS#8 key).
pub struct Pki {
    dir: tempfile::TempDir,
}

impl Pki {
    /// A new CA named `"{name} test CA"` and its server certificate.
    ///
    /// Errors: key generation, signing or writing the files failed.
    pub fn new(name: &str) -> Result<Pki> {
        let dir = benchlink_testkit::temp_dir();
        let mut ca = CertificateParams::new(Vec::<String>::new()).context("CA params")?;
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.distinguished_name
            .push(DnType::CommonName, format!("{name} test CA"));
        ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().context("CA key")?)
            .context("CA certificate")?;
        let mut server =
            CertificateParams::new(vec!["127.0.0.1".to_string(), "localhost".to_string()])
                .context("server params")?;
        server
            .distinguished_name
            .push(DnType::CommonName, "benchlink registry");
        let key = KeyPair::generate().context("server key")?;
        let cert = server.signed_by(&key, &ca).context("server certificate")?;
        std::fs::write(dir.path().join("ca.pem"), ca.pem())?;
        std::fs::write(dir.path().join("server.pem"), cert.pem())?;
        std::fs::write(dir.path().join("server.key"), key.serialize_pem())?;
        Ok(Pki { dir })
    }

    /// The file `name` (`ca.pem`, `server.pem`, `server.key`) of this PKI.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A self-signed certificate for `127.0.0.1` with its key, written as
    /// `{name}.pem` and `{name}.key`: valid from 2020-01-01 to 2020-02-01
    /// when `expired`, and marked `CA:FALSE` (basicConstraints) either
    /// way. Returns both paths.
    ///
    /// Errors: key generation, signing or writing failed.
    pub fn odd_certificate(&self, name: &str, expired: bool) -> Result<(PathBuf, PathBuf)> {
        let mut params = CertificateParams::new(vec!["127.0.0.1".to_string()]).context("params")?;
        params.is_ca = IsCa::ExplicitNoCa;
        if expired {
            params.not_before = rcgen::date_time_ymd(2020, 1, 1);
            params.not_after = rcgen::date_time_ymd(2020, 2, 1);
        }
        let key = KeyPair::generate().context("key")?;
        let cert = params.self_signed(&key).context("certificate")?;
        let (c, k) = (
            self.path(&format!("{name}.pem")),
            self.path(&format!("{name}.key")),
        );
        std::fs::write(&c, cert.pem())?;
        std::fs::write(&k, key.serialize_pem())?;
        Ok((c, k))
    }

    /// The lab's TLS options: the server certificate, its key and the CA.
    pub fn lab_tls(&self) -> LabTls {
        LabTls {
            cert_file: self.path("server.pem"),
            key_file: self.path("server.key"),
            ca_file: self.path("ca.pem"),
        }
    }
}
