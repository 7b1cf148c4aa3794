//! The evidence outbox: every artifact a driver produces is a file on disk
//! plus a row in SQLite (WAL) before anything else happens to it. The file
//! is deleted only once the registry has both halves of the artifact: its
//! bytes (the uploader, [`crate::uploader`], saw the registry confirm their
//! sha256) and its metadata (the session update carrying it was queued with
//! [`Outbox::queue_update_with_artifacts`] and the broker acknowledged it,
//! [`Outbox::remove_updates`]). Until then the registry may still drop
//! bytes it cannot bind (its unbound-upload sweep), and the local copy is
//! the evidence.
//!
//! Layout under the configured `dir`:
//! - `{artifact_id}`: the bytes of a pending (or corrupt) artifact;
//! - `.{artifact_id}.part`: a file being written (never referenced by a row
//!   until renamed into place);
//! - `orphaned/`: complete files found at start without a row (a crash hit
//!   between rename and commit); kept for inspection, never uploaded.
//!
//! The database also keeps session updates that still have to reach the
//! registry ([`Outbox::queue_update`]), so a restart loses none, and the
//! last update of each session the broker acknowledged (for an hour, at
//! most [`SENT_UPDATE_MAX_ROWS`]), which a `session_sync` from the registry
//! can have sent again ([`Outbox::resend_for_sync`]).
//!
//! Durability: artifact files and rows follow the configured `durability`
//! (`fsync`: file fsync + `synchronous=FULL` commits). Session-update rows
//! are always committed with `synchronous=NORMAL` (no fsync): they survive
//! the daemon being killed, and what a power loss takes is reconciled by
//! the registry, which fails (or marks `incomplete_evidence`) the sessions
//! of a provider that comes back with a new boot id. This keeps two fsyncs
//! off every action's round trip.
//!
//! Every method blocks on file and SQLite I/O: call it from a runner
//! thread, a dedicated thread or `tokio::task::spawn_blocking`, never from
//! an async task directly. [`Outbox`] is cheap to clone and safe to share.

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Write};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use chrono::{DateTime, SecondsFormat, Utc};
use rusqlite::{params, Connection, OptionalExtension};
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};
use shared_protocol::artifact::{ArtifactType, CapabilityArtifact};
use shared_protocol::validate::check_id;

use crate::config::{Durability, OutboxConfig};
use crate::drivers::NewArtifact;

/// Bytes written (and hashed) per `write` call.
const CHUNK: usize = 256 * 1024;

/// Uploaded rows are kept this long for `edge-agent` diagnostics, then pruned.
const UPLOADED_RETENTION_DAYS: i64 = 30;

/// How long the last acknowledged update of each session is kept, so a
/// `session_sync` can have it sent again ([`Outbox::resend_for_sync`]).
/// A sync follows a reconnection within seconds; this leaves ample room.
pub const SENT_UPDATE_RETENTION: Duration = Duration::from_secs(3600);
/// At most this many acknowledged updates are kept (the newest).
pub const SENT_UPDATE_MAX_ROWS: i64 = 10_000;
/// How often acknowledging updates also prunes the kept ones.
const SENT_PRUNE_EVERY: Duration = Duration::from_secs(60);

/// Whether a queued session update ends its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpdateKind {
    /// `running`, or progress: the session goes on.
    Progress,
    /// `completed`, `failed`, `cancelled`: the session's last word, kept
    /// after its acknowledgement for a `session_sync`.
    Final,
}

/// What [`Outbox::resend_for_sync`] found for a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncAnswer {
    /// An update of the session is still queued: it will be sent anyway.
    StillQueued,
    /// Its last acknowledged update was queued again.
    Requeued,
    /// The outbox has no update of this session (none was ever queued, or
    /// it was pruned).
    NoRecord,
}

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

/// Why the outbox refused or failed.
#[derive(Debug, thiserror::Error)]
pub enum OutboxError {
    /// Accepting the artifact would put more than the configured budget of
    /// not-yet-uploaded bytes on disk. Nothing was written; nothing was
    /// dropped to make room.
    #[error("outbox disk budget of {budget_mib} MiB exhausted: {pending_artifacts} pending artifacts await upload")]
    BudgetExhausted {
        budget_mib: u64,
        pending_artifacts: u64,
        /// Bytes pending plus the refused artifact's size.
        needed_bytes: u64,
    },
    #[error("outbox file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("outbox database {path}: {source}")]
    Db {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// The artifact's description is unusable (e.g. an invalid session id).
    #[error("artifact refused: {0}")]
    Invalid(String),
    #[error("no artifact `{0}` in the outbox")]
    UnknownArtifact(String),
    /// The file system of the outbox is full: new evidence cannot be kept
    /// (nothing of it was written). The room reserved for the outbox's own
    /// bookkeeping (see [`RESERVE_BYTES`]) was given up, so that the
    /// failure can still be recorded and reported.
    #[error(
        "the edge's disk is full at {path}: the evidence of this action cannot be kept ({detail})"
    )]
    DiskFull { path: PathBuf, detail: String },
}

/// Room kept on the outbox database's file system for its own bookkeeping,
/// bytes (1 MiB): a file of this size sits next to the database and is
/// deleted the moment a database write finds the disk full, so that the
/// write, and those reporting the failure, still fit. While it is gone no
/// new artifact is taken in; it is made again once there is room.
pub const RESERVE_BYTES: u64 = 1024 * 1024;

/// True for SQLite's "database or disk is full" (`SQLITE_FULL`, what a
/// write on a full file system gives).
fn is_disk_full(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull)
}

/// Bytes an unprivileged writer may still use on the file system of
/// `dir` (`statvfs`), or `None` when it cannot be told.
fn free_bytes(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `c` is a NUL-terminated path and `st` is writable memory of
    // the right type; statvfs fills it on success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so `st` is initialised.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

/// True for a file write on a full file system (`ENOSPC`).
fn io_is_disk_full(e: &std::io::Error) -> bool {
    e.kind() == std::io::ErrorKind::StorageFull
}

/// What [`Outbox::open`] found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Half-written `.part` files deleted (their rows were never committed).
    pub temp_files_removed: usize,
    /// `.part` files whose row was committed but whose rename was lost
    /// (power cut): checked against the row's sha256 and moved into place.
    pub temp_files_promoted: usize,
    /// Complete files without a row, moved to `orphaned/`.
    pub orphans_quarantined: usize,
    /// Pending rows whose file is missing, marked `lost`.
    pub rows_lost: usize,
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

/// A session update waiting to be published (payload: the MQTT envelope).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedUpdate {
    pub seq: i64,
    pub message_id: String,
    pub session_id: String,
    pub payload: Vec<u8>,
}

/// Counts for heartbeats, `STATUS=` and diagnostics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OutboxStats {
    pub pending_artifacts: u64,
    /// Bytes of files on disk awaiting upload (pending and corrupt).
    pub pending_bytes: u64,
    /// Bytes counted against the disk budget: files awaiting upload, files
    /// uploaded whose metadata is not acknowledged yet, ingests in progress.
    /// This, not `pending_bytes`, is what fills the budget.
    pub budget_used_bytes: u64,
    pub corrupt_artifacts: u64,
    pub uploaded_artifacts: u64,
    pub queued_updates: u64,
    pub budget_bytes: u64,
}

/// Handle to the outbox (cheap to clone).
#[derive(Clone)]
pub struct Outbox {
    inner: Arc<Inner>,
}

struct Inner {
    dir: PathBuf,
    db_path: PathBuf,
    durability: Durability,
    provider_id: String,
    conn: Mutex<Connection>,
    budget: Mutex<Budget>,
    follow: Mutex<Follow>,
    /// Notified when acknowledged metadata made artifacts due for upload
    /// again ([`Outbox::due_again`]).
    due_again: Arc<tokio::sync::Notify>,
    /// When acknowledged updates were last pruned (see
    /// [`SENT_UPDATE_RETENTION`]).
    sent_pruned_at: Mutex<Option<std::time::Instant>>,
    /// Sessions a `session_sync` found with their final update still
    /// queued: once the broker acknowledges it, it is queued once more
    /// ([`Outbox::resend_for_sync`]).
    resend_after_ack: Mutex<std::collections::HashSet<String>>,
    /// The file of [`RESERVE_BYTES`] next to the database.
    reserve_path: PathBuf,
    /// Set while the reserve is given up: why evidence cannot be kept.
    disk_problem: Mutex<Option<String>>,
}

/// Most updates kept in memory for the publisher ([`Outbox::followed_updates`]);
/// past this it reads the table again.
const FOLLOW_MAX: usize = 256;

/// Session updates queued since the publisher last read the table to its
/// end, in queue order, so it can take them without reading SQLite.
#[derive(Default)]
struct Follow {
    /// Every update queued since that read is in `rows` (or was taken).
    on: bool,
    rows: std::collections::VecDeque<QueuedUpdate>,
}

/// Bytes on disk not yet confirmed by the registry (bytes and metadata),
/// including reservations of ingests in progress.
struct Budget {
    limit: u64,
    used: u64,
    files: u64,
}

/// Up to `limit` rows of `pending_updates` with `seq > after`, by `seq`.
fn select_updates_after(
    c: &Connection,
    after: i64,
    limit: usize,
) -> rusqlite::Result<Vec<QueuedUpdate>> {
    let mut stmt = c.prepare_cached(
        "SELECT seq, message_id, session_id, payload FROM pending_updates
         WHERE seq > ?1 ORDER BY seq LIMIT ?2",
    )?;
    let rows = stmt.query_map(params![after, limit as i64], |r| {
        Ok(QueuedUpdate {
            seq: r.get(0)?,
            message_id: r.get(1)?,
            session_id: r.get(2)?,
            payload: r.get(3)?,
        })
    })?;
    rows.collect()
}

/// Delete the acknowledged updates older than [`SENT_UPDATE_RETENTION`]
/// at `now_ms`, and all but the newest [`SENT_UPDATE_MAX_ROWS`].
fn prune_sent(c: &Connection, now_ms: i64) -> rusqlite::Result<usize> {
    let cutoff = now_ms - SENT_UPDATE_RETENTION.as_millis() as i64;
    let old = c
        .prepare_cached("DELETE FROM sent_updates WHERE acked_at_ms < ?1")?
        .execute([cutoff])?;
    let surplus = c
        .prepare_cached(
            "DELETE FROM sent_updates WHERE seq <
                (SELECT seq FROM sent_updates ORDER BY seq DESC LIMIT 1 OFFSET ?1 - 1)",
        )?
        .execute([SENT_UPDATE_MAX_ROWS])?;
    Ok(old + surplus)
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Outbox {
    /// Open (creating if needed) the outbox for `provider_id` (used in
    /// `storage_uri`s), repair what a crash left behind and load the budget.
    pub fn open(
        cfg: &OutboxConfig,
        provider_id: &str,
    ) -> Result<(Self, RecoveryReport), OutboxError> {
        let io = |path: &Path| {
            let path = path.to_path_buf();
            move |source| OutboxError::Io { path, source }
        };
        fs::create_dir_all(&cfg.dir).map_err(io(&cfg.dir))?;
        if let Some(parent) = cfg.db.parent() {
            fs::create_dir_all(parent).map_err(io(parent))?;
        }
        let db_err = |source| OutboxError::Db {
            path: cfg.db.clone(),
            source,
        };
        let conn = Connection::open(&cfg.db).map_err(db_err)?;
        conn.busy_timeout(Duration::from_secs(10)).map_err(db_err)?;
        conn.pragma_update(None, "journal_mode", "WAL")
            .map_err(db_err)?;
        let sync = match cfg.durability {
            Durability::Fsync => "FULL",
            Durability::Os => "NORMAL",
        };
        conn.pragma_update(None, "synchronous", sync)
            .map_err(db_err)?;
        conn.execute_batch(SCHEMA).map_err(db_err)?;
        migrate(&conn).map_err(db_err)?;

        let outbox = Outbox {
            inner: Arc::new(Inner {
                dir: cfg.dir.clone(),
                db_path: cfg.db.clone(),
                durability: cfg.durability,
                provider_id: provider_id.to_string(),
                conn: Mutex::new(conn),
                follow: Mutex::new(Follow::default()),
                due_again: Arc::default(),
                sent_pruned_at: Mutex::new(None),
                resend_after_ack: Mutex::default(),
                reserve_path: cfg.db.with_extension("reserve"),
                disk_problem: Mutex::new(None),
                budget: Mutex::new(Budget {
                    limit: cfg.disk_budget_bytes,
                    used: 0,
                    files: 0,
                }),
            }),
        };
        let report = outbox.recover()?;
        outbox.restore_reserve();
        outbox.prune_uploaded()?;
        let (files, used) = outbox.with_conn(|c| {
            c.query_row(
                "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM artifacts
                 WHERE upload_state IN ('pending', 'corrupt')
                    OR (upload_state = 'uploaded' AND (metadata_acked = 0 OR bytes_bound = 0))",
                [],
                |r| Ok((r.get::<_, i64>(0)? as u64, r.get::<_, i64>(1)? as u64)),
            )
        })?;
        {
            let mut b = lock(&outbox.inner.budget);
            b.files = files;
            b.used = used;
        }
        Ok((outbox, report))
    }

    /// Notified when [`Self::remove_updates`] made artifacts due for a
    /// confirming upload (bytes the registry held without their metadata),
    /// so the uploader need not wait for its next timer.
    pub fn due_again(&self) -> Arc<tokio::sync::Notify> {
        self.inner.due_again.clone()
    }

    /// The artifact directory.
    pub fn dir(&self) -> &Path {
        &self.inner.dir
    }

    /// Where a pending artifact's bytes are.
    pub fn file_path(&self, artifact_id: &str) -> PathBuf {
        self.inner.dir.join(artifact_id)
    }

    /// `edge-outbox://{provider_id}/{artifact_id}`: the `storage_uri` of an
    /// artifact that has not reached the registry yet (seed 001 §2.2.5).
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

    fn release(&self, bytes: u64, files: u64) {
        let mut b = lock(&self.inner.budget);
        b.used = b.used.saturating_sub(bytes);
        b.files = b.files.saturating_sub(files);
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

    /// Delete the local file of `artifact_id` (already gone is fine).
    fn remove_file(&self, artifact_id: &str) -> Result<(), OutboxError> {
        let path = self.file_path(artifact_id);
        match fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(source) => Err(OutboxError::Io { path, source }),
        }
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

    /// sha256 of the local file of `artifact_id` as it is on disk now.
    pub fn rehash(&self, artifact_id: &str) -> Result<String, OutboxError> {
        let path = self.file_path(artifact_id);
        hash_file(&path).map_err(|source| OutboxError::Io { path, source })
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

    /// Keep a final session update (an MQTT envelope's bytes) until it has
    /// been published; returns its queue position. For a progress update,
    /// or one that carries artifact metadata, use
    /// [`Self::queue_update_with_artifacts`].
    pub fn queue_update(
        &self,
        message_id: &str,
        session_id: &str,
        payload: &[u8],
    ) -> Result<i64, OutboxError> {
        self.queue_update_with_artifacts(message_id, session_id, payload, &[], UpdateKind::Final)
    }

    /// [`Self::queue_update`] for an update that carries the metadata of
    /// `artifact_ids` (rows of this outbox): their files are kept until the
    /// broker acknowledged this update ([`Self::remove_updates`]) and the
    /// registry confirmed their bytes ([`Self::mark_uploaded`]). Ids without
    /// a row are ignored. Returns the update's queue position.
    pub fn queue_update_with_artifacts(
        &self,
        message_id: &str,
        session_id: &str,
        payload: &[u8],
        artifact_ids: &[&str],
        kind: UpdateKind,
    ) -> Result<i64, OutboxError> {
        self.with_conn_unsynced(|c| {
            self.queue_in(c, message_id, session_id, payload, artifact_ids, kind)
        })
    }

    /// [`Self::queue_update_with_artifacts`] on the locked connection.
    fn queue_in(
        &self,
        c: &Connection,
        message_id: &str,
        session_id: &str,
        payload: &[u8],
        artifact_ids: &[&str],
        kind: UpdateKind,
    ) -> rusqlite::Result<i64> {
        let tx = c.unchecked_transaction()?;
        let inserted = c
            .prepare_cached(
                "INSERT OR IGNORE INTO pending_updates
                    (message_id, session_id, payload, queued_at, final)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
            )?
            .execute(params![
                message_id,
                session_id,
                payload,
                now_text(),
                kind == UpdateKind::Final
            ])?;
        let seq = if inserted == 0 {
            // Queued before (same message id): its position.
            c.prepare_cached("SELECT seq FROM pending_updates WHERE message_id = ?1")?
                .query_row([message_id], |r| r.get(0))?
        } else {
            c.last_insert_rowid()
        };
        if !artifact_ids.is_empty() {
            let mut stmt = c.prepare_cached(
                "UPDATE artifacts SET metadata_seq = ?2
                 WHERE artifact_id = ?1 AND metadata_acked = 0",
            )?;
            for id in artifact_ids {
                stmt.execute(params![id, seq])?;
            }
        }
        tx.commit()?;
        if inserted > 0 {
            // Still under the connection lock: rows reach `follow` in
            // the order of their `seq`.
            let mut follow = lock(&self.inner.follow);
            if follow.on && follow.rows.len() < FOLLOW_MAX {
                follow.rows.push_back(QueuedUpdate {
                    seq,
                    message_id: message_id.to_string(),
                    session_id: session_id.to_string(),
                    payload: payload.to_vec(),
                });
            } else {
                *follow = Follow::default();
            }
        }
        Ok(seq)
    }

    /// Answer a `session_sync` entry for `session_id`. When its final
    /// update is still queued, it goes out anyway; if it is already on its
    /// way to the broker (published, not yet acknowledged), it is queued
    /// once more after its acknowledgement, since it may have gone out
    /// before the registry subscribed. When the final update was
    /// acknowledged (and kept, see [`SENT_UPDATE_RETENTION`]), it is queued
    /// again now, with its own message id. The broker's acknowledgement
    /// does not prove the registry received it.
    pub fn resend_for_sync(&self, session_id: &str) -> Result<SyncAnswer, OutboxError> {
        self.with_conn_unsynced(|c| {
            let queued: bool = c
                .prepare_cached(
                    "SELECT EXISTS (SELECT 1 FROM pending_updates
                                    WHERE session_id = ?1 AND final = 1)",
                )?
                .query_row([session_id], |r| r.get(0))?;
            if queued {
                lock(&self.inner.resend_after_ack).insert(session_id.to_string());
                return Ok(SyncAnswer::StillQueued);
            }
            let sent: Option<(String, Vec<u8>)> = c
                .prepare_cached(
                    "SELECT message_id, payload FROM sent_updates WHERE session_id = ?1",
                )?
                .query_row([session_id], |r| Ok((r.get(0)?, r.get(1)?)))
                .optional()?;
            match sent {
                Some((message_id, payload)) => {
                    self.queue_in(c, &message_id, session_id, &payload, &[], UpdateKind::Final)?;
                    Ok(SyncAnswer::Requeued)
                }
                None => Ok(SyncAnswer::NoRecord),
            }
        })
    }

    /// [`Self::queued_updates_after`] for the one publisher: when it read
    /// the table to its end (fewer than `limit` rows), updates queued from
    /// now on are also kept in memory for [`Self::followed_updates`].
    pub fn follow_updates_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<QueuedUpdate>, OutboxError> {
        self.with_conn(|c| {
            let rows = select_updates_after(c, after, limit)?;
            // Under the connection lock: no update can be queued between
            // the read and this.
            let mut follow = lock(&self.inner.follow);
            *follow = Follow {
                on: rows.len() < limit,
                rows: Default::default(),
            };
            Ok(rows)
        })
    }

    /// Up to `limit` updates with `seq > after` queued since the last
    /// [`Self::follow_updates_after`] that read the table to its end, taken
    /// from memory (never waits for SQLite). `None` when that is not known
    /// (no such read yet, or more were queued than memory keeps): read the
    /// table instead.
    pub fn followed_updates(&self, after: i64, limit: usize) -> Option<Vec<QueuedUpdate>> {
        let mut follow = lock(&self.inner.follow);
        if !follow.on {
            return None;
        }
        while follow.rows.front().is_some_and(|u| u.seq <= after) {
            follow.rows.pop_front();
        }
        let n = limit.min(follow.rows.len());
        Some(follow.rows.drain(..n).collect())
    }

    /// Up to `limit` queued session updates, oldest first.
    pub fn queued_updates(&self, limit: usize) -> Result<Vec<QueuedUpdate>, OutboxError> {
        self.queued_updates_after(0, limit)
    }

    /// Up to `limit` queued session updates with `seq > after`, oldest first.
    pub fn queued_updates_after(
        &self,
        after: i64,
        limit: usize,
    ) -> Result<Vec<QueuedUpdate>, OutboxError> {
        self.with_conn(|c| select_updates_after(c, after, limit))
    }

    /// Replace the payload of queued update `seq` (kept at its place in the
    /// queue), e.g. with a shortened envelope of the same message id. A row
    /// no longer queued is left alone.
    pub fn replace_update_payload(&self, seq: i64, payload: &[u8]) -> Result<(), OutboxError> {
        self.with_conn_unsynced(|c| {
            c.prepare_cached("UPDATE pending_updates SET payload = ?2 WHERE seq = ?1")?
                .execute(params![seq, payload])
                .map(|_| ())
        })?;
        let mut follow = lock(&self.inner.follow);
        for row in follow.rows.iter_mut().filter(|r| r.seq == seq) {
            row.payload = payload.to_vec();
        }
        Ok(())
    }

    /// The broker acknowledged queued update `seq`.
    pub fn remove_update(&self, seq: i64) -> Result<(), OutboxError> {
        self.remove_updates(&[seq])
    }

    /// The broker acknowledged the queued updates `seqs`: delete them in
    /// one transaction (no fsync: a delete lost to a power cut only means
    /// the update is sent again, and receivers de-duplicate by message id),
    /// record that the metadata of the artifacts they carry was
    /// acknowledged, and delete the files of those whose bytes the registry
    /// already confirmed (the others go at [`Self::mark_uploaded`]).
    pub fn remove_updates(&self, seqs: &[i64]) -> Result<(), OutboxError> {
        if seqs.is_empty() {
            return Ok(());
        }
        let resync_waiting = !lock(&self.inner.resend_after_ack).is_empty();
        let (done, confirming): (Vec<(String, i64)>, usize) = self.with_conn_unsynced(|c| {
            if resync_waiting {
                self.queue_again_after_ack(c, seqs)?;
            }
            let tx = c.unchecked_transaction()?;
            let mut done = Vec::new();
            let mut confirming = 0;
            {
                let mut select = tx.prepare_cached(
                    "SELECT artifact_id, size_bytes FROM artifacts
                     WHERE metadata_seq = ?1 AND metadata_acked = 0 AND upload_state = 'uploaded'
                       AND bytes_bound = 1",
                )?;
                // Bytes the registry held unbound: upload again to confirm
                // they are bound (or to replace them if swept).
                let mut confirm = tx.prepare_cached(
                    "UPDATE artifacts SET upload_state = 'pending', next_attempt_at_ms = 0
                     WHERE metadata_seq = ?1 AND metadata_acked = 0 AND upload_state = 'uploaded'
                       AND bytes_bound = 0",
                )?;
                let mut ack = tx.prepare_cached(
                    "UPDATE artifacts SET metadata_acked = 1
                     WHERE metadata_seq = ?1 AND metadata_acked = 0",
                )?;
                // The newest acknowledged update of each session is kept
                // for a `session_sync` (the broker's PUBACK does not prove
                // the registry was subscribed).
                let mut keep = tx.prepare_cached(
                    "INSERT INTO sent_updates (session_id, seq, message_id, payload, acked_at_ms)
                     SELECT session_id, seq, message_id, payload, ?2 FROM pending_updates
                     WHERE seq = ?1 AND final = 1
                     ON CONFLICT (session_id) DO UPDATE SET
                        seq = excluded.seq, message_id = excluded.message_id,
                        payload = excluded.payload, acked_at_ms = excluded.acked_at_ms
                     WHERE excluded.seq > sent_updates.seq",
                )?;
                let now_ms = Utc::now().timestamp_millis();
                let mut delete = tx.prepare_cached("DELETE FROM pending_updates WHERE seq = ?1")?;
                for seq in seqs {
                    keep.execute(params![seq, now_ms])?;
                    let rows = select
                        .query_map([seq], |r| Ok((r.get(0)?, r.get(1)?)))?
                        .collect::<Result<Vec<(String, i64)>, _>>()?;
                    done.extend(rows);
                    confirming += confirm.execute([seq])?;
                    ack.execute([seq])?;
                    delete.execute([seq])?;
                }
            }
            if self.sent_prune_due() {
                prune_sent(&tx, Utc::now().timestamp_millis())?;
            }
            tx.commit()?;
            Ok((done, confirming))
        })?;
        if confirming > 0 {
            self.inner.due_again.notify_one();
        }
        let mut first_error = None;
        for (artifact_id, size) in done {
            match self.remove_file(&artifact_id) {
                Ok(()) => {
                    tracing::info!(
                        %artifact_id,
                        "outbox: artifact metadata acknowledged, local copy removed"
                    );
                }
                // The next start removes it.
                Err(e) => {
                    first_error.get_or_insert(e);
                }
            }
            self.release(size.max(0) as u64, 1);
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Delete queued update `seq` although the broker never acknowledged it
    /// (it can never be sent). The artifacts it carries keep their files:
    /// their metadata did not reach the registry.
    pub fn drop_update(&self, seq: i64) -> Result<(), OutboxError> {
        self.with_conn_unsynced(|c| {
            c.prepare_cached("DELETE FROM pending_updates WHERE seq = ?1")?
                .execute([seq])
                .map(|_| ())
        })
    }

    /// Counts of artifacts and queued updates.
    pub fn stats(&self) -> Result<OutboxStats, OutboxError> {
        let (budget_bytes, budget_used_bytes) = {
            let b = lock(&self.inner.budget);
            (b.limit, b.used)
        };
        self.with_conn(|c| {
            let (pending, pending_bytes, corrupt, uploaded) = c.query_row(
                "SELECT
                    COALESCE(SUM(upload_state = 'pending'), 0),
                    COALESCE(SUM(CASE WHEN upload_state IN ('pending', 'corrupt') THEN size_bytes END), 0),
                    COALESCE(SUM(upload_state = 'corrupt'), 0),
                    COALESCE(SUM(upload_state = 'uploaded'), 0)
                 FROM artifacts",
                [],
                |r| {
                    Ok((
                        r.get::<_, i64>(0)?,
                        r.get::<_, i64>(1)?,
                        r.get::<_, i64>(2)?,
                        r.get::<_, i64>(3)?,
                    ))
                },
            )?;
            let queued: i64 =
                c.query_row("SELECT COUNT(*) FROM pending_updates", [], |r| r.get(0))?;
            Ok(OutboxStats {
                pending_artifacts: pending as u64,
                pending_bytes: pending_bytes as u64,
                budget_used_bytes,
                corrupt_artifacts: corrupt as u64,
                uploaded_artifacts: uploaded as u64,
                queued_updates: queued as u64,
                budget_bytes,
            })
        })
    }

    /// Flush the WAL into the database file (at shutdown).
    pub fn checkpoint(&self) -> Result<(), OutboxError> {
        self.with_conn(|c| c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);"))
    }

    /// True when the database answers (watchdog health check).
    pub fn ping(&self) -> bool {
        self.with_conn(|c| c.query_row("SELECT 1", [], |r| r.get::<_, i64>(0)))
            .is_ok()
    }

    /// Of the final updates being acknowledged (`seqs`), queue again
    /// those a `session_sync` asked for while they were on their way (see
    /// [`Self::resend_for_sync`]), each once.
    fn queue_again_after_ack(&self, c: &Connection, seqs: &[i64]) -> rusqlite::Result<()> {
        let mut again = Vec::new();
        {
            let mut waiting = lock(&self.inner.resend_after_ack);
            let mut stmt = c.prepare_cached(
                "SELECT session_id, message_id, payload FROM pending_updates
                 WHERE seq = ?1 AND final = 1",
            )?;
            for seq in seqs {
                let row: Option<(String, String, Vec<u8>)> = stmt
                    .query_row([seq], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
                    .optional()?;
                if let Some((session_id, message_id, payload)) = row {
                    if waiting.remove(&session_id) {
                        again.push((session_id, message_id, payload));
                    }
                }
            }
        }
        for (session_id, message_id, payload) in again {
            // The acknowledged row goes below, in the same lock: a fresh
            // message id keeps the copy from being taken for it.
            let copy = format!("{message_id}.sync");
            self.queue_in(c, &copy, &session_id, &payload, &[], UpdateKind::Final)?;
        }
        Ok(())
    }

    /// True (and the clock restarted) when acknowledged updates were last
    /// pruned [`SENT_PRUNE_EVERY`] ago or never.
    fn sent_prune_due(&self) -> bool {
        let mut at = lock(&self.inner.sent_pruned_at);
        let due = at.is_none_or(|t| t.elapsed() >= SENT_PRUNE_EVERY);
        if due {
            *at = Some(std::time::Instant::now());
        }
        due
    }

    /// Run `f` on the database. A write that finds the disk full gives up
    /// the bookkeeping reserve and runs once more.
    fn with_conn<T>(
        &self,
        mut f: impl FnMut(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, OutboxError> {
        let conn = lock(&self.inner.conn);
        let result = match f(&conn) {
            Err(e) if is_disk_full(&e) => {
                self.make_room(&conn, &e);
                f(&conn)
            }
            other => other,
        };
        self.keep_wal_small(&conn);
        result.map_err(|source| OutboxError::Db {
            path: self.inner.db_path.clone(),
            source,
        })
    }

    /// A write found the disk full (`e`): give up the reserve and shrink
    /// the write-ahead log to nothing (a checkpoint moves its pages into
    /// the database, whose free pages it reuses), so the write can run
    /// again.
    fn make_room(&self, conn: &Connection, e: &rusqlite::Error) {
        self.release_reserve(&e.to_string());
        if let Err(c) = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(())) {
            tracing::warn!("outbox: checkpoint on a full disk failed: {c}");
        }
    }

    /// While the disk is full, checkpoint after every write: the
    /// write-ahead log would otherwise grow into the little room left and
    /// its checkpoint then find none to move its pages into the database.
    fn keep_wal_small(&self, conn: &Connection) {
        if lock(&self.inner.disk_problem).is_some() {
            let _ = conn.query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()));
        }
    }

    /// Why new evidence cannot be kept now (the disk is full), or `None`.
    pub fn disk_problem(&self) -> Option<String> {
        lock(&self.inner.disk_problem).clone()
    }

    /// Make sure the bookkeeping reserve exists, making it again if it was
    /// given up and there is room (blocking: file I/O). True when it is in
    /// place.
    pub fn restore_reserve(&self) -> bool {
        let path = &self.inner.reserve_path;
        let mut problem = lock(&self.inner.disk_problem);
        if problem.is_none() && fs::metadata(path).is_ok_and(|m| m.len() >= RESERVE_BYTES) {
            return true;
        }
        let temp = path.with_extension("reserve.part");
        let made = (|| -> std::io::Result<()> {
            // Made again only with as much room again for evidence, so a
            // disk still nearly full does not take in, fail and give up
            // the reserve over and over.
            if problem.is_some() {
                if let Some(free) = free_bytes(path.parent().unwrap_or(Path::new("."))) {
                    if free < 2 * RESERVE_BYTES {
                        return Err(std::io::Error::new(
                            std::io::ErrorKind::StorageFull,
                            format!("{free} bytes free, {} needed", 2 * RESERVE_BYTES),
                        ));
                    }
                }
            }
            let mut f = fs::File::create(&temp)?;
            // Real bytes: a sparse file would hold no room.
            let chunk = vec![0u8; 64 * 1024];
            for _ in 0..RESERVE_BYTES / chunk.len() as u64 {
                std::io::Write::write_all(&mut f, &chunk)?;
            }
            f.sync_all()?;
            fs::rename(&temp, path)
        })();
        match made {
            Ok(()) => {
                if problem.take().is_some() {
                    tracing::info!(path = %path.display(), "outbox: room for its bookkeeping reserved again; new evidence is taken in");
                }
                true
            }
            Err(e) => {
                let _ = fs::remove_file(&temp);
                if problem.is_none() {
                    tracing::error!(path = %path.display(), "outbox: cannot reserve room for its bookkeeping: {e}; new evidence is refused");
                    *problem = Some(format!(
                        "the edge's disk is full at {}: evidence cannot be kept ({e})",
                        self.inner.dir.display()
                    ));
                }
                false
            }
        }
    }

    /// The disk is full (`why`): delete the reserve so bookkeeping writes
    /// fit, and refuse new evidence until it is made again. True when
    /// there was a reserve to give up.
    fn release_reserve(&self, why: &str) -> bool {
        let mut problem = lock(&self.inner.disk_problem);
        let released = fs::remove_file(&self.inner.reserve_path).is_ok();
        if problem.is_none() {
            tracing::error!(
                released_reserve = released,
                "outbox: the disk is full ({why}); new evidence is refused until there is room"
            );
            *problem = Some(format!(
                "the edge's disk is full at {}: evidence cannot be kept ({why})",
                self.inner.dir.display()
            ));
        }
        released
    }

    /// Like [`Self::with_conn`], with the commits inside `f` made without
    /// fsync (`synchronous=NORMAL`) whatever the configured durability:
    /// for session-update rows (see the module docs).
    fn with_conn_unsynced<T>(
        &self,
        mut f: impl FnMut(&Connection) -> rusqlite::Result<T>,
    ) -> Result<T, OutboxError> {
        let conn = lock(&self.inner.conn);
        let relax = self.inner.durability == Durability::Fsync;
        let mut run = || -> rusqlite::Result<T> {
            // Prepared once and kept: these run twice per queued update.
            if relax {
                conn.prepare_cached("PRAGMA synchronous = NORMAL")?
                    .execute([])?;
            }
            let out = f(&conn);
            if relax {
                conn.prepare_cached("PRAGMA synchronous = FULL")?
                    .execute([])?;
            }
            out
        };
        let result = match run() {
            Err(e) if is_disk_full(&e) => {
                self.make_room(&conn, &e);
                run()
            }
            other => other,
        };
        self.keep_wal_small(&conn);
        result.map_err(|source| OutboxError::Db {
            path: self.inner.db_path.clone(),
            source,
        })
    }

    /// Bring files and rows back into agreement after a crash.
    fn recover(&self) -> Result<RecoveryReport, OutboxError> {
        let dir = &self.inner.dir;
        let mut report = RecoveryReport::default();
        let entries = fs::read_dir(dir).map_err(|source| OutboxError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut names = Vec::new();
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
                if let Some(name) = entry.file_name().to_str() {
                    names.push(name.to_string());
                }
            }
        }
        for name in names {
            let path = dir.join(&name);
            if let Some(id) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".part")) {
                let row = self.row_state(id)?;
                let fin = dir.join(id);
                let promote = match row {
                    Some((UploadState::Pending, sha)) if !fin.exists() => {
                        hash_file(&path).ok().as_deref() == Some(sha.as_str())
                    }
                    _ => false,
                };
                if promote && fs::rename(&path, &fin).is_ok() {
                    tracing::warn!(
                        artifact_id = id,
                        "outbox: recovered an artifact whose rename was lost"
                    );
                    report.temp_files_promoted += 1;
                } else {
                    let _ = fs::remove_file(&path);
                    report.temp_files_removed += 1;
                }
                continue;
            }
            if !name.starts_with("art-") {
                continue;
            }
            match self.row_state(&name)? {
                Some((UploadState::Uploaded, _)) if self.fully_acknowledged(&name)? => {
                    // Bytes and metadata acknowledged, but the delete did
                    // not happen before a crash.
                    let _ = fs::remove_file(&path);
                }
                Some(_) => {}
                None => {
                    let quarantine = dir.join("orphaned");
                    fs::create_dir_all(&quarantine).map_err(|source| OutboxError::Io {
                        path: quarantine.clone(),
                        source,
                    })?;
                    let _ = fs::rename(&path, quarantine.join(&name));
                    tracing::warn!(
                        file = %path.display(),
                        "outbox: file without a row (crash before commit) moved to orphaned/"
                    );
                    report.orphans_quarantined += 1;
                }
            }
        }
        // Rows whose file is gone.
        let pending: Vec<String> = self.with_conn(|c| {
            let mut stmt = c.prepare(
                "SELECT artifact_id FROM artifacts WHERE upload_state IN ('pending', 'corrupt')",
            )?;
            let ids = stmt
                .query_map([], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            Ok(ids)
        })?;
        for id in pending {
            if !dir.join(&id).exists() {
                tracing::error!(artifact_id = %id, "outbox: the file of a pending artifact is missing; marked lost");
                self.with_conn(|c| {
                    c.execute(
                        "UPDATE artifacts SET upload_state = 'lost', last_error = 'file missing at start'
                         WHERE artifact_id = ?1",
                        [&id],
                    )
                })?;
                report.rows_lost += 1;
            }
        }
        Ok(report)
    }

    fn row_state(&self, artifact_id: &str) -> Result<Option<(UploadState, String)>, OutboxError> {
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
    fn fully_acknowledged(&self, artifact_id: &str) -> Result<bool, OutboxError> {
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

    fn prune_uploaded(&self) -> Result<(), OutboxError> {
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

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS artifacts (
    artifact_id TEXT PRIMARY KEY,
    session_id TEXT NOT NULL,
    artifact_type TEXT NOT NULL,
    content_type TEXT NOT NULL,
    size_bytes INTEGER NOT NULL,
    sha256 TEXT NOT NULL,
    captured_at TEXT NOT NULL,
    duration_ms INTEGER,
    metadata_json TEXT NOT NULL,
    upload_state TEXT NOT NULL DEFAULT 'pending'
        CHECK (upload_state IN ('pending', 'uploaded', 'corrupt', 'lost')),
    attempts INTEGER NOT NULL DEFAULT 0,
    next_attempt_at_ms INTEGER NOT NULL DEFAULT 0,
    last_error TEXT,
    uploaded_at TEXT,
    metadata_seq INTEGER,
    metadata_acked INTEGER NOT NULL DEFAULT 0,
    bytes_bound INTEGER NOT NULL DEFAULT 1
);
CREATE INDEX IF NOT EXISTS artifacts_by_state ON artifacts (upload_state, next_attempt_at_ms);
CREATE TABLE IF NOT EXISTS pending_updates (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    message_id TEXT NOT NULL UNIQUE,
    session_id TEXT NOT NULL,
    payload BLOB NOT NULL,
    queued_at TEXT NOT NULL
);
-- One b-tree, no secondary index: a row is written on every acknowledged
-- final update (the action path), read only for a session_sync, and pruned
-- by a scan once a minute.
CREATE TABLE IF NOT EXISTS sent_updates (
    session_id TEXT PRIMARY KEY,
    seq INTEGER NOT NULL,
    message_id TEXT NOT NULL,
    payload BLOB NOT NULL,
    acked_at_ms INTEGER NOT NULL
) WITHOUT ROWID;
";

/// Add the columns that tie an artifact to the session update carrying its
/// metadata to a database made before they existed. Rows already there
/// keep the former rule (the file goes once the bytes are confirmed): which
/// queued update carries them is not recorded.
fn migrate(c: &Connection) -> rusqlite::Result<()> {
    let has_column = |table: &str, name: &str| -> rusqlite::Result<bool> {
        c.query_row(
            "SELECT COUNT(*) FROM pragma_table_info(?1) WHERE name = ?2",
            [table, name],
            |r| r.get::<_, i64>(0).map(|n| n > 0),
        )
    };
    if !has_column("artifacts", "metadata_acked")? {
        c.execute_batch(
            "BEGIN;
             ALTER TABLE artifacts ADD COLUMN metadata_seq INTEGER;
             ALTER TABLE artifacts ADD COLUMN metadata_acked INTEGER NOT NULL DEFAULT 0;
             UPDATE artifacts SET metadata_acked = 1;
             COMMIT;",
        )?;
    }
    if !has_column("artifacts", "bytes_bound")? {
        c.execute_batch(
            "ALTER TABLE artifacts ADD COLUMN bytes_bound INTEGER NOT NULL DEFAULT 1;",
        )?;
    }
    if !has_column("pending_updates", "final")? {
        // Rows queued before the column existed count as final: at worst a
        // progress update is kept for a `session_sync`.
        c.execute_batch(
            "ALTER TABLE pending_updates ADD COLUMN final INTEGER NOT NULL DEFAULT 1;",
        )?;
    }
    c.execute_batch(
        "CREATE INDEX IF NOT EXISTS artifacts_by_metadata_seq ON artifacts (metadata_seq);",
    )
}

fn now_text() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
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

#[cfg(test)]
mod pragma_tests {
    /// `with_conn_unsynced` switches `synchronous` with cached prepared
    /// statements; SQLite runs some pragmas when a statement is prepared
    /// rather than stepped, so check that each run of the cached statement
    /// takes effect again (artifact rows must be back at FULL after every
    /// session update).
    #[test]
    fn cached_synchronous_pragmas_take_effect_on_every_run() {
        let c = rusqlite::Connection::open_in_memory().unwrap();
        let level = |c: &rusqlite::Connection| -> i64 {
            c.query_row("PRAGMA synchronous", [], |r| r.get(0)).unwrap()
        };
        for _ in 0..3 {
            c.prepare_cached("PRAGMA synchronous = NORMAL")
                .unwrap()
                .execute([])
                .unwrap();
            assert_eq!(level(&c), 1, "NORMAL");
            c.prepare_cached("PRAGMA synchronous = FULL")
                .unwrap()
                .execute([])
                .unwrap();
            assert_eq!(level(&c), 2, "FULL");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(c: &Connection) -> Vec<String> {
        let mut stmt = c
            .prepare("SELECT session_id FROM sent_updates ORDER BY seq")
            .unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    }

    #[test]
    fn acknowledged_updates_are_pruned_by_age_and_by_count() {
        let c = Connection::open_in_memory().unwrap();
        c.execute_batch(SCHEMA).unwrap();
        let now = 10_000_000_000_i64;
        let hour = SENT_UPDATE_RETENTION.as_millis() as i64;
        let mut insert = c
            .prepare(
                "INSERT INTO sent_updates (session_id, seq, message_id, payload, acked_at_ms)
                 VALUES (?1, ?2, ?1, x'00', ?3)",
            )
            .unwrap();
        insert.execute(params!["old", 1, now - hour - 1]).unwrap();
        insert.execute(params!["edge", 2, now - hour]).unwrap();
        insert.execute(params!["new", 3, now]).unwrap();
        assert_eq!(prune_sent(&c, now).unwrap(), 1);
        assert_eq!(kept(&c), vec!["edge", "new"]);

        // Past the row cap, the oldest go ("edge" and "new").
        for seq in 4..(SENT_UPDATE_MAX_ROWS + 4) {
            insert
                .execute(params![format!("s-{seq}"), seq, now])
                .unwrap();
        }
        assert_eq!(prune_sent(&c, now).unwrap(), 2);
        let left = kept(&c);
        assert_eq!(left.len() as i64, SENT_UPDATE_MAX_ROWS);
        assert_eq!(left.first().unwrap(), "s-4");
        assert_eq!(
            left.last().unwrap(),
            &format!("s-{}", SENT_UPDATE_MAX_ROWS + 3)
        );
        // Nothing more to prune.
        assert_eq!(prune_sent(&c, now).unwrap(), 0);
    }
}
