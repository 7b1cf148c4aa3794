//! Providers and their capabilities: registration, heartbeats, liveness,
//! health history, and their HTTP routes (seed 001 §2.1, §4.1-§4.3;
//! docs/architecture.md "Registry internals").
//!
//! - [`registration`]: [`Providers`], the one path for registration,
//!   heartbeats, status and liveness, shared by HTTP and the MQTT ingest;
//!   it tells the lease engine through [`LeaseSync`] and later modules
//!   (sessions) through [`ProviderHooks`].
//! - [`store`]: the [`ProviderStore`] trait (tables `capability_providers`,
//!   `capabilities`, `capability_health_snapshots`), its row types and
//!   [`StoreError`]; [`sqlite`] implements it, [`cache`] keeps committed
//!   rows in memory for the hot paths.
//! - [`api`]: the `/capability-providers` and `/capabilities` handlers and
//!   the HTTP mapping of [`StoreError`].

pub mod api;
pub mod cache;
pub mod registration;
pub mod sqlite;
pub mod store;

pub use registration::{
    LeaseSync, LoggingHooks, OfflineReason, ProviderHooks, ProviderSettings, Providers,
};
pub use sqlite::SqliteProviderStore;
pub use store::{ProviderStore, StoreError, StoreResult};
