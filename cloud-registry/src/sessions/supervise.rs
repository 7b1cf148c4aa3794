//! Background supervision: the deadline watchdog, lost providers, the
//! sweeps of unbound and unfinished uploads, and the sessions of a lease
//! that ended.
//!
//! # When things go wrong
//! - Provider offline or restarted with a new boot id (seed 001 §5.4): its
//!   running sessions end (when it is only unheard since a restart of a
//!   registry with the embedded broker, not before the registry has heard
//!   for a full offline timeout without it coming back), `incomplete_evidence` when some of their
//!   artifacts' bytes are missing, `failed` otherwise; its completed
//!   sessions still waiting for bytes become `incomplete_evidence`. A
//!   session the registry ended this way takes the provider's own final
//!   report if one arrives later (the edge queues its updates across
//!   outages), and an `incomplete_evidence` session the provider had
//!   completed becomes `completed` again once its last artifact arrives.
//! - No final report by the session's deadline (`timeout_ms` plus
//!   `result_grace_ms`, on the monotonic clock: `deadlines.rs`): the
//!   registry fails the session (not while its
//!   MQTT link is down; in the first offline timeout after the link
//!   (re)connects or the registry starts, only sessions sent since: an
//!   older one's report may still be on its way).
//! - The lease ends under a running session (preempted at the end of its
//!   grace period, expired, or released): the MQTT forwarder, the one
//!   follower of lease events, sends the bench `lease_revoked` (its fence
//!   needs the generation) and then an `action_cancel` for each running
//!   session ([`LeaseEndHook`], implemented here); interruptible
//!   actions stop, non-interruptible ones (seed 001 §6.4) finish first. A
//!   session cut this way ends `failed` with the reason first in its
//!   `error_message`, e.g. `lease revoked by preemption: safety_stop (…)`,
//!   then what the provider said, without the reason it repeats
//!   (`… (provider: cancelled)`; [`sql::lease_end_message`]).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::Value;
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::mqtt::ActionCancel;
use shared_protocol::provider::OnlineStatus;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::sql;

use super::deadlines::{self};
use super::{flat, unbound, Sessions};
use crate::hearing::Hearing;
use crate::mqtt::LeaseEndHook;

/// How often running sessions are checked against their deadline.
const WATCHDOG_PERIOD: Duration = Duration::from_millis(500);

/// Longest time between two sweeps of unbound bytes.
const MAX_UNBOUND_SWEEP_PERIOD: Duration = Duration::from_secs(60);

/// Whether the registry can hear ([`Hearing`]: `None` while its MQTT link
/// is down, else the monotonic instant of its latest (re)connection or
/// stall's end) and how long after that providers get to report before
/// the registry judges their silence.
pub(super) struct ReportWindow {
    hearing: Hearing,
    window: Duration,
}

/// Which overdue sessions the watchdog may fail now.
enum Judge {
    /// Every one: the registry has heard for a full window.
    All,
    /// Only those sent after this monotonic instant (on the current MQTT
    /// connection, so their reports had a clear way back).
    SentAfter(tokio::time::Instant),
    /// None: the link is down.
    Nobody,
}

impl ReportWindow {
    fn judge(&self) -> Judge {
        match self.hearing.since() {
            None => Judge::Nobody,
            Some(t) if t.elapsed() >= self.window => Judge::All,
            Some(t) => Judge::SentAfter(tokio::time::Instant::from_std(t)),
        }
    }
}

/// The reason recorded on running sessions for a lease event, if it ends
/// the lease.
fn reason_for_event(ev: &CapabilityEvent) -> Option<String> {
    let why = ev.data.get("reason").and_then(Value::as_str);
    match ev.event_type {
        EventType::LeasePreempted => {
            let field = |k: &str| ev.data.get(k).and_then(Value::as_str).map(str::to_string);
            let (reason, by) = (field("preempt_reason"), field("preempted_by"));
            Some(format!(
                "lease revoked by preemption: {} (lease `{}` of higher priority took over at the end of the grace period)",
                reason.as_deref().unwrap_or("no reason given"),
                by.as_deref().unwrap_or("?"),
            ))
        }
        EventType::LeaseExpired => Some(format!(
            "lease expired ({}) before the action ended",
            why.unwrap_or("ttl_elapsed")
        )),
        EventType::LeaseReleased => Some(match why {
            Some(w) => format!("lease released by its holder ({w}) before the action ended"),
            None => "lease released by its holder before the action ended".to_string(),
        }),
        _ => None,
    }
}

impl Sessions {
    /// Tell the service when it can hear providers (once; later calls are
    /// ignored): `hearing` from [`crate::mqtt::MqttLink::hearing`],
    /// `window` the heartbeat offline timeout. While the link is down no
    /// session is failed for a passed deadline, and for `window` after it
    /// (re)connects (also after the registry starts, and after the
    /// registry ran again following a stall) only those sent since: the
    /// report of an older one may still be on its way (an edge reconnects
    /// with a backoff of up to 10 s; a stopped registry has unread
    /// reports queued). Without this call deadlines are enforced at once.
    pub fn set_hearing(&self, hearing: Hearing, window: Duration) {
        let _ = self.hearing.set(ReportWindow { hearing, window });
    }

    /// Which overdue sessions may be failed now (see
    /// [`Sessions::set_hearing`]).
    fn judge(&self) -> Judge {
        self.hearing.get().map_or(Judge::All, ReportWindow::judge)
    }

    /// Start the background task until `shutdown` turns true: the
    /// deadline watchdog, which also sweeps unbound bytes. (The sessions of
    /// a lease that ended are told by the MQTT forwarder, which follows the
    /// lease events: [`LeaseEndHook`].)
    pub fn spawn_background(self: &Arc<Self>, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        let _ = self.shutdown.set(shutdown.clone());
        tokio::spawn(self.clone().run_watchdog(shutdown))
    }

    /// A provider went away (`why`, e.g. "provider `p` went offline"): end
    /// its running sessions (seed 001 §5.4).
    pub async fn provider_lost(&self, provider_id: &str, why: String) {
        let p = provider_id.to_string();
        match self
            .db
            .write(move |c| sql::provider_lost(c, &p, &why, Utc::now()))
            .await
            .and_then(flat)
        {
            Ok(events) => {
                if !events.is_empty() {
                    tracing::warn!(
                        provider_id,
                        sessions = events.len(),
                        "sessions of a lost provider ended (failed / incomplete_evidence)"
                    );
                }
                self.withdraw_invokes(&events);
                self.publish(events).await;
            }
            Err(e) => {
                tracing::error!(provider_id, error = %e, "cannot end the sessions of a lost provider")
            }
        }
    }

    /// Fail sessions past their deadline; every so often (a quarter of
    /// the unbound-bytes grace time, between 0.5 s and 60 s) sweep unbound
    /// bytes.
    async fn run_watchdog(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(WATCHDOG_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let sweep_every = (Duration::from_secs(self.cfg.unbound_upload_ttl_seconds) / 4)
            .clamp(WATCHDOG_PERIOD, MAX_UNBOUND_SWEEP_PERIOD);
        let mut last_sweep = Instant::now();
        self.restore_deadlines().await;
        self.restore_evidence_due().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|s| *s) => break,
            }
            self.resync_after_full().await;
            self.judge_evidence().await;
            let sent_after = match self.judge() {
                Judge::Nobody => continue,
                Judge::SentAfter(t) => Some(t),
                Judge::All => {
                    self.judge_unheard_since_restart().await;
                    None
                }
            };
            self.fail_overdue(sent_after).await;
            if last_sweep.elapsed() >= sweep_every {
                last_sweep = Instant::now();
                self.sweep_unbound().await;
                self.sweep_partials().await;
            }
        }
    }

    /// Judge the evidence of the ended `evidence_required` leases whose
    /// `evidence_grace_ms` has passed: their completed sessions still
    /// missing bytes become `incomplete_evidence` (seed 001 §5.4).
    async fn judge_evidence(&self) {
        let now = Instant::now();
        let due: Vec<String> = {
            let mut pending = crate::leases::lock(&self.evidence_due);
            if pending.iter().all(|(at, _)| *at > now) {
                return;
            }
            let (due, later) = std::mem::take(&mut *pending)
                .into_iter()
                .partition(|(at, _)| *at <= now);
            *pending = later;
            due.into_iter().map(|(_, id)| id).collect::<Vec<_>>()
        };
        let grace = self.cfg.evidence_grace_ms;
        for lease_id in due {
            let id = lease_id.clone();
            match self
                .db
                .write(move |c| sql::lease_evidence_due(c, &id, grace))
                .await
                .and_then(flat)
            {
                Ok(events) => {
                    if !events.is_empty() {
                        tracing::warn!(%lease_id, sessions = events.len(), "lease ended without all its required evidence: sessions marked incomplete_evidence");
                    }
                    self.publish(events).await;
                }
                // Tried again at the next tick.
                Err(e) => {
                    tracing::error!(%lease_id, error = %e, "cannot judge the evidence of an ended lease");
                    crate::leases::lock(&self.evidence_due).push((now, lease_id));
                }
            }
        }
    }

    /// After a restart: the ended `evidence_required` leases whose
    /// sessions still miss bytes are judged `evidence_grace_ms` after
    /// their stored `ended_at` (at once when that has passed).
    async fn restore_evidence_due(&self) {
        let pending = match self
            .db
            .read(|c| sql::leases_awaiting_evidence(c))
            .await
            .and_then(flat)
        {
            Ok(p) => p,
            Err(e) => {
                tracing::error!(error = %e, "cannot list ended leases still waiting for evidence");
                return;
            }
        };
        let (now, wall) = (Instant::now(), Utc::now());
        let grace = chrono::Duration::milliseconds(
            self.cfg.evidence_grace_ms.min(i64::MAX as u64 / 2) as i64,
        );
        let mut due = crate::leases::lock(&self.evidence_due);
        for (lease_id, ended_at) in pending {
            let left = (ended_at + grace - wall).to_std().unwrap_or_default();
            due.push((now + left, lease_id));
        }
    }

    /// Rebuild the monotonic deadlines of the sessions the store holds
    /// open (sent by an earlier run of the registry) from their wall-clock
    /// `deadline_at` (see [`deadlines`]).
    async fn restore_deadlines(&self) {
        match self
            .db
            .read(|c| sql::open_deadlines(c))
            .await
            .and_then(flat)
        {
            Ok(open) => {
                let (now, wall_now) = (tokio::time::Instant::now(), Utc::now());
                let mut d = crate::leases::lock(&self.deadlines);
                for (session_id, deadline_at) in &open {
                    d.restore(
                        session_id,
                        deadlines::instant_of(now, wall_now, *deadline_at),
                    );
                }
                if !open.is_empty() {
                    tracing::info!(
                        sessions = open.len(),
                        "deadlines of the open sessions restored"
                    );
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot read the open sessions' deadlines; they are not enforced")
            }
        }
    }

    /// Fail the sessions whose monotonic deadline has passed (with
    /// `sent_after`, only those sent after it) and withdraw their
    /// `action_invoke` if the MQTT link still holds it.
    async fn fail_overdue(&self, sent_after: Option<tokio::time::Instant>) {
        let due =
            crate::leases::lock(&self.deadlines).overdue(tokio::time::Instant::now(), sent_after);
        if due.is_empty() {
            return;
        }
        let ids = due.clone();
        match self
            .db
            .write(move |c| sql::fail_overdue(c, &ids, Utc::now()))
            .await
            .and_then(flat)
        {
            Ok(events) => {
                {
                    // Also those that had ended meanwhile.
                    let mut d = crate::leases::lock(&self.deadlines);
                    for id in &due {
                        d.remove(id);
                    }
                }
                for ev in &events {
                    tracing::warn!(session_id = ?ev.session_id, "session failed: no report from its provider before the deadline");
                }
                self.withdraw_invokes(&events);
                self.publish(events).await;
            }
            Err(e) => tracing::error!(error = %e, "session deadline check failed"),
        }
    }

    /// Sessions the registry ended itself (`events`): an `action_invoke`
    /// for one that the MQTT link still holds (the link was down) is not
    /// sent.
    pub(super) fn withdraw_invokes(&self, events: &[CapabilityEvent]) {
        let Some(commands) = self.commands.get() else {
            return;
        };
        for session_id in events.iter().filter_map(|ev| ev.session_id.as_deref()) {
            commands.withdraw(session_id);
        }
    }

    /// Providers marked offline at a restart of a registry with the
    /// embedded broker that are still offline now that the registry has
    /// heard for a full window: their open sessions end (running ones
    /// `failed` or `incomplete_evidence`, completed ones still missing
    /// bytes `incomplete_evidence`), as for any provider gone offline.
    async fn judge_unheard_since_restart(&self) {
        let pending = std::mem::take(&mut *crate::leases::lock(&self.unheard_since_restart));
        for provider_id in pending {
            let online = match self.providers.get_provider(&provider_id).await {
                Ok(p) => p.is_some_and(|p| p.online_status == OnlineStatus::Online),
                Err(e) => {
                    tracing::error!(%provider_id, error = %e, "cannot read a provider unheard since the restart");
                    continue;
                }
            };
            if !online {
                self.provider_lost(
                    &provider_id,
                    format!(
                        "provider `{provider_id}` did not reconnect after the registry restarted"
                    ),
                )
                .await;
            }
        }
    }

    /// Drop held uploads and delete blobs that no artifact bound within
    /// `unbound_upload_ttl_seconds` (see [`unbound`]); each removal is
    /// logged. Database work runs on the database threads, file deletion in
    /// the blob store (off the async workers). A blob whose file cannot be
    /// deleted stays listed and is tried again at the next sweep.
    async fn sweep_unbound(&self) {
        let Some(cutoff) = i64::try_from(self.cfg.unbound_upload_ttl_seconds)
            .ok()
            .and_then(chrono::Duration::try_seconds)
            .and_then(|ttl| Utc::now().checked_sub_signed(ttl))
        else {
            return;
        };
        match self
            .db
            .read(move |c| unbound::anything_before(c, cutoff))
            .await
            .and_then(flat)
        {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::error!(error = %e, "unbound artifact bytes: cannot look for expired uploads");
                return;
            }
        }
        // No upload may record a blob between the choice and the deletion.
        let _gc = self.blob_gc.write().await;
        let expired = match self
            .db
            .write(move |c| unbound::expire_unbound(c, cutoff))
            .await
            .and_then(flat)
        {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "unbound artifact bytes: sweep failed");
                return;
            }
        };
        let ttl_seconds = self.cfg.unbound_upload_ttl_seconds;
        for d in &expired.dropped {
            tracing::info!(
                artifact_id = %d.artifact_id,
                provider_id = %d.provider_id,
                size_bytes = d.size_bytes,
                sha256 = %d.sha256,
                ttl_seconds,
                "held artifact bytes dropped: no metadata named them in time"
            );
        }
        let mut deleted = Vec::new();
        for blob in expired.doomed {
            let (provider_id, artifact_id) = blob.uploads.first().cloned().unwrap_or_default();
            match self.blobs.delete(&blob.sha256).await {
                Ok(file_found) => {
                    tracing::info!(
                        %artifact_id,
                        %provider_id,
                        size_bytes = blob.size_bytes,
                        sha256 = %blob.sha256,
                        uploads = blob.uploads.len(),
                        file_found,
                        ttl_seconds,
                        "unbound artifact bytes deleted: no artifact bound them in time"
                    );
                    deleted.push(blob.sha256);
                }
                Err(e) => {
                    tracing::error!(%artifact_id, %provider_id, sha256 = %blob.sha256, error = %e, "cannot delete unbound artifact bytes; the next sweep tries again")
                }
            }
        }
        if deleted.is_empty() {
            return;
        }
        let forgotten = self
            .db
            .write(move |c| {
                let tx = c.transaction()?;
                for sha256 in &deleted {
                    unbound::forget_deleted(&tx, sha256, cutoff)?;
                }
                tx.commit()
            })
            .await;
        match forgotten.and_then(flat) {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(error = %e, "unbound artifact bytes: deleted files stay listed")
            }
        }
    }

    /// Remove resumable uploads not written for
    /// `partial_upload_ttl_seconds`; each removal is logged.
    pub(super) async fn sweep_partials(&self) {
        let ttl = Duration::from_secs(self.cfg.partial_upload_ttl_seconds.max(1));
        for s in self.partials.sweep(ttl).await {
            tracing::info!(file = %s.file, provider = %s.provider, size_bytes = s.size_bytes, ttl_seconds = ttl.as_secs(), "unfinished resumable upload removed: not continued in time");
        }
    }

    /// Lease `lease_id` ended for `reason`: record why on its running
    /// sessions and give them `revoke_grace_ms` to report. Returns the
    /// `action_cancel` for each, with its provider, for the MQTT forwarder
    /// to send after the bench's `lease_revoked` ([`LeaseEndHook`]).
    async fn end_sessions_of_lease(
        &self,
        lease_id: &str,
        reason: String,
    ) -> Vec<(String, ActionCancel)> {
        // Most leases end with no action running: find that out on the
        // reader instead of a write transaction per lease.
        let id = lease_id.to_string();
        match self
            .db
            .read(move |c| sql::has_open_sessions(c, &id))
            .await
            .and_then(flat)
        {
            Ok(false) => return Vec::new(),
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(lease_id, error = %e, "cannot look up the sessions of an ended lease")
            }
        }
        // The deadline that counts is monotonic; `deadline` is its wall
        // rendering, stored for a restart.
        let grace = Duration::from_millis(self.cfg.revoke_grace_ms);
        let until = deadlines::after(tokio::time::Instant::now(), grace);
        let deadline = Utc::now()
            + chrono::Duration::milliseconds(self.cfg.revoke_grace_ms.min(i64::MAX as u64) as i64);
        let (id, why) = (lease_id.to_string(), reason.clone());
        let rows = match self
            .db
            .write(move |c| sql::lease_ended(c, &id, &why, deadline))
            .await
            .and_then(flat)
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(lease_id, error = %e, "cannot mark the sessions of an ended lease");
                return Vec::new();
            }
        };
        {
            let mut d = crate::leases::lock(&self.deadlines);
            for row in &rows {
                d.shorten(&row.session.session_id, until);
            }
        }
        rows.into_iter()
            .map(|row| {
                tracing::info!(lease_id, session_id = %row.session.session_id, provider_id = %row.provider_id, %reason, "lease ended under a running session: cancelling it");
                (
                    row.provider_id,
                    ActionCancel {
                        session_id: row.session.session_id,
                        reason: reason.clone(),
                    },
                )
            })
            .collect()
    }
}

#[async_trait::async_trait]
impl LeaseEndHook for Sessions {
    async fn on_lease_ended(&self, ev: &CapabilityEvent) -> Vec<(String, ActionCancel)> {
        match (reason_for_event(ev), ev.lease_id.as_deref()) {
            (Some(reason), Some(lease_id)) => {
                if ev.data.get("evidence_required").and_then(Value::as_bool) == Some(true) {
                    let at = Instant::now() + Duration::from_millis(self.cfg.evidence_grace_ms);
                    crate::leases::lock(&self.evidence_due).push((at, lease_id.to_string()));
                }
                self.end_sessions_of_lease(lease_id, reason).await
            }
            _ => Vec::new(),
        }
    }
}
