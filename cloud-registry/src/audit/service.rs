//! [`AuditService`]: the audit-task operations behind the HTTP API, the
//! claim loop that ties a claim to a lease group, and the sweeper that
//! takes back timed-out claims. See the module doc of `audit` for the
//! protocol decisions.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use crate::sql::TransactionBehavior;
use chrono::{TimeDelta, Utc};
use serde::Serialize;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use shared_protocol::audit::{
    AuditRequestStatus, AuditResultStatus, AuditTaskRequest, AuditTaskResult, AuditType,
};
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::lease::{CapabilityLease, HolderType, LeaseGroupRequest, LeaseRenewRequest};
use shared_protocol::Validate;
use tokio::sync::{broadcast, watch, Notify};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::chief;
use super::error::{AuditError, UnsatisfiableRequirement};
use super::model::{
    AuditRequestFilter, AuditRequestPage, AuditRequestRecord, ClaimEndReason, ClaimInfo,
    ClaimRequest, ClaimedTask, ExtendRequest, ExtendedClaim, MessagePost, ReleaseRequest,
    ThreadFilter, ThreadMessage, ThreadRecord, ThreadRegistration,
};
use super::queue::{self, Ending, PickParams, Picked};
use super::sql::{self, RequestRow};
use super::threads;
use super::AuditConfig;
use crate::auth::Principal;
use crate::db::Db;
use crate::events::{self, EventBus, NewEvent};
use crate::leases::{CapabilityInfo, LeaseEngine, LeaseError, LeaseFilter, MAX_GROUP_MEMBERS};
use shared_protocol::capability::{CapabilityRequirement, LeaseMode, RequirementMode};

/// Principal the registry acts as when it ends claims on its own
/// (sweeper) and sends messages to threads.
pub const SYSTEM_PRINCIPAL: &str = "system:audit-queue";

/// Roles that may read requests, results, threads and messages.
const READ_ROLES: &[Role] = &[Role::Viewer, Role::Operator, Role::Admin, Role::AuditAgent];
/// Roles that may create requests, register threads and post messages.
const WRITE_ROLES: &[Role] = &[Role::Operator, Role::Admin, Role::AuditAgent];
/// Roles that may claim, extend and post results.
const AGENT_ROLES: &[Role] = &[Role::AuditAgent];

/// A reservation outlives the claim's wait by this much, milliseconds
/// (covers the lease round trips after the wait).
const RESERVATION_MARGIN_MS: u64 = 30_000;
/// A claim's lease group gives up waiting in the lease queue this long
/// after the claim's wait, seconds (a safety net: the claim withdraws it
/// itself).
const QUEUE_TIMEOUT_MARGIN_S: u32 = 5;

fn require(who: &Principal, roles: &[Role], action: &'static str) -> Result<(), AuditError> {
    if who.role == Role::SuperAdmin || roles.contains(&who.role) {
        return Ok(());
    }
    Err(AuditError::Forbidden {
        role: who.role,
        action,
        allowed: roles.iter().map(|r| r.as_str()).collect(),
    })
}

fn remaining(deadline: Instant) -> Duration {
    deadline.saturating_duration_since(Instant::now())
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// "Capabilities for this requirement set were not grantable at `epoch`,
/// up to `priority`."
#[derive(Debug, Clone, Copy)]
struct Blocked {
    priority: u8,
    epoch: u64,
    at: std::time::Instant,
}

/// The audit-task service. Create with [`AuditService::new`], share the
/// `Arc`, serve [`super::router`], and run [`AuditService::run_sweeper`].
pub struct AuditService {
    db: Db,
    bus: EventBus,
    leases: Arc<LeaseEngine>,
    cfg: AuditConfig,
    /// Woken when work may have become claimable (created, returned,
    /// dependencies done, capabilities freed).
    changed: Notify,
    /// Bumped whenever capabilities may have freed (see `frees_capacity`).
    lease_epoch: AtomicU64,
    blocked: Mutex<HashMap<String, Blocked>>,
    system: Principal,
    /// Set when the sweeper's shutdown signal fired: waiting claims stop
    /// waiting (they answer "nothing claimable").
    closing: AtomicBool,
}

impl AuditService {
    /// A service over `db` (whose audit tables [`super::migrate`] has
    /// created), appending to and publishing on `bus`, leasing through
    /// `leases`. Out-of-range settings are replaced by their defaults
    /// (logged); call [`AuditConfig::validate`] first to refuse them
    /// instead.
    pub fn new(db: Db, bus: EventBus, leases: Arc<LeaseEngine>, cfg: AuditConfig) -> Arc<Self> {
        Arc::new(Self {
            db,
            bus,
            leases,
            cfg: cfg.sanitized(),
            changed: Notify::new(),
            lease_epoch: AtomicU64::new(0),
            blocked: Mutex::new(HashMap::new()),
            system: Principal {
                name: SYSTEM_PRINCIPAL.to_string(),
                role: Role::Admin,
            },
            closing: AtomicBool::new(false),
        })
    }

    /// The settings in force.
    pub fn config(&self) -> &AuditConfig {
        &self.cfg
    }

    // -----------------------------------------------------------------
    // Requests

    /// Store a new request (`queued`) and append `audit_task_created`.
    /// `created_at` is set to now when absent.
    ///
    /// Errors: `Forbidden` (roles other than operator, admin,
    /// audit_agent), `Invalid` naming the field (protocol rules, an
    /// extension field of another audit type, an unknown
    /// `source_thread_ref`, a bad `depends_on`, a requirement longer than
    /// the lease maximum), `Unsatisfiable` for requirements no registered
    /// capability could serve, `Duplicate` for a known `audit_request_id`.
    pub async fn create(
        &self,
        who: &Principal,
        mut req: AuditTaskRequest,
    ) -> Result<AuditRequestRecord, AuditError> {
        require(who, WRITE_ROLES, "create audit requests")?;
        req.validate()?;
        check_request_shape(&req, self.leases.config().max_duration_seconds)?;
        if !req.capability_requirements.is_empty() {
            let dir = self.leases.directory().await;
            let failing = unsatisfiable(&req.capability_requirements, &dir);
            if !failing.is_empty() {
                return Err(AuditError::Unsatisfiable { failing });
            }
        }
        let now = Utc::now();
        req.created_at.get_or_insert(now);
        let sig = requirements_signature(&req);
        // Every field of the request, as stored, in the chain (an audit
        // bundle's verify recomputes it from request.json).
        let request_sha256 = shared_protocol::chain::record_digest(
            &serde_json::to_value(&req)
                .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?,
        );
        let by = who.name.clone();
        let max_attempts = self.cfg.max_attempts;
        let (mut record, event) = self
            .db
            .write(move |c| -> Result<_, AuditError> {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let id = req.audit_request_id.clone();
                if sql::load_request(&tx, &id)?.is_some() {
                    return Err(AuditError::Duplicate {
                        audit_request_id: id,
                    });
                }
                if let Some(t) = &req.source_thread_ref {
                    threads::require_registered(&tx, "source_thread_ref", t)?;
                }
                chief::check_dependencies(&tx, &req)?;
                sql::insert_request(&tx, &req, sig.as_deref(), &by, now)?;
                let event = events::append(
                    &tx,
                    NewEvent::new(
                        EventType::AuditTaskCreated,
                        by.clone(),
                        json!({
                            "audit_request_id": id,
                            "audit_type": req.audit_type,
                            "project_id": req.project_id,
                            "task_id": req.task_id,
                            "priority": req.priority,
                            "source_thread_ref": req.source_thread_ref,
                            "depends_on": req.chief.depends_on,
                            "capability_types": req.capability_requirements
                                .iter().map(|r| r.capability_type).collect::<Vec<_>>(),
                            "request_status": AuditRequestStatus::Queued,
                            "request_sha256": request_sha256,
                        }),
                    )
                    .audit_request(id.clone()),
                )?;
                let record = sql::load_record(&tx, &id, max_attempts)?
                    .ok_or(rusqlite::Error::QueryReturnedNoRows)?;
                tx.commit()?;
                Ok((record, event))
            })
            .await??;
        self.explain_waits(std::slice::from_mut(&mut record)).await;
        self.bus.publish([event]);
        self.changed.notify_waiters();
        Ok(record)
    }

    /// The request `id` with its queue state.
    ///
    /// Errors: `Forbidden` (provider), `NotFound`.
    pub async fn get(&self, who: &Principal, id: &str) -> Result<AuditRequestRecord, AuditError> {
        require(who, READ_ROLES, "read audit requests")?;
        let key = id.to_string();
        let max = self.cfg.max_attempts;
        let mut record = self
            .db
            .read(move |c| sql::load_record(c, &key, max))
            .await??
            .ok_or_else(|| AuditError::not_found("audit_request", id))?;
        self.explain_waits(std::slice::from_mut(&mut record)).await;
        Ok(record)
    }

    /// Add to each queued record with capability requirements, in
    /// `waiting_on`, what it waits on, one line per requirement that
    /// cannot be served now: "requirement 2 (microphone, exclusive):
    /// mic-01 held by lease lease_… (audit:x) until <expires_at>",
    /// "…: mic-01 offline", or, when every requirement has a free
    /// capability, "no agent has claimed it yet".
    async fn explain_waits(&self, records: &mut [AuditRequestRecord]) {
        let waiting = |r: &AuditRequestRecord| {
            r.status == AuditRequestStatus::Queued && !r.request.capability_requirements.is_empty()
        };
        if !records.iter().any(waiting) {
            return;
        }
        let dir = self.leases.directory().await;
        let held = self
            .leases
            .list(LeaseFilter {
                active_only: true,
                ..LeaseFilter::default()
            })
            .await;
        for record in records.iter_mut().filter(|r| waiting(r)) {
            let mut lines = Vec::new();
            for (i, r) in record.request.capability_requirements.iter().enumerate() {
                let mut fits: Vec<&CapabilityInfo> = dir.iter().filter(|c| serves(r, c)).collect();
                fits.sort_by(|a, b| a.capability_id.cmp(&b.capability_id));
                let holders = |c: &CapabilityInfo| -> Vec<&CapabilityLease> {
                    held.iter()
                        .filter(|l| {
                            l.capability_id == c.capability_id && l.status.holds_capability()
                        })
                        .filter(|l| {
                            r.mode == RequirementMode::Exclusive || l.mode == LeaseMode::Exclusive
                        })
                        .collect()
                };
                if fits.iter().any(|c| c.online && holders(c).is_empty()) {
                    continue;
                }
                let what = if fits.is_empty() {
                    "no registered capability matches".to_string()
                } else {
                    fits.iter()
                        .map(|c| {
                            if !c.online {
                                return format!("{} offline", c.capability_id);
                            }
                            let hs: Vec<String> = holders(c)
                                .iter()
                                .map(|l| match &l.expires_at {
                                    Some(t) => {
                                        format!("lease {} ({}) until {t}", l.lease_id, l.holder_ref)
                                    }
                                    None => format!("lease {} ({})", l.lease_id, l.holder_ref),
                                })
                                .collect();
                            format!("{} held by {}", c.capability_id, hs.join(", "))
                        })
                        .collect::<Vec<_>>()
                        .join("; ")
                };
                lines.push(format!(
                    "requirement {i} ({}, {}): {what}",
                    r.capability_type, r.mode
                ));
            }
            if lines.is_empty() {
                lines.push("no agent has claimed it yet".to_string());
            }
            record.waiting_on.extend(lines);
        }
    }

    /// One page of requests matching `filter` (`limit` 0 means 50; at most
    /// 500).
    ///
    /// Errors: `Forbidden` (provider), `Invalid` for `priority_min` above
    /// `priority_max`.
    pub async fn list(
        &self,
        who: &Principal,
        mut filter: AuditRequestFilter,
    ) -> Result<AuditRequestPage, AuditError> {
        require(who, READ_ROLES, "read audit requests")?;
        if let (Some(lo), Some(hi)) = (filter.priority_min, filter.priority_max) {
            if lo > hi {
                return Err(AuditError::invalid(
                    "priority_min",
                    format!("{lo} is above priority_max {hi}"),
                ));
            }
        }
        filter.limit = if filter.limit == 0 {
            50
        } else {
            filter.limit.min(500)
        };
        let max = self.cfg.max_attempts;
        let f = filter.clone();
        let (audit_requests, total) = self
            .db
            .read(move |c| sql::list_records(c, &f, max))
            .await??;
        let mut audit_requests = audit_requests;
        self.explain_waits(&mut audit_requests).await;
        Ok(AuditRequestPage {
            audit_requests,
            total,
            limit: filter.limit,
            offset: filter.offset,
        })
    }

    // -----------------------------------------------------------------
    // Claims

    /// Claim the next request of `req.audit_types`: highest priority
    /// first, then oldest; for a request with `capability_requirements`,
    /// together with its lease group (see the module doc). Waits up to
    /// `wait_ms` (cut to `max_claim_wait_ms`) for claimable work; `None`
    /// when there is none by then (or when the registry shuts down while it
    /// waits). Appends `audit_task_claimed`.
    ///
    /// Errors: `Forbidden` (not an audit agent), `Invalid` (`audit_types`
    /// empty, `agent_ref` not the caller's), `Lease` when the lease engine
    /// is unavailable or its queue is full.
    pub async fn claim(
        &self,
        who: &Principal,
        req: ClaimRequest,
    ) -> Result<Option<ClaimedTask>, AuditError> {
        require(who, AGENT_ROLES, "claim audit requests")?;
        req.validate()?;
        check_agent_ref(who, &req.agent_ref)?;
        let wait = Duration::from_millis(req.wait_ms.min(self.cfg.max_claim_wait_ms));
        let deadline = Instant::now() + wait;
        let mut types = req.audit_types.clone();
        types.sort();
        types.dedup();
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(task) = self
                .claim_round(who, &types, &req.agent_ref, deadline)
                .await?
            {
                return Ok(Some(task));
            }
            let now = Instant::now();
            if now >= deadline || self.closing.load(Ordering::SeqCst) {
                return Ok(None);
            }
            let poll = (now + Duration::from_millis(self.cfg.claim_poll_interval_ms)).min(deadline);
            tokio::select! {
                _ = &mut notified => {}
                _ = tokio::time::sleep_until(poll) => {}
            }
        }
    }

    /// One pass over the queue: claim the first request that can run now.
    async fn claim_round(
        &self,
        who: &Principal,
        types: &[AuditType],
        agent_ref: &str,
        deadline: Instant,
    ) -> Result<Option<ClaimedTask>, AuditError> {
        let mut skip = HashSet::new();
        loop {
            let wait_ms = u64::try_from(remaining(deadline).as_millis()).unwrap_or(u64::MAX);
            let params = PickParams {
                types: types.to_vec(),
                skip: skip.clone(),
                blocked: self.blocked_snapshot(),
                principal: who.name.clone(),
                agent_ref: agent_ref.to_string(),
                claim_id: format!("claim_{}", uuid::Uuid::new_v4().simple()),
                reservation_ms: i64::try_from(wait_ms.saturating_add(RESERVATION_MARGIN_MS))
                    .unwrap_or(i64::MAX),
            };
            let (p, cfg) = (params.clone(), self.cfg.clone());
            let picked = self.db.write(move |c| queue::pick(c, &p, &cfg)).await??;
            let row = match picked {
                Picked::Nothing => return Ok(None),
                Picked::Claimed { task, events } => {
                    self.bus.publish(events);
                    return Ok(Some(*task));
                }
                Picked::Reserved(row) => row,
            };
            skip.insert(row.audit_request_id.clone());
            let acquired = self.acquire(who, &row, &params, deadline).await;
            let (group_id, leases) = match acquired {
                Ok(Some(granted)) => granted,
                Ok(None) => {
                    self.unreserve(&row.audit_request_id, &params.claim_id)
                        .await;
                    continue;
                }
                Err(e) => {
                    self.unreserve(&row.audit_request_id, &params.claim_id)
                        .await;
                    return Err(e);
                }
            };
            let lease_ids: Vec<String> = leases.iter().map(|l| l.lease_id.clone()).collect();
            let (id, p, cfg) = (
                row.audit_request_id.clone(),
                params.clone(),
                self.cfg.clone(),
            );
            let done = self
                .db
                .write(move |c| queue::finalize(c, &id, &p, &cfg, group_id, leases))
                .await;
            match done {
                Ok(Ok(Some((task, events)))) => {
                    self.bus.publish(events);
                    return Ok(Some(task));
                }
                Ok(Ok(None)) => {
                    tracing::warn!(audit_request_id = %row.audit_request_id, "reservation lost while leasing; giving the leases back");
                    self.release_leases(who, &lease_ids, "audit_claim_lost")
                        .await;
                }
                Ok(Err(e)) => {
                    self.release_leases(who, &lease_ids, "audit_claim_failed")
                        .await;
                    self.unreserve(&row.audit_request_id, &params.claim_id)
                        .await;
                    return Err(e.into());
                }
                Err(e) => {
                    self.release_leases(who, &lease_ids, "audit_claim_failed")
                        .await;
                    return Err(e.into());
                }
            }
        }
    }

    /// Request the lease group of reserved request `row` for `who`; wait
    /// for it until `deadline`. `Some((lease_group_id, leases))` when every
    /// lease is granted; `None` (group withdrawn, requirement set marked
    /// not grantable) otherwise.
    async fn acquire(
        &self,
        who: &Principal,
        row: &RequestRow,
        p: &PickParams,
        deadline: Instant,
    ) -> Result<Option<(String, Vec<CapabilityLease>)>, AuditError> {
        let epoch = self.lease_epoch.load(Ordering::SeqCst);
        let req = &row.request;
        let visibility = self.cfg.visibility_timeout_seconds(req.time_budget_seconds);
        let longest_needed = req
            .capability_requirements
            .iter()
            .filter_map(|r| r.min_duration_seconds)
            .max()
            .unwrap_or(0);
        let duration = visibility
            .max(longest_needed)
            .min(self.leases.config().max_duration_seconds)
            .max(1);
        let wait_s = u32::try_from(remaining(deadline).as_secs()).unwrap_or(u32::MAX);
        let group_req = LeaseGroupRequest {
            capability_ids: Vec::new(),
            requirements: req.capability_requirements.clone(),
            holder_type: HolderType::AuditAgent,
            holder_ref: p.agent_ref.clone(),
            project_id: req.project_id.clone(),
            purpose: lease_purpose(req),
            priority: req.priority,
            requested_duration_seconds: duration,
            evidence_required: true,
            preempt_if_needed: req
                .capability_requirements
                .iter()
                .any(|r| r.preempt_if_needed),
            preempt_reason: self
                .cfg
                .preempt_reasons
                .for_type(req.audit_type)
                .map(str::to_string),
            queue_timeout_seconds: Some(
                wait_s
                    .saturating_add(1)
                    .saturating_add(QUEUE_TIMEOUT_MARGIN_S),
            ),
        };
        let group = match self.leases.request_group(who, group_req).await {
            Ok(g) => g,
            Err(
                e @ (LeaseError::NoMatchingCapability { .. }
                | LeaseError::UnknownCapability { .. }
                | LeaseError::CapabilityOffline { .. }
                | LeaseError::InvalidRequest { .. }),
            ) => {
                tracing::debug!(audit_request_id = %row.audit_request_id, error = %e, "capabilities of the audit request cannot be leased now");
                self.mark_blocked(row, epoch);
                return Ok(None);
            }
            Err(e) => return Err(e.into()),
        };
        if group.status.holds_capability() {
            return Ok(Some((group.lease_group_id, group.leases)));
        }
        let ids: Vec<String> = group.leases.iter().map(|l| l.lease_id.clone()).collect();
        if let Some(first) = ids.first() {
            let left = remaining(deadline);
            if !left.is_zero() {
                // Members of a group are granted in one commit: the first
                // one's grant is the group's.
                if let Err(e) = self.leases.wait_granted(first, left).await {
                    tracing::debug!(lease_id = %first, error = %e, "waiting for a lease group");
                }
            }
        }
        let mut leases = Vec::with_capacity(ids.len());
        for id in &ids {
            if let Some(l) = self.leases.get(id).await {
                leases.push(l);
            }
        }
        if leases.len() == ids.len() && leases.iter().all(|l| l.status.holds_capability()) {
            return Ok(Some((group.lease_group_id, leases)));
        }
        // Withdraw every member: a waiting group goes as a whole; a member
        // granted in the meantime is released too.
        self.release_leases(who, &ids, "audit_claim_not_grantable")
            .await;
        self.mark_blocked(row, epoch);
        Ok(None)
    }

    async fn unreserve(&self, id: &str, token: &str) {
        let (id, token) = (id.to_string(), token.to_string());
        let done = self
            .db
            .write(move |c| queue::unreserve(c, &id, &token))
            .await;
        if let Err(e) = done
            .map_err(AuditError::from)
            .and_then(|r| r.map_err(AuditError::from))
        {
            tracing::error!(error = %e, "cannot drop an audit reservation; it runs out by itself");
        }
    }

    /// Release `ids` on behalf of `who` (a holder or an admin). Leases that
    /// already ended are fine; other failures are logged (the leases end
    /// by their TTL anyway).
    async fn release_leases(&self, who: &Principal, ids: &[String], reason: &str) {
        for id in ids {
            match self.leases.release(who, id, Some(reason.to_string())).await {
                Ok(_)
                | Err(LeaseError::Expired { .. })
                | Err(LeaseError::NotUsable { .. })
                | Err(LeaseError::NotFound { .. }) => {}
                Err(e) => {
                    tracing::warn!(lease_id = %id, error = %e, "cannot release an audit claim's lease; it ends by its TTL")
                }
            }
        }
    }

    fn blocked_snapshot(&self) -> HashMap<String, u8> {
        let epoch = self.lease_epoch.load(Ordering::SeqCst);
        let ttl = Duration::from_millis(self.cfg.claim_poll_interval_ms);
        let mut blocked = lock(&self.blocked);
        blocked.retain(|_, b| b.epoch == epoch && b.at.elapsed() < ttl);
        blocked
            .iter()
            .map(|(k, b)| (k.clone(), b.priority))
            .collect()
    }

    fn mark_blocked(&self, row: &RequestRow, epoch: u64) {
        let Some(sig) = &row.requirements_sig else {
            return;
        };
        let mut blocked = lock(&self.blocked);
        if self.lease_epoch.load(Ordering::SeqCst) != epoch {
            // Something freed while we tried: the verdict is already stale.
            return;
        }
        let now = std::time::Instant::now();
        let entry = blocked.entry(sig.clone()).or_insert(Blocked {
            priority: row.priority,
            epoch,
            at: now,
        });
        if entry.epoch != epoch {
            entry.priority = row.priority;
        }
        entry.priority = entry.priority.max(row.priority);
        entry.epoch = epoch;
        entry.at = now;
    }

    /// Move the caller's claim on `id` to now + `extend_seconds` (default:
    /// its visibility timeout) and renew its leases for as long (at most
    /// the lease engine's maximum). A heartbeat.
    ///
    /// Errors: `Forbidden`, `NotFound`, `NotClaimHolder` (403),
    /// `ClaimExpired` / `ClaimEnded` (409).
    pub async fn extend(
        &self,
        who: &Principal,
        id: &str,
        req: ExtendRequest,
    ) -> Result<ExtendedClaim, AuditError> {
        require(who, AGENT_ROLES, "extend audit claims")?;
        req.validate()?;
        let (key, by) = (id.to_string(), who.name.clone());
        let claim = self
            .db
            .write(move |c| -> Result<ClaimInfo, AuditError> {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let row = sql::load_request(&tx, &key)?
                    .ok_or_else(|| AuditError::not_found("audit_request", &key))?;
                let mut claim = live_claim_of(&tx, &row, &by)?;
                let seconds = req
                    .extend_seconds
                    .unwrap_or(claim.visibility_timeout_seconds);
                let now = Utc::now();
                // On the steady clock, as every comparison with it.
                claim.expires_at = sql::steady_now() + TimeDelta::seconds(i64::from(seconds));
                sql::set_claim_deadline(&tx, &claim, claim.expires_at.timestamp_millis(), now)?;
                tx.commit()?;
                Ok(claim)
            })
            .await??;
        let seconds = req
            .extend_seconds
            .unwrap_or(claim.visibility_timeout_seconds)
            .min(self.leases.config().max_duration_seconds)
            .max(1);
        let mut leases = Vec::with_capacity(claim.lease_ids.len());
        for lease_id in &claim.lease_ids {
            let renewal = LeaseRenewRequest {
                requested_duration_seconds: Some(seconds),
            };
            match self.leases.renew(who, lease_id, renewal).await {
                Ok(l) => leases.push(l),
                Err(e) => {
                    tracing::warn!(lease_id = %lease_id, error = %e, "audit claim extended but its lease was not renewed");
                    if let Some(l) = self.leases.get(lease_id).await {
                        leases.push(l);
                    }
                }
            }
        }
        Ok(ExtendedClaim { claim, leases })
    }

    /// Give the claim on `id` back: the caller's own claim, or (admin) the
    /// request's live claim. The request returns to the queue (`failed`
    /// after `max_attempts`), the claim's leases are released. Event
    /// `audit_task_released` (`released_by_agent` / `released_by_admin`).
    ///
    /// Errors: `Forbidden`, `NotFound`, `NotClaimHolder`, `ClaimExpired`,
    /// `ClaimEnded`, `NotClaimed` (admin, request not claimed).
    pub async fn release(
        &self,
        who: &Principal,
        id: &str,
        req: ReleaseRequest,
    ) -> Result<AuditRequestRecord, AuditError> {
        if !who.is_admin() {
            require(who, AGENT_ROLES, "release audit claims")?;
        }
        req.validate()?;
        let (key, by, admin) = (id.to_string(), who.name.clone(), who.is_admin());
        let max = self.cfg.max_attempts;
        let (record, given) = self
            .db
            .write(move |c| -> Result<_, AuditError> {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let row = sql::load_request(&tx, &key)?
                    .ok_or_else(|| AuditError::not_found("audit_request", &key))?;
                let own = sql::latest_claim_of(&tx, &key, &by)?;
                let (claim, reason) = match own {
                    Some(c) if c.ended_at.is_none() => (c, ClaimEndReason::ReleasedByAgent),
                    _ if admin => {
                        let live = match (&row.claim_id, row.status) {
                            (Some(cid), AuditRequestStatus::Claimed) => sql::load_claim(&tx, cid)?,
                            _ => None,
                        };
                        let Some(c) = live else {
                            return Err(AuditError::NotClaimed {
                                audit_request_id: key,
                                status: row.status,
                            });
                        };
                        (c, ClaimEndReason::ReleasedByAdmin)
                    }
                    Some(c) => return Err(ended(&c)),
                    None => {
                        return Err(AuditError::NotClaimHolder {
                            audit_request_id: key,
                            principal: by,
                        })
                    }
                };
                let ending = Ending {
                    reason,
                    note: req.reason.as_deref(),
                    actor: &by,
                };
                let given = queue::give_back(&tx, &row, &claim, ending, max, Utc::now())?;
                let record = sql::load_record(&tx, &key, max)?
                    .ok_or(rusqlite::Error::QueryReturnedNoRows)?;
                tx.commit()?;
                Ok((record, given))
            })
            .await??;
        self.bus.publish([given.event]);
        self.release_leases(who, &given.claim.lease_ids, "audit_claim_released")
            .await;
        self.changed.notify_waiters();
        Ok(record)
    }

    /// Cancel the queued request `id`: its creator or an admin. It
    /// becomes `failed` with `failure_reason` "cancelled by <name>[: reason]"
    /// and is never claimed again (a claim that was leasing for it gives its
    /// leases back). Event `audit_task_released` with `data.reason`
    /// `cancelled` and `data.request_status` `failed`.
    ///
    /// Errors: `Forbidden` (not the creator nor an admin), `NotFound`,
    /// `NotQueued` (409: claimed — its holder or an admin releases it
    /// first — or already final).
    pub async fn cancel(
        &self,
        who: &Principal,
        id: &str,
        req: ReleaseRequest,
    ) -> Result<AuditRequestRecord, AuditError> {
        require(who, WRITE_ROLES, "cancel audit requests")?;
        req.validate()?;
        let (key, by, admin) = (id.to_string(), who.name.clone(), who.is_admin());
        let role = who.role;
        let max = self.cfg.max_attempts;
        let (record, event) = self
            .db
            .write(move |c| -> Result<_, AuditError> {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let row = sql::load_request(&tx, &key)?
                    .ok_or_else(|| AuditError::not_found("audit_request", &key))?;
                if !admin && row.created_by != by {
                    return Err(AuditError::Forbidden {
                        role,
                        action: "cancel audit requests created by others",
                        allowed: vec!["the request's creator", "admin"],
                    });
                }
                if row.status != AuditRequestStatus::Queued {
                    return Err(AuditError::NotQueued {
                        audit_request_id: key,
                        status: row.status,
                    });
                }
                let failure = match &req.reason {
                    Some(r) => format!("cancelled by {by}: {r}"),
                    None => format!("cancelled by {by}"),
                };
                let now = Utc::now();
                sql::set_request_status(
                    &tx,
                    &key,
                    AuditRequestStatus::Failed,
                    Some(&failure),
                    now,
                )?;
                let event = events::append(
                    &tx,
                    NewEvent::new(
                        EventType::AuditTaskReleased,
                        by.clone(),
                        json!({
                            "reason": "cancelled",
                            "note": req.reason,
                            "request_status": AuditRequestStatus::Failed,
                            "attempts": row.attempts,
                            "max_attempts": max,
                            "failure_reason": failure,
                        }),
                    )
                    .audit_request(key.clone()),
                )?;
                let record = sql::load_record(&tx, &key, max)?
                    .ok_or(rusqlite::Error::QueryReturnedNoRows)?;
                tx.commit()?;
                Ok((record, event))
            })
            .await??;
        self.bus.publish([event]);
        self.changed.notify_waiters();
        Ok(record)
    }

    /// Accept the result of the caller's live claim on `id`: store it with
    /// its findings, used capabilities and artifact refs, release the
    /// claim's leases, and complete the request (`audit_task_completed`;
    /// an `audit_completed` message to its source thread and, for a chief,
    /// an `audit_handoff` message to `handoff_target`) — or, for status
    /// `needs_retry`, return it to the queue (`audit_task_released`).
    ///
    /// Errors, checked in this order: `Forbidden`, `NotFound` (unknown id),
    /// `NotClaimHolder` (403), `ClaimExpired` (409, past the visibility
    /// timeout), `ClaimEnded` (409, e.g. a result was already accepted),
    /// then every field rule at once: `Invalid` for one, `InvalidFields`
    /// for several (`result.validate()`, a chief without `final_decision`,
    /// `audit_request_id` not the path's, `audit_type` not the request's,
    /// an output field of another audit type, a repeated `finding_id`, an
    /// unknown `handoff_target`; `artifact_refs` or findings'
    /// `evidence_ref_ids` naming artifacts the registry does not know,
    /// with `details.field` the first such field and the message listing
    /// every unknown id). Nothing is stored on error.
    pub async fn submit_result(
        &self,
        who: &Principal,
        id: &str,
        result: AuditTaskResult,
    ) -> Result<AuditRequestRecord, AuditError> {
        require(who, AGENT_ROLES, "post audit results")?;
        // Every field error of the body is answered at once.
        let early = result.validate().err().map(AuditError::from);
        let (key, by) = (id.to_string(), who.name.clone());
        let max = self.cfg.max_attempts;
        let (record, events, lease_ids) = self
            .db
            .write(move |c| -> Result<_, AuditError> {
                let tx = c.transaction_with_behavior(TransactionBehavior::Immediate)?;
                let row = sql::load_request(&tx, &key)?
                    .ok_or_else(|| AuditError::not_found("audit_request", &key))?;
                let claim = live_claim_of(&tx, &row, &by)?;
                let mut errors: Vec<AuditError> = early.into_iter().collect();
                if result.audit_type == AuditType::Chief && result.chief.final_decision.is_none() {
                    errors.push(AuditError::invalid(
                        "final_decision",
                        "a chief audit result carries final_decision",
                    ));
                }
                if result.audit_request_id != key {
                    errors.push(AuditError::invalid(
                        "audit_request_id",
                        format!(
                            "`{}` is not the request `{key}` this result is posted to",
                            result.audit_request_id
                        ),
                    ));
                }
                if result.audit_type != row.audit_type {
                    errors.push(AuditError::invalid(
                        "audit_type",
                        format!(
                            "request `{key}` is a `{}` audit; the result says `{}`",
                            row.audit_type, result.audit_type
                        ),
                    ));
                }
                if let Err(e) = check_result_shape(&result) {
                    errors.push(e);
                }
                if let Err(e) = check_artifacts_exist(&tx, &row.request, &result) {
                    errors.push(e);
                }
                if let Some(target) = &result.chief.handoff_target {
                    if let Err(e) = threads::require_registered(&tx, "handoff_target", target) {
                        errors.push(e);
                    }
                }
                if !errors.is_empty() {
                    return Err(AuditError::fields(errors));
                }
                let now = Utc::now();
                sql::insert_result(&tx, &result, &claim.claim_id, &by, now)?;
                let events = if result.status == AuditResultStatus::NeedsRetry {
                    let ending = Ending {
                        reason: ClaimEndReason::NeedsRetry,
                        note: Some(&result.summary),
                        actor: &by,
                    };
                    vec![queue::give_back(&tx, &row, &claim, ending, max, now)?.event]
                } else {
                    complete(&tx, &row, &claim, &result, &by, now)?
                };
                let record = sql::load_record(&tx, &key, max)?
                    .ok_or(rusqlite::Error::QueryReturnedNoRows)?;
                tx.commit()?;
                Ok((record, events, claim.lease_ids))
            })
            .await??;
        self.bus.publish(events);
        self.release_leases(who, &lease_ids, "audit_result_submitted")
            .await;
        self.changed.notify_waiters();
        Ok(record)
    }

    /// The newest stored result of `id` (the accepted one once the request
    /// is `completed`).
    ///
    /// Errors: `Forbidden` (provider), `NotFound`, `NoResult`.
    pub async fn result(&self, who: &Principal, id: &str) -> Result<AuditTaskResult, AuditError> {
        require(who, READ_ROLES, "read audit results")?;
        let key = id.to_string();
        let (row, result) = self
            .db
            .read(move |c| -> rusqlite::Result<_> {
                Ok((sql::load_request(c, &key)?, sql::latest_result(c, &key)?))
            })
            .await??;
        let row = row.ok_or_else(|| AuditError::not_found("audit_request", id))?;
        result.ok_or_else(|| AuditError::NoResult {
            audit_request_id: id.to_string(),
            status: row.status,
        })
    }

    // -----------------------------------------------------------------
    // Threads

    /// Register (or update) a thread; `true` when it is new.
    ///
    /// Errors: `Forbidden` (viewer, provider), `Invalid`.
    pub async fn register_thread(
        &self,
        who: &Principal,
        reg: ThreadRegistration,
    ) -> Result<(ThreadRecord, bool), AuditError> {
        require(who, WRITE_ROLES, "register threads")?;
        reg.validate()?;
        let by = who.name.clone();
        Ok(self
            .db
            .write(move |c| threads::register(c, &reg, &by))
            .await??)
    }

    /// Registered threads matching `filter`.
    pub async fn threads(
        &self,
        who: &Principal,
        filter: ThreadFilter,
    ) -> Result<Vec<ThreadRecord>, AuditError> {
        require(who, READ_ROLES, "read threads")?;
        Ok(self.db.read(move |c| threads::list(c, &filter)).await??)
    }

    /// The thread `thread_ref`. Errors: `Forbidden`, `NotFound`.
    pub async fn thread(
        &self,
        who: &Principal,
        thread_ref: &str,
    ) -> Result<ThreadRecord, AuditError> {
        require(who, READ_ROLES, "read threads")?;
        let key = thread_ref.to_string();
        self.db
            .read(move |c| threads::get(c, &key))
            .await??
            .ok_or_else(|| AuditError::not_found("thread", thread_ref))
    }

    /// Post `msg` to `to`'s inbox; the sender is the caller.
    ///
    /// Errors: `Forbidden`, `NotFound` (`to`), `Invalid` (unknown
    /// `from_thread_ref` or `audit_request_id`).
    pub async fn post_message(
        &self,
        who: &Principal,
        to: &str,
        msg: MessagePost,
    ) -> Result<ThreadMessage, AuditError> {
        require(who, WRITE_ROLES, "post thread messages")?;
        msg.validate()?;
        let (to, by) = (to.to_string(), who.name.clone());
        self.db
            .write(move |c| threads::post(c, &to, &msg, &by))
            .await?
    }

    /// Messages to `to` after `message_id` `after`, oldest first, at most
    /// `limit` (0 means 100; at most 1000).
    ///
    /// Errors: `Forbidden`, `NotFound` (`to`).
    pub async fn messages(
        &self,
        who: &Principal,
        to: &str,
        after: u64,
        limit: u32,
    ) -> Result<Vec<ThreadMessage>, AuditError> {
        require(who, READ_ROLES, "read thread messages")?;
        let limit = if limit == 0 { 100 } else { limit.min(1000) };
        let key = to.to_string();
        let (known, messages) = self
            .db
            .read(move |c| -> rusqlite::Result<_> {
                Ok((
                    threads::exists(c, &key)?,
                    threads::messages(c, &key, after, limit)?,
                ))
            })
            .await??;
        if !known {
            return Err(AuditError::not_found("thread", to));
        }
        Ok(messages)
    }

    // -----------------------------------------------------------------
    // Sweeper

    /// Take back every claim past its visibility timeout now: the request
    /// returns to the queue (or `failed` after `max_attempts`), the claim's
    /// leases are released. Returns how many claims were taken back.
    pub async fn sweep_now(&self) -> Result<usize, AuditError> {
        let max = self.cfg.max_attempts;
        let given = self
            .db
            .write(move |c| queue::expire_due(c, SYSTEM_PRINCIPAL, max))
            .await??;
        if given.is_empty() {
            return Ok(0);
        }
        self.bus.publish(given.iter().map(|g| g.event.clone()));
        for g in &given {
            tracing::info!(
                audit_request_id = %g.claim.audit_request_id,
                claim_id = %g.claim.claim_id,
                agent_ref = %g.claim.agent_ref,
                request_status = %g.status,
                "audit claim timed out"
            );
            self.release_leases(&self.system, &g.claim.lease_ids, "audit_claim_expired")
                .await;
        }
        self.changed.notify_waiters();
        Ok(given.len())
    }

    /// The background task: every `sweep_interval_ms` take back timed-out
    /// claims, and watch the event stream for freed capabilities (which
    /// wakes waiting claims). Ends when `shutdown` turns true or its
    /// sender is dropped; a sweep in progress finishes first, and claims
    /// still waiting for work answer at once.
    pub async fn run_sweeper(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(Duration::from_millis(self.cfg.sweep_interval_ms));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut events = Some(self.bus.subscribe_shared());
        loop {
            if *shutdown.borrow() {
                break;
            }
            tokio::select! {
                _ = tick.tick() => {
                    if let Err(e) = self.sweep_now().await {
                        tracing::error!(error = %e, "audit claim sweep failed; retrying next interval");
                    }
                }
                ev = next_event(&mut events) => match ev {
                    Ok(ev) => {
                        if frees_capacity(&ev) {
                            self.capacity_changed();
                        }
                    }
                    Err(broadcast::error::RecvError::Lagged(_)) => self.capacity_changed(),
                    Err(broadcast::error::RecvError::Closed) => events = None,
                },
                changed = shutdown.changed() => {
                    if changed.is_err() {
                        break;
                    }
                }
            }
        }
        self.closing.store(true, Ordering::SeqCst);
        self.changed.notify_waiters();
        tracing::debug!("audit sweeper stopped");
    }

    /// Spawn [`run_sweeper`](Self::run_sweeper) on the current runtime.
    pub fn spawn_sweeper(self: &Arc<Self>, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(self.clone().run_sweeper(shutdown))
    }

    fn capacity_changed(&self) {
        self.lease_epoch.fetch_add(1, Ordering::SeqCst);
        self.changed.notify_waiters();
    }
}

async fn next_event(
    rx: &mut Option<broadcast::Receiver<Arc<CapabilityEvent>>>,
) -> Result<Arc<CapabilityEvent>, broadcast::error::RecvError> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}

/// Events after which leases that could not be granted may be grantable:
/// a lease that was held ended, or capabilities or providers changed.
fn frees_capacity(ev: &CapabilityEvent) -> bool {
    match ev.event_type {
        EventType::LeaseReleased | EventType::LeaseExpired | EventType::LeasePreempted => {
            ev.data.get("granted_at").is_some_and(|v| !v.is_null())
        }
        EventType::CapabilityRegistered
        | EventType::CapabilityHealthChanged
        | EventType::CapabilityMaintenanceEnded
        | EventType::ProviderRegistered => true,
        _ => false,
    }
}

/// The error for a claim of the caller's that has ended.
fn ended(claim: &ClaimInfo) -> AuditError {
    match claim.end_reason {
        Some(ClaimEndReason::VisibilityTimeout) => AuditError::ClaimExpired {
            audit_request_id: claim.audit_request_id.clone(),
            claim_id: claim.claim_id.clone(),
            expired_at: claim.expires_at,
        },
        reason => AuditError::ClaimEnded {
            audit_request_id: claim.audit_request_id.clone(),
            claim_id: claim.claim_id.clone(),
            reason: reason.unwrap_or(ClaimEndReason::Completed),
        },
    }
}

/// The caller's live claim on `row`, checked: it exists (else 403), has
/// not ended and is within its visibility timeout (else 409).
fn live_claim_of(
    conn: &crate::sql::Connection,
    row: &RequestRow,
    principal: &str,
) -> Result<ClaimInfo, AuditError> {
    let not_holder = || AuditError::NotClaimHolder {
        audit_request_id: row.audit_request_id.clone(),
        principal: principal.to_string(),
    };
    let claim =
        sql::latest_claim_of(conn, &row.audit_request_id, principal)?.ok_or_else(not_holder)?;
    if claim.ended_at.is_some() {
        return Err(ended(&claim));
    }
    if claim.expires_at.timestamp_millis() <= sql::now_ms() {
        return Err(AuditError::ClaimExpired {
            audit_request_id: claim.audit_request_id.clone(),
            claim_id: claim.claim_id.clone(),
            expired_at: claim.expires_at,
        });
    }
    if row.claim_id.as_deref() != Some(claim.claim_id.as_str()) {
        return Err(not_holder());
    }
    Ok(claim)
}

/// Complete `row` with its accepted final `result` (inside the caller's
/// transaction): end the claim, `completed`, the event, and the messages
/// to the source thread and the handoff target.
fn complete(
    tx: &crate::sql::Connection,
    row: &RequestRow,
    claim: &ClaimInfo,
    result: &AuditTaskResult,
    by: &str,
    now: shared_protocol::Timestamp,
) -> rusqlite::Result<Vec<CapabilityEvent>> {
    sql::end_claim(tx, &claim.claim_id, ClaimEndReason::Completed, now)?;
    sql::set_request_status(
        tx,
        &row.audit_request_id,
        AuditRequestStatus::Completed,
        None,
        now,
    )?;
    let id = row.audit_request_id.as_str();
    let event = events::append(
        tx,
        NewEvent::new(
            EventType::AuditTaskCompleted,
            by,
            json!({
                "claim_id": claim.claim_id,
                "audit_type": result.audit_type,
                "result_status": result.status,
                "decision": result.decision,
                "confidence": result.confidence,
                "findings": result.findings.len(),
                "artifact_refs": result.artifact_refs,
                "used_capabilities": result.used_capabilities,
                "final_decision": result.chief.final_decision,
                "handoff_target": result.chief.handoff_target,
                "request_status": AuditRequestStatus::Completed,
                "result_sha256": shared_protocol::chain::record_digest(
                    &serde_json::to_value(result)
                        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?,
                ),
            }),
        )
        .audit_request(id),
    )?;
    if let Some(source) = &row.request.source_thread_ref {
        threads::insert_message(
            tx,
            source,
            None,
            SYSTEM_PRINCIPAL,
            "audit_completed",
            Some(id),
            &json!({
                "audit_request_id": id,
                "audit_type": result.audit_type,
                "status": result.status,
                "decision": result.decision,
                "summary": result.summary,
                "findings": result.findings.len(),
                "required_actions": result.required_actions,
                "submitted_by": by,
            }),
        )?;
    }
    if let Some(target) = &result.chief.handoff_target {
        threads::insert_message(
            tx,
            target,
            row.request.source_thread_ref.as_deref(),
            SYSTEM_PRINCIPAL,
            "audit_handoff",
            Some(id),
            &json!({
                "audit_request_id": id,
                "final_decision": result.chief.final_decision,
                "overall_risk_level": result.chief.overall_risk_level,
                "blocking_reasons": result.chief.blocking_reasons,
                "recommended_next_step": result.chief.recommended_next_step,
                "summary": result.summary,
                "submitted_by": by,
            }),
        )?;
    }
    Ok(vec![event])
}

/// `agent_ref` must name the caller (its principal, or
/// `<principal>:<instance>` / `<principal>/<instance>`); admins may name
/// anyone. The lease engine applies the same rule to `holder_ref`.
fn check_agent_ref(who: &Principal, agent_ref: &str) -> Result<(), AuditError> {
    let own = agent_ref == who.name
        || agent_ref
            .strip_prefix(who.name.as_str())
            .is_some_and(|rest| rest.starts_with(':') || rest.starts_with('/'));
    if own || who.is_admin() {
        return Ok(());
    }
    Err(AuditError::invalid(
        "agent_ref",
        format!(
            "`{agent_ref}` is not the caller `{}` (use `{}` or `{}:<instance>`)",
            who.name, who.name, who.name
        ),
    ))
}

/// The JSON keys an extension struct carries (its `Some` fields).
fn present_keys<T: Serialize>(v: &T) -> Vec<String> {
    match serde_json::to_value(v) {
        Ok(Value::Object(m)) => m.keys().cloned().collect(),
        _ => Vec::new(),
    }
}

/// Refuse the first field that belongs to another audit type's extension.
fn check_sections(
    audit_type: AuditType,
    kind: &str,
    sections: [(AuditType, &str, Vec<String>); 4],
) -> Result<(), AuditError> {
    for (t, section, keys) in sections {
        if t == audit_type {
            continue;
        }
        if let Some(k) = keys.first() {
            return Err(AuditError::invalid(
                k.clone(),
                format!(
                    "`{k}` is a {t} audit {kind} (seed 001 {section}); this is a `{audit_type}` audit"
                ),
            ));
        }
    }
    Ok(())
}

/// Protocol rules of a request beyond its own `validate`.
fn check_request_shape(req: &AuditTaskRequest, lease_max_seconds: u32) -> Result<(), AuditError> {
    if req.protocol_version.split('.').next() != Some("1") {
        return Err(AuditError::invalid(
            "protocol_version",
            format!(
                "`{}` is not supported; this registry speaks {}",
                req.protocol_version,
                shared_protocol::PROTOCOL_VERSION
            ),
        ));
    }
    if req.response_mode != "structured_json" {
        return Err(AuditError::invalid(
            "response_mode",
            format!(
                "`{}` is not supported; use `structured_json`",
                req.response_mode
            ),
        ));
    }
    check_sections(
        req.audit_type,
        "input",
        [
            (AuditType::Software, "§9.1", present_keys(&req.software)),
            (AuditType::Hardware, "§10.1", present_keys(&req.hardware)),
            (
                AuditType::Multimodal,
                "§11.1",
                present_keys(&req.multimodal),
            ),
            (AuditType::Chief, "§12.1", present_keys(&req.chief)),
        ],
    )?;
    if req.capability_requirements.len() > MAX_GROUP_MEMBERS {
        return Err(AuditError::invalid(
            "capability_requirements",
            format!(
                "{} requirements; at most {MAX_GROUP_MEMBERS} capabilities are leased together",
                req.capability_requirements.len()
            ),
        ));
    }
    for (i, r) in req.capability_requirements.iter().enumerate() {
        if let Some(min) = r.min_duration_seconds.filter(|m| *m > lease_max_seconds) {
            return Err(AuditError::invalid(
                format!("capability_requirements[{i}].min_duration_seconds"),
                format!("{min} s is above the registry's longest lease of {lease_max_seconds} s"),
            ));
        }
    }
    Ok(())
}

/// Protocol rules of a result beyond its own `validate`.
fn check_result_shape(result: &AuditTaskResult) -> Result<(), AuditError> {
    check_sections(
        result.audit_type,
        "output",
        [
            (AuditType::Software, "§9.2", present_keys(&result.software)),
            (AuditType::Hardware, "§10.2", present_keys(&result.hardware)),
            (
                AuditType::Multimodal,
                "§11.2",
                present_keys(&result.multimodal),
            ),
            (AuditType::Chief, "§12.2", present_keys(&result.chief)),
        ],
    )?;
    for (i, f) in result.findings.iter().enumerate() {
        if result.findings[..i]
            .iter()
            .any(|g| g.finding_id == f.finding_id)
        {
            return Err(AuditError::invalid(
                format!("findings[{i}].finding_id"),
                format!("`{}` appears twice in this result", f.finding_id),
            ));
        }
    }
    Ok(())
}

/// What makes two requests' capability needs interchangeable for "can it
/// be granted now": audit type (it picks the preempt reason) and each
/// requirement's type, mode, tags, fallback and preemption flag.
fn requirements_signature(req: &AuditTaskRequest) -> Option<String> {
    if req.capability_requirements.is_empty() {
        return None;
    }
    let mut parts: Vec<String> = req
        .capability_requirements
        .iter()
        .map(|r| {
            let mut tags = r.preferred_node_tags.clone();
            tags.sort();
            json!([
                r.capability_type,
                r.mode,
                tags,
                r.fallback_allowed,
                r.preempt_if_needed
            ])
            .to_string()
        })
        .collect();
    parts.sort();
    Some(format!("{}|{}", req.audit_type, parts.join(",")))
}

/// The lease `purpose`: which audit, and its objective (200 characters at
/// most).
fn lease_purpose(req: &AuditTaskRequest) -> String {
    let text = format!(
        "audit {} ({}): {}",
        req.audit_request_id, req.audit_type, req.objective
    );
    // A lease purpose is one line (no control characters).
    text.chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(200)
        .collect()
}

/// The requirements of `reqs` that no capability of `dir` could ever serve,
/// whether online or not: the lease engine's rule (same type, the
/// capability's own lease mode, every preferred tag unless
/// `fallback_allowed`), with a reason naming the nearest capabilities.
fn unsatisfiable(
    reqs: &[CapabilityRequirement],
    dir: &[CapabilityInfo],
) -> Vec<UnsatisfiableRequirement> {
    let mut out = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        let mut of_type: Vec<&CapabilityInfo> = dir
            .iter()
            .filter(|c| c.capability_type == r.capability_type)
            .collect();
        of_type.sort_by(|a, b| a.capability_id.cmp(&b.capability_id));
        let list = |cs: &[&CapabilityInfo], what: &dyn Fn(&CapabilityInfo) -> String| {
            cs.iter()
                .map(|c| format!("{} {}", c.capability_id, what(c)))
                .collect::<Vec<_>>()
                .join(", ")
        };
        let ty = r.capability_type;
        let mode = r.mode;
        if of_type.is_empty() {
            out.push(UnsatisfiableRequirement {
                requirement_index: i,
                reason: format!("no {ty} is registered"),
            });
            continue;
        }
        let moded: Vec<&CapabilityInfo> = of_type
            .iter()
            .copied()
            .filter(|c| mode_fits(mode, c))
            .collect();
        if moded.is_empty() {
            out.push(UnsatisfiableRequirement {
                requirement_index: i,
                reason: format!(
                    "no {ty} offers {mode}; {}",
                    list(&of_type, &|c| format!("is {}", c.lease_mode))
                ),
            });
            continue;
        }
        if !r.fallback_allowed
            && !moded
                .iter()
                .any(|c| r.preferred_node_tags.iter().all(|t| c.tags.contains(t)))
        {
            out.push(UnsatisfiableRequirement {
                requirement_index: i,
                reason: format!(
                    "no {ty} offering {mode} has the tags [{}] (fallback_allowed is false); {}",
                    r.preferred_node_tags.join(", "),
                    list(&moded, &|c| format!("has [{}]", c.tags.join(", ")))
                ),
            });
        }
    }
    out
}

/// The lease engine's mode rule: an exclusive requirement takes an
/// exclusive capability, a shared one a shared capability.
fn mode_fits(mode: RequirementMode, c: &CapabilityInfo) -> bool {
    match mode {
        RequirementMode::Exclusive => c.lease_mode == LeaseMode::Exclusive,
        RequirementMode::SharedRead => c.lease_mode != LeaseMode::Exclusive,
    }
}

/// True when `c` can serve `r` (type, mode, tags unless fallback), online
/// or not.
fn serves(r: &CapabilityRequirement, c: &CapabilityInfo) -> bool {
    c.capability_type == r.capability_type
        && mode_fits(r.mode, c)
        && (r.fallback_allowed || r.preferred_node_tags.iter().all(|t| c.tags.contains(t)))
}

/// Every artifact id `result` names (`artifact_refs`, findings'
/// `evidence_ref_ids`) must be an artifact the registry knows: reported by
/// a session (`capability_artifacts`) or with its upload under way
/// (`artifact_pending_uploads`). A finding's evidence may also be one of
/// the request's own `evidence_refs` / `artifact_refs` or an audit
/// request (a chief's finding pointing at a sub-audit).
///
/// Errors: `Invalid` on the first field naming an unknown id, the message
/// listing every unknown id with its field.
fn check_artifacts_exist(
    tx: &crate::sql::Connection,
    request: &AuditTaskRequest,
    result: &AuditTaskResult,
) -> Result<(), AuditError> {
    let mut named: Vec<(String, &str)> = result
        .artifact_refs
        .iter()
        .map(|a| ("artifact_refs".to_string(), a.as_str()))
        .collect();
    for (i, f) in result.findings.iter().enumerate() {
        for e in &f.evidence_ref_ids {
            let given = request.evidence_refs.contains(e) || request.artifact_refs.contains(e);
            let audit: bool = tx
                .prepare_cached(
                    "SELECT EXISTS(SELECT 1 FROM audit_requests WHERE audit_request_id = ?1)",
                )?
                .query_row([e], |r| r.get(0))?;
            if !given && !audit {
                named.push((format!("findings[{i}].evidence_ref_ids"), e.as_str()));
            }
        }
    }
    if named.is_empty() {
        return Ok(());
    }
    let mut stmt = tx.prepare_cached(
        "SELECT EXISTS(SELECT 1 FROM capability_artifacts WHERE artifact_id = ?1)
             OR EXISTS(SELECT 1 FROM artifact_pending_uploads WHERE artifact_id = ?1)",
    )?;
    let mut unknown: Vec<(String, &str)> = Vec::new();
    for (field, id) in named {
        let known: bool = stmt.query_row([id], |r| r.get(0))?;
        if !known && !unknown.iter().any(|(f, u)| *f == field && *u == id) {
            unknown.push((field, id));
        }
    }
    let Some((first, _)) = unknown.first() else {
        return Ok(());
    };
    let list: Vec<String> = unknown
        .iter()
        .map(|(f, id)| format!("`{id}` ({f})"))
        .collect();
    Err(AuditError::invalid(
        first.clone(),
        format!("unknown artifacts: {}", list.join(", ")),
    ))
}
