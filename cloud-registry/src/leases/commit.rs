//! Group commit: every transition's rows and events reach SQLite in one
//! transaction, and transitions queued while a commit is in flight go
//! together into the next one.
//!
//! Operations change the in-memory model under the state mutex and, still
//! under it, send their [`Piece`] to this task, so pieces arrive in the
//! order the model changed. The task takes everything queued, writes it on
//! the database's writer thread in one transaction (rows coalesced to the
//! last state of each lease, events in order through
//! [`crate::events::append`]), and only after the commit: updates the
//! committed view, wakes `wait_granted` callers, publishes the events on
//! the bus, and answers the callers. Two batches may be queued on the
//! writer thread at once (the next one is gathered while the previous one
//! is written); they commit and are finished in order.
//!
//! Durability is SQLite's WAL with `synchronous=NORMAL`: an answered
//! operation survives the registry being killed (SIGKILL); a power loss may
//! roll back the last commits, never corrupt them.
//!
//! If a commit fails, its callers and every caller queued after it get
//! [`super::LeaseError::Unavailable`] (their changes were built on the
//! failed one), and the engine reloads its model from the table before it
//! accepts operations again.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::stream::{FuturesOrdered, StreamExt};
use serde_json::Value;
use shared_protocol::event::CapabilityEvent;
use shared_protocol::lease::{CapabilityLease, LeaseStatus};
use tokio::sync::{mpsc, oneshot};

use super::idempotency::KeyChange;
use super::model::{Piece, Row};
use super::{lock, sql, LeaseEngine};
use crate::db::Db;
use crate::events::{EventBus, NewEvent};

/// Most pieces taken into one transaction.
const MAX_PIECES_PER_COMMIT: usize = 2048;

/// Most transactions handed to the writer thread at once.
const MAX_IN_FLIGHT: usize = 2;

/// Counters of the group committer since start (for metrics and the
/// benchmark): how well commits are grouped and how busy the writer is.
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub commits: AtomicU64,
    pub operations: AtomicU64,
    pub rows: AtomicU64,
    pub events: AtomicU64,
    pub writer_busy_us: AtomicU64,
}

/// The committed state of every live lease, callers waiting for a lease
/// to leave `requested`, and how many stored leases are in each status.
#[derive(Default)]
pub(crate) struct View {
    pub leases: HashMap<String, CapabilityLease>,
    pub waiters: HashMap<String, Vec<oneshot::Sender<CapabilityLease>>>,
    /// Stored leases per status, in [`LeaseStatus::ALL`] order (read from
    /// the table at start and recovery, then kept up to date by each
    /// commit, so that metrics never scan the table).
    counts: Vec<u64>,
}

fn status_index(s: LeaseStatus) -> usize {
    LeaseStatus::ALL.iter().position(|x| *x == s).unwrap_or(0)
}

impl View {
    /// Replace the leases with `rows` and the counts with `counts` (start,
    /// recovery).
    pub fn load(&mut self, rows: &[Row], counts: &[(LeaseStatus, u64)]) {
        self.leases = rows
            .iter()
            .filter(|r| !r.lease.status.is_final())
            .map(|r| (r.lease.lease_id.clone(), r.lease.clone()))
            .collect();
        self.counts = vec![0; LeaseStatus::ALL.len()];
        for (s, n) in counts {
            self.counts[status_index(*s)] = *n;
        }
        let View {
            leases, waiters, ..
        } = self;
        waiters.retain(|id, _| leases.contains_key(id));
    }

    /// Stored leases in each status, every status listed.
    pub fn counts(&self) -> Vec<(LeaseStatus, u64)> {
        LeaseStatus::ALL
            .iter()
            .map(|s| (*s, self.counts.get(status_index(*s)).copied().unwrap_or(0)))
            .collect()
    }

    /// Apply committed rows and wake waiters of leases no longer waiting.
    fn apply(&mut self, rows: &[Row]) {
        if self.counts.len() != LeaseStatus::ALL.len() {
            self.counts = vec![0; LeaseStatus::ALL.len()];
        }
        for row in rows {
            let id = &row.lease.lease_id;
            // A lease not in the view is a new row: live leases are all
            // here, and a final lease is never written again.
            let before = self.leases.get(id).map(|l| l.status);
            if before != Some(row.lease.status) {
                if let Some(b) = before {
                    let n = &mut self.counts[status_index(b)];
                    *n = n.saturating_sub(1);
                }
                self.counts[status_index(row.lease.status)] += 1;
            }
            if row.lease.status.is_final() {
                self.leases.remove(id);
            } else {
                self.leases.insert(id.clone(), row.lease.clone());
            }
            if row.lease.status != LeaseStatus::Requested {
                if let Some(ws) = self.waiters.remove(id) {
                    for w in ws {
                        let _ = w.send(row.lease.clone());
                    }
                }
            }
        }
    }
}

/// The event's `data` (the lease JSON plus the extra keys) as a value for
/// the bus and as the text stored in the table, each rendered once from
/// the lease (the text is not rendered from the value: that would walk
/// the value tree a second time, on the writer thread).
fn render(p: &super::model::PendingEvent) -> (Value, Option<String>) {
    let (mut data, text) = match (
        serde_json::to_value(&p.lease),
        serde_json::to_string(&p.lease),
    ) {
        (Ok(v), Ok(t)) => (v, Some(t)),
        (Err(e), _) | (_, Err(e)) => {
            tracing::error!(lease_id = %p.lease.lease_id, error = %e, "cannot render lease as JSON");
            return (Value::Null, None);
        }
    };
    let Value::Object(map) = &mut data else {
        return (data, None);
    };
    // Extra keys are appended to the text; one that the lease already has
    // would appear twice, so then the text is left to the value.
    let mut text =
        text.filter(|t| t.ends_with('}') && p.extra.iter().all(|(k, _)| !map.contains_key(*k)));
    for (k, v) in &p.extra {
        if let Some(t) = &mut text {
            t.pop();
            if t.len() > 1 {
                t.push(',');
            }
            t.push_str(&Value::from(*k).to_string());
            t.push(':');
            t.push_str(&v.to_string());
            t.push('}');
        }
        map.insert(k.to_string(), v.clone());
    }
    (data, text)
}

fn to_new_event(p: super::model::PendingEvent) -> NewEvent {
    let (data, text) = render(&p);
    let mut ev = NewEvent::new(p.event_type, p.actor, data).lease(p.lease.lease_id.clone());
    if let Some(text) = text {
        ev = ev.data_json(text);
    }
    if !p.lease.capability_id.is_empty() {
        ev = ev.capability(p.lease.capability_id.clone());
    }
    if let Some(provider) = p.provider_id {
        ev = ev.provider(provider);
    }
    ev
}

/// Pieces gathered into one transaction.
struct Batch {
    rows: Vec<Row>,
    events: Vec<NewEvent>,
    keys: Vec<KeyChange>,
    dones: Vec<Done>,
}

type Done = oneshot::Sender<Result<(), String>>;

/// What a commit gave back: the rows written (for the view), the callers
/// to answer, and the stored events or the failure.
type Outcome = (Vec<Row>, Vec<Done>, Result<Vec<CapabilityEvent>, String>);

/// Take `first` and everything queued behind it (up to the limit), keeping
/// only the last row of each lease.
fn gather(first: Piece, rx: &mut mpsc::UnboundedReceiver<Piece>) -> Batch {
    let mut pieces = vec![first];
    while pieces.len() < MAX_PIECES_PER_COMMIT {
        match rx.try_recv() {
            Ok(p) => pieces.push(p),
            Err(_) => break,
        }
    }
    let mut rows: Vec<Row> = Vec::new();
    let mut index: HashMap<String, usize> = HashMap::new();
    let mut events = Vec::new();
    let mut keys = Vec::new();
    let mut dones = Vec::with_capacity(pieces.len());
    for p in pieces {
        for row in p.tx.rows {
            match index.get(&row.lease.lease_id) {
                Some(&i) => rows[i] = row,
                None => {
                    index.insert(row.lease.lease_id.clone(), rows.len());
                    rows.push(row);
                }
            }
        }
        events.extend(p.tx.events.into_iter().map(to_new_event));
        keys.extend(p.tx.keys);
        dones.extend(p.done);
    }
    Batch {
        rows,
        events,
        keys,
        dones,
    }
}

/// Write `batch` in one transaction on the writer thread. A batch queued
/// behind a failed one is not written (`poisoned`): it was built on the
/// failed batch's changes.
async fn write(
    db: Db,
    batch: Batch,
    poisoned: Arc<AtomicBool>,
    counters: Arc<Counters>,
) -> Outcome {
    let Batch {
        rows,
        events,
        keys,
        dones,
    } = batch;
    let flag = poisoned.clone();
    let operations = dones.len() as u64;
    let result = db
        .write(
            move |conn| -> (Vec<Row>, Result<Vec<CapabilityEvent>, String>) {
                if flag.load(Ordering::Acquire) {
                    return (rows, Err("an earlier lease commit failed".to_string()));
                }
                let started = std::time::Instant::now();
                let n_events = events.len() as u64;
                let result = sql::commit(conn, &rows, events, &keys);
                let busy = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                counters.writer_busy_us.fetch_add(busy, Ordering::Relaxed);
                match result {
                    Ok(stored) => {
                        counters.commits.fetch_add(1, Ordering::Relaxed);
                        counters.operations.fetch_add(operations, Ordering::Relaxed);
                        counters
                            .rows
                            .fetch_add(rows.len() as u64, Ordering::Relaxed);
                        counters.events.fetch_add(n_events, Ordering::Relaxed);
                        (rows, Ok(stored))
                    }
                    Err(e) => {
                        flag.store(true, Ordering::Release);
                        (rows, Err(format!("commit failed: {e}")))
                    }
                }
            },
        )
        .await;
    match result {
        Ok((rows, r)) => (rows, dones, r),
        Err(e) => {
            poisoned.store(true, Ordering::Release);
            (Vec::new(), dones, Err(format!("commit failed: {e}")))
        }
    }
}

/// After a commit: update the committed view (waking `wait_granted`),
/// forget committed final leases, publish the events, answer the callers.
fn committed(
    view: &Mutex<View>,
    engine: &Weak<LeaseEngine>,
    bus: &EventBus,
    rows: Vec<Row>,
    dones: Vec<Done>,
    stored: Vec<CapabilityEvent>,
) {
    lock(view).apply(&rows);
    if let Some(engine) = engine.upgrade() {
        let mut st = lock(&engine.state);
        for row in rows.iter().filter(|r| r.lease.status.is_final()) {
            st.recent_final.remove(&row.lease.lease_id);
        }
    }
    bus.publish(stored);
    for d in dones {
        let _ = d.send(Ok(()));
    }
}

/// The committer task: runs until every sender is gone (engine dropped or
/// shut down) and everything queued is written.
///
/// Up to [`MAX_IN_FLIGHT`] batches are handed to the writer thread at once,
/// so that gathering the next batch and finishing the previous one overlap
/// with SQLite's work; they commit, and are finished, in order.
pub(crate) async fn run(
    mut rx: mpsc::UnboundedReceiver<Piece>,
    db: Db,
    bus: EventBus,
    view: Arc<Mutex<View>>,
    engine: Weak<LeaseEngine>,
    counters: Arc<Counters>,
) {
    let mut in_flight = FuturesOrdered::new();
    let mut poisoned = Arc::new(AtomicBool::new(false));
    let mut open = true;
    let mut recovering = false;
    loop {
        if recovering && in_flight.is_empty() {
            recover(&engine, &mut rx).await;
            poisoned = Arc::new(AtomicBool::new(false));
            recovering = false;
        }
        if !open && in_flight.is_empty() {
            break;
        }
        tokio::select! {
            biased;
            Some(outcome) = in_flight.next(), if !in_flight.is_empty() => {
                let (rows, dones, result): Outcome = outcome;
                match result {
                    Ok(stored) => committed(&view, &engine, &bus, rows, dones, stored),
                    Err(message) => {
                        fail(dones, &message);
                        if !recovering {
                            recovering = true;
                            if let Some(e) = engine.upgrade() {
                                lock(&e.state).available = false;
                            }
                        }
                    }
                }
            }
            next = rx.recv(), if open && !recovering && in_flight.len() < MAX_IN_FLIGHT => {
                match next {
                    Some(first) => {
                        let batch = gather(first, &mut rx);
                        in_flight.push_back(write(
                            db.clone(),
                            batch,
                            poisoned.clone(),
                            counters.clone(),
                        ));
                    }
                    None => open = false,
                }
            }
            else => break,
        }
    }
}

/// Answer the callers of a failed batch.
fn fail(dones: Vec<Done>, message: &str) {
    tracing::error!(
        error = message,
        "lease commit failed; the lease model will be reloaded"
    );
    for d in dones {
        let _ = d.send(Err(message.to_string()));
    }
}

/// Refuse new operations, fail everything queued after the failed commit,
/// and reload the model from the table (retrying every second).
async fn recover(engine: &Weak<LeaseEngine>, rx: &mut mpsc::UnboundedReceiver<Piece>) {
    {
        let Some(e) = engine.upgrade() else {
            return;
        };
        lock(&e.state).available = false;
    }
    while let Ok(p) = rx.try_recv() {
        if let Some(d) = p.done {
            let _ = d.send(Err("an earlier lease commit failed".to_string()));
        }
    }
    loop {
        let Some(e) = engine.upgrade() else {
            return;
        };
        match e.reload().await {
            Ok(()) => return,
            Err(err) => {
                tracing::error!(error = %err, "cannot reload leases; retrying in 1 s");
                drop(e);
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;
    use shared_protocol::capability::LeaseMode;
    use shared_protocol::event::EventType;
    use shared_protocol::lease::HolderType;

    use super::*;
    use crate::leases::model::PendingEvent;

    fn lease() -> CapabilityLease {
        CapabilityLease {
            lease_id: "lease_1".into(),
            capability_id: "cam \"front\"".into(),
            holder_type: HolderType::AuditAgent,
            holder_ref: "agent-1".into(),
            project_id: "p".into(),
            purpose: "line\nbreak".into(),
            priority: 50,
            status: LeaseStatus::Released,
            requested_at: chrono::Utc::now(),
            granted_at: Some(chrono::Utc::now()),
            expires_at: None,
            grace_until: None,
            preempt_reason: None,
            evidence_required: false,
            mode: LeaseMode::Exclusive,
            lease_group_id: None,
            preempted_by: None,
            ended_at: Some(chrono::Utc::now()),
            principal: "agent-1".into(),
            generation: None,
            capability_selector: None,
        }
    }

    fn pending(extra: Vec<(&'static str, Value)>) -> PendingEvent {
        PendingEvent {
            event_type: EventType::LeaseReleased,
            actor: "agent-1".into(),
            provider_id: None,
            lease: lease(),
            extra,
        }
    }

    #[test]
    fn stored_text_is_the_json_of_the_published_value() {
        for extra in [
            Vec::new(),
            vec![("reason", json!("done, \"really\""))],
            vec![("reason", json!("x")), ("notice", json!({"a": [1, 2]}))],
        ] {
            let (value, text) = render(&pending(extra.clone()));
            let text = text.expect("rendered once as text");
            let parsed: Value = serde_json::from_str(&text).expect("valid JSON");
            assert_eq!(parsed, value);
            for (k, v) in extra {
                assert_eq!(value.get(k), Some(&v));
            }
        }
    }

    #[test]
    fn an_extra_key_the_lease_has_is_rendered_from_the_value() {
        let (value, text) = render(&pending(vec![("status", json!("other"))]));
        assert_eq!(text, None);
        assert_eq!(value.get("status"), Some(&json!("other")));
    }
}
