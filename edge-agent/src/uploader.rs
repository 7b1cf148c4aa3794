//! The uploader: drains the outbox to the registry over HTTP
//! (docs/architecture.md "Artifact bytes").
//!
//! For each pending artifact, oldest first:
//!
//! ```text
//! PUT {base_url}/api/v1/artifacts/{artifact_id}/content
//! Authorization: Bearer {token}
//! X-Checksum-Sha256: {64 lowercase hex}
//! Content-Type: {artifact content type}
//! Content-Length: {size}
//! <the file, streamed>
//! ```
//!
//! - `200`/`201` whose JSON `checksum` equals ours: the row is marked
//!   uploaded. The local file is deleted once the session update carrying
//!   the artifact's metadata was acknowledged by the broker too (now, or
//!   later by the publisher; see [`crate::outbox`]). When the answer says
//!   `"metadata_received": false` the registry holds the bytes unbound and
//!   may sweep them: once the metadata was acknowledged the artifact is
//!   sent once more to confirm, and only that answer lets the file go.
//!   A crash between the PUT and
//!   the mark simply sends again; the registry answers a repeated PUT of the
//!   same bytes with `200` (idempotent), so delivery is exactly-once in
//!   effect.
//! - `422` with error code `checksum_mismatch`: logged loudly, the file is
//!   kept and re-hashed. If it still matches its recorded sha256 the bytes
//!   were damaged in transit and the upload is retried; if not, the disk
//!   corrupted it: the artifact is marked `corrupt` and kept for inspection.
//! - `401`/`403`: the token is refused; everything waits a minute.
//! - Connection errors, timeouts, `429` and `5xx`: the registry is
//!   unreachable; back off exponentially (with jitter, up to a minute).
//! - Other `4xx`: this artifact backs off on its own; others continue.
//!
//! File reads go through `tokio::fs` (the blocking pool) and SQLite calls
//! through `spawn_blocking`; the body is streamed, never loaded whole.

use std::sync::Arc;
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_TYPE};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::{watch, Notify};

use crate::link::Backoff;
use crate::outbox::{Outbox, OutboxError, PendingUpload};

/// Header carrying the sha256 of the body.
pub const CHECKSUM_HEADER: &str = "X-Checksum-Sha256";
/// Longest pause while the registry is unreachable.
const UNREACHABLE_CAP: Duration = Duration::from_secs(60);
/// Pause after the registry refused the token.
const AUTH_PAUSE: Duration = Duration::from_secs(60);
/// Artifacts read from the database per round.
const BATCH: usize = 16;

/// What one upload attempt ended in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UploadOutcome {
    /// The registry stored the bytes and confirmed their sha256.
    Uploaded,
    /// The same, but the registry did not know the artifact's metadata
    /// (`"metadata_received": false`): it holds the bytes unbound.
    UploadedUnbound,
    /// `422 checksum_mismatch`; the local file was re-hashed: `local_intact`
    /// tells whether it still matches the recorded sha256.
    ChecksumMismatch { local_intact: bool },
    /// The registry could not be reached or is overloaded; try later.
    Unreachable(String),
    /// The registry refused the token.
    AuthRefused(String),
    /// The registry refused this artifact (other 4xx, or a confirmation with
    /// the wrong checksum); it backs off alone.
    Refused(String),
    /// The local file is gone.
    FileMissing,
}

/// What [`Uploader::drain_once`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DrainReport {
    pub uploaded: usize,
    pub failed: usize,
    /// Stopped early because the registry is unreachable or refused the token.
    pub registry_unavailable: bool,
    /// The registry refused the token (401/403).
    pub auth_refused: bool,
}

/// Uploads outbox artifacts to the registry.
#[derive(Clone)]
pub struct Uploader {
    http: reqwest::Client,
    outbox: Outbox,
    base_url: String,
    token: Arc<str>,
    artifacts_ready: Arc<Notify>,
}

impl Uploader {
    /// An uploader for `base_url` (e.g. `https://registry.lab.example`)
    /// with the provider's bearer `token`. `artifacts_ready` is notified
    /// whenever something was ingested.
    pub fn new(
        outbox: Outbox,
        base_url: &str,
        token: &str,
        artifacts_ready: Arc<Notify>,
    ) -> Result<Self, reqwest::Error> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(1)
            .build()?;
        Ok(Self {
            http,
            outbox,
            base_url: base_url.trim_end_matches('/').to_string(),
            token: token.into(),
            artifacts_ready,
        })
    }

    /// `{base_url}/api/v1/artifacts/{artifact_id}/content`.
    pub fn content_url(&self, artifact_id: &str) -> String {
        format!("{}/api/v1/artifacts/{artifact_id}/content", self.base_url)
    }

    /// Run until `stop` turns true: upload what is due, wait for new
    /// artifacts or the next retry, back off while the registry is away.
    pub async fn run(self, mut stop: watch::Receiver<bool>) {
        let mut backoff = Backoff::new(Duration::from_secs(1), UNREACHABLE_CAP);
        let mut unreachable_since: Option<std::time::Instant> = None;
        let due_again = self.outbox.due_again();
        loop {
            if *stop.borrow() {
                return;
            }
            let report = self.drain_once().await;
            let pause = if report.auth_refused {
                AUTH_PAUSE
            } else if report.registry_unavailable {
                if unreachable_since.is_none() {
                    unreachable_since = Some(std::time::Instant::now());
                }
                backoff.next_delay()
            } else {
                if let Some(since) = unreachable_since.take() {
                    tracing::info!(
                        after_s = since.elapsed().as_secs(),
                        "uploader: registry reachable again"
                    );
                }
                backoff.reset();
                let outbox = self.outbox.clone();
                match tokio::task::spawn_blocking(move || outbox.next_due_in()).await {
                    Ok(Ok(Some(d))) => d.clamp(Duration::from_millis(100), Duration::from_secs(60)),
                    _ => Duration::from_secs(60),
                }
            };
            tokio::select! {
                _ = self.artifacts_ready.notified(), if !report.registry_unavailable => {}
                _ = due_again.notified(), if !report.registry_unavailable => {}
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Upload every artifact due now, oldest first, until one finds the
    /// registry unavailable.
    pub async fn drain_once(&self) -> DrainReport {
        let mut report = DrainReport::default();
        loop {
            let outbox = self.outbox.clone();
            let due = match tokio::task::spawn_blocking(move || outbox.due_uploads(BATCH)).await {
                Ok(Ok(due)) => due,
                Ok(Err(e)) => {
                    tracing::error!("uploader: reading the outbox failed: {e}");
                    return report;
                }
                Err(e) => {
                    tracing::error!("uploader: {e}");
                    return report;
                }
            };
            if due.is_empty() {
                return report;
            }
            for p in due {
                let outcome = self.upload_one(&p).await;
                match self.settle(&p, &outcome).await {
                    Ok(()) => {}
                    Err(e) => {
                        tracing::error!(artifact_id = %p.artifact_id, "uploader: recording the outcome failed: {e}")
                    }
                }
                match outcome {
                    UploadOutcome::Uploaded | UploadOutcome::UploadedUnbound => {
                        report.uploaded += 1
                    }
                    UploadOutcome::Unreachable(_) | UploadOutcome::AuthRefused(_) => {
                        report.auth_refused = matches!(outcome, UploadOutcome::AuthRefused(_));
                        report.failed += 1;
                        report.registry_unavailable = true;
                        return report;
                    }
                    _ => report.failed += 1,
                }
            }
        }
    }

    /// Record `outcome` in the outbox (mark uploaded, back off, mark
    /// corrupt).
    async fn settle(&self, p: &PendingUpload, outcome: &UploadOutcome) -> Result<(), OutboxError> {
        let outbox = self.outbox.clone();
        let id = p.artifact_id.clone();
        let attempts = p.attempts;
        let outcome = outcome.clone();
        let size = p.size_bytes;
        let result = tokio::task::spawn_blocking(move || match outcome {
            UploadOutcome::Uploaded => {
                tracing::info!(artifact_id = %id, size_bytes = size, "uploader: artifact uploaded");
                outbox.mark_uploaded(&id)
            }
            UploadOutcome::UploadedUnbound => {
                tracing::info!(artifact_id = %id, size_bytes = size, "uploader: artifact uploaded, its metadata not yet at the registry");
                outbox.mark_uploaded_unbound(&id, per_artifact_backoff(attempts))
            }
            UploadOutcome::ChecksumMismatch { local_intact: true } => outbox.record_upload_failure(
                &id,
                "registry reported checksum_mismatch although the local file is intact (damaged in transit?)",
                Duration::from_secs(30),
            ),
            UploadOutcome::ChecksumMismatch { local_intact: false } => outbox.mark_corrupt(
                &id,
                "the local file no longer matches the sha256 recorded at capture (disk corruption)",
            ),
            UploadOutcome::Refused(why) => {
                outbox.record_upload_failure(&id, &why, per_artifact_backoff(attempts))
            }
            UploadOutcome::FileMissing => outbox.mark_lost(&id, "file missing at upload"),
            UploadOutcome::Unreachable(why) | UploadOutcome::AuthRefused(why) => {
                outbox.record_upload_failure(&id, &why, Duration::ZERO)
            }
        })
        .await;
        result.unwrap_or_else(|e| Err(OutboxError::Invalid(format!("settle task: {e}"))))
    }

    /// One PUT of one artifact.
    pub async fn upload_one(&self, p: &PendingUpload) -> UploadOutcome {
        let file = match tokio::fs::File::open(&p.path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::error!(artifact_id = %p.artifact_id, path = %p.path.display(), "uploader: the file of a pending artifact is missing");
                return UploadOutcome::FileMissing;
            }
            Err(e) => {
                return UploadOutcome::Refused(format!("cannot open {}: {e}", p.path.display()))
            }
        };
        // Allow 1 MiB/s at worst, plus 30 s.
        let timeout = Duration::from_secs(30 + p.size_bytes / (1024 * 1024));
        let response = self
            .http
            .put(self.content_url(&p.artifact_id))
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .header(CHECKSUM_HEADER, &p.sha256)
            .header(CONTENT_TYPE, &p.content_type)
            .header(CONTENT_LENGTH, p.size_bytes)
            .body(reqwest::Body::from(file))
            .timeout(timeout)
            .send()
            .await;
        let response = match response {
            Ok(r) => r,
            Err(e) => return UploadOutcome::Unreachable(format!("PUT failed: {e}")),
        };
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        match status {
            StatusCode::OK | StatusCode::CREATED => match confirmed_checksum(&body) {
                Some(sum) if sum == p.sha256 => {
                    if body.get("metadata_received").and_then(Value::as_bool) == Some(false) {
                        UploadOutcome::UploadedUnbound
                    } else {
                        UploadOutcome::Uploaded
                    }
                }
                Some(sum) => {
                    tracing::error!(artifact_id = %p.artifact_id, ours = %p.sha256, theirs = %sum, "uploader: the registry confirmed a different checksum; keeping the file");
                    UploadOutcome::Refused(format!(
                        "registry confirmed checksum {sum}, expected {}",
                        p.sha256
                    ))
                }
                None => UploadOutcome::Refused(format!(
                    "registry answered {status} without a `checksum` in its JSON body"
                )),
            },
            StatusCode::UNPROCESSABLE_ENTITY if error_code(&body) == Some("checksum_mismatch") => {
                let outbox = self.outbox.clone();
                let id = p.artifact_id.clone();
                let local = tokio::task::spawn_blocking(move || outbox.rehash(&id)).await;
                let local_intact = matches!(&local, Ok(Ok(h)) if *h == p.sha256);
                tracing::error!(
                    artifact_id = %p.artifact_id,
                    expected = %p.sha256,
                    local_file_intact = local_intact,
                    "uploader: the registry reports checksum_mismatch; the file is kept"
                );
                UploadOutcome::ChecksumMismatch { local_intact }
            }
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                tracing::error!(%status, "uploader: the registry refused the provider token");
                UploadOutcome::AuthRefused(format!("{status}: {}", error_message(&body)))
            }
            s if s == StatusCode::TOO_MANY_REQUESTS || s.is_server_error() => {
                UploadOutcome::Unreachable(format!("{s}: {}", error_message(&body)))
            }
            s => {
                tracing::warn!(artifact_id = %p.artifact_id, status = %s, "uploader: the registry refused an artifact: {}", error_message(&body));
                UploadOutcome::Refused(format!("{s}: {}", error_message(&body)))
            }
        }
    }
}

/// A refused artifact waits 2^attempts seconds (up to an hour).
fn per_artifact_backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(12)).min(Duration::from_secs(3600))
}

/// The checksum the registry confirmed: `checksum` (a `CapabilityArtifact`),
/// `sha256`, or either under `artifact`.
fn confirmed_checksum(body: &Value) -> Option<String> {
    let pick = |v: &Value| {
        v.get("checksum")
            .or_else(|| v.get("sha256"))
            .and_then(Value::as_str)
            .map(str::to_ascii_lowercase)
    };
    pick(body).or_else(|| body.get("artifact").and_then(pick))
}

/// `error.code` of a registry error body.
fn error_code(body: &Value) -> Option<&str> {
    body.get("error")?.get("code")?.as_str()
}

fn error_message(body: &Value) -> String {
    body.get("error")
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| "no error message".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_confirmed_checksum_is_read_from_an_artifact_record() {
        let body = serde_json::json!({"artifact_id": "a", "checksum": "AB12"});
        assert_eq!(confirmed_checksum(&body).as_deref(), Some("ab12"));
        let nested = serde_json::json!({"artifact": {"sha256": "cd"}});
        assert_eq!(confirmed_checksum(&nested).as_deref(), Some("cd"));
        assert_eq!(confirmed_checksum(&serde_json::json!({})), None);
    }
}
