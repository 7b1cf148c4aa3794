//! Time for the lease engine: a monotonic clock for every deadline (expiry,
//! grace period, queue timeout) and the wall clock only to render those
//! deadlines on the wire (`expires_at`, `grace_until`) and to persist them.
//!
//! Deadlines never move when the system clock is stepped (NTP, an operator
//! setting the date): they are `tokio::time::Instant`s. The wall-clock
//! rendering of a deadline is computed once, when the deadline is set.

use std::sync::Mutex;
use std::time::Duration;

use chrono::{SubsecRound, TimeDelta, Utc};
use shared_protocol::Timestamp;
use tokio::time::Instant;

/// Where the engine reads the time. [`SystemClock`] in production;
/// [`ManualClock`] lets tests and simulations move time by hand instead of
/// sleeping.
pub trait LeaseClock: Send + Sync + 'static {
    /// Monotonic now (deadlines).
    fn now(&self) -> Instant;
    /// Wall-clock now (rendering on the wire, persistence).
    fn wall(&self) -> Timestamp;
}

/// The real clocks: `tokio::time::Instant::now()` and `Utc::now()`.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl LeaseClock for SystemClock {
    fn now(&self) -> Instant {
        Instant::now()
    }
    fn wall(&self) -> Timestamp {
        Utc::now()
    }
}

/// A clock that only moves when told to ([`ManualClock::advance`]); both
/// its monotonic and its wall reading move together. The background
/// sweeper still runs on real time but sees this clock, so after an
/// `advance` a test calls [`super::LeaseEngine::sweep_now`] (or waits one
/// sweep interval) to see expiries.
#[derive(Debug)]
pub struct ManualClock {
    origin: Instant,
    wall_origin: Timestamp,
    offset: Mutex<Duration>,
}

impl ManualClock {
    /// A clock whose wall reading starts at the real wall time.
    pub fn new() -> Self {
        Self::starting_at(Utc::now())
    }

    /// A clock whose wall reading starts at `wall` (e.g. later than another
    /// clock's, to simulate the registry being down for a while).
    pub fn starting_at(wall: Timestamp) -> Self {
        Self {
            origin: Instant::now(),
            wall_origin: wall,
            offset: Mutex::new(Duration::ZERO),
        }
    }

    /// Move both readings forward by `by`.
    pub fn advance(&self, by: Duration) {
        let mut offset = self.offset.lock().unwrap_or_else(|e| e.into_inner());
        *offset += by;
    }

    fn offset(&self) -> Duration {
        *self.offset.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Default for ManualClock {
    fn default() -> Self {
        Self::new()
    }
}

impl LeaseClock for ManualClock {
    fn now(&self) -> Instant {
        self.origin + self.offset()
    }
    fn wall(&self) -> Timestamp {
        self.wall_origin + delta(self.offset())
    }
}

fn delta(d: Duration) -> TimeDelta {
    TimeDelta::from_std(d).unwrap_or(TimeDelta::MAX)
}

/// Both readings taken once at the start of a transition, so that every
/// deadline set by it and its rendering agree.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Now {
    pub instant: Instant,
    pub wall: Timestamp,
}

impl Now {
    /// Read both clocks; the wall reading is cut to whole milliseconds so
    /// that what is answered, stored and reloaded is the same value.
    pub fn read(clock: &dyn LeaseClock) -> Self {
        Self {
            instant: clock.now(),
            wall: clock.wall().trunc_subsecs(3),
        }
    }

    /// The deadline `seconds` from now and its wall rendering.
    pub fn after(&self, seconds: u32) -> (Instant, Timestamp) {
        let d = Duration::from_secs(u64::from(seconds));
        (self.instant + d, self.wall + delta(d))
    }

    /// The monotonic deadline for a persisted wall time: now plus what is
    /// left until `wall` (never before "now minus the time since `wall`";
    /// a past wall time gives a past instant, clamped at the clock's
    /// start).
    pub fn instant_at(&self, wall: Timestamp) -> Instant {
        let remaining = wall - self.wall;
        match remaining.to_std() {
            Ok(ahead) => self.instant + ahead,
            Err(_) => {
                let behind = (-remaining).to_std().unwrap_or(Duration::ZERO);
                self.instant.checked_sub(behind).unwrap_or(self.instant)
            }
        }
    }
}
