//! Claiming: which queued request an agent gets, and every way a claim
//! ends. Each function here is one SQLite transaction on the writer
//! thread, so a selection and the status change it leads to can never be
//! split by another claim (seed 001 §8; no request is ever held by two
//! agents).

use std::collections::{HashMap, HashSet};

use crate::sql::types::Value as SqlValue;
use crate::sql::{params, params_from_iter, Connection, TransactionBehavior};
use chrono::{TimeDelta, Utc};
use serde_json::json;
use shared_protocol::audit::{AuditRequestStatus, AuditType};
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::lease::CapabilityLease;
use shared_protocol::Timestamp;

use super::chief;
use super::model::{ClaimEndReason, ClaimInfo, ClaimedTask, LeaseAssignment};
use super::sql::{self, RequestRow, REQUEST_COLUMNS};
use super::AuditConfig;
use crate::events::{self, NewEvent};

/// What a claim is looking for.
#[derive(Debug, Clone)]
pub(crate) struct PickParams {
    pub types: Vec<AuditType>,
    /// Requests this claim already tried and could not get leases for.
    pub skip: HashSet<String>,
    /// Requirement signature → highest priority at which those
    /// capabilities were found not grantable (requests at or below it are
    /// passed over).
    pub blocked: HashMap<String, u8>,
    pub principal: String,
    pub agent_ref: String,
    /// The id the claim gets; also the reservation token.
    pub claim_id: String,
    /// How long a reservation holds, milliseconds.
    pub reservation_ms: i64,
}

/// What [`pick`] found.
#[derive(Debug)]
pub(crate) enum Picked {
    /// Nothing claimable.
    Nothing,
    /// A request without capability requirements, now claimed.
    Claimed {
        task: Box<ClaimedTask>,
        events: Vec<CapabilityEvent>,
    },
    /// A request with capability requirements, reserved for this claim
    /// while its leases are requested.
    Reserved(Box<RequestRow>),
}

/// Pick the best claimable request of `p.types`: `queued`, not reserved by
/// another claim, every dependency final (chief), highest priority first,
/// then oldest. Claim it at once when it needs no capabilities; reserve it
/// otherwise.
pub(crate) fn pick(
    conn: &mut Connection,
    p: &PickParams,
    cfg: &AuditConfig,
) -> rusqlite::Result<Picked> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now_ms = sql::now_ms();
    let chosen = {
        let marks = vec!["?"; p.types.len()].join(", ");
        let mut args: Vec<SqlValue> = p
            .types
            .iter()
            .map(|t| SqlValue::Text(t.as_str().to_string()))
            .collect();
        args.push(SqlValue::Integer(now_ms));
        let mut stmt = tx.prepare(&format!(
            "SELECT {REQUEST_COLUMNS} FROM audit_requests r
             WHERE r.status = 'queued' AND r.audit_type IN ({marks})
               AND (r.reserved_until_ms IS NULL OR r.reserved_until_ms <= ?)
               AND NOT EXISTS (
                   SELECT 1 FROM audit_dependencies d
                       JOIN audit_requests s ON s.audit_request_id = d.depends_on
                   WHERE d.audit_request_id = r.audit_request_id
                     AND s.status IN ('queued', 'claimed'))
             ORDER BY r.priority DESC, r.queue_seq ASC"
        ))?;
        let mut rows = stmt.query(params_from_iter(args.iter()))?;
        let mut chosen = None;
        while let Some(r) = rows.next()? {
            let id: String = r.get(0)?;
            if p.skip.contains(&id) {
                continue;
            }
            let priority: u8 = r.get(2)?;
            let sig: Option<String> = r.get(4)?;
            if let Some(sig) = &sig {
                if p.blocked.get(sig).is_some_and(|b| priority <= *b) {
                    continue;
                }
            }
            chosen = Some(sql::request_row(&r)?);
            break;
        }
        chosen
    };
    let Some(row) = chosen else {
        return Ok(Picked::Nothing);
    };
    if row.requirements_sig.is_none() {
        let (task, events) = claim_row(&tx, row, p, cfg, None, Vec::new())?;
        tx.commit()?;
        return Ok(Picked::Claimed {
            task: Box::new(task),
            events,
        });
    }
    tx.execute(
        "UPDATE audit_requests SET reserved_token = ?2, reserved_until_ms = ?3
         WHERE audit_request_id = ?1",
        params![row.audit_request_id, p.claim_id, now_ms + p.reservation_ms],
    )?;
    tx.commit()?;
    Ok(Picked::Reserved(Box::new(row)))
}

/// Complete a reserved claim once its leases are granted. `None` when the
/// reservation was lost meanwhile (it ran out and another claim took the
/// request); the caller then gives the leases back.
pub(crate) fn finalize(
    conn: &mut Connection,
    audit_request_id: &str,
    p: &PickParams,
    cfg: &AuditConfig,
    lease_group_id: String,
    leases: Vec<CapabilityLease>,
) -> rusqlite::Result<Option<(ClaimedTask, Vec<CapabilityEvent>)>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let Some(row) = sql::load_request(&tx, audit_request_id)? else {
        return Ok(None);
    };
    if row.status != AuditRequestStatus::Queued
        || row.reserved_token.as_deref() != Some(p.claim_id.as_str())
    {
        return Ok(None);
    }
    let out = claim_row(&tx, row, p, cfg, Some(lease_group_id), leases)?;
    tx.commit()?;
    Ok(Some(out))
}

/// Drop this claim's reservation of `audit_request_id` (its leases were
/// not granted).
pub(crate) fn unreserve(
    conn: &Connection,
    audit_request_id: &str,
    token: &str,
) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE audit_requests SET reserved_token = NULL, reserved_until_ms = NULL
         WHERE audit_request_id = ?1 AND reserved_token = ?2",
        params![audit_request_id, token],
    )?;
    Ok(())
}

/// Claim `row` for `p` inside `tx`: the claim row, the request's new
/// status, the `audit_task_claimed` event, and for a chief its
/// sub-results.
fn claim_row(
    tx: &Connection,
    row: RequestRow,
    p: &PickParams,
    cfg: &AuditConfig,
    lease_group_id: Option<String>,
    leases: Vec<CapabilityLease>,
) -> rusqlite::Result<(ClaimedTask, Vec<CapabilityEvent>)> {
    let visibility = cfg.visibility_timeout_seconds(row.request.time_budget_seconds);
    let now = Utc::now();
    let claim = ClaimInfo {
        claim_id: p.claim_id.clone(),
        audit_request_id: row.audit_request_id.clone(),
        attempt: row.attempts + 1,
        principal: p.principal.clone(),
        agent_ref: p.agent_ref.clone(),
        claimed_at: now,
        // On the steady clock, as every comparison with it.
        expires_at: sql::steady_now() + TimeDelta::seconds(i64::from(visibility)),
        visibility_timeout_seconds: visibility,
        lease_group_id,
        lease_ids: leases.iter().map(|l| l.lease_id.clone()).collect(),
        ended_at: None,
        end_reason: None,
    };
    sql::start_claim(tx, &claim)?;
    let event = events::append(
        tx,
        NewEvent::new(
            EventType::AuditTaskClaimed,
            p.principal.clone(),
            json!({
                "claim": claim,
                "audit_type": row.audit_type,
                "priority": row.priority,
                "request_status": AuditRequestStatus::Claimed,
            }),
        )
        .audit_request(row.audit_request_id.clone()),
    )?;
    let mut request = row.request;
    let sub_results = if row.audit_type == AuditType::Chief {
        let subs = chief::sub_results(tx, &row.audit_request_id)?;
        chief::fill_inputs(&mut request, &subs);
        subs
    } else {
        Vec::new()
    };
    let assignments = request
        .capability_requirements
        .iter()
        .zip(&leases)
        .enumerate()
        .map(|(i, (r, l))| LeaseAssignment {
            requirement_index: i,
            capability_type: r.capability_type,
            capability_id: l.capability_id.clone(),
            lease_id: l.lease_id.clone(),
        })
        .collect();
    Ok((
        ClaimedTask {
            claim,
            request,
            leases,
            assignments,
            sub_results,
        },
        vec![event],
    ))
}

/// A claim that ended and sent its request back (or to `failed`).
#[derive(Debug)]
pub(crate) struct GivenBack {
    pub claim: ClaimInfo,
    pub status: AuditRequestStatus,
    pub event: CapabilityEvent,
}

/// Why and by whom a claim is ended without a final result.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Ending<'a> {
    pub reason: ClaimEndReason,
    /// The agent's reason text, if it gave one.
    pub note: Option<&'a str>,
    /// Principal recorded on the event.
    pub actor: &'a str,
}

/// End `claim` as `ending` says and return its request to the queue, or to
/// `failed` when it has used its `max_attempts`. Appends
/// `audit_task_released` with `reason`, `request_status` and `attempts`.
pub(crate) fn give_back(
    tx: &Connection,
    row: &RequestRow,
    claim: &ClaimInfo,
    ending: Ending<'_>,
    max_attempts: u32,
    now: Timestamp,
) -> rusqlite::Result<GivenBack> {
    let Ending {
        reason,
        note,
        actor,
    } = ending;
    sql::end_claim(tx, &claim.claim_id, reason, now)?;
    let (status, failure) = if row.attempts >= max_attempts {
        (
            AuditRequestStatus::Failed,
            Some(format!(
                "gave up after {} attempts (max_attempts {max_attempts}); the last ended: {reason}",
                row.attempts
            )),
        )
    } else {
        (AuditRequestStatus::Queued, None)
    };
    sql::set_request_status(tx, &row.audit_request_id, status, failure.as_deref(), now)?;
    let event = events::append(
        tx,
        NewEvent::new(
            EventType::AuditTaskReleased,
            actor,
            json!({
                "claim_id": claim.claim_id,
                "principal": claim.principal,
                "agent_ref": claim.agent_ref,
                "reason": reason,
                "note": note,
                "request_status": status,
                "attempts": row.attempts,
                "max_attempts": max_attempts,
                "lease_ids": claim.lease_ids,
                "failure_reason": failure,
            }),
        )
        .audit_request(row.audit_request_id.clone()),
    )?;
    let mut claim = claim.clone();
    claim.ended_at = Some(now);
    claim.end_reason = Some(reason);
    Ok(GivenBack {
        claim,
        status,
        event,
    })
}

/// Take back every claim whose visibility deadline is at or before now
/// on the steady clock ([`sql::now_ms`]), in one transaction.
pub(crate) fn expire_due(
    conn: &mut Connection,
    actor: &str,
    max_attempts: u32,
) -> rusqlite::Result<Vec<GivenBack>> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let now = Utc::now();
    let due: Vec<RequestRow> = {
        let mut stmt = tx.prepare(&format!(
            "SELECT {REQUEST_COLUMNS} FROM audit_requests
             WHERE status = 'claimed' AND claim_expires_ms <= ?1"
        ))?;
        let rows = stmt.query_map(params![sql::now_ms()], sql::request_row)?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut out = Vec::with_capacity(due.len());
    for row in due {
        let Some(claim) = row
            .claim_id
            .as_deref()
            .map(|c| sql::load_claim(&tx, c))
            .transpose()?
            .flatten()
        else {
            tracing::error!(audit_request_id = %row.audit_request_id, "claimed request without its claim row; returning it to the queue");
            sql::set_request_status(
                &tx,
                &row.audit_request_id,
                AuditRequestStatus::Queued,
                None,
                now,
            )?;
            continue;
        };
        out.push(give_back(
            &tx,
            &row,
            &claim,
            Ending {
                reason: ClaimEndReason::VisibilityTimeout,
                note: None,
                actor,
            },
            max_attempts,
            now,
        )?);
    }
    tx.commit()?;
    Ok(out)
}
