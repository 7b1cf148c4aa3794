//! Transitions of a held lease: renew, act, release, expire, revoke, and the
//! sweep that runs the clock-driven ones (seed 001 §5.2-§5.4, §6.3).

use std::collections::HashSet;

use serde_json::{json, Value};
use shared_protocol::event::EventType;
use shared_protocol::lease::{CapabilityLease, LeaseStatus};
use tokio::time::Instant;

use super::clock::Now;
use super::error::LeaseError;
use super::model::{RankKey, State, Tx, SYSTEM_ACTOR};
use super::LeaseConfig;

/// A clock-driven end that is due for a holding lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Due {
    /// Its TTL ran out: `expired`, event `lease_expired`.
    Expiry,
    /// Its grace period ended: `revoked`, event `lease_preempted`.
    GraceEnd,
}

fn reason(r: &str) -> Vec<(&'static str, Value)> {
    vec![("reason", json!(r))]
}

impl State {
    /// The end due for live lease `id` at `now`, if any. Nothing is due
    /// while the capability is inside a non-interruptible window (seed 001
    /// §6.4): neither revocation nor expiry cuts an action in one.
    fn due(&self, id: &str, now: Instant) -> Option<(Instant, Due)> {
        let e = self.leases.get(id)?;
        if !e.lease.status.holds_capability() || self.in_window(&e.lease.capability_id) {
            return None;
        }
        let expiry = e.deadline.filter(|d| *d <= now).map(|d| (d, Due::Expiry));
        let grace = e
            .grace_deadline
            .filter(|d| *d <= now)
            .map(|d| (d, Due::GraceEnd));
        match (expiry, grace) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Apply the end `due` to lease `id`; returns the freed capability.
    fn end(&mut self, tx: &mut Tx, now: &Now, id: &str, due: Due) -> Option<String> {
        match due {
            Due::Expiry => self.finish(
                tx,
                now,
                id,
                LeaseStatus::Expired,
                (EventType::LeaseExpired, SYSTEM_ACTOR, reason("ttl_elapsed")),
            ),
            Due::GraceEnd => self.finish(
                tx,
                now,
                id,
                LeaseStatus::Revoked,
                (
                    EventType::LeasePreempted,
                    SYSTEM_ACTOR,
                    reason("grace_period_ended"),
                ),
            ),
        }
    }

    /// Expire or revoke lease `id` now if its deadline has passed (so that
    /// an operation never acts on a lease the sweeper has not reached yet),
    /// and give its capability to the next waiter.
    pub fn settle(&mut self, tx: &mut Tx, now: &Now, cfg: &LeaseConfig, id: &str) {
        if let Some((_, due)) = self.due(id, now.instant) {
            let freed = self.end(tx, now, id, due);
            self.schedule(tx, now, cfg, freed.into_iter().collect());
        }
    }

    /// One sweep: expire leases past their TTL, revoke leases past their
    /// grace period, fail waiting requests past their queue timeout, then
    /// grant what was freed. `also_dirty` are capabilities that changed for
    /// another reason (back online, window closed).
    pub fn sweep(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        cfg: &LeaseConfig,
        also_dirty: HashSet<String>,
    ) {
        let mut dirty = also_dirty;
        let mut due: Vec<(Instant, Due, String)> = self
            .leases
            .keys()
            .filter_map(|id| self.due(id, now.instant).map(|(at, d)| (at, d, id.clone())))
            .collect();
        due.sort();
        for (_, d, id) in due {
            dirty.extend(self.end(tx, now, &id, d));
        }

        let timed_out: Vec<RankKey> = self
            .queue
            .iter()
            .filter(|(_, w)| w.queue_deadline.is_some_and(|d| d <= now.instant))
            .map(|(k, _)| *k)
            .collect();
        for key in timed_out {
            let (members, touched) = self.remove_waiter(&key);
            dirty.extend(touched);
            for m in members {
                self.finish(
                    tx,
                    now,
                    &m,
                    LeaseStatus::Failed,
                    (
                        EventType::LeaseExpired,
                        SYSTEM_ACTOR,
                        reason("queue_timeout"),
                    ),
                );
            }
        }
        self.schedule(tx, now, cfg, dirty);
    }

    /// Release live lease `id` on behalf of `actor`: a held lease becomes
    /// `released` and its capability goes to the next waiter; a waiting
    /// request is withdrawn (`released`), with every lease of its group.
    /// Events: `lease_release_requested` then `lease_released`, both with
    /// `reason` when given.
    pub fn release(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        cfg: &LeaseConfig,
        id: &str,
        actor: &str,
        why: Option<&str>,
    ) -> Option<CapabilityLease> {
        let extra = || why.map(reason).unwrap_or_default();
        let status = self.leases.get(id)?.lease.status;
        let mut dirty = HashSet::new();
        let members = if status == LeaseStatus::Requested {
            let key = *self.rank_of.get(id)?;
            let (members, touched) = self.remove_waiter(&key);
            dirty.extend(touched);
            members
        } else {
            vec![id.to_string()]
        };
        for m in members {
            self.record(
                tx,
                &m,
                Some((EventType::LeaseReleaseRequested, actor, extra())),
            );
            dirty.extend(self.finish(
                tx,
                now,
                &m,
                LeaseStatus::Released,
                (EventType::LeaseReleased, actor, extra()),
            ));
        }
        self.schedule(tx, now, cfg, dirty);
        self.snapshot(id)
    }

    /// Renew live lease `id`: a new expiry `duration_seconds` from now
    /// (default: the duration first requested). Allowed from `granted`,
    /// `active` and `renew_pending`; refused during a preemption's grace
    /// period.
    pub fn renew(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        cfg: &LeaseConfig,
        id: &str,
        actor: &str,
        duration_seconds: Option<u32>,
    ) -> Result<CapabilityLease, LeaseError> {
        let Some(e) = self.leases.get_mut(id) else {
            return Err(LeaseError::NotFound {
                lease_id: id.to_string(),
            });
        };
        match e.lease.status {
            LeaseStatus::Granted | LeaseStatus::Active | LeaseStatus::RenewPending => {}
            other => return Err(LeaseError::status(id, other, "renew")),
        }
        let duration = duration_seconds.unwrap_or(e.book.requested_duration_seconds);
        super::check_duration(cfg, duration)?;
        let (deadline, expires_at) = now.after(duration);
        e.deadline = Some(deadline);
        e.lease.expires_at = Some(expires_at);
        if e.lease.status == LeaseStatus::RenewPending {
            e.lease.status = LeaseStatus::Active;
        }
        let lease = e.lease.clone();
        self.record(tx, id, Some((EventType::LeaseRenewed, actor, Vec::new())));
        Ok(lease)
    }

    /// Check that live lease `id` may run an action on `capability_id`,
    /// moving `granted` to `active` (recorded, no event: seed 001 §7 has no
    /// event for it; the session that starts is the record).
    pub fn authorize(
        &mut self,
        tx: &mut Tx,
        id: &str,
        capability_id: &str,
    ) -> Result<CapabilityLease, LeaseError> {
        let Some(e) = self.leases.get_mut(id) else {
            return Err(LeaseError::NotFound {
                lease_id: id.to_string(),
            });
        };
        if !e.lease.status.holds_capability() {
            return Err(LeaseError::status(id, e.lease.status, "act"));
        }
        if e.lease.capability_id != capability_id {
            return Err(LeaseError::invalid(
                "capability_id",
                format!(
                    "lease `{id}` covers capability `{}`, not `{capability_id}`",
                    e.lease.capability_id
                ),
            ));
        }
        if e.lease.status == LeaseStatus::Granted {
            e.lease.status = LeaseStatus::Active;
            let lease = e.lease.clone();
            self.record(tx, id, None);
            return Ok(lease);
        }
        Ok(e.lease.clone())
    }
}
