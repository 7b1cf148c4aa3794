//! Benchlink cloud registry: providers, capabilities, leases with preemption,
//! the event stream, audit tasks and the agent runtime behind the Earth
//! command.
//!
//! Module map (see docs/architecture.md):
//! - [`db`]: SQLite on dedicated threads; [`events`]: the append-only event
//!   log and live bus; [`auth`]: bearer tokens and roles; [`error`] /
//!   [`extract`]: the JSON error body and validated JSON bodies.
//! - [`agents`]: the agent runtime and the Earth command (seed 000).

pub mod agents;
pub mod auth;
pub mod db;
pub mod error;
pub mod events;
pub mod extract;
