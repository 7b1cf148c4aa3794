//! systemd integration of `cloud-registry serve` (`Type=notify`,
//! `WatchdogSec=`, systemd/cloud-registry.service, docs/install-registry.md),
//! through the `sd-notify` crate:
//! - `READY=1` once the HTTP API and MQTT are up ([`Watchdog::ready`]);
//! - `WATCHDOG=1` at half of `$WATCHDOG_USEC`, only while
//!   [`RunningRegistry::health_problem`] finds nothing wrong: a hung store
//!   writer, a stuck lease engine or a stopped HTTP server withholds the
//!   ping, and systemd restarts the service when the watchdog runs out;
//! - `STOPPING=1` when the shutdown signal arrives.
//!
//! Outside systemd (`$NOTIFY_SOCKET` unset) every call is a no-op.

use std::time::Duration;

use sd_notify::NotifyState;

use crate::app::RunningRegistry;

/// Talks to the service manager for `serve`.
#[derive(Debug, Clone)]
pub struct Watchdog {
    /// `$WATCHDOG_USEC` when the watchdog is on.
    timeout: Option<Duration>,
}

impl Watchdog {
    /// Read `$WATCHDOG_USEC` / `$WATCHDOG_PID` (left in the environment).
    pub fn from_env() -> Self {
        let mut usec = 0u64;
        let on = sd_notify::watchdog_enabled(false, &mut usec) && usec > 0;
        Self {
            timeout: on.then(|| Duration::from_micros(usec)),
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        send(&[NotifyState::Ready, NotifyState::Status(status)]);
    }

    /// `STOPPING=1` with a status line.
    pub fn stopping(&self, status: &str) {
        send(&[NotifyState::Stopping, NotifyState::Status(status)]);
    }

    /// Ping at half the watchdog timeout, whatever happens; never returns
    /// (a standby: it has no lease engine or broker to probe). Returns at
    /// once when the watchdog is off.
    pub async fn keep_alive(&self) {
        let Some(timeout) = self.timeout else {
            return std::future::pending().await;
        };
        let mut tick = tokio::time::interval(timeout / 2);
        loop {
            tick.tick().await;
            send(&[NotifyState::Watchdog]);
        }
    }

    /// Ping at half the watchdog timeout while `registry` is healthy;
    /// never returns (run it beside the shutdown signal). Returns at once
    /// when the watchdog is off.
    pub async fn run(&self, registry: &RunningRegistry) {
        let Some(timeout) = self.timeout else {
            return std::future::pending().await;
        };
        let every = timeout / 2;
        // A probe must answer well within one period, or the ping is late
        // whatever it finds.
        let probe_limit = every.min(Duration::from_secs(10));
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut withheld = false;
        loop {
            tick.tick().await;
            match registry.health_problem(probe_limit).await {
                None => {
                    if withheld {
                        tracing::info!("registry healthy again; watchdog pings resume");
                        withheld = false;
                    }
                    send(&[NotifyState::Watchdog, NotifyState::Status("serving")]);
                }
                Some(problem) => {
                    tracing::error!("registry unhealthy, withholding the watchdog ping: {problem}");
                    withheld = true;
                    let status = format!("unhealthy: {problem}");
                    send(&[NotifyState::Status(&status)]);
                }
            }
        }
    }
}

fn send(states: &[NotifyState<'_>]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}
