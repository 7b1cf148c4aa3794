//! What can go wrong when invoking an action or handling artifact bytes;
//! its HTTP answers are mapped in `api.rs`.

use shared_protocol::capability::{CapabilityAction, LeaseMode};
use shared_protocol::constraints::ConstraintViolation;

use super::blobs::BlobError;
use crate::db::DbError;
use crate::leases::LeaseError;
use crate::providers::StoreError;

/// Why an action was not started or an artifact not taken. Every variant
/// names the lease, capability, provider, action or artifact it is about.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The lease engine refused (not the holder: 403 `not_lease_holder`;
    /// a lease no longer usable: 409 with `details.lease_status`; unknown:
    /// 404).
    #[error(transparent)]
    Lease(#[from] LeaseError),

    /// The capability does not offer `action`. HTTP 422
    /// `unsupported_action`, `details.field = "action"`.
    #[error("capability `{capability_id}` does not support action `{action}`; it supports: {}", .supported.join(", "))]
    UnsupportedAction {
        capability_id: String,
        action: CapabilityAction,
        supported: Vec<String>,
    },

    /// A param of the action is outside a limit the capability's edge
    /// declared in `constraints_json` (docs/policy.md "Device
    /// constraints"). Nothing was sent, no session was stored and no
    /// budget spent. HTTP 422 `constraint_violated`, details `constraint`,
    /// `limit`, `value`, `param`, `capability_id`, `action`.
    #[error("{action} on capability `{capability_id}`: {violation}")]
    ConstraintViolated {
        capability_id: String,
        action: CapabilityAction,
        violation: ConstraintViolation,
    },

    /// A holder of a `shared_stream` lease asked for an action that
    /// changes the device for every holder (docs/policy.md "Shared
    /// stream"). Nothing was sent and no session was stored. HTTP 409
    /// `action_not_allowed_in_shared_lease`, details `action`,
    /// `lease_mode`, `allowed_actions` (those of the capability's type a
    /// shared holder may run), `lease_id`, `capability_id`.
    #[error("lease `{lease_id}` holds capability `{capability_id}` in mode `{mode}`, which allows only captures, streams and reads ({}); `{action}` changes the device for every holder and needs an exclusive lease", .allowed.join(", "))]
    NotAllowedInSharedLease {
        lease_id: String,
        capability_id: String,
        action: CapabilityAction,
        mode: LeaseMode,
        allowed: Vec<String>,
    },

    /// `capability_id` in the request is not the lease's capability.
    /// HTTP 422 `invalid_field`, `details.field = "capability_id"`.
    #[error("lease `{lease_id}` is for capability `{leased}`, not `{requested}`")]
    CapabilityNotLeased {
        lease_id: String,
        leased: String,
        requested: String,
    },

    /// The lease names a capability the registry no longer knows. HTTP 404.
    #[error("capability `{capability_id}` is not registered")]
    UnknownCapability { capability_id: String },

    /// The capability's provider is not connected: nothing was sent and no
    /// session was created. HTTP 503 `provider_offline`.
    #[error(
        "provider `{provider_id}` of capability `{capability_id}` is offline; nothing was sent"
    )]
    ProviderOffline {
        provider_id: String,
        capability_id: String,
    },

    /// Every token of the capability's provider has been revoked: its
    /// bench may no longer act (its evidence could never be uploaded).
    /// Nothing was sent and no session was created. HTTP 403
    /// `provider_credentials_revoked`.
    #[error(
        "the credentials of provider `{provider_id}` (capability `{capability_id}`) have been revoked; nothing was sent"
    )]
    ProviderCredentialsRevoked {
        provider_id: String,
        capability_id: String,
    },

    /// The provider is heard from two instances at once (a copied bench
    /// configuration): an action could land on either bench, so none is
    /// sent. HTTP 409 `provider_conflict`, `details.instances` naming
    /// each instance's host, node and boot id.
    #[error(
        "provider `{provider_id}` of capability `{capability_id}` is connected from {} instances at once ({}); nothing was sent until only one is left",
        instances.len(),
        instances.iter().map(|i| format!("{} / {}", i.hostname, i.node_id)).collect::<Vec<_>>().join(", ")
    )]
    ProviderConflict {
        provider_id: String,
        capability_id: String,
        instances: Vec<shared_protocol::mqtt::ProviderInstance>,
    },

    /// The registry has no MQTT connection, so no command can reach a
    /// provider. HTTP 503 `control_plane_unavailable`.
    #[error("the registry is not connected to the MQTT broker; no command can be sent")]
    ControlPlaneDown,

    /// The `action_invoke` command, encoded for MQTT, would be `size`
    /// bytes, more than the registry's MQTT packet limit `limit` (which
    /// follows `http.body_limit_bytes`, at least 64 KiB): params can grow
    /// when encoded again (`9e9` becomes `9000000000.0`). Nothing was sent
    /// and no session was created. HTTP 413 `command_too_large`.
    #[error("the action command for capability `{capability_id}` would be {size} bytes on MQTT, more than the limit of {limit} bytes; send smaller params")]
    CommandTooLarge {
        capability_id: String,
        size: usize,
        limit: usize,
    },

    /// The action is over one of the lab's action budgets
    /// (`[policy.budgets]`): nothing was sent and no session was created.
    /// HTTP 429 `action_budget_exceeded` with `Retry-After`, details
    /// naming the budget (`budget`, `limit`, `window_seconds`,
    /// `retry_after_seconds`, `capability_type`, `action`).
    #[error(transparent)]
    BudgetExceeded(#[from] crate::budgets::BudgetExceeded),

    /// No session has this id. HTTP 404.
    #[error("session `{session_id}` not found")]
    SessionNotFound { session_id: String },

    /// No artifact has this id. HTTP 404.
    #[error("artifact `{artifact_id}` not found")]
    ArtifactNotFound { artifact_id: String },

    /// Only metadata is known: the bytes have not been uploaded. HTTP 409
    /// `artifact_not_uploaded`.
    #[error("artifact `{artifact_id}` is known, but its bytes have not been uploaded yet")]
    ArtifactNotUploaded { artifact_id: String },

    /// The bytes were received and confirmed, but the artifact store no
    /// longer holds the blob (deleted from the bucket or the directory).
    /// HTTP 500 `artifact_bytes_missing`.
    #[error("artifact `{artifact_id}` was uploaded, but the artifact store no longer holds its bytes (sha256 {checksum}); the registry log has the detail")]
    ArtifactBytesMissing {
        artifact_id: String,
        checksum: String,
    },

    /// The artifact was produced on another provider. HTTP 403
    /// `not_artifact_owner`.
    #[error("artifact `{artifact_id}` belongs to provider `{owner}`, not to `{caller}`")]
    NotArtifactOwner {
        artifact_id: String,
        owner: String,
        caller: String,
    },

    /// The bytes do not hash to what was declared. Nothing was stored.
    /// HTTP 422 `checksum_mismatch` with `details.expected` / `actual`.
    #[error("artifact `{artifact_id}`: {what} sha256 is {expected}, the bytes received hash to {actual}")]
    ChecksumMismatch {
        artifact_id: String,
        /// `X-Checksum-Sha256` or `recorded` (the metadata's checksum).
        what: &'static str,
        expected: String,
        actual: String,
    },

    /// `X-Checksum-Sha256` missing or not 64 hex digits. HTTP 400
    /// `invalid_checksum_header`.
    #[error("header `X-Checksum-Sha256` must carry the sha256 of the body as 64 hex digits")]
    BadChecksumHeader,

    /// The body is longer than `sessions.max_artifact_bytes`. HTTP 413
    /// `body_too_large`.
    #[error("artifact `{artifact_id}` is larger than the registry's limit of {limit} bytes")]
    TooLarge { artifact_id: String, limit: u64 },

    /// Bytes for an artifact whose metadata is unknown, from a provider
    /// that already holds `held` bytes no artifact binds and is sending
    /// `in_flight` more in other such uploads: with `incoming` more (the
    /// declared length; `max_artifact_bytes` when not declared) it would be
    /// over `limit` (`sessions.max_unbound_bytes_per_provider`). Nothing
    /// was read or stored. HTTP 409 `unbound_upload_limit`.
    #[error("provider `{provider_id}` already holds {held} bytes of uploads that no artifact metadata names (and is sending {in_flight} more in other uploads); {incoming} more for artifact `{artifact_id}` would exceed the limit of {limit} bytes{hint}; send the session update with the metadata first, or retry once earlier uploads are bound")]
    UnboundLimit {
        provider_id: String,
        artifact_id: String,
        held: u64,
        in_flight: u64,
        incoming: u64,
        limit: u64,
        /// Empty, or why `incoming` is not the body's size (no
        /// `Content-Length`).
        hint: &'static str,
    },

    /// The client stopped sending mid-body. HTTP 400 `upload_interrupted`.
    #[error("upload of artifact `{artifact_id}` broke off after {received} bytes: {message}")]
    Interrupted {
        artifact_id: String,
        received: u64,
        message: String,
    },

    /// `Content-Range` is not `bytes START-END/TOTAL` with START <= END <
    /// TOTAL, or the body's length does not match it. HTTP 400
    /// `invalid_content_range`.
    #[error("header `Content-Range`: {0}")]
    BadContentRange(String),

    /// A ranged PUT starts elsewhere than at the end of the bytes held.
    /// HTTP 409 `upload_offset_mismatch` with `details.received_bytes`.
    #[error("artifact `{artifact_id}`: the registry holds {held} bytes of this upload; a ranged PUT must start at 0 or at {held}, not at {start}")]
    OffsetMismatch {
        artifact_id: String,
        held: u64,
        start: u64,
    },

    /// Another ranged PUT of the same upload is being received. HTTP 409
    /// `upload_in_progress`.
    #[error("artifact `{artifact_id}`: another ranged PUT of these bytes is in progress; ask `GET …/content/upload-status` and continue once it ended")]
    UploadBusy { artifact_id: String },

    /// The provider's unfinished resumable uploads (`held` bytes) and this
    /// one (`incoming`, its TOTAL) would exceed `limit`
    /// (`sessions.max_partial_bytes_per_provider`). HTTP 409
    /// `partial_upload_limit`.
    #[error("artifact `{artifact_id}`: the registry keeps {held} bytes of this provider's unfinished uploads; {incoming} more would exceed the limit of {limit} bytes; finish or abandon earlier uploads")]
    PartialLimit {
        artifact_id: String,
        held: u64,
        incoming: u64,
        limit: u64,
    },

    /// Blob storage failed. HTTP 500.
    #[error("blob store: {0}")]
    Blob(#[from] BlobError),

    /// The database failed. HTTP 500.
    #[error("store: {0}")]
    Store(String),
}

impl From<DbError> for SessionError {
    fn from(e: DbError) -> Self {
        SessionError::Store(e.to_string())
    }
}

impl From<rusqlite::Error> for SessionError {
    fn from(e: rusqlite::Error) -> Self {
        SessionError::Store(e.to_string())
    }
}

impl From<StoreError> for SessionError {
    fn from(e: StoreError) -> Self {
        SessionError::Store(e.to_string())
    }
}
