//! The MQTT link to the registry (docs/architecture.md "Control plane").
//!
//! Two tasks share one rumqttc connection:
//! - the **poll task** owns the `EventLoop`: it only polls, reconnects with
//!   exponential backoff and jitter (capped at [`BACKOFF_CAP`]), drops
//!   repeated command `message_id`s and hands commands on through a bounded
//!   queue. It never awaits a publish.
//! - the **publisher task** owns the `AsyncClient`: on every ConnAck it
//!   (re)subscribes to `…/commands` (whatever `session_present` says),
//!   publishes the retained `online` status, the `register` message and a
//!   first heartbeat (capability health), then drains the session updates
//!   queued in the outbox database; between those it sends heartbeats
//!   (QoS 0) every `heartbeat_interval_seconds`.
//!
//! Session updates are stored in the outbox database before they reach the
//! link, and a row is deleted only once the broker acknowledged (PUBACK)
//! that exact publish. QoS 1 publishes go to the event loop over a
//! rendezvous request channel in the order they are registered with the
//! acknowledgement tracker, so each outgoing packet id is bound to the
//! right message and an acknowledgement is never credited to the wrong
//! one; queued updates are pipelined (a batch is sent, then its PUBACKs are
//! awaited). A message whose acknowledgement does not arrive is sent again
//! after the next ConnAck (receivers de-duplicate by `message_id`).
//!
//! The connection carries client id and user name = provider id, password =
//! token, and a retained LWT `status` envelope with `offline`; over TLS
//! when `[registry] mqtt_tls = true` (docs/install-edge-agent.md "TLS").

use std::collections::{HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use chrono::Utc;
use rumqttc::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event, EventLoop, LastWill, MqttOptions,
    Outgoing, Packet, QoS, StateError, SubscribeReasonCode,
};
use shared_protocol::mqtt::{topic, Envelope, MessageType, RegisterBody, StatusBody, TopicKind};
use shared_protocol::provider::{HeartbeatRequest, OnlineStatus};
use tokio::sync::{mpsc, oneshot, watch, Notify};
use tokio::task::JoinHandle;

use crate::drivers::live::LiveMessage;
use crate::outbox::{Outbox, QueuedUpdate};
use crate::update_size::{shrink_queued, MAX_SESSION_UPDATE_BYTES};

/// Longest wait between reconnection attempts.
pub const BACKOFF_CAP: Duration = Duration::from_secs(10);
/// First wait after a lost connection.
const BACKOFF_BASE: Duration = Duration::from_millis(250);
/// How long a QoS 1 publish may wait for its PUBACK before it counts as
/// not delivered (and is sent again after the next ConnAck).
const ACK_TIMEOUT: Duration = Duration::from_secs(10);
/// How long handing a request to the event loop may take before the link
/// counts as down.
const SEND_TIMEOUT: Duration = Duration::from_secs(5);
/// Message ids remembered for de-duplication.
const DEDUP_CAPACITY: usize = 4096;
/// Commands waiting for the dispatcher.
const COMMAND_QUEUE: usize = 1024;
/// A QoS 1 publish handed to the event loop, waiting for its PUBACK.
struct InFlight {
    id: u64,
    acked: oneshot::Receiver<()>,
}

/// Largest MQTT packet sent or accepted, bytes.
pub const MAX_PACKET_BYTES: usize = 8 << 20;
/// Most session updates in flight (sent, PUBACK not yet received) at once;
/// below rumqttc's default limit of 100 outgoing QoS 1 messages.
const DRAIN_WINDOW: usize = 64;
/// Longest a drain pass runs before heartbeats and control messages get a
/// turn.
const DRAIN_PASS: Duration = Duration::from_millis(200);

/// How a drain pass ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Drained {
    /// Nothing queued and nothing in flight.
    Empty,
    /// The pass ran out of time (or hit its deadline) with updates left.
    More,
}

/// What the link needs from the configuration.
#[derive(Clone)]
pub struct LinkConfig {
    pub provider_id: String,
    pub host: String,
    pub port: u16,
    /// MQTT over TLS with this configuration (`[registry] mqtt_tls`, see
    /// [`crate::tls`]); `None`: plain TCP.
    pub tls: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
    pub topic_prefix: String,
    /// MQTT password; never logged.
    pub token: String,
    /// Seconds.
    pub keep_alive_seconds: u16,
    /// Heartbeat period until the `register_ack` says otherwise, seconds.
    pub heartbeat_interval_seconds: u32,
    /// Random id of this process start, in `status`, `register` and
    /// heartbeats.
    pub boot_id: String,
}

/// Where the link gets what it publishes. Both methods may block (they
/// read driver health and the outbox); the link calls them on the blocking
/// pool.
pub trait LinkSource: Send + Sync + 'static {
    /// Provider and capability batch (docs/architecture.md, "Control plane (MQTT)").
    fn register_body(&self) -> RegisterBody;
    /// Health per capability, running sessions with their
    /// non-interruptible flags, faults (docs/architecture.md, "Control plane (MQTT)").
    fn heartbeat_body(&self) -> HeartbeatRequest;
}

/// Connection state others may read.
#[derive(Debug, Default)]
pub struct LinkState {
    connected: AtomicBool,
    connects: AtomicU64,
    /// Set by the publisher once `online` and `register` went out after the
    /// latest ConnAck.
    registered: AtomicBool,
}

impl LinkState {
    /// True while the broker connection is up.
    pub fn is_connected(&self) -> bool {
        self.connected.load(Ordering::SeqCst)
    }
    /// Number of ConnAcks received since start.
    pub fn connect_count(&self) -> u64 {
        self.connects.load(Ordering::SeqCst)
    }
    /// True once `online` status and `register` were acknowledged on the
    /// current connection.
    pub fn is_registered(&self) -> bool {
        self.registered.load(Ordering::SeqCst)
    }
}

/// The running link.
pub struct Link {
    state: Arc<LinkState>,
    heartbeat_interval: Arc<watch::Sender<u32>>,
    control: mpsc::Sender<Control>,
    poll_task: JoinHandle<()>,
    publisher_task: JoinHandle<()>,
    frames_task: JoinHandle<()>,
    frames_tx: mpsc::Sender<LiveMessage>,
}

/// Changes the link's heartbeat period (the dispatcher applies
/// `register_ack.heartbeat_interval_seconds` through it).
#[derive(Clone)]
pub struct HeartbeatControl(Arc<watch::Sender<u32>>);

impl HeartbeatControl {
    /// New period, seconds (at least 1).
    pub fn set(&self, seconds: u32) {
        let _ = self.0.send(seconds.max(1));
    }
}

enum Control {
    Shutdown {
        deadline: tokio::time::Instant,
        done: oneshot::Sender<()>,
    },
}

#[derive(Debug, Clone, Copy)]
enum LinkEvent {
    Connected,
    Disconnected,
}

impl Link {
    /// Start both tasks. Incoming commands (already de-duplicated) arrive on
    /// the returned receiver. `updates_ready` is notified whenever a session
    /// update was queued in `outbox`.
    pub fn start(
        cfg: LinkConfig,
        source: Arc<dyn LinkSource>,
        outbox: Outbox,
        updates_ready: Arc<Notify>,
    ) -> (Link, mpsc::Receiver<Envelope>) {
        let status_topic = topic(&cfg.topic_prefix, &cfg.provider_id, TopicKind::Status);
        let offline = status_envelope(&cfg, OnlineStatus::Offline);
        let mut options = MqttOptions::new(cfg.provider_id.clone(), cfg.host.clone(), cfg.port);
        options
            .set_credentials(cfg.provider_id.clone(), cfg.token.clone())
            .set_keep_alive(Duration::from_secs(u64::from(cfg.keep_alive_seconds)))
            .set_clean_session(true)
            .set_max_packet_size(MAX_PACKET_BYTES, MAX_PACKET_BYTES)
            .set_last_will(LastWill::new(
                status_topic,
                offline.to_bytes(),
                QoS::AtLeastOnce,
                true,
            ));
        if let Some(tls) = &cfg.tls {
            options.set_transport(rumqttc::Transport::tls_with_config(
                rumqttc::TlsConfiguration::Rustls(tls.clone()),
            ));
        }
        // Capacity 0: a request is handed over only when the event loop takes
        // it, so nothing waits in a buffer that a reconnect would discard,
        // and packet ids map one-to-one onto our QoS 1 publishes.
        let (client, mut eventloop) = AsyncClient::new(options, 0);
        let mut net = eventloop.network_options();
        net.set_connection_timeout(5);
        net.set_tcp_nodelay(true);
        eventloop.set_network_options(net);

        let state = Arc::new(LinkState::default());
        let tracker = Arc::new(Mutex::new(AckTracker::default()));
        let (commands_tx, commands_rx) = mpsc::channel(COMMAND_QUEUE);
        let (events_tx, events_rx) = mpsc::unbounded_channel();
        let (stop_tx, stop_rx) = watch::channel(false);
        let (hb_tx, hb_rx) = watch::channel(cfg.heartbeat_interval_seconds.max(1));
        let (control_tx, control_rx) = mpsc::channel(1);

        let poll_task = tokio::spawn(poll_loop(PollCtx {
            eventloop,
            commands_topic: topic(&cfg.topic_prefix, &cfg.provider_id, TopicKind::Commands),
            state: state.clone(),
            tracker: tracker.clone(),
            commands_tx,
            events_tx,
            stop: stop_rx,
        }));
        let (frames_tx, frames_rx) = mpsc::channel(FRAME_QUEUE);
        let frames_task = tokio::spawn(frames_loop(
            client.clone(),
            topic(&cfg.topic_prefix, &cfg.provider_id, TopicKind::Frames),
            state.clone(),
            frames_rx,
        ));
        let publisher_task = tokio::spawn(publisher_loop(Publisher {
            client,
            cfg,
            state: state.clone(),
            tracker,
            source,
            outbox,
            updates_ready,
            events_rx,
            control_rx,
            heartbeat: hb_rx,
            stop_poll: stop_tx,
            drained_clean: false,
        }));
        (
            Link {
                state,
                heartbeat_interval: Arc::new(hb_tx),
                control: control_tx,
                poll_task,
                publisher_task,
                frames_task,
                frames_tx,
            },
            commands_rx,
        )
    }

    /// Where live camera frames go to be published on the `frames` topic
    /// (see [`crate::drivers::live`]).
    pub fn frame_sender(&self) -> mpsc::Sender<LiveMessage> {
        self.frames_tx.clone()
    }

    /// Connection state.
    pub fn state(&self) -> Arc<LinkState> {
        self.state.clone()
    }

    /// Change the heartbeat period (from a `register_ack`), seconds.
    pub fn set_heartbeat_interval(&self, seconds: u32) {
        let _ = self.heartbeat_interval.send(seconds.max(1));
    }

    /// A handle that changes the heartbeat period from elsewhere.
    pub fn heartbeat_control(&self) -> HeartbeatControl {
        HeartbeatControl(self.heartbeat_interval.clone())
    }

    /// True while both tasks run (watchdog health).
    pub fn is_alive(&self) -> bool {
        !self.poll_task.is_finished() && !self.publisher_task.is_finished()
    }

    /// Publish what is still queued, then the retained `offline` status,
    /// disconnect, and stop. Gives up at `timeout` (what is not published
    /// stays in the outbox database for the next start).
    pub async fn shutdown(self, timeout: Duration) {
        let deadline = tokio::time::Instant::now() + timeout;
        let (done_tx, done_rx) = oneshot::channel();
        let sent = self
            .control
            .send(Control::Shutdown {
                deadline,
                done: done_tx,
            })
            .await
            .is_ok();
        if sent {
            let _ = tokio::time::timeout_at(deadline + Duration::from_secs(1), done_rx).await;
        }
        self.publisher_task.abort();
        self.frames_task.abort();
        let mut poll = self.poll_task;
        if tokio::time::timeout(Duration::from_secs(2), &mut poll)
            .await
            .is_err()
        {
            poll.abort();
        }
    }
}

/// Live frames waiting for the frames task; more are dropped.
const FRAME_QUEUE: usize = 2;
/// How long handing a live frame to the event loop may take before it is
/// dropped.
const FRAME_SEND_TIMEOUT: Duration = Duration::from_millis(500);

/// Publishes live camera frames, QoS 0 and not retained, while the link is
/// up; drops them while it is down (a live view has no use for old
/// frames). Its own task, so a slow hand-over never delays heartbeats or
/// session updates, and the event loop never awaits it.
async fn frames_loop(
    client: AsyncClient,
    topic: String,
    state: Arc<LinkState>,
    mut rx: mpsc::Receiver<LiveMessage>,
) {
    while let Some(m) = rx.recv().await {
        if !state.is_connected() {
            continue;
        }
        let payload = m.header.encode(&m.jpeg);
        let send = client.publish(topic.clone(), QoS::AtMostOnce, false, payload);
        match tokio::time::timeout(FRAME_SEND_TIMEOUT, send).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::debug!("mqtt: live frame not sent: {e}"),
            Err(_) => tracing::debug!("mqtt: live frame dropped (event loop busy)"),
        }
    }
}

fn status_envelope(cfg: &LinkConfig, status: OnlineStatus) -> Envelope {
    envelope(
        MessageType::Status,
        &StatusBody {
            provider_id: cfg.provider_id.clone(),
            online_status: status,
            boot_id: Some(cfg.boot_id.clone()),
        },
    )
}

/// Wrap `body` in an envelope with a fresh `message_id`.
pub fn envelope<T: serde::Serialize>(message_type: MessageType, body: &T) -> Envelope {
    Envelope::new(
        message_type,
        uuid::Uuid::new_v4().to_string(),
        Utc::now(),
        body,
    )
    .unwrap_or_else(|_| Envelope {
        protocol_version: shared_protocol::PROTOCOL_VERSION.to_string(),
        message_id: uuid::Uuid::new_v4().to_string(),
        sent_at: Utc::now(),
        message_type,
        body: serde_json::Value::Null,
    })
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

// ---------------------------------------------------------------------------
// Acknowledgement tracking.

/// QoS 1 publishes in flight, in the order they were handed to the event
/// loop, each with its packet id once the event loop has written it.
///
/// The event loop writes publishes in the order it takes them, and the
/// publisher task hands them over one at a time through a rendezvous
/// channel after registering each here, so the n-th `Outgoing::Publish`
/// always belongs to the oldest entry without a packet id: an
/// acknowledgement is never credited to the wrong message.
#[derive(Default)]
struct AckTracker {
    next_id: u64,
    waiting: VecDeque<Waiting>,
}

struct Waiting {
    id: u64,
    pkid: Option<u16>,
    done: oneshot::Sender<()>,
}

impl AckTracker {
    /// Register the next QoS 1 publish (before handing it over); returns
    /// its entry id and the receiver completed by its PUBACK.
    fn begin(&mut self) -> (u64, oneshot::Receiver<()>) {
        let (tx, rx) = oneshot::channel();
        self.next_id += 1;
        let id = self.next_id;
        self.waiting.push_back(Waiting {
            id,
            pkid: None,
            done: tx,
        });
        (id, rx)
    }

    /// Forget entry `id` (not taken by the event loop, or given up on).
    fn abort(&mut self, id: u64) {
        self.waiting.retain(|w| w.id != id);
    }

    /// The event loop put a QoS 1 publish with `pkid` on the wire: it is
    /// the oldest entry still without a packet id.
    fn bind(&mut self, pkid: u16) {
        if let Some(w) = self.waiting.iter_mut().find(|w| w.pkid.is_none()) {
            w.pkid = Some(pkid);
        }
    }

    fn acked(&mut self, pkid: u16) {
        if let Some(i) = self.waiting.iter().position(|w| w.pkid == Some(pkid)) {
            if let Some(w) = self.waiting.remove(i) {
                let _ = w.done.send(());
            }
        }
    }

    /// The connection dropped: publishes already on the wire will not be
    /// acknowledged (their receivers see the drop and they are sent again
    /// after the next ConnAck). One registered but not yet written is kept:
    /// the event loop writes it on the next connection.
    fn connection_lost(&mut self) {
        self.waiting.retain(|w| w.pkid.is_none());
    }
}

// ---------------------------------------------------------------------------
// The poll task.

struct PollCtx {
    eventloop: EventLoop,
    commands_topic: String,
    state: Arc<LinkState>,
    tracker: Arc<Mutex<AckTracker>>,
    commands_tx: mpsc::Sender<Envelope>,
    events_tx: mpsc::UnboundedSender<LinkEvent>,
    stop: watch::Receiver<bool>,
}

/// Exponential backoff with "equal jitter": each wait is between half and
/// all of the current step; steps double up to the cap.
#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    step: Duration,
}

impl Backoff {
    /// Start at `base`, never exceed `cap`.
    pub fn new(base: Duration, cap: Duration) -> Self {
        Self {
            base,
            cap,
            step: base,
        }
    }
    /// The next wait.
    pub fn next_delay(&mut self) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.cap);
        let half = step / 2;
        half + half.mul_f64(random_fraction())
    }
    /// Back to `base` (after a success).
    pub fn reset(&mut self) {
        self.step = self.base;
    }
}

/// A number in [0, 1) from the OS random source (through uuid v4).
pub fn random_fraction() -> f64 {
    let bits = uuid::Uuid::new_v4().as_u128() as u64 >> 11;
    bits as f64 / (1u64 << 53) as f64
}

/// De-duplication of message ids: remembers the last `capacity` ids.
#[derive(Debug)]
pub struct MessageIdLru {
    seen: HashSet<String>,
    order: VecDeque<String>,
    capacity: usize,
}

impl MessageIdLru {
    /// Remember up to `capacity` ids.
    pub fn new(capacity: usize) -> Self {
        Self {
            seen: HashSet::with_capacity(capacity),
            order: VecDeque::with_capacity(capacity),
            capacity: capacity.max(1),
        }
    }
    /// True the first time `id` is offered; false for a repeat.
    pub fn first_time(&mut self, id: &str) -> bool {
        if self.seen.contains(id) {
            return false;
        }
        if self.order.len() == self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        self.seen.insert(id.to_string());
        self.order.push_back(id.to_string());
        true
    }
}

/// A connection that lasted at least this long counts as a success that
/// resets the reconnection backoff; one closed sooner does not (a broker
/// closing it at once, as when another client takes the same client id).
pub const STABLE_AFTER: Duration = Duration::from_secs(10);
/// Connections in a row closed within [`STABLE_AFTER`] after which the
/// bench suspects a twin and waits up to [`TAKEOVER_CAP`] between tries.
pub const TAKEOVERS_TO_SUSPECT: u32 = 3;
/// Longest wait between tries while connections keep being taken over.
pub const TAKEOVER_CAP: Duration = Duration::from_secs(30);

async fn poll_loop(mut ctx: PollCtx) {
    let mut backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP);
    let mut dedup = MessageIdLru::new(DEDUP_CAPACITY);
    let mut failures: u64 = 0;
    // When the current connection was made, and how many in a row were
    // closed within `STABLE_AFTER`.
    let mut connected_at: Option<Instant> = None;
    let mut short_lived: u32 = 0;
    loop {
        let event = tokio::select! {
            ev = ctx.eventloop.poll() => ev,
            _ = ctx.stop.changed() => break,
        };
        match event {
            Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                // The backoff resets once this connection proves stable.
                connected_at = Some(Instant::now());
                failures = 0;
                ctx.state.connected.store(true, Ordering::SeqCst);
                ctx.state.connects.fetch_add(1, Ordering::SeqCst);
                tracing::info!(
                    session_present = ack.session_present,
                    "mqtt: connected to broker"
                );
                let _ = ctx.events_tx.send(LinkEvent::Connected);
            }
            Ok(Event::Incoming(Packet::Publish(p))) => {
                if p.topic != ctx.commands_topic {
                    tracing::debug!(topic = %p.topic, "mqtt: ignoring message on a foreign topic");
                    continue;
                }
                match Envelope::parse(&p.payload) {
                    Ok(env) => {
                        if !dedup.first_time(&env.message_id) {
                            tracing::debug!(message_id = %env.message_id, "mqtt: dropping a repeated command");
                            continue;
                        }
                        match ctx.commands_tx.try_send(env) {
                            Ok(()) => {}
                            Err(mpsc::error::TrySendError::Full(env)) => tracing::error!(
                                message_id = %env.message_id,
                                "mqtt: command queue full ({COMMAND_QUEUE}), command dropped"
                            ),
                            Err(mpsc::error::TrySendError::Closed(env)) => tracing::warn!(
                                message_id = %env.message_id,
                                "mqtt: command arrived while stopping; ignored"
                            ),
                        }
                    }
                    Err(e) => tracing::warn!("mqtt: refusing a malformed command: {e}"),
                }
            }
            Ok(Event::Incoming(Packet::PubAck(ack))) => {
                lock(&ctx.tracker).acked(ack.pkid);
            }
            Ok(Event::Incoming(Packet::SubAck(ack))) => {
                if ack
                    .return_codes
                    .iter()
                    .any(|c| matches!(c, SubscribeReasonCode::Failure))
                {
                    tracing::error!(
                        topic = %ctx.commands_topic,
                        "mqtt: the broker refused the subscription to the commands topic (check its ACL for this provider)"
                    );
                }
            }
            Ok(Event::Outgoing(Outgoing::Publish(pkid))) if pkid != 0 => {
                lock(&ctx.tracker).bind(pkid);
            }
            Ok(Event::Outgoing(Outgoing::Disconnect)) => {
                ctx.state.connected.store(false, Ordering::SeqCst);
                tracing::info!("mqtt: disconnected");
                let _ = ctx.events_tx.send(LinkEvent::Disconnected);
                break;
            }
            Ok(_) => {}
            Err(e) => {
                let was_connected = ctx.state.connected.swap(false, Ordering::SeqCst);
                ctx.state.registered.store(false, Ordering::SeqCst);
                lock(&ctx.tracker).connection_lost();
                if was_connected {
                    let _ = ctx.events_tx.send(LinkEvent::Disconnected);
                }
                failures += 1;
                match connected_at.take() {
                    Some(at) if at.elapsed() < STABLE_AFTER => {
                        short_lived += 1;
                        if short_lived == TAKEOVERS_TO_SUSPECT {
                            backoff = Backoff::new(BACKOFF_BASE * 8, TAKEOVER_CAP);
                        }
                        if short_lived >= TAKEOVERS_TO_SUSPECT {
                            tracing::error!(
                                commands_topic = %ctx.commands_topic,
                                in_a_row = short_lived,
                                "mqtt: the broker closed this bench's connection soon after it was made, again: another bench may be connected with the same provider id (client id); waiting up to {} s between tries",
                                TAKEOVER_CAP.as_secs()
                            );
                        }
                    }
                    Some(_) => {
                        short_lived = 0;
                        backoff = Backoff::new(BACKOFF_BASE, BACKOFF_CAP);
                    }
                    None => {}
                }
                let delay = backoff.next_delay();
                log_connection_error(&e, was_connected, failures, delay);
                tokio::select! {
                    _ = tokio::time::sleep(delay) => {}
                    _ = ctx.stop.changed() => break,
                }
            }
        }
    }
}

fn log_connection_error(e: &ConnectionError, was_connected: bool, failures: u64, delay: Duration) {
    let delay_ms = delay.as_millis() as u64;
    match e {
        ConnectionError::ConnectionRefused(
            code @ (ConnectReturnCode::BadUserNamePassword | ConnectReturnCode::NotAuthorized),
        ) => tracing::error!(
            ?code,
            retry_in_ms = delay_ms,
            "mqtt: the registry refused this bench's credentials (token revoked or unknown); check provider_id and token"
        ),
        ConnectionError::ConnectionRefused(code @ ConnectReturnCode::ServiceUnavailable) => {
            tracing::warn!(
                ?code,
                retry_in_ms = delay_ms,
                "mqtt: the broker cannot take this bench now (the registry's broker holds its most clients, or its token store is unavailable); retrying"
            )
        }
        ConnectionError::ConnectionRefused(code) => tracing::error!(
            ?code,
            retry_in_ms = delay_ms,
            "mqtt: the broker refused the connection (check provider_id and token)"
        ),
        // The registry's embedded broker (rumqttd) refuses a login by
        // closing the connection without a CONNACK: a broker that took the
        // TCP connection and closed it before answering the CONNECT.
        ConnectionError::MqttState(StateError::ConnectionAborted) if !was_connected => {
            tracing::error!(
                attempts = failures,
                retry_in_ms = delay_ms,
                "mqtt: the registry refused this bench's credentials (token revoked or unknown): the broker closed the connection at login; check provider_id and token"
            )
        }
        _ if was_connected => {
            tracing::warn!(retry_in_ms = delay_ms, "mqtt: connection lost: {e}")
        }
        // The first failure and then about once a minute at the capped rate.
        _ if failures == 1 || failures.is_multiple_of(6) => tracing::warn!(
            attempts = failures,
            retry_in_ms = delay_ms,
            "mqtt: broker unreachable: {e}"
        ),
        _ => tracing::debug!(attempts = failures, "mqtt: broker unreachable: {e}"),
    }
}

// ---------------------------------------------------------------------------
// The publisher task.

struct Publisher {
    client: AsyncClient,
    cfg: LinkConfig,
    state: Arc<LinkState>,
    tracker: Arc<Mutex<AckTracker>>,
    source: Arc<dyn LinkSource>,
    outbox: Outbox,
    updates_ready: Arc<Notify>,
    events_rx: mpsc::UnboundedReceiver<LinkEvent>,
    control_rx: mpsc::Receiver<Control>,
    heartbeat: watch::Receiver<u32>,
    stop_poll: watch::Sender<bool>,
    /// The last drain pass ended with nothing in flight and no error: every
    /// queued update not yet taken is in the outbox's memory (when it
    /// still follows), so the next pass need not read the table first.
    drained_clean: bool,
}

#[derive(Debug, thiserror::Error)]
enum PublishError {
    #[error("the event loop did not take the message within {SEND_TIMEOUT:?}")]
    SendTimeout,
    #[error("mqtt client: {0}")]
    Client(#[from] rumqttc::ClientError),
    #[error("no PUBACK")]
    NotAcknowledged,
    #[error("outbox: {0}")]
    Outbox(String),
}

fn hb_interval(seconds: u32) -> tokio::time::Interval {
    let period = Duration::from_secs(u64::from(seconds.max(1)));
    let mut i = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    i
}

async fn publisher_loop(mut p: Publisher) {
    let mut connected = false;
    let mut handshake_due = false;
    let mut drain_due = false;
    let mut heartbeat = hb_interval(*p.heartbeat.borrow());
    loop {
        if connected && handshake_due {
            match p.handshake().await {
                Ok(()) => {
                    handshake_due = false;
                    drain_due = true;
                    // Health at once: the registration carries none, and
                    // the first timed heartbeat is an interval away.
                    if let Err(e) = p.send_heartbeat().await {
                        tracing::debug!("mqtt: heartbeat not sent: {e}");
                    }
                    heartbeat = hb_interval(*p.heartbeat.borrow());
                }
                Err(e) => tracing::warn!("mqtt: announcing this provider failed, will retry: {e}"),
            }
        }
        let mut more = false;
        if connected && !handshake_due && drain_due {
            match p.drain_updates(None).await {
                Ok(Drained::Empty) => drain_due = false,
                Ok(Drained::More) => more = true,
                Err(e) => tracing::warn!(
                    "mqtt: publishing queued session updates failed, will retry: {e}"
                ),
            }
        }
        let retry = connected && (handshake_due || drain_due) && !more;
        tokio::select! {
            ctl = p.control_rx.recv() => {
                let Some(Control::Shutdown { deadline, done }) = ctl else { break };
                p.finish(connected && !handshake_due, deadline).await;
                let _ = done.send(());
                return;
            }
            ev = p.events_rx.recv() => match ev {
                Some(LinkEvent::Connected) => {
                    connected = true;
                    handshake_due = true;
                }
                Some(LinkEvent::Disconnected) => connected = false,
                None => break,
            },
            _ = p.updates_ready.notified() => drain_due = true,
            _ = heartbeat.tick() => {
                if connected && !handshake_due {
                    if let Err(e) = p.send_heartbeat().await {
                        tracing::debug!("mqtt: heartbeat not sent: {e}");
                    }
                }
            }
            Ok(()) = p.heartbeat.changed() => {
                let secs = *p.heartbeat.borrow();
                heartbeat = hb_interval(secs);
            }
            _ = tokio::time::sleep(Duration::from_secs(2)), if retry => {}
            // Another drain pass at once, after the other branches had
            // their chance.
            _ = std::future::ready(()), if more => {}
        }
    }
    let _ = p.stop_poll.send(true);
}

impl Publisher {
    fn topic(&self, kind: TopicKind) -> String {
        topic(&self.cfg.topic_prefix, &self.cfg.provider_id, kind)
    }

    /// After a ConnAck: subscribe, `online`, `register`.
    async fn handshake(&mut self) -> Result<(), PublishError> {
        let commands = self.topic(TopicKind::Commands);
        tokio::time::timeout(
            SEND_TIMEOUT,
            self.client.subscribe(commands, QoS::AtLeastOnce),
        )
        .await
        .map_err(|_| PublishError::SendTimeout)??;
        let online = status_envelope(&self.cfg, OnlineStatus::Online);
        self.publish_qos1(TopicKind::Status, true, online.to_bytes())
            .await?;
        let source = self.source.clone();
        let body = tokio::task::spawn_blocking(move || source.register_body())
            .await
            .map_err(|e| PublishError::Outbox(format!("register body: {e}")))?;
        let mut body = body;
        body.provider.boot_id = Some(self.cfg.boot_id.clone());
        let register = envelope(MessageType::Register, &body);
        self.publish_qos1(TopicKind::Register, false, register.to_bytes())
            .await?;
        self.state.registered.store(true, Ordering::SeqCst);
        tracing::info!(
            capabilities = body.capabilities.len(),
            "mqtt: online status and registration published"
        );
        Ok(())
    }

    /// Publish queued session updates oldest first, deleting each once
    /// acknowledged. Up to [`DRAIN_WINDOW`] publishes are in flight at
    /// once: while the oldest waits for its PUBACK, updates queued meanwhile
    /// (`updates_ready`) are read and sent behind it, so a session's final
    /// update does not wait for the round trip of its `running` one.
    /// Acknowledged rows are deleted off this task. After one read of the
    /// table to its end, updates queued meanwhile are taken from the
    /// outbox's memory ([`Outbox::followed_updates`]) instead of another
    /// read, in this pass and, after a clean pass, in the next.
    ///
    /// A pass ends when nothing is queued or in flight ([`Drained::Empty`]),
    /// or after [`DRAIN_PASS`] so heartbeats and control messages get their
    /// turn ([`Drained::More`]: call again). Stops sending at `deadline` if
    /// given. Errors: a publish not taken or not acknowledged (the rest
    /// stay queued for the next pass or connection).
    async fn drain_updates(
        &mut self,
        deadline: Option<tokio::time::Instant>,
    ) -> Result<Drained, PublishError> {
        let pass_end = tokio::time::Instant::now() + DRAIN_PASS;
        let mut after = 0;
        // Read the table (and start following) unless the last pass left
        // nothing behind; then take what was queued since from memory.
        let mut synced = std::mem::take(&mut self.drained_clean);
        let mut in_flight: VecDeque<(i64, String, String, InFlight)> = VecDeque::new();
        let mut delivered: Vec<i64> = Vec::new();
        let result = 'pass: loop {
            let now = tokio::time::Instant::now();
            let sending = deadline.is_none_or(|d| now < d) && now < pass_end;
            if sending && in_flight.len() < DRAIN_WINDOW {
                let room = DRAIN_WINDOW - in_flight.len();
                let followed = if synced {
                    self.outbox.followed_updates(after, room)
                } else {
                    None
                };
                let batch = match followed {
                    Some(rows) => Ok(rows),
                    None => {
                        let outbox = self.outbox.clone();
                        synced = true;
                        tokio::task::spawn_blocking(move || {
                            outbox.follow_updates_after(after, room)
                        })
                        .await
                        .map_err(|e| PublishError::Outbox(e.to_string()))
                        .and_then(|r| r.map_err(|e| PublishError::Outbox(e.to_string())))
                    }
                };
                let batch = match batch {
                    Ok(b) => b,
                    Err(e) => break 'pass Err(e),
                };
                for update in batch {
                    after = update.seq;
                    let mut update = update;
                    if update.payload.len() > MAX_SESSION_UPDATE_BYTES {
                        // Queued by an older version, or larger than the
                        // bounds allow: sent as it is, a broker could drop
                        // the connection on every reconnect. Rewrite it
                        // shorter, or drop it.
                        match self.rewrite_oversized(&update).await {
                            Some(payload) => update.payload = payload,
                            None => continue,
                        }
                    }
                    match self
                        .send_qos1(TopicKind::Results, false, update.payload)
                        .await
                    {
                        Ok(p) => in_flight.push_back((
                            update.seq,
                            update.message_id,
                            update.session_id,
                            p,
                        )),
                        Err(e) => break 'pass Err(e),
                    }
                }
            }
            let Some((seq, message_id, session_id, mut pending)) = in_flight.pop_front() else {
                break if sending {
                    Ok(Drained::Empty)
                } else {
                    Ok(Drained::More)
                };
            };
            let can_refill = sending && in_flight.len() < DRAIN_WINDOW;
            tokio::select! {
                acked = tokio::time::timeout(ACK_TIMEOUT, &mut pending.acked) => {
                    if !matches!(acked, Ok(Ok(()))) {
                        lock(&self.tracker).abort(pending.id);
                        break 'pass Err(PublishError::NotAcknowledged);
                    }
                    tracing::debug!(%message_id, %session_id, "mqtt: session update delivered");
                    delivered.push(seq);
                    // Others acknowledged meanwhile.
                    while let Some(next) = in_flight.front_mut() {
                        if next.3.acked.try_recv().is_err() {
                            break;
                        }
                        if let Some((seq, message_id, session_id, _)) = in_flight.pop_front() {
                            tracing::debug!(%message_id, %session_id, "mqtt: session update delivered");
                            delivered.push(seq);
                        }
                    }
                    self.forget_delivered(std::mem::take(&mut delivered));
                }
                _ = self.updates_ready.notified(), if can_refill => {
                    in_flight.push_front((seq, message_id, session_id, pending));
                }
            }
        };
        if result.is_err() {
            let mut tracker = lock(&self.tracker);
            for (_, _, _, p) in &in_flight {
                tracker.abort(p.id);
            }
        }
        self.forget_delivered(delivered);
        // Nothing taken is left unacknowledged unless the pass failed.
        self.drained_clean = result.is_ok();
        result
    }

    /// A queued update larger than [`MAX_SESSION_UPDATE_BYTES`]: shortened
    /// ([`shrink_queued`]) and stored so, returning the new payload; or,
    /// when it cannot be shortened enough, deleted from the outbox (logged
    /// as an error with its session) and `None`. Either way it is never
    /// sent at its old size.
    async fn rewrite_oversized(&self, update: &QueuedUpdate) -> Option<Vec<u8>> {
        let outbox = self.outbox.clone();
        let queued = update.clone();
        let outcome = tokio::task::spawn_blocking(move || {
            match shrink_queued(&queued.payload, MAX_SESSION_UPDATE_BYTES) {
                Some(payload) => outbox
                    .replace_update_payload(queued.seq, &payload)
                    .map(|()| Some(payload)),
                None => outbox.drop_update(queued.seq).map(|()| None),
            }
        })
        .await;
        match outcome {
            Ok(Ok(Some(payload))) => {
                tracing::error!(
                    message_id = %update.message_id,
                    session_id = %update.session_id,
                    size_bytes = update.payload.len(),
                    new_size_bytes = payload.len(),
                    "mqtt: a queued session update was larger than {MAX_SESSION_UPDATE_BYTES} bytes; its error message and result summary were shortened"
                );
                Some(payload)
            }
            Ok(Ok(None)) => {
                tracing::error!(
                    message_id = %update.message_id,
                    session_id = %update.session_id,
                    size_bytes = update.payload.len(),
                    "mqtt: a queued session update is larger than {MAX_SESSION_UPDATE_BYTES} bytes and cannot be shortened; dropped (the registry ends the session at its deadline)"
                );
                None
            }
            Ok(Err(e)) => {
                tracing::error!(
                    message_id = %update.message_id,
                    "outbox: cannot rewrite an oversized session update, skipped for now: {e}"
                );
                None
            }
            Err(e) => {
                tracing::error!("outbox: rewriting an oversized session update failed: {e}");
                None
            }
        }
    }

    /// Delete acknowledged update rows on a blocking thread, without making
    /// the publisher wait (a failed delete only means a resend, which the
    /// registry de-duplicates).
    fn forget_delivered(&self, seqs: Vec<i64>) {
        if seqs.is_empty() {
            return;
        }
        let outbox = self.outbox.clone();
        let updates_ready = self.updates_ready.clone();
        tokio::task::spawn_blocking(move || match outbox.remove_updates(&seqs) {
            // A copy the registry asked for (`session_sync`) while the
            // original was in flight was queued: send it now, not with the
            // next unrelated update.
            Ok(requeued) if requeued > 0 => updates_ready.notify_one(),
            Ok(_) => {}
            Err(e) => tracing::warn!("outbox: cannot delete acknowledged session updates: {e}"),
        });
    }

    async fn send_heartbeat(&mut self) -> Result<(), PublishError> {
        let source = self.source.clone();
        let mut body = tokio::task::spawn_blocking(move || source.heartbeat_body())
            .await
            .map_err(|e| PublishError::Outbox(format!("heartbeat body: {e}")))?;
        body.boot_id = Some(self.cfg.boot_id.clone());
        let env = envelope(MessageType::Heartbeat, &body);
        tokio::time::timeout(
            SEND_TIMEOUT,
            self.client.publish(
                self.topic(TopicKind::Heartbeat),
                QoS::AtMostOnce,
                false,
                env.to_bytes(),
            ),
        )
        .await
        .map_err(|_| PublishError::SendTimeout)??;
        Ok(())
    }

    /// One QoS 1 publish, waiting for its PUBACK.
    async fn publish_qos1(
        &mut self,
        kind: TopicKind,
        retain: bool,
        payload: Vec<u8>,
    ) -> Result<(), PublishError> {
        let pending = self.send_qos1(kind, retain, payload).await?;
        self.await_ack(pending).await
    }

    /// Hand one QoS 1 publish to the event loop without waiting for its
    /// PUBACK; [`Self::await_ack`] waits for it.
    async fn send_qos1(
        &mut self,
        kind: TopicKind,
        retain: bool,
        payload: Vec<u8>,
    ) -> Result<InFlight, PublishError> {
        let (id, acked) = lock(&self.tracker).begin();
        let send = tokio::time::timeout(
            SEND_TIMEOUT,
            self.client
                .publish(self.topic(kind), QoS::AtLeastOnce, retain, payload),
        )
        .await;
        match send {
            Ok(Ok(())) => Ok(InFlight { id, acked }),
            Ok(Err(e)) => {
                lock(&self.tracker).abort(id);
                Err(e.into())
            }
            Err(_) => {
                // Not taken: the cancelled send left nothing behind.
                lock(&self.tracker).abort(id);
                Err(PublishError::SendTimeout)
            }
        }
    }

    /// Wait up to [`ACK_TIMEOUT`] for the PUBACK of `pending`.
    async fn await_ack(&self, pending: InFlight) -> Result<(), PublishError> {
        match tokio::time::timeout(ACK_TIMEOUT, pending.acked).await {
            Ok(Ok(())) => Ok(()),
            _ => {
                lock(&self.tracker).abort(pending.id);
                Err(PublishError::NotAcknowledged)
            }
        }
    }

    /// Shutdown: flush queued updates, publish `offline`, disconnect.
    async fn finish(&mut self, connected: bool, deadline: tokio::time::Instant) {
        if connected {
            let flush = async {
                loop {
                    match self.drain_updates(Some(deadline)).await {
                        Ok(Drained::Empty) => return Ok(()),
                        Ok(Drained::More) if tokio::time::Instant::now() < deadline => {}
                        Ok(Drained::More) => return Err(PublishError::SendTimeout),
                        Err(e) => return Err(e),
                    }
                }
            };
            if let Err(e) = tokio::time::timeout_at(deadline, flush)
                .await
                .unwrap_or(Err(PublishError::SendTimeout))
            {
                tracing::warn!("mqtt: not every session update went out before shutdown ({e}); they stay queued for the next start");
            }
            let offline = status_envelope(&self.cfg, OnlineStatus::Offline);
            match tokio::time::timeout_at(
                deadline,
                self.publish_qos1(TopicKind::Status, true, offline.to_bytes()),
            )
            .await
            {
                Ok(Ok(())) => tracing::info!("mqtt: offline status published"),
                _ => tracing::warn!(
                    "mqtt: could not publish the offline status; the broker publishes the LWT (offline) when it notices the connection is gone"
                ),
            }
            let _ = tokio::time::timeout(Duration::from_secs(1), self.client.disconnect()).await;
            // Let the poll task write the DISCONNECT packet.
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.stop_poll.send(true);
    }
}
