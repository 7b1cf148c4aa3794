//! What a test needs from the machine, and the one rule for when it is
//! missing: under `CI=true` the test fails (a test must not pass by
//! skipping there); elsewhere it prints `SKIPPED: <reason>` and returns
//! early. `./scripts/test.sh` sets up the services (README.md).

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

/// Where the tests expect the shared Mosquitto.
pub const MOSQUITTO: &str = "127.0.0.1:1883";

/// True when the environment says `CI=true`.
pub fn in_ci() -> bool {
    std::env::var("CI").as_deref() == Ok("true")
}

/// The missing-service rule: panics with `why` under `CI=true`, otherwise
/// prints `SKIPPED: why` on stderr. Call it, then return from the test.
pub fn skip_unless_ci(why: &str) {
    assert!(!in_ci(), "{why} and CI=true");
    eprintln!("SKIPPED: {why}");
}

/// True when something accepts TCP connections at `addr` within 500 ms.
pub fn reachable(addr: &str) -> bool {
    addr.parse()
        .ok()
        .and_then(|a| TcpStream::connect_timeout(&a, Duration::from_millis(500)).ok())
        .is_some()
}

/// True when Mosquitto answers at [`MOSQUITTO`]; otherwise the
/// missing-service rule ([`skip_unless_ci`]) and false.
pub fn mosquitto() -> bool {
    if reachable(MOSQUITTO) {
        return true;
    }
    skip_unless_ci(&format!(
        "Mosquitto is not reachable at {MOSQUITTO} (start it: mosquitto -d)"
    ));
    false
}

/// True when `tool` is on `PATH`; otherwise the missing-service rule and
/// false.
pub fn tool_installed(tool: &str) -> bool {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !found {
        skip_unless_ci(&format!("{tool} is not installed"));
    }
    found
}

/// A tmpfs of a fixed size mounted for one test (a disk that fills up);
/// unmounted (lazily) on drop, and its directory removed if it was made
/// by [`Tmpfs::mount_temp`].
pub struct Tmpfs {
    path: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl Tmpfs {
    /// Mount a `size` tmpfs (e.g. `"3m"`) on `dir` (made if missing).
    /// Needs root: where the mount fails, the missing-service rule and
    /// `None`.
    pub fn mount(dir: &Path, size: &str) -> Option<Tmpfs> {
        std::fs::create_dir_all(dir).expect("tmpfs mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output();
        match out {
            Ok(o) if o.status.success() => Some(Tmpfs {
                path: dir.to_path_buf(),
                _dir: None,
            }),
            other => {
                let why = match other {
                    Ok(o) => String::from_utf8_lossy(&o.stderr).into_owned(),
                    Err(e) => e.to_string(),
                };
                skip_unless_ci(&format!("cannot mount a tmpfs (needs root): {why}"));
                None
            }
        }
    }

    /// [`Tmpfs::mount`] on a new temporary directory named `prefix…`.
    pub fn mount_temp(prefix: &str, size: &str) -> Option<Tmpfs> {
        let dir = tempfile::Builder::new()
            .prefix(prefix)
            .tempdir()
            .expect("temporary directory");
        let mut fs = Self::mount(dir.path(), size)?;
        fs._dir = Some(dir);
        Some(fs)
    }

    /// The mount point.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.path).status();
    }
}
