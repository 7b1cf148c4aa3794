//! Bodies and answers of the audit-task API that the seed does not define
//! itself: claims, the stored request with its queue state, list filters,
//! threads and messages. The seed's own types (`AuditTaskRequest`,
//! `AuditTaskResult`, `Finding`) are in `shared_protocol::audit`.

use serde::{Deserialize, Serialize};
use serde_json::Value;
use shared_protocol::audit::{
    AuditDecision, AuditRequestStatus, AuditResultStatus, AuditTaskRequest, AuditTaskResult,
    AuditType,
};
use shared_protocol::capability::CapabilityType;
use shared_protocol::lease::CapabilityLease;
use shared_protocol::validate::{check_id, check_range, Validate, ValidationError};
use shared_protocol::Timestamp;

/// Longest `reason`, `role`, `kind` and label texts, characters.
const SHORT_TEXT: usize = 256;

fn check_text(field: &str, value: &str, max: usize) -> Result<(), ValidationError> {
    if value.trim().is_empty() || value.chars().count() > max {
        return Err(ValidationError::new(
            field,
            format!("must be 1 to {max} characters"),
        ));
    }
    Ok(())
}

/// `POST /api/v1/audit-requests/claim` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ClaimRequest {
    /// Audit types this agent can run (at least one).
    pub audit_types: Vec<AuditType>,
    /// Who works on the task: the caller's principal name or
    /// `<principal>:<instance>`; becomes the `holder_ref` of its leases.
    pub agent_ref: String,
    /// Wait up to this long for claimable work, milliseconds (0 = answer
    /// at once; cut to `max_claim_wait_ms`).
    #[serde(default)]
    pub wait_ms: u64,
}

impl Validate for ClaimRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        if self.audit_types.is_empty() {
            return Err(ValidationError::new(
                "audit_types",
                "name at least one audit type",
            ));
        }
        check_text("agent_ref", &self.agent_ref, SHORT_TEXT)
    }
}

/// `POST /api/v1/audit-requests/{id}/extend` body (may be empty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ExtendRequest {
    /// New deadline = now + this, seconds (1..=86 400); absent: the claim's
    /// visibility timeout.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "shared_protocol::validate::opt_u32_in::<1, 86_400, _>"
    )]
    pub extend_seconds: Option<u32>,
}

impl Validate for ExtendRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        if let Some(s) = self.extend_seconds {
            check_range("extend_seconds", s, 1, 86_400)?;
        }
        Ok(())
    }
}

/// `POST /api/v1/audit-requests/{id}/release` body (may be empty).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReleaseRequest {
    /// Why the agent gives the task back (kept on the event).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

impl Validate for ReleaseRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        if let Some(r) = &self.reason {
            check_text("reason", r, 1000)?;
        }
        Ok(())
    }
}

shared_protocol::wire_enum! {
    /// How a claim ended.
    pub enum ClaimEndReason {
        /// A final result was accepted.
        Completed = "completed",
        /// A `needs_retry` result was accepted; the request went back.
        NeedsRetry = "needs_retry",
        /// The holder gave it back (`POST …/release`).
        ReleasedByAgent = "released_by_agent",
        /// An admin took it back.
        ReleasedByAdmin = "released_by_admin",
        /// The visibility timeout ran out.
        VisibilityTimeout = "visibility_timeout",
    }
}

/// One claim: a request handed to one agent until `expires_at`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClaimInfo {
    /// `claim_` and 32 hex digits.
    pub claim_id: String,
    pub audit_request_id: String,
    /// 1 for the first claim of the request.
    pub attempt: u32,
    /// The claiming principal (token name).
    pub principal: String,
    pub agent_ref: String,
    #[schema(value_type = String, format = DateTime)]
    pub claimed_at: Timestamp,
    /// The visibility deadline; `POST …/extend` moves it.
    #[schema(value_type = String, format = DateTime)]
    pub expires_at: Timestamp,
    /// The claim's visibility timeout, seconds.
    pub visibility_timeout_seconds: u32,
    /// The lease group granted with the claim (requests with
    /// `capability_requirements`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_group_id: Option<String>,
    /// Its leases, in the order of `capability_requirements`.
    #[serde(default)]
    pub lease_ids: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ended_at: Option<Timestamp>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_reason: Option<ClaimEndReason>,
}

/// Which capability a lease of the claim serves.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct LeaseAssignment {
    /// Index into the request's `capability_requirements`.
    pub requirement_index: usize,
    pub capability_type: CapabilityType,
    pub capability_id: String,
    pub lease_id: String,
}

/// A dependency of a chief request as the chief agent reads it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct SubResult {
    pub audit_request_id: String,
    pub audit_type: AuditType,
    /// `completed`, or `failed` when it ran out of attempts.
    pub request_status: AuditRequestStatus,
    pub attempts: u32,
    /// The accepted result (for a failed request: its last result, if any).
    pub result: Option<AuditTaskResult>,
}

/// Answer of a successful claim (HTTP 200; no work is HTTP 204).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ClaimedTask {
    pub claim: ClaimInfo,
    /// The request as created; for a chief, `software_audit_result`,
    /// `hardware_audit_result` and `multimodal_audit_result` are filled
    /// from the stored results of its `depends_on`.
    pub request: AuditTaskRequest,
    /// Leases granted with the claim, in the order of
    /// `request.capability_requirements` (`leases[i]` serves requirement
    /// `i`).
    #[serde(default)]
    pub leases: Vec<CapabilityLease>,
    /// The same leases by capability type.
    #[serde(default)]
    pub assignments: Vec<LeaseAssignment>,
    /// Chief requests: every dependency with its result.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub sub_results: Vec<SubResult>,
}

/// Answer of `POST …/extend`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ExtendedClaim {
    pub claim: ClaimInfo,
    /// The claim's leases after renewal (a lease that could not be renewed,
    /// e.g. during a preemption grace period, is shown as it is).
    #[serde(default)]
    pub leases: Vec<CapabilityLease>,
}

/// A stored audit request with its queue state
/// (`GET /api/v1/audit-requests/{id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditRequestRecord {
    /// The request as created (`created_at` filled in when it was absent).
    pub request: AuditTaskRequest,
    pub status: AuditRequestStatus,
    /// Claims so far.
    pub attempts: u32,
    pub max_attempts: u32,
    /// Principal that created it.
    pub created_by: String,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
    /// The live claim, while `claimed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub claim: Option<ClaimInfo>,
    /// Chief requests: dependencies that are not final yet. Then, for a
    /// queued request with capability requirements, one readable line per
    /// requirement that cannot be served now (held by which lease until
    /// when, offline), or "no agent has claimed it yet".
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub waiting_on: Vec<String>,
    /// The latest stored result's status and decision.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result_status: Option<AuditResultStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<AuditDecision>,
    /// Why it is `failed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_reason: Option<String>,
}

/// Order of `GET /api/v1/audit-requests`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum ListOrder {
    /// Claim order: highest priority first, then oldest.
    #[default]
    Queue,
    /// Newest first.
    Newest,
}

/// Filter of `GET /api/v1/audit-requests`; every given field must match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditRequestFilter {
    pub status: Option<AuditRequestStatus>,
    pub audit_type: Option<AuditType>,
    pub project_id: Option<String>,
    /// Inclusive bounds, 0..=100.
    pub priority_min: Option<u8>,
    pub priority_max: Option<u8>,
    pub order: ListOrder,
    /// Page size (default 50, at most 500).
    pub limit: u32,
    pub offset: u32,
}

/// One page of `GET /api/v1/audit-requests`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AuditRequestPage {
    pub audit_requests: Vec<AuditRequestRecord>,
    /// Matching requests in all pages.
    pub total: u64,
    pub limit: u32,
    pub offset: u32,
}

/// `POST /api/v1/threads` body: a worker or agent thread (seed 001 §14
/// `thread_registry`). Registering an existing `thread_ref` updates it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ThreadRegistration {
    /// `<node>:<thread>`, e.g. `mac-01:thread-ui-22`.
    pub thread_ref: String,
    /// The machine it runs on, e.g. `mac-01`; when `thread_ref` has a
    /// `<node>:` prefix it must be this node.
    pub node_id: String,
    /// What it does, e.g. `worker`, `ui`, `audit`, `release-manager`.
    pub role: String,
    #[serde(default)]
    pub labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
}

impl Validate for ThreadRegistration {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("thread_ref", &self.thread_ref)?;
        check_id("node_id", &self.node_id)?;
        if let Some((node, _)) = self.thread_ref.split_once(':') {
            if node != self.node_id {
                return Err(ValidationError::new(
                    "node_id",
                    format!(
                        "thread `{}` is on node `{node}`, not `{}`",
                        self.thread_ref, self.node_id
                    ),
                ));
            }
        }
        check_text("role", &self.role, 64)?;
        for (i, l) in self.labels.iter().enumerate() {
            check_text(&format!("labels[{i}]"), l, 64)?;
        }
        if let Some(d) = &self.display_name {
            check_text("display_name", d, SHORT_TEXT)?;
        }
        if let Some(p) = &self.project_id {
            check_id("project_id", p)?;
        }
        Ok(())
    }
}

/// A registered thread.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ThreadRecord {
    pub thread_ref: String,
    pub node_id: String,
    pub role: String,
    pub labels: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub project_id: Option<String>,
    /// Principal that last registered it.
    pub registered_by: String,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
}

/// Filter of `GET /api/v1/threads`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ThreadFilter {
    pub node_id: Option<String>,
    pub role: Option<String>,
    pub label: Option<String>,
}

/// `POST /api/v1/threads/{thread_ref}/messages` body (seed 001 §14
/// `inter_thread_messages`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MessagePost {
    /// The sending thread, when a thread sends (must be registered).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_thread_ref: Option<String>,
    /// What the message is, e.g. `note`, `question`, `handoff`. The registry
    /// itself sends `audit_completed` and `audit_handoff`.
    pub kind: String,
    /// The audit request it is about (must exist).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_request_id: Option<String>,
    /// Free JSON.
    #[serde(default)]
    pub body: Value,
}

impl Validate for MessagePost {
    fn validate(&self) -> Result<(), ValidationError> {
        if let Some(f) = &self.from_thread_ref {
            check_id("from_thread_ref", f)?;
        }
        check_id("kind", &self.kind)?;
        if let Some(a) = &self.audit_request_id {
            check_id("audit_request_id", a)?;
        }
        Ok(())
    }
}

/// A message in a thread's inbox.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ThreadMessage {
    /// Increases by one per message, registry-wide (`?after=` pages on it).
    pub message_id: u64,
    pub to_thread_ref: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from_thread_ref: Option<String>,
    /// Principal that sent it (`system:audit-queue` for the registry).
    pub sender: String,
    pub kind: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_request_id: Option<String>,
    pub body: Value,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
}
