//! The pseudo-terminal a simulator speaks on, and the stable symlink that names it.
//!
//! A pty pair is a real serial port as far as a driver can tell: the *slave*
//! end (`/dev/pts/N`) opens with `serialport::new(path, baud).open()`, takes
//! termios settings (baud rates are accepted and ignored) and carries bytes.
//! The simulator owns the *master* end.
//!
//! Only the master is kept open here; the slave is closed right after the pair
//! is created. That lets the simulator see, as a real USB-serial adapter
//! would, whether a program has the port open: while no slave descriptor is
//! open, `poll(2)` on the master reports `POLLHUP`. Bytes the device sends
//! while nobody has the port open are dropped, as on real hardware.
//!
//! What a driver holding the slave open observes when the master closes
//! (the device "vanishes", see [`super::Simulator::vanish`]), verified on
//! Linux by `tests/devsim_vanish.rs`:
//! - `poll` on the slave reports `POLLIN | POLLHUP | POLLERR`;
//! - a raw `read(2)` returns 0 bytes (end of file) and keeps doing so;
//! - a raw `write(2)` fails with `EIO`;
//! - through the `serialport` crate both `read` and `write` fail at once
//!   with `io::ErrorKind::BrokenPipe` (its poll wrapper maps `POLLHUP`);
//! - the old `/dev/pts/N` is gone; the device comes back as a *new*
//!   `/dev/pts/M`, so drivers must reopen through the stable symlink.

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serialport::{SerialPort, TTYPort};

use super::DevSimError;

/// The master end of a fresh pty pair, plus the path of its slave end.
#[derive(Debug)]
pub struct PtyMaster {
    file: File,
    slave_path: PathBuf,
}

/// What one [`PtyMaster::read_timeout`] call saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MasterRead {
    /// This many bytes were read into the buffer.
    Bytes(usize),
    /// The timeout passed with no data; a program has the slave open.
    Idle,
    /// No program has the slave open (`POLLHUP`, or `EIO` on read).
    HostClosed,
}

impl PtyMaster {
    /// Opens a new pty pair and closes its slave end.
    ///
    /// Errors: [`DevSimError::Pty`] when the kernel has no free pty or the
    /// slave name cannot be read.
    pub fn open() -> Result<PtyMaster, DevSimError> {
        let (master, slave) = TTYPort::pair().map_err(|source| DevSimError::Pty { source })?;
        let slave_path = slave
            .name()
            .map(PathBuf::from)
            .ok_or_else(|| DevSimError::Pty {
                source: serialport::Error::new(
                    serialport::ErrorKind::Unknown,
                    "pty slave has no name",
                ),
            })?;
        drop(slave);
        // SAFETY: `into_raw_fd` hands over sole ownership of the master
        // descriptor, which `File` then closes exactly once on drop.
        let file = unsafe { File::from_raw_fd(master.into_raw_fd()) };
        Ok(PtyMaster { file, slave_path })
    }

    /// The slave path a driver opens, e.g. `/dev/pts/7`.
    pub fn slave_path(&self) -> &Path {
        &self.slave_path
    }

    /// Waits up to `timeout` (millisecond resolution) for bytes from the
    /// host and reads what is there.
    ///
    /// Returns [`MasterRead::HostClosed`] immediately when no program has the
    /// slave open. Errors: any other `poll`/`read` failure.
    pub fn read_timeout(&mut self, buf: &mut [u8], timeout: Duration) -> io::Result<MasterRead> {
        let revents = poll_one(&self.file, libc::POLLIN, timeout)?;
        if revents & libc::POLLIN != 0 {
            // Data the host wrote before closing is still readable; EIO
            // only comes once it is drained.
            return match self.file.read(buf) {
                Ok(0) => Ok(MasterRead::HostClosed),
                Ok(n) => Ok(MasterRead::Bytes(n)),
                Err(e) if e.raw_os_error() == Some(libc::EIO) => Ok(MasterRead::HostClosed),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => Ok(MasterRead::Idle),
                Err(e) => Err(e),
            };
        }
        if revents & (libc::POLLHUP | libc::POLLERR) != 0 {
            return Ok(MasterRead::HostClosed);
        }
        Ok(MasterRead::Idle)
    }

    /// Writes `bytes` towards the host, giving up after `timeout` when the
    /// host does not read (the pty buffer is full).
    ///
    /// Returns how many bytes were written; the rest are lost, as on a UART
    /// nobody reads. Errors: `poll`/`write` failures other than `EAGAIN`.
    pub fn write_timeout(&mut self, mut bytes: &[u8], timeout: Duration) -> io::Result<usize> {
        let deadline = Instant::now() + timeout;
        let mut written = 0;
        while !bytes.is_empty() {
            let left = deadline.saturating_duration_since(Instant::now());
            let revents = poll_one(&self.file, libc::POLLOUT, left)?;
            if revents & libc::POLLOUT == 0 {
                break;
            }
            match self.file.write(bytes) {
                Ok(0) => break,
                Ok(n) => {
                    written += n;
                    bytes = &bytes[n..];
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
            if Instant::now() >= deadline {
                break;
            }
        }
        Ok(written)
    }
}

/// `poll(2)` on one descriptor; returns `revents` (0 on timeout).
fn poll_one(file: &File, events: libc::c_short, timeout: Duration) -> io::Result<libc::c_short> {
    let mut pfd = libc::pollfd {
        fd: file.as_raw_fd(),
        events,
        revents: 0,
    };
    let ms = libc::c_int::try_from(timeout.as_millis()).unwrap_or(libc::c_int::MAX);
    // SAFETY: `pfd` is a valid, exclusively borrowed pollfd array of length 1
    // for the duration of the call.
    let n = unsafe { libc::poll(&mut pfd, 1, ms) };
    if n < 0 {
        let err = io::Error::last_os_error();
        if err.kind() == io::ErrorKind::Interrupted {
            return Ok(0);
        }
        return Err(err);
    }
    Ok(if n == 0 { 0 } else { pfd.revents })
}

/// A symlink at a fixed path (like a `/dev/serial/by-id/usb-…-if00` name)
/// pointing at the current pty slave, removed on drop.
#[derive(Debug)]
pub struct StableLink {
    path: PathBuf,
    target: PathBuf,
}

impl StableLink {
    /// Creates (or replaces a stale) symlink `path -> target`, creating the
    /// parent directory if needed.
    ///
    /// Errors: [`DevSimError::LinkOccupied`] when `path` exists and is not a
    /// symlink (a real file is never clobbered); [`DevSimError::Link`] for
    /// filesystem errors, naming the path.
    pub fn create(path: &Path, target: &Path) -> Result<StableLink, DevSimError> {
        let link_err = |source| DevSimError::Link {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(link_err)?;
        }
        match std::fs::symlink_metadata(path) {
            Ok(meta) if meta.file_type().is_symlink() => {
                std::fs::remove_file(path).map_err(link_err)?;
            }
            Ok(_) => {
                return Err(DevSimError::LinkOccupied {
                    path: path.to_path_buf(),
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(link_err(e)),
        }
        std::os::unix::fs::symlink(target, path).map_err(link_err)?;
        Ok(StableLink {
            path: path.to_path_buf(),
            target: target.to_path_buf(),
        })
    }

    /// The symlink's own path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for StableLink {
    fn drop(&mut self) {
        // Only remove the link if it still points at our pty: another
        // simulator may have taken the name over since.
        if std::fs::read_link(&self.path).is_ok_and(|t| t == self.target) {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
