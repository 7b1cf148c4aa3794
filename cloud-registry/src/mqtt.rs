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
//!   while the broker connection is down it holds commands itself and
//!   sends them when it returns, revocations first (`Held`);
//! - the *forwarder* follows the event log and queues `lease_granted`,
//!   `preempt_requested` and `lease_revoked` commands for the capability's
//!   provider; it is the one owner of "the lease ended: tell the bench":
//!   after the `lease_revoked` it sends what the [`LeaseEndHook`] (the
//!   sessions) adds, an `action_cancel` per session running under it.
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
    parse_topic, topic, topic_filter_all, ActionCancel, Envelope, LeaseGranted, LeaseRevoked,
    LiveFrame, MessageType, ProviderConflict, RegisterAck, RegisterBody, SessionUpdate, StatusBody,
    TopicKind,
};
use shared_protocol::provider::{HeartbeatRequest, OnlineStatus};
use shared_protocol::Validate;
use tokio::sync::{mpsc, watch, Mutex};
use tokio::task::JoinHandle;

use crate::events::follow::{EventFollower, Followed};
use crate::events::EventBus;
use crate::hearing::Hearing;
use crate::providers::{Providers, StoreError};
use crate::twins::Heard as TwinHeard;

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
    /// Connect over TLS with this client configuration (an external
    /// broker with `[mqtt] tls = true`); `None`: plain TCP.
    pub tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
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
    /// Commands queued for providers (held while the link is down).
    pub commands_out: AtomicU64,
    /// PUBLISH packets the client wrote to the broker (retransmissions
    /// included): `benchlink_mqtt_messages_out_total{kind="commands"}`.
    pub published: AtomicU64,
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

/// What the publisher task is asked to do, in order.
enum Outbound {
    /// Send a command (or a `register_ack`) to a provider.
    Publish(Command),
    /// Drop a held `action_invoke` of this session: the registry ended the
    /// session before the command could leave (no-op once it was sent).
    Withdraw { session_id: String },
    /// The broker connection is up (ConnAck): subscribe, then send what
    /// was held meanwhile.
    Connected,
    /// The broker connection was lost: hold commands until `Connected`.
    Disconnected,
}

/// One message for a provider's `commands` topic, with what the publisher
/// needs to hold and order it while the link is down.
#[derive(Debug, Clone, PartialEq)]
struct Command {
    topic: String,
    /// The encoded envelope.
    payload: Vec<u8>,
    message_type: MessageType,
    /// The session an `action_invoke` or `action_cancel` is about.
    session_id: Option<String>,
}

impl Command {
    /// `env` for `topic`; the session id is read from the body of an
    /// `action_invoke` / `action_cancel`.
    fn new(topic: String, env: &Envelope) -> Command {
        let session_id = match env.message_type {
            MessageType::ActionInvoke | MessageType::ActionCancel => env
                .body
                .get("session_id")
                .and_then(Value::as_str)
                .map(str::to_string),
            _ => None,
        };
        Command {
            topic,
            payload: env.to_bytes(),
            message_type: env.message_type,
            session_id,
        }
    }

    /// Sent first when the link returns: the bench must hear that a lease
    /// ended before anything else.
    fn is_revocation(&self) -> bool {
        matches!(
            self.message_type,
            MessageType::LeaseRevoked | MessageType::ActionCancel
        )
    }
}

/// Commands the publisher holds while the broker connection is down,
/// instead of handing them to the MQTT client (whose queue cannot be
/// filtered or reordered). Unbounded, like the channel in front of it:
/// while the link is down invocations are refused, so what collects is
/// lease commands and acknowledgements, a few per lease.
#[derive(Debug, Default)]
struct Held {
    queue: Vec<Command>,
}

impl Held {
    fn hold(&mut self, command: Command) {
        self.queue.push(command);
    }

    /// Drop the held `action_invoke` of `session_id`; true if there was one.
    fn withdraw(&mut self, session_id: &str) -> bool {
        let before = self.queue.len();
        self.queue.retain(|c| {
            !(c.message_type == MessageType::ActionInvoke
                && c.session_id.as_deref() == Some(session_id))
        });
        self.queue.len() != before
    }

    /// Everything held, in the order to send it once the link is back:
    /// `lease_revoked` and `action_cancel` first, then the rest, each in
    /// the order queued. An `action_invoke` whose `action_cancel` is held
    /// too (its lease ended before either could leave) is dropped with the
    /// cancel: the action must not start. Returns the commands and the
    /// session ids of the invokes so dropped.
    fn release(&mut self) -> (Vec<Command>, Vec<String>) {
        let queue = std::mem::take(&mut self.queue);
        let cancelled: HashSet<String> = queue
            .iter()
            .filter(|c| c.message_type == MessageType::ActionCancel)
            .filter_map(|c| c.session_id.clone())
            .collect();
        let invoked: HashSet<String> = queue
            .iter()
            .filter(|c| c.message_type == MessageType::ActionInvoke)
            .filter_map(|c| c.session_id.clone())
            .collect();
        let dropped: HashSet<&String> = cancelled.intersection(&invoked).collect();
        let keep = |c: &Command| {
            !(matches!(
                c.message_type,
                MessageType::ActionInvoke | MessageType::ActionCancel
            ) && c.session_id.as_ref().is_some_and(|s| dropped.contains(s)))
        };
        let (first, rest): (Vec<Command>, Vec<Command>) = queue
            .iter()
            .filter(|c| keep(c))
            .cloned()
            .partition(Command::is_revocation);
        let mut dropped: Vec<String> = dropped.into_iter().cloned().collect();
        dropped.sort();
        (first.into_iter().chain(rest).collect(), dropped)
    }

    fn len(&self) -> usize {
        self.queue.len()
    }
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
    /// `None` when the link has stopped (nothing was queued). While the
    /// broker connection is down the command is held, and sent when it
    /// returns (revocations and cancellations first).
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
            .send(Outbound::Publish(Command::new(
                topic(&self.prefix, provider_id, TopicKind::Commands),
                &env,
            )))
            .ok()?;
        self.stats.commands_out.fetch_add(1, Ordering::Relaxed);
        Some(message_id)
    }

    /// The registry ended session `session_id` itself (deadline, provider
    /// lost): if its `action_invoke` is still held because the broker
    /// connection is down, it is dropped and never sent. Once handed to
    /// the MQTT client it cannot be recalled (this does nothing then).
    pub fn withdraw(&self, session_id: &str) {
        let _ = self.outbound.send(Outbound::Withdraw {
            session_id: session_id.to_string(),
        });
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

    /// True when `(provider, id)` was remembered (its message applied).
    fn seen(&self, provider: &str, id: &str) -> bool {
        self.seen.contains(&(provider.to_string(), id.to_string()))
    }

    /// Remember `(provider, id)`: its message was applied (stored, or
    /// refused for good). Only then: a message the store failed to keep
    /// must be applied when it is sent again.
    fn remember(&mut self, provider: &str, id: &str) {
        let key = (provider.to_string(), id.to_string());
        if !self.seen.insert(key.clone()) {
            return;
        }
        self.order.push_back(key);
        if self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
    }
}

/// `body` as a new `message_type` envelope for `provider_id`'s `commands`
/// topic.
fn command_to<T: Serialize>(
    prefix: &str,
    provider_id: &str,
    message_type: MessageType,
    body: &T,
) -> Option<Command> {
    Envelope::new(
        message_type,
        uuid::Uuid::new_v4().to_string(),
        Utc::now(),
        body,
    )
    .ok()
    .map(|env| Command::new(topic(prefix, provider_id, TopicKind::Commands), &env))
}

impl MqttLink {
    /// Connect to the broker and start the four tasks. Returns at once; the
    /// connection is made (and remade after a loss) in the background.
    /// Lease events with `event_id > forward_after` are forwarded as
    /// commands (pass the log's current end); `lease_end` adds the commands
    /// of a lease that ended.
    pub fn start(
        settings: MqttSettings,
        providers: Arc<Providers>,
        bus: EventBus,
        forward_after: u64,
        lease_end: Arc<dyn LeaseEndHook>,
        live: Arc<crate::live::LiveFrames>,
    ) -> Self {
        let mut opts = MqttOptions::new(&settings.client_id, &settings.host, settings.port);
        opts.set_keep_alive(settings.keep_alive)
            .set_clean_session(!settings.persistent_session)
            .set_max_packet_size(settings.max_packet_bytes, settings.max_packet_bytes);
        if let Some(user) = &settings.username {
            opts.set_credentials(user, settings.password.clone().unwrap_or_default());
        }
        if let Some(tls) = &settings.tls {
            opts.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(tls.clone()),
            ));
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
                    providers: providers.clone(),
                    live,
                    heard: Arc::new(Mutex::new(HashMap::new())),
                    link_up_since: hearing.subscribe(),
                },
                stats.clone(),
                prefix.clone(),
            )),
            tokio::spawn(run_twin_notices(
                providers.clone(),
                out_tx.clone(),
                prefix.clone(),
                stop_rx.clone(),
            )),
            tokio::spawn(run_forwarder(
                bus,
                Recipients {
                    providers,
                    lease_end,
                },
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
    /// monitor, [`Providers::run_liveness_monitor`], and the
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
        if let Some(command) = command_to(&self.prefix, provider_id, message_type, body) {
            let _ = self.outbound.send(Outbound::Publish(command));
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
                // Then the commands held while the link was down go.
                let _ = outbound.send(Outbound::Connected);
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if ingest.send(p).await.is_err() {
                    break;
                }
            }
            Ok(Event::Outgoing(rumqttc::Outgoing::Publish(_))) => {
                stats.published.fetch_add(1, Ordering::Relaxed);
            }
            Ok(_) => {}
            Err(e) => {
                let was_up = link.down();
                if was_up {
                    let _ = outbound.send(Outbound::Disconnected);
                }
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

/// Send what is queued, in order. While the broker connection is down
/// (from `Disconnected` to `Connected`) commands are held in [`Held`]
/// instead of handed to the client; at `Connected` the publisher
/// subscribes, then sends them (revocations first, withdrawn invokes
/// dropped). Messages handed to the client before the loss was reported
/// stay in its queue and are retransmitted by it as they are.
async fn run_publisher(
    client: AsyncClient,
    mut outbound: mpsc::UnboundedReceiver<Outbound>,
    prefix: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut up = false;
    let mut held = Held::default();
    loop {
        let msg = tokio::select! {
            m = outbound.recv() => m,
            _ = stop.changed() => None,
        };
        let Some(msg) = msg else { break };
        match msg {
            Outbound::Publish(command) if !up => held.hold(command),
            Outbound::Publish(command) => publish(&client, command).await,
            Outbound::Withdraw { session_id } => {
                if held.withdraw(&session_id) {
                    tracing::info!(%session_id, "action_invoke withdrawn before it was sent: the registry ended its session while the broker connection was down");
                }
            }
            Outbound::Disconnected => up = false,
            Outbound::Connected => {
                up = true;
                let filters = [
                    TopicKind::Status,
                    TopicKind::Register,
                    TopicKind::Heartbeat,
                    TopicKind::Results,
                ]
                .map(|k| {
                    rumqttc::SubscribeFilter::new(topic_filter_all(&prefix, k), QoS::AtLeastOnce)
                })
                .into_iter()
                .chain([rumqttc::SubscribeFilter::new(
                    topic_filter_all(&prefix, TopicKind::Frames),
                    QoS::AtMostOnce,
                )]);
                if let Err(e) = client.subscribe_many(filters).await {
                    tracing::warn!(error = %e, "MQTT subscription not queued");
                }
                if held.len() > 0 {
                    let (commands, dropped) = held.release();
                    for session_id in dropped {
                        tracing::info!(%session_id, "action_invoke and its action_cancel dropped: the lease ended before either could be sent");
                    }
                    tracing::info!(
                        commands = commands.len(),
                        "sending the commands held while the broker connection was down"
                    );
                    for command in commands {
                        publish(&client, command).await;
                    }
                }
            }
        }
    }
}

async fn publish(client: &AsyncClient, command: Command) {
    if let Err(e) = client
        .publish(command.topic, QoS::AtLeastOnce, false, command.payload)
        .await
    {
        tracing::warn!(error = %e, command = %command.message_type, "MQTT publish not queued");
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
    providers: Arc<Providers>,
    /// Where `frames` messages go.
    live: Arc<crate::live::LiveFrames>,
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
            store_status(&this.providers, &provider_id, body).await;
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
    let providers = &*confirm.providers;
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
        TopicKind::Commands | TopicKind::Frames => &stats.other_in,
    };
    counter.fetch_add(1, Ordering::Relaxed);
    if kind == TopicKind::Commands {
        return Ok(());
    }
    if kind == TopicKind::Frames {
        return live_frame(p, provider_id, providers, &confirm.live).await;
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
    if !live_status && dedup.seen(provider_id, &env.message_id) {
        stats.duplicates.fetch_add(1, Ordering::Relaxed);
        tracing::debug!(provider_id, message_id = %env.message_id, "duplicate MQTT message dropped");
        if kind == TopicKind::Status {
            // Replayed as the registry subscribed again: results the
            // provider sent while the registry was away may be lost (a
            // broker that lost or overflowed its queue), so ask anyway.
            let body: StatusBody = env.body_as(MessageType::Status)?;
            if body.online_status == OnlineStatus::Online && body.provider_id == provider_id {
                providers.provider_announced_online(provider_id).await;
            }
        }
        return Ok(());
    }
    let stored = match kind {
        TopicKind::Status => {
            let body: StatusBody = env.body_as(MessageType::Status)?;
            same_provider(provider_id, &body.provider_id)?;
            if body.online_status != OnlineStatus::Online {
                confirm.schedule(heard, provider_id, body);
                dedup.remember(provider_id, &env.message_id);
                return Ok(());
            }
            if twin_conflict(
                providers,
                outbound,
                prefix,
                provider_id,
                body.boot_id.as_deref(),
                None,
            ) {
                return Ok(());
            }
            *heard.entry(provider_id.to_string()).or_default() += 1;
            store_status(providers, provider_id, body).await
        }
        TopicKind::Register => {
            let body: RegisterBody = env.body_as(MessageType::Register)?;
            same_provider(provider_id, &body.provider.provider_id)?;
            if twin_conflict(
                providers,
                outbound,
                prefix,
                provider_id,
                body.provider.boot_id.as_deref(),
                Some((&body.provider.hostname, &body.provider.node_id)),
            ) {
                return Ok(());
            }
            *heard.entry(provider_id.to_string()).or_default() += 1;
            let ack = register(providers, provider_id, body).await;
            let stored = !ack.error.as_deref().is_some_and(crate::storage::is_full);
            if let Some(command) = command_to(prefix, provider_id, MessageType::RegisterAck, &ack) {
                let _ = outbound.send(Outbound::Publish(command));
            }
            stored
        }
        TopicKind::Heartbeat => {
            let body: HeartbeatRequest = env.body_as(MessageType::Heartbeat)?;
            same_provider(provider_id, &body.provider_id)?;
            if twin_conflict(
                providers,
                outbound,
                prefix,
                provider_id,
                body.boot_id.as_deref(),
                None,
            ) {
                return Ok(());
            }
            *heard.entry(provider_id.to_string()).or_default() += 1;
            match providers.heartbeat(provider_id, body).await {
                Ok(_) => true,
                Err(StoreError::NotFound { .. }) => {
                    tracing::warn!(provider_id, "heartbeat before registration; ignored");
                    true
                }
                Err(e) => {
                    note_store_error("heartbeat", provider_id, &e);
                    false
                }
            }
        }
        TopicKind::Results => {
            let body: SessionUpdate = env.body_as(MessageType::SessionUpdate)?;
            let owner = providers
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
            providers.session_update(provider_id, body).await
        }
        TopicKind::Commands | TopicKind::Frames => true,
    };
    if stored {
        dedup.remember(provider_id, &env.message_id);
    }
    Ok(())
}

/// A `frames` message: the latest frame of a stream of one of the
/// provider's capabilities (or its end), kept in memory for the live view.
async fn live_frame(
    p: &Publish,
    provider_id: &str,
    providers: &Providers,
    live: &crate::live::LiveFrames,
) -> Result<(), Refused> {
    let (header, jpeg) = match LiveFrame::decode(&p.payload) {
        Ok(x) => x,
        Err(e) => {
            tracing::debug!(provider_id, error = %e, "live frame refused");
            return Ok(());
        }
    };
    let owner = providers
        .store()
        .get_capability(&header.capability_id)
        .await
        .ok()
        .flatten()
        .map(|c| c.provider_id);
    if owner.as_deref() != Some(provider_id) {
        return Err(Refused::ForeignCapability {
            provider_id: provider_id.to_string(),
            capability_id: header.capability_id,
        });
    }
    if header.end || jpeg.is_empty() {
        live.end(&header.capability_id);
    } else {
        live.put(
            &header.capability_id,
            header.seq,
            header.captured_at,
            bytes::Bytes::copy_from_slice(jpeg),
        );
    }
    Ok(())
}

/// Log a store failure while applying a provider's `what` message: a full
/// disk marks the store not writable (its warning is rate-limited), any
/// other failure is an error line.
fn note_store_error(what: &str, provider_id: &str, e: &StoreError) {
    if crate::storage::is_full(e) {
        crate::storage::note_full(what, e);
    } else {
        tracing::error!(provider_id, error = %e, "{what} not stored");
    }
}

/// Note the boot id of a message showing `provider_id` connected, for
/// twin detection ([`crate::twins`]). True when the message must change
/// nothing: the provider is heard from two instances at once (both are
/// told, once when it starts and then every [`TWIN_NOTICE_PERIOD`]).
fn twin_conflict(
    providers: &Providers,
    outbound: &mpsc::UnboundedSender<Outbound>,
    prefix: &str,
    provider_id: &str,
    boot_id: Option<&str>,
    host: Option<(&str, &str)>,
) -> bool {
    let Some(boot_id) = boot_id else {
        return false;
    };
    match providers.twins().heard(provider_id, boot_id, host) {
        TwinHeard::Alone => false,
        TwinHeard::InConflict { notify } => {
            if notify {
                if let Some(instances) = providers.twins().conflict(provider_id) {
                    send_conflict(outbound, prefix, provider_id, instances, false);
                }
            }
            true
        }
        TwinHeard::ConflictStarted(instances) => {
            let hosts: Vec<String> = instances
                .iter()
                .map(|i| format!("{} (node {}, boot {})", i.hostname, i.node_id, i.boot_id))
                .collect();
            tracing::error!(
                provider_id,
                instances = %hosts.join("; "),
                "two instances of one provider are connected at once (a copied bench configuration?); its actions are refused until only one is left"
            );
            send_conflict(outbound, prefix, provider_id, instances, false);
            true
        }
    }
}

fn send_conflict(
    outbound: &mpsc::UnboundedSender<Outbound>,
    prefix: &str,
    provider_id: &str,
    instances: Vec<crate::twins::Instance>,
    resolved: bool,
) {
    let body = ProviderConflict {
        provider_id: provider_id.to_string(),
        instances,
        resolved,
    };
    if let Some(command) = command_to(prefix, provider_id, MessageType::ProviderConflict, &body) {
        let _ = outbound.send(Outbound::Publish(command));
    }
}

/// How often the instances of a provider in conflict are told again (an
/// instance that reconnects learns it at once).
const TWIN_NOTICE_PERIOD: Duration = Duration::from_secs(5);

/// End conflicts whose twin is gone (each second) and tell the instances
/// of those still in conflict again.
async fn run_twin_notices(
    providers: Arc<Providers>,
    outbound: mpsc::UnboundedSender<Outbound>,
    prefix: String,
    mut stop: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    let mut last_notice = Instant::now();
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = stop.changed() => return,
        }
        for (provider_id, left) in providers.twins().settle() {
            tracing::warn!(
                provider_id,
                hostname = %left.hostname,
                node_id = %left.node_id,
                boot_id = %left.boot_id,
                "provider conflict over: only one instance is left; its actions are accepted again"
            );
            send_conflict(&outbound, &prefix, &provider_id, vec![left], true);
        }
        if last_notice.elapsed() >= TWIN_NOTICE_PERIOD {
            last_notice = Instant::now();
            for (provider_id, instances) in providers.twins().conflicted() {
                send_conflict(&outbound, &prefix, &provider_id, instances, false);
            }
        }
    }
}

/// Register a provider and its capabilities from one MQTT message; the
/// answer goes back as `register_ack`.
async fn register(providers: &Providers, provider_id: &str, body: RegisterBody) -> RegisterAck {
    let interval = providers.settings().heartbeat_interval_seconds;
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
    if let Err(e) = providers
        .register_provider(provider_id, body.provider)
        .await
    {
        return refuse(e.to_string());
    }
    match providers.register_capabilities(provider_id, batch).await {
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

/// What else the bench is told when a granted lease ends (preempted,
/// expired, released): called by the forwarder after it queued the
/// `lease_revoked`, in event order. Implemented by the sessions, which
/// record why on the sessions running under the lease.
#[async_trait::async_trait]
pub trait LeaseEndHook: Send + Sync + 'static {
    /// The `action_cancel`s (with their provider ids) for lease event
    /// `ev`; empty when it ends no lease or nothing runs under it.
    async fn on_lease_ended(&self, ev: &CapabilityEvent) -> Vec<(String, ActionCancel)>;
}

/// Who the forwarder asks about a lease event: the providers (whose
/// capability it is) and the [`LeaseEndHook`].
struct Recipients {
    providers: Arc<Providers>,
    lease_end: Arc<dyn LeaseEndHook>,
}

/// Whether `ev` ends a lease.
fn ends_lease(ev: &CapabilityEvent) -> bool {
    matches!(
        ev.event_type,
        EventType::LeasePreempted | EventType::LeaseExpired | EventType::LeaseReleased
    )
}

/// The command (type and body) to send for a lease event, if any.
fn command_for(ev: &CapabilityEvent) -> Option<(MessageType, Value)> {
    // Most events tell the provider nothing: decide before parsing.
    if !matches!(
        ev.event_type,
        EventType::LeasePreemptRequested
            | EventType::LeasePreempted
            | EventType::LeaseExpired
            | EventType::LeaseReleased
            | EventType::LeaseGranted
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
        EventType::LeaseGranted => {
            let lease = lease?;
            let body = LeaseGranted {
                lease_id,
                capability_id,
                lease_generation: lease.generation?,
                lease_mode: lease.mode,
                expires_at: lease.expires_at,
            };
            Some((MessageType::LeaseGranted, serde_json::to_value(body).ok()?))
        }
        EventType::LeasePreempted | EventType::LeaseExpired | EventType::LeaseReleased => {
            // A request that ends before it was ever granted (withdrawn,
            // queue timeout) gave the bench nothing to fence.
            let generation = lease.as_ref().and_then(|l| l.generation)?;
            let reason = data_str(ev, "reason").unwrap_or_else(|| match ev.event_type {
                EventType::LeaseReleased => "released".to_string(),
                t => t.as_str().to_string(),
            });
            let body = LeaseRevoked {
                lease_id,
                capability_id,
                reason,
                lease_generation: generation,
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
    Recipients {
        providers,
        lease_end,
    }: Recipients,
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
        if let Some((message_type, body)) = command_for(&ev) {
            if let Some(provider_id) = provider_of(&providers, &ev).await {
                if let Some(command) = command_to(&prefix, &provider_id, message_type, &body) {
                    stats.commands_out.fetch_add(1, Ordering::Relaxed);
                    tracing::info!(provider_id, event_id = ev.event_id, command = %message_type, "forwarding lease command to provider");
                    let _ = outbound.send(Outbound::Publish(command));
                }
            }
        }
        if ends_lease(&ev) {
            for (provider_id, cancel) in lease_end.on_lease_ended(&ev).await {
                if let Some(command) =
                    command_to(&prefix, &provider_id, MessageType::ActionCancel, &cancel)
                {
                    stats.commands_out.fetch_add(1, Ordering::Relaxed);
                    let _ = outbound.send(Outbound::Publish(command));
                }
            }
        }
    }
}

/// The provider a lease event's command goes to: the event's, or the
/// owner of its capability.
async fn provider_of(providers: &Providers, ev: &CapabilityEvent) -> Option<String> {
    match (&ev.provider_id, &ev.capability_id) {
        (Some(p), _) => Some(p.clone()),
        (None, Some(c)) => providers
            .store()
            .get_capability(c)
            .await
            .ok()
            .flatten()
            .map(|c| c.provider_id),
        (None, None) => None,
    }
}

/// Store a provider's status message; a provider that never registered
/// is ignored, a store failure logged.
/// Store a status; false when the store failed (see [`Dedup::remember`]).
async fn store_status(providers: &Providers, provider_id: &str, body: StatusBody) -> bool {
    match providers.provider_status(provider_id, body).await {
        Ok(()) => true,
        Err(StoreError::NotFound { .. }) => {
            tracing::debug!(
                provider_id,
                "status of a provider that never registered; ignored"
            );
            true
        }
        Err(e) => {
            note_store_error("status", provider_id, &e);
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A message whose content could not be stored is not a duplicate
    /// when it comes again; one applied is, and the oldest ids are
    /// forgotten past the capacity.
    #[test]
    fn only_applied_message_ids_are_duplicates() {
        let mut d = Dedup::new(2);
        assert!(!d.seen("p1", "m1"), "not stored yet: not remembered");
        d.remember("p1", "m1");
        assert!(d.seen("p1", "m1"));
        assert!(!d.seen("p2", "m1"), "ids are per provider");
        d.remember("p1", "m2");
        d.remember("p1", "m3");
        assert!(!d.seen("p1", "m1"), "the oldest is forgotten");
        assert!(d.seen("p1", "m3"));
    }

    /// A command of `message_type` for provider `p1`, about `session_id`.
    fn command(message_type: MessageType, body: Value) -> Command {
        let env = Envelope::new(
            message_type,
            uuid::Uuid::new_v4().to_string(),
            Utc::now(),
            &body,
        )
        .unwrap();
        Command::new(topic("bl/v1", "p1", TopicKind::Commands), &env)
    }

    fn invoke(session_id: &str) -> Command {
        command(
            MessageType::ActionInvoke,
            json!({"session_id": session_id, "lease_id": "l1", "action": "snapshot"}),
        )
    }

    fn cancel(session_id: &str) -> Command {
        command(
            MessageType::ActionCancel,
            json!({"session_id": session_id, "reason": "lease expired"}),
        )
    }

    fn revoked(lease_id: &str) -> Command {
        command(
            MessageType::LeaseRevoked,
            json!({"lease_id": lease_id, "capability_id": "cam-1", "reason": "ttl_elapsed"}),
        )
    }

    fn kinds(commands: &[Command]) -> Vec<(MessageType, Option<&str>)> {
        commands
            .iter()
            .map(|c| (c.message_type, c.session_id.as_deref()))
            .collect()
    }

    #[test]
    fn a_command_knows_its_type_and_session_without_its_payload_being_parsed_again() {
        let c = invoke("s1");
        assert_eq!(c.message_type, MessageType::ActionInvoke);
        assert_eq!(c.session_id.as_deref(), Some("s1"));
        assert_eq!(revoked("l1").session_id, None);
        let env = Envelope::parse(&c.payload).unwrap();
        assert_eq!(env.body["session_id"], "s1");
    }

    #[test]
    fn held_commands_leave_revocations_first_then_the_rest_in_their_order() {
        let mut held = Held::default();
        held.hold(invoke("s1"));
        held.hold(command(
            MessageType::PreemptRequested,
            json!({"lease_id": "l2"}),
        ));
        held.hold(revoked("l2"));
        held.hold(invoke("s2"));
        held.hold(cancel("s0"));
        held.hold(revoked("l3"));
        let (out, dropped) = held.release();
        assert_eq!(
            kinds(&out),
            [
                (MessageType::LeaseRevoked, None),
                (MessageType::ActionCancel, Some("s0")),
                (MessageType::LeaseRevoked, None),
                (MessageType::ActionInvoke, Some("s1")),
                (MessageType::PreemptRequested, None),
                (MessageType::ActionInvoke, Some("s2")),
            ]
        );
        assert!(dropped.is_empty());
        // The two revocations keep their own order.
        let leases: Vec<String> = out
            .iter()
            .filter(|c| c.message_type == MessageType::LeaseRevoked)
            .map(|c| Envelope::parse(&c.payload).unwrap().body["lease_id"].to_string())
            .collect();
        assert_eq!(leases, ["\"l2\"", "\"l3\""]);
        assert_eq!(held.len(), 0, "released commands are no longer held");
    }

    #[test]
    fn a_withdrawn_invoke_is_never_sent_and_withdrawing_a_sent_one_changes_nothing() {
        let mut held = Held::default();
        held.hold(invoke("s1"));
        held.hold(cancel("s2"));
        held.hold(invoke("s3"));
        assert!(held.withdraw("s1"));
        // Only invokes are withdrawn: the cancel of s2 stays.
        assert!(!held.withdraw("s2"));
        assert!(!held.withdraw("unknown"));
        let (out, _) = held.release();
        assert_eq!(
            kinds(&out),
            [
                (MessageType::ActionCancel, Some("s2")),
                (MessageType::ActionInvoke, Some("s3")),
            ]
        );
        // Nothing held any more (everything was sent): a no-op.
        assert!(!held.withdraw("s3"));
    }

    #[test]
    fn an_invoke_cancelled_before_either_could_leave_is_dropped_with_its_cancel() {
        let mut held = Held::default();
        held.hold(invoke("s1"));
        held.hold(invoke("s2"));
        held.hold(revoked("l1"));
        held.hold(cancel("s1"));
        let (out, dropped) = held.release();
        assert_eq!(
            kinds(&out),
            [
                (MessageType::LeaseRevoked, None),
                (MessageType::ActionInvoke, Some("s2")),
            ]
        );
        assert_eq!(dropped, ["s1"]);
    }

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
