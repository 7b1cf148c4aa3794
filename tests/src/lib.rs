//! Harness for the end-to-end tests and the demo: start the real
//! `cloud-registry`, `edge-agent` and `bench-sim` binaries as child
//! processes, wait for their ready lines, and make sure none outlives the
//! test (children are killed on drop, also when a test panics).

pub mod asr;
pub mod bench;
pub mod browser;
pub mod client;
pub mod pg;
pub mod pki;
pub mod scenario;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use serde_json::Value;

/// Path of a workspace binary built next to the running executable
/// (`target/<profile>/<name>`). `./scripts/test.sh` and `./scripts/demo.sh`
/// build every binary before running.
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let mut dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.ends_with("deps") {
        dir.pop();
    }
    let path = dir.join(name);
    assert!(
        path.exists(),
        "{} is missing: build the workspace binaries first (cargo build --workspace --bins)",
        path.display()
    );
    path
}

pub use benchlink_testkit::{free_port, reachable, sha256_hex};

/// Mosquitto at 127.0.0.1:1883 for tests of the external-broker path:
/// the kit's rule ([`benchlink_testkit::mosquitto`]), a missing broker
/// fails under `CI=true` and is skipped with a printed reason elsewhere
/// (returns false).
pub fn require_mosquitto() -> bool {
    benchlink_testkit::mosquitto()
}

/// A child process that is killed (SIGKILL) and reaped on drop.
pub struct Proc {
    pub name: String,
    child: Option<Child>,
    /// Lines the process printed on stdout after its ready line.
    pub stdout_rx: Option<mpsc::Receiver<String>>,
}

impl Proc {
    /// Start `cmd` with stdout piped and stderr inherited (or to a file),
    /// and wait up to `timeout` for a stdout line that is a JSON object with
    /// `"event": "ready"`; returns the process and that object.
    pub fn start_ready(name: &str, cmd: Command, timeout: Duration) -> Result<(Self, Value)> {
        Self::start_until(name, cmd, timeout, |v| {
            v.get("event").and_then(Value::as_str) == Some("ready")
        })
    }

    /// Like [`Proc::start_ready`], with another test for the first line
    /// that counts as ready (a JSON value for which `is_ready` is true),
    /// e.g. `bench-sim --json`'s `{"devices": [...]}`.
    pub fn start_until(
        name: &str,
        mut cmd: Command,
        timeout: Duration,
        is_ready: impl Fn(&Value) -> bool,
    ) -> Result<(Self, Value)> {
        cmd.stdout(Stdio::piped()).stdin(Stdio::null());
        let mut child = cmd.spawn().with_context(|| format!("spawn {name}"))?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                match line {
                    Ok(l) => {
                        if tx.send(l).is_err() {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        });
        let mut proc = Proc {
            name: name.to_string(),
            child: Some(child),
            stdout_rx: None,
        };
        let deadline = Instant::now() + timeout;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                bail!("{name} printed no ready line within {timeout:?}");
            }
            match rx.recv_timeout(left) {
                Ok(line) => {
                    if let Ok(v) = serde_json::from_str::<Value>(&line) {
                        if is_ready(&v) {
                            proc.stdout_rx = Some(rx);
                            return Ok((proc, v));
                        }
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => continue,
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = proc.child.as_mut().and_then(|c| c.wait().ok());
                    bail!("{name} exited before it was ready: {status:?}");
                }
            }
        }
    }

    /// Start without waiting for a ready line.
    pub fn start(name: &str, mut cmd: Command) -> Result<Self> {
        cmd.stdin(Stdio::null());
        let child = cmd.spawn().with_context(|| format!("spawn {name}"))?;
        Ok(Proc {
            name: name.to_string(),
            child: Some(child),
            stdout_rx: None,
        })
    }

    /// The OS process id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().map(|c| c.id()).unwrap_or(0)
    }

    /// Send SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Send SIGTERM and wait up to `timeout` for a clean exit; SIGKILL
    /// after that. Returns the exit status code when it exited by itself.
    pub fn terminate(&mut self, timeout: Duration) -> Option<i32> {
        let mut c = self.child.take()?;
        let _ = Command::new("kill")
            .args(["-TERM", &c.id().to_string()])
            .status();
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(st)) = c.try_wait() {
                return st.code();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = c.kill();
        let _ = c.wait();
        None
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Holds a process stopped with SIGSTOP; SIGCONT when dropped (also when
/// a test fails, so the lab can stop it).
pub struct Paused(u32);

impl Paused {
    /// Stop process `pid` (a child of this test).
    ///
    /// Panics: `kill(2)` fails (no such process).
    pub fn pause(pid: u32) -> Paused {
        // SAFETY: kill(2) on a child pid of ours, no memory involved.
        assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGSTOP) }, 0);
        Paused(pid)
    }
}

impl Drop for Paused {
    fn drop(&mut self) {
        // SAFETY: as above.
        unsafe { libc::kill(self.0 as i32, libc::SIGCONT) };
    }
}

pub use benchlink_testkit::eventually;

/// Poll `f` every 50 ms until it returns `Some`, for at most `timeout`
/// ([`benchlink_testkit::wait_for`] with an `anyhow` error).
pub fn wait_for<T>(timeout: Duration, what: &str, f: impl FnMut() -> Option<T>) -> Result<T> {
    benchlink_testkit::wait_for(timeout, what, f).map_err(|e| anyhow!(e))
}

/// Poll the async `check` until it returns `Some`, for at most `timeout`
/// ([`benchlink_testkit::poll_until`] with an `anyhow` error).
///
/// Errors: `timeout` passed first; the message names `what`.
pub async fn poll_until<T, F, Fut>(timeout: Duration, what: &str, check: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    benchlink_testkit::poll_until(timeout, what, check)
        .await
        .map_err(|e| anyhow!(e))
}

/// Read a file to a string, naming it on error.
pub fn read_to_string(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("read {}", path.display()))
}
