//! The one SQLite connection of the outbox: its schema and migrations, and
//! the two ways to run a closure on it. Artifact rows follow the configured
//! `durability` (`fsync`: `synchronous=FULL` commits); session-update rows
//! are always committed with `synchronous=NORMAL` ([`Outbox::with_conn_unsynced`]):
//! they survive the daemon being killed, and what a power loss takes is
//! reconciled by the registry (docs/architecture.md, "Control plane (MQTT)").
//! This keeps two fsyncs off every action's round trip.
//!
//! A write that finds the disk full gives up the reserve (`reserve.rs`),
//! checkpoints the write-ahead log and runs once more.

use rusqlite::Connection;

use chrono::{SecondsFormat, Utc};

use super::handle::{lock, Outbox, OutboxError};
use crate::config::Durability;

/// True for SQLite's "database or disk is full" (`SQLITE_FULL`, what a
/// write on a full file system gives).
pub(super) fn is_disk_full(e: &rusqlite::Error) -> bool {
    matches!(e, rusqlite::Error::SqliteFailure(f, _) if f.code == rusqlite::ErrorCode::DiskFull)
}

impl Outbox {
    /// Run `f` on the database. A write that finds the disk full gives up
    /// the bookkeeping reserve and runs once more.
    pub(super) fn with_conn<T>(
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

    /// Like [`Self::with_conn`], with the commits inside `f` made without
    /// fsync (`synchronous=NORMAL`) whatever the configured durability:
    /// for session-update rows (see the module docs).
    pub(super) fn with_conn_unsynced<T>(
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
}

pub(super) const SCHEMA: &str = "
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
pub(super) fn migrate(c: &Connection) -> rusqlite::Result<()> {
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

pub(super) fn now_text() -> String {
    Utc::now().to_rfc3339_opts(SecondsFormat::Millis, true)
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
