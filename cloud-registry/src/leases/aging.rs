//! Queue aging (docs/policy.md "Queue aging"): a waiting request's
//! *effective* priority rises with the time it has waited, so that a
//! steady stream of higher-priority requests cannot starve it.
//!
//! - [`QueueAging`]: the `[policy.queue_aging]` settings and the ranking
//!   function (`effective`, `next_change`);
//! - [`State::rerank`]: moves waiters whose boost changed to their new
//!   place in the queue (the queue stays a sorted map keyed by effective
//!   priority, then arrival).
//!
//! Aging only orders the queue: preemption compares the request's own
//! `priority` (see `preemption.rs`), never the boosted one.

use std::cmp::Reverse;
use std::collections::HashSet;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use super::model::{RankKey, State};

/// Highest priority a request, boosted or not, can have.
const MAX_PRIORITY: u8 = 100;

/// `[policy.queue_aging]`: how fast a waiting request's priority rises.
///
/// effective priority = min(100, priority + min(max_boost,
/// floor(age_minutes × priority_per_minute))), with the age on the
/// engine's monotonic clock.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QueueAging {
    /// Priority points gained per minute of waiting; finite and above 0
    /// (e.g. 10.0: a request gains 10 points a minute).
    pub priority_per_minute: f64,
    /// Most points a request can gain by waiting, 1..=100 (e.g. 50).
    pub max_boost: u32,
}

impl QueueAging {
    /// Every broken rule as `(dotted key, message)`, for `check-config`.
    pub fn problems(&self) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let rate = self.priority_per_minute;
        if !(rate.is_finite() && rate > 0.0) {
            out.push((
                "policy.queue_aging.priority_per_minute".to_string(),
                format!("must be a finite number above 0 (points per minute), not {rate}"),
            ));
        }
        if !(1..=u32::from(MAX_PRIORITY)).contains(&self.max_boost) {
            out.push((
                "policy.queue_aging.max_boost".to_string(),
                format!("must be from 1 to {MAX_PRIORITY}, not {}", self.max_boost),
            ));
        }
        out
    }

    /// Points gained after waiting `age`: floor(age_minutes ×
    /// priority_per_minute), at most `max_boost`.
    pub fn boost(&self, age: Duration) -> u8 {
        let cap = self.max_boost.min(u32::from(MAX_PRIORITY));
        let gained = (age.as_secs_f64() / 60.0 * self.priority_per_minute).floor();
        if gained.is_nan() || gained <= 0.0 {
            0
        } else if gained >= f64::from(cap) {
            cap as u8
        } else {
            gained as u8
        }
    }

    /// The priority a request of `priority` ranks with after waiting
    /// `age`: `priority + boost(age)`, at most 100.
    pub fn effective(&self, priority: u8, age: Duration) -> u8 {
        priority.saturating_add(self.boost(age)).min(MAX_PRIORITY)
    }

    /// The age (since arrival) at which a request of `priority` that has
    /// waited `age` next gains a point; `None` when it never will (at
    /// `max_boost` or at 100).
    pub fn next_change(&self, priority: u8, age: Duration) -> Option<Duration> {
        let boost = self.boost(age);
        if u32::from(boost) >= self.max_boost || self.effective(priority, age) >= MAX_PRIORITY {
            return None;
        }
        let minutes = f64::from(boost + 1) / self.priority_per_minute;
        // One microsecond past the exact point, so that the floor there
        // is already the next step despite rounding.
        Duration::try_from_secs_f64(minutes * 60.0)
            .ok()
            .map(|d| d + Duration::from_micros(1))
    }
}

impl State {
    /// With `aging`, move every waiter whose effective priority changed by
    /// `now` to its new key (same arrival, new priority), and note the
    /// candidates of those that moved: the next [`State::schedule`] looks
    /// at them (a waiter moved ahead may take what the one it passed had
    /// reserved). Cheap when no boost is due: it only compares `now` with
    /// the earliest next change.
    pub fn rerank(&mut self, now: Instant, aging: Option<&QueueAging>) {
        let Some(aging) = aging else {
            return;
        };
        if self.next_rerank.is_none_or(|at| now < at) {
            return;
        }
        let mut moved: Vec<(RankKey, RankKey)> = Vec::new();
        let mut next: Option<Instant> = None;
        for (key, w) in &self.queue {
            let age = now.saturating_duration_since(w.enqueued_at);
            let rank = aging.effective(w.priority, age);
            if rank != key.0 .0 {
                moved.push((*key, (Reverse(rank), key.1)));
            }
            if let Some(d) = aging.next_change(w.priority, age) {
                let at = w.enqueued_at + d;
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        self.next_rerank = next;
        let mut touched = HashSet::new();
        for (old, new) in moved {
            let Some(w) = self.queue.remove(&old) else {
                continue;
            };
            for m in &w.members {
                self.rank_of.insert(m.clone(), new);
                if let Some(e) = self.leases.get(m) {
                    touched.extend(e.candidates.iter().cloned());
                }
            }
            self.queue.insert(new, w);
        }
        self.reranked.extend(touched);
    }

    /// Note that a waiter of `priority` arrived at `at`: the next rerank is
    /// due no later than its first point.
    pub fn note_arrival(&mut self, priority: u8, at: Instant, aging: Option<&QueueAging>) {
        let Some(d) = aging.and_then(|a| a.next_change(priority, Duration::ZERO)) else {
            return;
        };
        let first = at + d;
        self.next_rerank = Some(self.next_rerank.map_or(first, |n| n.min(first)));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn aging(rate: f64, max_boost: u32) -> QueueAging {
        QueueAging {
            priority_per_minute: rate,
            max_boost,
        }
    }

    fn secs(s: f64) -> Duration {
        Duration::from_secs_f64(s)
    }

    #[test]
    fn the_boost_is_the_floor_of_age_times_rate_capped() {
        let a = aging(10.0, 50);
        assert_eq!(a.boost(Duration::ZERO), 0);
        assert_eq!(a.boost(secs(5.9)), 0);
        assert_eq!(a.boost(secs(6.0)), 1);
        assert_eq!(a.boost(secs(59.9)), 9);
        assert_eq!(a.boost(secs(60.0)), 10);
        assert_eq!(a.boost(secs(299.0)), 49);
        assert_eq!(a.boost(secs(300.0)), 50);
        assert_eq!(a.boost(secs(86_400.0)), 50, "capped at max_boost");
    }

    #[test]
    fn the_effective_priority_never_exceeds_100() {
        let a = aging(10.0, 50);
        assert_eq!(a.effective(10, secs(120.0)), 30);
        assert_eq!(a.effective(10, secs(86_400.0)), 60);
        assert_eq!(a.effective(80, secs(180.0)), 100);
        assert_eq!(a.effective(100, Duration::ZERO), 100);
        assert_eq!(aging(1e9, 100).effective(0, secs(1.0)), 100);
    }

    #[test]
    fn the_next_change_is_the_next_whole_point_until_the_cap() {
        let a = aging(10.0, 3);
        let n = a.next_change(10, Duration::ZERO).unwrap();
        assert!(n > secs(6.0) && n < secs(6.001), "{n:?}");
        assert_eq!(a.boost(n), 1);
        let n = a.next_change(10, secs(13.0)).unwrap();
        assert!(n > secs(18.0) && n < secs(18.001), "{n:?}");
        assert_eq!(a.next_change(10, secs(18.5)), None, "at max_boost");
        assert_eq!(a.next_change(99, secs(6.5)), None, "at 100");
        assert_eq!(a.next_change(100, Duration::ZERO), None);
    }

    #[test]
    fn bad_settings_are_reported_by_key() {
        assert!(aging(10.0, 50).problems().is_empty());
        assert!(aging(0.001, 100).problems().is_empty());
        for rate in [0.0, -1.0, f64::NAN, f64::INFINITY] {
            let p = aging(rate, 50).problems();
            assert_eq!(p.len(), 1, "{rate}: {p:?}");
            assert_eq!(p[0].0, "policy.queue_aging.priority_per_minute");
        }
        for max in [0, 101, 1000] {
            let p = aging(10.0, max).problems();
            assert_eq!(p.len(), 1, "{max}: {p:?}");
            assert_eq!(p[0].0, "policy.queue_aging.max_boost");
        }
    }
}
