//! Benchlink cloud registry: providers, capabilities, leases with preemption,
//! the event stream, actions and their evidence, audit tasks, and the agent
//! runtime behind the Earth command.
//!
//! Module map (docs/architecture.md "Registry internals" says more). Each
//! feature folder owns its routes and their HTTP error mapping in its
//! `api.rs`; its domain code knows nothing of HTTP.
//! - Core, from `registry-core` under their old paths: [`db`] (SQLite on
//!   dedicated threads), [`auth`] (bearer tokens, roles), [`error`] /
//!   [`extract`] (the JSON error body, validated bodies and queries),
//!   [`ids`], [`storage`] (a full disk); here: [`http_server`], [`fdlimit`],
//!   [`tls`] (HTTPS and MQTT over TLS, docs/install-registry.md "TLS").
//! - Features: [`providers`] (registration, heartbeats, liveness, health
//!   history, behind [`providers::ProviderStore`]); [`leases`] (the lease
//!   engine); [`sessions`] (actions on leased capabilities, their sessions
//!   and artifacts); [`events`] (the append-only log, live bus, SSE);
//!   [`tokens`] (token routes); [`audit`] (audit tasks); [`agents`]
//!   (`registry-agents`: the agent runtime and the Earth command,
//!   docs/earth-command.md); [`budgets`] (actuator action budgets and
//!   the per-principal request rate limit, docs/policy.md).
//! - MQTT: [`broker`] / [`broker_gate`] / [`broker_log`] (the embedded broker, its per-topic gate and its
//!   reports), [`mqtt`] (the registry's client: ingest, command forwarding),
//!   [`hearing`] (whether the registry can hear), [`twins`] (two benches
//!   under one provider id).
//! - [`policy`]: the lab's rules on grants (maintenance; docs/policy.md);
//!   [`safe_state`]: `on_release` actions run when a lease ends.
//! - [`console`]: the web console's embedded assets under `/console/`.
//! - Composition: [`api`] (what the features' routes share), [`health`]
//!   (`/healthz`, `/metrics`, `/time`), [`metrics`] (the Prometheus
//!   figures behind `/metrics`), [`app`] ([`app::Registry::start`]:
//!   everything wired, every router merged), [`openapi`] (the generated
//!   OpenAPI 3.1 document), [`config`] (the TOML file).

pub use registry_agents as agents;
pub use registry_core::{auth, db, error, extract, ids, sql, storage};

pub mod access_log;
pub mod api;
pub mod app;
pub mod audit;
pub mod broker;
pub mod broker_gate;
pub mod broker_log;
pub mod budgets;
pub mod cluster;
pub mod config;
pub mod console;
pub mod derive;
pub mod events;
pub mod fdlimit;
pub mod health;
pub mod hearing;
pub mod http_server;
pub mod leases;
pub mod live;
pub mod metrics;
pub mod mqtt;
pub mod notify;
pub mod openapi;
pub mod policy;
pub mod providers;
pub mod safe_state;
pub mod sessions;
pub mod tls;
pub mod tokens;
pub mod twins;
