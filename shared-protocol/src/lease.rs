//! Leases: who may use a capability, until when (seed 001 §2.2.3, §5, §6).

use serde::{Deserialize, Serialize};

use crate::capability::{CapabilityRequirement, CapabilitySelector, LeaseMode};
use crate::validate::limits::MAX_GROUP_MEMBERS;
use crate::validate::{
    check_count, check_id, check_range, validate_each, Validate, ValidationError,
};
use crate::Timestamp;

wire_enum! {
    /// Who holds a lease (seed 001 §2.2.3 `holder_type`).
    pub enum HolderType {
        WorkerThread = "worker_thread",
        AuditAgent = "audit_agent",
        HumanOperator = "human_operator",
        System = "system",
    }
}

wire_enum! {
    /// The ten lease states (seed 001 §2.2.3 `status`).
    ///
    /// `requested` waits in the queue; `granted` is held but not yet used;
    /// `active` has run an action; `renew_pending` awaits a renewal decision;
    /// `preempt_requested` has been asked to give way and `grace_period` runs
    /// until `grace_until`; the last four are final.
    pub enum LeaseStatus {
        Requested = "requested",
        Granted = "granted",
        Active = "active",
        RenewPending = "renew_pending",
        PreemptRequested = "preempt_requested",
        GracePeriod = "grace_period",
        Released = "released",
        Expired = "expired",
        Revoked = "revoked",
        Failed = "failed",
    }
}

impl LeaseStatus {
    /// True for `released`, `expired`, `revoked`, `failed`: nothing follows.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            LeaseStatus::Released
                | LeaseStatus::Expired
                | LeaseStatus::Revoked
                | LeaseStatus::Failed
        )
    }

    /// True while the lease gives its holder use of the capability:
    /// `granted`, `active`, `renew_pending`, `preempt_requested`,
    /// `grace_period` (a holder in its grace period may still finish up).
    pub fn holds_capability(self) -> bool {
        matches!(
            self,
            LeaseStatus::Granted
                | LeaseStatus::Active
                | LeaseStatus::RenewPending
                | LeaseStatus::PreemptRequested
                | LeaseStatus::GracePeriod
        )
    }
}

/// Highest priority (seed 001 §6.1: 100 = safety / emergency stop).
pub const MAX_PRIORITY: u8 = 100;

/// `POST /api/v1/capability-leases/request` body (seed 001 §5.1).
///
/// Exactly one of `capability_id` and `capability_selector` is given. The
/// holder is the authenticated principal; `holder_ref` is checked against it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_selector: Option<CapabilitySelector>,
    pub holder_type: HolderType,
    /// e.g. `audit:multimodal-auditor-01`.
    pub holder_ref: String,
    pub project_id: String,
    pub purpose: String,
    /// 0..=100, see seed 001 §6.1.
    pub priority: u8,
    /// 1..=server maximum, seconds.
    pub requested_duration_seconds: u32,
    #[serde(default)]
    pub evidence_required: bool,
    #[serde(default)]
    pub preempt_if_needed: bool,
    /// Why preemption is justified; must be on the registry's whitelist
    /// (seed 001 §6.2). Required for preemption to happen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_reason: Option<String>,
    /// Exclusive (default) or shared use of a shared capability.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<LeaseMode>,
    /// Give up waiting in the queue after this many seconds (the lease ends
    /// `failed`). Absent: answer at once, queue without limit.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout_seconds: Option<u32>,
}

/// Longest lease `purpose`, characters: it travels in every lease listing
/// and lease event.
pub const MAX_PURPOSE_CHARS: usize = 1_000;
/// Longest `preempt_reason`, characters (the whitelist's entries are short
/// words such as `safety_stop`).
pub const MAX_PREEMPT_REASON_CHARS: usize = 128;

/// `value` is at most `max` characters and has no control characters.
fn check_text(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    let chars = value.chars().count();
    if chars > max {
        return Err(ValidationError::new(
            field,
            format!("is {chars} characters long; at most {max} are allowed"),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(ValidationError::new(
            field,
            "must not contain control characters (line breaks, tabs, NUL ...)",
        ));
    }
    Ok(())
}

fn validate_holder(
    holder_ref: &str,
    project_id: &str,
    purpose: &str,
    preempt_reason: Option<&str>,
    priority: u8,
    duration: u32,
) -> Result<(), ValidationError> {
    check_text("purpose", purpose, MAX_PURPOSE_CHARS)?;
    if let Some(reason) = preempt_reason {
        check_text("preempt_reason", reason, MAX_PREEMPT_REASON_CHARS)?;
    }
    if holder_ref.trim().is_empty() || holder_ref.len() > 256 {
        return Err(ValidationError::new(
            "holder_ref",
            "must be 1 to 256 characters",
        ));
    }
    check_id("project_id", project_id)?;
    check_range("priority", priority, 0, MAX_PRIORITY)?;
    check_range("requested_duration_seconds", duration, 1, 86_400)?;
    Ok(())
}

impl Validate for LeaseRequest {
    fn normalize(&mut self) {
        if let Some(s) = &mut self.capability_selector {
            s.normalize();
        }
    }

    fn validate(&self) -> Result<(), ValidationError> {
        match (&self.capability_id, &self.capability_selector) {
            (Some(id), None) => check_id("capability_id", id)?,
            (None, Some(selector)) => selector
                .validate()
                .map_err(|e| e.within("capability_selector"))?,
            (Some(_), Some(_)) => {
                return Err(ValidationError::new(
                    "capability_selector",
                    "give either capability_id or capability_selector, not both",
                ))
            }
            (None, None) => {
                return Err(ValidationError::new(
                    "capability_id",
                    "one of capability_id or capability_selector is required",
                ))
            }
        }
        validate_holder(
            &self.holder_ref,
            &self.project_id,
            &self.purpose,
            self.preempt_reason.as_deref(),
            self.priority,
            self.requested_duration_seconds,
        )
    }
}

/// `POST /api/v1/capability-leases/request-group`: several capabilities
/// granted all together or not at all (an audit task's
/// `capability_requirements`, seed 001 §13).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseGroupRequest {
    /// Ask for these ids ...
    #[serde(default)]
    pub capability_ids: Vec<String>,
    /// ... and/or capabilities matching these requirements.
    #[serde(default)]
    pub requirements: Vec<CapabilityRequirement>,
    pub holder_type: HolderType,
    pub holder_ref: String,
    pub project_id: String,
    pub purpose: String,
    pub priority: u8,
    pub requested_duration_seconds: u32,
    #[serde(default)]
    pub evidence_required: bool,
    #[serde(default)]
    pub preempt_if_needed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempt_reason: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_timeout_seconds: Option<u32>,
}

impl Validate for LeaseGroupRequest {
    fn normalize(&mut self) {
        self.requirements.iter_mut().for_each(Validate::normalize);
    }

    fn validate(&self) -> Result<(), ValidationError> {
        if self.capability_ids.is_empty() && self.requirements.is_empty() {
            return Err(ValidationError::new(
                "capability_ids",
                "name at least one capability id or requirement",
            ));
        }
        check_count(
            "capability_ids",
            self.capability_ids.len(),
            MAX_GROUP_MEMBERS,
        )?;
        check_count("requirements", self.requirements.len(), MAX_GROUP_MEMBERS)?;
        for (i, id) in self.capability_ids.iter().enumerate() {
            check_id(&format!("capability_ids[{i}]"), id)?;
        }
        validate_each("requirements", &self.requirements)?;
        validate_holder(
            &self.holder_ref,
            &self.project_id,
            &self.purpose,
            self.preempt_reason.as_deref(),
            self.priority,
            self.requested_duration_seconds,
        )
    }
}

/// A lease as the registry stores and returns it (seed 001 §2.2.3, all
/// fields, plus the grouping and bookkeeping a holder needs).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CapabilityLease {
    pub lease_id: String,
    pub capability_id: String,
    pub holder_type: HolderType,
    pub holder_ref: String,
    pub project_id: String,
    pub purpose: String,
    pub priority: u8,
    pub status: LeaseStatus,
    #[schema(value_type = String, format = DateTime)]
    pub requested_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub granted_at: Option<Timestamp>,
    /// Wall-clock rendering of the monotonic deadline.
    #[schema(value_type = Option<String>, format = DateTime)]
    pub expires_at: Option<Timestamp>,
    /// End of the grace period after a preemption request (§6.3).
    #[schema(value_type = Option<String>, format = DateTime)]
    pub grace_until: Option<Timestamp>,
    pub preempt_reason: Option<String>,
    pub evidence_required: bool,
    /// The mode this lease holds the capability in.
    pub mode: LeaseMode,
    /// Set when the lease was granted as part of a group request.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_group_id: Option<String>,
    /// The lease that preempted this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preempted_by: Option<String>,
    /// When the lease reached a final status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ended_at: Option<Timestamp>,
    /// The authenticated principal holding the lease.
    pub principal: String,
    /// The lease's place in the registry's grant order, set when it is
    /// granted: each grant takes the next number, so of two leases of one
    /// capability the larger generation is the later one. Commands to the
    /// bench carry it as their fence (docs/architecture.md "Fencing").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub generation: Option<u64>,
    /// The selector a lease asked for by `capability_selector` was
    /// requested with; absent for a lease asked for by id or by a group
    /// requirement. While such a lease waits (`capability_id: ""`) it says
    /// which capabilities could take it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_selector: Option<CapabilitySelector>,
}

/// Answer to a group request: every lease of the group, all in the same
/// status (`granted` together, or `requested` together).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeaseGroup {
    pub lease_group_id: String,
    pub status: LeaseStatus,
    pub leases: Vec<CapabilityLease>,
}

/// `POST /api/v1/capability-leases/{lease_id}/renew` body (seed 001 §5.2).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseRenewRequest {
    /// New duration from now, seconds; absent: the lease's original duration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_duration_seconds: Option<u32>,
}

impl Validate for LeaseRenewRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        if let Some(d) = self.requested_duration_seconds {
            check_range("requested_duration_seconds", d, 1, 86_400)?;
        }
        Ok(())
    }
}

/// `POST /api/v1/capability-leases/{lease_id}/release` body (seed 001 §5.3).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct LeaseReleaseRequest {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Validate for LeaseReleaseRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        Ok(())
    }
}

/// Sent to the holder (SSE and the provider's command topic) when its lease
/// is asked to give way (seed 001 §6.3 `preempt_requested`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct PreemptNotice {
    pub lease_id: String,
    pub capability_id: String,
    /// The higher-priority lease waiting for the capability.
    pub preempting_lease_id: String,
    pub preempt_reason: String,
    #[schema(value_type = String, format = DateTime)]
    pub grace_until: Timestamp,
}
