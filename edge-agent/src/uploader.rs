//! The uploader: drains the outbox to the registry over HTTP
//! (docs/architecture.md "Artifact bytes").
//!
//! Two lanes work side by side, each oldest first: artifacts under
//! [`LARGE_ARTIFACT_BYTES`] and the others, so a small snapshot never waits
//! behind a large clip, and each lane backs off on its own.
//!
//! A large artifact, and any artifact sent before (an earlier attempt may
//! have reached the registry although its answer or its record here was
//! lost), first asks what the registry holds:
//!
//! ```text
//! GET {base_url}/api/v1/artifacts/{artifact_id}/content/upload-status
//! X-Checksum-Sha256: {64 lowercase hex}
//! ```
//!
//! `complete: true` settles it without sending a byte; otherwise a large
//! artifact is sent from `received_bytes` on, with
//! `Content-Range: bytes {received}-{size-1}/{size}`, so a link that drops
//! every few seconds still gets it through. Every failed attempt is logged
//! at `warn` with the artifact id, the bytes sent and the error.
//!
//! The plain upload, for a small artifact:
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

use std::collections::HashSet;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use reqwest::header::{AUTHORIZATION, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncSeekExt};
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
/// Artifacts of at least this many bytes (1 MiB) go in the large lane and
/// are sent resumably.
pub const LARGE_ARTIFACT_BYTES: u64 = 1024 * 1024;
/// Pause of the large lane after an attempt that broke off having sent
/// bytes: the registry keeps them, so the next attempt continues soon.
const RESUME_PAUSE: Duration = Duration::from_secs(1);
/// Chunk size of upload bodies, bytes.
const BODY_CHUNK: usize = 64 * 1024;

/// Which artifacts one lane of the uploader works on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lane {
    /// Under [`LARGE_ARTIFACT_BYTES`].
    Small,
    /// [`LARGE_ARTIFACT_BYTES`] and more.
    Large,
}

impl Lane {
    /// The sizes, in bytes, of the lane's artifacts.
    pub fn sizes(self) -> Range<u64> {
        match self {
            Lane::Small => 0..LARGE_ARTIFACT_BYTES,
            Lane::Large => LARGE_ARTIFACT_BYTES..u64::MAX,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Lane::Small => "small",
            Lane::Large => "large",
        }
    }
}

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
    /// The registry could not be reached, or the connection broke; try
    /// later.
    Unreachable(String),
    /// The registry answered 429 or 5xx (overloaded, or its artifact store
    /// is down): nothing it received is kept; back off.
    Unavailable(String),
    /// The registry refused the token.
    AuthRefused(String),
    /// The registry refused this artifact (other 4xx, or a confirmation with
    /// the wrong checksum); it backs off alone.
    Refused(String),
    /// The local file is gone.
    FileMissing,
    /// The registry holds part of a resumable upload, or another attempt
    /// of it is still being received: ask again shortly.
    Retry(String),
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
    /// The attempt that found the registry unreachable had sent bytes
    /// before its connection broke (which a resumable upload keeps):
    /// continue soon. Never set after a 429/5xx answer.
    pub progressed: bool,
    /// Recording an outcome in the outbox failed (a full disk?).
    pub bookkeeping_failed: bool,
}

/// What the registry holds of one upload (`upload-status`).
enum Held {
    /// All of it: no byte needs sending.
    Complete { metadata_received: bool },
    /// This many bytes of an unfinished resumable upload (0: none).
    Partial(u64),
    /// The registry does not answer the question (an older version):
    /// send the whole with a plain PUT.
    Unknown,
}

/// Uploads outbox artifacts to the registry.
#[derive(Clone)]
pub struct Uploader {
    http: reqwest::Client,
    outbox: Outbox,
    base_url: String,
    token: Arc<str>,
    artifacts_ready: Arc<Notify>,
    /// Artifacts the registry confirmed whose confirmation could not be
    /// recorded in the outbox: asked about before any byte is sent again.
    confirmed_unrecorded: Arc<Mutex<HashSet<String>>>,
}

impl Uploader {
    /// An uploader for `base_url` (e.g. `https://registry.lab.example`)
    /// with the provider's bearer `token`. `artifacts_ready` is notified
    /// whenever something was ingested. `trust`: the only CA certificates
    /// an `https://` registry may be signed by
    /// ([`crate::tls::http_trust`]); `None`: the system's.
    ///
    /// Errors: the HTTP client cannot be built (TLS backend).
    pub fn new(
        outbox: Outbox,
        base_url: &str,
        token: &str,
        artifacts_ready: Arc<Notify>,
        trust: Option<&[reqwest::Certificate]>,
    ) -> Result<Self, reqwest::Error> {
        let builder = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(1);
        let http = crate::tls::trusting(builder, trust).build()?;
        Ok(Self {
            http,
            outbox,
            base_url: base_url.trim_end_matches('/').to_string(),
            token: token.into(),
            artifacts_ready,
            confirmed_unrecorded: Arc::default(),
        })
    }

    /// `{base_url}/api/v1/artifacts/{artifact_id}/content`.
    pub fn content_url(&self, artifact_id: &str) -> String {
        format!("{}/api/v1/artifacts/{artifact_id}/content", self.base_url)
    }

    /// `{base_url}/api/v1/artifacts/{artifact_id}/content/upload-status`.
    pub fn status_url(&self, artifact_id: &str) -> String {
        format!("{}/upload-status", self.content_url(artifact_id))
    }

    /// Run until `stop` turns true: both lanes upload what is due, wait
    /// for new artifacts or the next retry, and back off on their own
    /// while the registry is away.
    pub async fn run(self, stop: watch::Receiver<bool>) {
        let lanes = [
            (Lane::Small, Arc::new(Notify::new())),
            (Lane::Large, Arc::new(Notify::new())),
        ];
        // The runner and the outbox wake one waiter; every lane must hear.
        let forward = {
            let (ready, due) = (self.artifacts_ready.clone(), self.outbox.due_again());
            let wake: Vec<Arc<Notify>> = lanes.iter().map(|(_, n)| n.clone()).collect();
            let mut stop = stop.clone();
            tokio::spawn(async move {
                loop {
                    tokio::select! {
                        _ = ready.notified() => {}
                        _ = due.notified() => {}
                        _ = stop.changed() => return,
                    }
                    for w in &wake {
                        w.notify_one();
                    }
                }
            })
        };
        let tasks: Vec<_> = lanes
            .into_iter()
            .map(|(lane, wake)| tokio::spawn(self.clone().run_lane(lane, wake, stop.clone())))
            .collect();
        for t in tasks {
            let _ = t.await;
        }
        forward.abort();
    }

    async fn run_lane(self, lane: Lane, wake: Arc<Notify>, mut stop: watch::Receiver<bool>) {
        let mut backoff = Backoff::new(Duration::from_secs(1), UNREACHABLE_CAP);
        let mut unreachable_since: Option<std::time::Instant> = None;
        loop {
            if *stop.borrow() {
                return;
            }
            let report = self.drain_lane(lane).await;
            let pause = if report.auth_refused {
                AUTH_PAUSE
            } else if report.registry_unavailable && report.progressed {
                backoff.reset();
                RESUME_PAUSE
            } else if report.registry_unavailable || report.bookkeeping_failed {
                if unreachable_since.is_none() && report.registry_unavailable {
                    unreachable_since = Some(std::time::Instant::now());
                }
                backoff.next_delay()
            } else {
                if let Some(since) = unreachable_since.take() {
                    tracing::info!(
                        lane = lane.name(),
                        after_s = since.elapsed().as_secs(),
                        "uploader: registry reachable again"
                    );
                }
                backoff.reset();
                let outbox = self.outbox.clone();
                match tokio::task::spawn_blocking(move || outbox.next_due_in_sized(lane.sizes()))
                    .await
                {
                    Ok(Ok(Some(d))) => d.clamp(Duration::from_millis(100), Duration::from_secs(60)),
                    _ => Duration::from_secs(60),
                }
            };
            let waiting_out = report.registry_unavailable || report.bookkeeping_failed;
            tokio::select! {
                _ = wake.notified(), if !waiting_out => {}
                _ = tokio::time::sleep(pause) => {}
                _ = stop.changed() => return,
            }
        }
    }

    /// Upload every artifact due now, the small lane then the large one,
    /// each until one finds the registry unavailable.
    pub async fn drain_once(&self) -> DrainReport {
        let mut report = self.drain_lane(Lane::Small).await;
        let large = self.drain_lane(Lane::Large).await;
        report.uploaded += large.uploaded;
        report.failed += large.failed;
        report.registry_unavailable |= large.registry_unavailable;
        report.auth_refused |= large.auth_refused;
        report.progressed |= large.progressed;
        report.bookkeeping_failed |= large.bookkeeping_failed;
        report
    }

    /// Upload every artifact of `lane` due now, oldest first, until one
    /// finds the registry unavailable or its outcome cannot be recorded.
    pub async fn drain_lane(&self, lane: Lane) -> DrainReport {
        let mut report = DrainReport::default();
        loop {
            let outbox = self.outbox.clone();
            let due = match tokio::task::spawn_blocking(move || {
                outbox.due_uploads_sized(BATCH, lane.sizes())
            })
            .await
            {
                Ok(Ok(due)) => due,
                Ok(Err(e)) => {
                    tracing::error!("uploader: reading the outbox failed: {e}");
                    report.bookkeeping_failed = true;
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
                let (outcome, sent) = self.attempt(&p).await;
                if let Err(e) = self.settle(&p, &outcome).await {
                    tracing::error!(artifact_id = %p.artifact_id, "uploader: recording the outcome failed; backing off: {e}");
                    if matches!(
                        outcome,
                        UploadOutcome::Uploaded | UploadOutcome::UploadedUnbound
                    ) {
                        lock(&self.confirmed_unrecorded).insert(p.artifact_id.clone());
                    }
                    report.bookkeeping_failed = true;
                    return report;
                }
                lock(&self.confirmed_unrecorded).remove(&p.artifact_id);
                match outcome {
                    UploadOutcome::Uploaded | UploadOutcome::UploadedUnbound => {
                        report.uploaded += 1
                    }
                    UploadOutcome::Unreachable(_)
                    | UploadOutcome::Unavailable(_)
                    | UploadOutcome::AuthRefused(_) => {
                        report.auth_refused = matches!(outcome, UploadOutcome::AuthRefused(_));
                        // Bytes sent before the connection broke may be
                        // kept by a resumable upload; bytes answered with
                        // 429/5xx are not, and the registry asked for time.
                        report.progressed =
                            sent > 0 && matches!(outcome, UploadOutcome::Unreachable(_));
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
            UploadOutcome::Unreachable(why)
            | UploadOutcome::Unavailable(why)
            | UploadOutcome::AuthRefused(why) => {
                outbox.record_upload_failure(&id, &why, Duration::ZERO)
            }
            UploadOutcome::Retry(why) => outbox.record_upload_failure(&id, &why, RESUME_PAUSE),
        })
        .await;
        result.unwrap_or_else(|e| Err(OutboxError::Invalid(format!("settle task: {e}"))))
    }

    /// One upload of one artifact (see the module doc).
    pub async fn upload_one(&self, p: &PendingUpload) -> UploadOutcome {
        self.attempt(p).await.0
    }

    /// One attempt: ask what the registry holds when that may save bytes,
    /// then send what it lacks. Returns the outcome and the body bytes
    /// handed to the connection. Failed attempts are logged at `warn`.
    async fn attempt(&self, p: &PendingUpload) -> (UploadOutcome, u64) {
        let large = p.size_bytes >= LARGE_ARTIFACT_BYTES;
        let sent_before =
            p.attempts > 0 || lock(&self.confirmed_unrecorded).contains(&p.artifact_id);
        let mut held = Held::Unknown;
        if large || sent_before {
            held = match self.upload_status(p).await {
                Ok(h) => h,
                Err(outcome) => {
                    tracing::warn!(artifact_id = %p.artifact_id, bytes_sent = 0, error = ?outcome, "uploader: upload attempt failed (asking what the registry holds)");
                    return (outcome, 0);
                }
            };
        }
        let offset = match held {
            Held::Complete { metadata_received } => {
                tracing::info!(artifact_id = %p.artifact_id, size_bytes = p.size_bytes, "uploader: the registry already holds the whole artifact; nothing sent");
                let outcome = if metadata_received {
                    UploadOutcome::Uploaded
                } else {
                    UploadOutcome::UploadedUnbound
                };
                return (outcome, 0);
            }
            Held::Partial(n) if large && n < p.size_bytes => Some(n),
            Held::Partial(_) if large => Some(0),
            _ => None,
        };
        let sent = Arc::new(AtomicU64::new(0));
        let outcome = self.put(p, offset, sent.clone()).await;
        let sent = sent.load(Ordering::Relaxed);
        if !matches!(
            outcome,
            UploadOutcome::Uploaded | UploadOutcome::UploadedUnbound
        ) {
            tracing::warn!(
                artifact_id = %p.artifact_id,
                size_bytes = p.size_bytes,
                offset = offset.unwrap_or(0),
                bytes_sent = sent,
                error = ?outcome,
                "uploader: upload attempt failed"
            );
        } else if let Some(from) = offset.filter(|n| *n > 0) {
            tracing::info!(artifact_id = %p.artifact_id, size_bytes = p.size_bytes, resumed_from = from, "uploader: resumed upload completed");
        }
        (outcome, sent)
    }

    /// `GET …/content/upload-status` for `p`.
    async fn upload_status(&self, p: &PendingUpload) -> Result<Held, UploadOutcome> {
        let response = self
            .http
            .get(self.status_url(&p.artifact_id))
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .header(CHECKSUM_HEADER, &p.sha256)
            .timeout(Duration::from_secs(30))
            .send()
            .await
            .map_err(|e| UploadOutcome::Unreachable(format!("upload-status failed: {e}")))?;
        let status = response.status();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        match status {
            StatusCode::OK => {
                if body.get("complete").and_then(Value::as_bool) == Some(true) {
                    Ok(Held::Complete {
                        metadata_received: body.get("metadata_received").and_then(Value::as_bool)
                            != Some(false),
                    })
                } else {
                    Ok(Held::Partial(
                        body.get("received_bytes")
                            .and_then(Value::as_u64)
                            .unwrap_or(0),
                    ))
                }
            }
            StatusCode::NOT_FOUND | StatusCode::METHOD_NOT_ALLOWED => Ok(Held::Unknown),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(UploadOutcome::AuthRefused(
                format!("{status}: {}", error_message(&body)),
            )),
            s if s == StatusCode::TOO_MANY_REQUESTS || s.is_server_error() => Err(
                UploadOutcome::Unavailable(format!("{s}: {}", error_message(&body))),
            ),
            s => Err(UploadOutcome::Refused(format!(
                "upload-status {s}: {}",
                error_message(&body)
            ))),
        }
    }

    /// One PUT of `p`: the whole file (plain) when `offset` is `None`, else
    /// the bytes from `offset` on with `Content-Range`. `sent` counts the
    /// body bytes handed to the connection.
    async fn put(
        &self,
        p: &PendingUpload,
        offset: Option<u64>,
        sent: Arc<AtomicU64>,
    ) -> UploadOutcome {
        let mut file = match tokio::fs::File::open(&p.path).await {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                tracing::error!(artifact_id = %p.artifact_id, path = %p.path.display(), "uploader: the file of a pending artifact is missing");
                return UploadOutcome::FileMissing;
            }
            Err(e) => {
                return UploadOutcome::Refused(format!("cannot open {}: {e}", p.path.display()))
            }
        };
        let start = offset.unwrap_or(0);
        if start > 0 {
            if let Err(e) = file.seek(std::io::SeekFrom::Start(start)).await {
                return UploadOutcome::Refused(format!("cannot seek {}: {e}", p.path.display()));
            }
        }
        let length = p.size_bytes - start;
        // Allow 1 MiB/s at worst, plus 30 s.
        let timeout = Duration::from_secs(30 + length / (1024 * 1024));
        let mut request = self
            .http
            .put(self.content_url(&p.artifact_id))
            .header(AUTHORIZATION, format!("Bearer {}", self.token))
            .header(CHECKSUM_HEADER, &p.sha256)
            .header(CONTENT_TYPE, &p.content_type)
            .header(CONTENT_LENGTH, length);
        if offset.is_some() && p.size_bytes > 0 {
            request = request.header(
                CONTENT_RANGE,
                format!("bytes {start}-{}/{}", p.size_bytes - 1, p.size_bytes),
            );
        }
        let response = request
            .body(counted_body(file.take(length), sent))
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
            StatusCode::ACCEPTED => UploadOutcome::Retry(format!(
                "the registry holds {} bytes of the upload",
                body.get("received_bytes")
                    .and_then(Value::as_u64)
                    .unwrap_or(0)
            )),
            StatusCode::CONFLICT
                if matches!(
                    error_code(&body),
                    Some("upload_offset_mismatch" | "upload_in_progress")
                ) =>
            {
                UploadOutcome::Retry(format!("409: {}", error_message(&body)))
            }
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => {
                tracing::error!(%status, "uploader: the registry refused the provider token");
                UploadOutcome::AuthRefused(format!("{status}: {}", error_message(&body)))
            }
            s if s == StatusCode::TOO_MANY_REQUESTS || s.is_server_error() => {
                UploadOutcome::Unavailable(format!("{s}: {}", error_message(&body)))
            }
            s => {
                tracing::warn!(artifact_id = %p.artifact_id, status = %s, "uploader: the registry refused an artifact: {}", error_message(&body));
                UploadOutcome::Refused(format!("{s}: {}", error_message(&body)))
            }
        }
    }
}

/// A body streaming `reader` in chunks of [`BODY_CHUNK`], adding what it
/// hands on to `sent`.
fn counted_body(
    reader: impl tokio::io::AsyncRead + Send + Unpin + 'static,
    sent: Arc<AtomicU64>,
) -> reqwest::Body {
    let stream = futures::stream::try_unfold(reader, move |mut r| {
        let sent = sent.clone();
        async move {
            let mut buf = vec![0u8; BODY_CHUNK];
            let n = r.read(&mut buf).await?;
            if n == 0 {
                return Ok::<_, std::io::Error>(None);
            }
            buf.truncate(n);
            sent.fetch_add(n as u64, Ordering::Relaxed);
            Ok(Some((bytes::Bytes::from(buf), r)))
        }
    });
    reqwest::Body::wrap_stream(stream)
}

/// A refused artifact waits 2^attempts seconds (up to an hour).
fn per_artifact_backoff(attempts: u32) -> Duration {
    Duration::from_secs(1u64 << attempts.min(12)).min(Duration::from_secs(3600))
}

/// A poisoned lock still holds a usable set.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
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
