//! Audit tasks (seed 001 §8-§14): requests that audit agents claim from a
//! queue, the results and findings they return, the chief audit that
//! reads the other audits' results, and the thread registry with its
//! inter-thread messages. `docs/audit-protocol.md` walks through the
//! protocol with one worked example.
//!
//! # Lifecycle of an audit request
//! ```text
//!  POST /audit-requests ─► queued ──claim──► claimed ──result──► completed
//!                            ▲                  │
//!                            └── release, ──────┤
//!                                needs_retry,   └──(attempts = max_attempts)──► failed
//!                                visibility timeout
//! ```
//! - A claim hands one request to one audit agent for a *visibility
//!   timeout*: `max(time_budget_seconds × visibility_timeout_factor,
//!   min_visibility_timeout_seconds)`. The agent extends it with
//!   `POST …/extend` (heartbeat), gives it back with `POST …/release`, or
//!   ends it with `POST …/result`. A claim that runs out is taken back by
//!   the sweeper; the request returns to the queue at its old place
//!   (priority, then age).
//! - Every claim counts as an attempt. A request that comes back (release,
//!   timeout, a `needs_retry` result) after its `max_attempts`-th attempt
//!   becomes `failed` instead of `queued`.
//! - Selection is "highest priority first, then oldest", and the selection
//!   and the status change happen in one SQLite transaction on the single
//!   writer thread: no request is ever claimed by two agents at once.
//!
//! # Capability requirements (seed 001 §13)
//! A request with `capability_requirements` is claimable only together
//! with one multi-capability lease group from the lease engine
//! ([`crate::leases::LeaseEngine::request_group`]): holder = the claiming agent's
//! principal (`holder_ref` = its `agent_ref`), priority = the request's
//! priority, duration = the visibility timeout (at most the lease engine's
//! `max_duration_seconds`; `POST …/extend` renews the leases too).
//! `preferred_node_tags`, `fallback_allowed` and `preempt_if_needed` are
//! passed through as requirements; the group's `preempt_reason` comes from
//! `[audit.preempt_reasons]` by audit type (requests cannot name their own).
//!
//! While the lease group is being requested the request is *reserved* for
//! that claim (still `queued`, skipped by other claims). When the group is
//! granted the claim completes. When it has to wait, the claim waits for
//! it at most the rest of its `wait_ms`; if it is still not granted the
//! group is **withdrawn** (its leases end `released`), so it neither holds
//! a queue slot nor reserves capabilities against other work, the request
//! stays `queued`, and the claim tries the next request (answering 204 when
//! none can run). A preemption the group started is not taken back (a
//! lease-engine rule): agents that claim preempting work should pass a
//! `wait_ms` longer than the grace period.
//!
//! A request whose capabilities could not be granted is not retried by
//! any claim until a capability frees (a `lease_released`,
//! `lease_expired` or `lease_preempted` of a granted lease, a capability or
//! provider registration or health change on the event stream), or
//! `claim_poll_interval_ms` has passed; this is kept per requirement set
//! and priority, so 50 waiting agents do not each request the same busy
//! camera over and over.
//!
//! When a claim ends (result, release, timeout) its leases are released.
//! After a registry crash between the two steps the leases still end by
//! their TTL.
//!
//! # Chief audit (seed 001 §12)
//! A chief request names the requests it reads in `depends_on` (they must
//! exist; other types may not name dependencies). It is claimable once
//! every one of them is final (`completed`, or `failed` after its
//! attempts); the claim answer carries `sub_results` for all of them and
//! fills `software_audit_result`, `hardware_audit_result` and
//! `multimodal_audit_result` of the request with the stored results (one
//! result: the object; several of one type: an array).
//!
//! # Threads (seed 001 §14)
//! `source_thread_ref` of a request and `handoff_target` of a chief result
//! must name a registered thread (unknown refs are refused with 422, so
//! every reference points at something real). When a request completes,
//! its source thread gets an `audit_completed` message and a chief's
//! handoff target an `audit_handoff` message, in the same transaction.
//!
//! # Roles
//! | action | roles (`super_admin` always) |
//! |---|---|
//! | create requests | `operator`, `admin`, `audit_agent` |
//! | list / get requests, results, threads, messages | all but `provider` |
//! | claim, extend, post a result | `audit_agent` (the claim's holder) |
//! | release a claim | its holder; `admin` may release any |
//! | register threads, post messages | `operator`, `admin`, `audit_agent` |
//!
//! # Events
//! `audit_task_created`, `audit_task_claimed`, `audit_task_released`
//! (`data.reason`: `released_by_agent`, `released_by_admin`,
//! `visibility_timeout`, `needs_retry`; `data.request_status`: `queued` or
//! `failed`) and `audit_task_completed`, each appended in the transaction
//! of its change and published after the commit.
//!
//! # Time
//! Visibility deadlines are wall-clock milliseconds stored with the claim,
//! so they survive a restart; a claim past its deadline is treated as
//! expired at once (a result is refused with 409 `claim_expired`) even
//! before the sweeper has returned it to the queue.

mod api;
pub mod bundle;
mod chief;
mod error;
pub mod limits;
mod model;
mod queue;
mod service;
mod sql;
mod threads;

use serde::{Deserialize, Serialize};
use shared_protocol::audit::AuditType;

pub use api::router;
pub use error::AuditError;
pub use model::*;
pub use service::AuditService;
pub use sql::migrate;

/// Lease `preempt_reason` used for the capability requirements of each
/// audit type (`[audit.preempt_reasons]`); it must be on the lease
/// engine's `preempt_reason_whitelist` for preemption to happen. Absent:
/// that type's lease groups wait without preempting.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PreemptReasons {
    pub software: Option<String>,
    pub hardware: Option<String>,
    pub multimodal: Option<String>,
    pub chief: Option<String>,
}

impl Default for PreemptReasons {
    fn default() -> Self {
        Self {
            software: None,
            hardware: Some("hardware_audit_deadline".to_string()),
            multimodal: None,
            chief: Some("chief_audit".to_string()),
        }
    }
}

impl PreemptReasons {
    /// The reason configured for `audit_type` (an empty string in the
    /// file switches a default off).
    pub fn for_type(&self, audit_type: AuditType) -> Option<&str> {
        let reason = match audit_type {
            AuditType::Software => self.software.as_deref(),
            AuditType::Hardware => self.hardware.as_deref(),
            AuditType::Multimodal => self.multimodal.as_deref(),
            AuditType::Chief => self.chief.as_deref(),
        };
        reason.filter(|r| !r.trim().is_empty())
    }
}

/// Audit-task settings: the `[audit]` table of the registry's TOML file.
///
/// ```toml
/// [audit]
/// visibility_timeout_factor = 1.5
/// min_visibility_timeout_seconds = 30
/// max_attempts = 3
/// sweep_interval_ms = 1000
/// max_claim_wait_ms = 60000
/// claim_poll_interval_ms = 2000
/// [audit.preempt_reasons]
/// hardware = "hardware_audit_deadline"
/// chief = "chief_audit"
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// Visibility timeout = `time_budget_seconds` × this (1.5); at least 1.0.
    pub visibility_timeout_factor: f64,
    /// Shortest visibility timeout, seconds (30).
    pub min_visibility_timeout_seconds: u32,
    /// Claims a request may have; the one after the last puts it in
    /// `failed` (3).
    pub max_attempts: u32,
    /// How often the sweeper looks for timed-out claims, milliseconds
    /// (1000).
    pub sweep_interval_ms: u64,
    /// Longest `wait_ms` a claim may wait for work, milliseconds (60 000);
    /// larger values are cut to it.
    pub max_claim_wait_ms: u64,
    /// While a claim waits, how often it looks again without being woken,
    /// and how long a "capabilities not grantable" verdict is trusted,
    /// milliseconds (2000).
    pub claim_poll_interval_ms: u64,
    /// Lease `preempt_reason` per audit type.
    pub preempt_reasons: PreemptReasons,
}

impl Default for AuditConfig {
    fn default() -> Self {
        Self {
            visibility_timeout_factor: 1.5,
            min_visibility_timeout_seconds: 30,
            max_attempts: 3,
            sweep_interval_ms: 1000,
            max_claim_wait_ms: 60_000,
            claim_poll_interval_ms: 2000,
            preempt_reasons: PreemptReasons::default(),
        }
    }
}

/// A configuration value that breaks a rule; `key` is the key under
/// `[audit]`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("audit.{key}: {message}")]
pub struct AuditConfigError {
    pub key: &'static str,
    pub message: String,
}

impl AuditConfig {
    /// Check every rule: factor finite and ≥ 1.0, `max_attempts` ≥ 1,
    /// intervals ≥ 1 ms, minimum timeout 1..=86 400 s.
    pub fn validate(&self) -> Result<(), AuditConfigError> {
        let err = |key, message: &str| AuditConfigError {
            key,
            message: message.to_string(),
        };
        if !self.visibility_timeout_factor.is_finite() || self.visibility_timeout_factor < 1.0 {
            return Err(err(
                "visibility_timeout_factor",
                "must be a number of at least 1.0",
            ));
        }
        if !(1..=86_400).contains(&self.min_visibility_timeout_seconds) {
            return Err(err(
                "min_visibility_timeout_seconds",
                "must be 1 to 86400 seconds",
            ));
        }
        if self.max_attempts == 0 {
            return Err(err("max_attempts", "must be at least 1"));
        }
        if self.sweep_interval_ms == 0 {
            return Err(err("sweep_interval_ms", "must be at least 1"));
        }
        if self.claim_poll_interval_ms == 0 {
            return Err(err("claim_poll_interval_ms", "must be at least 1"));
        }
        Ok(())
    }

    /// The visibility timeout of a claim on a request with
    /// `time_budget_seconds`, seconds (rounded up, at most 7 days).
    pub fn visibility_timeout_seconds(&self, time_budget_seconds: u32) -> u32 {
        let factor = if self.visibility_timeout_factor.is_finite() {
            self.visibility_timeout_factor.max(1.0)
        } else {
            1.0
        };
        let scaled = (f64::from(time_budget_seconds) * factor).ceil();
        let scaled = scaled.min(7.0 * 86_400.0) as u32;
        scaled.max(self.min_visibility_timeout_seconds.max(1))
    }

    /// The same settings with out-of-range values replaced by their
    /// defaults (each replacement is logged).
    pub(crate) fn sanitized(mut self) -> Self {
        let d = Self::default();
        while let Err(e) = self.validate() {
            tracing::warn!(key = e.key, error = %e, "audit setting out of range; using its default");
            match e.key {
                "visibility_timeout_factor" => {
                    self.visibility_timeout_factor = d.visibility_timeout_factor
                }
                "min_visibility_timeout_seconds" => {
                    self.min_visibility_timeout_seconds = d.min_visibility_timeout_seconds
                }
                "max_attempts" => self.max_attempts = d.max_attempts,
                "sweep_interval_ms" => self.sweep_interval_ms = d.sweep_interval_ms,
                _ => self.claim_poll_interval_ms = d.claim_poll_interval_ms,
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn visibility_timeout_is_budget_times_factor_with_a_floor() {
        let cfg = AuditConfig::default();
        assert_eq!(cfg.visibility_timeout_seconds(300), 450);
        assert_eq!(cfg.visibility_timeout_seconds(5), 30);
        assert_eq!(cfg.visibility_timeout_seconds(21), 32);
    }

    #[test]
    fn an_audit_table_in_toml_overrides_only_the_keys_it_names() {
        let cfg: AuditConfig =
            toml::from_str("max_attempts = 5\n[preempt_reasons]\nmultimodal = \"chief_audit\"\n")
                .unwrap();
        assert_eq!(cfg.max_attempts, 5);
        assert_eq!(cfg.min_visibility_timeout_seconds, 30);
        assert_eq!(
            cfg.preempt_reasons.for_type(AuditType::Multimodal),
            Some("chief_audit")
        );
        assert_eq!(
            cfg.preempt_reasons.for_type(AuditType::Chief),
            Some("chief_audit")
        );
        assert!(toml::from_str::<AuditConfig>("max_attempt = 5").is_err());
    }

    #[test]
    fn out_of_range_settings_are_refused_by_key_and_replaced_when_sanitized() {
        let cfg = AuditConfig {
            visibility_timeout_factor: 0.5,
            max_attempts: 0,
            ..AuditConfig::default()
        };
        assert_eq!(cfg.validate().unwrap_err().key, "visibility_timeout_factor");
        let fixed = cfg.sanitized();
        assert_eq!(fixed.visibility_timeout_factor, 1.5);
        assert_eq!(fixed.max_attempts, 3);
    }

    #[test]
    fn an_extend_of_the_wrong_type_names_the_range_in_force() {
        let err =
            shared_protocol::parse_json::<super::ExtendRequest>(br#"{"extend_seconds": "long"}"#)
                .unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid field `extend_seconds`: invalid type: string \"long\", \
             expected an integer from 1 to 86400"
        );
    }
}
