//! The registry's store of providers, capabilities and their health history
//! (seed 001 §14 tables `capability_providers`, `capabilities`,
//! `capability_health_snapshots`).
//!
//! [`ProviderStore`] is the interface the HTTP handlers and the MQTT ingest use; no
//! SQL lives outside its implementations. [`sqlite::SqliteProviderStore`] is the
//! default; the trait is shaped so a PostgreSQL implementation can follow:
//! every operation is one call that owns its transaction, takes owned
//! values, and returns the events it appended in that same transaction (the
//! caller publishes them on the live bus after the call returns, i.e. after
//! commit).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use shared_protocol::capability::{
    Capability, CapabilityRegistration, CapabilityStatus, CapabilityType, HealthStatus,
};
use shared_protocol::event::CapabilityEvent;
use shared_protocol::provider::{
    CapabilityProvider, HeartbeatRequest, OnlineStatus, ProviderRegisterRequest,
};
use shared_protocol::Timestamp;

/// Errors of a store operation.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// `kind` `id` does not exist (e.g. `provider`, `provider-lab-01`).
    #[error("{kind} `{id}` not found")]
    NotFound { kind: &'static str, id: String },
    /// The operation contradicts stored state (e.g. a capability id that
    /// belongs to another provider).
    #[error("{message}")]
    Conflict {
        code: &'static str,
        message: String,
        details: Value,
    },
    /// The backend failed (I/O, SQL, a corrupt row).
    #[error("store backend: {0}")]
    Backend(String),
}

impl From<crate::db::DbError> for StoreError {
    fn from(e: crate::db::DbError) -> Self {
        StoreError::Backend(e.to_string())
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Backend(e.to_string())
    }
}

/// Result of a store operation.
pub type StoreResult<T> = Result<T, StoreError>;

/// One row of `capability_health_snapshots`: a capability's health at one
/// instant (`GET /api/v1/capabilities/{id}/health-history`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct HealthSnapshot {
    /// Increases with every row.
    pub snapshot_id: u64,
    pub capability_id: String,
    pub provider_id: String,
    pub health_status: HealthStatus,
    /// The capability's stored status then (`available`, `offline`,
    /// `maintenance`).
    pub status: CapabilityStatus,
    /// The provider's explanation, when it gave one.
    pub message: Option<String>,
    /// Readings the provider reported (e.g. `output_voltage_v`).
    pub metrics: Option<Map<String, Value>>,
    #[schema(value_type = String, format = DateTime)]
    pub recorded_at: Timestamp,
}

/// A capability whose health or status changed.
#[derive(Debug, Clone, PartialEq)]
pub struct HealthChange {
    pub capability_id: String,
    pub previous_health_status: HealthStatus,
    pub health_status: HealthStatus,
    pub previous_status: CapabilityStatus,
    pub status: CapabilityStatus,
}

/// What [`ProviderStore::register_provider`] did.
#[derive(Debug, Clone)]
pub struct ProviderRegistered {
    pub provider: CapabilityProvider,
    /// False for a first registration.
    pub was_known: bool,
    /// The boot id stored before this registration.
    pub previous_boot_id: Option<String>,
    /// The provider had been offline (or was new) and is online now.
    pub came_online: bool,
    /// Its capabilities that went from `offline` to `available`.
    pub changes: Vec<HealthChange>,
    /// `provider_registered`, then one `capability_health_changed` per change.
    pub events: Vec<CapabilityEvent>,
}

impl ProviderRegistered {
    /// True when a known provider came back with a different boot id: the
    /// edge daemon restarted, so its old sessions cannot finish.
    pub fn restarted(&self) -> bool {
        boot_changed(
            self.previous_boot_id.as_deref(),
            self.provider.boot_id.as_deref(),
        )
    }
}

/// True when a stored boot id is replaced by a different one.
pub fn boot_changed(previous: Option<&str>, now: Option<&str>) -> bool {
    matches!((previous, now), (Some(a), Some(b)) if a != b)
}

/// What [`ProviderStore::register_capabilities`] did.
#[derive(Debug, Clone)]
pub struct CapabilitiesRegistered {
    /// The stored capabilities, in request order.
    pub capabilities: Vec<Capability>,
    /// Whether the provider is online (for the lease engine).
    pub provider_online: bool,
    /// One `capability_registered` per capability.
    pub events: Vec<CapabilityEvent>,
}

/// What [`ProviderStore::record_heartbeat`] did.
#[derive(Debug, Clone)]
pub struct HeartbeatRecorded {
    pub provider_id: String,
    /// The provider had been offline and is online again.
    pub came_online: bool,
    /// The boot id stored before this heartbeat.
    pub previous_boot_id: Option<String>,
    /// The boot id stored now.
    pub boot_id: Option<String>,
    pub changes: Vec<HealthChange>,
    /// Rows written to `capability_health_snapshots` (bounded by the
    /// minimum interval unless health or status changed).
    pub snapshots_written: usize,
    /// Reported capability ids that are not this provider's (ignored).
    pub unknown_capabilities: Vec<String>,
    /// Every capability id of this provider (running sessions naming
    /// others are ignored by the caller).
    pub capability_ids: Vec<String>,
    /// One `capability_health_changed` per change.
    pub events: Vec<CapabilityEvent>,
}

/// What [`ProviderStore::set_provider_online`] did.
#[derive(Debug, Clone)]
pub struct OnlineTransition {
    pub provider_id: String,
    /// False when the provider already had that status (nothing written).
    pub changed: bool,
    /// The boot id stored before the call.
    pub previous_boot_id: Option<String>,
    /// Every capability of the provider (the lease engine is told about
    /// each).
    pub capability_ids: Vec<String>,
    pub changes: Vec<HealthChange>,
    pub events: Vec<CapabilityEvent>,
}

/// What [`ProviderStore::set_maintenance`] did.
#[derive(Debug, Clone)]
pub struct MaintenanceChange {
    /// Every named capability as stored now (also those already in the
    /// asked state).
    pub capabilities: Vec<Capability>,
    /// One `capability_maintenance_started` or `_ended` per capability
    /// whose status changed.
    pub events: Vec<CapabilityEvent>,
}

/// `GET /api/v1/capability-providers` filters.
#[derive(Debug, Clone, Default)]
pub struct ProviderFilter {
    pub online_status: Option<OnlineStatus>,
}

/// `GET /api/v1/capabilities` filters; each given field must match.
#[derive(Debug, Clone, Default)]
pub struct CapabilityFilter {
    pub capability_type: Option<CapabilityType>,
    pub provider_id: Option<String>,
    /// A stored status (`available`, `offline`, `maintenance`); `leased` is
    /// derived from the lease engine by the API layer.
    pub status: Option<CapabilityStatus>,
    /// The capability carries this tag.
    pub tag: Option<String>,
}

/// Counts for `/metrics` and `/healthz`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StoreCounts {
    pub providers_total: u64,
    pub providers_online: u64,
    pub capabilities_total: u64,
    pub health_snapshots_total: u64,
}

/// Storage of providers, capabilities and health history. Implementations
/// append the events of a change in the same transaction as the change and
/// return them; they never publish.
#[async_trait::async_trait]
pub trait ProviderStore: Send + Sync + 'static {
    /// Cheap round trip to the backend (`/healthz`).
    async fn ping(&self) -> StoreResult<()>;

    /// Insert or update a provider (seed 001 §4.1), mark it online and seen
    /// at `now`, and append `provider_registered`.
    async fn register_provider(
        &self,
        actor: &str,
        req: ProviderRegisterRequest,
        now: Timestamp,
    ) -> StoreResult<ProviderRegistered>;

    /// Insert or update capabilities of `provider_id` (seed 001 §4.2) and
    /// append one `capability_registered` each. Additive: capabilities not
    /// named are left as they are.
    ///
    /// Errors: `NotFound` provider; `Conflict`
    /// `capability_owned_by_other_provider` when an id belongs to another
    /// provider (nothing is written).
    async fn register_capabilities(
        &self,
        actor: &str,
        provider_id: &str,
        capabilities: Vec<CapabilityRegistration>,
        now: Timestamp,
    ) -> StoreResult<CapabilitiesRegistered>;

    /// Apply a heartbeat (seed 001 §4.3): provider online and seen at `now`,
    /// `last_heartbeat_at = now`, each reported health stored; a change
    /// appends `capability_health_changed`; a snapshot row is written when
    /// health or status changed or the capability's last snapshot is at
    /// least `snapshot_min_interval` old.
    ///
    /// Errors: `NotFound` provider.
    async fn record_heartbeat(
        &self,
        actor: &str,
        heartbeat: HeartbeatRequest,
        now: Timestamp,
        snapshot_min_interval: Duration,
    ) -> StoreResult<HeartbeatRecorded>;

    /// Mark a provider online or offline (MQTT status, LWT, missed
    /// heartbeats). Offline takes its capabilities to `offline`; online
    /// brings `offline` ones back to `available` (`maintenance` stays).
    /// `boot_id`, when given, is stored.
    ///
    /// Errors: `NotFound` provider.
    async fn set_provider_online(
        &self,
        actor: &str,
        provider_id: &str,
        online: bool,
        boot_id: Option<String>,
        reason: &str,
        now: Timestamp,
    ) -> StoreResult<OnlineTransition>;

    /// Put capabilities into maintenance (`reason: Some`) or take them
    /// out (`None`: back to `available`, or `offline` when the provider
    /// is); a change writes a snapshot and appends
    /// `capability_maintenance_started` / `capability_maintenance_ended`.
    /// Already in the asked state: nothing is written (idempotent).
    ///
    /// Errors: `NotFound` capability (nothing is written).
    async fn set_maintenance(
        &self,
        actor: &str,
        capability_ids: Vec<String>,
        reason: Option<String>,
        now: Timestamp,
    ) -> StoreResult<MaintenanceChange>;

    /// Delete a retired capability, which must be in `maintenance`, and
    /// append `capability_removed` (its health history is kept).
    ///
    /// Errors: `NotFound`; `Conflict` `capability_not_in_maintenance`.
    async fn remove_capability(
        &self,
        actor: &str,
        capability_id: &str,
        now: Timestamp,
    ) -> StoreResult<CapabilityEvent>;

    async fn get_provider(&self, provider_id: &str) -> StoreResult<Option<CapabilityProvider>>;

    /// Providers ordered by id.
    async fn list_providers(&self, filter: ProviderFilter) -> StoreResult<Vec<CapabilityProvider>>;

    async fn get_capability(&self, capability_id: &str) -> StoreResult<Option<Capability>>;

    /// Capabilities ordered by id.
    async fn list_capabilities(&self, filter: CapabilityFilter) -> StoreResult<Vec<Capability>>;

    /// The newest `limit` snapshots of a capability, newest first.
    async fn health_history(
        &self,
        capability_id: &str,
        limit: usize,
    ) -> StoreResult<Vec<HealthSnapshot>>;

    async fn counts(&self) -> StoreResult<StoreCounts>;
}
