//! The HTTP error body shared by every endpoint (DESIGN.md "HTTP API").

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// `{"error": {"code", "message", "details"}}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorBody {
    pub error: ErrorDetail,
}

/// The error itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ErrorDetail {
    /// Stable machine-readable code, e.g. `lease_not_held`, `invalid_field`.
    pub code: String,
    /// One sentence for a person.
    pub message: String,
    /// Structured context, e.g. `{"field": "priority"}` or the lease status.
    #[serde(default)]
    pub details: Value,
}

wire_enum! {
    /// Roles a bearer token is bound to (DESIGN.md "HTTP API").
    pub enum Role {
        SuperAdmin = "super_admin",
        Admin = "admin",
        Operator = "operator",
        AuditAgent = "audit_agent",
        Provider = "provider",
        Viewer = "viewer",
    }
}

/// `GET /api/v1/time`: the registry's clock, for benches that fence
/// commands by it (docs/architecture.md "Fencing").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RegistryTime {
    /// The registry's wall clock when it answered.
    #[schema(value_type = String, format = DateTime)]
    pub now: crate::Timestamp,
    /// The same instant in milliseconds since the Unix epoch.
    pub unix_ms: i64,
}
