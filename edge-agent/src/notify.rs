//! systemd integration: `Type=notify` readiness, `STATUS=` lines and the
//! watchdog (`WatchdogSec=`), through the `sd-notify` crate.
//!
//! Outside systemd (`$NOTIFY_SOCKET` unset) every call is a no-op, so the
//! daemon runs the same from a terminal or a test.

use std::time::Duration;

use sd_notify::NotifyState;

/// Talks to the service manager.
#[derive(Debug, Clone)]
pub struct Notifier {
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Read `$WATCHDOG_USEC` / `$WATCHDOG_PID` (left in place, so a
    /// re-executed process sees them too).
    pub fn from_env() -> Self {
        let mut usec = 0u64;
        let watchdog = if sd_notify::watchdog_enabled(false, &mut usec) && usec > 0 {
            Some(Duration::from_micros(usec))
        } else {
            None
        };
        Self { watchdog }
    }

    /// The watchdog timeout systemd expects pings within, when enabled.
    pub fn watchdog_timeout(&self) -> Option<Duration> {
        self.watchdog
    }

    /// How often to ping: half the watchdog timeout (or `None`).
    pub fn ping_interval(&self) -> Option<Duration> {
        self.watchdog.map(|w| w / 2)
    }

    /// `READY=1` with a status line: start-up finished.
    pub fn ready(&self, status: &str) {
        self.send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// `STATUS=...` (shown by `systemctl status`).
    pub fn status(&self, status: &str) {
        self.send(&[NotifyState::Status(status)]);
    }

    /// `WATCHDOG=1`: the daemon is healthy. Only call this while it is.
    pub fn watchdog_ping(&self) {
        if self.watchdog.is_some() {
            self.send(&[NotifyState::Watchdog]);
        }
    }

    /// `STOPPING=1` with a status line.
    pub fn stopping(&self, status: &str) {
        self.send(&[NotifyState::Stopping, NotifyState::Status(status)]);
    }

    fn send(&self, state: &[NotifyState<'_>]) {
        if let Err(e) = sd_notify::notify(false, state) {
            tracing::debug!("sd_notify failed: {e}");
        }
    }
}
