//! Session deadlines on the monotonic clock.
//!
//! Each open session's deadline (`timeout_ms + result_grace_ms` after its
//! command was sent; at most `revoke_grace_ms` after its lease ended) is a
//! `tokio::time::Instant` held here, so a step of the wall clock (NTP, an
//! operator setting the date) neither fails a running session at once nor
//! keeps a silent one open for the size of the step. The row's
//! `deadline_at` is the wall-clock rendering, computed when the deadline is
//! set; it is read only when the registry starts, to rebuild the deadlines
//! of the sessions still open ("now + (deadline_at − wall now)", as leases
//! do, see `leases` "Time"): time the registry was down counts against
//! them, and a wall-clock step while it was down shifts them by the step.
//!
//! Beside its deadline, a session sent by this run keeps its command's
//! [`Fence`], so a report is judged against it without reading the store.

use std::collections::HashMap;
use std::time::Duration;

use shared_protocol::Timestamp;
use tokio::time::Instant;

/// When a session's command left, for the report window (a session is
/// judged in the first window after a (re)connection only if its command
/// was sent since).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Sent {
    /// At this instant, by this run of the registry.
    At(Instant),
    /// Before this run of the registry started (rebuilt from the store).
    BeforeStart,
}

/// The authority a session's command carried (docs/architecture.md
/// "Fencing"): its lease and its `not_after`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Fence {
    pub lease_id: String,
    pub not_after: Timestamp,
}

#[derive(Debug, Clone)]
struct Deadline {
    at: Instant,
    sent: Sent,
    /// Known for sessions sent by this run.
    fence: Option<Fence>,
}

/// The deadlines of the open sessions, by session id. A session leaves
/// when it ends (its final event is published); an id left behind by a
/// race (the session ended while it was rebuilt) is dropped at its
/// deadline, when the store finds the session already ended.
#[derive(Debug, Default)]
pub(crate) struct Deadlines {
    open: HashMap<String, Deadline>,
}

/// `now + d`, or a century on when that does not fit the clock (a
/// configured grace time near `u64::MAX` ms).
pub(crate) fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 24 * 3600)))
        .unwrap_or(now)
}

/// The monotonic deadline for a stored wall-clock deadline `wall`, read
/// when the monotonic clock says `now` and the wall clock `wall_now`: now
/// plus what is left until `wall`; `now` itself for a deadline already
/// past (overdue at once).
pub(crate) fn instant_of(now: Instant, wall_now: Timestamp, wall: Timestamp) -> Instant {
    match (wall - wall_now).to_std() {
        Ok(ahead) => after(now, ahead),
        Err(_) => now,
    }
}

impl Deadlines {
    /// A session sent at `sent` under `fence` must end by `at`.
    pub fn insert(&mut self, session_id: &str, sent: Instant, at: Instant, fence: Option<Fence>) {
        self.open.insert(
            session_id.to_string(),
            Deadline {
                at,
                sent: Sent::At(sent),
                fence,
            },
        );
    }

    /// The fence of open session `session_id`, when this run sent it.
    pub fn fence(&self, session_id: &str) -> Option<Fence> {
        self.open.get(session_id).and_then(|d| d.fence.clone())
    }

    /// When open session `session_id`'s command left, when this run sent
    /// it (for `benchlink_action_round_trip_seconds`).
    pub fn sent_at(&self, session_id: &str) -> Option<Instant> {
        match self.open.get(session_id)?.sent {
            Sent::At(t) => Some(t),
            Sent::BeforeStart => None,
        }
    }

    /// A session found open in the store at start, whose deadline is `at`;
    /// one already known (sent by this run) keeps its own.
    pub fn restore(&mut self, session_id: &str, at: Instant) {
        self.open.entry(session_id.to_string()).or_insert(Deadline {
            at,
            sent: Sent::BeforeStart,
            fence: None,
        });
    }

    /// The session must end by `at` at the latest (its lease ended). An
    /// unknown id is added as sent before this run.
    pub fn shorten(&mut self, session_id: &str, at: Instant) {
        let d = self.open.entry(session_id.to_string()).or_insert(Deadline {
            at,
            sent: Sent::BeforeStart,
            fence: None,
        });
        d.at = d.at.min(at);
    }

    /// The session ended.
    pub fn remove(&mut self, session_id: &str) {
        self.open.remove(session_id);
    }

    /// Sessions whose deadline is at or before `now`; with `sent_after`,
    /// only those sent by this run after that instant.
    pub fn overdue(&self, now: Instant, sent_after: Option<Instant>) -> Vec<String> {
        self.open
            .iter()
            .filter(|(_, d)| d.at <= now)
            .filter(|(_, d)| match (sent_after, d.sent) {
                (None, _) => true,
                (Some(t), Sent::At(sent)) => sent > t,
                (Some(_), Sent::BeforeStart) => false,
            })
            .map(|(id, _)| id.clone())
            .collect()
    }

    /// Number of sessions held.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.open.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_session_is_overdue_only_once_its_monotonic_deadline_has_passed() {
        let t0 = Instant::now();
        let mut d = Deadlines::default();
        d.insert("s1", t0, t0 + Duration::from_secs(45), None);
        assert!(d.overdue(t0 + Duration::from_secs(44), None).is_empty());
        assert_eq!(d.overdue(t0 + Duration::from_secs(45), None), ["s1"]);
        d.remove("s1");
        assert!(d.overdue(t0 + Duration::from_secs(99), None).is_empty());
        assert_eq!(d.len(), 0);
    }

    #[test]
    fn a_lease_end_only_brings_a_deadline_closer() {
        let t0 = Instant::now();
        let mut d = Deadlines::default();
        d.insert("s1", t0, t0 + Duration::from_secs(45), None);
        d.shorten("s1", t0 + Duration::from_secs(15));
        assert_eq!(d.overdue(t0 + Duration::from_secs(15), None), ["s1"]);
        d.shorten("s1", t0 + Duration::from_secs(60));
        assert_eq!(d.overdue(t0 + Duration::from_secs(15), None), ["s1"]);
    }

    #[test]
    fn in_the_report_window_only_sessions_sent_since_the_reconnection_are_judged() {
        let t0 = Instant::now();
        let reconnected = t0 + Duration::from_secs(10);
        let mut d = Deadlines::default();
        d.insert("before", t0, t0 + Duration::from_secs(1), None);
        d.insert(
            "since",
            reconnected + Duration::from_secs(1),
            reconnected + Duration::from_secs(2),
            None,
        );
        d.restore("restored", t0);
        // A restored id does not replace the deadline of one sent by this run.
        d.restore("since", t0);
        let late = reconnected + Duration::from_secs(5);
        assert_eq!(d.overdue(late, Some(reconnected)), ["since"]);
        let mut all = d.overdue(late, None);
        all.sort();
        assert_eq!(all, ["before", "restored", "since"]);
    }

    #[test]
    fn a_stored_deadline_becomes_the_time_left_on_the_monotonic_clock() {
        let now = Instant::now();
        let wall: Timestamp = "2026-12-01T12:00:00Z".parse().unwrap();
        let later = wall + chrono::Duration::seconds(30);
        assert_eq!(instant_of(now, wall, later), now + Duration::from_secs(30));
        let past = wall - chrono::Duration::seconds(30);
        assert_eq!(instant_of(now, wall, past), now);
    }

    #[test]
    fn a_grace_time_too_large_for_the_clock_is_a_century() {
        let t0 = Instant::now();
        assert!(after(t0, Duration::from_millis(u64::MAX)) > t0 + Duration::from_secs(3600));
    }
}
