//! What can go wrong with an audit-task operation, and how each failure is
//! told to an HTTP client.

use axum::http::StatusCode;
use serde_json::json;
use shared_protocol::api::Role;
use shared_protocol::audit::AuditRequestStatus;
use shared_protocol::ValidationError;

use super::model::ClaimEndReason;
use crate::db::DbError;
use crate::error::ApiError;
use crate::leases::LeaseError;

/// Why an audit-task operation was refused or failed. Every variant names
/// the request, claim, thread or field it is about.
#[derive(Debug, thiserror::Error)]
pub enum AuditError {
    /// The caller's role may not do this. HTTP 403 `forbidden`.
    #[error("role `{role}` may not {action}; allowed: {}", allowed.join(", "))]
    Forbidden {
        role: Role,
        action: &'static str,
        allowed: Vec<&'static str>,
    },

    /// Unknown audit request, thread, ... HTTP 404 `not_found`.
    #[error("{kind} `{id}` not found")]
    NotFound { kind: &'static str, id: String },

    /// The request has no stored result yet. HTTP 404 `no_result`.
    #[error("audit request `{audit_request_id}` has no result yet (status `{status}`)")]
    NoResult {
        audit_request_id: String,
        status: AuditRequestStatus,
    },

    /// An audit request with this id exists. HTTP 409
    /// `duplicate_audit_request`.
    #[error("audit request `{audit_request_id}` already exists")]
    Duplicate { audit_request_id: String },

    /// A field breaks a rule. HTTP 422 `invalid_field` naming the field.
    #[error("{field}: {message}")]
    Invalid { field: String, message: String },

    /// The caller does not hold the request's claim. HTTP 403
    /// `not_claim_holder`.
    #[error("`{principal}` does not hold a claim on audit request `{audit_request_id}`")]
    NotClaimHolder {
        audit_request_id: String,
        principal: String,
    },

    /// The caller's claim ran past its visibility timeout; the request
    /// goes (or went) back to the queue. HTTP 409 `claim_expired`.
    #[error("claim `{claim_id}` on audit request `{audit_request_id}` expired at {expired_at}")]
    ClaimExpired {
        audit_request_id: String,
        claim_id: String,
        expired_at: shared_protocol::Timestamp,
    },

    /// The caller's claim already ended otherwise (released, result
    /// given). HTTP 409 `claim_ended`.
    #[error("claim `{claim_id}` on audit request `{audit_request_id}` has ended ({reason})")]
    ClaimEnded {
        audit_request_id: String,
        claim_id: String,
        reason: ClaimEndReason,
    },

    /// The request is not claimed (release or extend by an admin of a
    /// request in another state). HTTP 409 `not_claimed`.
    #[error("audit request `{audit_request_id}` is `{status}`, not claimed")]
    NotClaimed {
        audit_request_id: String,
        status: AuditRequestStatus,
    },

    /// The lease engine refused or failed (see [`LeaseError`]'s mapping).
    #[error(transparent)]
    Lease(#[from] LeaseError),

    /// The store failed. HTTP 500.
    #[error("audit store: {0}")]
    Db(#[from] DbError),

    /// The store failed. HTTP 500.
    #[error("audit store: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

impl AuditError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        AuditError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    pub(crate) fn not_found(kind: &'static str, id: impl Into<String>) -> Self {
        AuditError::NotFound {
            kind,
            id: id.into(),
        }
    }
}

impl From<ValidationError> for AuditError {
    fn from(e: ValidationError) -> Self {
        AuditError::Invalid {
            field: e.field,
            message: e.message,
        }
    }
}

impl From<AuditError> for ApiError {
    /// 403 `forbidden` / `not_claim_holder`, 404 `not_found` / `no_result`,
    /// 409 `duplicate_audit_request` / `claim_expired` / `claim_ended` /
    /// `not_claimed`, 422 `invalid_field` with `details.field`, the lease
    /// engine's own codes, 500 for the store.
    fn from(e: AuditError) -> Self {
        let message = e.to_string();
        match e {
            AuditError::Forbidden { role, allowed, .. } => ApiError::forbidden(message)
                .with_details(json!({ "role": role, "allowed_roles": allowed })),
            AuditError::NotFound { kind, id } => ApiError::not_found(kind, &id),
            AuditError::NoResult {
                audit_request_id,
                status,
            } => ApiError::new(StatusCode::NOT_FOUND, "no_result", message)
                .with_details(json!({ "audit_request_id": audit_request_id, "status": status })),
            AuditError::Duplicate { audit_request_id } => {
                ApiError::conflict("duplicate_audit_request", message)
                    .with_details(json!({ "audit_request_id": audit_request_id }))
            }
            AuditError::Invalid { field, message } => {
                ApiError::invalid_field(&field, format!("{field}: {message}"))
            }
            AuditError::NotClaimHolder {
                audit_request_id,
                principal,
            } => ApiError::new(StatusCode::FORBIDDEN, "not_claim_holder", message).with_details(
                json!({ "audit_request_id": audit_request_id, "principal": principal }),
            ),
            AuditError::ClaimExpired {
                audit_request_id,
                claim_id,
                expired_at,
            } => ApiError::conflict("claim_expired", message).with_details(json!({
                "audit_request_id": audit_request_id,
                "claim_id": claim_id,
                "expired_at": expired_at,
            })),
            AuditError::ClaimEnded {
                audit_request_id,
                claim_id,
                reason,
            } => ApiError::conflict("claim_ended", message).with_details(json!({
                "audit_request_id": audit_request_id,
                "claim_id": claim_id,
                "end_reason": reason,
            })),
            AuditError::NotClaimed {
                audit_request_id,
                status,
            } => ApiError::conflict("not_claimed", message)
                .with_details(json!({ "audit_request_id": audit_request_id, "status": status })),
            AuditError::Lease(e) => e.into(),
            AuditError::Db(e) => ApiError::internal(e),
            AuditError::Sqlite(e) => ApiError::internal(e),
        }
    }
}
