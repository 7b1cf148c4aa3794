//! Principal policy (docs/policy.md "Principal policy"): per role and per
//! principal, the highest priority, most concurrent leases, longest lease,
//! capability types and tags, and preempt reasons a lease request may use.
//! `[policy.roles.<role>]` applies to every principal of that role;
//! `[policy.principals."<name>"]` overrides it field by field. A limit left
//! out is no limit; no table at all leaves a principal as before.
//!
//! The lease engine asks [`PrincipalPolicy::limits`] once per request and
//! checks the answer ([`Limits`]) before anything is stored; a refusal is
//! [`LeaseError::PolicyDenied`] (HTTP 403 `policy_denied`, `details.rule`
//! names the table and key).

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use shared_protocol::capability::{CapabilityRequirement, CapabilitySelector, CapabilityType};

use crate::auth::Principal;
use crate::leases::{CapabilityInfo, LeaseError};

/// One `[policy.roles.<role>]` or `[policy.principals."<name>"]` table.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    /// Highest `priority` (0..=100) a request may ask for.
    pub max_priority: Option<u8>,
    /// Most leases the principal may have at once, waiting (`requested`)
    /// and held (`granted`, `grace`) together; a group counts each member.
    pub max_concurrent_leases: Option<u32>,
    /// Longest `requested_duration_seconds` (also for a renewal), seconds.
    pub max_lease_seconds: Option<u32>,
    /// Capability types it may lease.
    pub allowed_capability_types: Option<Vec<CapabilityType>>,
    /// A capability it leases must carry at least one of these tags.
    pub allowed_tags: Option<Vec<String>>,
    /// `preempt_reason`s it may preempt with (`preempt_if_needed: true`).
    pub allowed_preempt_reasons: Option<Vec<String>>,
}

impl LimitsConfig {
    /// Out-of-range values, as `(dotted key under prefix, why)` for
    /// `check-config`.
    pub fn problems(&self, prefix: &str) -> Vec<(String, String)> {
        let mut out = Vec::new();
        let mut bad = |key: &str, why: &str| out.push((format!("{prefix}.{key}"), why.to_string()));
        if self.max_priority.is_some_and(|p| p > 100) {
            bad("max_priority", "must be 0 to 100");
        }
        if self.max_concurrent_leases == Some(0) {
            bad(
                "max_concurrent_leases",
                "must be at least 1 (leave it out for no limit)",
            );
        }
        if self.max_lease_seconds == Some(0) {
            bad(
                "max_lease_seconds",
                "must be at least 1 (leave it out for no limit)",
            );
        }
        for (key, list) in [
            ("allowed_tags", &self.allowed_tags),
            ("allowed_preempt_reasons", &self.allowed_preempt_reasons),
        ] {
            if list.as_ref().is_some_and(|l| l.is_empty()) {
                bad(
                    key,
                    "an empty list allows nothing; leave it out for no limit",
                );
            }
        }
        if self
            .allowed_capability_types
            .as_ref()
            .is_some_and(|l| l.is_empty())
        {
            bad(
                "allowed_capability_types",
                "an empty list allows nothing; leave it out for no limit",
            );
        }
        out
    }
}

/// `[policy.roles]` and `[policy.principals]`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PrincipalPolicyConfig {
    /// Keyed by role name (`audit_agent`, `operator`, …).
    pub roles: BTreeMap<Role, LimitsConfig>,
    /// Keyed by principal name (`audit:nightly`).
    pub principals: BTreeMap<String, LimitsConfig>,
}

/// One limit and the rule it comes from (`roles.audit_agent.max_priority`).
#[derive(Debug, Clone)]
struct Rule<T> {
    value: T,
    rule: String,
}

/// The limits in force for one principal.
#[derive(Debug, Clone, Default)]
pub struct Limits {
    max_priority: Option<Rule<u8>>,
    max_concurrent_leases: Option<Rule<u32>>,
    max_lease_seconds: Option<Rule<u32>>,
    allowed_capability_types: Option<Rule<Vec<CapabilityType>>>,
    allowed_tags: Option<Rule<Vec<String>>>,
    allowed_preempt_reasons: Option<Rule<Vec<String>>>,
}

/// The policy: config plus lookup.
#[derive(Debug, Clone, Default)]
pub struct PrincipalPolicy {
    cfg: PrincipalPolicyConfig,
}

fn denied(rule: &str, limit: Value, value: Value, message: String) -> LeaseError {
    LeaseError::PolicyDenied {
        rule: rule.to_string(),
        limit,
        value,
        message,
    }
}

impl PrincipalPolicy {
    /// The policy of `cfg`.
    pub fn new(cfg: PrincipalPolicyConfig) -> Self {
        Self { cfg }
    }

    /// True when no table is configured (every request passes).
    pub fn is_empty(&self) -> bool {
        self.cfg.roles.is_empty() && self.cfg.principals.is_empty()
    }

    /// The limits for `p`: its role's table, overridden field by field by
    /// its own. `None` when neither exists.
    pub fn limits(&self, p: &Principal) -> Option<Limits> {
        let role = self.cfg.roles.get(&p.role);
        let own = self.cfg.principals.get(&p.name);
        if role.is_none() && own.is_none() {
            return None;
        }
        let role_prefix = format!("roles.{}", p.role);
        let own_prefix = format!("principals.\"{}\"", p.name);
        macro_rules! pick {
            ($field:ident) => {
                own.and_then(|c| c.$field.clone())
                    .map(|value| Rule {
                        value,
                        rule: format!("{own_prefix}.{}", stringify!($field)),
                    })
                    .or_else(|| {
                        role.and_then(|c| c.$field.clone()).map(|value| Rule {
                            value,
                            rule: format!("{role_prefix}.{}", stringify!($field)),
                        })
                    })
            };
        }
        Some(Limits {
            max_priority: pick!(max_priority),
            max_concurrent_leases: pick!(max_concurrent_leases),
            max_lease_seconds: pick!(max_lease_seconds),
            allowed_capability_types: pick!(allowed_capability_types),
            allowed_tags: pick!(allowed_tags),
            allowed_preempt_reasons: pick!(allowed_preempt_reasons),
        })
    }
}

impl Limits {
    /// The checks that need nothing but the request: `priority`, the
    /// duration (seconds) and the preempt reason when it asks to preempt.
    pub fn check_request(
        &self,
        priority: u8,
        duration_seconds: u32,
        preempt_if_needed: bool,
        preempt_reason: Option<&str>,
    ) -> Result<(), LeaseError> {
        if let Some(r) = &self.max_priority {
            if priority > r.value {
                return Err(denied(
                    &r.rule,
                    json!(r.value),
                    json!(priority),
                    format!(
                        "priority {priority} is above the highest allowed, {} (`{}`)",
                        r.value, r.rule
                    ),
                ));
            }
        }
        self.check_duration(duration_seconds)?;
        if let (true, Some(r)) = (preempt_if_needed, &self.allowed_preempt_reasons) {
            let reason = preempt_reason.unwrap_or_default();
            if !r.value.iter().any(|a| a == reason) {
                return Err(denied(
                    &r.rule,
                    json!(r.value),
                    json!(preempt_reason),
                    format!(
                        "preempting with reason `{reason}` is not allowed; allowed: {} (`{}`)",
                        r.value.join(", "),
                        r.rule
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A lease (or renewal) of `seconds` against `max_lease_seconds`.
    pub fn check_duration(&self, seconds: u32) -> Result<(), LeaseError> {
        match &self.max_lease_seconds {
            Some(r) if seconds > r.value => Err(denied(
                &r.rule,
                json!(r.value),
                json!(seconds),
                format!(
                    "a {seconds} s lease is longer than the {} s allowed (`{}`)",
                    r.value, r.rule
                ),
            )),
            _ => Ok(()),
        }
    }

    /// `live` leases held or awaited now plus `adding` new ones against
    /// `max_concurrent_leases`.
    pub fn check_concurrent(&self, live: usize, adding: usize) -> Result<(), LeaseError> {
        match &self.max_concurrent_leases {
            Some(r) if live + adding > r.value as usize => Err(denied(
                &r.rule,
                json!(r.value),
                json!(live + adding),
                format!(
                    "{live} leases live and {adding} asked: more than the {} allowed at once (`{}`)",
                    r.value, r.rule
                ),
            )),
            _ => Ok(()),
        }
    }

    fn check_type(&self, t: CapabilityType, what: &str) -> Result<(), LeaseError> {
        match &self.allowed_capability_types {
            Some(r) if !r.value.contains(&t) => Err(denied(
                &r.rule,
                json!(r.value),
                json!(t),
                format!(
                    "{what} is a `{t}`; allowed types: {} (`{}`)",
                    r.value
                        .iter()
                        .map(|t| t.to_string())
                        .collect::<Vec<_>>()
                        .join(", "),
                    r.rule
                ),
            )),
            _ => Ok(()),
        }
    }

    fn check_tags(&self, tags: &[String], what: &str, hint: &str) -> Result<(), LeaseError> {
        match &self.allowed_tags {
            Some(r) if !tags.iter().any(|t| r.value.contains(t)) => Err(denied(
                &r.rule,
                json!(r.value),
                json!(tags),
                format!(
                    "{what} must carry one of the tags {}{hint} (`{}`)",
                    r.value.join(", "),
                    r.rule
                ),
            )),
            _ => Ok(()),
        }
    }

    /// A capability named by id.
    pub fn check_capability(&self, info: &CapabilityInfo) -> Result<(), LeaseError> {
        let what = format!("capability `{}`", info.capability_id);
        self.check_type(info.capability_type, &what)?;
        self.check_tags(&info.tags, &what, "")
    }

    /// A selector may only match capabilities the principal may use: its
    /// type must be allowed and its (required) tags must include an
    /// allowed one, so that everything it matches, now or later, is.
    pub fn check_selector(&self, s: &CapabilitySelector) -> Result<(), LeaseError> {
        self.check_type(s.capability_type, "the selector's capability")?;
        self.check_tags(&s.tags, "a selector", "; name one in `tags`")
    }

    /// A group requirement: as a selector; its tags bind only with
    /// `fallback_allowed: false`.
    pub fn check_requirement(&self, r: &CapabilityRequirement) -> Result<(), LeaseError> {
        self.check_type(r.capability_type, "the requirement's capability")?;
        let binding: &[String] = if r.fallback_allowed {
            &[]
        } else {
            &r.preferred_node_tags
        };
        self.check_tags(
            binding,
            "a requirement",
            "; name one in `preferred_node_tags` with `fallback_allowed: false`",
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn principal(name: &str, role: Role) -> Principal {
        Principal {
            name: name.into(),
            role,
        }
    }

    #[test]
    fn a_principal_table_overrides_its_role_field_by_field() {
        let cfg: PrincipalPolicyConfig = toml::from_str(
            r#"
            [roles.audit_agent]
            max_priority = 50
            max_lease_seconds = 600
            [principals."audit:nightly"]
            max_priority = 80
            "#,
        )
        .unwrap();
        let policy = PrincipalPolicy::new(cfg);
        let nightly = policy
            .limits(&principal("audit:nightly", Role::AuditAgent))
            .unwrap();
        assert!(nightly.check_request(80, 600, false, None).is_ok());
        let err = nightly.check_request(80, 601, false, None).unwrap_err();
        assert!(
            matches!(&err, LeaseError::PolicyDenied { rule, .. } if rule == "roles.audit_agent.max_lease_seconds")
        );
        let other = policy
            .limits(&principal("audit:other", Role::AuditAgent))
            .unwrap();
        let err = other.check_request(51, 60, false, None).unwrap_err();
        assert!(
            matches!(&err, LeaseError::PolicyDenied { rule, .. } if rule == "roles.audit_agent.max_priority")
        );
        assert!(policy.limits(&principal("op", Role::Operator)).is_none());
    }

    #[test]
    fn a_selector_must_name_an_allowed_tag() {
        let cfg: PrincipalPolicyConfig = toml::from_str(
            "[roles.audit_agent]\nallowed_tags = [\"winlab\"]\nallowed_capability_types = [\"camera\"]\n",
        )
        .unwrap();
        let limits = PrincipalPolicy::new(cfg)
            .limits(&principal("a", Role::AuditAgent))
            .unwrap();
        let sel = |t: &str, tags: &[&str]| CapabilitySelector {
            capability_type: t.parse().unwrap(),
            tags: tags.iter().map(|s| s.to_string()).collect(),
            provider_id: None,
            node_id: None,
        };
        assert!(limits.check_selector(&sel("camera", &["winlab"])).is_ok());
        assert!(limits.check_selector(&sel("camera", &[])).is_err());
        assert!(limits.check_selector(&sel("relay", &["winlab"])).is_err());
    }
}
