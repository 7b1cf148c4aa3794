//! Benchlink wire types and the MQTT topic scheme. No I/O lives here.
//!
//! Every type mirrors one of the two source specifications, with their field
//! names and enum values verbatim (snake_case):
//! - seed 001 "Capability Registry 与审计 Agent 协议": providers (§2.2.1, §4.1),
//!   capabilities (§2.2.2, §3, §4.2), heartbeats (§4.3), leases (§2.2.3, §5,
//!   §6), sessions (§2.2.4), artifacts (§2.2.5), events (§7), audit tasks
//!   (§8-§12) and capability requirements (§13);
//! - seed 000 "Agent Runtime, Earth LLM Command, And Speech Entry Plan": agent
//!   runs, steps, evidence and proposals, the JSON tool-call protocol, the
//!   Earth command and its action plan, and speech transcription.
//!
//! Times are RFC 3339 UTC ([`Timestamp`]); durations carry their unit in the
//! field name (`_ms`, `_seconds`). [`parse_json`] is the one entry point for
//! untrusted JSON: it names the offending field in its error and runs the
//! type's [`Validate`] checks.

#[macro_use]
mod macros;

pub mod agent;
pub mod api;
pub mod artifact;
pub mod audit;
pub mod capability;
pub mod chain;
pub mod constraints;
pub mod earth;
pub mod event;
pub mod lease;
pub mod mqtt;
pub mod provider;
pub mod regions;
pub mod session;
pub mod speech;
pub mod validate;

/// For [`wire_enum!`]'s OpenAPI schema (the registry's document).
#[doc(hidden)]
pub use utoipa;

pub use validate::{parse_json, parse_value, ParseError, Validate, ValidationError};

/// An instant on the wire: RFC 3339 in UTC, e.g. `2026-11-30T03:29:22Z`.
pub type Timestamp = chrono::DateTime<chrono::Utc>;

/// Version of this protocol, sent in every MQTT envelope and in
/// `AuditTaskRequest.protocol_version` (seed 001 §8.1 uses `"1.0"`).
pub const PROTOCOL_VERSION: &str = "1.0";
