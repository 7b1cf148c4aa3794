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

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::thread;

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

/// Handle to the database threads. Cheap to clone.
#[derive(Clone)]
pub struct Db {
    writer: mpsc::Sender<Job>,
    reader: mpsc::Sender<Job>,
    path: PathBuf,
}

fn configure(conn: &Connection) -> rusqlite::Result<()> {
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    Ok(())
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
