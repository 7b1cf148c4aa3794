//! The registry's MQTT client (rumqttc): ingest of the providers' `status`,
//! `register`, `heartbeat` and `results` topics, and forwarding of preempt
//! notices and lease revocations to the providers' `commands` topics
//! (docs/architecture.md "Control plane").
//!
//! Four tasks, so the event loop is never blocked by our own publishing:
//! - the *event loop* task polls rumqttc and hands incoming publishes to
//!   the ingest channel; it never awaits a publish;
//! - the *ingest* task processes messages one at a time, in arrival order
//!   (a provider's `register` before its `heartbeat`), and queues replies on
//!   the unbounded outbound channel, so it never waits on the event loop;
//! - the *publisher* task owns the `AsyncClient` and sends what is queued;
//! - the *forwarder* follows the event log and queues `preempt_requested`
//!   and `lease_revoked` commands for the capability's provider.
//!
//! # Trust
//! A message on `{prefix}/providers/{p}/{kind}` is accepted only when it
//! parses as an [`Envelope`] of the type that topic carries and its body
//! names provider `{p}` (`results`: its capability belongs to `{p}`). QoS 1
//! delivers at least once: a repeated `(provider, message_id)` is dropped,
//! except a live (not retained) `status` (a last will repeats its envelope
//! each time the broker publishes it).
//!
//! # Persistent session
//! With [`MqttSettings::persistent_session`] (an external broker) the client
//! connects with `clean_session = false` and QoS 1 subscriptions, so the
//! broker keeps the subscriptions and queues QoS 1 messages (session
//! updates, status, registrations) while the registry is away, and hands
//! them over when it reconnects. The client id must therefore be stable
//! across restarts and unique: two registries sharing one would take the
//! session from each other.
//!
//! # Offline status
//! An `offline` status (a provider's last will, or its own graceful
//! `offline`) is acted on only after [`OFFLINE_CONFIRM_DELAY`], and only
//! if meanwhile the registry's own link stayed up and the provider was not
//! heard from (an `online` status, a registration or a heartbeat). A broker
//! that shuts down gracefully publishes the wills of the clients it closes
//! just before it closes the registry's connection: those wills are
//! dropped, as the outage is the broker's, not the providers'.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use rumqttc::{AsyncClient, Event, EventLoop, MqttOptions, Packet, Publish, QoS};
use serde::Serialize;
use serde_json::Value;
use shared_protocol::capability::CapabilityBatchRegisterRequest;
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::lease::{CapabilityLease, PreemptNotice};
use shared_protocol::mqtt::{
    parse_topic, topic, topic_filter_all, Envelope, LeaseRevoked, MessageType, RegisterAck,
    RegisterBody, SessionUpdate, StatusBody, TopicKind,
};
use shared_protocol::provider::{HeartbeatRequest, OnlineStatus};
use shared_protocol::Validate;
use tokio::sync::{mpsc, watch, Mutex};
use tokio::task::JoinHandle;

use crate::events::EventBus;
use crate::follow::{EventFollower, Followed};
use crate::hearing::Hearing;
use crate::registry::CapabilityRegistry;
use crate::store::StoreError;

/// Where and how the registry's client connects.
#[derive(Debug, Clone)]
pub struct MqttSettings {
    pub host: String,
    pub port: u16,
    pub client_id: String,
    pub username: Option<String>,
    pub password: Option<String>,
    pub topic_prefix: String,
    pub keep_alive: Duration,
    /// Largest message in either direction, bytes.
    pub max_packet_bytes: usize,
    /// Connect with `clean_session = false`, so the broker queues QoS 1
    /// messages for the registry while it is disconnected (external
    /// broker). `client_id` must then be stable and used by this registry
    /// alone.
    pub persistent_session: bool,
}

/// How long an `offline` status waits before it is acted on: it is
/// dropped if the registry's link goes down (or reconnects) or the
/// provider is heard from within this delay.
pub const OFFLINE_CONFIRM_DELAY: Duration = Duration::from_secs(2);

/// Counters for `/metrics`.
#[derive(Debug, Default)]
pub struct MqttStats {
    pub status_in: AtomicU64,
    pub register_in: AtomicU64,
    pub heartbeat_in: AtomicU64,
    pub results_in: AtomicU64,
    /// Messages on topics that are not ours or on `commands`.
    pub other_in: AtomicU64,
    /// Refused: bad topic, bad envelope, wrong type, provider mismatch.
    pub rejected: AtomicU64,
    /// Dropped as a repeated message id.
    pub duplicates: AtomicU64,
    /// Commands published to providers.
    pub commands_out: AtomicU64,
    /// (Re)connections to the broker.
    pub connects: AtomicU64,
}

impl MqttStats {
    /// (topic kind, messages received) pairs.
    pub fn messages_in(&self) -> [(&'static str, u64); 5] {
        [
            ("status", self.status_in.load(Ordering::Relaxed)),
            ("register", self.register_in.load(Ordering::Relaxed)),
            ("heartbeat", self.heartbeat_in.load(Ordering::Relaxed)),
            ("results", self.results_in.load(Ordering::Relaxed)),
            ("other", self.other_in.load(Ordering::Relaxed)),
        ]
    }
}

enum Outbound {
    Publish { topic: String, payload: Vec<u8> },
    Subscribe,
}

/// The running client. [`MqttLink::stop`] disconnects cleanly.
pub struct MqttLink {
    outbound: mpsc::UnboundedSender<Outbound>,
    connected: Arc<AtomicBool>,
    hearing: Hearing,
    stats: Arc<MqttStats>,
    stop_tx: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    prefix: String,
}

/// Queues commands for providers on the registry's MQTT link. Cheap to
/// clone; publishing never waits on the broker.
#[derive(Clone)]
pub struct CommandSender {
    outbound: mpsc::UnboundedSender<Outbound>,
    connected: Arc<AtomicBool>,
    stats: Arc<MqttStats>,
    prefix: String,
}

impl CommandSender {
    /// True while the registry holds a broker connection.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// Queue `body` as a `message_type` envelope on `provider_id`'s
    /// `commands` topic (QoS 1). Returns the envelope's `message_id`, or
    /// `None` when the link has stopped (nothing was queued).
    pub fn send<T: Serialize>(
        &self,
        provider_id: &str,
        message_type: MessageType,
        body: &T,
    ) -> Option<String> {
        let env = Envelope::new(
            message_type,
            uuid::Uuid::new_v4().to_string(),
            Utc::now(),
            body,
        )
        .ok()?;
        let message_id = env.message_id.clone();
        self.outbound
            .send(Outbound::Publish {
                topic: topic(&self.prefix, provider_id, TopicKind::Commands),
                payload: env.to_bytes(),
            })
            .ok()?;
        self.stats.commands_out.fetch_add(1, Ordering::Relaxed);
        Some(message_id)
    }
}

/// Ids of messages already processed, per provider, bounded.
struct Dedup {
    seen: HashSet<(String, String)>,
    order: VecDeque<(String, String)>,
    capacity: usize,
}

impl Dedup {
    fn new(capacity: usize) -> Self {
        Self {
            seen: HashSet::new(),
            order: VecDeque::new(),
            capacity,
        }
    }

    /// True the first time `(provider, id)` is seen.
    fn first_time(&mut self, provider: &str, id: &str) -> bool {
        let key = (provider.to_string(), id.to_string());
        if !self.seen.insert(key.clone()) {
            return false;
        }
        self.order.push_back(key);
        if self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        true
    }
}

fn envelope_bytes<T: Serialize>(message_type: MessageType, body: &T) -> Option<Vec<u8>> {
    Envelope::new(
        message_type,
        uuid::Uuid::new_v4().to_string(),
        Utc::now(),
        body,
    )
    .ok()
    .map(|e| e.to_bytes())
}

impl MqttLink {
    /// Connect to the broker and start the four tasks. Returns at once; the
    /// connection is made (and remade after a loss) in the background.
    /// Lease events with `event_id > forward_after` are forwarded as
    /// commands (pass the log's current end).
    pub fn start(
        settings: MqttSettings,
        registry: Arc<CapabilityRegistry>,
        bus: EventBus,
        forward_after: u64,
    ) -> Self {
        let mut opts = MqttOptions::new(&settings.client_id, &settings.host, settings.port);
        opts.set_keep_alive(settings.keep_alive)
            .set_clean_session(!settings.persistent_session)
            .set_max_packet_size(settings.max_packet_bytes, settings.max_packet_bytes);
        if let Some(user) = &settings.username {
            opts.set_credentials(user, settings.password.clone().unwrap_or_default());
        }
        let (client, mut eventloop) = AsyncClient::new(opts, 256);
        // Commands and results are small messages answered at once: with
        // Nagle's algorithm on, each can wait for a delayed ACK (~40 ms).
        let mut net = rumqttc::NetworkOptions::new();
        net.set_tcp_nodelay(true);
        eventloop.set_network_options(net);
        let (stop_tx, stop_rx) = watch::channel(false);
        let (out_tx, out_rx) = mpsc::unbounded_channel();
        let (in_tx, in_rx) = mpsc::channel::<Publish>(4096);
        let connected = Arc::new(AtomicBool::new(false));
        let hearing = Hearing::new();
        let stats = Arc::new(MqttStats::default());
        let prefix = settings.topic_prefix.clone();

        let tasks = vec![
            tokio::spawn(run_event_loop(
                eventloop,
                client.clone(),
                in_tx,
                out_tx.clone(),
                LinkFlags {
                    connected: connected.clone(),
                    hearing: hearing.clone(),
                },
                stats.clone(),
                stop_rx.clone(),
            )),
            tokio::spawn(run_publisher(
                client,
                out_rx,
                prefix.clone(),
                stop_rx.clone(),
            )),
            tokio::spawn(run_ingest(
                in_rx,
                out_tx.clone(),
                OfflineConfirm {
                    registry: registry.clone(),
                    heard: Arc::new(Mutex::new(HashMap::new())),
                    link_up_since: hearing.subscribe(),
                },
                stats.clone(),
                prefix.clone(),
            )),
            tokio::spawn(run_forwarder(
                bus,
                registry,
                out_tx.clone(),
                stats.clone(),
                prefix.clone(),
                forward_after,
                stop_rx.clone(),
            )),
            tokio::spawn(hearing.clone().run_ticker(stop_rx)),
        ];
        Self {
            outbound: out_tx,
            connected,
            hearing,
            stats,
            stop_tx,
            tasks,
            prefix,
        }
    }

    /// True while the client holds a broker connection.
    pub fn connected(&self) -> bool {
        self.connected.load(Ordering::Relaxed)
    }

    /// The shared connected flag (for `/healthz`).
    pub fn connected_flag(&self) -> Arc<AtomicBool> {
        self.connected.clone()
    }

    /// Since when the registry has been able to hear providers (see
    /// [`Hearing`]): `None` while the client has no broker connection, else
    /// the monotonic instant of its latest (re)connection or of the end of
    /// the registry's latest stall, whichever is later (for the liveness
    /// monitor, [`CapabilityRegistry::run_liveness_monitor`], and the
    /// sessions' deadline watchdog).
    pub fn hearing(&self) -> Hearing {
        self.hearing.clone()
    }

    /// The counters.
    pub fn stats(&self) -> Arc<MqttStats> {
        self.stats.clone()
    }

    /// Wait up to `timeout` for the first broker connection.
    pub async fn wait_connected(&self, timeout: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + timeout;
        while !self.connected() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// A cloneable handle that queues commands on this link (for modules
    /// that send their own commands, e.g. `action_invoke`).
    pub fn command_sender(&self) -> CommandSender {
        CommandSender {
            outbound: self.outbound.clone(),
            connected: self.connected.clone(),
            stats: self.stats.clone(),
            prefix: self.prefix.clone(),
        }
    }

    /// Queue a command for `provider_id` on its `commands` topic (QoS 1).
    pub fn send_command<T: Serialize>(
        &self,
        provider_id: &str,
        message_type: MessageType,
        body: &T,
    ) {
        if let Some(payload) = envelope_bytes(message_type, body) {
            let _ = self.outbound.send(Outbound::Publish {
                topic: topic(&self.prefix, provider_id, TopicKind::Commands),
                payload,
            });
        }
    }

    /// Disconnect from the broker (MQTT DISCONNECT) and end the tasks.
    pub async fn stop(self) {
        let _ = self.stop_tx.send(true);
        drop(self.outbound);
        for t in self.tasks {
            if tokio::time::timeout(Duration::from_secs(3), t)
                .await
                .is_err()
            {
                tracing::warn!("an MQTT task did not stop within 3 s");
            }
        }
    }
}

/// The event loop's report of the connection: the flag `/healthz` and
/// the command senders read, and the instant of the latest connection.
struct LinkFlags {
    connected: Arc<AtomicBool>,
    hearing: Hearing,
}

impl LinkFlags {
    fn up(&self) {
        self.hearing.link_up();
        self.connected.store(true, Ordering::Relaxed);
    }

    /// Marks the link down; true when it was up.
    fn down(&self) -> bool {
        self.hearing.link_down();
        self.connected.swap(false, Ordering::Relaxed)
    }
}

/// The size in bytes of a packet the broker sent over the client's
/// `max_packet_bytes`, when that is why the connection failed.
fn oversized_packet(e: &rumqttc::ConnectionError) -> Option<usize> {
    match e {
        rumqttc::ConnectionError::MqttState(rumqttc::StateError::Deserialization(
            rumqttc::mqttbytes::Error::PayloadSizeLimitExceeded(bytes),
        )) => Some(*bytes),
        _ => None,
    }
}

async fn run_event_loop(
    mut eventloop: EventLoop,
    client: AsyncClient,
    ingest: mpsc::Sender<Publish>,
    outbound: mpsc::UnboundedSender<Outbound>,
    link: LinkFlags,
    stats: Arc<MqttStats>,
    mut stop: watch::Receiver<bool>,
) {
    let mut backoff = Duration::from_millis(200);
    loop {
        let polled = tokio::select! {
            ev = eventloop.poll() => ev,
            _ = stop.changed() => break,
        };
        match polled {
            Ok(Event::Incoming(Packet::ConnAck(_))) => {
                link.up();
                stats.connects.fetch_add(1, Ordering::Relaxed);
                backoff = Duration::from_millis(200);
                tracing::info!("connected to the MQTT broker");
                // Subscribe after every connect: a clean session has lost
                // its subscriptions, and repeating them on a persistent one
                // is harmless (and covers a broker that lost its state).
                let _ = outbound.send(Outbound::Subscribe);
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if ingest.send(p).await.is_err() {
                    break;
                }
            }
            Ok(_) => {}
            Err(e) => {
                let was_up = link.down();
                if let Some(bytes) = oversized_packet(&e) {
                    // The broker relayed a message larger than our limit:
                    // rumqttc drops the connection. Who published it is
                    // not known here (the broker logs its own clients'
                    // oversized packets).
                    tracing::warn!(
                        packet_bytes = bytes,
                        limit_bytes = eventloop.mqtt_options.max_packet_size(),
                        "MQTT packet from the broker over the size limit; the registry's \
                         client dropped the connection and reconnects"
                    );
                } else if was_up {
                    tracing::warn!(error = %e, "MQTT connection lost; reconnecting");
                } else {
                    tracing::debug!(error = %e, "MQTT connect failed; retrying");
                }
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stop.changed() => break,
                }
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
    // Send DISCONNECT and let the loop flush it (bounded).
    if link.connected.load(Ordering::Relaxed) && client.try_disconnect().is_ok() {
        let flush = async {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) | Err(_) => break,
                    Ok(_) => {}
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(1), flush).await;
    }
    link.down();
}

async fn run_publisher(
    client: AsyncClient,
    mut outbound: mpsc::UnboundedReceiver<Outbound>,
    prefix: String,
    mut stop: watch::Receiver<bool>,
) {
    loop {
        let msg = tokio::select! {
            m = outbound.recv() => m,
            _ = stop.changed() => None,
        };
        let Some(msg) = msg else { break };
        let result = match msg {
            Outbound::Publish { topic, payload } => {
                client
                    .publish(topic, QoS::AtLeastOnce, false, payload)
                    .await
            }
            Outbound::Subscribe => {
                let filters = [
                    TopicKind::Status,
                    TopicKind::Register,
                    TopicKind::Heartbeat,
                    TopicKind::Results,
                ]
                .map(|k| {
                    rumqttc::SubscribeFilter::new(topic_filter_all(&prefix, k), QoS::AtLeastOnce)
                });
                client.subscribe_many(filters).await
            }
        };
        if let Err(e) = result {
            tracing::warn!(error = %e, "MQTT request not queued");
        }
    }
}

/// Why an incoming message was refused (logged, counted).
#[derive(Debug, thiserror::Error)]
enum Refused {
    #[error("{0}")]
    Topic(#[from] shared_protocol::mqtt::TopicError),
    #[error("{0}")]
    Envelope(#[from] shared_protocol::mqtt::EnvelopeError),
    #[error("body names provider `{body}` but the topic is provider `{topic}`'s")]
    ProviderMismatch { topic: String, body: String },
    #[error("capability `{capability_id}` does not belong to provider `{provider_id}`")]
    ForeignCapability {
        provider_id: String,
        capability_id: String,
    },
}

fn same_provider(topic_p: &str, body_p: &str) -> Result<(), Refused> {
    if topic_p == body_p {
        Ok(())
    } else {
        Err(Refused::ProviderMismatch {
            topic: topic_p.to_string(),
            body: body_p.to_string(),
        })
    }
}

/// Per provider, how many messages have shown it connected (an `online`
/// status, a registration, a heartbeat). Locked by the ingest task while
/// it processes a message and by a pending offline confirmation while it
/// decides, so the two never interleave.
type Heard = HashMap<String, u64>;

/// What a pending `offline` status needs to be confirmed or dropped.
#[derive(Clone)]
struct OfflineConfirm {
    registry: Arc<CapabilityRegistry>,
    heard: Arc<Mutex<Heard>>,
    link_up_since: watch::Receiver<Option<Instant>>,
}

/// Whether an `offline` status received when the provider's heard count
/// was `heard_then` and the link's `up_since` was `link_then` still holds
/// after the delay, with `heard_now` and `link_now`: the link was up then
/// and is the same connection now, and the provider was not heard since.
fn offline_confirmed(
    heard_then: u64,
    heard_now: u64,
    link_then: Option<Instant>,
    link_now: Option<Instant>,
) -> bool {
    link_then.is_some() && link_now == link_then && heard_now == heard_then
}

impl OfflineConfirm {
    /// Act on `body` (an `offline` status of `provider_id`) after
    /// [`OFFLINE_CONFIRM_DELAY`] unless it is contradicted meanwhile.
    fn schedule(&self, heard: &Heard, provider_id: &str, body: StatusBody) {
        let heard_then = heard.get(provider_id).copied().unwrap_or(0);
        let mut link = self.link_up_since.clone();
        let link_then = *link.borrow_and_update();
        let this = self.clone();
        let provider_id = provider_id.to_string();
        tracing::info!(
            provider_id,
            delay_ms = OFFLINE_CONFIRM_DELAY.as_millis() as u64,
            "offline status received; acting on it if the link stays up and the provider stays silent"
        );
        tokio::spawn(async move {
            let delay = tokio::time::sleep(OFFLINE_CONFIRM_DELAY);
            tokio::pin!(delay);
            loop {
                tokio::select! {
                    _ = &mut delay => break,
                    changed = link.changed() => {
                        if changed.is_err() {
                            return;
                        }
                        if link.borrow_and_update().is_none() {
                            break;
                        }
                    }
                }
            }
            let heard = this.heard.lock().await;
            let heard_now = heard.get(&provider_id).copied().unwrap_or(0);
            let link_now = *this.link_up_since.borrow();
            if !offline_confirmed(heard_then, heard_now, link_then, link_now) {
                tracing::info!(
                    provider_id,
                    link_lost = link_now != link_then,
                    heard_again = heard_now != heard_then,
                    "offline status dropped: the registry's link went down or the provider was heard from"
                );
                return;
            }
            store_status(&this.registry, &provider_id, body).await;
            drop(heard);
        });
    }
}

async fn run_ingest(
    mut incoming: mpsc::Receiver<Publish>,
    outbound: mpsc::UnboundedSender<Outbound>,
    confirm: OfflineConfirm,
    stats: Arc<MqttStats>,
    prefix: String,
) {
    let mut dedup = Dedup::new(16_384);
    while let Some(p) = incoming.recv().await {
        let mut heard = confirm.heard.lock().await;
        let done = ingest_one(
            &p, &mut dedup, &mut heard, &outbound, &confirm, &stats, &prefix,
        )
        .await;
        drop(heard);
        if let Err(e) = done {
            stats.rejected.fetch_add(1, Ordering::Relaxed);
            tracing::warn!(topic = %p.topic, error = %e, "MQTT message refused");
        }
    }
}

async fn ingest_one(
    p: &Publish,
    dedup: &mut Dedup,
    heard: &mut Heard,
    outbound: &mpsc::UnboundedSender<Outbound>,
    confirm: &OfflineConfirm,
    stats: &MqttStats,
    prefix: &str,
) -> Result<(), Refused> {
    let registry = &*confirm.registry;
    let (provider_id, kind) = match parse_topic(prefix, &p.topic) {
        Ok(t) => t,
        Err(e) => {
            stats.other_in.fetch_add(1, Ordering::Relaxed);
            return Err(e.into());
        }
    };
    let counter = match kind {
        TopicKind::Status => &stats.status_in,
        TopicKind::Register => &stats.register_in,
        TopicKind::Heartbeat => &stats.heartbeat_in,
        TopicKind::Results => &stats.results_in,
        TopicKind::Commands => &stats.other_in,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if kind == TopicKind::Commands {
        return Ok(());
    }
    if p.payload.is_empty() {
        // A cleared retained status.
        return Ok(());
    }
    let env = Envelope::parse(&p.payload)?;
    // A last will is fixed at connect, so a provider that returned and
    // vanished again has the broker publish the same envelope (same
    // message id) once more: a live status always counts. A retained one
    // (replayed at each subscription, e.g. after the registry reconnects)
    // is dropped when already seen: an old will replayed must not take a
    // provider offline again.
    let live_status = kind == TopicKind::Status && !p.retain;
    if !live_status && !dedup.first_time(provider_id, &env.message_id) {
        stats.duplicates.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(provider_id, message_id = %env.message_id, "duplicate MQTT message dropped");
        if kind == TopicKind::Status {
            // Replayed as the registry subscribed again: results the
            // provider sent while the registry was away may be lost (a
            // broker that lost or overflowed its queue), so ask anyway.
            let body: StatusBody = env.body_as(MessageType::Status)?;
            if body.online_status == OnlineStatus::Online && body.provider_id == provider_id {
                registry.provider_announced_online(provider_id).await;
            }
        }
        return Ok(());
    }
    match kind {
        TopicKind::Status => {
            let body: StatusBody = env.body_as(MessageType::Status)?;
            same_provider(provider_id, &body.provider_id)?;
            if body.online_status != OnlineStatus::Online {
                confirm.schedule(heard, provider_id, body);
                return Ok(());
            }
            *heard.entry(provider_id.to_string()).or_default() += 1;
            store_status(registry, provider_id, body).await;
        }
        TopicKind::Register => {
            let body: RegisterBody = env.body_as(MessageType::Register)?;
            same_provider(provider_id, &body.provider.provider_id)?;
            *heard.entry(provider_id.to_string()).or_default() += 1;
            let ack = register(registry, provider_id, body).await;
            if let Some(payload) = envelope_bytes(MessageType::RegisterAck, &ack) {
                let _ = outbound.send(Outbound::Publish {
                    topic: topic(prefix, provider_id, TopicKind::Commands),
                    payload,
                });
            }
        }
        TopicKind::Heartbeat => {
            let body: HeartbeatRequest = env.body_as(MessageType::Heartbeat)?;
            same_provider(provider_id, &body.provider_id)?;
            *heard.entry(provider_id.to_string()).or_default() += 1;
            match registry.heartbeat(provider_id, body).await {
                Ok(_) => {}
                Err(StoreError::NotFound { .. }) => {
                    tracing::warn!(provider_id, "heartbeat before registration; ignored");
                }
                Err(e) => tracing::error!(provider_id, error = %e, "heartbeat not stored"),
            }
        }
        TopicKind::Results => {
            let body: SessionUpdate = env.body_as(MessageType::SessionUpdate)?;
            let owner = registry
                .store()
                .get_capability(&body.capability_id)
                .await
                .ok()
                .flatten()
                .map(|c| c.provider_id);
            if owner.as_deref() != Some(provider_id) {
                return Err(Refused::ForeignCapability {
                    provider_id: provider_id.to_string(),
                    capability_id: body.capability_id,
                });
            }
            registry.session_update(provider_id, body).await;
        }
        TopicKind::Commands => {}
    }
    Ok(())
}

/// Register a provider and its capabilities from one MQTT message; the
/// answer goes back as `register_ack`.
async fn register(
    registry: &CapabilityRegistry,
    provider_id: &str,
    body: RegisterBody,
) -> RegisterAck {
    let interval = registry.settings().heartbeat_interval_seconds;
    let refuse = |error: String| RegisterAck {
        provider_id: provider_id.to_string(),
        accepted: false,
        heartbeat_interval_seconds: interval,
        registered: vec![],
        error: Some(error),
    };
    let batch = CapabilityBatchRegisterRequest {
        provider_id: provider_id.to_string(),
        capabilities: body.capabilities,
    };
    // Check the whole batch before storing anything.
    if let Err(e) = batch.validate() {
        return refuse(e.to_string());
    }
    if let Err(e) = registry.register_provider(provider_id, body.provider).await {
        return refuse(e.to_string());
    }
    match registry.register_capabilities(provider_id, batch).await {
        Ok(done) => RegisterAck {
            provider_id: provider_id.to_string(),
            accepted: true,
            heartbeat_interval_seconds: interval,
            registered: done.registered,
            error: None,
        },
        Err(e) => refuse(e.to_string()),
    }
}

/// The lease a lease event is about: its `data` is the lease, or holds it
/// under `lease`.
fn lease_of(ev: &CapabilityEvent) -> Option<CapabilityLease> {
    serde_json::from_value::<CapabilityLease>(ev.data.clone())
        .ok()
        .or_else(|| {
            ev.data
                .get("lease")
                .and_then(|l| serde_json::from_value(l.clone()).ok())
        })
}

fn data_str(ev: &CapabilityEvent, key: &str) -> Option<String> {
    ev.data.get(key).and_then(Value::as_str).map(str::to_string)
}

/// The command (type and body) to send for a lease event, if any.
fn command_for(ev: &CapabilityEvent) -> Option<(MessageType, Value)> {
    // Most events tell the provider nothing: decide before parsing.
    if !matches!(
        ev.event_type,
        EventType::LeasePreemptRequested | EventType::LeasePreempted | EventType::LeaseExpired
    ) {
        return None;
    }
    let lease = lease_of(ev);
    let capability_id = ev
        .capability_id
        .clone()
        .or_else(|| lease.as_ref().map(|l| l.capability_id.clone()))?;
    let lease_id = ev
        .lease_id
        .clone()
        .or_else(|| lease.as_ref().map(|l| l.lease_id.clone()))?;
    match ev.event_type {
        EventType::LeasePreemptRequested => {
            // The engine puts the notice in the event; older shapes carry
            // the lease alone.
            if let Some(notice) = ev
                .data
                .get("notice")
                .and_then(|n| serde_json::from_value::<PreemptNotice>(n.clone()).ok())
            {
                return Some((
                    MessageType::PreemptRequested,
                    serde_json::to_value(notice).ok()?,
                ));
            }
            let grace_until = lease.as_ref().and_then(|l| l.grace_until).or_else(|| {
                ev.data
                    .get("grace_until")
                    .and_then(|v| serde_json::from_value(v.clone()).ok())
            })?;
            let notice = PreemptNotice {
                lease_id,
                capability_id,
                preempting_lease_id: data_str(ev, "preempting_lease_id")
                    .or_else(|| lease.as_ref().and_then(|l| l.preempted_by.clone()))
                    .unwrap_or_default(),
                preempt_reason: data_str(ev, "preempt_reason")
                    .or_else(|| lease.as_ref().and_then(|l| l.preempt_reason.clone()))
                    .unwrap_or_default(),
                grace_until,
            };
            Some((
                MessageType::PreemptRequested,
                serde_json::to_value(notice).ok()?,
            ))
        }
        EventType::LeasePreempted | EventType::LeaseExpired => {
            let reason =
                data_str(ev, "reason").unwrap_or_else(|| ev.event_type.as_str().to_string());
            let body = LeaseRevoked {
                lease_id,
                capability_id,
                reason,
            };
            Some((MessageType::LeaseRevoked, serde_json::to_value(body).ok()?))
        }
        _ => None,
    }
}

/// Follow the event log from its current end and forward lease events to
/// the providers that hold the capabilities.
async fn run_forwarder(
    bus: EventBus,
    registry: Arc<CapabilityRegistry>,
    outbound: mpsc::UnboundedSender<Outbound>,
    stats: Arc<MqttStats>,
    prefix: String,
    start: u64,
    mut stop: watch::Receiver<bool>,
) {
    let mut follower = EventFollower::new(bus, start);
    loop {
        let next = tokio::select! {
            n = follower.next() => n,
            _ = stop.changed() => break,
        };
        let ev = match next {
            Ok(Followed::Event(ev)) => ev,
            Ok(Followed::Gap { .. }) => continue,
            Ok(Followed::Closed) => break,
            Err(e) => {
                tracing::error!(error = %e, "event log unreadable; command forwarding paused");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let Some((message_type, body)) = command_for(&ev) else {
            continue;
        };
        let provider_id = match &ev.provider_id {
            Some(p) => Some(p.clone()),
            None => match &ev.capability_id {
                Some(c) => registry
                    .store()
                    .get_capability(c)
                    .await
                    .ok()
                    .flatten()
                    .map(|c| c.provider_id),
                None => None,
            },
        };
        let Some(provider_id) = provider_id else {
            continue;
        };
        if let Some(payload) = envelope_bytes(message_type, &body) {
            stats.commands_out.fetch_add(1, Ordering::Relaxed);
            tracing::info!(provider_id, event_id = ev.event_id, command = %message_type, "forwarding lease command to provider");
            let _ = outbound.send(Outbound::Publish {
                topic: topic(&prefix, &provider_id, TopicKind::Commands),
                payload,
            });
        }
    }
}

/// Store a provider's status message; a provider that never registered
/// is ignored, a store failure logged.
async fn store_status(registry: &CapabilityRegistry, provider_id: &str, body: StatusBody) {
    match registry.provider_status(provider_id, body).await {
        Ok(()) => {}
        Err(StoreError::NotFound { .. }) => {
            tracing::debug!(
                provider_id,
                "status of a provider that never registered; ignored"
            );
        }
        Err(e) => tracing::error!(provider_id, error = %e, "status not stored"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_offline_status_holds_only_if_the_link_stayed_up_and_the_provider_stayed_silent() {
        let up = Instant::now();
        let reconnected = up + Duration::from_secs(1);
        // Same connection, provider silent: acted on.
        assert!(offline_confirmed(3, 3, Some(up), Some(up)));
        // The provider was heard from meanwhile (came back).
        assert!(!offline_confirmed(3, 4, Some(up), Some(up)));
        // The link went down (the broker is going away) ...
        assert!(!offline_confirmed(3, 3, Some(up), None));
        // ... or went down and came back within the delay.
        assert!(!offline_confirmed(3, 3, Some(up), Some(reconnected)));
        // Received while the link was already down.
        assert!(!offline_confirmed(3, 3, None, None));
    }
}
