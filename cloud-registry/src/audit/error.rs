//! What can go wrong with an audit-task operation; its HTTP answers are
//! mapped in `api.rs`.

use shared_protocol::api::Role;
use shared_protocol::audit::AuditRequestStatus;
use shared_protocol::ValidationError;

use super::model::ClaimEndReason;
use crate::db::DbError;
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

    /// Several fields break rules; all are listed. HTTP 422
    /// `invalid_field` with `details.field` the first and
    /// `details.errors` every `{field, message}`.
    #[error("{}", errors.iter().map(|(f, m)| format!("{f}: {m}")).collect::<Vec<_>>().join("; "))]
    InvalidFields { errors: Vec<(String, String)> },

    /// A capability requirement no registered capability could ever
    /// serve (type, mode, preferred tags without fallback). HTTP 422
    /// `unsatisfiable_requirement`, `details.requirements` listing each.
    #[error("{} capability requirement(s) cannot be met by any registered capability: {}",
        failing.len(),
        failing.iter().map(|f| format!("[{}] {}", f.requirement_index, f.reason)).collect::<Vec<_>>().join("; "))]
    Unsatisfiable {
        failing: Vec<UnsatisfiableRequirement>,
    },

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

    /// Only a queued request can be cancelled. HTTP 409 `not_queued`.
    #[error("audit request `{audit_request_id}` is `{status}`, not queued")]
    NotQueued {
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

/// One requirement of [`AuditError::Unsatisfiable`].
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct UnsatisfiableRequirement {
    /// Index in `capability_requirements`.
    pub requirement_index: usize,
    /// Why nothing matches, naming the capabilities that come closest,
    /// e.g. "no microphone offers exclusive; mic-01 is shared_read".
    pub reason: String,
}

impl AuditError {
    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        AuditError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }

    /// One error for `errors`: itself when it is the only one, else
    /// [`AuditError::InvalidFields`] of the `Invalid` ones (any other kind
    /// is returned as is, first).
    pub(crate) fn fields(mut errors: Vec<AuditError>) -> Self {
        if errors.len() == 1 {
            return errors.remove(0);
        }
        let mut fields = Vec::with_capacity(errors.len());
        for e in errors {
            match e {
                AuditError::Invalid { field, message } => fields.push((field, message)),
                other => return other,
            }
        }
        AuditError::InvalidFields { errors: fields }
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
