//! The embedded broker's public listener: an MQTT-aware gate in front of
//! rumqttd that confines each provider to its own topics
//! (docs/architecture.md "Control plane (MQTT)").
//!
//! rumqttd 0.20 checks a login only at connect, so it listens on a
//! loopback port of its own and accepts only the gate and the registry's
//! client (both with a per-start secret). Each connection to the public
//! address is handled here:
//! 1. the CONNECT is read (MQTT 3.1.1, rumqttc's `mqttbytes` codec) and
//!    the login checked ([`crate::broker`]'s `allow_login`); a refusal is
//!    answered with a CONNACK `bad user name or password` (a will outside
//!    the provider's own `status` topic: `not authorized`);
//! 2. the CONNECT is relayed to rumqttd with the secret in place of the
//!    token; from then on bytes flow both ways, framed but not re-encoded;
//! 3. from a provider, a PUBLISH outside its own edge→cloud topics
//!    ([`may_publish`]) closes the connection (MQTT 3.1.1 §3.3.5 leaves a
//!    server that refuses a publish only that or a silent acknowledgement);
//!    a SUBSCRIBE filter that reaches beyond `{prefix}/providers/{own id}`
//!    ([`may_subscribe`]) gets return code 0x80 in the SUBACK while the
//!    others are subscribed.
//!
//! With `[mqtt] tls_cert_file` / `tls_key_file` the gate speaks MQTT over
//! TLS only (docs/install-registry.md "TLS"): it terminates TLS (the
//! handshake within [`CONNECT_TIMEOUT`]) and relays plain MQTT to rumqttd
//! on loopback.
//!
//! Admins and the registry's own login pass unchecked. Every refusal is
//! logged (`WARN`, with client id and topic) and counted ([`GateStats`],
//! on `/metrics`). Both legs set `TCP_NODELAY`; the hot path (PUBLISH
//! relay) reads the topic in place and allocates nothing per packet.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::BytesMut;
use rumqttc::mqttbytes::v4::{
    ConnAck, Connect, ConnectReturnCode, Login, Packet, SubAck, Subscribe, SubscribeReasonCode,
};
use rumqttc::mqttbytes::{self, PacketType, Protocol};
use shared_protocol::mqtt::{parse_topic, TopicKind};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::tcp::OwnedWriteHalf;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, Semaphore};
use tokio_rustls::TlsAcceptor;

use crate::auth::Authenticator;

/// How long a new connection may take to send its CONNECT (and, over TLS,
/// as long again to complete its handshake first).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// What a logged-in client may do on the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Access {
    /// The registry's own client or an admin: every topic.
    Full,
    /// A provider: only its own topics (see [`may_publish`],
    /// [`may_subscribe`]).
    Provider(String),
}

/// Counters of the gate, for `/metrics`.
#[derive(Debug, Default)]
pub struct GateStats {
    /// Connections accepted on the public address.
    pub connections: AtomicU64,
    /// CONNECTs refused: bad or missing login, or not MQTT 3.1.1.
    pub refused_logins: AtomicU64,
    /// CONNECTs refused for a will outside the provider's own topics.
    pub refused_wills: AtomicU64,
    /// PUBLISHes refused (each closed its connection).
    pub refused_publishes: AtomicU64,
    /// SUBSCRIBE filters answered with 0x80.
    pub refused_subscriptions: AtomicU64,
    /// Connections refused because [`Gate::clients`] had no permit left.
    pub refused_capacity: AtomicU64,
}

/// Whether provider `provider_id` may publish on `topic`: only its own
/// `status`, `register`, `heartbeat`, `results` and `frames` under
/// `prefix` (not `commands`, which only the registry writes).
pub fn may_publish(prefix: &str, provider_id: &str, topic: &str) -> bool {
    matches!(parse_topic(prefix, topic), Ok((p, kind)) if p == provider_id && kind != TopicKind::Commands)
}

/// Whether provider `provider_id` may subscribe to `filter`: only filters
/// under `{prefix}/providers/{provider_id}` (its own topics, wildcards
/// allowed below that level). `#`, `+` at or above the provider level,
/// shared subscriptions and anything outside the prefix are refused.
pub fn may_subscribe(prefix: &str, provider_id: &str, filter: &str) -> bool {
    let rest = filter
        .strip_prefix(prefix)
        .and_then(|r| r.strip_prefix("/providers/"))
        .and_then(|r| r.strip_prefix(provider_id));
    matches!(rest, Some(r) if r.is_empty() || r.starts_with('/'))
}

/// What the gate needs to check and relay connections.
pub(crate) struct Gate {
    pub auth: Arc<Authenticator>,
    pub registry_user: String,
    /// SHA-256 of the per-start secret (the registry's password, and the
    /// password the gate puts into the CONNECTs it relays).
    pub secret_hash: [u8; 32],
    pub secret: String,
    /// rumqttd's loopback address.
    pub internal: SocketAddr,
    pub prefix: String,
    /// Largest packet a client may send, bytes (remaining length).
    pub max_packet_bytes: usize,
    pub stats: Arc<GateStats>,
    /// TLS on the public address (`None`: plain MQTT).
    pub tls: Option<TlsAcceptor>,
    /// One permit per client connection the gate may hold at once
    /// (`[mqtt] max_clients`, [`crate::config::gate_client_cap`]).
    pub clients: Arc<Semaphore>,
    /// The permits `clients` started with, for the log.
    pub max_clients: usize,
}

/// How a relayed connection ended, seen from the client's side.
enum UpEnd {
    /// The client closed its side (after a DISCONNECT, or vanished).
    ClientClosed,
    /// The gate closes it: a refused packet, a protocol error, a packet
    /// over the limit, or a broken socket.
    Closed,
}

/// SUBSCRIBEs sent on with some filters removed, by packet id: which of
/// the client's filters were kept, in its order.
type Pending = Arc<Mutex<HashMap<u16, Vec<bool>>>>;

impl Gate {
    /// Accept connections on `listener` until the runtime stops, each in
    /// its own task.
    pub async fn serve(self: Arc<Self>, listener: TcpListener) {
        let mut last_full_warning = None;
        loop {
            let (stream, peer) = match listener.accept().await {
                Ok(s) => s,
                Err(e) => {
                    // Out of descriptors and the like: wait, then go on.
                    tracing::warn!(error = %e, "MQTT gate cannot accept a connection");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = self.clients.clone().try_acquire_owned() else {
                self.refuse_over_capacity(stream, peer, &mut last_full_warning);
                continue;
            };
            self.stats.connections.fetch_add(1, Ordering::Relaxed);
            let gate = self.clone();
            tokio::spawn(async move {
                gate.connection(stream, peer).await;
                drop(permit);
            });
        }
    }

    /// A connection beyond the client cap: it is answered CONNACK 3
    /// (server unavailable) without its CONNECT being read (over TLS after
    /// the handshake, within the CONNECT timeout), its side is shut, and
    /// what it sends is drained for at most 2 s (so the close is not a
    /// reset that could discard the CONNACK). A warning is logged at most
    /// once a minute.
    fn refuse_over_capacity(
        &self,
        stream: TcpStream,
        peer: SocketAddr,
        last_warning: &mut Option<std::time::Instant>,
    ) {
        self.stats.refused_capacity.fetch_add(1, Ordering::Relaxed);
        let tls = self.tls.clone();
        tokio::spawn(async move {
            match tls {
                None => answer_server_unavailable(stream).await,
                Some(acceptor) => {
                    if let Ok(Ok(stream)) =
                        tokio::time::timeout(CONNECT_TIMEOUT, acceptor.accept(stream)).await
                    {
                        answer_server_unavailable(stream).await;
                    }
                }
            }
        });
        if last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(60)) {
            *last_warning = Some(std::time::Instant::now());
            tracing::warn!(
                %peer,
                max_clients = self.max_clients,
                refused = self.stats.refused_capacity.load(Ordering::Relaxed),
                "MQTT connection refused: the embedded broker holds its most clients \
                 (`[mqtt] max_clients`, or the file-descriptor limit: raise LimitNOFILE)"
            );
        }
    }

    async fn connection(self: Arc<Self>, client: TcpStream, peer: SocketAddr) {
        let _ = client.set_nodelay(true);
        match &self.tls {
            None => {
                let (rd, wr) = client.into_split();
                self.session(rd, wr, peer).await;
            }
            Some(acceptor) => {
                match tokio::time::timeout(CONNECT_TIMEOUT, acceptor.accept(client)).await {
                    Ok(Ok(stream)) => {
                        let (rd, wr) = tokio::io::split(stream);
                        self.session(rd, wr, peer).await;
                    }
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "MQTT TLS handshake failed; connection closed");
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "no TLS handshake within {CONNECT_TIMEOUT:?}");
                    }
                }
            }
        }
    }

    /// One client's connection (plain, or the TLS stream's halves): the
    /// login, then the relay both ways.
    async fn session<R, W>(self: Arc<Self>, mut client_rd: R, mut client_wr: W, peer: SocketAddr)
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let mut buf = BytesMut::with_capacity(4096);
        let connect = match tokio::time::timeout(
            CONNECT_TIMEOUT,
            read_connect(&mut client_rd, &mut buf, self.max_packet_bytes),
        )
        .await
        {
            Ok(Ok(c)) => c,
            Ok(Err(reason)) => {
                tracing::debug!(%peer, %reason, "MQTT connection closed before login");
                return;
            }
            Err(_) => {
                tracing::debug!(%peer, "no CONNECT within {CONNECT_TIMEOUT:?}");
                return;
            }
        };
        let access = match self.admit(&connect).await {
            Ok(a) => a,
            Err((code, reason)) => {
                tracing::warn!(%peer, client_id = %connect.client_id, %reason, "MQTT login refused: {reason}");
                let mut out = BytesMut::with_capacity(4);
                if ConnAck::new(code, false).write(&mut out).is_ok() {
                    let _ = client_wr.write_all(&out).await;
                }
                let _ = client_wr.shutdown().await;
                return;
            }
        };
        let client_id = connect.client_id.clone();
        let mut relayed = connect;
        if let Some(login) = relayed.login.as_mut() {
            *login = Login::new(login.username.clone(), self.secret.clone());
        }
        let mut first = BytesMut::with_capacity(relayed.size() + 8);
        if relayed.write(&mut first).is_err() {
            return;
        }
        let broker = match TcpStream::connect(self.internal).await {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(error = %e, internal = %self.internal, "the MQTT gate cannot reach the embedded broker");
                let mut out = BytesMut::with_capacity(4);
                if ConnAck::new(ConnectReturnCode::ServiceUnavailable, false)
                    .write(&mut out)
                    .is_ok()
                {
                    let _ = client_wr.write_all(&out).await;
                }
                return;
            }
        };
        let _ = broker.set_nodelay(true);
        let (broker_rd, mut broker_wr) = broker.into_split();
        if broker_wr.write_all(&first).await.is_err() {
            return;
        }
        let pending: Pending = Arc::default();
        let (inject_tx, inject_rx) = mpsc::unbounded_channel::<SubAck>();
        let up = self.up(
            client_rd,
            &mut broker_wr,
            buf,
            &access,
            &client_id,
            pending.clone(),
            inject_tx,
        );
        let down = down(broker_rd, client_wr, pending, inject_rx);
        tokio::pin!(down);
        tokio::select! {
            end = up => {
                if let UpEnd::ClientClosed = end {
                    // Let the broker see the DISCONNECT (or the loss)
                    // before the sockets close.
                    let _ = broker_wr.shutdown().await;
                    let _ = tokio::time::timeout(Duration::from_secs(2), &mut down).await;
                }
            }
            _ = &mut down => {}
        }
    }

    /// Check a CONNECT: the login (see `allow_login`), then a provider's
    /// will topic. `Err`: the CONNACK code and why, for the log.
    async fn admit(&self, c: &Connect) -> Result<Access, (ConnectReturnCode, String)> {
        if c.protocol != Protocol::V4 {
            self.stats.refused_logins.fetch_add(1, Ordering::Relaxed);
            return Err((
                ConnectReturnCode::RefusedProtocolVersion,
                "only MQTT 3.1.1 is spoken here".into(),
            ));
        }
        let Some(login) = &c.login else {
            self.stats.refused_logins.fetch_add(1, Ordering::Relaxed);
            return Err((
                ConnectReturnCode::BadUserNamePassword,
                "no user name and password (anonymous connections are refused)".into(),
            ));
        };
        let access = crate::broker::allow_login(
            &self.auth,
            &self.registry_user,
            &self.secret_hash,
            &c.client_id,
            &login.username,
            &login.password,
        )
        .await
        .inspect_err(|_| {
            self.stats.refused_logins.fetch_add(1, Ordering::Relaxed);
        })?;
        if let (Access::Provider(p), Some(will)) = (&access, &c.last_will) {
            if !may_publish(&self.prefix, p, &will.topic) {
                self.stats.refused_wills.fetch_add(1, Ordering::Relaxed);
                return Err((
                    ConnectReturnCode::NotAuthorized,
                    format!(
                        "will topic `{}` is not one of provider `{p}`'s topics",
                        will.topic
                    ),
                ));
            }
        }
        Ok(access)
    }

    /// Client → broker: frame each packet, check a provider's PUBLISH and
    /// SUBSCRIBE, pass the rest on unchanged (one write per read).
    #[allow(clippy::too_many_arguments)]
    async fn up(
        &self,
        mut client_rd: impl AsyncRead + Unpin,
        broker_wr: &mut OwnedWriteHalf,
        mut buf: BytesMut,
        access: &Access,
        client_id: &str,
        pending: Pending,
        inject: mpsc::UnboundedSender<SubAck>,
    ) -> UpEnd {
        let mut out = BytesMut::with_capacity(8 * 1024);
        loop {
            loop {
                let fixed = match mqttbytes::check(buf.iter(), self.max_packet_bytes) {
                    Ok(f) => f,
                    Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                    Err(mqttbytes::Error::PayloadSizeLimitExceeded(n)) => {
                        tracing::warn!(
                            target: "cloud_registry::broker",
                            client_id,
                            packet_bytes = n,
                            limit_bytes = self.max_packet_bytes,
                            "MQTT packet over the size limit; the embedded broker closed the client's connection"
                        );
                        return UpEnd::Closed;
                    }
                    Err(e) => {
                        tracing::debug!(client_id, error = %e, "malformed MQTT packet; connection closed");
                        return UpEnd::Closed;
                    }
                };
                let len = fixed.frame_length();
                let provider = match access {
                    Access::Provider(p) => p.as_str(),
                    Access::Full => {
                        out.extend_from_slice(&buf[..len]);
                        let _ = buf.split_to(len);
                        continue;
                    }
                };
                match fixed.packet_type() {
                    Ok(PacketType::Publish) => {
                        let topic = publish_topic(&buf[..len]).unwrap_or("");
                        if !may_publish(&self.prefix, provider, topic) {
                            self.stats.refused_publishes.fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                client_id,
                                topic,
                                "MQTT publish refused: not one of the provider's own topics; connection closed"
                            );
                            return UpEnd::Closed;
                        }
                        out.extend_from_slice(&buf[..len]);
                        let _ = buf.split_to(len);
                    }
                    Ok(PacketType::Subscribe) => {
                        let frame = buf.split_to(len).freeze();
                        let sub = match Subscribe::read(fixed, frame.clone()) {
                            Ok(s) => s,
                            Err(e) => {
                                tracing::debug!(client_id, error = %e, "malformed SUBSCRIBE; connection closed");
                                return UpEnd::Closed;
                            }
                        };
                        let kept: Vec<bool> = sub
                            .filters
                            .iter()
                            .map(|f| may_subscribe(&self.prefix, provider, &f.path))
                            .collect();
                        for (f, _) in sub.filters.iter().zip(&kept).filter(|(_, k)| !**k) {
                            self.stats
                                .refused_subscriptions
                                .fetch_add(1, Ordering::Relaxed);
                            tracing::warn!(
                                client_id,
                                filter = %f.path,
                                "MQTT subscription refused: beyond the provider's own topics"
                            );
                        }
                        if kept.iter().all(|k| *k) {
                            out.extend_from_slice(&frame);
                        } else if kept.iter().any(|k| *k) {
                            let filters = sub
                                .filters
                                .into_iter()
                                .zip(&kept)
                                .filter(|(_, k)| **k)
                                .map(|(f, _)| f)
                                .collect();
                            let narrowed = Subscribe {
                                pkid: sub.pkid,
                                filters,
                            };
                            lock(&pending).insert(sub.pkid, kept);
                            if narrowed.write(&mut out).is_err() {
                                return UpEnd::Closed;
                            }
                        } else {
                            let codes = vec![SubscribeReasonCode::Failure; kept.len()];
                            if inject.send(SubAck::new(sub.pkid, codes)).is_err() {
                                return UpEnd::Closed;
                            }
                        }
                    }
                    Ok(PacketType::Connect) => {
                        tracing::debug!(client_id, "a second CONNECT; connection closed");
                        return UpEnd::Closed;
                    }
                    _ => {
                        out.extend_from_slice(&buf[..len]);
                        let _ = buf.split_to(len);
                    }
                }
            }
            if !out.is_empty() {
                if broker_wr.write_all(&out).await.is_err() {
                    return UpEnd::Closed;
                }
                out.clear();
            }
            buf.reserve(4096);
            match client_rd.read_buf(&mut buf).await {
                Ok(0) => return UpEnd::ClientClosed,
                Ok(_) => {}
                Err(_) => return UpEnd::Closed,
            }
        }
    }
}

/// CONNACK 3 (server unavailable) on `stream`, then shut its side and
/// drain what the client sends, all within 2 s.
async fn answer_server_unavailable<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S) {
    let mut out = BytesMut::with_capacity(4);
    if ConnAck::new(ConnectReturnCode::ServiceUnavailable, false)
        .write(&mut out)
        .is_err()
    {
        return;
    }
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        stream.write_all(&out).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 512];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<_, std::io::Error>(())
    })
    .await;
}

fn lock(p: &Pending) -> std::sync::MutexGuard<'_, HashMap<u16, Vec<bool>>> {
    p.lock().unwrap_or_else(|e| e.into_inner())
}

/// Broker → client: bytes pass unchanged, except a SUBACK to a narrowed
/// SUBSCRIBE (0x80 put back where filters were removed) and the gate's own
/// SUBACKs (every filter refused).
async fn down(
    mut broker_rd: tokio::net::tcp::OwnedReadHalf,
    mut client_wr: impl AsyncWrite + Unpin,
    pending: Pending,
    mut inject: mpsc::UnboundedReceiver<SubAck>,
) {
    let mut buf = BytesMut::with_capacity(8 * 1024);
    let mut out = BytesMut::with_capacity(8 * 1024);
    loop {
        tokio::select! {
            read = broker_rd.read_buf(&mut buf) => match read {
                Ok(0) | Err(_) => {
                    // Send what is complete, then close the client's side.
                    let _ = client_wr.write_all(&buf).await;
                    let _ = client_wr.shutdown().await;
                    return;
                }
                Ok(_) => {}
            },
            Some(ack) = inject.recv() => {
                if ack.write(&mut out).is_err() {
                    return;
                }
            }
        }
        loop {
            // The broker only sends what it accepted: no size limit here.
            let fixed = match mqttbytes::check(buf.iter(), usize::MAX >> 1) {
                Ok(f) => f,
                Err(mqttbytes::Error::InsufficientBytes(_)) => break,
                Err(_) => return,
            };
            let len = fixed.frame_length();
            let rewrite =
                matches!(fixed.packet_type(), Ok(PacketType::SubAck)) && !lock(&pending).is_empty();
            if rewrite {
                let frame = buf.split_to(len).freeze();
                let Ok(Packet::SubAck(ack)) = Packet::read(&mut BytesMut::from(&frame[..]), len)
                else {
                    return;
                };
                match lock(&pending).remove(&ack.pkid) {
                    Some(kept) => {
                        let mut codes = ack.return_codes.into_iter();
                        let return_codes = kept
                            .iter()
                            .map(|k| {
                                if *k {
                                    codes.next().unwrap_or(SubscribeReasonCode::Failure)
                                } else {
                                    SubscribeReasonCode::Failure
                                }
                            })
                            .collect();
                        if SubAck::new(ack.pkid, return_codes).write(&mut out).is_err() {
                            return;
                        }
                    }
                    None => out.extend_from_slice(&frame),
                }
            } else {
                out.extend_from_slice(&buf[..len]);
                let _ = buf.split_to(len);
            }
        }
        if !out.is_empty() {
            if client_wr.write_all(&out).await.is_err() {
                return;
            }
            out.clear();
        }
        buf.reserve(4096);
    }
}

/// Read from `stream` until `buf` holds a whole first packet; it must be a
/// CONNECT. `Err`: why not, for the log.
async fn read_connect(
    stream: &mut (impl AsyncRead + Unpin),
    buf: &mut BytesMut,
    max_packet_bytes: usize,
) -> Result<Connect, String> {
    loop {
        match Packet::read(buf, max_packet_bytes) {
            Ok(Packet::Connect(c)) => return Ok(c),
            Ok(other) => return Err(format!("first packet is not a CONNECT: {other:?}")),
            Err(mqttbytes::Error::InsufficientBytes(_)) => {}
            Err(e) => return Err(e.to_string()),
        }
        match stream.read_buf(buf).await {
            Ok(0) => return Err("closed".into()),
            Ok(_) => {}
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// The topic of a whole PUBLISH frame, read in place: after the fixed
/// header (1 byte, then 1 to 4 bytes of remaining length), a 2-byte
/// big-endian length and that many bytes of UTF-8. `None`: malformed.
fn publish_topic(frame: &[u8]) -> Option<&str> {
    let mut at = 1;
    while *frame.get(at)? & 0x80 != 0 {
        at += 1;
    }
    at += 1;
    let len = usize::from(u16::from_be_bytes([*frame.get(at)?, *frame.get(at + 1)?]));
    let topic = frame.get(at + 2..at + 2 + len)?;
    std::str::from_utf8(topic).ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use rumqttc::mqttbytes::v4::Publish;
    use rumqttc::mqttbytes::QoS;

    const P: &str = "benchlink/v1";

    #[test]
    fn a_provider_publishes_only_on_its_own_edge_topics() {
        for kind in ["status", "register", "heartbeat", "results", "frames"] {
            assert!(may_publish(
                P,
                "bench-a",
                &format!("{P}/providers/bench-a/{kind}")
            ));
            assert!(!may_publish(
                P,
                "bench-b",
                &format!("{P}/providers/bench-a/{kind}")
            ));
        }
        assert!(!may_publish(
            P,
            "bench-a",
            &format!("{P}/providers/bench-a/commands")
        ));
        assert!(!may_publish(
            P,
            "bench-a",
            &format!("{P}/providers/bench-ab/status")
        ));
        assert!(!may_publish(
            P,
            "bench-a",
            &format!("{P}/providers/bench-a/status/x")
        ));
        assert!(!may_publish(P, "bench-a", "other/providers/bench-a/status"));
        assert!(!may_publish(P, "bench-a", ""));
    }

    #[test]
    fn a_provider_subscribes_only_below_its_own_id() {
        assert!(may_subscribe(
            P,
            "bench-a",
            &format!("{P}/providers/bench-a/commands")
        ));
        assert!(may_subscribe(
            P,
            "bench-a",
            &format!("{P}/providers/bench-a/#")
        ));
        assert!(may_subscribe(
            P,
            "bench-a",
            &format!("{P}/providers/bench-a/+")
        ));
        for f in [
            "#".to_string(),
            format!("{P}/#"),
            format!("{P}/providers/+/commands"),
            format!("{P}/providers/#"),
            format!("{P}/providers/bench-b/commands"),
            format!("{P}/providers/bench-ab/commands"),
            format!("$share/g/{P}/providers/bench-b/commands"),
            "+/v1/providers/bench-a/commands".to_string(),
        ] {
            assert!(!may_subscribe(P, "bench-a", &f), "{f}");
        }
    }

    #[test]
    fn the_topic_is_read_from_a_publish_frame_of_any_length() {
        for size in [0usize, 100, 200, 20_000, 3_000_000] {
            let topic = format!("{P}/providers/bench-a/results");
            let mut out = BytesMut::new();
            let mut publish = Publish::new(&topic, QoS::AtLeastOnce, vec![b'x'; size]);
            publish.pkid = 7;
            publish.write(&mut out).unwrap();
            assert_eq!(
                publish_topic(&out),
                Some(topic.as_str()),
                "payload {size} bytes"
            );
        }
        assert_eq!(publish_topic(&[0x30]), None);
        assert_eq!(publish_topic(&[0x30, 0x05, 0x00, 0x09, b'a']), None);
    }
}
