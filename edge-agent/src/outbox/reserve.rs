//! The bookkeeping reserve: a file of [`RESERVE_BYTES`] next to the outbox
//! database, given up when the disk is full so that bookkeeping writes and
//! the failure report still fit; while it is gone no new evidence is taken
//! in (docs/architecture.md, "Edge internals").

use std::fs;
use std::path::Path;

use super::handle::{lock, Outbox};

/// Room kept on the outbox database's file system for its own bookkeeping,
/// bytes (1 MiB): a file of this size sits next to the database and is
/// deleted the moment a database write finds the disk full, so that the
/// write, and those reporting the failure, still fit. While it is gone no
/// new artifact is taken in; it is made again once there is room.
pub const RESERVE_BYTES: u64 = 1024 * 1024;

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

impl Outbox {
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
    pub(super) fn release_reserve(&self, why: &str) -> bool {
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
}
