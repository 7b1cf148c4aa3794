//! The registry's disk: telling a full store apart from other failures.
//!
//! - [`is_full`] recognises "no space left" in an error, whichever layer it
//!   came through (SQLite's `SQLITE_FULL`, the blob store's or a staging
//!   file's `ENOSPC`);
//! - [`note_full`] marks the store not writable (shown on `/healthz` and
//!   `/metrics`) and logs it, at most once per [`WARN_EVERY`];
//! - [`start_probe`] checks every [`PROBE_EVERY`] while the store is not
//!   writable whether space is back (a probe file written and synced in
//!   the store's directory), then marks it writable again (the sessions
//!   module then asks the providers whose updates could not be stored to
//!   send them again).
//!
//! One store per process: the state is process-wide.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};
use std::time::{Duration, Instant};

/// Least time between two warnings of one kind (disk full, WAL); the ones
/// in between are counted and the count is given with the next warning.
pub const WARN_EVERY: Duration = Duration::from_secs(10);

/// How often, while the store is not writable, space is looked for again.
pub const PROBE_EVERY: Duration = Duration::from_secs(1);

/// Bytes the probe writes (and syncs) to call the store writable again:
/// enough for a few SQLite transactions and a small artifact.
pub const PROBE_BYTES: usize = 256 * 1024;

/// SQLite's text for `SQLITE_FULL`, and the OS's for `ENOSPC`: errors reach
/// the HTTP layer from several stores, some already turned into text.
const FULL_TEXTS: [&str; 3] = [
    "database or disk is full",
    "No space left on device",
    "os error 28",
];

/// How the message of a store error begins when the store's server could
/// not be reached (PostgreSQL down, the connection cut): answered 503
/// `store_unavailable` ([`crate::error::ApiError::internal`]).
pub const UNREACHABLE: &str = "store unreachable: ";

/// True when `err` says the store's server could not be reached.
pub fn is_unreachable(err: &(impl std::fmt::Display + ?Sized)) -> bool {
    err.to_string().contains(UNREACHABLE)
}

/// True when `err` says the disk is full.
pub fn is_full(err: &(impl std::fmt::Display + ?Sized)) -> bool {
    let text = err.to_string();
    FULL_TEXTS.iter().any(|t| text.contains(t))
}

/// True when `e` is SQLite's `SQLITE_FULL`.
pub fn is_sqlite_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull) || is_full(e)
}

/// One warning in [`WARN_EVERY`] at most.
#[derive(Debug)]
pub struct WarnLimiter {
    every: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl WarnLimiter {
    /// A limiter letting one warning through per `every`.
    pub const fn new(every: Duration) -> Self {
        Self {
            every,
            last: None,
            suppressed: 0,
        }
    }

    /// `Some(n)` when a warning may be logged now (`n` were held back since
    /// the last one); `None` (counted) otherwise.
    pub fn allow(&mut self) -> Option<u64> {
        let now = Instant::now();
        match self.last {
            Some(t) if now.duration_since(t) < self.every => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

/// What `/healthz` shows of the disk.
#[derive(Debug, Clone, serde::Serialize)]
pub struct StorageSnapshot {
    /// False from a write that failed for lack of space until the probe
    /// finds space again.
    pub writable: bool,
    /// The store's directory (database, WAL, artifacts).
    pub path: String,
    /// Writes refused for lack of space since the registry started.
    pub full_errors_total: u64,
    /// Since when the store is not writable, ms (absent while writable).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub full_for_ms: Option<u64>,
    /// The last "no space" error, while not writable.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

struct State {
    full: AtomicBool,
    full_errors: AtomicU64,
    inner: Mutex<Inner>,
}

struct Inner {
    dir: PathBuf,
    full_since: Option<Instant>,
    last_error: Option<String>,
    warn: WarnLimiter,
}

static STATE: LazyLock<State> = LazyLock::new(|| State {
    full: AtomicBool::new(false),
    full_errors: AtomicU64::new(0),
    inner: Mutex::new(Inner {
        dir: PathBuf::from("."),
        full_since: None,
        last_error: None,
        warn: WarnLimiter::new(WARN_EVERY),
    }),
});

fn inner() -> std::sync::MutexGuard<'static, Inner> {
    STATE.inner.lock().unwrap_or_else(|p| p.into_inner())
}

/// Name the store's directory (shown in errors, probed for space).
pub fn set_store_dir(dir: &Path) {
    inner().dir = dir.to_path_buf();
}

/// The store's directory.
pub fn store_dir() -> PathBuf {
    inner().dir.clone()
}

/// A write failed for lack of space (`what` names it, e.g. "artifact
/// upload"): mark the store not writable and warn (rate-limited).
pub fn note_full(what: &str, error: &(impl std::fmt::Display + ?Sized)) {
    STATE.full_errors.fetch_add(1, Ordering::Relaxed);
    let was_full = STATE.full.swap(true, Ordering::AcqRel);
    let mut st = inner();
    if !was_full {
        st.full_since = Some(Instant::now());
    }
    st.last_error = Some(error.to_string());
    if let Some(suppressed) = st.warn.allow() {
        tracing::error!(
            store = %st.dir.display(),
            what,
            error = %error,
            suppressed,
            "the registry's store is full: writes are refused (507 storage_full) until space is freed"
        );
    }
}

/// True while the store is not writable.
pub fn is_store_full() -> bool {
    STATE.full.load(Ordering::Acquire)
}

/// The disk's state for `/healthz`.
pub fn snapshot() -> StorageSnapshot {
    let st = inner();
    let writable = !is_store_full();
    StorageSnapshot {
        writable,
        path: st.dir.display().to_string(),
        full_errors_total: STATE.full_errors.load(Ordering::Relaxed),
        full_for_ms: st
            .full_since
            .filter(|_| !writable)
            .map(|t| t.elapsed().as_millis() as u64),
        last_error: st.last_error.clone().filter(|_| !writable),
    }
}

/// Write and sync [`PROBE_BYTES`] in `dir`, then remove the file.
fn probe(dir: &Path) -> std::io::Result<()> {
    use std::io::Write;
    let path = dir.join(".storage-probe");
    let result = (|| {
        let mut f = std::fs::File::create(&path)?;
        f.write_all(&vec![0u8; PROBE_BYTES])?;
        f.sync_all()
    })();
    let _ = std::fs::remove_file(&path);
    result
}

/// Start the thread that, while the store is not writable, probes for
/// space every [`PROBE_EVERY`] (a thread: the probe's file I/O must not
/// block a tokio worker). Runs for the process's life.
pub fn start_probe() {
    static STARTED: AtomicBool = AtomicBool::new(false);
    if STARTED.swap(true, Ordering::AcqRel) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("storage-probe".into())
        .spawn(|| loop {
            std::thread::sleep(PROBE_EVERY);
            if !is_store_full() {
                continue;
            }
            let dir = store_dir();
            if probe(&dir).is_ok() {
                let mut st = inner();
                let for_ms = st.full_since.map_or(0, |t| t.elapsed().as_millis());
                st.full_since = None;
                st.last_error = None;
                STATE.full.store(false, Ordering::Release);
                drop(st);
                tracing::warn!(
                    store = %dir.display(),
                    full_for_ms = for_ms as u64,
                    "the registry's store is writable again"
                );
            }
        });
    if let Err(e) = spawned {
        tracing::error!(error = %e, "cannot start the storage probe thread");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_disks_are_recognised_through_every_layer() {
        let sqlite = rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_FULL),
            None,
        );
        assert!(is_sqlite_full(&sqlite));
        assert!(is_full(&format!("store: {sqlite}")));
        let io = std::io::Error::from_raw_os_error(28);
        assert!(is_full(&format!("blob store: write /x: {io}")));
        assert!(!is_full(
            "sqlite: UNIQUE constraint failed: leases.lease_id"
        ));
    }

    #[test]
    fn a_limiter_lets_one_warning_through_and_counts_the_rest() {
        let mut w = WarnLimiter::new(Duration::from_millis(200));
        assert_eq!(w.allow(), Some(0));
        assert_eq!(w.allow(), None);
        assert_eq!(w.allow(), None);
        std::thread::sleep(Duration::from_millis(250));
        assert_eq!(w.allow(), Some(2));
    }
}
