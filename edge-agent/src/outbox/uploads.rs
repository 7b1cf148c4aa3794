//! The upload state machine the uploader ([`crate::uploader`]) drives:
//! `pending` (due, or backing off) → `uploaded` once the registry confirmed
//! the sha256, or `corrupt` (the file no longer matches) or `lost` (the
//! file vanished). Bytes the registry holds without their metadata stay
//! `uploaded` but unbound and are sent once more after the metadata was
//! acknowledged (docs/architecture.md, "Artifact bytes (HTTP)").

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{params, OptionalExtension};
use serde_json::{Map, Value};
use shared_protocol::artifact::{ArtifactType, CapabilityArtifact};

use super::db::now_text;
use super::handle::{Outbox, OutboxError};

/// Uploaded rows are kept this long for `edge-agent` diagnostics, then pruned.
const UPLOADED_RETENTION_DAYS: i64 = 30;

/// Where an artifact is in its life at the edge.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UploadState {
    /// On disk, waiting for (or retrying) upload.
    Pending,
    /// The registry confirmed the sha256. The local file is gone once the
    /// artifact's metadata was acknowledged too (see the module docs).
    Uploaded,
    /// The local file no longer matches its recorded sha256 (disk
    /// corruption). Kept on disk for inspection, not retried.
    Corrupt,
    /// The row exists but its file vanished (deleted by hand, disk replaced).
    Lost,
}

impl UploadState {
    /// The name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            UploadState::Pending => "pending",
            UploadState::Uploaded => "uploaded",
            UploadState::Corrupt => "corrupt",
            UploadState::Lost => "lost",
        }
    }

    fn parse(s: &str) -> Self {
        match s {
            "uploaded" => UploadState::Uploaded,
            "corrupt" => UploadState::Corrupt,
            "lost" => UploadState::Lost,
            _ => UploadState::Pending,
        }
    }
}

/// A row of the outbox, as the uploader and diagnostics see it.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactRecord {
    pub artifact: CapabilityArtifact,
    pub state: UploadState,
    /// Upload attempts that failed.
    pub attempts: u32,
    pub last_error: Option<String>,
    /// Where the bytes are while pending (and, once uploaded, until the
    /// metadata was acknowledged).
    pub path: PathBuf,
    /// The broker acknowledged a session update carrying this artifact's
    /// metadata.
    pub metadata_acked: bool,
}

/// An artifact the uploader should send now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingUpload {
    pub artifact_id: String,
    pub session_id: String,
    pub path: PathBuf,
    pub size_bytes: u64,
    /// Lowercase hex sha256 recorded at ingest.
    pub sha256: String,
    pub content_type: String,
    pub attempts: u32,
}

impl Outbox {
    /// Notified when [`Self::remove_updates`] made artifacts due for a
    /// confirming upload (bytes the registry held without their metadata),
    /// so the uploader need not wait for its next timer.
    pub fn due_again(&self) -> Arc<tokio::sync::Notify> {
        self.inner.due_again.clone()
    }

    /// Artifacts due for upload (pending, not backing off), oldest first.
    pub fn due_uploads(&self, limit: usize) -> Result<Vec<PendingUpload>, OutboxError> {
        self.due_uploads_sized(limit, 0..u64::MAX)
    }

    /// [`Self::due_uploads`] of the artifacts whose size in bytes lies in
    /// `sizes` (the uploader's lanes: small ones are not held behind a
    /// large one).
    pub fn due_uploads_sized(
        &self,
        limit: usize,
        sizes: std::ops::Range<u64>,
    ) -> Result<Vec<PendingUpload>, OutboxError> {
        let (min, max) = (
            i64::try_from(sizes.start).unwrap_or(i64::MAX),
            i64::try_from(sizes.end).unwrap_or(i64::MAX),
        );
        let now_ms = Utc::now().timestamp_millis();
        let rows = self.with_conn(|c| {
            let mut stmt = c.prepare_cached(
                "SELECT artifact_id, session_id, size_bytes, sha256, content_type, attempts
                 FROM artifacts
                 WHERE upload_state = 'pending' AND next_attempt_at_ms <= ?1
                   AND size_bytes >= ?3 AND size_bytes < ?4
                 ORDER BY rowid LIMIT ?2",
            )?;
            let rows = stmt
                .query_map(params![now_ms, limit as i64, min, max], |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, String>(4)?,
                        r.get::<_, i64>(5)?,
                    ))
                })?
                .collect::<Result<Vec<_>, _>>()?;
            Ok(rows)
        })?;
        Ok(rows
            .into_iter()
            .map(
                |(id, session_id, size, sha256, content_type, attempts)| PendingUpload {
                    path: self.file_path(&id),
                    artifact_id: id,
                    session_id,
                    size_bytes: size.max(0) as u64,
                    sha256,
                    content_type,
                    attempts: attempts.max(0) as u32,
                },
            )
            .collect())
    }

    /// The earliest time a backing-off pending artifact becomes due, if any
    /// artifact is pending at all.
    pub fn next_due_in(&self) -> Result<Option<Duration>, OutboxError> {
        self.next_due_in_sized(0..u64::MAX)
    }

    /// [`Self::next_due_in`] among artifacts whose size in bytes lies in
    /// `sizes`.
    pub fn next_due_in_sized(
        &self,
        sizes: std::ops::Range<u64>,
    ) -> Result<Option<Duration>, OutboxError> {
        let (min, max) = (
            i64::try_from(sizes.start).unwrap_or(i64::MAX),
            i64::try_from(sizes.end).unwrap_or(i64::MAX),
        );
        let next = self.with_conn(|c| {
            c.query_row(
                "SELECT MIN(next_attempt_at_ms) FROM artifacts WHERE upload_state = 'pending'
                   AND size_bytes >= ?1 AND size_bytes < ?2",
                params![min, max],
                |r| r.get::<_, Option<i64>>(0),
            )
        })?;
        let now = Utc::now().timestamp_millis();
        Ok(next.map(|t| Duration::from_millis((t - now).max(0) as u64)))
    }

    /// The registry confirmed `artifact_id`'s sha256 (and did not say it
    /// lacks the metadata; else [`Self::mark_uploaded_unbound`]): mark it
    /// uploaded. The local file is deleted now only if the session update carrying
    /// the artifact's metadata was already acknowledged; otherwise it stays
    /// (still counted against the disk budget) until
    /// [`Self::remove_updates`] records that acknowledgment. A crash
    /// between the commit and the delete leaves a file that the next start
    /// removes.
    ///
    /// Errors: [`OutboxError::UnknownArtifact`] without such a row; SQLite
    /// and file-removal errors.
    pub fn mark_uploaded(&self, artifact_id: &str) -> Result<(), OutboxError> {
        let row = self.with_conn(|c| {
            let row: Option<(i64, String, bool, bool)> = c
                .query_row(
                    "SELECT size_bytes, upload_state, metadata_acked, bytes_bound FROM artifacts
                     WHERE artifact_id = ?1",
                    [artifact_id],
                    |r| {
                        Ok((
                            r.get(0)?,
                            r.get(1)?,
                            r.get::<_, i64>(2)? != 0,
                            r.get::<_, i64>(3)? != 0,
                        ))
                    },
                )
                .optional()?;
            c.execute(
                "UPDATE artifacts SET upload_state = 'uploaded', uploaded_at = ?2, last_error = NULL,
                    bytes_bound = 1
                 WHERE artifact_id = ?1",
                params![artifact_id, now_text()],
            )?;
            Ok(row)
        })?;
        let Some((size, state, metadata_acked, bytes_bound)) = row else {
            return Err(OutboxError::UnknownArtifact(artifact_id.to_string()));
        };
        // Whether the file was still there (and counted against the
        // budget): an uploaded one is until both halves were acknowledged.
        let was_on_disk = match UploadState::parse(&state) {
            UploadState::Pending | UploadState::Corrupt => true,
            UploadState::Uploaded => !metadata_acked || !bytes_bound,
            UploadState::Lost => false,
        };
        if !metadata_acked {
            if was_on_disk {
                tracing::info!(
                    artifact_id,
                    "outbox: bytes confirmed by the registry; the file is kept until its metadata is acknowledged"
                );
            }
            return Ok(());
        }
        self.remove_file(artifact_id)?;
        if was_on_disk {
            self.release(size.max(0) as u64, 1);
        }
        Ok(())
    }

    /// The registry stored `artifact_id`'s bytes but did not know its
    /// metadata yet (`"metadata_received": false`): it holds them unbound
    /// and may sweep them before the metadata arrives. The file stays.
    /// Once the session update carrying the metadata was acknowledged
    /// ([`Self::remove_updates`]) the artifact is due again for a
    /// confirming upload (a repeated PUT: cheap if the registry still has
    /// the bytes, a new copy if it swept them). If it was acknowledged
    /// already (the registry has not processed it yet), that confirming
    /// upload waits `retry_after`.
    ///
    /// Errors: [`OutboxError::UnknownArtifact`] without such a row; SQLite
    /// errors.
    pub fn mark_uploaded_unbound(
        &self,
        artifact_id: &str,
        retry_after: Duration,
    ) -> Result<(), OutboxError> {
        let at = Utc::now().timestamp_millis() + retry_after.as_millis() as i64;
        let changed = self.with_conn(|c| {
            c.execute(
                "UPDATE artifacts SET
                    upload_state = CASE WHEN metadata_acked = 1 THEN 'pending' ELSE 'uploaded' END,
                    attempts = CASE WHEN metadata_acked = 1 THEN attempts + 1 ELSE attempts END,
                    next_attempt_at_ms = ?2,
                    last_error = CASE WHEN metadata_acked = 1
                        THEN 'the registry still holds the bytes without their metadata'
                        ELSE NULL END,
                    uploaded_at = ?3,
                    bytes_bound = 0
                 WHERE artifact_id = ?1 AND upload_state IN ('pending', 'uploaded')",
                params![artifact_id, at, now_text()],
            )
        })?;
        if changed == 0 && self.row_state(artifact_id)?.is_none() {
            return Err(OutboxError::UnknownArtifact(artifact_id.to_string()));
        }
        tracing::info!(
            artifact_id,
            "outbox: the registry holds the bytes without their metadata; the file is kept for a confirming upload"
        );
        Ok(())
    }

    /// An upload attempt failed with `error`; try again after `retry_after`.
    pub fn record_upload_failure(
        &self,
        artifact_id: &str,
        error: &str,
        retry_after: Duration,
    ) -> Result<(), OutboxError> {
        let at = Utc::now().timestamp_millis() + retry_after.as_millis() as i64;
        self.with_conn(|c| {
            c.execute(
                "UPDATE artifacts SET attempts = attempts + 1, last_error = ?2, next_attempt_at_ms = ?3
                 WHERE artifact_id = ?1",
                params![artifact_id, error, at],
            )
        })?;
        Ok(())
    }

    /// The local file no longer matches the recorded sha256: keep it, stop
    /// retrying, record why. It still counts against the disk budget.
    pub fn mark_corrupt(&self, artifact_id: &str, reason: &str) -> Result<(), OutboxError> {
        self.with_conn(|c| {
            c.execute(
                "UPDATE artifacts SET upload_state = 'corrupt', last_error = ?2
                 WHERE artifact_id = ?1 AND upload_state = 'pending'",
                params![artifact_id, reason],
            )
        })?;
        Ok(())
    }

    /// The file of a pending artifact vanished: mark the row `lost` and stop
    /// counting it against the budget.
    pub fn mark_lost(&self, artifact_id: &str, reason: &str) -> Result<(), OutboxError> {
        let changed = self.with_conn(|c| {
            let size: Option<i64> = c
                .query_row(
                    "SELECT size_bytes FROM artifacts
                     WHERE artifact_id = ?1 AND upload_state IN ('pending', 'corrupt')",
                    [artifact_id],
                    |r| r.get(0),
                )
                .optional()?;
            c.execute(
                "UPDATE artifacts SET upload_state = 'lost', last_error = ?2
                 WHERE artifact_id = ?1 AND upload_state IN ('pending', 'corrupt')",
                params![artifact_id, reason],
            )?;
            Ok(size)
        })?;
        if let Some(size) = changed {
            self.release(size.max(0) as u64, 1);
        }
        Ok(())
    }

    /// One row, with its state.
    pub fn artifact(&self, artifact_id: &str) -> Result<Option<ArtifactRecord>, OutboxError> {
        let row = self.with_conn(|c| {
            c.query_row(
                "SELECT artifact_id, session_id, artifact_type, content_type, size_bytes, sha256,
                        captured_at, duration_ms, metadata_json, upload_state, attempts, last_error,
                        metadata_acked
                 FROM artifacts WHERE artifact_id = ?1",
                [artifact_id],
                |r| {
                    Ok((
                        r.get::<_, String>(0)?,
                        r.get::<_, String>(1)?,
                        r.get::<_, String>(2)?,
                        r.get::<_, String>(3)?,
                        r.get::<_, i64>(4)?,
                        r.get::<_, String>(5)?,
                        r.get::<_, String>(6)?,
                        r.get::<_, Option<i64>>(7)?,
                        r.get::<_, String>(8)?,
                        r.get::<_, String>(9)?,
                        r.get::<_, i64>(10)?,
                        r.get::<_, Option<String>>(11)?,
                        r.get::<_, i64>(12)? != 0,
                    ))
                },
            )
            .optional()
        })?;
        let Some((
            id,
            session_id,
            kind,
            content_type,
            size,
            sha256,
            captured,
            duration,
            meta,
            state,
            attempts,
            last_error,
            metadata_acked,
        )) = row
        else {
            return Ok(None);
        };
        let state = UploadState::parse(&state);
        let metadata_json: Map<String, Value> = serde_json::from_str(&meta).unwrap_or_default();
        let artifact_type = kind
            .parse::<ArtifactType>()
            .map_err(|e| OutboxError::Invalid(format!("row {id}: {e}")))?;
        let captured_at = DateTime::parse_from_rfc3339(&captured)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| OutboxError::Invalid(format!("row {id}: captured_at: {e}")))?;
        Ok(Some(ArtifactRecord {
            path: self.file_path(&id),
            artifact: CapabilityArtifact {
                storage_uri: self.storage_uri(&id),
                artifact_id: id,
                session_id,
                artifact_type,
                content_type,
                captured_at,
                duration_ms: duration.map(|d| d.max(0) as u64),
                checksum: sha256,
                size_bytes: size.max(0) as u64,
                metadata_json,
                uploaded: state == UploadState::Uploaded,
            },
            state,
            attempts: attempts.max(0) as u32,
            last_error,
            metadata_acked,
        }))
    }

    pub(super) fn row_state(
        &self,
        artifact_id: &str,
    ) -> Result<Option<(UploadState, String)>, OutboxError> {
        self.with_conn(|c| {
            c.query_row(
                "SELECT upload_state, sha256 FROM artifacts WHERE artifact_id = ?1",
                [artifact_id],
                |r| Ok((UploadState::parse(&r.get::<_, String>(0)?), r.get(1)?)),
            )
            .optional()
        })
    }

    /// The metadata was acknowledged and the registry confirmed bytes it
    /// could bind.
    pub(super) fn fully_acknowledged(&self, artifact_id: &str) -> Result<bool, OutboxError> {
        self.with_conn(|c| {
            c.query_row(
                "SELECT metadata_acked AND bytes_bound FROM artifacts WHERE artifact_id = ?1",
                [artifact_id],
                |r| r.get::<_, i64>(0),
            )
            .optional()
            .map(|v| v.unwrap_or(0) != 0)
        })
    }

    pub(super) fn prune_uploaded(&self) -> Result<(), OutboxError> {
        let cutoff = (Utc::now() - chrono::Duration::days(UPLOADED_RETENTION_DAYS))
            .to_rfc3339_opts(SecondsFormat::Millis, true);
        self.with_conn(|c| {
            c.execute(
                "DELETE FROM artifacts
                 WHERE upload_state = 'uploaded' AND metadata_acked = 1 AND bytes_bound = 1
                   AND uploaded_at < ?1",
                [&cutoff],
            )
        })?;
        Ok(())
    }
}
