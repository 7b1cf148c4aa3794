//! Benchlink cloud registry: providers, capabilities, leases with preemption,
//! the event stream, sessions and audit tasks; it serves the agent runtime
//! and the Earth command of `registry-agents`.
//!
//! Module map (see docs/architecture.md):
//! - From `registry-core`, re-exported under their old paths: [`auth`]
//!   (bearer tokens and roles), [`db`] (SQLite on dedicated threads),
//!   [`error`] / [`extract`] (the JSON error body, validated bodies and
//!   queries), [`ids`], [`storage`] (the store's disk).
//! - [`agents`]: `registry-agents`, the agent runtime and the Earth command
//!   (docs/earth-command.md).
//! - [`events`]: the append-only event log and live bus; [`fdlimit`]: the
//!   file-descriptor limit; [`http_server`]: the HTTP listener (timeouts,
//!   connection cap).
//! - [`app`]: composition ([`app::Registry::start`]); [`config`]: the TOML
//!   file; [`store`]: providers, capabilities, health history behind the
//!   [`store::Store`] trait; [`registry`]: registration and liveness shared
//!   by HTTP and MQTT; [`api`]: the HTTP handlers; [`broker`] / [`mqtt`]:
//!   the embedded broker and the registry's MQTT client; [`broker_log`]:
//!   the broker's oversized-packet reports in the registry's log; [`follow`]:
//!   lossless ordered reading of the event log (SSE, command forwarding).
//! - [`sessions`]: actions on leased capabilities, their sessions and
//!   artifacts (bytes in a content-addressed blob store).

pub use registry_agents as agents;
pub use registry_core::{auth, db, error, extract, ids, storage};

pub mod api;
pub mod app;
pub mod audit;
pub mod broker;
pub mod broker_log;
pub mod config;
pub mod events;
pub mod fdlimit;
pub mod follow;
pub mod hearing;
pub mod http_server;
pub mod leases;
pub mod mqtt;
pub mod registry;
pub mod sessions;
pub mod store;
pub mod twins;
