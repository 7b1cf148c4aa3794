//! The handle every job of the outbox works through: [`Outbox`] and the
//! state behind it (one SQLite connection, the disk budget, the updates
//! followed in memory), the outbox's error type and its lock helper.
//! It imports no other part of the outbox.

use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

use rusqlite::Connection;

use crate::config::Durability;

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
    /// bookkeeping (see [`super::RESERVE_BYTES`]) was given up, so that the
    /// failure can still be recorded and reported.
    #[error(
        "the edge's disk is full at {path}: the evidence of this action cannot be kept ({detail})"
    )]
    DiskFull { path: PathBuf, detail: String },
}

/// Handle to the outbox (cheap to clone).
#[derive(Clone)]
pub struct Outbox {
    pub(super) inner: Arc<Inner>,
}

pub(super) struct Inner {
    pub(super) dir: PathBuf,
    pub(super) db_path: PathBuf,
    pub(super) durability: Durability,
    pub(super) provider_id: String,
    pub(super) conn: Mutex<Connection>,
    pub(super) budget: Mutex<Budget>,
    pub(super) follow: Mutex<Follow>,
    /// Notified when acknowledged metadata made artifacts due for upload
    /// again ([`Outbox::due_again`]).
    pub(super) due_again: Arc<tokio::sync::Notify>,
    /// When acknowledged updates were last pruned (see
    /// [`super::SENT_UPDATE_RETENTION`]).
    pub(super) sent_pruned_at: Mutex<Option<std::time::Instant>>,
    /// Sessions a `session_sync` found with their final update still
    /// queued: once the broker acknowledges it, it is queued once more
    /// ([`Outbox::resend_for_sync`]).
    pub(super) resend_after_ack: Mutex<std::collections::HashSet<String>>,
    /// The file of [`super::RESERVE_BYTES`] next to the database.
    pub(super) reserve_path: PathBuf,
    /// Set while the reserve is given up: why evidence cannot be kept.
    pub(super) disk_problem: Mutex<Option<String>>,
}

/// Bytes on disk not yet confirmed by the registry (bytes and metadata),
/// including reservations of ingests in progress.
pub(super) struct Budget {
    pub(super) limit: u64,
    pub(super) used: u64,
    pub(super) files: u64,
}

/// Most updates kept in memory for the publisher ([`Outbox::followed_updates`]);
/// past this it reads the table again.
pub(super) const FOLLOW_MAX: usize = 256;

/// Session updates queued since the publisher last read the table to its
/// end, in queue order, so it can take them without reading SQLite.
#[derive(Default)]
pub(super) struct Follow {
    /// Every update queued since that read is in `rows` (or was taken).
    pub(super) on: bool,
    pub(super) rows: std::collections::VecDeque<QueuedUpdate>,
}

/// A session update waiting to be published (payload: the MQTT envelope).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueuedUpdate {
    pub seq: i64,
    pub message_id: String,
    pub session_id: String,
    pub payload: Vec<u8>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock leaves plain data behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}
