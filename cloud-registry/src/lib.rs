//! Benchlink cloud registry: providers, capabilities, leases with preemption,
//! the event stream, audit tasks and the agent runtime behind the Earth
//! command.
//!
//! Module map (see docs/architecture.md):
//! - [`db`]: SQLite on dedicated threads; [`events`]: the append-only event
//!   log and live bus; [`auth`]: bearer tokens and roles; [`error`] /
//!   [`extract`]: the JSON error body and validated JSON bodies;
//!   [`fdlimit`]: the file-descriptor limit; [`http_server`]: the HTTP
//!   listener (timeouts, connection cap).
//! - [`agents`]: the agent runtime and the Earth command (seed 000).
//! - [`app`]: composition ([`app::Registry::start`]); [`config`]: the TOML
//!   file; [`store`]: providers, capabilities, health history behind the
//!   [`store::Store`] trait; [`registry`]: registration and liveness shared
//!   by HTTP and MQTT; [`api`]: the HTTP handlers; [`broker`] / [`mqtt`]:
//!   the embedded broker and the registry's MQTT client; [`broker_log`]:
//!   the broker's oversized-packet reports in the registry's log; [`follow`]:
//!   lossless ordered reading of the event log (SSE, command forwarding).
//! - [`sessions`]: actions on leased capabilities, their sessions and
//!   artifacts (bytes in a content-addressed blob store).

pub mod agents;
pub mod api;
pub mod app;
pub mod audit;
pub mod auth;
pub mod broker;
pub mod broker_log;
pub mod config;
pub mod db;
pub mod error;
pub mod events;
pub mod extract;
pub mod fdlimit;
pub mod follow;
pub mod hearing;
pub mod http_server;
pub mod ids;
pub mod leases;
pub mod mqtt;
pub mod registry;
pub mod sessions;
pub mod storage;
pub mod store;
pub mod twins;
