//! A private PulseAudio server for tests that play and record real sound:
//! `pulseaudio` in a temporary HOME and XDG_RUNTIME_DIR with the null sink
//! `vsink` (48 kHz stereo) as default sink and its monitor `vsink.monitor`
//! as default source. A speaker (rodio) plays into the sink; a microphone
//! (cpal) records the monitor. Stopped on drop, also on panic.
//!
//! Used by edge-agent/tests/audio_loopback.rs and tests/tests/speech_path.rs.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// A running private PulseAudio server; SIGTERM (then SIGKILL after 3 s)
/// on drop.
pub struct PulseServer {
    dir: tempfile::TempDir,
    pid: i32,
}

impl PulseServer {
    /// Start the server and set its default sink and source.
    ///
    /// Errors: a readable reason when `pulseaudio` or `pactl` cannot run
    /// or fail; pass it to [`crate::skip_unless_ci`].
    pub fn start() -> Result<PulseServer, String> {
        let dir = tempfile::tempdir().map_err(|e| format!("temporary directory: {e}"))?;
        let (home, run) = (dir.path().join("home"), dir.path().join("run"));
        for d in [&home, &run] {
            std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
        }
        let out = Command::new("pulseaudio")
            .args([
                "-D",
                "--exit-idle-time=-1",
                "--system=false",
                "-n",
                "--load=module-native-protocol-unix",
                "--load=module-null-sink sink_name=vsink rate=48000 channels=2",
            ])
            .env("HOME", &home)
            .env("XDG_RUNTIME_DIR", &run)
            .output()
            .map_err(|e| format!("cannot run pulseaudio: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pulseaudio failed: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let pid_file = run.join("pulse/pid");
        let pid = std::fs::read_to_string(&pid_file)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| format!("pulseaudio started but wrote no {}", pid_file.display()))?;
        let server = PulseServer { dir, pid };
        server.pactl(&["set-default-sink", "vsink"])?;
        server.pactl(&["set-default-source", "vsink.monitor"])?;
        Ok(server)
    }

    fn home(&self) -> PathBuf {
        self.dir.path().join("home")
    }

    fn runtime(&self) -> PathBuf {
        self.dir.path().join("run")
    }

    /// `PULSE_SERVER` and `PULSE_COOKIE` pointing an audio client (this
    /// process, or a child such as edge-agent) at this server.
    pub fn env(&self) -> Vec<(String, String)> {
        vec![
            (
                "PULSE_SERVER".into(),
                format!("unix:{}", self.runtime().join("pulse/native").display()),
            ),
            (
                "PULSE_COOKIE".into(),
                self.home()
                    .join(".config/pulse/cookie")
                    .display()
                    .to_string(),
            ),
        ]
    }

    /// Run `pactl ARGS` against this server; its stdout.
    ///
    /// Errors: pactl cannot run or exits non-zero (with its stderr).
    pub fn pactl(&self, args: &[&str]) -> Result<String, String> {
        let out = Command::new("pactl")
            .args(args)
            .env("HOME", self.home())
            .env("XDG_RUNTIME_DIR", self.runtime())
            .output()
            .map_err(|e| format!("cannot run pactl: {e}"))?;
        if !out.status.success() {
            return Err(format!(
                "pactl {args:?}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }
}

impl Drop for PulseServer {
    fn drop(&mut self) {
        let alive = |pid: i32| Path::new(&format!("/proc/{pid}")).exists();
        // SAFETY: signals the pulseaudio daemon this server started (its
        // pid from the pid file in its own runtime directory).
        unsafe {
            libc::kill(self.pid, libc::SIGTERM);
        }
        let t0 = Instant::now();
        while alive(self.pid) && t0.elapsed() < Duration::from_secs(3) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if alive(self.pid) {
            // SAFETY: as above.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
    }
}
