//! SQLite access without blocking the async runtime.
//!
//! One dedicated OS thread owns the read-write connection and runs jobs in
//! the order they arrive; callers `await` their job's result. A second
//! thread owns a read-only connection so long reads (event replay, listings)
//! never wait behind writes (WAL mode lets them run side by side).
//!
//! Durability: WAL with `synchronous=NORMAL`. A committed transaction
//! survives the registry process being killed (SIGKILL); the last
//! transactions before a power loss may be rolled back, never corrupted.
//!
//! Checkpoints: the writer never checkpoints (`wal_autocheckpoint = 0`), so
//! a commit never waits behind copying WAL pages into the database file and
//! the fsyncs that go with it. A third thread with its own connection runs a
//! `PASSIVE` checkpoint every [`CHECKPOINT_EVERY`] (readers and the writer
//! carry on meanwhile) and a last one when the [`Db`] is dropped. The WAL
//! file is truncated back to [`WAL_SIZE_LIMIT`] bytes when it restarts.

use std::path::{Path, PathBuf};
use std::sync::{mpsc, Arc};
use std::thread;
use std::time::Duration;

use rusqlite::{Connection, OpenFlags};
use tokio::sync::oneshot;

type Job = Box<dyn FnOnce(&mut Connection) + Send + 'static>;

/// Errors from the database layer.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the database thread has stopped")]
    Closed,
    #[error("cannot open database {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
}

/// How often the checkpoint thread copies committed WAL pages into the
/// database file.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Size, in bytes, the WAL file is truncated back to when it restarts.
pub const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// Handle to the database threads. Cheap to clone.
#[derive(Clone)]
pub struct Db {
    writer: mpsc::Sender<Job>,
    reader: mpsc::Sender<Job>,
    path: PathBuf,
    /// Dropped with the last handle: the checkpoint thread then runs a
    /// final checkpoint and stops.
    _checkpointer: Arc<mpsc::Sender<()>>,
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.pragma_update(None, "journal_size_limit", WAL_SIZE_LIMIT)?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(())
}

/// Start the thread that checkpoints the WAL every [`CHECKPOINT_EVERY`]
/// until the returned sender (and its clones) are dropped.
fn spawn_checkpointer(conn: Connection) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let spawned = thread::Builder::new()
        .name("db-checkpoint".to_string())
        .spawn(move || {
            let checkpoint = |mode: &str| {
                let sql = format!("PRAGMA wal_checkpoint({mode})");
                if let Err(e) = conn.query_row(&sql, [], |_| Ok(())) {
                    tracing::warn!(error = %e, "WAL checkpoint failed");
                }
            };
            loop {
                match rx.recv_timeout(CHECKPOINT_EVERY) {
                    Err(mpsc::RecvTimeoutError::Timeout) | Ok(()) => checkpoint("PASSIVE"),
                    Err(mpsc::RecvTimeoutError::Disconnected) => break,
                }
            }
            checkpoint("TRUNCATE");
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the WAL checkpoint thread");
    }
    tx
}

fn spawn_worker(name: &str, mut conn: Connection) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel::<Job>();
    let spawned = thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            while let Ok(job) = rx.recv() {
                job(&mut conn);
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start database thread");
    }
    tx
}

impl Db {
    /// Open (creating if needed) the SQLite file at `path` and run
    /// `migrate` on the write connection before anything else.
    ///
    /// Errors: the file cannot be opened or a migration fails.
    pub fn open(
        path: &Path,
        migrate: impl FnOnce(&mut Connection) -> rusqlite::Result<()>,
    ) -> Result<Self, DbError> {
        if let Some(dir) = path.parent() {
            if !dir.as_os_str().is_empty() {
                let _ = std::fs::create_dir_all(dir);
            }
        }
        let open_err = |source| DbError::Open {
            path: path.to_path_buf(),
            source,
        };
        let mut writer = Connection::open(path).map_err(open_err)?;
        configure(&writer).map_err(open_err)?;
        migrate(&mut writer)?;
        writer
            .pragma_update(None, "wal_autocheckpoint", 0)
            .map_err(open_err)?;
        let checkpointer = Connection::open(path).map_err(open_err)?;
        checkpointer
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open_err)?;
        let reader = Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(open_err)?;
        reader
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open_err)?;
        Ok(Self {
            writer: spawn_worker("db-writer", writer),
            reader: spawn_worker("db-reader", reader),
            path: path.to_path_buf(),
            _checkpointer: Arc::new(spawn_checkpointer(checkpointer)),
        })
    }

    /// The database file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    async fn run<R: Send + 'static>(
        queue: &mpsc::Sender<Job>,
        f: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, DbError> {
        let (tx, rx) = oneshot::channel();
        queue
            .send(Box::new(move |conn| {
                let _ = tx.send(f(conn));
            }))
            .map_err(|_| DbError::Closed)?;
        rx.await.map_err(|_| DbError::Closed)
    }

    /// Run `f` on the write connection (in arrival order) and return its
    /// result. `f` should open its own transaction when it writes more than
    /// one row.
    pub async fn write<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, DbError> {
        Self::run(&self.writer, f).await
    }

    /// Run `f` on the read-only connection.
    pub async fn read<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, DbError> {
        Self::run(&self.reader, f).await
    }

    /// Run `f` on the write connection from a non-async context (a
    /// dedicated thread), blocking until it is done. Never call this from a
    /// tokio worker.
    pub fn write_blocking<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, DbError> {
        let (tx, rx) = mpsc::channel();
        self.writer
            .send(Box::new(move |conn| {
                let _ = tx.send(f(conn));
            }))
            .map_err(|_| DbError::Closed)?;
        rx.recv().map_err(|_| DbError::Closed)
    }
}
