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
//! carry on meanwhile) and a last one when the [`Db`] is dropped. When the
//! WAL file has grown past [`WAL_SIZE_LIMIT`] the writer itself runs a
//! `PASSIVE` checkpoint between two jobs: no write can slip in meanwhile,
//! so it copies every frame and the next write starts the WAL over instead
//! of letting it grow without bound under steady writes.
//!
//! A reader that holds one read transaction for long (an operator's
//! `sqlite3` shell, a copy of the file) keeps every checkpoint from
//! passing its snapshot, so the WAL grows while it reads. [`WalStats`]
//! counts checkpoints and the WAL's size (on `/metrics`), and a warning is
//! logged, at most once per [`crate::storage::WARN_EVERY`], while
//! checkpoints stay behind for [`CHECKPOINT_STALL_WARN`] or the WAL is
//! larger than [`WAL_WARN_BYTES`]. `cloud-registry backup` copies the
//! store with SQLite's online backup in short steps instead ([`backup`]).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use rusqlite::OpenFlags;
use tokio::sync::oneshot;

pub use crate::sql::Connection;
use crate::sql::{pg::PgConn, Backend, TransactionBehavior};

type Job = Box<dyn FnOnce(&mut Connection) + Send + 'static>;

/// What a grouped write hands back after running: told whether the
/// transaction it ran in committed, it answers its caller.
type Finish = Box<dyn FnOnce(Result<(), DbError>) + Send + 'static>;

/// A write run by [`Db::write_grouped`].
type GroupedJob = Box<dyn FnOnce(&mut Connection) -> Finish + Send + 'static>;

/// Errors from the database layer.
#[derive(Debug, thiserror::Error)]
pub enum DbError {
    /// A statement failed (on PostgreSQL too: see [`crate::sql`]).
    #[error("store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("the database thread has stopped")]
    Closed,
    #[error("cannot open database {path}: {source}")]
    Open {
        path: PathBuf,
        source: rusqlite::Error,
    },
    /// The shared transaction of a grouped write could not commit; the
    /// write was rolled back with it.
    #[error("sqlite commit: {0}")]
    Commit(String),
}

/// How often the checkpoint thread copies committed WAL pages into the
/// database file.
pub const CHECKPOINT_EVERY: Duration = Duration::from_millis(100);

/// Size, in bytes, past which the writer rewinds the WAL, and to which
/// SQLite truncates the file when it starts over.
pub const WAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;

/// How long checkpoints may stay behind (frames left that a reader's old
/// snapshot keeps them from copying) before a warning is logged.
pub const CHECKPOINT_STALL_WARN: Duration = Duration::from_secs(5);

/// Frames a checkpoint may leave behind and still count as keeping up (a
/// short read of the registry's own reader; about 1 MiB).
pub const CHECKPOINT_LAG_OK_FRAMES: i64 = 256;

/// WAL size, in bytes, past which a warning is logged whatever the cause.
pub const WAL_WARN_BYTES: u64 = 2 * WAL_SIZE_LIMIT as u64;

/// Checkpoints and WAL size since the database was opened (`/metrics`).
#[derive(Debug, Default)]
pub struct WalStats {
    /// Size of the WAL file at the last checkpoint, bytes.
    pub wal_bytes: AtomicU64,
    /// Checkpoints that copied every frame of the WAL.
    pub checkpoints_complete: AtomicU64,
    /// Checkpoints that left frames behind (a reader's snapshot, or busy).
    pub checkpoints_incomplete: AtomicU64,
    /// Checkpoints that failed (e.g. the disk is full).
    pub checkpoints_failed: AtomicU64,
    /// Frames the last checkpoint left behind.
    pub lag_frames: AtomicU64,
    /// How long checkpoints have stayed behind, ms (0 when keeping up).
    pub stalled_ms: AtomicU64,
}

/// Prepared statements kept per connection (rusqlite's default is 16; the
/// registry runs more distinct hot statements than that).
const STATEMENT_CACHE: usize = 128;

/// The WAL file of the database at `db`.
fn wal_path(db: &Path) -> PathBuf {
    let mut name = db.as_os_str().to_os_string();
    name.push("-wal");
    PathBuf::from(name)
}

/// Handle to the database threads. Cheap to clone.
#[derive(Clone)]
pub struct Db {
    writer: mpsc::Sender<Job>,
    reader: mpsc::Sender<Job>,
    /// Grouped writes waiting for the writer thread (see
    /// [`Db::write_grouped`]).
    grouped: Arc<Mutex<Vec<GroupedJob>>>,
    path: PathBuf,
    backend: Backend,
    wal_stats: Arc<WalStats>,
    /// Dropped with the last handle: the checkpoint thread then runs a
    /// final checkpoint and stops (SQLite only).
    _checkpointer: Option<Arc<mpsc::Sender<()>>>,
}

fn configure(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    // First: every statement after it, `journal_mode` included, waits for
    // a lock another process holds instead of failing at once.
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "NORMAL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

/// Start the thread that runs a `PASSIVE` checkpoint every
/// [`CHECKPOINT_EVERY`] until the returned sender (and its clones) are
/// dropped, then a `TRUNCATE` one. It keeps `stats` and warns when
/// checkpoints cannot keep up (see the module docs).
fn spawn_checkpointer(
    conn: rusqlite::Connection,
    wal: PathBuf,
    stats: Arc<WalStats>,
) -> mpsc::Sender<()> {
    let (tx, rx) = mpsc::channel::<()>();
    let spawned = thread::Builder::new()
        .name("db-checkpoint".to_string())
        .spawn(move || {
            let mut watch = CheckpointWatch::new(wal, stats);
            while let Ok(()) | Err(mpsc::RecvTimeoutError::Timeout) =
                rx.recv_timeout(CHECKPOINT_EVERY)
            {
                let done = checkpoint(&conn, "PASSIVE");
                watch.note(done);
            }
            let _ = checkpoint(&conn, "TRUNCATE");
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the WAL checkpoint thread");
    }
    tx
}

/// The checkpoint thread's view of whether checkpoints keep up.
struct CheckpointWatch {
    wal: PathBuf,
    stats: Arc<WalStats>,
    /// Since when every checkpoint left more than
    /// [`CHECKPOINT_LAG_OK_FRAMES`] behind.
    behind_since: Option<Instant>,
    behind_warn: crate::storage::WarnLimiter,
    failed_warn: crate::storage::WarnLimiter,
}

impl CheckpointWatch {
    fn new(wal: PathBuf, stats: Arc<WalStats>) -> Self {
        Self {
            wal,
            stats,
            behind_since: None,
            behind_warn: crate::storage::WarnLimiter::new(crate::storage::WARN_EVERY),
            failed_warn: crate::storage::WarnLimiter::new(crate::storage::WARN_EVERY),
        }
    }

    fn note(&mut self, done: Result<(i64, i64, i64), rusqlite::Error>) {
        let wal_bytes = std::fs::metadata(&self.wal).map_or(0, |m| m.len());
        let s = &self.stats;
        s.wal_bytes.store(wal_bytes, Ordering::Relaxed);
        let (busy, log, copied) = match done {
            Ok(v) => v,
            Err(e) => {
                s.checkpoints_failed.fetch_add(1, Ordering::Relaxed);
                if crate::storage::is_sqlite_full(&e) {
                    crate::storage::note_full("WAL checkpoint", &e);
                } else if let Some(suppressed) = self.failed_warn.allow() {
                    tracing::warn!(error = %e, suppressed, "WAL checkpoint failed");
                }
                return;
            }
        };
        let lag = (log - copied).max(0);
        s.lag_frames.store(lag as u64, Ordering::Relaxed);
        if busy == 0 && lag == 0 {
            s.checkpoints_complete.fetch_add(1, Ordering::Relaxed);
        } else {
            s.checkpoints_incomplete.fetch_add(1, Ordering::Relaxed);
        }
        let now = Instant::now();
        if busy == 0 && lag <= CHECKPOINT_LAG_OK_FRAMES {
            if let Some(t) = self.behind_since.take() {
                tracing::info!(
                    behind_ms = now.duration_since(t).as_millis() as u64,
                    wal_bytes,
                    "WAL checkpoints keep up again"
                );
            }
            s.stalled_ms.store(0, Ordering::Relaxed);
        } else {
            let since = *self.behind_since.get_or_insert(now);
            s.stalled_ms.store(
                now.duration_since(since).as_millis() as u64,
                Ordering::Relaxed,
            );
        }
        let stalled = self
            .behind_since
            .map(|t| now.duration_since(t))
            .filter(|d| *d >= CHECKPOINT_STALL_WARN);
        if stalled.is_some() || wal_bytes > WAL_WARN_BYTES {
            if let Some(suppressed) = self.behind_warn.allow() {
                tracing::warn!(
                    wal_bytes,
                    frames_behind = lag,
                    behind_ms = stalled.map_or(0, |d| d.as_millis() as u64),
                    suppressed,
                    "WAL checkpoints cannot keep up: a long read transaction on the store (an open sqlite3 shell, a file copy) holds an old snapshot; the WAL grows and writes slow down until it ends (use `cloud-registry backup` to copy the store)"
                );
            }
        }
    }
}

/// Run `PRAGMA wal_checkpoint(mode)`: (busy, frames in the WAL, frames
/// checkpointed).
fn checkpoint(conn: &rusqlite::Connection, mode: &str) -> Result<(i64, i64, i64), rusqlite::Error> {
    let sql = format!("PRAGMA wal_checkpoint({mode})");
    conn.query_row(&sql, [], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))
}

/// Start a thread that runs jobs on `conn` in arrival order. Given the WAL
/// file's path (the writer), it also rewinds the WAL between jobs once the
/// file has grown past [`WAL_SIZE_LIMIT`].
///
/// Why: the checkpoint thread's `PASSIVE` checkpoints never wait, but under
/// steady writes they never let the WAL start over either: SQLite rewinds
/// the WAL only when a write begins after a checkpoint that copied every
/// frame, and there is always a newer frame. The same `PASSIVE` checkpoint
/// run by the writer between jobs has no writer to race, so it copies
/// everything (little is left: the checkpoint thread did the rest) and the
/// next write starts the WAL from its beginning; SQLite then truncates the
/// file back to the limit (`journal_size_limit`), so the file's size is the
/// signal (one `stat` per job). A `RESTART` checkpoint would do the same but
/// sleeps in the busy handler until readers let go: millisecond stalls.
fn spawn_worker(
    name: &str,
    mut conn: Connection,
    wal: Option<(PathBuf, u64)>,
) -> mpsc::Sender<Job> {
    let (tx, rx) = mpsc::channel::<Job>();
    let spawned = thread::Builder::new()
        .name(name.to_string())
        .spawn(move || {
            // While a reader's snapshot keeps the checkpoint from copying
            // everything, trying after every job only costs (the WAL
            // cannot start over anyway): try again after
            // [`CHECKPOINT_EVERY`].
            let mut next_try = Instant::now();
            while let Ok(job) = rx.recv() {
                job(&mut conn);
                if let Some((wal, limit)) = &wal {
                    let grown = std::fs::metadata(wal).is_ok_and(|m| m.len() > *limit);
                    if grown && Instant::now() >= next_try {
                        // Frames left with no lock in the way (busy = 0):
                        // a reader's snapshot. Busy (the checkpoint
                        // thread was running) is worth trying again at
                        // the next job.
                        let reader_in_way = conn.as_sqlite().is_some_and(|c| {
                            matches!(
                                checkpoint(c, "PASSIVE"),
                                Ok((0, log, copied)) if log != copied
                            )
                        });
                        if reader_in_way {
                            next_try = Instant::now() + CHECKPOINT_EVERY;
                        }
                    }
                }
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
        Self::open_with_wal_limit(path, migrate, WAL_SIZE_LIMIT)
    }

    /// [`Db::open`] with the WAL rewound past `wal_limit` bytes instead of
    /// [`WAL_SIZE_LIMIT`].
    fn open_with_wal_limit(
        path: &Path,
        migrate: impl FnOnce(&mut Connection) -> rusqlite::Result<()>,
        wal_limit: i64,
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
        let writer = rusqlite::Connection::open(path).map_err(open_err)?;
        configure(&writer).map_err(open_err)?;
        // Every transaction of the writer takes the write lock when it
        // begins, waiting (busy timeout) behind another process's writer,
        // e.g. `cloud-registry token create`. A deferred one that read first
        // would fail at its first write, without waiting, if that process
        // had committed since the read (SQLITE_BUSY_SNAPSHOT).
        writer
            .pragma_update(None, "journal_size_limit", wal_limit)
            .map_err(open_err)?;
        let mut writer = Connection::sqlite(writer, TransactionBehavior::Immediate);
        migrate(&mut writer)?;
        if let Some(w) = writer.as_sqlite() {
            w.pragma_update(None, "wal_autocheckpoint", 0)
                .map_err(open_err)?;
        }
        let checkpointer = rusqlite::Connection::open(path).map_err(open_err)?;
        checkpointer
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open_err)?;
        let reader = rusqlite::Connection::open_with_flags(
            path,
            OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(open_err)?;
        reader
            .busy_timeout(std::time::Duration::from_secs(5))
            .map_err(open_err)?;
        reader.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let reader = Connection::sqlite(reader, TransactionBehavior::Deferred);
        let wal_stats = Arc::new(WalStats::default());
        Ok(Self {
            writer: spawn_worker(
                "db-writer",
                writer,
                Some((wal_path(path), wal_limit.max(0) as u64)),
            ),
            reader: spawn_worker("db-reader", reader, None),
            grouped: Arc::default(),
            path: path.to_path_buf(),
            backend: Backend::Sqlite,
            wal_stats: wal_stats.clone(),
            _checkpointer: Some(Arc::new(spawn_checkpointer(
                checkpointer,
                wal_path(path),
                wal_stats,
            ))),
        })
    }

    /// Connect to PostgreSQL at `url` (`postgres://user@host:5432/db`) on
    /// `schema` (created when missing), run `migrate` on the write
    /// connection, then open the read connection.
    ///
    /// Errors: the server cannot be reached or refuses the login, or a
    /// migration fails ([`DbError::Open`], `path` then being the URL
    /// without its password).
    pub fn open_postgres(
        url: &str,
        schema: &str,
        migrate: impl FnOnce(&mut Connection) -> rusqlite::Result<()>,
    ) -> Result<Self, DbError> {
        let writer = PgConn::connect(url, schema).map_err(|source| DbError::Open {
            path: PathBuf::from(redact_url(url)),
            source,
        })?;
        Self::open_postgres_on(writer, url, schema, migrate)
    }

    /// [`Db::open_postgres`] with `writer` as the writing session (one
    /// that holds the store's advisory lock, [`PgConn::try_fence`]).
    ///
    /// Errors: as [`Db::open_postgres`].
    pub fn open_postgres_on(
        writer: PgConn,
        url: &str,
        schema: &str,
        migrate: impl FnOnce(&mut Connection) -> rusqlite::Result<()>,
    ) -> Result<Self, DbError> {
        let shown = PathBuf::from(redact_url(url));
        let open_err = |source| DbError::Open {
            path: shown.clone(),
            source,
        };
        let mut writer = Connection::postgres(writer);
        migrate(&mut writer)?;
        let reader = Connection::postgres(PgConn::connect(url, schema).map_err(open_err)?);
        Ok(Self {
            writer: spawn_worker("db-writer", writer, None),
            reader: spawn_worker("db-reader", reader, None),
            grouped: Arc::default(),
            path: shown,
            backend: Backend::Postgres,
            wal_stats: Arc::default(),
            _checkpointer: None,
        })
    }

    /// The engine this store runs on.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The database file (on PostgreSQL: the URL without its password).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Checkpoints and WAL size since the database was opened.
    pub fn wal_stats(&self) -> &WalStats {
        &self.wal_stats
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

    /// Run `f` on the write connection inside a transaction it may share
    /// with other grouped writes queued meanwhile (group commit), and
    /// return its result once that transaction has committed.
    ///
    /// Under concurrent writers this turns one commit (WAL frames, locks,
    /// a `pwrite` per page) per write into one per batch. `f` must keep its
    /// changes inside a savepoint (`conn.savepoint()`, which also works
    /// alone, outside any transaction) and must not open a transaction:
    /// an `Err` it returns after rolling back its savepoint leaves the
    /// other writes of the batch untouched.
    ///
    /// Errors: [`DbError::Closed`] when the writer thread has stopped;
    /// [`DbError::Commit`] when the shared transaction could not commit
    /// (then nothing of `f` is stored).
    pub async fn write_grouped<R: Send + 'static>(
        &self,
        f: impl FnOnce(&mut Connection) -> R + Send + 'static,
    ) -> Result<R, DbError> {
        let (tx, rx) = oneshot::channel();
        let job: GroupedJob = Box::new(move |conn| {
            let out = f(conn);
            Box::new(move |committed: Result<(), DbError>| {
                let _ = tx.send(committed.map(|()| out));
            })
        });
        let first = {
            let mut queue = lock(&self.grouped);
            queue.push(job);
            queue.len() == 1
        };
        if first {
            // The first write of a batch sends the job that runs it; the
            // ones queued before that job starts join the same batch.
            let queue = self.grouped.clone();
            self.writer
                .send(Box::new(move |conn| run_grouped(conn, &queue)))
                .map_err(|_| DbError::Closed)?;
        }
        rx.await.map_err(|_| DbError::Closed)?
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

/// What [`backup`] did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct BackupReport {
    /// The copy.
    pub path: PathBuf,
    /// Pages copied (of the source's page size).
    pub pages: u64,
    /// Size of the copy, bytes.
    pub bytes: u64,
    /// Times the copy started over because the source was written to.
    pub restarts: u32,
    /// Wall time taken, ms.
    pub elapsed_ms: u64,
}

/// Steps after which a [`backup`] that keeps starting over (the registry
/// writes between every two steps) copies the rest in one step.
const BACKUP_MAX_RESTARTS: u32 = 5;

/// Copy the database at `from` (in use by a running registry or not) to
/// `to` with SQLite's online backup, `pages_per_step` pages per step and a
/// `pause` between steps. Each step holds a read transaction only while it
/// copies its pages, so checkpoints run between steps and the WAL does not
/// grow as under one long read (an open `sqlite3` shell, `cp`). A write to
/// the source between two steps starts the copy over; after
/// [`BACKUP_MAX_RESTARTS`] the rest is copied in one step. The copy is
/// written next to `to` and renamed over it once complete and checked
/// (`PRAGMA quick_check`), so `to` never holds half a copy. Blocking: run
/// it on its own thread, never on a tokio worker.
///
/// Errors: `from` cannot be opened, the copy fails (disk full...), or the
/// copy does not pass `quick_check`.
pub fn backup(
    from: &Path,
    to: &Path,
    pages_per_step: i32,
    pause: Duration,
) -> Result<BackupReport, DbError> {
    use rusqlite::backup::{Backup, StepResult};
    let started = Instant::now();
    let open_err = |path: &Path| {
        let path = path.to_path_buf();
        move |source| DbError::Open { path, source }
    };
    let src = rusqlite::Connection::open_with_flags(from, OpenFlags::SQLITE_OPEN_READ_ONLY)
        .map_err(open_err(from))?;
    src.busy_timeout(Duration::from_secs(5))?;
    let mut partial = to.as_os_str().to_os_string();
    partial.push(".partial");
    let partial = PathBuf::from(partial);
    let _ = std::fs::remove_file(&partial);
    let mut dst = rusqlite::Connection::open(&partial).map_err(open_err(&partial))?;
    let mut restarts = 0u32;
    let pages = {
        let b = Backup::new(&src, &mut dst)?;
        let mut last_remaining = i32::MAX;
        loop {
            let step = if restarts >= BACKUP_MAX_RESTARTS {
                -1
            } else {
                pages_per_step
            };
            // More, Busy and Locked all mean: step again after the pause.
            if b.step(step)? == StepResult::Done {
                break;
            }
            let p = b.progress();
            if p.remaining > last_remaining {
                restarts += 1;
            }
            last_remaining = p.remaining;
            std::thread::sleep(pause);
        }
        b.progress().pagecount.max(0) as u64
    };
    let check: String = dst.query_row("PRAGMA quick_check", [], |r| r.get(0))?;
    drop(dst);
    if check != "ok" {
        let _ = std::fs::remove_file(&partial);
        return Err(DbError::Commit(format!(
            "the copy failed its check: {check}"
        )));
    }
    std::fs::rename(&partial, to).map_err(|e| DbError::Commit(format!("rename: {e}")))?;
    Ok(BackupReport {
        path: to.to_path_buf(),
        pages,
        bytes: std::fs::metadata(to).map_or(0, |m| m.len()),
        restarts,
        elapsed_ms: started.elapsed().as_millis() as u64,
    })
}

/// `url` with its password, if any, replaced by `***` (for logs and errors).
pub fn redact_url(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_owned(),
            }
        }
        _ => url.to_owned(),
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Run every grouped write queued now in one transaction, then answer
/// each with the commit's outcome (on the writer thread).
fn run_grouped(conn: &mut Connection, queue: &Mutex<Vec<GroupedJob>>) {
    let jobs = std::mem::take(&mut *lock(queue));
    if jobs.is_empty() {
        return;
    }
    // Should BEGIN fail, each write's savepoint commits on its own: the
    // answers below are then still true. The writer's transactions begin
    // IMMEDIATE on SQLite (see `Db::open`).
    let mut finishers = Vec::with_capacity(jobs.len());
    let began = conn.begin().is_ok();
    for job in jobs {
        finishers.push(job(conn));
    }
    let committed = if began {
        conn.commit().map_err(|e| DbError::Commit(e.to_string()))
    } else {
        Ok(())
    };
    for finish in finishers {
        finish(match &committed {
            Ok(()) => Ok(()),
            Err(e) => Err(DbError::Commit(e.to_string())),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Under writes that never pause, the WAL still starts over: its file
    /// stays bounded instead of growing with everything ever written.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_wal_stays_bounded_under_steady_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("t.db");
        let limit = 8 * 1024 * 1024;
        let db = Db::open_with_wal_limit(
            &path,
            |c| c.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, body BLOB NOT NULL)"),
            limit,
        )
        .unwrap();
        let wal = dir.path().join("t.db-wal");
        let mut largest = 0u64;
        // 30,000 commits of at least one 4 KiB page each: ~120 MiB of WAL
        // frames if the WAL never started over (bound: 24 MiB).
        for round in 0..300 {
            db.write(move |c| {
                for i in 0..100 {
                    c.execute(
                        "INSERT OR REPLACE INTO t (id, body) VALUES (?1, zeroblob(1024))",
                        [(round * 100 + i) % 5000],
                    )
                    .unwrap();
                }
            })
            .await
            .unwrap();
            largest = largest.max(std::fs::metadata(&wal).map(|m| m.len()).unwrap_or(0));
        }
        let bound = 3 * limit as u64;
        assert!(
            largest < bound,
            "WAL grew to {largest} bytes (bound {bound}) under steady writes"
        );
        let rows: i64 = db
            .read(|c| c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rows, 5000, "every committed row is readable");
    }

    /// Another process committing (a CLI command beside the registry)
    /// never makes the registry's read-then-write transactions, grouped or
    /// not, fail with `database is locked`: they wait for the lock instead.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn writes_that_read_first_wait_for_another_processs_commits() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("w.db");
        let db = Db::open(&path, |c| {
            c.execute_batch(
                "CREATE TABLE t (id INTEGER PRIMARY KEY, v INTEGER NOT NULL);
                 CREATE TABLE other (n INTEGER NOT NULL);
                 INSERT INTO t (id, v) VALUES (1, 0);",
            )
        })
        .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let other = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let c = rusqlite::Connection::open(&path).unwrap();
                c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
                let mut n = 0i64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    c.execute("INSERT INTO other (n) VALUES (?1)", [n]).unwrap();
                    n += 1;
                    std::thread::sleep(std::time::Duration::from_micros(200));
                }
                n
            })
        };
        // Read, give the other process time to commit, then write.
        let read_then_write = |c: &Connection| -> rusqlite::Result<()> {
            let v: i64 = c.query_row("SELECT v FROM t WHERE id = 1", [], |r| r.get(0))?;
            std::thread::sleep(std::time::Duration::from_micros(500));
            c.execute("UPDATE t SET v = ?1 WHERE id = 1", [v + 1])?;
            Ok(())
        };
        let mut failures = Vec::new();
        for _ in 0..30 {
            let grouped = db
                .write_grouped(move |c| -> rusqlite::Result<()> {
                    let sp = c.savepoint()?;
                    read_then_write(&sp)?;
                    sp.commit()
                })
                .await
                .unwrap();
            let plain = db
                .write(move |c| -> rusqlite::Result<()> {
                    let tx = c.transaction()?;
                    read_then_write(&tx)?;
                    tx.commit()
                })
                .await
                .unwrap();
            failures.extend(grouped.err().map(|e| format!("grouped: {e}")));
            failures.extend(plain.err().map(|e| format!("plain: {e}")));
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(other.join().unwrap() > 0, "the other process committed");
        assert!(failures.is_empty(), "{failures:?}");
        let v: i64 = db
            .read(|c| c.query_row("SELECT v FROM t WHERE id = 1", [], |r| r.get(0)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(v, 60, "every increment kept");
    }

    /// Grouped writes that arrive together share commits, each is readable
    /// by the time its caller is answered, and one that fails (rolling back
    /// its savepoint) takes nothing of the others with it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn grouped_writes_commit_together_and_fail_alone() {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("g.db"), |c| {
            c.execute_batch("CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT NOT NULL)")
        })
        .unwrap();
        let mut tasks = Vec::new();
        for i in 0..200i64 {
            let db = db.clone();
            tasks.push(tokio::spawn(async move {
                let written = db
                    .write_grouped(move |c| -> rusqlite::Result<()> {
                        let sp = c.savepoint()?;
                        sp.execute("INSERT INTO t (id, v) VALUES (?1, 'first')", [i])?;
                        if i % 10 == 0 {
                            // Half done, then refused: the first row must
                            // not survive either.
                            sp.execute("INSERT INTO t (id, v) VALUES (?1, 'dup')", [i])?;
                        }
                        sp.commit()
                    })
                    .await
                    .unwrap();
                // Answered: a fresh read sees exactly what was answered.
                let seen: i64 = db
                    .read(move |c| {
                        c.query_row("SELECT COUNT(*) FROM t WHERE id = ?1", [i], |r| r.get(0))
                    })
                    .await
                    .unwrap()
                    .unwrap();
                (i, written.is_ok(), seen)
            }));
        }
        for t in tasks {
            let (i, ok, seen) = t.await.unwrap();
            assert_eq!(ok, i % 10 != 0, "write {i}");
            assert_eq!(seen, i64::from(ok), "rows of write {i} after its answer");
        }
        let rows: i64 = db
            .read(|c| c.query_row("SELECT COUNT(*) FROM t", [], |r| r.get(0)))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rows, 180);
        // A plain write after the batches: the connection is back in
        // autocommit mode.
        db.write(|c| c.execute("INSERT INTO t (id, v) VALUES (1000, 'plain')", []))
            .await
            .unwrap()
            .unwrap();
        assert!(db.write(|c| c.is_autocommit()).await.unwrap());
    }
}
