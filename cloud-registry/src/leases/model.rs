//! The in-memory lease model: the capability directory, who holds what, the
//! wait queue, and every transition of a lease (seed 001 §2.2.3, §5, §6).
//!
//! Everything here is synchronous and runs under the engine's state mutex.
//! A transition changes the model and records what must be persisted (the
//! lease row and its event) in a [`Tx`]; the engine hands the `Tx` to the
//! group committer and answers the caller only after it committed.
//!
//! Invariants kept by every transition:
//! - `holders[c]` lists exactly the live leases in a holding status on `c`,
//!   and never an exclusive lease beside any other lease;
//! - every waiter in `queue` is blocked: none of them could be granted
//!   given the waiters ranked before it (see `queue.rs`).

use std::cmp::Reverse;
use std::collections::{BTreeMap, HashMap, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use shared_protocol::capability::{
    CapabilityRequirement, CapabilitySelector, LeaseMode, RequirementMode,
};
use shared_protocol::event::EventType;
use shared_protocol::lease::{CapabilityLease, LeaseStatus};
use shared_protocol::Timestamp;
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use super::clock::Now;
use super::CapabilityInfo;

/// Actor recorded on events the engine causes on its own (expiry, grace
/// end, grants from the queue, preemption requests).
pub(crate) const SYSTEM_ACTOR: &str = "system";

/// An event to record with a row: its type, its actor, and the extra keys
/// merged into the lease JSON.
pub(crate) type EventSpec<'a> = (EventType, &'a str, Vec<(&'static str, Value)>);

/// Queue order: higher priority first, then arrival (`queue_seq`). The
/// priority is the waiter's effective one: its own, plus its boost when
/// queue aging is on (see `aging.rs`).
pub(crate) type RankKey = (Reverse<u8>, u64);

/// What a request asked for, kept so that a waiting request can be matched
/// against capabilities registered later and after a restart.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub(crate) enum Want {
    /// One capability by id, in the capability's own mode.
    Capability {
        capability_id: String,
        mode: LeaseMode,
    },
    /// Any capability matching a selector (seed 001 §5.1).
    Selector {
        selector: CapabilitySelector,
        #[serde(default)]
        mode: Option<LeaseMode>,
    },
    /// Any capability meeting a requirement (seed 001 §13).
    Requirement { requirement: CapabilityRequirement },
}

impl Want {
    /// The mode the lease will hold, when the request fixes it; `None`
    /// means "the granted capability's own mode".
    pub fn mode(&self) -> Option<LeaseMode> {
        match self {
            Want::Capability { mode, .. } => Some(*mode),
            Want::Selector { mode, .. } => *mode,
            Want::Requirement { requirement } => match requirement.mode {
                RequirementMode::Exclusive => Some(LeaseMode::Exclusive),
                RequirementMode::SharedRead => None,
            },
        }
    }

    /// The selector of a want by selector.
    pub fn selector(&self) -> Option<&CapabilitySelector> {
        match self {
            Want::Selector { selector, .. } => Some(selector),
            _ => None,
        }
    }

    /// True when `info` can serve this want.
    pub fn matches(&self, info: &CapabilityInfo) -> bool {
        match self {
            Want::Capability { capability_id, .. } => &info.capability_id == capability_id,
            Want::Selector { selector, mode } => {
                info.capability_type == selector.capability_type
                    && selector.tags.iter().all(|t| info.tags.contains(t))
                    && selector
                        .provider_id
                        .as_ref()
                        .is_none_or(|p| p == &info.provider_id)
                    && selector.node_id.as_ref().is_none_or(|n| n == &info.node_id)
                    && mode.is_none_or(|m| m == info.lease_mode)
            }
            Want::Requirement { requirement } => {
                let mode_ok = match requirement.mode {
                    RequirementMode::Exclusive => info.lease_mode == LeaseMode::Exclusive,
                    RequirementMode::SharedRead => info.lease_mode != LeaseMode::Exclusive,
                };
                info.capability_type == requirement.capability_type
                    && mode_ok
                    && (requirement.fallback_allowed || has_preferred_tags(requirement, info))
            }
        }
    }

    /// Capability ids that can serve this want, best first: for a
    /// requirement, those with all preferred tags first; then by id (a
    /// deterministic order, so equal inputs give equal grants).
    pub fn candidates(&self, dir: &HashMap<String, CapabilityInfo>) -> Vec<String> {
        if let Want::Capability { capability_id, .. } = self {
            return vec![capability_id.clone()];
        }
        let mut found: Vec<(bool, &str)> = dir
            .values()
            .filter(|info| self.matches(info))
            .map(|info| {
                let preferred = match self {
                    Want::Requirement { requirement } => has_preferred_tags(requirement, info),
                    _ => true,
                };
                (!preferred, info.capability_id.as_str())
            })
            .collect();
        found.sort();
        found.into_iter().map(|(_, id)| id.to_string()).collect()
    }

    /// The fixed capability id, for a want by id.
    pub fn fixed_capability(&self) -> Option<&str> {
        match self {
            Want::Capability { capability_id, .. } => Some(capability_id),
            _ => None,
        }
    }
}

fn has_preferred_tags(req: &CapabilityRequirement, info: &CapabilityInfo) -> bool {
    req.preferred_node_tags
        .iter()
        .all(|t| info.tags.contains(t))
}

/// Bookkeeping persisted beside the wire fields of a lease.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Book {
    /// The duration asked for; a grant and a renewal without a duration
    /// use it.
    pub requested_duration_seconds: u32,
    /// Arrival order, monotonic over the registry's life (queue age).
    pub queue_seq: u64,
    pub want: Want,
    pub preempt_if_needed: bool,
    /// The reason this request gives for preempting others (the lease's
    /// own `preempt_reason` may later say why it was preempted).
    pub request_preempt_reason: Option<String>,
    /// Wall rendering of the queue timeout.
    pub queue_deadline: Option<Timestamp>,
    /// The capability a waiting request has started a preemption on: it
    /// waits for that one while the preemption runs.
    pub pinned_capability_id: Option<String>,
}

/// A lease as persisted: the wire lease plus bookkeeping.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub lease: CapabilityLease,
    pub book: Book,
}

/// A live (not final) lease in memory.
#[derive(Debug, Clone)]
pub(crate) struct Entry {
    pub lease: CapabilityLease,
    pub book: Book,
    /// Monotonic expiry, while holding.
    pub deadline: Option<Instant>,
    /// Monotonic end of the grace period, while being preempted.
    pub grace_deadline: Option<Instant>,
    /// When it was granted, on the engine's monotonic clock, while holding
    /// (`benchlink_lease_hold_seconds`; across a restart: from the stored
    /// `granted_at`).
    pub held_since: Option<Instant>,
    /// Capabilities a waiting request may be granted, best first.
    pub candidates: Vec<String>,
}

impl Entry {
    pub fn row(&self) -> Row {
        Row {
            lease: self.lease.clone(),
            book: self.book.clone(),
        }
    }

    pub fn being_preempted(&self) -> bool {
        matches!(
            self.lease.status,
            LeaseStatus::PreemptRequested | LeaseStatus::GracePeriod
        )
    }
}

/// A waiting request: one lease, or every lease of a group (granted
/// together or not at all).
#[derive(Debug, Clone)]
pub(crate) struct Waiter {
    /// Lease ids, in request order.
    pub members: Vec<String>,
    /// The request's own priority (preemption compares this one; the
    /// queue ranks by the aged one in the key).
    pub priority: u8,
    /// When it arrived, on the engine's monotonic clock (its age for
    /// queue aging).
    pub enqueued_at: Instant,
    pub preempt_if_needed: bool,
    pub preempt_reason: Option<String>,
    pub queue_deadline: Option<Instant>,
}

/// An event to append once the transaction commits.
#[derive(Debug, Clone)]
pub(crate) struct PendingEvent {
    pub event_type: EventType,
    pub actor: String,
    pub provider_id: Option<String>,
    pub lease: CapabilityLease,
    /// Extra keys merged into the lease JSON (`notice`, `reason`).
    pub extra: Vec<(&'static str, Value)>,
}

/// What one operation must persist, in order.
#[derive(Debug, Default)]
pub(crate) struct Tx {
    pub rows: Vec<Row>,
    pub events: Vec<PendingEvent>,
    /// Idempotency key rows to write or delete with them.
    pub keys: Vec<super::idempotency::KeyChange>,
}

impl Tx {
    pub fn is_empty(&self) -> bool {
        self.rows.is_empty() && self.events.is_empty() && self.keys.is_empty()
    }
}

/// A `Tx` on its way to the committer, with the channel on which the
/// caller waits for the commit (`Err` carries the failure's message).
pub(crate) struct Piece {
    pub tx: Tx,
    pub done: Option<oneshot::Sender<Result<(), String>>>,
}

/// The whole working model.
pub(crate) struct State {
    /// The capability directory (from registration, status, heartbeats).
    pub dir: HashMap<String, CapabilityInfo>,
    /// Capability id → live leases in a holding status on it.
    pub holders: HashMap<String, Vec<String>>,
    /// Every live lease (`requested` or holding) by id.
    pub leases: HashMap<String, Entry>,
    /// Waiting requests in grant order.
    pub queue: BTreeMap<RankKey, Waiter>,
    /// Lease id → its waiter's key, for waiting leases.
    pub rank_of: HashMap<String, RankKey>,
    /// Earliest time a waiter's aged priority may change (`None`: never,
    /// or queue aging off); see [`State::rerank`].
    pub next_rerank: Option<Instant>,
    /// Candidates of waiters moved by a rerank and not scheduled since.
    pub reranked: HashSet<String>,
    /// Leases that reached a final status and whose row is not committed
    /// yet (the committer removes them), so that an operation on them
    /// answers with the final status.
    pub recent_final: HashMap<String, CapabilityLease>,
    pub next_seq: u64,
    /// The `generation` the next grant takes (grant order, never reused:
    /// restored from the table's largest at start).
    pub next_generation: u64,
    /// To the committer; `None` once shut down.
    pub sender: Option<mpsc::UnboundedSender<Piece>>,
    /// False while recovering from a failed commit.
    pub available: bool,
    /// Where grants, ends and the queue depth are recorded (`None`: not
    /// recorded); see `LeaseEngine::attach_metrics`.
    pub metrics: Option<crate::metrics::LeaseMetrics>,
}

/// Why an operation found no usable engine.
pub(crate) fn unavailable(st: &State) -> Option<&'static str> {
    if st.sender.is_none() {
        Some("shut down")
    } else if !st.available {
        Some("recovering from a failed commit; retry shortly")
    } else {
        None
    }
}

impl State {
    pub fn new(sender: mpsc::UnboundedSender<Piece>) -> Self {
        Self {
            dir: HashMap::new(),
            holders: HashMap::new(),
            leases: HashMap::new(),
            queue: BTreeMap::new(),
            rank_of: HashMap::new(),
            next_rerank: None,
            reranked: HashSet::new(),
            recent_final: HashMap::new(),
            next_seq: 1,
            next_generation: 1,
            sender: Some(sender),
            available: true,
            metrics: None,
        }
    }

    /// Replace the leases with persisted rows (start, recovery); the
    /// directory is kept. Deadlines are recomputed from the persisted wall
    /// times (see `LeaseEngine::start`).
    pub fn load(&mut self, rows: Vec<Row>, next_seq: u64, next_generation: u64, now: &Now) {
        self.holders.clear();
        self.leases.clear();
        self.queue.clear();
        self.rank_of.clear();
        self.reranked.clear();
        // Ages come from the stored `requested_at`: rerank at once.
        self.next_rerank = Some(now.instant);
        self.recent_final.clear();
        self.next_seq = self.next_seq.max(next_seq);
        self.next_generation = self.next_generation.max(next_generation);
        let mut waiters: BTreeMap<RankKey, Waiter> = BTreeMap::new();
        for row in rows {
            let lease = row.lease;
            let book = row.book;
            let id = lease.lease_id.clone();
            let status = lease.status;
            let mut entry = Entry {
                deadline: lease.expires_at.map(|w| now.instant_at(w)),
                grace_deadline: lease.grace_until.map(|w| now.instant_at(w)),
                held_since: lease
                    .granted_at
                    .filter(|_| status.holds_capability())
                    .map(|w| now.instant_at(w)),
                candidates: book.want.candidates(&self.dir),
                lease,
                book,
            };
            if status.holds_capability() {
                entry.candidates.clear();
                self.holders
                    .entry(entry.lease.capability_id.clone())
                    .or_default()
                    .push(id.clone());
            } else if status == LeaseStatus::Requested {
                let key = (Reverse(entry.lease.priority), entry.book.queue_seq);
                let w = waiters.entry(key).or_insert_with(|| Waiter {
                    members: Vec::new(),
                    priority: entry.lease.priority,
                    // Its age across a restart, as deadlines are, from the
                    // stored wall time.
                    enqueued_at: now.instant_at(entry.lease.requested_at),
                    preempt_if_needed: entry.book.preempt_if_needed,
                    preempt_reason: entry.book.request_preempt_reason.clone(),
                    queue_deadline: entry.book.queue_deadline.map(|w| now.instant_at(w)),
                });
                w.members.push(id.clone());
                self.rank_of.insert(id.clone(), key);
            } else {
                continue;
            }
            self.leases.insert(id, entry);
        }
        // Group members were stored in request order by lease id creation;
        // keep a stable order.
        for w in waiters.values_mut() {
            w.members.sort();
        }
        self.queue = waiters;
    }

    /// The type of a capability, for the metrics' `type` label (`unknown`
    /// for one not in the directory).
    pub fn capability_type_of(&self, capability_id: &str) -> &'static str {
        self.dir
            .get(capability_id)
            .map_or("unknown", |i| i.capability_type.as_str())
    }

    /// The provider of a capability, for events.
    pub fn provider_of(&self, capability_id: &str) -> Option<String> {
        self.dir.get(capability_id).map(|i| i.provider_id.clone())
    }

    /// Record the live lease `id`'s row and, optionally, an event about it.
    pub fn record(&self, tx: &mut Tx, id: &str, event: Option<EventSpec<'_>>) {
        if let Some(e) = self.leases.get(id) {
            self.record_entry(tx, e, event);
        }
    }

    fn record_entry(&self, tx: &mut Tx, e: &Entry, event: Option<EventSpec<'_>>) {
        tx.rows.push(e.row());
        if let Some((event_type, actor, extra)) = event {
            tx.events.push(PendingEvent {
                event_type,
                actor: actor.to_string(),
                provider_id: self.provider_of(&e.lease.capability_id),
                lease: e.lease.clone(),
                extra,
            });
        }
    }

    /// Move live lease `id` to a final `status`, drop it from holders and
    /// from the live set, record it with `event`. Returns the capability it
    /// held, if it held one (its holders changed). A capability with
    /// `on_release` actions that nobody holds any more goes to the
    /// safe-state holder at once (`safe_state.rs`).
    ///
    /// The caller removes a waiting lease's waiter first.
    pub fn finish(
        &mut self,
        tx: &mut Tx,
        now: &Now,
        id: &str,
        status: LeaseStatus,
        event: EventSpec<'_>,
    ) -> Option<String> {
        let mut e = self.leases.remove(id)?;
        let held = e.lease.status.holds_capability();
        if let (true, Some(m), Some(since)) = (held, &self.metrics, e.held_since) {
            m.ended(
                self.capability_type_of(&e.lease.capability_id),
                e.lease.holder_type.as_str(),
                status.as_str(),
                now.instant.saturating_duration_since(since),
            );
        }
        e.lease.status = status;
        e.lease.ended_at = Some(now.wall);
        e.deadline = None;
        e.grace_deadline = None;
        e.book.pinned_capability_id = None;
        self.rank_of.remove(id);
        let cap = e.lease.capability_id.clone();
        if held {
            if let Some(hs) = self.holders.get_mut(&cap) {
                hs.retain(|h| h != id);
                if hs.is_empty() {
                    self.holders.remove(&cap);
                }
            }
        }
        self.record_entry(tx, &e, Some(event));
        if held {
            // In the same transaction as the end, before anyone is
            // scheduled (safe_state.rs).
            self.hand_to_safe_state(tx, now, &e.lease);
        }
        self.recent_final.insert(id.to_string(), e.lease);
        held.then_some(cap)
    }

    /// Remove a waiter from the queue; returns the candidates of its
    /// members (their reservations are gone, so they are worth another
    /// look).
    pub fn remove_waiter(&mut self, key: &RankKey) -> (Vec<String>, HashSet<String>) {
        let Some(w) = self.queue.remove(key) else {
            return (Vec::new(), HashSet::new());
        };
        let mut touched = HashSet::new();
        for m in &w.members {
            self.rank_of.remove(m);
            if let Some(e) = self.leases.get(m) {
                touched.extend(e.candidates.iter().cloned());
            }
        }
        (w.members, touched)
    }

    /// How many live leases (waiting or holding) `principal` has, for
    /// `max_concurrent_leases` (docs/policy.md "Principal policy").
    pub fn live_leases_of(&self, principal: &str) -> usize {
        self.leases
            .values()
            .filter(|e| e.lease.principal == principal && !e.lease.status.is_final())
            .count()
    }

    /// Leases (live or final-but-uncommitted) by id, as the caller would
    /// see them now.
    pub fn snapshot(&self, id: &str) -> Option<CapabilityLease> {
        self.leases
            .get(id)
            .map(|e| e.lease.clone())
            .or_else(|| self.recent_final.get(id).cloned())
    }

    /// Recompute waiting requests' candidates after the directory changed.
    pub fn refresh_candidates(&mut self) {
        let State {
            dir, leases, queue, ..
        } = self;
        for w in queue.values() {
            for m in &w.members {
                if let Some(e) = leases.get_mut(m) {
                    if e.book.want.fixed_capability().is_none() {
                        e.candidates = e.book.want.candidates(dir);
                    }
                }
            }
        }
    }

    /// Every capability in the directory (for a full rescan).
    pub fn all_capabilities(&self) -> HashSet<String> {
        self.dir.keys().cloned().collect()
    }

    /// Whether `capability_id` is inside a non-interruptible window.
    pub fn in_window(&self, capability_id: &str) -> bool {
        self.dir
            .get(capability_id)
            .is_some_and(|i| i.non_interruptible)
    }
}
