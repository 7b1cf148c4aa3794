//! The capability event stream (seed 001 §7), served as Server-Sent Events
//! at `GET /api/v1/capability-events/stream`.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Timestamp;

wire_enum! {
    /// Event types: the fifteen of seed 001 §7, `session_late_report`
    /// (a fence violation, docs/architecture.md "Fencing"), then the
    /// audit-task events (seed 001 §8) that share the stream, then the
    /// agent runtime's run and proposal events.
    pub enum EventType {
        ProviderRegistered = "provider_registered",
        CapabilityRegistered = "capability_registered",
        CapabilityHealthChanged = "capability_health_changed",
        LeaseRequested = "lease_requested",
        LeaseGranted = "lease_granted",
        LeaseRenewed = "lease_renewed",
        LeaseReleaseRequested = "lease_release_requested",
        LeaseReleased = "lease_released",
        LeaseExpired = "lease_expired",
        LeasePreemptRequested = "lease_preempt_requested",
        LeasePreempted = "lease_preempted",
        SessionStarted = "session_started",
        SessionCompleted = "session_completed",
        SessionFailed = "session_failed",
        ArtifactUploaded = "artifact_uploaded",
        /// A provider reported an action the bench started outside its
        /// lease; `data` is the session with its `late_report`.
        SessionLateReport = "session_late_report",
        /// The registry could not derive evidence (`detection_json`,
        /// `ocr_text`, `transcript`) from an uploaded artifact; `data` is
        /// `{source_artifact_id, source_sha256, artifact_type, deriver,
        /// reason}` (docs/audit-trail.md "Derived evidence").
        ArtifactDerivationFailed = "artifact_derivation_failed",
        AuditTaskCreated = "audit_task_created",
        AuditTaskClaimed = "audit_task_claimed",
        AuditTaskReleased = "audit_task_released",
        AuditTaskCompleted = "audit_task_completed",
        /// An agent run was created; `data` is `{run_id, run_type, status,
        /// title, created_by}`.
        AgentRunCreated = "agent_run_created",
        /// A run's status changed or a step was added or ended; `data` as
        /// for `agent_run_created`, plus `step` when a step changed.
        AgentRunUpdated = "agent_run_updated",
        /// A proposal was recorded; `data` is `{proposal_id, run_id,
        /// proposal_type, status, risk_level}`. Admins only.
        AgentProposalCreated = "agent_proposal_created",
        /// A proposal was applied, rejected, failed, or an apply was
        /// refused; `data` as for `agent_proposal_created`. Admins only.
        AgentProposalUpdated = "agent_proposal_updated",
        /// An admin put a capability into maintenance; `data` is
        /// `{capability_id, provider_id, reason, previous_status, status}`.
        /// Its holders get `lease_preempt_requested` with
        /// `preempt_reason: "maintenance"` (docs/policy.md).
        CapabilityMaintenanceStarted = "capability_maintenance_started",
        /// An admin took a capability out of maintenance; `data` as for
        /// `capability_maintenance_started`.
        CapabilityMaintenanceEnded = "capability_maintenance_ended",
        /// An admin removed a retired capability; `data` is the capability
        /// as it was.
        CapabilityRemoved = "capability_removed",
    }
}

impl EventType {
    /// True for the events only admins may read (proposals are admin-only
    /// in the API, so their events are too).
    pub fn admin_only(self) -> bool {
        matches!(
            self,
            EventType::AgentProposalCreated | EventType::AgentProposalUpdated
        )
    }

    /// The fifteen types seed 001 §7 lists.
    pub const SEED_SECTION_7: [EventType; 15] = [
        EventType::ProviderRegistered,
        EventType::CapabilityRegistered,
        EventType::CapabilityHealthChanged,
        EventType::LeaseRequested,
        EventType::LeaseGranted,
        EventType::LeaseRenewed,
        EventType::LeaseReleaseRequested,
        EventType::LeaseReleased,
        EventType::LeaseExpired,
        EventType::LeasePreemptRequested,
        EventType::LeasePreempted,
        EventType::SessionStarted,
        EventType::SessionCompleted,
        EventType::SessionFailed,
        EventType::ArtifactUploaded,
    ];
}

/// One event. `event_id` increases by one per event for the registry's whole
/// life (it is the SSE `id:`; a client resumes with `Last-Event-ID`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CapabilityEvent {
    pub event_id: u64,
    pub event_type: EventType,
    #[schema(value_type = String, format = DateTime)]
    pub occurred_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provider_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub artifact_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_request_id: Option<String>,
    /// Type-specific detail (the lease, the session, the health change...).
    pub data: Value,
}

/// Sent as SSE event `stream_gap` when a client fell too far behind and
/// events `from_event_id..=to_event_id` were dropped for it; it should
/// reconnect with `Last-Event-ID` to fetch them from the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct StreamGap {
    pub from_event_id: u64,
    pub to_event_id: u64,
}
