//! Result ingest: the providers' `session_update`s (final reports, artifact
//! metadata, reports against their fence, docs/architecture.md "Fencing"),
//! and asking a provider to report its open sessions again
//! (`session_sync`). Also the [`ProviderHooks`] the providers module calls.

use chrono::Utc;
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::lease::{CapabilityLease, LeaseStatus};
use shared_protocol::mqtt::{MessageType, SessionSync, SessionUpdate};
use shared_protocol::session::{CapabilitySession, SessionStatus};

use super::sql;

use super::deadlines::Fence;
use super::sql::UpdateRefused;
use super::{flat, Sessions};
use crate::providers::{OfflineReason, ProviderHooks};

/// How far back a session the registry ended by presumption (provider
/// offline, deadline) is still listed in a `session_sync`: the hour for
/// which an edge keeps its acknowledged final updates.
const PRESUMED_SYNC_WINDOW: chrono::Duration = chrono::Duration::hours(1);

/// Most open sessions one provider is asked about at a reconnection (in
/// messages of [`SessionSync::MAX_SESSIONS`]).
const MAX_SYNCED_SESSIONS: usize = 10_000;

fn lease_end_reason(lease: &CapabilityLease) -> Option<String> {
    match lease.status {
        LeaseStatus::Revoked => Some(format!(
            "lease revoked by preemption: {} (lease `{}` of higher priority took over at the end of the grace period)",
            lease.preempt_reason.as_deref().unwrap_or("no reason given"),
            lease.preempted_by.as_deref().unwrap_or("?"),
        )),
        LeaseStatus::Expired => Some("lease expired before the action ended".to_string()),
        LeaseStatus::Released => Some("lease released by its holder before the action ended".to_string()),
        LeaseStatus::Failed => Some("lease failed before the action ended".to_string()),
        _ => None,
    }
}

impl Sessions {
    /// Apply one `session_update` from `provider_id`; refusals are logged
    /// (there is nobody to answer on MQTT). False when the update could
    /// not be stored (the store failed: the same update sent again must be
    /// applied, not dropped as a duplicate); true when it was stored, had
    /// nothing to store, or was refused for good. An update lost to a full
    /// disk is asked for again (`session_sync`) once the store is writable.
    pub async fn apply_update(&self, provider_id: &str, update: SessionUpdate) -> bool {
        if !update.status.is_final()
            && update.artifacts.is_empty()
            && update.result_summary.is_none()
        {
            // "Started running": nothing to store (the session has been
            // `running` since it was sent).
            tracing::debug!(provider_id, session_id = %update.session_id, "session running at the provider");
            return true;
        }
        let lease_reason = if matches!(
            update.status,
            SessionStatus::Failed | SessionStatus::Cancelled
        ) {
            self.lease_reason_for(&update).await
        } else {
            None
        };
        let fence_end = if update.status.is_final() && update.started_at.is_some() {
            self.fence_end_for(&update).await
        } else {
            None
        };
        let provider = provider_id.to_string();
        let session_id = update.session_id.clone();
        let applied = self
            .db
            .write_grouped(move |c| {
                sql::apply_update(c, &provider, &update, lease_reason, fence_end, Utc::now())
            })
            .await;
        let error = match applied {
            Ok(Ok(out)) => {
                for why in &out.ignored_artifacts {
                    tracing::warn!(provider_id, %session_id, "artifact metadata ignored: {why}");
                }
                if let Some(s) = &out.session {
                    tracing::debug!(provider_id, %session_id, status = %s.status, "session update applied");
                    self.note_round_trip(s, &out.events);
                }
                self.publish(out.events).await;
                return true;
            }
            Ok(Err(UpdateRefused::Sqlite(e))) => e.to_string(),
            Ok(Err(refused)) => {
                tracing::warn!(provider_id, %session_id, "session update refused: {refused}");
                return true;
            }
            Err(e) => e.to_string(),
        };
        if crate::storage::is_full(&error) {
            crate::storage::note_full("session update", &error);
            tracing::warn!(
                provider_id,
                %session_id,
                "session update not stored: the store is full; it is asked for again once space is freed"
            );
            crate::leases::lock(&self.resync_after_full).insert(provider_id.to_string());
        } else {
            tracing::error!(provider_id, %session_id, error = %error, "session update not stored");
        }
        false
    }

    /// When `events` end session `s` (the provider's final result was
    /// applied), record its round trip since its command left, for a
    /// session this run sent. Before [`Sessions::publish`], which forgets
    /// the session's send time.
    fn note_round_trip(&self, s: &CapabilitySession, events: &[CapabilityEvent]) {
        let Some(metrics) = self.metrics.get() else {
            return;
        };
        let ended = events.iter().any(|e| {
            matches!(
                e.event_type,
                EventType::SessionCompleted | EventType::SessionFailed
            ) && e.session_id.as_deref() == Some(s.session_id.as_str())
        });
        if !ended {
            return;
        }
        let sent = crate::leases::lock(&self.deadlines).sent_at(&s.session_id);
        if let Some(sent) = sent {
            metrics.observe(
                s.action.capability_type().as_str(),
                s.action.as_str(),
                s.status.as_str(),
                sent.elapsed(),
            );
        }
    }

    /// Once the store is writable again, ask each provider whose session
    /// update a full disk kept from being stored to send it again.
    pub(super) async fn resync_after_full(&self) {
        if crate::storage::is_store_full() {
            return;
        }
        let providers: Vec<String> = crate::leases::lock(&self.resync_after_full)
            .drain()
            .collect();
        for provider_id in providers {
            tracing::info!(
                provider_id,
                "the store is writable again: asking the provider for the session updates it could not store"
            );
            self.sync_open_sessions(&provider_id).await;
        }
    }

    /// When the authority of `update`'s command ended ([`sql::fence_end`]):
    /// `None` when the session or its lease cannot be read.
    pub(super) async fn fence_end_for(
        &self,
        update: &SessionUpdate,
    ) -> Option<chrono::DateTime<Utc>> {
        let known = crate::leases::lock(&self.deadlines).fence(&update.session_id);
        if let Some(Fence {
            lease_id,
            not_after,
        }) = known
        {
            let lease = self.leases.get(&lease_id).await?;
            return Some(match lease.ended_at.filter(|_| lease.status.is_final()) {
                Some(ended) if ended < not_after => ended,
                _ => not_after,
            });
        }
        // Sent before a restart of the registry: from the store.
        let id = update.session_id.clone();
        let row = self
            .db
            .read(move |c| sql::load_session(c, &id))
            .await
            .ok()?
            .ok()??;
        let lease = self.leases.get(&row.session.lease_id).await?;
        let ended = lease.ended_at.filter(|_| lease.status.is_final());
        Some(sql::fence_end(&row, ended))
    }

    /// Why the lease under an update's session ended, when it ended before
    /// the update's `occurred_at` (a failure after a revocation is the
    /// revocation's doing).
    pub(super) async fn lease_reason_for(&self, update: &SessionUpdate) -> Option<String> {
        let id = update.session_id.clone();
        let row = self
            .db
            .read(move |c| sql::load_session(c, &id))
            .await
            .ok()?
            .ok()??;
        if row.revoke_reason.is_some() {
            return None;
        }
        let lease = self.leases.get(&row.session.lease_id).await?;
        let ended_first = lease
            .ended_at
            .is_some_and(|t| t <= update.occurred_at + chrono::Duration::seconds(1));
        if lease.status.is_final() && ended_first {
            lease_end_reason(&lease)
        } else {
            None
        }
    }

    /// Send `provider_id` a `session_sync` listing the sessions still open
    /// on it, and those the registry ended by presumption in the last hour
    /// (none: nothing is sent). The provider reports again those it
    /// has ended and fails those it never received (see
    /// [`SessionSync`]): a final update that reached the broker while the
    /// registry was not subscribed is recovered at the provider's next
    /// reconnection instead of failing at the session's deadline.
    pub async fn sync_open_sessions(&self, provider_id: &str) {
        let Some(commands) = self.commands.get() else {
            return;
        };
        let p = provider_id.to_string();
        let presumed_since = Utc::now() - PRESUMED_SYNC_WINDOW;
        let open = match self
            .db
            .read(move |c| sql::open_sessions_of(c, &p, presumed_since, MAX_SYNCED_SESSIONS))
            .await
            .and_then(flat)
        {
            Ok(open) => open,
            Err(e) => {
                tracing::error!(provider_id, error = %e, "cannot list open sessions to sync");
                return;
            }
        };
        if open.is_empty() {
            return;
        }
        tracing::info!(
            provider_id,
            sessions = open.len(),
            "asking the provider to report its open sessions again"
        );
        for chunk in open.chunks(SessionSync::MAX_SESSIONS) {
            commands.send(
                provider_id,
                MessageType::SessionSync,
                &SessionSync {
                    sessions: chunk.to_vec(),
                },
            );
        }
    }
}

#[async_trait::async_trait]
impl ProviderHooks for Sessions {
    async fn on_provider_restarted(&self, provider_id: &str) {
        self.provider_lost(
            provider_id,
            format!("provider `{provider_id}` restarted (new boot id)"),
        )
        .await;
    }

    async fn on_provider_offline(&self, provider_id: &str, reason: OfflineReason) {
        if reason == OfflineReason::RegistryRestarted {
            // Not heard since the registry (and its embedded broker)
            // restarted says nothing about the bench: a planned restart
            // leaves its edge running, and it reconnects with its sessions'
            // results. Failing them now would be a false failure that the
            // results then reverse. They end by the provider's report, by
            // its restart (new boot id: `on_provider_restarted`), or, if it
            // is still offline once the registry has heard for a full
            // window, then (`judge_unheard_since_restart`).
            tracing::info!(provider_id, "provider not heard since the registry restarted; its open sessions wait for its return");
            crate::leases::lock(&self.unheard_since_restart).push(provider_id.to_string());
            return;
        }
        self.provider_lost(
            provider_id,
            format!("provider `{provider_id}` went offline ({reason})"),
        )
        .await;
    }

    async fn on_provider_announced_online(&self, provider_id: &str) {
        self.sync_open_sessions(provider_id).await;
    }

    async fn on_session_update(&self, provider_id: &str, update: SessionUpdate) -> bool {
        self.apply_update(provider_id, update).await
    }
}
