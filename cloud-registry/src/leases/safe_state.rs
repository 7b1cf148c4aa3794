//! Safe state on release (docs/policy.md "Safe state on release"): when
//! the last lease on a capability with `on_release` actions ends, for any
//! reason, the capability is handed to the system holder
//! [`SAFE_STATE_PRINCIPAL`] in the same transaction as the end, so that no
//! waiter can be granted before the actions ran. The runner
//! (`crate::safe_state`) runs them and releases that lease.
//! A failed run marks the capability with the registry's own verdict
//! (`LeaseEngine::set_check_unhealthy`).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use shared_protocol::capability::{CapabilityAction, LeaseMode};
use shared_protocol::event::EventType;
use shared_protocol::lease::{CapabilityLease, HolderType, LeaseStatus};

use super::clock::Now;
use super::model::{Book, Entry, State, Tx, Want, SYSTEM_ACTOR};
use super::queue::new_lease_id;

/// Principal (and `holder_ref`) of the leases that run `on_release`
/// actions; their `holder_type` is `system`.
pub const SAFE_STATE_PRINCIPAL: &str = "system:safe-state";

/// `purpose` of those leases.
pub const SAFE_STATE_PURPOSE: &str = "on_release safe state";

/// Priority of those leases (the highest: nothing outranks them, and they
/// are never preempted in any case).
const SAFE_STATE_PRIORITY: u8 = 100;

/// One `on_release` action of a capability, as the edge registers it in
/// `metadata_json.on_release`: `{"action": "power_off", "params": {}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReleaseAction {
    /// One of the capability's supported actions.
    pub action: CapabilityAction,
    /// The action's parameters (docs/actions.md).
    #[serde(default)]
    pub params: Map<String, Value>,
}

/// The `on_release` actions in a capability's `metadata_json`: the
/// `on_release` array, each entry a [`ReleaseAction`]. A missing key is no
/// actions; an entry that does not parse is skipped with a warning (the
/// edge checks them at `check-config`).
pub fn release_actions(capability_id: &str, metadata: &Map<String, Value>) -> Vec<ReleaseAction> {
    let Some(Value::Array(items)) = metadata.get("on_release") else {
        return Vec::new();
    };
    items
        .iter()
        .filter_map(
            |v| match serde_json::from_value::<ReleaseAction>(v.clone()) {
                Ok(a) => Some(a),
                Err(e) => {
                    tracing::warn!(capability_id, error = %e, entry = %v, "on_release entry skipped");
                    None
                }
            },
        )
        .collect()
}

/// The principal safe-state actions run as (role `operator`: it holds
/// its leases like any holder, nothing more).
pub fn principal() -> crate::auth::Principal {
    crate::auth::Principal {
        name: SAFE_STATE_PRINCIPAL.to_string(),
        role: shared_protocol::api::Role::Operator,
    }
}

/// True for a lease of the safe-state holder.
pub fn is_safe_state(lease: &CapabilityLease) -> bool {
    lease.principal == SAFE_STATE_PRINCIPAL && lease.holder_type == HolderType::System
}

impl State {
    /// After a holding lease `ended` on `capability_id` reached a final
    /// status: when the capability has `on_release` actions and nobody
    /// holds it any more, grant it to the safe-state holder now (events
    /// `lease_requested`, `lease_granted`). The lease has no expiry: it
    /// lasts until the runner releases it. Returns its id.
    pub(crate) fn hand_to_safe_state(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        ended: &CapabilityLease,
    ) -> Option<String> {
        let cap = &ended.capability_id;
        if is_safe_state(ended)
            || self.holders.get(cap).is_some_and(|h| !h.is_empty())
            || self.dir.get(cap).is_none_or(|i| i.on_release.is_empty())
        {
            return None;
        }
        let id = new_lease_id();
        let lease = CapabilityLease {
            lease_id: id.clone(),
            capability_id: cap.clone(),
            holder_type: HolderType::System,
            holder_ref: SAFE_STATE_PRINCIPAL.to_string(),
            project_id: ended.project_id.clone(),
            purpose: SAFE_STATE_PURPOSE.to_string(),
            priority: SAFE_STATE_PRIORITY,
            status: LeaseStatus::Requested,
            requested_at: now.wall,
            granted_at: None,
            expires_at: None,
            grace_until: None,
            preempt_reason: None,
            evidence_required: false,
            mode: LeaseMode::Exclusive,
            lease_group_id: None,
            preempted_by: None,
            ended_at: None,
            principal: SAFE_STATE_PRINCIPAL.to_string(),
            generation: None,
            capability_selector: None,
        };
        let entry = Entry {
            lease,
            book: Book {
                requested_duration_seconds: 1,
                queue_seq: self.next_seq,
                want: Want::Capability {
                    capability_id: cap.clone(),
                    mode: LeaseMode::Exclusive,
                },
                preempt_if_needed: false,
                request_preempt_reason: None,
                queue_deadline: None,
                pinned_capability_id: None,
            },
            deadline: None,
            grace_deadline: None,
            held_since: Some(now.instant),
            candidates: Vec::new(),
        };
        self.next_seq += 1;
        self.leases.insert(id.clone(), entry);
        self.record(
            tx,
            &id,
            Some((EventType::LeaseRequested, SYSTEM_ACTOR, Vec::new())),
        );
        let generation = self.next_generation;
        self.next_generation += 1;
        let e = self.leases.get_mut(&id)?;
        e.lease.status = LeaseStatus::Granted;
        e.lease.granted_at = Some(now.wall);
        e.lease.generation = Some(generation);
        if let Some(m) = &self.metrics {
            // Handed over in the transaction that ended the last lease: no
            // wait.
            m.granted(
                self.capability_type_of(cap),
                HolderType::System.as_str(),
                std::time::Duration::ZERO,
            );
        }
        self.holders
            .entry(cap.clone())
            .or_default()
            .push(id.clone());
        self.record(
            tx,
            &id,
            Some((EventType::LeaseGranted, SYSTEM_ACTOR, Vec::new())),
        );
        tracing::info!(lease_id = %id, capability_id = %cap, ended = %ended.lease_id, "capability handed to the safe-state holder");
        Some(id)
    }
}
