//! Configuration proposals (docs/earth-command.md, "Proposal policy"): a run drafts a
//! change to one `datasource_config`, `ai_prompt` or `external_integration`
//! setting; an administrator applies it later (or a super_admin's run applies
//! a low-risk one at once when `auto_apply_low_risk` is on).
//!
//! A proposal stores the setting's value when it was made (`before_payload`)
//! and the full value it would write (`after_payload` = before with the
//! changes merged in, RFC 7386 style: `null` removes a key). Applying is a
//! compare-and-set in one transaction: if the setting changed meanwhile the
//! proposal fails with that error saved. Secret values are masked before a
//! rejected proposal is stored, so a rejected API key never lands in SQLite.

use chrono::Utc;
use registry_core::sql::Connection;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use shared_protocol::agent::{AgentProposal, ProposalRiskLevel, ProposalStatus, ProposalType};
use shared_protocol::api::Role;

use crate::policy::{self, ApplyMode};
use crate::store::{self, NewProposal, ProposalOutcome, StoreError};

/// What a run proposes (the `agents.propose_config` tool's arguments).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProposalDraft {
    pub proposal_type: ProposalType,
    /// `{"datasource_id"}`, `{"prompt_key"}` or `{"integration_id"}`.
    pub target: Value,
    /// Fields to change; `null` removes a field.
    pub changes: Map<String, Value>,
    pub rationale: String,
    /// The proposer's own risk estimate; the policy may only raise it.
    #[serde(default)]
    pub risk_level: Option<ProposalRiskLevel>,
}

/// Why applying failed.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error("proposal {0} not found")]
    NotFound(i64),
    #[error("proposal {id} is {status}; only pending or approved proposals can be applied")]
    NotPending { id: i64, status: ProposalStatus },
    /// Rejected by the policy (secrets, schema); the proposal is saved so.
    #[error("proposal {} rejected: {}", .0.id, .0.error.clone().unwrap_or_default())]
    Rejected(Box<AgentProposal>),
    /// The write failed; the error is saved on the proposal.
    #[error("proposal {} failed: {}", .0.id, .0.error.clone().unwrap_or_default())]
    Failed(Box<AgentProposal>),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// RFC 7386 merge of `changes` into `base` (top level and nested objects).
pub fn merge_patch(base: &Value, changes: &Map<String, Value>) -> Value {
    let mut out = base.as_object().cloned().unwrap_or_default();
    for (k, v) in changes {
        match v {
            Value::Null => {
                out.remove(k);
            }
            Value::Object(inner) => {
                let merged = merge_patch(out.get(k).unwrap_or(&Value::Null), inner);
                out.insert(k.clone(), merged);
            }
            other => {
                out.insert(k.clone(), other.clone());
            }
        }
    }
    Value::Object(out)
}

/// `value` with every secret field's value replaced by `"***"`.
pub fn mask_secrets(value: &Value) -> Value {
    match value {
        Value::Object(m) => Value::Object(
            m.iter()
                .map(|(k, v)| {
                    let norm = k.to_lowercase().replace(['-', ' '], "_");
                    if policy::SECRET_KEY_FRAGMENTS
                        .iter()
                        .any(|f| norm.contains(f))
                    {
                        (k.clone(), json!("***"))
                    } else {
                        (k.clone(), mask_secrets(v))
                    }
                })
                .collect(),
        ),
        Value::Array(items) => Value::Array(items.iter().map(mask_secrets).collect()),
        other => other.clone(),
    }
}

/// The current value of a proposal's target: the settings row, else
/// `fallback` (the prompt text in force for `ai_prompt`, `{}` otherwise).
fn current_value(
    conn: &Connection,
    t: ProposalType,
    target: &Value,
    fallback: &Value,
) -> Result<Value, StoreError> {
    let Some(key) = policy::target_key(t, target) else {
        return Ok(fallback.clone());
    };
    Ok(
        store::get_setting_sync(conn, policy::setting_kind(t), &key)?
            .map(|s| s.value)
            .unwrap_or_else(|| fallback.clone()),
    )
}

/// Create a proposal under run `run_id` (one transaction): read the current
/// value, merge the changes, assess, store as `pending` or `rejected`.
pub fn create_sync(
    conn: &mut Connection,
    run_id: i64,
    draft: &ProposalDraft,
    fallback_current: &Value,
) -> Result<AgentProposal, StoreError> {
    let tx = conn.transaction()?;
    let before = current_value(&tx, draft.proposal_type, &draft.target, fallback_current)?;
    let after = merge_patch(&before, &draft.changes);
    let a = policy::assess_proposal(
        draft.proposal_type,
        &draft.target,
        &before,
        &after,
        draft.risk_level,
    );
    let rejected = a.must_reject();
    let reasons = a.rejection_reasons();
    let policy_result = json!({
        "stage": "proposed",
        "decision": if rejected { "rejected" } else { "pending_review" },
        "risk_level": a.risk_level,
        "risk_reasons": a.risk_reasons,
        "secret_fields": a.secret_fields,
        "schema_errors": a.schema_errors,
    });
    let p = store::insert_proposal_sync(
        &tx,
        &NewProposal {
            run_id,
            proposal_type: draft.proposal_type,
            status: if rejected {
                ProposalStatus::Rejected
            } else {
                ProposalStatus::Pending
            },
            risk_level: a.risk_level,
            target: mask_secrets(&draft.target),
            before_payload: before,
            after_payload: mask_secrets(&after),
            rationale: draft.rationale.clone(),
            policy_result,
            error: rejected.then(|| reasons.join("; ")),
        },
    )?;
    tx.commit()?;
    Ok(p)
}

/// Record a refused apply attempt (status unchanged) in `policy_result.last_refusal`.
pub fn record_refusal_sync(
    conn: &Connection,
    id: i64,
    by: &str,
    role: Role,
    reason: &str,
) -> Result<(), StoreError> {
    let Some(p) = store::get_proposal_sync(conn, id)? else {
        return Err(StoreError::NotFound {
            kind: "proposal",
            id: id.to_string(),
        });
    };
    let mut pr = p.policy_result.clone();
    if let Value::Object(m) = &mut pr {
        m.insert(
            "last_refusal".into(),
            json!({"by": by, "role": role, "reason": reason, "at": store::ts(Utc::now())}),
        );
    }
    store::update_proposal_sync(
        conn,
        id,
        &ProposalOutcome {
            status: p.status,
            policy_result: pr,
            before_payload: None,
            applied_by: None,
            applied: false,
            error: p.error.clone(),
        },
    )?;
    Ok(())
}

/// Apply proposal `id` (one transaction): it must be pending or approved,
/// pass the secret and schema checks again, and its target must still hold
/// `before_payload`; then the setting is written and the proposal marked
/// `applied` by `by`. A rejection or failure is saved on the proposal.
pub fn apply_sync(
    conn: &mut Connection,
    id: i64,
    by: &str,
    role: Role,
    mode: ApplyMode,
    fallback_current: &Value,
) -> Result<AgentProposal, ApplyError> {
    let tx = conn.transaction().map_err(StoreError::from)?;
    let p = open_proposal(&tx, id)?;
    let a = policy::assess_proposal(
        p.proposal_type,
        &p.target,
        &p.before_payload,
        &p.after_payload,
        Some(p.risk_level),
    );
    let mut pr = p.policy_result.as_object().cloned().unwrap_or_default();
    pr.insert("stage".into(), json!("apply"));
    pr.insert("applied_mode".into(), json!(mode));
    pr.insert("applier_role".into(), json!(role));
    if a.must_reject() {
        let reasons = a.rejection_reasons().join("; ");
        pr.insert("decision".into(), json!("rejected"));
        let saved = store::update_proposal_sync(
            &tx,
            id,
            &ProposalOutcome {
                status: ProposalStatus::Rejected,
                policy_result: Value::Object(pr),
                before_payload: None,
                applied_by: None,
                applied: false,
                error: Some(reasons),
            },
        )?;
        tx.commit().map_err(StoreError::from)?;
        return Err(ApplyError::Rejected(Box::new(saved)));
    }
    let current = current_value(&tx, p.proposal_type, &p.target, fallback_current)?;
    if current != p.before_payload {
        pr.insert("decision".into(), json!("failed"));
        let saved = store::update_proposal_sync(
            &tx,
            id,
            &ProposalOutcome {
                status: ProposalStatus::Failed,
                policy_result: Value::Object(pr),
                before_payload: None,
                applied_by: None,
                applied: false,
                error: Some(
                    "the target changed after the proposal was made (its value no longer equals \
                     before_payload); make a new proposal"
                        .into(),
                ),
            },
        )?;
        tx.commit().map_err(StoreError::from)?;
        return Err(ApplyError::Failed(Box::new(saved)));
    }
    let key = policy::target_key(p.proposal_type, &p.target).unwrap_or_default();
    store::put_setting_sync(
        &tx,
        policy::setting_kind(p.proposal_type),
        &key,
        &p.after_payload,
        by,
    )?;
    pr.insert("decision".into(), json!("applied"));
    let saved = store::update_proposal_sync(
        &tx,
        id,
        &ProposalOutcome {
            status: ProposalStatus::Applied,
            policy_result: Value::Object(pr),
            before_payload: None,
            applied_by: Some(by.to_string()),
            applied: true,
            error: None,
        },
    )?;
    tx.commit().map_err(StoreError::from)?;
    Ok(saved)
}

/// Proposal `id` when it may still be applied, failed or rejected.
///
/// Errors: not found; not pending or approved.
fn open_proposal(conn: &Connection, id: i64) -> Result<AgentProposal, ApplyError> {
    let p = store::get_proposal_sync(conn, id)?.ok_or(ApplyError::NotFound(id))?;
    if !matches!(p.status, ProposalStatus::Pending | ProposalStatus::Approved) {
        return Err(ApplyError::NotPending {
            id,
            status: p.status,
        });
    }
    Ok(p)
}

/// Mark pending or approved proposal `id` `failed` with `error` without
/// writing its setting (its side effect could not be carried out: a
/// datasource that cannot be fetched or parsed). Errors: not found, not
/// pending.
pub fn fail_sync(
    conn: &mut Connection,
    id: i64,
    role: Role,
    mode: ApplyMode,
    error: &str,
) -> Result<AgentProposal, ApplyError> {
    let tx = conn.transaction().map_err(StoreError::from)?;
    let p = open_proposal(&tx, id)?;
    let mut pr = p.policy_result.as_object().cloned().unwrap_or_default();
    pr.insert("stage".into(), json!("apply"));
    pr.insert("applied_mode".into(), json!(mode));
    pr.insert("applier_role".into(), json!(role));
    pr.insert("decision".into(), json!("failed"));
    let saved = store::update_proposal_sync(
        &tx,
        id,
        &ProposalOutcome {
            status: ProposalStatus::Failed,
            policy_result: Value::Object(pr),
            before_payload: None,
            applied_by: None,
            applied: false,
            error: Some(error.to_string()),
        },
    )?;
    tx.commit().map_err(StoreError::from)?;
    Ok(saved)
}

/// Reject a pending proposal by hand (`POST /proposals/{id}/reject`).
pub fn reject_sync(
    conn: &mut Connection,
    id: i64,
    by: &str,
    reason: &str,
) -> Result<AgentProposal, ApplyError> {
    let tx = conn.transaction().map_err(StoreError::from)?;
    let p = open_proposal(&tx, id)?;
    let mut pr = p.policy_result.as_object().cloned().unwrap_or_default();
    pr.insert("decision".into(), json!("rejected"));
    pr.insert("rejected_by".into(), json!(by));
    let saved = store::update_proposal_sync(
        &tx,
        id,
        &ProposalOutcome {
            status: ProposalStatus::Rejected,
            policy_result: Value::Object(pr),
            before_payload: None,
            applied_by: None,
            applied: false,
            error: Some(format!("rejected by {by}: {reason}")),
        },
    )?;
    tx.commit().map_err(StoreError::from)?;
    Ok(saved)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merge_patch_sets_nested_fields_and_null_removes() {
        let base = json!({"endpoint": "https://a", "options": {"x": 1, "y": 2}, "enabled": true});
        let changes = json!({"endpoint": "https://b", "options": {"y": null}, "enabled": null});
        let out = merge_patch(&base, changes.as_object().unwrap());
        assert_eq!(out, json!({"endpoint": "https://b", "options": {"x": 1}}));
    }

    #[test]
    fn masking_hides_secret_values_only() {
        let v = json!({"endpoint": "https://a", "api_key": "sk-123", "options": {"Token": "t"}});
        assert_eq!(
            mask_secrets(&v),
            json!({"endpoint": "https://a", "api_key": "***", "options": {"Token": "***"}})
        );
    }
}
