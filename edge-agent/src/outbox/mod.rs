//! The evidence outbox: every artifact a driver produces is a file on disk
//! plus a row in SQLite (WAL) before anything else happens to it, and every
//! session update waits here until the broker acknowledged it. The file is
//! deleted only once the registry has both halves of the artifact, its
//! bytes and its metadata (docs/architecture.md, "Artifact bytes (HTTP)"
//! and "Edge internals").
//!
//! One handle ([`Outbox`], `handle.rs`) over one SQLite connection; one
//! file per job:
//! - `db.rs`: the connection, its schema and migrations, `with_conn` (and
//!   the unsynced variant for session-update rows);
//! - `reserve.rs`: the bookkeeping reserve that keeps a full disk from
//!   silencing the bench;
//! - `files.rs`: artifact files (ingest, hashing, the disk budget);
//! - `uploads.rs`: the upload state machine (`pending` → `uploaded`,
//!   `corrupt`, `lost`) the uploader drives;
//! - `updates.rs`: the session-update queue the publisher drains;
//! - `acks.rs`: what the broker's acknowledgement of updates releases;
//! - `sync.rs`: acknowledged final updates kept for a `session_sync`;
//! - `recovery.rs`: bringing files and rows back into agreement at start.
//!
//! Every method blocks on file and SQLite I/O: call it from a runner
//! thread, a dedicated thread or `tokio::task::spawn_blocking`, never from
//! an async task directly. [`Outbox`] is cheap to clone and safe to share.

mod acks;
mod db;
mod files;
mod handle;
mod recovery;
mod reserve;
mod sync;
mod updates;
mod uploads;

use std::fs;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rusqlite::Connection;

use crate::config::{Durability, OutboxConfig};

pub use files::hash_file;
pub use handle::{Outbox, OutboxError, QueuedUpdate};
pub use recovery::RecoveryReport;
pub use reserve::RESERVE_BYTES;
pub use sync::{SyncAnswer, SENT_UPDATE_MAX_ROWS, SENT_UPDATE_RETENTION};
pub use updates::UpdateKind;
pub use uploads::{ArtifactRecord, PendingUpload, UploadState};

use db::{migrate, SCHEMA};
use handle::{lock, Budget, Follow, Inner};

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
    /// `captured_at` of the oldest artifact awaiting upload (`None`: none
    /// waits): the upload lag.
    pub oldest_pending_captured_at: Option<chrono::DateTime<chrono::Utc>>,
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
            let oldest: Option<String> = c.query_row(
                "SELECT MIN(captured_at) FROM artifacts WHERE upload_state = 'pending'",
                [],
                |r| r.get(0),
            )?;
            let oldest_pending_captured_at = oldest
                .and_then(|t| chrono::DateTime::parse_from_rfc3339(&t).ok())
                .map(|t| t.with_timezone(&chrono::Utc));
            Ok(OutboxStats {
                pending_artifacts: pending as u64,
                pending_bytes: pending_bytes as u64,
                budget_used_bytes,
                corrupt_artifacts: corrupt as u64,
                uploaded_artifacts: uploaded as u64,
                queued_updates: queued as u64,
                budget_bytes,
                oldest_pending_captured_at,
            })
        })
    }

    /// Flush the WAL into the database file (at shutdown).
    pub fn checkpoint(&self) -> Result<(), OutboxError> {
        self.with_conn(|c| c.execute_batch("PRAGMA wal_checkpoint(TRUNCATE);"))
    }

    /// True when the database takes writes (watchdog health check): the
    /// write lock is taken and given back (`BEGIN IMMEDIATE; ROLLBACK`,
    /// nothing written), so a database another process keeps locked, or
    /// a connection stuck in a write, answers false or not at all.
    pub fn ping(&self) -> bool {
        self.with_conn(|c| c.execute_batch("BEGIN IMMEDIATE; ROLLBACK"))
            .is_ok()
    }
}
