//! What can go wrong with a lease operation; its HTTP answers are
//! mapped in `api.rs`.

use shared_protocol::lease::LeaseStatus;

use crate::db::DbError;

/// Why the lease engine refused or could not do an operation. Every variant
/// names the lease, capability or field it is about; variants about an
/// existing lease carry its current status.
#[derive(Debug, thiserror::Error)]
pub enum LeaseError {
    /// No lease has this id. HTTP 404.
    #[error("lease `{lease_id}` not found")]
    NotFound { lease_id: String },

    /// The lease belongs to another principal (only the holder may renew,
    /// act or release; an admin may also release). HTTP 403.
    #[error("lease `{lease_id}` is held by `{holder}`, not by `{principal}`")]
    NotHolder {
        lease_id: String,
        /// The caller.
        principal: String,
        /// The principal holding the lease.
        holder: String,
    },

    /// The lease's status does not allow `operation` (e.g. renewing during a
    /// grace period, acting on a lease still `requested`, releasing a
    /// revoked lease). HTTP 409 with `details.lease_status`.
    #[error("lease `{lease_id}` is `{status}`: cannot {operation}")]
    NotUsable {
        lease_id: String,
        status: LeaseStatus,
        /// `renew`, `act`, `release`.
        operation: &'static str,
    },

    /// The lease has expired (its TTL ran out without renewal). HTTP 409
    /// with `details.lease_status = "expired"`.
    #[error("lease `{lease_id}` has expired")]
    Expired { lease_id: String },

    /// The request names a capability the registry does not know. HTTP 404.
    #[error("capability `{capability_id}` is not registered")]
    UnknownCapability { capability_id: String },

    /// Every capability the request could use belongs to an offline
    /// provider. HTTP 503.
    #[error("capability {} is offline (its provider is not connected)", .capability_ids.join(", "))]
    CapabilityOffline { capability_ids: Vec<String> },

    /// An admin put the capability into maintenance (docs/policy.md
    /// "Maintenance"): nothing is granted on it until it is taken out.
    /// HTTP 409 `capability_in_maintenance`.
    #[error("capability `{capability_id}` is in maintenance{}", reason_suffix(.reason))]
    CapabilityInMaintenance {
        capability_id: String,
        /// What the admin gave (empty when none is known).
        reason: String,
    },

    /// The capability's provider reports it `unhealthy` and the request
    /// asked not to wait (`queue_timeout_seconds: 0`; docs/policy.md
    /// "Health gating"). HTTP 503 `capability_unhealthy`.
    #[error("capability {} is unhealthy; the request asked not to wait", .capability_ids.join(", "))]
    CapabilityUnhealthy { capability_ids: Vec<String> },

    /// The lab's principal policy refuses the request (docs/policy.md
    /// "Principal policy"). HTTP 403 `policy_denied` with `details.rule`
    /// (e.g. `roles.audit_agent.max_priority`), `details.limit` and
    /// `details.value` (what was asked).
    #[error("{message}")]
    PolicyDenied {
        rule: String,
        limit: serde_json::Value,
        value: serde_json::Value,
        message: String,
    },

    /// The capability cannot be removed while leases hold it or wait for
    /// it by id. HTTP 409 `capability_leased`.
    #[error("capability `{capability_id}` has live leases ({}); release them first", .lease_ids.join(", "))]
    CapabilityInUse {
        capability_id: String,
        lease_ids: Vec<String>,
    },

    /// No registered capability matches the selector or requirement given
    /// in `field`. HTTP 404.
    #[error("no registered capability matches `{field}`: {selector}")]
    NoMatchingCapability {
        /// `capability_selector` or `requirements[i]`.
        field: String,
        /// The selector as JSON.
        selector: String,
    },

    /// The request would have to wait and `limit` requests already do.
    /// HTTP 503.
    #[error("{limit} lease requests are already waiting; try again later")]
    QueueFull { limit: usize },

    /// A field breaks a rule (duration above the maximum, `holder_ref` not
    /// the caller's, a mode the capability does not offer...). HTTP 422
    /// naming the field.
    #[error("{field}: {message}")]
    InvalidRequest { field: String, message: String },

    /// The engine is shut down, or recovering from a failed commit; nothing
    /// was changed. HTTP 503.
    #[error("the lease engine is unavailable: {message}")]
    Unavailable { message: String },

    /// The request's idempotency key was used before by the same principal
    /// for a request that asked for something else. HTTP 422
    /// `idempotency_key_reused`; nothing is requested.
    #[error("Idempotency-Key `{key}` was used for another lease request; use a new key for a new request")]
    IdempotencyKeyReused { key: String },

    /// Reading the lease store failed. HTTP 500.
    #[error("lease store: {0}")]
    Store(#[from] DbError),
}

impl LeaseError {
    /// The current status of the lease the error is about, when it has one.
    pub fn lease_status(&self) -> Option<LeaseStatus> {
        match self {
            LeaseError::NotUsable { status, .. } => Some(*status),
            LeaseError::Expired { .. } => Some(LeaseStatus::Expired),
            _ => None,
        }
    }

    /// The refusal for `operation` on a lease that is in `status`:
    /// [`LeaseError::Expired`] for `expired`, [`LeaseError::NotUsable`]
    /// otherwise.
    pub(crate) fn status(lease_id: &str, status: LeaseStatus, operation: &'static str) -> Self {
        if status == LeaseStatus::Expired {
            LeaseError::Expired {
                lease_id: lease_id.to_string(),
            }
        } else {
            LeaseError::NotUsable {
                lease_id: lease_id.to_string(),
                status,
                operation,
            }
        }
    }

    /// `field`'s `value` lies outside the range the registry enforces:
    /// "{value} is out of range {min}..={max}" (the wording of
    /// [`shared_protocol::validate::check_range`]), followed by ` ({why})`
    /// when the range has a reason to give, e.g. the configured maximum
    /// lease. HTTP 422 `invalid_field` naming the field.
    pub fn out_of_range(
        field: impl Into<String>,
        value: impl std::fmt::Display,
        min: impl std::fmt::Display,
        max: impl std::fmt::Display,
        why: Option<&str>,
    ) -> Self {
        let mut message = format!("{value} is out of range {min}..={max}");
        if let Some(why) = why {
            message.push_str(&format!(" ({why})"));
        }
        LeaseError::InvalidRequest {
            field: field.into(),
            message,
        }
    }

    pub(crate) fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        LeaseError::InvalidRequest {
            field: field.into(),
            message: message.into(),
        }
    }
}

fn reason_suffix(reason: &str) -> String {
    if reason.is_empty() {
        String::new()
    } else {
        format!(": {reason}")
    }
}

impl From<rusqlite::Error> for LeaseError {
    fn from(e: rusqlite::Error) -> Self {
        LeaseError::Store(DbError::Sqlite(e))
    }
}

impl From<shared_protocol::ValidationError> for LeaseError {
    fn from(e: shared_protocol::ValidationError) -> Self {
        LeaseError::InvalidRequest {
            field: e.field,
            message: e.message,
        }
    }
}
