//! The wait queue: who gets a capability when it frees (seed 001 §5, §6).
//!
//! Waiters are ordered by priority (higher first), then by arrival
//! (`queue_seq`, FIFO within a priority). A waiter is one request, or a
//! whole group request (all of its capabilities or none). With queue
//! aging (`aging.rs`) the priority is the *effective* one, which rises
//! while the request waits; waiters are moved to their new place when it
//! changes, before each scheduling pass. Preemption still compares own
//! priorities only.
//!
//! Scheduling walks the queue in that order with a set of *reserved*
//! capabilities: every capability a blocked waiter could use is reserved
//! for it, and no waiter ranked after it may take one. This is what gives
//! - FIFO within a priority and no starvation: a later arrival of equal or
//!   lower priority cannot overtake a blocked waiter, not even on a
//!   capability the blocked waiter only needs as part of a group;
//! - groups without hold-and-wait or deadlock: a group is granted only when
//!   every member can be granted at once, and while it waits it holds
//!   nothing (its free members are merely reserved, not leased), so two
//!   groups asking for the same capabilities in opposite orders are served
//!   one after the other in queue order;
//! - no writer starvation on shared capabilities: readers that arrive
//!   after a waiting exclusive request queue behind it.
//!
//! The price is that a capability reserved for a blocked waiter may stay
//! idle while that waiter waits for its other members.
//!
//! A capability that a failed health check holds out is reserved by no
//! waiter but the check's own lease: the others could not be granted it,
//! and the check that may bring it back must not wait behind them.
//!
//! Scheduling after an event only looks at waiters that could be affected:
//! those with a candidate among the *dirty* capabilities (freed, back
//! online, out of a window, or released from a reservation), and stops as
//! soon as every dirty capability is reserved.

use std::collections::HashSet;
use std::ops::Bound::{Excluded, Unbounded};

use shared_protocol::capability::LeaseMode;
use shared_protocol::event::EventType;
use shared_protocol::lease::{CapabilityLease, HolderType, LeaseStatus};

use super::clock::Now;
use super::error::LeaseError;
use super::model::{Book, Entry, RankKey, State, Tx, Waiter, Want, SYSTEM_ACTOR};
use super::preemption::{holder_block, request_may_preempt, PreemptionBlock};
use super::LeaseConfig;

/// What a waiter can do right now.
#[derive(Debug)]
pub(crate) enum Decision {
    /// Grant every member: (lease id, capability id).
    Grant(Vec<(String, String)>),
    /// Preempt `victims` (victim lease id, preempting lease id) and wait
    /// with members pinned to the capabilities being freed.
    Preempt {
        pins: Vec<(String, String)>,
        victims: Vec<(String, String)>,
    },
    /// Wait.
    Block,
}

/// One lease of a new request.
pub(crate) struct NewMember {
    pub want: Want,
    pub candidates: Vec<String>,
    /// Shown while waiting; fixed at grant.
    pub capability_id: String,
    pub mode: LeaseMode,
}

/// A new request (single or group) about to enter the engine.
pub(crate) struct Admission {
    pub principal: String,
    pub holder_type: HolderType,
    pub holder_ref: String,
    pub project_id: String,
    pub purpose: String,
    pub priority: u8,
    pub requested_duration_seconds: u32,
    pub evidence_required: bool,
    pub preempt_if_needed: bool,
    pub preempt_reason: Option<String>,
    pub queue_timeout_seconds: Option<u32>,
    pub lease_group_id: Option<String>,
    pub members: Vec<NewMember>,
}

/// A fresh lease id: `lease_` and 32 hex digits, time-ordered (see
/// [`crate::ids::time_ordered`]).
pub(crate) fn new_lease_id() -> String {
    crate::ids::time_ordered("lease_")
}

impl State {
    /// True while some holder of `capability_id` is being preempted.
    fn preemption_in_flight(&self, capability_id: &str) -> bool {
        self.holders.get(capability_id).is_some_and(|hs| {
            hs.iter()
                .any(|h| self.leases.get(h).is_some_and(Entry::being_preempted))
        })
    }

    /// Where a waiting lease may be granted now: only its pinned
    /// capability while the preemption it started runs, else every
    /// candidate.
    fn effective_candidates<'a>(&'a self, e: &'a Entry) -> &'a [String] {
        if let Some(p) = &e.book.pinned_capability_id {
            if self.preemption_in_flight(p) {
                return std::slice::from_ref(p);
            }
        }
        &e.candidates
    }

    /// Holders of `capability_id` that a lease in `mode` cannot sit beside:
    /// everyone for an exclusive lease, exclusive holders for a shared one.
    fn conflicting_holders(&self, capability_id: &str, mode: LeaseMode) -> Vec<&Entry> {
        let Some(hs) = self.holders.get(capability_id) else {
            return Vec::new();
        };
        hs.iter()
            .filter_map(|h| self.leases.get(h))
            .filter(|h| mode == LeaseMode::Exclusive || h.lease.mode == LeaseMode::Exclusive)
            .collect()
    }

    /// The mode `e` would hold `capability_id` in.
    fn mode_on(&self, e: &Entry, capability_id: &str) -> LeaseMode {
        e.book
            .want
            .mode()
            .or_else(|| self.dir.get(capability_id).map(|i| i.lease_mode))
            .unwrap_or(e.lease.mode)
    }

    /// Known, grantable to `e` (online, in service, not unhealthy; see
    /// [`super::CapabilityInfo::grantable_to`]), and no conflicting holder.
    fn grantable(&self, capability_id: &str, e: &Entry) -> bool {
        self.dir
            .get(capability_id)
            .is_some_and(|i| i.grantable_to(e.lease.holder_type, &e.lease.principal))
            && self
                .conflicting_holders(capability_id, self.mode_on(e, capability_id))
                .is_empty()
    }

    /// The capabilities a waiter reserves: its members' candidates, less
    /// those a failed health check holds out from it (it could not be
    /// granted them anyway, and must not keep the check itself waiting).
    fn waiter_candidates<'a>(&'a self, w: &'a Waiter) -> impl Iterator<Item = &'a String> + 'a {
        w.members
            .iter()
            .filter_map(|m| self.leases.get(m))
            .flat_map(move |e| {
                self.effective_candidates(e)
                    .iter()
                    .filter(move |c| !self.held_out_from(c, e))
            })
    }

    /// True when a failed health check holds `capability_id` out from `e`
    /// (anyone but the check's own lease).
    fn held_out_from(&self, capability_id: &str, e: &Entry) -> bool {
        self.dir.get(capability_id).is_some_and(|i| {
            i.check_failed.is_some()
                && !super::is_health_check(e.lease.holder_type, &e.lease.principal)
        })
    }

    fn reserve(&self, key: &RankKey, reserved: &mut HashSet<String>) {
        if let Some(w) = self.queue.get(key) {
            reserved.extend(self.waiter_candidates(w).cloned());
        }
    }

    /// Capabilities reserved by the waiters ranked before `key`.
    pub fn reservations_before(&self, key: &RankKey) -> HashSet<String> {
        let mut reserved = HashSet::new();
        for w in self.queue.range(..*key).map(|(_, w)| w) {
            reserved.extend(self.waiter_candidates(w).cloned());
        }
        reserved
    }

    /// What the waiter at `key` can do, given the capabilities `reserved`
    /// by waiters ranked before it. Pure: changes nothing.
    pub fn evaluate(
        &self,
        key: &RankKey,
        reserved: &HashSet<String>,
        cfg: &LeaseConfig,
    ) -> Decision {
        let Some(w) = self.queue.get(key) else {
            return Decision::Block;
        };
        let mut used: Vec<&str> = Vec::new();
        let mut assign = Vec::new();
        let mut blocked = Vec::new();
        for m in &w.members {
            let Some(e) = self.leases.get(m) else {
                return Decision::Block;
            };
            let free = self.effective_candidates(e).iter().find(|c| {
                !reserved.contains(c.as_str())
                    && !used.contains(&c.as_str())
                    && self.grantable(c, e)
            });
            match free {
                Some(c) => {
                    used.push(c);
                    assign.push((m.clone(), c.clone()));
                }
                None => blocked.push((m, e)),
            }
        }
        if blocked.is_empty() {
            return Decision::Grant(assign);
        }
        if !request_may_preempt(w, cfg) {
            if w.preempt_if_needed {
                tracing::debug!(
                    waiting_lease_ids = ?w.members,
                    block = ?PreemptionBlock::ReasonNotAllowed,
                    "preemption not allowed"
                );
            }
            return Decision::Block;
        }
        let mut pins = Vec::new();
        let mut victims = Vec::new();
        for (m, e) in blocked {
            let found = self.effective_candidates(e).iter().find_map(|c| {
                if reserved.contains(c.as_str()) || used.contains(&c.as_str()) {
                    return None;
                }
                let info = self.dir.get(c).filter(|i| i.grantable())?;
                let mut take = Vec::new();
                for h in self.conflicting_holders(c, self.mode_on(e, c)) {
                    if h.being_preempted() {
                        continue;
                    }
                    if let Some(block) = holder_block(info, h, w.priority) {
                        tracing::debug!(
                            waiting_lease_id = %m,
                            holder_lease_id = %h.lease.lease_id,
                            capability_id = %c,
                            ?block,
                            "preemption not allowed"
                        );
                        return None;
                    }
                    take.push(h.lease.lease_id.clone());
                }
                Some((c, take))
            });
            let Some((c, take)) = found else {
                return Decision::Block;
            };
            used.push(c);
            pins.push((m.clone(), c.clone()));
            victims.extend(take.into_iter().map(|v| (v, m.clone())));
        }
        Decision::Preempt { pins, victims }
    }

    /// Grant every member of the waiter at `key` its assigned capability.
    /// Returns the capabilities its reservation no longer covers.
    fn grant(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        key: &RankKey,
        assign: Vec<(String, String)>,
        actor: &str,
    ) -> HashSet<String> {
        let enqueued_at = self.queue.get(key).map(|w| w.enqueued_at);
        let (_, touched) = self.remove_waiter(key);
        for (id, cap) in assign {
            let Some(e) = self.leases.get(&id) else {
                continue;
            };
            let mode = self.mode_on(e, &cap);
            debug_assert!(self.conflicting_holders(&cap, mode).is_empty());
            let Some(e) = self.leases.get_mut(&id) else {
                continue;
            };
            let (deadline, expires_at) = now.after(e.book.requested_duration_seconds);
            e.lease.generation = Some(self.next_generation);
            self.next_generation += 1;
            e.lease.capability_id = cap.clone();
            e.lease.mode = mode;
            e.lease.status = LeaseStatus::Granted;
            e.lease.granted_at = Some(now.wall);
            e.lease.expires_at = Some(expires_at);
            e.lease.grace_until = None;
            e.deadline = Some(deadline);
            e.grace_deadline = None;
            e.held_since = Some(now.instant);
            e.book.pinned_capability_id = None;
            e.book.queue_deadline = None;
            e.candidates.clear();
            let holder_type = e.lease.holder_type;
            if let Some(m) = &self.metrics {
                let waited = enqueued_at.map_or(std::time::Duration::ZERO, |t| {
                    now.instant.saturating_duration_since(t)
                });
                m.granted(self.capability_type_of(&cap), holder_type.as_str(), waited);
            }
            self.holders.entry(cap).or_default().push(id.clone());
            self.record(tx, &id, Some((EventType::LeaseGranted, actor, Vec::new())));
        }
        touched
    }

    fn apply_preempt(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        cfg: &LeaseConfig,
        key: &RankKey,
        pins: Vec<(String, String)>,
        victims: Vec<(String, String)>,
    ) {
        let reason = self
            .queue
            .get(key)
            .and_then(|w| w.preempt_reason.clone())
            .unwrap_or_default();
        for (victim, by) in victims {
            self.start_preemption(tx, now, cfg, &victim, &by, &reason);
        }
        for (id, cap) in pins {
            let changed = match self.leases.get_mut(&id) {
                Some(e) if e.book.pinned_capability_id.as_deref() != Some(cap.as_str()) => {
                    e.book.pinned_capability_id = Some(cap);
                    true
                }
                _ => false,
            };
            if changed {
                self.record(tx, &id, None);
            }
        }
    }

    fn waiter_touches(&self, key: &RankKey, dirty: &HashSet<String>) -> bool {
        self.queue
            .get(key)
            .is_some_and(|w| self.waiter_candidates(w).any(|c| dirty.contains(c)))
    }

    /// Grant, preempt for, or leave waiting every waiter that the change of
    /// the `dirty` capabilities may concern, in queue order.
    pub fn schedule(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        cfg: &LeaseConfig,
        mut dirty: HashSet<String>,
    ) {
        self.rerank(now.instant, cfg.queue_aging.as_ref());
        dirty.extend(std::mem::take(&mut self.reranked));
        let mut reserved: HashSet<String> = HashSet::new();
        let mut cursor: Option<RankKey> = None;
        loop {
            if dirty.iter().all(|c| reserved.contains(c)) {
                break;
            }
            let next = match cursor {
                None => self.queue.keys().next().copied(),
                Some(k) => self
                    .queue
                    .range((Excluded(k), Unbounded))
                    .next()
                    .map(|(k, _)| *k),
            };
            let Some(key) = next else {
                break;
            };
            cursor = Some(key);
            if !self.waiter_touches(&key, &dirty) {
                self.reserve(&key, &mut reserved);
                continue;
            }
            match self.evaluate(&key, &reserved, cfg) {
                Decision::Grant(assign) => {
                    let touched = self.grant(tx, now, &key, assign, SYSTEM_ACTOR);
                    dirty.extend(touched);
                }
                Decision::Preempt { pins, victims } => {
                    self.apply_preempt(tx, now, cfg, &key, pins, victims);
                    self.reserve(&key, &mut reserved);
                }
                Decision::Block => self.reserve(&key, &mut reserved),
            }
        }
    }

    /// Enter a new request: record `lease_requested` for each of its
    /// leases, then grant it at once, start a preemption for it, or leave it
    /// waiting. Nothing is changed when it is refused.
    ///
    /// Errors: [`LeaseError::QueueFull`] when it would wait and
    /// `max_queue_len` requests already do.
    pub fn admit(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        cfg: &LeaseConfig,
        adm: Admission,
    ) -> Result<Vec<String>, LeaseError> {
        // Aged ranks first, so that the new request is placed among the
        // others as they rank now.
        self.rerank(now.instant, cfg.queue_aging.as_ref());
        let seq = self.next_seq;
        let key: RankKey = (std::cmp::Reverse(adm.priority), seq);
        let queue_deadline = adm.queue_timeout_seconds.map(|s| now.after(s));
        let mut ids = Vec::with_capacity(adm.members.len());
        for m in adm.members {
            let id = new_lease_id();
            let lease = CapabilityLease {
                lease_id: id.clone(),
                capability_id: m.capability_id,
                holder_type: adm.holder_type,
                holder_ref: adm.holder_ref.clone(),
                project_id: adm.project_id.clone(),
                purpose: adm.purpose.clone(),
                priority: adm.priority,
                status: LeaseStatus::Requested,
                requested_at: now.wall,
                granted_at: None,
                expires_at: None,
                grace_until: None,
                preempt_reason: adm.preempt_reason.clone(),
                evidence_required: adm.evidence_required,
                mode: m.mode,
                lease_group_id: adm.lease_group_id.clone(),
                preempted_by: None,
                ended_at: None,
                principal: adm.principal.clone(),
                generation: None,
                capability_selector: m.want.selector().cloned(),
            };
            let entry = Entry {
                lease,
                book: Book {
                    requested_duration_seconds: adm.requested_duration_seconds,
                    queue_seq: seq,
                    want: m.want,
                    preempt_if_needed: adm.preempt_if_needed,
                    request_preempt_reason: adm.preempt_reason.clone(),
                    queue_deadline: queue_deadline.map(|(_, wall)| wall),
                    pinned_capability_id: None,
                },
                deadline: None,
                grace_deadline: None,
                held_since: None,
                candidates: m.candidates,
            };
            self.leases.insert(id.clone(), entry);
            self.rank_of.insert(id.clone(), key);
            ids.push(id);
        }
        self.queue.insert(
            key,
            Waiter {
                members: ids.clone(),
                priority: adm.priority,
                enqueued_at: now.instant,
                preempt_if_needed: adm.preempt_if_needed,
                preempt_reason: adm.preempt_reason.clone(),
                queue_deadline: queue_deadline.map(|(at, _)| at),
            },
        );
        let reserved = self.reservations_before(&key);
        let decision = self.evaluate(&key, &reserved, cfg);
        if !matches!(decision, Decision::Grant(_)) && self.queue.len() > cfg.max_queue_len {
            self.queue.remove(&key);
            for id in &ids {
                self.leases.remove(id);
                self.rank_of.remove(id);
            }
            return Err(LeaseError::QueueFull {
                limit: cfg.max_queue_len,
            });
        }
        self.next_seq += 1;
        self.note_arrival(adm.priority, now.instant, cfg.queue_aging.as_ref());
        for id in &ids {
            self.record(
                tx,
                id,
                Some((
                    EventType::LeaseRequested,
                    adm.principal.as_str(),
                    Vec::new(),
                )),
            );
        }
        match decision {
            Decision::Grant(assign) => {
                self.grant(tx, now, &key, assign, &adm.principal);
            }
            Decision::Preempt { pins, victims } => {
                self.apply_preempt(tx, now, cfg, &key, pins, victims)
            }
            Decision::Block => {}
        }
        if !self.reranked.is_empty() {
            // Waiters the rerank moved ahead may take what is free now.
            self.schedule(tx, now, cfg, HashSet::new());
        }
        Ok(ids)
    }

    /// Number of waiting requests (a group counts once).
    pub fn queue_len(&self) -> usize {
        self.queue.len()
    }
}
