//! A private S3 server for one test: `moto_server` (Python `moto`) on a
//! free loopback port, killed when the test ends. Missing `moto_server`
//! follows the missing-service rule ([`crate::skip_unless_ci`]).

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::{free_port, reachable, tool_installed, wait_until, KillOnDrop};

/// Credentials moto accepts (it checks none); the registry's config and
/// the test's own client use them.
pub const MOTO_ACCESS_KEY_ID: &str = "testing";
/// See [`MOTO_ACCESS_KEY_ID`].
pub const MOTO_SECRET_ACCESS_KEY: &str = "testing";
/// The region the tests name.
pub const MOTO_REGION: &str = "us-east-1";

/// A running `moto_server`.
pub struct MotoS3 {
    /// `http://127.0.0.1:PORT`.
    pub endpoint: String,
    _child: KillOnDrop,
}

impl MotoS3 {
    /// Start `moto_server -H 127.0.0.1 -p PORT` and wait (up to 30 s) until
    /// it accepts connections. `None` when `moto_server` is not installed
    /// (outside CI; under `CI=true` that panics).
    ///
    /// Panics: it does not start listening.
    pub fn start() -> Option<MotoS3> {
        if !tool_installed("moto_server") {
            return None;
        }
        let port = free_port();
        let child = Command::new("moto_server")
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn moto_server");
        let child = KillOnDrop(child);
        let addr = format!("127.0.0.1:{port}");
        assert!(
            wait_until(Duration::from_secs(30), || reachable(&addr)),
            "moto_server did not listen on {addr} within 30 s"
        );
        Some(MotoS3 {
            endpoint: format!("http://{addr}"),
            _child: child,
        })
    }

    /// Create the bucket `name` (`PUT /name`; moto needs no signature).
    ///
    /// Panics: the server refuses.
    pub async fn create_bucket(&self, name: &str) {
        let resp = reqwest::Client::new()
            .put(format!("{}/{name}", self.endpoint))
            .send()
            .await
            .expect("PUT bucket to moto_server");
        assert!(
            resp.status().is_success(),
            "moto_server refused to create bucket {name}: {}",
            resp.status()
        );
    }

    /// The `[blobs]` table of a registry config storing in `bucket` here.
    pub fn blobs_toml(&self, bucket: &str, prefix: Option<&str>) -> String {
        let prefix = prefix
            .map(|p| format!("prefix = \"{p}\"\n"))
            .unwrap_or_default();
        format!(
            "[blobs]\nbackend = \"s3\"\nbucket = \"{bucket}\"\nendpoint = \"{}\"\nregion = \"{MOTO_REGION}\"\n{prefix}access_key_id = \"{MOTO_ACCESS_KEY_ID}\"\nsecret_access_key = \"{MOTO_SECRET_ACCESS_KEY}\"\nallow_http = true\n",
            self.endpoint
        )
    }
}
