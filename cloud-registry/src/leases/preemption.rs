//! The preemption decision (seed 001 §6.2) and the start of a preemption
//! (§6.3).
//!
//! A holder is preempted only when all five conditions hold:
//! 1. the capability is `preemptible`;
//! 2. the capability is not `safety_locked`;
//! 3. the waiting request's priority is strictly higher than the holder's;
//! 4. the request set `preempt_if_needed` and gave a `preempt_reason` on
//!    the registry's whitelist;
//! 5. the capability is not inside a non-interruptible window (§6.4).
//!
//! When they hold, the holder gets a `lease_preempt_requested` event with a
//! [`PreemptNotice`] and its lease runs a grace period until `grace_until`;
//! at the end of the grace period the sweeper revokes it (`lease_preempted`)
//! unless the capability is then inside a non-interruptible window, in which
//! case revocation waits for the window to close.

use serde_json::json;
use shared_protocol::event::EventType;
use shared_protocol::lease::{LeaseStatus, PreemptNotice};

use super::clock::Now;
use super::model::{Entry, State, Tx, Waiter, SYSTEM_ACTOR};
use super::{CapabilityInfo, LeaseConfig};

/// Which of the five conditions of seed 001 §6.2 stops a preemption.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PreemptionBlock {
    /// 1: the capability is registered with `preemptible: false`.
    NotPreemptible,
    /// 2: the capability is `safety_locked`.
    SafetyLocked,
    /// 3: the request's priority is not strictly higher than the holder's.
    PriorityNotHigher,
    /// 4: `preempt_if_needed` is false, or `preempt_reason` is missing or
    /// not on the whitelist.
    ReasonNotAllowed,
    /// 5: the capability is inside a non-interruptible window (§6.4).
    NonInterruptibleWindow,
    /// The holder is the safe-state holder running `on_release` actions.
    SafeState,
}

/// Condition 4, which depends on the request alone.
pub(crate) fn request_may_preempt(w: &Waiter, cfg: &LeaseConfig) -> bool {
    w.preempt_if_needed
        && w.preempt_reason
            .as_ref()
            .is_some_and(|r| cfg.preempt_reason_whitelist.iter().any(|ok| ok == r))
}

/// Conditions 1, 2, 3 and 5 for one holder of `cap`.
pub(crate) fn holder_block(
    cap: &CapabilityInfo,
    holder: &Entry,
    priority: u8,
) -> Option<PreemptionBlock> {
    if super::safe_state::is_safe_state(&holder.lease) {
        Some(PreemptionBlock::SafeState)
    } else if !cap.preemptible {
        Some(PreemptionBlock::NotPreemptible)
    } else if cap.safety_locked {
        Some(PreemptionBlock::SafetyLocked)
    } else if priority <= holder.lease.priority {
        Some(PreemptionBlock::PriorityNotHigher)
    } else if cap.non_interruptible {
        Some(PreemptionBlock::NonInterruptibleWindow)
    } else {
        None
    }
}

impl State {
    /// Start the grace period of `victim`, preempted for the waiting lease
    /// `by` with `reason`: `preempt_requested` with its notice, then
    /// `grace_period` until `grace_until`, in the same commit. The event's
    /// data is the lease as left by the commit (status `grace_period`)
    /// plus `notice`.
    pub fn start_preemption(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        cfg: &LeaseConfig,
        victim: &str,
        by: &str,
        reason: &str,
    ) {
        let (grace_deadline, grace_until) = now.after(cfg.default_grace_period_seconds);
        let Some(e) = self.leases.get_mut(victim) else {
            return;
        };
        if e.being_preempted() || !e.lease.status.holds_capability() {
            return;
        }
        e.lease.status = LeaseStatus::PreemptRequested;
        e.lease.preempted_by = Some(by.to_string());
        e.lease.preempt_reason = Some(reason.to_string());
        e.lease.grace_until = Some(grace_until);
        e.grace_deadline = Some(grace_deadline);
        let notice = PreemptNotice {
            lease_id: victim.to_string(),
            capability_id: e.lease.capability_id.clone(),
            preempting_lease_id: by.to_string(),
            preempt_reason: reason.to_string(),
            grace_until,
        };
        e.lease.status = LeaseStatus::GracePeriod;
        tracing::info!(
            lease_id = victim,
            capability_id = %notice.capability_id,
            preempting_lease_id = by,
            preempt_reason = reason,
            %grace_until,
            "preemption requested; grace period started"
        );
        self.record(
            tx,
            victim,
            Some((
                EventType::LeasePreemptRequested,
                SYSTEM_ACTOR,
                vec![("notice", json!(notice))],
            )),
        );
    }
}

/// `preempt_reason` of the notice a holder gets when an admin puts its
/// capability into maintenance.
pub const MAINTENANCE_REASON: &str = "maintenance";

impl State {
    /// Start the grace period of `victim` because its capability went into
    /// maintenance: the same notice and states as a preemption
    /// ([`State::start_preemption`]) with `preempt_reason: "maintenance"`
    /// and no preempting lease (`preempting_lease_id` empty); the event
    /// also carries `maintenance_reason`. At the end of the grace period
    /// the sweeper revokes it as it does a preempted lease.
    pub fn start_withdrawal(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        cfg: &LeaseConfig,
        victim: &str,
        maintenance_reason: &str,
    ) {
        let (grace_deadline, grace_until) = now.after(cfg.default_grace_period_seconds);
        let Some(e) = self.leases.get_mut(victim) else {
            return;
        };
        if e.being_preempted() || !e.lease.status.holds_capability() {
            return;
        }
        e.lease.status = LeaseStatus::GracePeriod;
        e.lease.preempted_by = None;
        e.lease.preempt_reason = Some(MAINTENANCE_REASON.to_string());
        e.lease.grace_until = Some(grace_until);
        e.grace_deadline = Some(grace_deadline);
        let notice = PreemptNotice {
            lease_id: victim.to_string(),
            capability_id: e.lease.capability_id.clone(),
            preempting_lease_id: String::new(),
            preempt_reason: MAINTENANCE_REASON.to_string(),
            grace_until,
        };
        tracing::info!(
            lease_id = victim,
            capability_id = %notice.capability_id,
            maintenance_reason,
            %grace_until,
            "capability into maintenance; holder's grace period started"
        );
        self.record(
            tx,
            victim,
            Some((
                EventType::LeasePreemptRequested,
                SYSTEM_ACTOR,
                vec![
                    ("notice", json!(notice)),
                    ("maintenance_reason", json!(maintenance_reason)),
                ],
            )),
        );
    }
}
