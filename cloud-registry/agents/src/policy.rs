//! Policy rules (docs/earth-command.md, "Proposal policy"): who may run a tool, which proposals
//! are acceptable, how risky they are, and who may apply them how.
//!
//! Pure functions only; [`crate::proposals`] stores what they decide.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use shared_protocol::agent::{ProposalRiskLevel, ProposalType};
use shared_protocol::api::Role;
use shared_protocol::earth::EarthDomain;

use crate::config::{unknown_integration, INTEGRATION_IDS};
use crate::prompts::{MAX_PROMPT_CHARS, PROMPT_KEYS};

/// Key fragments that mark a field as a secret (compared lowercase with
/// `-` and spaces read as `_`). Seed 000: "Proposals containing secret
/// fields are rejected", "Do not allow agent proposals to write API keys".
pub const SECRET_KEY_FRAGMENTS: [&str; 12] = [
    "api_key",
    "apikey",
    "password",
    "passwd",
    "token",
    "secret",
    "private_key",
    "credential",
    "access_key",
    "auth",
    "cookie",
    "session_key",
];

/// Rank of a role for tool permissions: `viewer` < `operator` =
/// `audit_agent` < `admin` < `super_admin`. Providers (devices) run no
/// agent tools.
fn rank(role: Role) -> Option<u8> {
    match role {
        Role::Viewer => Some(0),
        Role::Operator | Role::AuditAgent => Some(1),
        Role::Admin => Some(2),
        Role::SuperAdmin => Some(3),
        Role::Provider => None,
    }
}

/// True when `role` may use something that needs `permission` (a role
/// name). Unknown permission names allow nobody.
pub fn role_allows(role: Role, permission: &str) -> bool {
    let Ok(needed) = permission.parse::<Role>() else {
        return false;
    };
    match (rank(role), rank(needed)) {
        (Some(have), Some(need)) => have >= need,
        _ => false,
    }
}

/// Dotted paths of every object key in `value` that names a secret.
pub fn secret_fields(value: &Value) -> Vec<String> {
    fn walk(v: &Value, path: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) => {
                for (k, child) in m {
                    let p = if path.is_empty() {
                        k.clone()
                    } else {
                        format!("{path}.{k}")
                    };
                    let norm = k.to_lowercase().replace(['-', ' '], "_");
                    if SECRET_KEY_FRAGMENTS.iter().any(|f| norm.contains(f)) {
                        out.push(p.clone());
                    }
                    walk(child, &p, out);
                }
            }
            Value::Array(items) => {
                for (i, child) in items.iter().enumerate() {
                    walk(child, &format!("{path}[{i}]"), out);
                }
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(value, "", &mut out);
    out
}

/// The settings table `kind` a proposal type writes.
pub fn setting_kind(t: ProposalType) -> &'static str {
    t.as_str()
}

/// JSON Schema of a proposal's `target` descriptor.
pub fn target_schema(t: ProposalType) -> Value {
    let id = json!({"type": "string", "pattern": "^[a-z0-9][a-z0-9_.:-]{0,63}$"});
    match t {
        ProposalType::DatasourceConfig => json!({
            "type": "object", "additionalProperties": false, "required": ["datasource_id"],
            "properties": {"datasource_id": id}
        }),
        ProposalType::AiPrompt => json!({
            "type": "object", "additionalProperties": false, "required": ["prompt_key"],
            "properties": {"prompt_key": {"type": "string", "enum": PROMPT_KEYS}}
        }),
        ProposalType::ExternalIntegration => json!({
            "type": "object", "additionalProperties": false, "required": ["integration_id"],
            "properties": {"integration_id": id}
        }),
    }
}

/// JSON Schema of the value a proposal writes (its full `after_payload`).
pub fn payload_schema(t: ProposalType) -> Value {
    let url = json!({"type": "string", "maxLength": 2000, "pattern": "^https?://[^\\s]+$"});
    let options = json!({
        "type": "object", "maxProperties": 50,
        "additionalProperties": {"type": ["string", "number", "boolean", "null"]}
    });
    let domains: Vec<&str> = EarthDomain::ALL.iter().map(|d| d.as_str()).collect();
    match t {
        ProposalType::DatasourceConfig => json!({
            "type": "object", "additionalProperties": false, "minProperties": 1,
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 200},
                "enabled": {"type": "boolean"},
                "endpoint": url,
                "format": {"type": "string", "enum": ["tle", "csv", "geojson", "json"]},
                "layer": {"type": "string", "enum": domains},
                "refresh_interval_seconds": {"type": "integer", "minimum": 10, "maximum": 604800},
                "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 600},
                "options": options
            }
        }),
        ProposalType::AiPrompt => json!({
            "type": "object", "additionalProperties": false, "required": ["text"],
            "properties": {"text": {"type": "string", "minLength": 1, "maxLength": MAX_PROMPT_CHARS}}
        }),
        ProposalType::ExternalIntegration => json!({
            "type": "object", "additionalProperties": false, "minProperties": 1,
            "properties": {
                "name": {"type": "string", "minLength": 1, "maxLength": 200},
                "enabled": {"type": "boolean"},
                "base_url": url,
                "timeout_seconds": {"type": "integer", "minimum": 1, "maximum": 600},
                "options": options
            }
        }),
    }
}

/// Schema errors of `instance` against `schema`, as `path: message`.
pub fn schema_errors(schema: &Value, instance: &Value) -> Vec<String> {
    match jsonschema::validator_for(schema) {
        Ok(v) => v
            .iter_errors(instance)
            .map(|e| {
                let path = e.instance_path().to_string();
                if path.is_empty() {
                    e.to_string()
                } else {
                    format!("{path}: {e}")
                }
            })
            .collect(),
        Err(e) => vec![format!("schema does not compile: {e}")],
    }
}

/// The settings key a proposal's target names.
pub fn target_key(t: ProposalType, target: &Value) -> Option<String> {
    let field = match t {
        ProposalType::DatasourceConfig => "datasource_id",
        ProposalType::AiPrompt => "prompt_key",
        ProposalType::ExternalIntegration => "integration_id",
    };
    target
        .get(field)
        .and_then(Value::as_str)
        .map(str::to_string)
}

/// What the policy concluded about a proposal's content.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProposalAssessment {
    pub risk_level: ProposalRiskLevel,
    /// Paths of secret fields found in target or payload.
    pub secret_fields: Vec<String>,
    pub schema_errors: Vec<String>,
    /// Why the risk level is what it is.
    pub risk_reasons: Vec<String>,
}

impl ProposalAssessment {
    /// True when the proposal must be rejected (secrets or schema errors).
    pub fn must_reject(&self) -> bool {
        !self.secret_fields.is_empty() || !self.schema_errors.is_empty()
    }

    /// The reasons for rejection, one sentence each.
    pub fn rejection_reasons(&self) -> Vec<String> {
        let mut r = Vec::new();
        if !self.secret_fields.is_empty() {
            r.push(format!(
                "proposals may not contain secret fields: {}",
                self.secret_fields.join(", ")
            ));
        }
        for e in &self.schema_errors {
            r.push(format!("schema: {e}"));
        }
        r
    }
}

fn max_risk(a: ProposalRiskLevel, b: ProposalRiskLevel) -> ProposalRiskLevel {
    a.max(b)
}

/// Assess a proposal: secret fields (anywhere in target or payload), schema
/// validation of target and full `after` value (an `integration_id` must
/// be one of [`INTEGRATION_IDS`]), and the risk level: low for
/// the low-risk scope (non-secret datasource / integration fields,
/// prompt overrides), medium for a new datasource or integration or one being
/// disabled, raised to `declared` when the proposer declared more.
pub fn assess_proposal(
    t: ProposalType,
    target: &Value,
    before: &Value,
    after: &Value,
    declared: Option<ProposalRiskLevel>,
) -> ProposalAssessment {
    let mut secrets = secret_fields(target);
    secrets.extend(secret_fields(after));
    let mut errors: Vec<String> = schema_errors(&target_schema(t), target)
        .into_iter()
        .map(|e| format!("target {e}"))
        .collect();
    if t == ProposalType::ExternalIntegration {
        if let Some(id) = target.get("integration_id").and_then(Value::as_str) {
            if !INTEGRATION_IDS.contains(&id) {
                errors.push(format!("target {}", unknown_integration(id)));
            }
        }
    }
    errors.extend(
        schema_errors(&payload_schema(t), after)
            .into_iter()
            .map(|e| format!("after_payload {e}")),
    );
    let mut risk = ProposalRiskLevel::Low;
    let mut reasons = vec![format!("{} non-secret change", t.as_str())];
    let before_empty = before.as_object().is_none_or(Map::is_empty);
    if t != ProposalType::AiPrompt && before_empty {
        risk = max_risk(risk, ProposalRiskLevel::Medium);
        reasons.push("creates a new entry".into());
    }
    if before.get("enabled") != Some(&json!(false)) && after.get("enabled") == Some(&json!(false)) {
        risk = max_risk(risk, ProposalRiskLevel::Medium);
        reasons.push("disables an entry".into());
    }
    if let Some(d) = declared {
        if d > risk {
            risk = d;
            reasons.push(format!("declared {} by the proposer", d.as_str()));
        }
    }
    ProposalAssessment {
        risk_level: risk,
        secret_fields: secrets,
        schema_errors: errors,
        risk_reasons: reasons,
    }
}

/// How an allowed application happens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ApplyMode {
    /// Without explicit confirmation (super_admin, low risk).
    Auto,
    /// With `confirm: true`.
    Manual,
}

/// Why an apply request is refused before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ApplyRefusal {
    #[error("role `{0}` may not apply proposals; admin or super_admin required")]
    Forbidden(Role),
    #[error("{0}; send {{\"confirm\": true}} to apply")]
    ConfirmationRequired(String),
}

/// Seed 000 "Proposal Policy" gate: super_admin may apply low-risk proposals
/// without confirmation; admins must confirm manually; high risk always
/// needs manual confirmation; medium risk needs it too.
pub fn apply_gate(
    role: Role,
    risk: ProposalRiskLevel,
    confirm: bool,
) -> Result<ApplyMode, ApplyRefusal> {
    if !matches!(role, Role::Admin | Role::SuperAdmin) {
        return Err(ApplyRefusal::Forbidden(role));
    }
    if confirm {
        return Ok(ApplyMode::Manual);
    }
    match (role, risk) {
        (Role::SuperAdmin, ProposalRiskLevel::Low) => Ok(ApplyMode::Auto),
        (_, ProposalRiskLevel::High) => Err(ApplyRefusal::ConfirmationRequired(
            "high-risk proposals always need manual confirmation".into(),
        )),
        (Role::SuperAdmin, _) => Err(ApplyRefusal::ConfirmationRequired(format!(
            "{}-risk proposals need manual confirmation",
            risk.as_str()
        ))),
        _ => Err(ApplyRefusal::ConfirmationRequired(
            "admins must confirm proposals manually".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secret_fields_are_found_at_any_depth_and_spelling() {
        let v = json!({"endpoint": "https://x", "options": {"API-Key": "k", "list": [{"db_password": 1}]}});
        assert_eq!(
            secret_fields(&v),
            vec!["options.API-Key", "options.list[0].db_password"]
        );
        assert!(secret_fields(&json!({"endpoint": "https://x", "enabled": true})).is_empty());
    }

    #[test]
    fn only_super_admin_applies_low_risk_without_confirmation() {
        use ProposalRiskLevel::*;
        assert_eq!(
            apply_gate(Role::SuperAdmin, Low, false),
            Ok(ApplyMode::Auto)
        );
        assert!(matches!(
            apply_gate(Role::Admin, Low, false),
            Err(ApplyRefusal::ConfirmationRequired(_))
        ));
        assert_eq!(apply_gate(Role::Admin, Low, true), Ok(ApplyMode::Manual));
        assert!(apply_gate(Role::SuperAdmin, High, false).is_err());
        assert_eq!(
            apply_gate(Role::SuperAdmin, High, true),
            Ok(ApplyMode::Manual)
        );
        assert_eq!(
            apply_gate(Role::Operator, Low, true),
            Err(ApplyRefusal::Forbidden(Role::Operator))
        );
    }

    #[test]
    fn tool_permissions_follow_role_rank() {
        assert!(role_allows(Role::Viewer, "viewer"));
        assert!(!role_allows(Role::Viewer, "admin"));
        assert!(role_allows(Role::SuperAdmin, "admin"));
        assert!(!role_allows(Role::Provider, "viewer"));
        assert!(!role_allows(Role::Admin, "root"));
    }

    #[test]
    fn an_integration_id_must_name_a_known_integration() {
        let assess = |id: &str| {
            assess_proposal(
                ProposalType::ExternalIntegration,
                &json!({"integration_id": id}),
                &json!({}),
                &json!({"base_url": "http://127.0.0.1:9000/v1"}),
                None,
            )
        };
        assert!(!assess("speech").must_reject());
        let a = assess("pager");
        assert!(a.must_reject());
        assert!(
            a.rejection_reasons()[0].contains("`pager` names no integration"),
            "{:?}",
            a.rejection_reasons()
        );
    }

    #[test]
    fn a_new_datasource_is_medium_and_a_bad_interval_is_a_schema_error() {
        let a = assess_proposal(
            ProposalType::DatasourceConfig,
            &json!({"datasource_id": "tle_active"}),
            &json!({}),
            &json!({"refresh_interval_seconds": 5}),
            None,
        );
        assert_eq!(a.risk_level, ProposalRiskLevel::Medium);
        assert_eq!(a.schema_errors.len(), 1, "{:?}", a.schema_errors);
        assert!(a.must_reject());
    }
}
