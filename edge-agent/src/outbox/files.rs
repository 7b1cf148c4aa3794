//! Artifact files. Layout under the configured `dir`:
//! - `{artifact_id}`: the bytes of a pending (or corrupt) artifact;
//! - `.{artifact_id}.part`: a file being written (never referenced by a row
//!   until renamed into place);
//! - `orphaned/`: complete files found at start without a row (a crash hit
//!   between rename and commit); kept for inspection, never uploaded.
//!
//! Files follow the configured `durability` (`fsync`: file fsync before the
//! row is committed). Bytes not yet confirmed by the registry count against
//! the disk budget (kept in `handle.rs`); nothing is ever dropped to make room.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::params;
use serde_json::Value;
use sha2::{Digest, Sha256};
use shared_protocol::artifact::CapabilityArtifact;
use shared_protocol::validate::check_id;

use super::db::is_disk_full;
use super::handle::{lock, Outbox, OutboxError};
use super::reserve::RESERVE_BYTES;
use crate::config::Durability;
use crate::drivers::NewArtifact;

/// Bytes written (and hashed) per `write` call.
const CHUNK: usize = 256 * 1024;

/// True for a file write on a full file system (`ENOSPC`).
fn io_is_disk_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull
}

impl Outbox {
    /// The artifact directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Where a pending artifact's bytes are.
    pub fn file_path(&self, artifact_id: &str) -> PathBuf {
        self.inner.dir.join(artifact_id)
    }

    /// `edge-outbox://{provider_id}/{artifact_id}`: the `storage_uri` of an
    /// artifact that has not reached the registry yet
    /// (docs/architecture.md, "Artifact bytes (HTTP)").
    pub fn storage_uri(&self, artifact_id: &str) -> String {
        format!("edge-outbox://{}/{artifact_id}", self.inner.provider_id)
    }

    /// Take one artifact of `session_id` into the outbox: write its bytes to
    /// a temporary file while computing their sha256, make them durable
    /// (per the configured durability), rename into place and commit the
    /// row. Returns the artifact's metadata for the session update.
    ///
    /// Errors: [`OutboxError::BudgetExhausted`] (nothing written),
    /// [`OutboxError::Invalid`] for a bad session id, I/O and SQLite errors
    /// (nothing left behind).
    pub fn ingest(
        &self,
        session_id: &str,
        artifact: NewArtifact,
    ) -> Result<CapabilityArtifact, OutboxError> {
        let mut out = self.ingest_batch(session_id, vec![artifact])?;
        out.pop()
            .ok_or_else(|| OutboxError::Invalid("nothing was ingested".into()))
    }

    /// Take all artifacts of one action at once: the same guarantees as
    /// [`Outbox::ingest`] for each, with one flush of the file system and one
    /// SQLite transaction for the batch. All or nothing: on error no row is
    /// committed and no file is left.
    pub fn ingest_batch(
        &self,
        session_id: &str,
        artifacts: Vec<NewArtifact>,
    ) -> Result<Vec<CapabilityArtifact>, OutboxError> {
        check_id("session_id", session_id).map_err(|e| OutboxError::Invalid(e.to_string()))?;
        if artifacts.is_empty() {
            return Ok(Vec::new());
        }
        let total: u64 = artifacts.iter().map(|a| a.bytes.len() as u64).sum();
        if !self.restore_reserve() {
            return Err(OutboxError::DiskFull {
                path: self.inner.dir.clone(),
                detail: format!(
                    "no room for the outbox's {} KiB bookkeeping reserve",
                    RESERVE_BYTES / 1024
                ),
            });
        }
        self.reserve(total)?;
        let mut written: Vec<(PathBuf, PathBuf)> = Vec::with_capacity(artifacts.len());
        let result = self
            .write_batch(session_id, artifacts, &mut written)
            .map_err(|e| match e {
                OutboxError::Io { path, source } if io_is_disk_full(&source) => {
                    self.release_reserve(&format!("writing {}: {source}", path.display()));
                    OutboxError::DiskFull {
                        path: self.inner.dir.clone(),
                        detail: format!("writing {}: {source}", path.display()),
                    }
                }
                OutboxError::Db { source, .. } if is_disk_full(&source) => OutboxError::DiskFull {
                    path: self.inner.dir.clone(),
                    detail: format!("recording the artifacts: {source}"),
                },
                e => e,
            });
        match result {
            Ok(metas) => {
                lock(&self.inner.budget).files += metas.len() as u64;
                Ok(metas)
            }
            Err(e) => {
                for (temp, fin) in &written {
                    let _ = fs::remove_file(temp);
                    let _ = fs::remove_file(fin);
                }
                self.release(total, 0);
                Err(e)
            }
        }
    }

    fn write_batch(
        &self,
        session_id: &str,
        artifacts: Vec<NewArtifact>,
        written: &mut Vec<(PathBuf, PathBuf)>,
    ) -> Result<Vec<CapabilityArtifact>, OutboxError> {
        let single = artifacts.len() == 1;
        let fsync = self.inner.durability == Durability::Fsync;
        // Millisecond precision: what is returned equals what is stored.
        let now = Utc::now();
        let captured_at = DateTime::from_timestamp_millis(now.timestamp_millis()).unwrap_or(now);
        let mut metas = Vec::with_capacity(artifacts.len());
        for a in artifacts {
            let artifact_id = format!("art-{}", uuid::Uuid::new_v4());
            let temp = self.inner.dir.join(format!(".{artifact_id}.part"));
            let fin = self.inner.dir.join(&artifact_id);
            written.push((temp.clone(), fin.clone()));
            // A single artifact is flushed on its own; a batch with one
            // syncfs() below, which is far cheaper than N fsyncs.
            let sha256 = write_hashed(&temp, &a.bytes, fsync && single)?;
            fs::rename(&temp, &fin).map_err(|source| OutboxError::Io {
                path: fin.clone(),
                source,
            })?;
            let content_type = if a.content_type.trim().is_empty() {
                "application/octet-stream".to_string()
            } else {
                a.content_type
            };
            metas.push(CapabilityArtifact {
                storage_uri: self.storage_uri(&artifact_id),
                artifact_id,
                session_id: session_id.to_string(),
                artifact_type: a.artifact_type,
                content_type,
                captured_at,
                duration_ms: a.duration_ms,
                checksum: sha256,
                size_bytes: a.bytes.len() as u64,
                metadata_json: a.metadata,
                uploaded: false,
            });
        }
        if fsync && !single {
            sync_filesystem(&self.inner.dir)?;
        }
        self.with_conn(|c| {
            let tx = c.unchecked_transaction()?;
            {
                let mut stmt = tx.prepare_cached(
                    "INSERT INTO artifacts (artifact_id, session_id, artifact_type, content_type,
                        size_bytes, sha256, captured_at, duration_ms, metadata_json, upload_state)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, 'pending')",
                )?;
                for m in &metas {
                    stmt.execute(params![
                        m.artifact_id,
                        m.session_id,
                        m.artifact_type.as_str(),
                        m.content_type,
                        m.size_bytes as i64,
                        m.checksum,
                        m.captured_at.to_rfc3339_opts(SecondsFormat::Millis, true),
                        m.duration_ms.map(|d| d as i64),
                        Value::Object(m.metadata_json.clone()).to_string(),
                    ])?;
                }
            }
            tx.commit()
        })?;
        Ok(metas)
    }

    fn reserve(&self, bytes: u64) -> Result<(), OutboxError> {
        let mut b = lock(&self.inner.budget);
        let needed = b.used.saturating_add(bytes);
        if needed > b.limit {
            return Err(OutboxError::BudgetExhausted {
                budget_mib: b.limit / (1024 * 1024),
                pending_artifacts: b.files,
                needed_bytes: needed,
            });
        }
        b.used = needed;
        Ok(())
    }

    pub(super) fn release(&self, bytes: u64, files: u64) {
        let mut b = lock(&self.inner.budget);
        b.used = b.used.saturating_sub(bytes);
        b.files = b.files.saturating_sub(files);
    }

    /// Delete the local file of `artifact_id` (already gone is fine).
    pub(super) fn remove_file(&self, artifact_id: &str) -> Result<(), OutboxError> {
        let path = self.file_path(artifact_id);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(OutboxError::Io { path, source }),
        }
    }

    /// sha256 of the local file of `artifact_id` as it is on disk now.
    pub fn rehash(&self, artifact_id: &str) -> Result<String, OutboxError> {
        let path = self.file_path(artifact_id);
        hash_file(&path).map_err(|source| OutboxError::Io { path, source })
    }
}

/// Write `bytes` to a new file at `path`, hashing as it goes; optionally
/// flush the data to disk. Returns the lowercase hex sha256.
fn write_hashed(path: &Path, bytes: &[u8], fsync: bool) -> Result<String, OutboxError> {
    let err = |source| OutboxError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(err)?;
    let mut hasher = Sha256::new();
    for chunk in bytes.chunks(CHUNK) {
        hasher.update(chunk);
        file.write_all(chunk).map_err(err)?;
    }
    if fsync {
        file.sync_data().map_err(err)?;
    }
    Ok(hex::encode(hasher.finalize()))
}

/// Flush every dirty page and inode of the file system holding `dir`
/// (one call for a whole batch of new files and their renames).
fn sync_filesystem(dir: &Path) -> Result<(), OutboxError> {
    let err = |source| OutboxError::Io {
        path: dir.to_path_buf(),
        source,
    };
    let d = File::open(dir).map_err(err)?;
    // SAFETY: `d` is an open descriptor for the duration of the call.
    let rc = unsafe { libc::syncfs(d.as_raw_fd()) };
    if rc != 0 {
        return Err(err(std::io::Error::last_os_error()));
    }
    Ok(())
}

/// Lowercase hex sha256 of a file, streamed.
pub fn hash_file(path: &Path) -> std::io::Result<String> {
    let mut f = File::open(path)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hex::encode(hasher.finalize()))
}
