//! Sessions: one action executed under a lease (seed 001 §2.2.4).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::capability::CapabilityAction;
use crate::validate::{check_range, Validate, ValidationError};
use crate::Timestamp;

wire_enum! {
    /// Where a session is (seed 001 §2.2.4 `status`; `incomplete_evidence`
    /// is §5.4's state for a session whose evidence never finished uploading).
    pub enum SessionStatus {
        Pending = "pending",
        Running = "running",
        Completed = "completed",
        Failed = "failed",
        Cancelled = "cancelled",
        IncompleteEvidence = "incomplete_evidence",
    }
}

impl SessionStatus {
    /// True once nothing more will happen to the session.
    pub fn is_final(self) -> bool {
        !matches!(self, SessionStatus::Pending | SessionStatus::Running)
    }
}

/// A session as the registry stores and returns it (seed 001 §2.2.4).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CapabilitySession {
    pub session_id: String,
    pub lease_id: String,
    pub capability_id: String,
    pub action: CapabilityAction,
    #[schema(value_type = String, format = DateTime)]
    pub started_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub ended_at: Option<Timestamp>,
    pub status: SessionStatus,
    /// The action's parameters as given when their compact JSON takes at
    /// most 4096 bytes; otherwise a summary of them:
    /// `{"truncated": true, "original_size_bytes": N, "key_count": K,
    /// "keys": [...]}` (N: the parameters' JSON size in bytes; K: how many
    /// top-level keys; `keys`: those keys sorted, as many as fit in 4096
    /// bytes). The provider always gets the whole parameters.
    pub input_summary: Value,
    /// Driver result (e.g. `{"voltage_v": 5.0, "current_a": 0.12}`).
    pub result_summary: Option<Value>,
    /// Artifact ids produced by this session.
    pub artifact_refs: Vec<String>,
    pub error_message: Option<String>,
    /// A provider's report that arrived for an action the bench started
    /// outside its lease (after the lease ended or the command's
    /// `not_after`): kept as it came (`status`, `started_at`,
    /// `result_summary`, `error_message`, `artifact_ids`, `received_at`),
    /// never applied over the registry's verdict (docs/architecture.md
    /// "Fencing"). Absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub late_report: Option<Value>,
}

/// Invoke an action on a leased capability:
/// `POST /api/v1/capability-leases/{lease_id}/actions`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ActionInvokeRequest {
    pub action: CapabilityAction,
    /// Action parameters; each driver documents its own (units in names).
    #[serde(default)]
    pub params: Map<String, Value>,
    /// Wait up to this long for the session to end before answering,
    /// milliseconds (0 = answer at once with the running session).
    #[serde(
        default,
        deserialize_with = "crate::validate::u32_in::<0, MAX_WAIT_MS, _>"
    )]
    pub wait_ms: u32,
    /// The capability; required when the lease covers several.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capability_id: Option<String>,
    /// Deadline for the driver, milliseconds (default 30,000).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "crate::validate::opt_u32_in::<1, MAX_TIMEOUT_MS, _>"
    )]
    pub timeout_ms: Option<u32>,
}

/// Longest `wait_ms` of an action request, milliseconds.
pub const MAX_WAIT_MS: u32 = 300_000;
/// Longest `timeout_ms` of an action request, milliseconds.
pub const MAX_TIMEOUT_MS: u32 = 600_000;

impl Validate for ActionInvokeRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        check_range("wait_ms", self.wait_ms, 0, MAX_WAIT_MS)?;
        if let Some(t) = self.timeout_ms {
            check_range("timeout_ms", t, 1, MAX_TIMEOUT_MS)?;
        }
        // `params` has no entry limit: it is bounded in bytes (the body
        // limit, and the MQTT packet limit of its `action_invoke`), and
        // the session keeps only a summary of a large one.
        Ok(())
    }
}

/// Free-form structured result of a driver action.
pub type ResultSummary = Map<String, Value>;
