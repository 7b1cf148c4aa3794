//! The Capability Registry (seed 001 §2.1): provider and capability
//! registration, heartbeats and liveness, shared by the HTTP API and the
//! MQTT ingest so both paths store the same rows and emit the same events.
//!
//! It tells the lease side what it learns through [`LeaseSync`] (new
//! capabilities, providers going on/offline, non-interruptible windows,
//! seed 001 §6.4) and tells later modules about provider restarts and
//! outages through [`ProviderHooks`] (the sessions module marks sessions
//! `incomplete_evidence` there, seed 001 §5.4).

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use chrono::Utc;
use shared_protocol::capability::{
    Capability, CapabilityBatchRegisterRequest, CapabilityBatchRegisterResponse,
};
use shared_protocol::mqtt::{SessionUpdate, StatusBody};
use shared_protocol::provider::{
    HeartbeatRequest, HeartbeatResponse, OnlineStatus, ProviderRegisterRequest,
    ProviderRegisterResponse,
};
use tokio::sync::watch;

use super::store::{boot_changed, ProviderFilter, ProviderStore, StoreError, StoreResult};
use crate::events::EventBus;
use crate::hearing::Hearing;
use crate::twins::{TwinSettings, TwinWatch};

/// What the registry tells the lease engine. Implemented for
/// [`crate::leases::LeaseEngine`] in `app.rs`; tests may use a recorder.
#[async_trait::async_trait]
pub trait LeaseSync: Send + Sync + 'static {
    /// A capability was registered or changed; `online` is its provider's
    /// status.
    async fn capability_upserted(&self, capability: &Capability, online: bool);
    /// A provider went online or offline (offline: its leases cannot be
    /// exercised; the engine decides what happens to them).
    async fn provider_online(&self, provider_id: &str, online: bool);
    /// A capability entered (`true`) or left (`false`) a non-interruptible
    /// window (seed 001 §6.4): revocation waits while it is in one.
    async fn non_interruptible(&self, capability_id: &str, in_window: bool);
    /// A capability's reported health changed; `unhealthy` ones are not
    /// granted (docs/policy.md "Health gating"). Nothing by default.
    async fn health_changed(&self, capability_id: &str, unhealthy: bool) {
        let _ = (capability_id, unhealthy);
    }
}

/// Callbacks for modules that own provider-side state (sessions). Every
/// method has a default that only logs, so an implementation overrides
/// what it needs. Called after the change is committed, from the task that
/// processed the message (keep them short; spawn for long work).
#[async_trait::async_trait]
pub trait ProviderHooks: Send + Sync + 'static {
    /// A known provider came back with a different boot id: the edge
    /// daemon restarted, so its sessions that were running cannot finish
    /// and should become `incomplete_evidence` (seed 001 §5.4).
    async fn on_provider_restarted(&self, provider_id: &str) {
        tracing::info!(provider_id, "provider restarted (new boot id): its running sessions should become incomplete_evidence");
    }

    /// A provider went offline, for `reason` (its text is the one stored
    /// with the change).
    async fn on_provider_offline(&self, provider_id: &str, reason: OfflineReason) {
        tracing::info!(
            provider_id,
            %reason,
            "provider offline: its running sessions cannot report until it returns"
        );
    }

    /// A provider announced itself `online` on MQTT (each (re)connection
    /// of its edge; or its retained status, when the registry subscribes).
    /// Called after the status is stored and after
    /// [`Self::on_provider_restarted`] where the boot id changed. Messages
    /// the provider published around its reconnection may have reached a
    /// broker with nobody subscribed: the sessions module asks it for the
    /// sessions still open (`session_sync`).
    async fn on_provider_announced_online(&self, provider_id: &str) {
        tracing::debug!(provider_id, "provider announced itself online");
    }

    /// A `session_update` arrived on the provider's `results` topic; the
    /// registry has checked the capability belongs to `provider_id`.
    /// False when it could not be stored (the store failed), so the same
    /// message sent again is applied rather than dropped as a duplicate.
    async fn on_session_update(&self, provider_id: &str, update: SessionUpdate) -> bool {
        tracing::info!(provider_id, session_id = %update.session_id, status = %update.status, "session update received (no sessions module attached)");
        true
    }
}

/// The hooks used when no module registered any: log only.
pub struct LoggingHooks;

#[async_trait::async_trait]
impl ProviderHooks for LoggingHooks {}

/// Why a provider went offline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OfflineReason {
    /// Its `offline` status arrived and held: it disconnected cleanly, or
    /// the broker published its last will.
    StatusReceived,
    /// Nothing heard from it for the offline timeout.
    MissedHeartbeats,
    /// Stored as `online` when a registry with the embedded broker
    /// started, so not connected now (see
    /// [`Providers::mark_unheard_providers_offline`]). Says nothing
    /// about the bench itself: a planned restart leaves it running.
    RegistryRestarted,
}

impl OfflineReason {
    /// The reason stored with the change and shown in its events.
    pub fn as_str(self) -> &'static str {
        match self {
            OfflineReason::StatusReceived => "offline status received: disconnect or last will",
            OfflineReason::MissedHeartbeats => "missed heartbeats",
            OfflineReason::RegistryRestarted => {
                "the registry restarted and the provider has not reconnected since"
            }
        }
    }
}

impl std::fmt::Display for OfflineReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A provider's presence as [`Providers`] records it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Presence {
    /// Its `online` status arrived.
    Online,
    Offline(OfflineReason),
}

/// Timing the registry needs from the configuration.
#[derive(Debug, Clone)]
pub struct ProviderSettings {
    /// Told to providers in register/heartbeat answers, seconds.
    pub heartbeat_interval_seconds: u32,
    /// Silence after which a provider is marked offline.
    pub offline_after: Duration,
    /// Minimum spacing of health snapshots per capability (unless changed).
    pub snapshot_min_interval: Duration,
    /// Twin detection ([`crate::twins`]).
    pub twins: TwinSettings,
}

/// The registry service. Share it as `Arc<Providers>`.
pub struct Providers {
    store: Arc<dyn ProviderStore>,
    bus: EventBus,
    leases: Arc<dyn LeaseSync>,
    hooks: RwLock<Vec<Arc<dyn ProviderHooks>>>,
    settings: ProviderSettings,
    /// Capabilities in a non-interruptible window, per provider, as last
    /// reported (so the engine hears only of changes).
    windows: Mutex<HashMap<String, HashSet<String>>>,
    /// Providers heard from two instances at once.
    twins: Arc<TwinWatch>,
    /// When each provider was last heard (registration, heartbeat,
    /// `online` status), on the monotonic clock: liveness compares these,
    /// never the stored `last_seen_at`, so a wall-clock step takes nobody
    /// offline (nor keeps a silent provider online).
    heard: Mutex<HashMap<String, Instant>>,
    /// When this registry started: the silence of a provider not heard
    /// since counts from here.
    started: Instant,
}

impl Providers {
    /// A registry over `store`, publishing on `bus`, telling `leases`.
    pub fn new(
        store: Arc<dyn ProviderStore>,
        bus: EventBus,
        leases: Arc<dyn LeaseSync>,
        settings: ProviderSettings,
    ) -> Arc<Self> {
        let twins = Arc::new(TwinWatch::new(settings.twins));
        Arc::new(Self {
            store,
            bus,
            leases,
            hooks: RwLock::new(Vec::new()),
            settings,
            windows: Mutex::new(HashMap::new()),
            twins,
            heard: Mutex::new(HashMap::new()),
            started: Instant::now(),
        })
    }

    /// Note that `provider_id` was heard now.
    fn heard_from(&self, provider_id: &str) {
        let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        heard.insert(provider_id.to_string(), Instant::now());
    }

    /// The store (reads for the API).
    pub fn store(&self) -> &Arc<dyn ProviderStore> {
        &self.store
    }

    /// The event bus.
    pub fn bus(&self) -> &EventBus {
        &self.bus
    }

    /// Twin detection (read by the action path: a provider in conflict is
    /// refused).
    pub fn twins(&self) -> &Arc<TwinWatch> {
        &self.twins
    }

    /// The timing settings.
    pub fn settings(&self) -> &ProviderSettings {
        &self.settings
    }

    /// Add a hook implementation; called in the order added.
    pub fn add_hooks(&self, hooks: Arc<dyn ProviderHooks>) {
        if let Ok(mut h) = self.hooks.write() {
            h.push(hooks);
        }
    }

    fn hooks(&self) -> Vec<Arc<dyn ProviderHooks>> {
        let list = self.hooks.read().map(|h| h.clone()).unwrap_or_default();
        if list.is_empty() {
            vec![Arc::new(LoggingHooks)]
        } else {
            list
        }
    }

    async fn provider_restarted(&self, provider_id: &str) {
        tracing::info!(provider_id, "provider restarted with a new boot id");
        for h in self.hooks() {
            h.on_provider_restarted(provider_id).await;
        }
    }

    async fn provider_went_offline(&self, provider_id: &str, reason: OfflineReason) {
        for h in self.hooks() {
            h.on_provider_offline(provider_id, reason).await;
        }
    }

    /// Hand a checked session update to the hooks. False when one of them
    /// could not store it (see [`ProviderHooks::on_session_update`]).
    pub async fn session_update(&self, provider_id: &str, update: SessionUpdate) -> bool {
        let mut stored = true;
        for h in self.hooks() {
            stored &= h.on_session_update(provider_id, update.clone()).await;
        }
        stored
    }

    /// Tell the lease engine about every stored capability and provider
    /// status (at start, so a restarted registry's engine knows them).
    pub async fn sync_lease_engine(&self) -> StoreResult<usize> {
        let providers = self.store.list_providers(Default::default()).await?;
        let online: HashMap<String, bool> = providers
            .iter()
            .map(|p| {
                (
                    p.provider_id.clone(),
                    p.online_status == OnlineStatus::Online,
                )
            })
            .collect();
        let caps = self.store.list_capabilities(Default::default()).await?;
        for c in &caps {
            let on = online.get(&c.provider_id).copied().unwrap_or(false);
            self.leases.capability_upserted(c, on).await;
        }
        Ok(caps.len())
    }

    /// Provider registration (seed 001 §4.1), HTTP or MQTT. `actor` is the
    /// authenticated principal (HTTP) or the MQTT provider id.
    pub async fn register_provider(
        &self,
        actor: &str,
        req: ProviderRegisterRequest,
    ) -> StoreResult<ProviderRegisterResponse> {
        let provider_id = req.provider_id.clone();
        let out = self.store.register_provider(actor, req, Utc::now()).await?;
        self.heard_from(&provider_id);
        self.bus.publish(out.events.clone());
        let restarted = out.restarted();
        if out.came_online {
            self.leases.provider_online(&provider_id, true).await;
        }
        if restarted {
            self.clear_windows(&provider_id).await;
            self.provider_restarted(&provider_id).await;
        }
        tracing::info!(
            provider_id,
            first = !out.was_known,
            restarted,
            "provider registered"
        );
        Ok(ProviderRegisterResponse {
            provider_id,
            accepted: true,
            heartbeat_interval_seconds: self.settings.heartbeat_interval_seconds,
        })
    }

    /// Capability batch registration (seed 001 §4.2), HTTP or MQTT.
    ///
    /// Errors: unknown provider (404), a capability of another provider
    /// (409 `capability_owned_by_other_provider`).
    pub async fn register_capabilities(
        &self,
        actor: &str,
        req: CapabilityBatchRegisterRequest,
    ) -> StoreResult<CapabilityBatchRegisterResponse> {
        let out = self
            .store
            .register_capabilities(actor, &req.provider_id, req.capabilities, Utc::now())
            .await?;
        self.bus.publish(out.events.clone());
        for c in &out.capabilities {
            self.leases
                .capability_upserted(c, out.provider_online)
                .await;
        }
        Ok(CapabilityBatchRegisterResponse {
            provider_id: req.provider_id,
            registered: out
                .capabilities
                .into_iter()
                .map(|c| c.capability_id)
                .collect(),
        })
    }

    /// A heartbeat (seed 001 §4.3), HTTP or MQTT.
    ///
    /// Errors: unknown provider (404).
    pub async fn heartbeat(
        &self,
        actor: &str,
        hb: HeartbeatRequest,
    ) -> StoreResult<HeartbeatResponse> {
        let provider_id = hb.provider_id.clone();
        let in_window: HashSet<String> = hb
            .running_sessions
            .iter()
            .filter(|s| s.non_interruptible)
            .map(|s| s.capability_id.clone())
            .collect();
        for f in &hb.faults {
            tracing::warn!(provider_id, capability_id = ?f.capability_id, code = %f.code, message = %f.message, "provider reported a fault");
        }
        let out = match self
            .store
            .record_heartbeat(actor, hb, Utc::now(), self.settings.snapshot_min_interval)
            .await
        {
            Ok(out) => out,
            Err(e @ StoreError::NotFound { .. }) => return Err(e),
            Err(e) => {
                // Heard, though not stored (e.g. the disk is full): the
                // provider is alive and must not be judged silent.
                self.heard_from(&provider_id);
                return Err(e);
            }
        };
        self.heard_from(&provider_id);
        self.bus.publish(out.events.clone());
        self.tell_health(&out.changes).await;
        if !out.unknown_capabilities.is_empty() {
            tracing::warn!(provider_id, unknown = ?out.unknown_capabilities, "heartbeat named capabilities this provider has not registered; ignored");
        }
        if out.came_online {
            self.leases.provider_online(&provider_id, true).await;
        }
        if boot_changed(out.previous_boot_id.as_deref(), out.boot_id.as_deref()) {
            self.clear_windows(&provider_id).await;
            self.provider_restarted(&provider_id).await;
        }
        // Only this provider's capabilities: a heartbeat cannot hold up
        // preemption on another provider's hardware.
        let owned: HashSet<&String> = out.capability_ids.iter().collect();
        let in_window = in_window
            .into_iter()
            .filter(|c| owned.contains(c))
            .collect();
        self.update_windows(&provider_id, in_window).await;
        Ok(HeartbeatResponse {
            accepted: true,
            heartbeat_interval_seconds: self.settings.heartbeat_interval_seconds,
            server_time: Utc::now(),
        })
    }

    /// Tell the lease engine of health changes (whether each capability
    /// is `unhealthy` now).
    async fn tell_health(&self, changes: &[super::store::HealthChange]) {
        use shared_protocol::capability::HealthStatus;
        for c in changes {
            if c.previous_health_status != c.health_status {
                let is = c.health_status == HealthStatus::Unhealthy;
                self.leases.health_changed(&c.capability_id, is).await;
            }
        }
    }

    /// A retained `status` message or the LWT.
    ///
    /// An `offline` that carries a boot id other than the stored one is a
    /// late will of an older connection and is ignored. Errors: unknown
    /// provider (404; a status before the first registration).
    pub async fn provider_status(&self, actor: &str, status: StatusBody) -> StoreResult<()> {
        let online = status.online_status == OnlineStatus::Online;
        if !online {
            if let Some(stored) = self.store.get_provider(&status.provider_id).await? {
                if boot_changed(stored.boot_id.as_deref(), status.boot_id.as_deref()) {
                    tracing::info!(provider_id = %status.provider_id, "ignoring offline status of an earlier boot");
                    return Ok(());
                }
            }
        }
        let presence = if online {
            Presence::Online
        } else {
            Presence::Offline(OfflineReason::StatusReceived)
        };
        let provider_id = status.provider_id.clone();
        self.set_online(actor, &provider_id, presence, status.boot_id)
            .await?;
        if online {
            self.provider_announced_online(&provider_id).await;
        }
        Ok(())
    }

    /// Tell the hooks `provider_id` announced itself online (see
    /// [`ProviderHooks::on_provider_announced_online`]). Called by
    /// [`Self::provider_status`], and on its own for a retained `online`
    /// status the registry had already applied, replayed when it
    /// subscribes again: the status changes nothing, but what the provider
    /// published meanwhile may have reached nobody.
    pub async fn provider_announced_online(&self, provider_id: &str) {
        for h in self.hooks() {
            h.on_provider_announced_online(provider_id).await;
        }
    }

    async fn set_online(
        &self,
        actor: &str,
        provider_id: &str,
        presence: Presence,
        boot_id: Option<String>,
    ) -> StoreResult<()> {
        let (online, reason) = match presence {
            Presence::Online => (true, "online status received"),
            Presence::Offline(why) => (false, why.as_str()),
        };
        let out = self
            .store
            .set_provider_online(
                actor,
                provider_id,
                online,
                boot_id.clone(),
                reason,
                Utc::now(),
            )
            .await?;
        if online {
            self.heard_from(provider_id);
        }
        self.bus.publish(out.events.clone());
        self.tell_health(&out.changes).await;
        if out.changed {
            tracing::info!(provider_id, online, reason, "provider status changed");
            self.leases.provider_online(provider_id, online).await;
        }
        if !online {
            self.clear_windows(provider_id).await;
            if let (true, Presence::Offline(why)) = (out.changed, presence) {
                self.provider_went_offline(provider_id, why).await;
            }
        } else if boot_changed(out.previous_boot_id.as_deref(), boot_id.as_deref()) {
            self.clear_windows(provider_id).await;
            self.provider_restarted(provider_id).await;
        }
        Ok(())
    }

    /// Mark offline every online provider silent for longer than
    /// `offline_after`, on the monotonic clock (since it was last heard,
    /// or since the registry started if not heard since); returns their
    /// ids.
    pub async fn mark_silent_providers_offline(&self) -> StoreResult<Vec<String>> {
        let online = self
            .store
            .list_providers(ProviderFilter {
                online_status: Some(OnlineStatus::Online),
            })
            .await?;
        let now = Instant::now();
        let ids: Vec<String> = {
            let heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
            online
                .into_iter()
                .map(|p| p.provider_id)
                .filter(|id| {
                    let last = heard.get(id).copied().unwrap_or(self.started);
                    now.saturating_duration_since(last) > self.settings.offline_after
                })
                .collect()
        };
        for id in &ids {
            match self
                .set_online(
                    "system",
                    id,
                    Presence::Offline(OfflineReason::MissedHeartbeats),
                    None,
                )
                .await
            {
                Ok(()) => {
                    tracing::warn!(provider_id = %id, "provider missed its heartbeats; marked offline")
                }
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(ids)
    }

    /// At the start of a registry whose MQTT broker starts with it (the
    /// embedded broker): no provider can be connected yet, so every
    /// provider the store still holds as `online` (from before the
    /// restart) is marked offline, with [`OfflineReason::RegistryRestarted`],
    /// through the same path as a confirmed offline (status row,
    /// capability events and snapshots, lease engine, hooks; the sessions
    /// module leaves their open sessions to the provider's report, its
    /// restart or their deadline). A provider becomes online again
    /// when it is next heard (status, registration, heartbeat). Returns the
    /// ids marked; a second call finds none (idempotent). One query when
    /// nobody is stored online.
    ///
    /// Not for an external broker, whose providers may still be connected
    /// across a registry restart.
    ///
    /// Errors: the store cannot be read or written.
    pub async fn mark_unheard_providers_offline(&self) -> StoreResult<Vec<String>> {
        let stored_online = self
            .store
            .list_providers(ProviderFilter {
                online_status: Some(OnlineStatus::Online),
            })
            .await?;
        let mut marked = Vec::with_capacity(stored_online.len());
        for p in stored_online {
            match self
                .set_online(
                    "system",
                    &p.provider_id,
                    Presence::Offline(OfflineReason::RegistryRestarted),
                    None,
                )
                .await
            {
                Ok(()) => {
                    tracing::info!(provider_id = %p.provider_id, "provider stored as online before the restart; offline until it reconnects");
                    marked.push(p.provider_id);
                }
                Err(StoreError::NotFound { .. }) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(marked)
    }

    /// Check for silent providers every heartbeat interval until `shutdown`
    /// turns true. The first check waits one full `offline_after` window:
    /// after a registry restart every provider gets the time to report
    /// before it is judged silent.
    ///
    /// Silence counts only while the registry can hear ([`Hearing`], from
    /// [`crate::mqtt::MqttLink::hearing`]): while the MQTT link is down
    /// nobody is judged (a broker outage silences every provider through
    /// no fault of theirs); while it is up, nobody is judged until
    /// `offline_after` has passed since it last (re)connected or since the
    /// registry last ran again after a stall (its process stopped or its
    /// machine frozen), so each provider gets a full window to be heard
    /// again after either.
    /// Heartbeats over HTTP count as hearing from a provider like MQTT
    /// ones.
    pub async fn run_liveness_monitor(
        self: Arc<Self>,
        hearing: Hearing,
        mut shutdown: watch::Receiver<bool>,
    ) {
        tokio::select! {
            _ = tokio::time::sleep(self.settings.offline_after) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        let period =
            Duration::from_secs(u64::from(self.settings.heartbeat_interval_seconds.max(1)))
                .min(self.settings.offline_after)
                .max(Duration::from_millis(200));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut held = false;
        loop {
            tokio::select! {
                _ = tick.tick() => {
                    let up_since = hearing.since();
                    let may_judge =
                        may_judge_silence(up_since, Instant::now(), self.settings.offline_after);
                    if held == may_judge {
                        held = !may_judge;
                        if held {
                            tracing::info!(link_up = up_since.is_some(), "MQTT link down, just restored, or the registry just ran again after a stall: no provider is judged silent until the registry has heard for the offline timeout");
                        } else {
                            tracing::info!("judging provider silence again");
                        }
                    }
                    if may_judge {
                        match self.mark_silent_providers_offline().await {
                            Ok(_) => {}
                            Err(e) if crate::storage::is_full(&e) => {
                                crate::storage::note_full("liveness check", &e)
                            }
                            Err(e) => tracing::error!(error = %e, "liveness check failed"),
                        }
                    }
                }
                _ = shutdown.changed() => break,
            }
            if *shutdown.borrow() {
                break;
            }
        }
    }

    async fn update_windows(&self, provider_id: &str, now_in: HashSet<String>) {
        let (entered, left) = {
            let Ok(mut map) = self.windows.lock() else {
                return;
            };
            let before = map.entry(provider_id.to_string()).or_default();
            let entered: Vec<String> = now_in.difference(before).cloned().collect();
            let left: Vec<String> = before.difference(&now_in).cloned().collect();
            *before = now_in;
            (entered, left)
        };
        for c in entered {
            self.leases.non_interruptible(&c, true).await;
        }
        for c in left {
            self.leases.non_interruptible(&c, false).await;
        }
    }

    async fn clear_windows(&self, provider_id: &str) {
        self.update_windows(provider_id, HashSet::new()).await;
    }
}

/// Whether silence may be held against providers at `now`: only while the
/// registry has heard ([`Hearing::since`] is `Some`) for at least
/// `offline_after`.
fn may_judge_silence(
    link_up_since: Option<Instant>,
    now: Instant,
    offline_after: Duration,
) -> bool {
    link_up_since.is_some_and(|since| now.saturating_duration_since(since) >= offline_after)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn silence_is_judged_only_after_the_link_has_been_up_a_full_window() {
        let window = Duration::from_secs(6);
        let restored = Instant::now();
        // Link down: nobody is judged, however long the silence.
        assert!(!may_judge_silence(None, restored + window * 10, window));
        // Link just back: not before a full window has passed.
        assert!(!may_judge_silence(Some(restored), restored, window));
        assert!(!may_judge_silence(
            Some(restored),
            restored + window - Duration::from_millis(1),
            window
        ));
        assert!(may_judge_silence(Some(restored), restored + window, window));
        assert!(may_judge_silence(
            Some(restored),
            restored + window * 3,
            window
        ));
    }
}
