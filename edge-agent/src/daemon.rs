//! The bench daemon: wires the outbox, the capability runners, the MQTT
//! link, the uploader, the command dispatcher and the deadline supervisor,
//! and shuts them down in order.
//!
//! Start-up: open the outbox (repairing what a crash left), build every
//! driver (no device is opened), start one runner thread per capability,
//! then the link and the uploader. Commands from the registry (or
//! [`Daemon::submit`]) go through one dispatcher, which fences each
//! `action_invoke` ([`crate::fence`], [`crate::clock`]) before a runner
//! sees it.
//!
//! Shutdown (SIGTERM/SIGINT → one signal): stop taking commands; cancel
//! queued sessions and interruptible running actions (non-interruptible
//! ones finish); wait for the runners; publish what is queued, then the
//! retained `offline` status, and disconnect; checkpoint the outbox.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::Utc;
use shared_protocol::capability::{CapabilityRegistration, HealthStatus};
use shared_protocol::lease::PreemptNotice;
use shared_protocol::mqtt::{
    ActionCancel, ActionCommand, Envelope, FenceRefusal, LeaseGranted, LeaseRevoked, MessageType,
    OpenSession, ProviderConflict, RegisterAck, RegisterBody, SessionSync,
};
use shared_protocol::provider::{HeartbeatRequest, ProviderFault, ProviderRegisterRequest};
use shared_protocol::session::SessionStatus;
use tokio::sync::{mpsc, watch, Notify};
use tokio::task::JoinHandle;

use crate::clock::RegistryClock;
use crate::config::{ConfigError, EdgeConfig};
use crate::fence::Fences;
use crate::link::{HeartbeatControl, Link, LinkConfig, LinkSource, LinkState};
use crate::notify::Notifier;
use crate::outbox::{Outbox, OutboxError, SyncAnswer};
use crate::runner::{
    refused_update, session_update, CancelOutcome, Rejection, Runners, UpdateSink,
};
use crate::status;
use crate::uploader::Uploader;

/// How long runners get to finish at shutdown before the daemon goes on.
pub const RUNNER_STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the link gets to publish what is queued and `offline`.
pub const LINK_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the daemon could not start.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("outbox: {0}")]
    Outbox(#[from] OutboxError),
    #[error("starting runner threads: {0}")]
    Threads(std::io::Error),
    #[error("HTTP client: {0}")]
    Http(#[from] reqwest::Error),
    #[error("start-up task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error("cannot listen for metrics on {addr} (`[metrics] listen`): {source}")]
    MetricsListen {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    /// `[registry] ca_file` or the system's CA certificates cannot be used.
    #[error("TLS: {0}")]
    Tls(String),
}

/// A running daemon.
pub struct Daemon {
    cfg: Arc<EdgeConfig>,
    boot_id: String,
    outbox: Outbox,
    runners: Arc<Runners>,
    link: Link,
    local_tx: mpsc::Sender<Envelope>,
    stop_tx: watch::Sender<bool>,
    uploader_task: JoinHandle<()>,
    dispatcher_task: JoinHandle<()>,
    supervisor_task: JoinHandle<()>,
    clock_task: JoinHandle<()>,
    notifier: Notifier,
    started_at: chrono::DateTime<Utc>,
    metrics: crate::metrics::EdgeMetrics,
    /// The `[metrics]` listener's address and task, when configured.
    metrics_server: Option<(std::net::SocketAddr, JoinHandle<()>)>,
}

impl Daemon {
    /// Start everything for `cfg`. Returns once the runners are up; the
    /// broker may still be unreachable (the link keeps trying).
    pub async fn start(cfg: EdgeConfig) -> Result<Daemon, DaemonError> {
        let cfg = Arc::new(cfg);
        // Bind first: a taken port fails before anything else starts.
        let metrics_listener = match cfg.metrics.listen {
            Some(addr) => Some(
                crate::metrics::bind(addr)
                    .await
                    .map_err(|source| DaemonError::MetricsListen { addr, source })?,
            ),
            None => None,
        };
        let metrics = crate::metrics::EdgeMetrics::new();
        let boot_id = uuid::Uuid::new_v4().to_string();
        tracing::info!(
            provider_id = %cfg.provider.provider_id,
            %boot_id,
            capabilities = cfg.capabilities.len(),
            version = env!("CARGO_PKG_VERSION"),
            "edge-agent starting"
        );

        let c = cfg.clone();
        let (outbox, recovery) = tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&c.state_dir).ok();
            Outbox::open(&c.outbox, &c.provider.provider_id)
        })
        .await??;
        if recovery != Default::default() {
            tracing::warn!(?recovery, "outbox repaired after an unclean stop");
        }

        let updates_ready = Arc::new(Notify::new());
        let artifacts_ready = Arc::new(Notify::new());
        let sink = UpdateSink::new(
            outbox.clone(),
            updates_ready.clone(),
            artifacts_ready.clone(),
        );

        let ca_file = cfg.registry.ca_file.clone();
        let mqtt_tls = cfg.registry.mqtt_tls;
        let (http_trust, mqtt_tls) = tokio::task::spawn_blocking(move || {
            let http = crate::tls::http_trust(ca_file.as_deref())?;
            let mqtt = if mqtt_tls {
                Some(crate::tls::mqtt_client_config(ca_file.as_deref())?)
            } else {
                None
            };
            Ok::<_, String>((http, mqtt))
        })
        .await?
        .map_err(|e| DaemonError::Tls(format!("registry.ca_file: {e}")))?;
        let clock = RegistryClock::new(&cfg.registry.base_url, http_trust.as_deref())?;
        let c = cfg.clone();
        let ob = outbox.clone();
        let sink2 = sink.clone();
        let clock2 = clock.clone();
        let m = metrics.clone();
        let (runners, registrations) = tokio::task::spawn_blocking(move || {
            let drivers = c.build_drivers()?;
            let pairs = c.capabilities.iter().cloned().zip(drivers).collect();
            Runners::start(pairs, ob, sink2, clock2, m).map_err(DaemonError::Threads)
        })
        .await??;
        let runners = Arc::new(runners);

        let source = Arc::new(DaemonSource {
            provider: provider_request(&cfg, &boot_id),
            registrations,
            runners: runners.clone(),
            outbox: outbox.clone(),
        });
        let (link, link_rx) = Link::start(
            LinkConfig {
                provider_id: cfg.provider.provider_id.clone(),
                host: cfg.registry.mqtt_host.clone(),
                port: cfg.registry.mqtt_port,
                tls: mqtt_tls,
                topic_prefix: cfg.registry.topic_prefix.clone(),
                token: cfg.registry.token.clone(),
                keep_alive_seconds: cfg.registry.mqtt_keep_alive_seconds,
                heartbeat_interval_seconds: cfg.registry.heartbeat_interval_seconds,
                boot_id: boot_id.clone(),
            },
            source,
            outbox.clone(),
            updates_ready,
        );
        crate::drivers::live::set_sink(link.frame_sender());

        let (stop_tx, stop_rx) = watch::channel(false);
        let uploader = Uploader::new(
            outbox.clone(),
            &cfg.registry.base_url,
            &cfg.registry.token,
            artifacts_ready,
            http_trust.as_deref(),
        )?;
        let uploader_task = tokio::spawn(uploader.run(stop_rx.clone()));
        let clock_task = tokio::spawn(clock.clone().run(stop_rx.clone()));

        let (local_tx, local_rx) = mpsc::channel(256);
        let dispatcher_task = tokio::spawn(dispatch_loop(
            link_rx,
            local_rx,
            Dispatcher {
                runners: runners.clone(),
                sink: sink.clone(),
                heartbeat: link.heartbeat_control(),
                received: Arc::default(),
                clock,
                fences: Arc::default(),
                boot_id: boot_id.clone(),
            },
            stop_rx.clone(),
        ));
        let supervisor_task =
            tokio::spawn(supervise_deadlines(runners.clone(), sink, stop_rx.clone()));
        let metrics_server = match metrics_listener {
            Some(listener) => {
                let addr = listener
                    .local_addr()
                    .map_err(|source| DaemonError::MetricsListen {
                        addr: cfg
                            .metrics
                            .listen
                            .unwrap_or_else(|| ([127, 0, 0, 1], 0).into()),
                        source,
                    })?;
                let scrape = crate::metrics::Scrape {
                    metrics: metrics.clone(),
                    link: link.state(),
                    runners: runners.clone(),
                    types: Arc::new(
                        cfg.capabilities
                            .iter()
                            .map(|c| (c.id.clone(), c.capability_type.to_string()))
                            .collect(),
                    ),
                };
                tracing::info!(%addr, "serving metrics at /metrics");
                let task = tokio::spawn(crate::metrics::serve(listener, scrape, stop_rx));
                Some((addr, task))
            }
            None => None,
        };

        Ok(Daemon {
            cfg,
            boot_id,
            outbox,
            runners,
            link,
            local_tx,
            stop_tx,
            uploader_task,
            dispatcher_task,
            supervisor_task,
            clock_task,
            notifier: Notifier::from_env(),
            started_at: Utc::now(),
            metrics,
            metrics_server,
        })
    }

    /// This process start's random id (in `status`, `register`, heartbeats).
    pub fn boot_id(&self) -> &str {
        &self.boot_id
    }

    /// This bench's provider id.
    pub fn provider_id(&self) -> &str {
        &self.cfg.provider.provider_id
    }

    /// Ids of the capabilities this daemon runs, in configuration order.
    pub fn capability_ids(&self) -> Vec<String> {
        self.cfg.capabilities.iter().map(|c| c.id.clone()).collect()
    }

    /// Where `GET /metrics` is served (the real port when 0 was
    /// configured); `None` without `[metrics] listen`.
    pub fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics_server.as_ref().map(|(a, _)| *a)
    }

    /// The evidence outbox.
    pub fn outbox(&self) -> &Outbox {
        &self.outbox
    }

    /// The MQTT connection state.
    pub fn link_state(&self) -> Arc<LinkState> {
        self.link.state()
    }

    /// Hand a command envelope to the dispatcher exactly as if it had
    /// arrived on the commands topic (false when the queue is full or the
    /// daemon is stopping).
    pub fn submit(&self, envelope: Envelope) -> bool {
        self.local_tx.try_send(envelope).is_ok()
    }

    /// Serve until `shutdown` resolves, pinging the systemd watchdog at half
    /// its interval while healthy; then stop cleanly.
    pub async fn run_until(self, shutdown: impl Future<Output = ()>) {
        let ping_every = self
            .notifier
            .ping_interval()
            .unwrap_or(Duration::from_secs(10));
        self.notifier.ready(&self.status_line().await);
        let mut tick = tokio::time::interval(ping_every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut status_tick = tokio::time::interval(status::STATUS_PERIOD);
        status_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut errors = status::ErrorMemory::default();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                _ = &mut shutdown => break,
                _ = status_tick.tick() => self.write_status(&mut errors).await,
                _ = tick.tick() => {
                    match self.health_problem().await {
                        None => {
                            self.notifier.watchdog_ping();
                            self.notifier.status(&self.status_line().await);
                        }
                        Some(problem) => {
                            tracing::error!("daemon unhealthy, withholding the watchdog ping: {problem}");
                            self.notifier.status(&format!("unhealthy: {problem}"));
                        }
                    }
                }
            }
        }
        tracing::info!("shutdown requested");
        self.shutdown().await;
    }

    /// Writes `<state_dir>/status.json` for `edge-agent status` (see
    /// [`crate::status`]); a failure is logged once per kind of error.
    async fn write_status(&self, errors: &mut status::ErrorMemory) {
        let outbox = self.outbox.clone();
        let runners = self.runners.clone();
        let (stats, health) = match tokio::task::spawn_blocking(move || {
            (outbox.stats().unwrap_or_default(), runners.health_reports())
        })
        .await
        {
            Ok(v) => v,
            Err(_) => return,
        };
        let types: HashMap<&str, String> = self
            .cfg
            .capabilities
            .iter()
            .map(|c| (c.id.as_str(), c.capability_type.to_string()))
            .collect();
        let mut capabilities: Vec<status::CapabilityStatus> = health
            .into_iter()
            .map(|h| status::CapabilityStatus {
                capability_type: types
                    .get(h.capability_id.as_str())
                    .cloned()
                    .unwrap_or_default(),
                capability_id: h.capability_id,
                health_status: h.health_status,
                message: h.message,
                last_error: None,
            })
            .collect();
        let now = Utc::now();
        self.metrics.set_outbox(&stats, now);
        errors.apply(now, &mut capabilities);
        let link = self.link.state();
        let snapshot = status::DaemonStatus {
            written_at: now,
            pid: std::process::id(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            provider_id: self.cfg.provider.provider_id.clone(),
            node_id: self.cfg.provider.node_id.clone(),
            boot_id: self.boot_id.clone(),
            started_at: self.started_at,
            broker: status::BrokerStatus {
                address: format!(
                    "{}:{}",
                    self.cfg.registry.mqtt_host, self.cfg.registry.mqtt_port
                ),
                connected: link.is_connected(),
                connects: link.connect_count(),
            },
            registry: status::RegistryStatus {
                base_url: self.cfg.registry.base_url.clone(),
                registered: link.is_registered(),
            },
            outbox: status::OutboxStatus {
                pending_artifacts: stats.pending_artifacts,
                pending_bytes: stats.pending_bytes,
                queued_updates: stats.queued_updates,
                corrupt_artifacts: stats.corrupt_artifacts,
                budget_used_bytes: stats.budget_used_bytes,
                budget_bytes: stats.budget_bytes,
            },
            capabilities,
        };
        let path = status::status_path(&self.cfg.state_dir);
        let written = tokio::task::spawn_blocking(move || snapshot.write(&path)).await;
        if let Ok(Err(e)) = written {
            tracing::debug!(error = %e, "cannot write the status file");
        }
    }

    /// `None` while every part works; else what is wrong.
    async fn health_problem(&self) -> Option<String> {
        if !self.runners.all_alive() {
            return Some("a capability runner thread has died".into());
        }
        if !self.link.is_alive() {
            return Some("the MQTT link tasks have stopped".into());
        }
        if self.uploader_task.is_finished() {
            return Some("the uploader has stopped".into());
        }
        if self.dispatcher_task.is_finished() || self.supervisor_task.is_finished() {
            return Some("the command dispatcher has stopped".into());
        }
        let outbox = self.outbox.clone();
        match tokio::time::timeout(
            Duration::from_secs(5),
            tokio::task::spawn_blocking(move || outbox.ping()),
        )
        .await
        {
            Ok(Ok(true)) => None,
            _ => Some("the outbox database does not answer within 5 s".into()),
        }
    }

    async fn status_line(&self) -> String {
        let outbox = self.outbox.clone();
        let stats = tokio::task::spawn_blocking(move || outbox.stats())
            .await
            .ok()
            .and_then(Result::ok)
            .unwrap_or_default();
        let state = self.link.state();
        format!(
            "{} capabilities; broker {}; {} artifacts ({:.1} MiB) awaiting upload; {} session updates queued",
            self.cfg.capabilities.len(),
            if state.is_connected() { "connected" } else { "unreachable" },
            stats.pending_artifacts,
            stats.pending_bytes as f64 / (1024.0 * 1024.0),
            stats.queued_updates,
        )
    }

    /// Stop in order (see the module docs).
    pub async fn shutdown(self) {
        self.notifier
            .stopping("stopping: finishing running actions");
        let _ = self.stop_tx.send(true);
        let _ = self.dispatcher_task.await;

        let runners = self.runners.clone();
        let sink = runners.sink().clone();
        let stuck = tokio::task::spawn_blocking(move || {
            for update in runners.begin_shutdown("provider shutting down") {
                sink.emit_logged(&update);
            }
            runners.join(RUNNER_STOP_TIMEOUT)
        })
        .await
        .unwrap_or_default();
        if !stuck.is_empty() {
            tracing::error!(capabilities = ?stuck, "runners still busy at shutdown; leaving them");
        }
        let mut supervisor = self.supervisor_task;
        if tokio::time::timeout(Duration::from_secs(1), &mut supervisor)
            .await
            .is_err()
        {
            supervisor.abort();
        }

        self.clock_task.abort();
        let mut uploader = self.uploader_task;
        if tokio::time::timeout(Duration::from_secs(2), &mut uploader)
            .await
            .is_err()
        {
            // An upload in flight is simply sent again next start.
            uploader.abort();
        }

        self.notifier
            .stopping("stopping: publishing offline status");
        self.link.shutdown(LINK_STOP_TIMEOUT).await;
        if let Some((_, mut task)) = self.metrics_server {
            // Stopped by the signal above; a scrape in flight is cut here.
            if tokio::time::timeout(Duration::from_secs(1), &mut task)
                .await
                .is_err()
            {
                task.abort();
            }
        }

        let outbox = self.outbox.clone();
        match tokio::task::spawn_blocking(move || outbox.checkpoint()).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::warn!("outbox checkpoint at shutdown failed: {e}"),
            Err(e) => tracing::warn!("outbox checkpoint at shutdown failed: {e}"),
        }
        tracing::info!("edge-agent stopped");
    }
}

fn provider_request(cfg: &EdgeConfig, boot_id: &str) -> ProviderRegisterRequest {
    let p = &cfg.provider;
    ProviderRegisterRequest {
        provider_id: p.provider_id.clone(),
        node_id: p.node_id.clone(),
        hostname: p.hostname.clone(),
        platform: p.platform.clone(),
        gateway_version: env!("CARGO_PKG_VERSION").to_string(),
        network_zone: p.network_zone.clone(),
        labels: p.labels.clone(),
        owner_type: p.owner_type.clone(),
        owner_display_name: p.owner_display_name.clone(),
        auth_mode: Some("token".into()),
        boot_id: Some(boot_id.to_string()),
    }
}

/// What the link publishes, read from the runners and the outbox.
struct DaemonSource {
    provider: ProviderRegisterRequest,
    registrations: Vec<CapabilityRegistration>,
    runners: Arc<Runners>,
    outbox: Outbox,
}

impl LinkSource for DaemonSource {
    fn register_body(&self) -> RegisterBody {
        RegisterBody {
            provider: self.provider.clone(),
            capabilities: self.registrations.clone(),
        }
    }

    fn heartbeat_body(&self) -> HeartbeatRequest {
        let now = Utc::now();
        let mut faults = Vec::new();
        for (capability_id, message) in self.runners.stuck_capabilities() {
            faults.push(ProviderFault {
                capability_id: Some(capability_id),
                code: "driver_stuck".into(),
                message,
                occurred_at: now,
            });
        }
        // While the disk is full every capability reports it: no action's
        // evidence can be kept. Once there is room the reserve is made
        // again (this runs on the blocking pool) and health recovers.
        let disk_problem = match self.outbox.disk_problem() {
            Some(_) if self.outbox.restore_reserve() => None,
            p => p,
        };
        if let Some(message) = &disk_problem {
            faults.push(ProviderFault {
                capability_id: None,
                code: "outbox_disk_full".into(),
                message: message.clone(),
                occurred_at: now,
            });
        }
        if let Ok(stats) = self.outbox.stats() {
            if stats.budget_bytes > 0 && stats.budget_used_bytes * 10 >= stats.budget_bytes * 9 {
                faults.push(ProviderFault {
                    capability_id: None,
                    code: "outbox_near_budget".into(),
                    message: format!(
                        "{} of {} MiB of the outbox disk budget used ({} artifacts awaiting upload, the rest uploaded and awaiting the acknowledgment of their metadata)",
                        stats.budget_used_bytes / (1024 * 1024),
                        stats.budget_bytes / (1024 * 1024),
                        stats.pending_artifacts
                    ),
                    occurred_at: now,
                });
            }
            if stats.corrupt_artifacts > 0 {
                faults.push(ProviderFault {
                    capability_id: None,
                    code: "outbox_corrupt_artifacts".into(),
                    message: format!(
                        "{} artifacts no longer match their recorded sha256 (disk corruption); kept for inspection",
                        stats.corrupt_artifacts
                    ),
                    occurred_at: now,
                });
            }
        }
        let mut capabilities = self.runners.health_reports();
        if let Some(message) = &disk_problem {
            for c in &mut capabilities {
                c.health_status = HealthStatus::Unhealthy;
                c.message = Some(message.clone());
            }
        }
        HeartbeatRequest {
            provider_id: self.provider.provider_id.clone(),
            boot_id: self.provider.boot_id.clone(),
            capabilities,
            running_sessions: self.runners.running_sessions(),
            faults,
        }
    }
}

// ---------------------------------------------------------------------------
// Dispatch.

#[derive(Clone)]
struct Dispatcher {
    runners: Arc<Runners>,
    sink: UpdateSink,
    heartbeat: HeartbeatControl,
    received: Arc<Mutex<Received>>,
    clock: Arc<RegistryClock>,
    fences: Arc<Mutex<Fences>>,
    /// This start's boot id (to tell this instance from a twin).
    boot_id: String,
}

/// Sessions this daemon got an `action_invoke` for since it started (the
/// newest [`RECEIVED_KEPT`]), so a `session_sync` tells a session never
/// received from one that ran. Memory is enough: after a restart the new
/// boot id makes the registry end the sessions of the old one.
#[derive(Default)]
struct Received {
    /// Session id → reported `failed` as never received.
    sessions: HashMap<String, bool>,
    order: VecDeque<String>,
}

/// Session ids [`Received`] remembers.
const RECEIVED_KEPT: usize = 100_000;

impl Received {
    /// Note that `session_id` is known here, as received (`lost = false`)
    /// or as reported never received (`lost = true`). Returns what was
    /// noted before, if anything.
    fn note(&mut self, session_id: &str, lost: bool) -> Option<bool> {
        if let Some(was) = self.sessions.get(session_id) {
            return Some(*was);
        }
        self.sessions.insert(session_id.to_string(), lost);
        self.order.push_back(session_id.to_string());
        if self.order.len() > RECEIVED_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.sessions.remove(&old);
            }
        }
        None
    }
}

/// A command whose envelope is older than this on the registry's clock
/// when it arrives has waited somewhere (a stopped bench or broker): what
/// followed it is probably right behind, so the dispatcher first lets that
/// backlog arrive ([`BACKLOG_SETTLE`]) and notes its revocations and grants
/// before judging the command.
pub const STALE_TRANSIT: Duration = Duration::from_millis(500);
/// How long the dispatcher lets a backlog arrive before judging a command
/// that was long in transit.
pub const BACKLOG_SETTLE: Duration = Duration::from_millis(200);

async fn dispatch_loop(
    mut link_rx: mpsc::Receiver<Envelope>,
    mut local_rx: mpsc::Receiver<Envelope>,
    d: Dispatcher,
    mut stop: watch::Receiver<bool>,
) {
    let mut backlog: VecDeque<Envelope> = VecDeque::new();
    loop {
        let env = match backlog.pop_front() {
            Some(env) => env,
            None => tokio::select! {
                Some(env) = link_rx.recv() => env,
                Some(env) = local_rx.recv() => env,
                _ = stop.changed() => return,
                else => return,
            },
        };
        if backlog.is_empty()
            && env.message_type == MessageType::ActionInvoke
            && d.long_in_transit(&env)
        {
            tokio::select! {
                _ = tokio::time::sleep(BACKLOG_SETTLE) => {}
                _ = stop.changed() => return,
            }
            while let Ok(more) = link_rx.try_recv() {
                backlog.push_back(more);
            }
            d.note_ahead(&backlog).await;
        }
        d.handle(env).await;
    }
}

impl Dispatcher {
    async fn emit(&self, updates: Vec<shared_protocol::mqtt::SessionUpdate>) {
        if updates.is_empty() {
            return;
        }
        let sink = self.sink.clone();
        let _ = tokio::task::spawn_blocking(move || {
            for u in &updates {
                sink.emit_logged(u);
            }
        })
        .await;
    }

    async fn handle(&self, env: Envelope) {
        self.clock.note_sent_at(env.sent_at);
        match env.message_type {
            MessageType::RegisterAck => {
                match env.body_as::<RegisterAck>(MessageType::RegisterAck) {
                    Ok(ack) if ack.accepted => {
                        tracing::info!(
                            heartbeat_interval_seconds = ack.heartbeat_interval_seconds,
                            registered = ack.registered.len(),
                            "registry accepted the registration"
                        );
                        self.heartbeat.set(ack.heartbeat_interval_seconds);
                    }
                    Ok(ack) => tracing::error!(
                        error = ack.error.as_deref().unwrap_or("no reason given"),
                        "registry refused the registration"
                    ),
                    Err(e) => tracing::warn!("malformed register_ack: {e}"),
                }
            }
            MessageType::ActionInvoke => self.on_action_invoke(&env).await,
            MessageType::ActionCancel => {
                match env.body_as::<ActionCancel>(MessageType::ActionCancel) {
                    Ok(c) => match self.runners.cancel_session(&c.session_id, &c.reason) {
                        CancelOutcome::CancelledQueued(u) => self.emit(vec![u]).await,
                        CancelOutcome::Signalled => {
                            tracing::info!(session_id = %c.session_id, reason = %c.reason, "cancelling a running action")
                        }
                        CancelOutcome::Deferred => tracing::info!(
                            session_id = %c.session_id,
                            "the running action is non-interruptible; it finishes before the cancel applies"
                        ),
                        CancelOutcome::NotFound => {
                            tracing::debug!(session_id = %c.session_id, "cancel for a session not running here")
                        }
                    },
                    Err(e) => tracing::warn!("malformed action_cancel: {e}"),
                }
            }
            MessageType::LeaseGranted => self.on_lease_granted(&env).await,
            MessageType::LeaseRevoked => self.on_lease_revoked(&env).await,
            MessageType::PreemptRequested => {
                match env.body_as::<PreemptNotice>(MessageType::PreemptRequested) {
                    Ok(n) => {
                        tracing::info!(notice = ?n, "preemption requested; the holder has a grace period")
                    }
                    Err(e) => tracing::warn!("malformed preempt_requested: {e}"),
                }
            }
            MessageType::ProviderConflict => {
                match env.body_as::<ProviderConflict>(MessageType::ProviderConflict) {
                    Ok(c) => self.provider_conflict(c),
                    Err(e) => tracing::warn!("malformed provider_conflict: {e}"),
                }
            }
            MessageType::SessionSync => {
                match env.body_as::<SessionSync>(MessageType::SessionSync) {
                    Ok(sync) => self.sync_sessions(sync.sessions).await,
                    Err(e) => tracing::warn!("malformed session_sync: {e}"),
                }
            }
            other => {
                tracing::warn!(message_type = %other, "unexpected message on the commands topic")
            }
        }
    }

    /// `action_invoke`: run the command unless its fence refuses it; a
    /// malformed one that names its session fails that session.
    async fn on_action_invoke(&self, env: &Envelope) {
        match env.body_as::<ActionCommand>(MessageType::ActionInvoke) {
            Ok(cmd) => {
                let session_id = cmd.session_id.clone();
                let capability_id = cmd.capability_id.clone();
                if self.note_received(&session_id) == Some(true) {
                    tracing::warn!(%session_id, "action_invoke for a session already reported never received; not run");
                    return;
                }
                let not_after = match self.fence(&cmd).await {
                    Ok(t) => t,
                    Err((why, detail)) => {
                        tracing::warn!(
                            %session_id,
                            lease_id = %cmd.lease_id,
                            %capability_id,
                            refusal = %why,
                            "refused a command by its fence: {detail}"
                        );
                        self.emit(vec![refused_update(
                            &session_id,
                            &capability_id,
                            why,
                            &detail,
                        )])
                        .await;
                        return;
                    }
                };
                match self.runners.submit(cmd, not_after) {
                    Ok(()) => {}
                    Err(Rejection::DuplicateSession(id)) => {
                        tracing::warn!(session_id = %id, "ignoring a second action_invoke for a session already accepted");
                    }
                    Err(r) => {
                        self.emit(vec![session_update(
                            &session_id,
                            &capability_id,
                            SessionStatus::Failed,
                            Some(r.to_string()),
                        )])
                        .await
                    }
                }
            }
            Err(e) => {
                // Name the session if the body lets us, so the
                // registry can fail it instead of waiting.
                let field = |k: &str| env.body.get(k).and_then(|v| v.as_str()).map(str::to_string);
                match (field("session_id"), field("capability_id")) {
                    (Some(s), Some(c)) if shared_protocol::validate::check_id("s", &s).is_ok() => {
                        self.note_received(&s);
                        self.emit(vec![session_update(
                            &s,
                            &c,
                            SessionStatus::Failed,
                            Some(format!("malformed action_invoke: {e}")),
                        )])
                        .await
                    }
                    _ => {
                        tracing::warn!(message_id = %env.message_id, "dropping a malformed action_invoke: {e}")
                    }
                }
            }
        }
    }

    /// `lease_granted`: note the lease in the fences and stop what it supersedes.
    async fn on_lease_granted(&self, env: &Envelope) {
        match env.body_as::<LeaseGranted>(MessageType::LeaseGranted) {
            Ok(g) => {
                let superseded = lock_fences(&self.fences).note_lease(
                    &g.capability_id,
                    &g.lease_id,
                    g.lease_generation,
                    g.lease_mode,
                );
                tracing::info!(
                    lease_id = %g.lease_id,
                    capability_id = %g.capability_id,
                    lease_generation = g.lease_generation,
                    lease_mode = %g.lease_mode,
                    superseded = superseded.len(),
                    "lease granted"
                );
                self.stop_superseded(&g.capability_id, &g.lease_id, superseded)
                    .await;
            }
            Err(e) => tracing::warn!("malformed lease_granted: {e}"),
        }
    }

    /// `lease_revoked`: end the lease in the fences and stop its sessions.
    async fn on_lease_revoked(&self, env: &Envelope) {
        match env.body_as::<LeaseRevoked>(MessageType::LeaseRevoked) {
            Ok(r) => {
                lock_fences(&self.fences).note_ended(
                    &r.capability_id,
                    &r.lease_id,
                    r.lease_generation,
                );
                let (updates, running) = self.runners.revoke_lease(
                    &r.lease_id,
                    &r.capability_id,
                    &format!("lease {} revoked: {}", r.lease_id, r.reason),
                );
                tracing::info!(
                    lease_id = %r.lease_id,
                    capability_id = %r.capability_id,
                    queued_cancelled = updates.len(),
                    running_stopped = running,
                    "lease revoked"
                );
                self.emit(updates).await;
            }
            Err(e) => tracing::warn!("malformed lease_revoked: {e}"),
        }
    }
}

fn lock_fences(m: &Mutex<Fences>) -> std::sync::MutexGuard<'_, Fences> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// How soon after a sample of the registry's clock another may be taken to
/// judge a command that looks past its `not_after`.
const FENCE_RESAMPLE_GAP: Duration = Duration::from_secs(1);

impl Dispatcher {
    /// Judge `cmd` by its fence (docs/architecture.md "Fencing"): refused
    /// when its lease is known to have ended or to be superseded, or when
    /// its `not_after` may have passed on the registry's clock (a look
    /// that says so with a sample older than [`FENCE_RESAMPLE_GAP`] is made
    /// again after a fresh sample: the registry's clock may have been
    /// stepped). Accepted, it returns `not_after` on this process's
    /// monotonic clock, less the clock's uncertainty, and the lease is
    /// noted (stopping the sessions of leases it supersedes).
    async fn fence(&self, cmd: &ActionCommand) -> Result<Instant, (FenceRefusal, String)> {
        lock_fences(&self.fences).check(
            &cmd.capability_id,
            &cmd.lease_id,
            cmd.lease_generation,
            cmd.lease_mode,
        )?;
        let mut est = self.clock.estimate();
        if est.latest() >= cmd.not_after && self.clock.age().is_none_or(|a| a > FENCE_RESAMPLE_GAP)
        {
            self.clock.refresh(FENCE_RESAMPLE_GAP).await;
            est = self.clock.estimate();
        }
        // The instant the estimate was taken: `left` counts from it.
        let judged_at = Instant::now();
        let left = cmd.not_after - est.latest();
        let Ok(left) = left.to_std() else {
            return Err((
                FenceRefusal::NotAfterPassed,
                format!(
                    "its not_after {} passed {} ms ago on the registry's clock (estimated {}, ±{} ms{})",
                    cmd.not_after.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    (-left).num_milliseconds(),
                    est.now.to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
                    est.uncertainty.as_millis(),
                    if est.synced { "" } else { ", not yet sampled: this bench's own clock" },
                ),
            ));
        };
        // Checked again after the await: a revocation cannot have been
        // handled meanwhile (one dispatcher), but be plain about it.
        let superseded = {
            let mut f = lock_fences(&self.fences);
            f.check(
                &cmd.capability_id,
                &cmd.lease_id,
                cmd.lease_generation,
                cmd.lease_mode,
            )?;
            f.note_lease(
                &cmd.capability_id,
                &cmd.lease_id,
                cmd.lease_generation,
                cmd.lease_mode,
            )
        };
        self.stop_superseded(&cmd.capability_id, &cmd.lease_id, superseded)
            .await;
        // The two clocks may drift apart over `left` too.
        Ok(judged_at + left.saturating_sub(crate::clock::drift(left)))
    }

    /// The registry hears this provider from more than one instance (or no
    /// longer): say so, naming the others.
    fn provider_conflict(&self, c: ProviderConflict) {
        let others: Vec<String> = c
            .instances
            .iter()
            .filter(|i| i.boot_id != self.boot_id)
            .map(|i| {
                format!(
                    "host `{}` node `{}` (boot {}, heard {} ms ago)",
                    i.hostname, i.node_id, i.boot_id, i.last_heard_ms_ago
                )
            })
            .collect();
        if c.resolved {
            let me = c.instances.iter().any(|i| i.boot_id == self.boot_id);
            tracing::warn!(
                provider_id = %c.provider_id,
                this_instance_left = me,
                "the registry hears one instance of this provider again; actions are accepted again"
            );
        } else if others.is_empty() {
            tracing::warn!(provider_id = %c.provider_id, "the registry reports a provider conflict naming only this instance");
        } else {
            tracing::error!(
                provider_id = %c.provider_id,
                boot_id = %self.boot_id,
                others = %others.join("; "),
                "another bench is connected with this provider id and token (a copied configuration?): the registry refuses actions on both until one is stopped; give each bench its own provider_id and token"
            );
        }
    }

    /// Whether `env` waited on its way here longer than [`STALE_TRANSIT`].
    fn long_in_transit(&self, env: &Envelope) -> bool {
        (self.clock.estimate().now - env.sent_at)
            .to_std()
            .is_ok_and(|d| d > STALE_TRANSIT)
    }

    /// Note the revocations and grants among `ahead` (commands that arrived
    /// behind the one about to be judged) in the fences first.
    async fn note_ahead(&self, ahead: &VecDeque<Envelope>) {
        let mut noted = 0;
        for env in ahead {
            match env.message_type {
                MessageType::LeaseRevoked => {
                    if let Ok(r) = env.body_as::<LeaseRevoked>(MessageType::LeaseRevoked) {
                        lock_fences(&self.fences).note_ended(
                            &r.capability_id,
                            &r.lease_id,
                            r.lease_generation,
                        );
                        noted += 1;
                    }
                }
                MessageType::LeaseGranted => {
                    if let Ok(g) = env.body_as::<LeaseGranted>(MessageType::LeaseGranted) {
                        let superseded = lock_fences(&self.fences).note_lease(
                            &g.capability_id,
                            &g.lease_id,
                            g.lease_generation,
                            g.lease_mode,
                        );
                        self.stop_superseded(&g.capability_id, &g.lease_id, superseded)
                            .await;
                        noted += 1;
                    }
                }
                _ => {}
            }
        }
        if !ahead.is_empty() {
            tracing::info!(
                backlog = ahead.len(),
                lease_changes = noted,
                "commands arrived late; lease changes behind them noted before judging them"
            );
        }
    }

    /// Cancel the sessions of `superseded` leases on `capability_id`, which
    /// lease `by` took over.
    async fn stop_superseded(&self, capability_id: &str, by: &str, superseded: Vec<String>) {
        for old in superseded {
            let (updates, running) = self.runners.revoke_lease(
                &old,
                capability_id,
                &format!("lease {old} superseded by lease {by}"),
            );
            if !updates.is_empty() || running > 0 {
                tracing::warn!(
                    lease_id = %old,
                    %capability_id,
                    by,
                    queued_cancelled = updates.len(),
                    running_stopped = running,
                    "a newer lease took over; the older lease's sessions are stopped"
                );
            }
            self.emit(updates).await;
        }
    }

    /// Note an `action_invoke` for `session_id` (see [`Received`]); returns
    /// what was noted before.
    fn note_received(&self, session_id: &str) -> Option<bool> {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(session_id, false)
    }

    /// Answer a `session_sync`: the registry holds `sessions` open. One
    /// still running here needs nothing; one whose final update is still
    /// queued neither (unless it is already on its way: the outbox queues
    /// it again after its acknowledgement); one whose final update the
    /// broker acknowledged has it sent again. The rest are looked at again
    /// after [`SYNC_RECHECK`] (a session ending right now leaves the
    /// runner's board a moment before its update is queued, and an
    /// `action_invoke` may follow the sync). Then an open one this daemon
    /// never received is reported `failed`, once; one it received and has
    /// no final update for (pruned from the outbox), or one the registry
    /// has ended already, is left alone.
    async fn sync_sessions(&self, sessions: Vec<OpenSession>) {
        let asked = sessions.len();
        let (unsettled, mut answered) = self.sync_pass(sessions, SyncCounts::default()).await;
        if unsettled.is_empty() {
            answered.log(asked);
            return;
        }
        let this = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(SYNC_RECHECK).await;
            let (unsettled, counts) = this.sync_pass(unsettled, answered).await;
            answered = counts;
            let mut updates = Vec::new();
            for s in unsettled {
                if s.ended_by_registry {
                    // Ended at the registry already, and perhaps sent to
                    // an earlier run of this daemon: nothing to tell.
                    tracing::debug!(session_id = %s.session_id, "session_sync: no final update kept for a session the registry ended");
                    answered.left_alone += 1;
                    continue;
                }
                let before = this
                    .received
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .note(&s.session_id, true);
                match before {
                    None => {
                        tracing::warn!(session_id = %s.session_id, capability_id = %s.capability_id, "the registry holds a session this bench never received; reporting it failed");
                        answered.never_received += 1;
                        updates.push(session_update(
                            &s.session_id,
                            &s.capability_id,
                            SessionStatus::Failed,
                            Some(NEVER_RECEIVED.to_string()),
                        ));
                    }
                    Some(true) => answered.left_alone += 1,
                    Some(false) => {
                        answered.left_alone += 1;
                        tracing::warn!(
                            session_id = %s.session_id,
                            "session_sync: a session this bench ran has no final update left to send again (pruned from the outbox, or not yet written); nothing sent"
                        )
                    }
                }
            }
            answered.log(asked);
            this.emit(updates).await;
        });
    }

    /// One look at `sessions` (see [`Self::sync_sessions`]), adding to
    /// `counts`; returns those neither open here nor with a final update in
    /// the outbox, and the counts.
    async fn sync_pass(
        &self,
        sessions: Vec<OpenSession>,
        mut counts: SyncCounts,
    ) -> (Vec<OpenSession>, SyncCounts) {
        let runners = self.runners.clone();
        let sink = self.sink.clone();
        let looked = tokio::task::spawn_blocking(move || {
            let mut unsettled = Vec::new();
            for s in sessions {
                if runners.is_open(&s.session_id) {
                    counts.running += 1;
                    continue;
                }
                match sink.resend_for_sync(&s.session_id) {
                    Ok(SyncAnswer::Requeued) => counts.requeued += 1,
                    Ok(SyncAnswer::StillQueued) => counts.queued += 1,
                    Ok(SyncAnswer::NoRecord) => unsettled.push(s),
                    Err(e) => {
                        tracing::error!(session_id = %s.session_id, error = %e, "session_sync: outbox unreadable");
                    }
                }
            }
            (unsettled, counts)
        })
        .await;
        looked.unwrap_or_default()
    }
}

/// How one `session_sync` was answered, logged once when it is settled.
#[derive(Debug, Default, Clone, Copy)]
struct SyncCounts {
    /// Still running on this bench.
    running: usize,
    /// Final update still in the outbox.
    queued: usize,
    /// Final update sent again.
    requeued: usize,
    /// Reported `failed`: never received by this daemon.
    never_received: usize,
    /// No record and nothing to tell (ended at the registry already, or
    /// its final update was pruned).
    left_alone: usize,
}

impl SyncCounts {
    fn log(&self, asked: usize) {
        tracing::info!(
            asked,
            running = self.running,
            queued = self.queued,
            requeued = self.requeued,
            never_received = self.never_received,
            left_alone = self.left_alone,
            "answered the registry's session_sync"
        );
    }
}

/// How long a session the registry asks about and this bench has no record
/// of is given before it is reported failed ([`Dispatcher::sync_sessions`]).
const SYNC_RECHECK: Duration = Duration::from_secs(2);

/// The error of a session whose `action_invoke` never reached the bench.
pub const NEVER_RECEIVED: &str = "the bench has no record of this session: its action_invoke never reached it (lost while the bench was disconnected from the broker)";

async fn supervise_deadlines(
    runners: Arc<Runners>,
    sink: UpdateSink,
    mut stop: watch::Receiver<bool>,
) {
    // Fine enough for deadlines and for `running` reports ~100 ms in.
    let mut tick = tokio::time::interval(Duration::from_millis(50));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stopping = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            r = stop.changed(), if !stopping => {
                // Keep enforcing deadlines while runners wind down; end
                // once the sender is gone.
                stopping = true;
                if r.is_err() { return; }
            }
        }
        let updates = runners.check_deadlines();
        if !updates.is_empty() {
            let sink = sink.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for u in &updates {
                    sink.emit_logged(u);
                }
            })
            .await;
        }
        if stopping && runners.running_sessions().is_empty() {
            return;
        }
    }
}
