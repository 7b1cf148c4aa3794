//! Since when the registry has been able to hear its providers.
//!
//! Silence is held against a provider (liveness) or a session (deadline
//! watchdog) only while the registry itself could have heard: its MQTT
//! link up, and the registry running. Two things interrupt hearing:
//! - the MQTT link going down (the event loop reports it);
//! - the registry not running at all: its process stopped (SIGSTOP, a
//!   debugger), its VM frozen or its host starved. Meanwhile heartbeats
//!   and results pile up in the broker and the socket, unread; the
//!   monotonic clock runs on. On waking, every overdue timer fires at
//!   once, and a liveness check that ran before the link's loss was
//!   noticed, or before the queued heartbeats were read, would blame the
//!   providers for the registry's own absence.
//!
//! [`Hearing`] joins the two: [`Hearing::since`] is `None` while the link
//! is down, else the monotonic instant from which silence counts. Each
//! look (and a ticker every [`STALL_TICK`]) notes that the registry runs;
//! a look that finds more than [`STALL_THRESHOLD`] since the previous one
//! moves that instant to now, so every provider and session gets a full
//! window again. Whichever task looks first after a stall moves it, before
//! it judges anything.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::watch;

/// Longest time between two looks at [`Hearing`] that still counts as the
/// registry running. Timers of a running but busy registry are late by
/// milliseconds; a gap of seconds means it was not scheduled at all.
pub const STALL_THRESHOLD: Duration = Duration::from_secs(2);

/// How often the ticker ([`Hearing::run_ticker`]) looks, so a stall is
/// noticed even between the watchdogs' own looks.
pub const STALL_TICK: Duration = Duration::from_millis(250);

/// A cloneable handle on the registry's hearing (see the module doc).
#[derive(Debug, Clone)]
pub struct Hearing {
    link: Arc<watch::Sender<Option<Instant>>>,
    last_look: Arc<Mutex<Instant>>,
}

impl Hearing {
    /// A hearing whose link is down (`since()` is `None`) until
    /// [`Hearing::link_up`].
    pub fn new() -> Hearing {
        Hearing {
            link: Arc::new(watch::channel(None).0),
            last_look: Arc::new(Mutex::new(Instant::now())),
        }
    }

    /// The MQTT link (re)connected now: silence counts from now.
    pub fn link_up(&self) {
        self.link.send_replace(Some(Instant::now()));
    }

    /// The MQTT link is down: nobody's silence counts.
    pub fn link_down(&self) {
        self.link.send_replace(None);
    }

    /// `None` while the MQTT link is down, else the monotonic instant from
    /// which silence counts: the link's latest (re)connection, or the end
    /// of the latest stall of the registry if later. Notes that the
    /// registry runs; when the previous look is more than
    /// [`STALL_THRESHOLD`] ago, the instant moves to now first (logged).
    pub fn since(&self) -> Option<Instant> {
        self.since_at(Instant::now())
    }

    /// [`Hearing::since`] looked at `now`.
    fn since_at(&self, now: Instant) -> Option<Instant> {
        let stalled = {
            let mut last = self.last_look.lock().unwrap_or_else(|p| p.into_inner());
            let gap = now.saturating_duration_since(*last);
            *last = (*last).max(now);
            (gap > STALL_THRESHOLD).then_some(gap)
        };
        if let Some(gap) = stalled {
            let moved = self.link.send_if_modified(|since| match since {
                Some(t) if *t < now => {
                    *t = now;
                    true
                }
                _ => false,
            });
            tracing::warn!(
                stalled_ms = u64::try_from(gap.as_millis()).unwrap_or(u64::MAX),
                window_restarted = moved,
                "the registry did not run for a while (process stopped, machine frozen or starved); silence during it is not held against providers or sessions"
            );
        }
        *self.link.borrow()
    }

    /// A receiver of the instant [`Hearing::since`] returns, to wait for
    /// its changes (a link loss, a reconnection, a stall).
    pub fn subscribe(&self) -> watch::Receiver<Option<Instant>> {
        self.link.subscribe()
    }

    /// Look every [`STALL_TICK`] until `shutdown` turns true.
    pub async fn run_ticker(self, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(STALL_TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    self.since();
                }
                _ = shutdown.wait_for(|s| *s) => break,
            }
        }
    }
}

impl Default for Hearing {
    fn default() -> Self {
        Hearing::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_counts_while_the_link_is_down_and_counting_starts_at_its_reconnection() {
        let h = Hearing::new();
        assert_eq!(h.since(), None);
        h.link_up();
        let up = h.since().expect("link up");
        assert!(up <= Instant::now());
        h.link_down();
        assert_eq!(h.since(), None);
    }

    #[test]
    fn a_look_after_a_stall_starts_the_window_again() {
        let h = Hearing::new();
        h.link_up();
        let up = h.since().expect("link up");
        let t0 = *h.last_look.lock().unwrap();

        // Looks within the threshold change nothing.
        let busy = t0 + STALL_THRESHOLD;
        assert_eq!(h.since_at(busy), Some(up));

        // A look 20 s after the previous one: the registry was not
        // running; silence counts from that look.
        let woke = busy + Duration::from_secs(20);
        assert_eq!(h.since_at(woke), Some(woke));
        // The next look, right after, keeps it.
        assert_eq!(h.since_at(woke + Duration::from_millis(10)), Some(woke));
    }

    #[test]
    fn a_stall_while_the_link_is_down_leaves_it_down() {
        let h = Hearing::new();
        let t0 = *h.last_look.lock().unwrap();
        assert_eq!(h.since_at(t0 + Duration::from_secs(30)), None);
    }

    #[tokio::test]
    async fn subscribers_see_a_stall_as_a_change() {
        let h = Hearing::new();
        h.link_up();
        let mut rx = h.subscribe();
        rx.borrow_and_update();
        let t0 = *h.last_look.lock().unwrap();
        let woke = t0 + Duration::from_secs(10);
        h.since_at(woke);
        assert!(rx.has_changed().unwrap());
        assert_eq!(*rx.borrow_and_update(), Some(woke));
    }
}
