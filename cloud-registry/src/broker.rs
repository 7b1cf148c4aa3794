//! The embedded MQTT broker (rumqttd 0.20), for a single-machine lab
//! (`[mqtt] mode = "embedded"`).
//!
//! # Who may connect
//! Every connection must log in (anonymous connections are refused):
//! - the registry's own client, with a user name from the configuration and
//!   a random password made at each start (never written anywhere);
//! - a provider: user name = client id = provider id, password = that
//!   provider's bearer token (role `provider`, principal = provider id),
//!   checked against the token store;
//! - an `admin` / `super_admin` token holder with its principal as user name
//!   (debugging with `mosquitto_sub`).
//!
//! # Per-topic authorization: the gate
//! rumqttd 0.20's only hook is the connect-time auth handler; it has no
//! per-topic authorization for PUBLISH or SUBSCRIBE (its
//! `validate-tenant-prefix` feature needs TLS client certificates and a
//! `/tenants/{tenant}/` scheme). So rumqttd listens on a loopback port and
//! accepts only a per-start secret, and the public address is the gate of
//! [`crate::broker_gate`]: it checks the login ([`allow_login`]), then
//! confines a provider to its own topics (a foreign PUBLISH closes the
//! connection, a foreign SUBSCRIBE filter gets 0x80, a foreign will is
//! refused). Admins and the registry pass unchecked; the registry's client
//! connects to rumqttd directly ([`EmbeddedBroker::internal_addr`]). The
//! registry also accepts a message on `…/providers/{p}/…` only when its
//! body's `provider_id` is `{p}` (see [`crate::mqtt`]).
//!
//! # Latency: no Nagle
//! rumqttd 0.20 accepts connections without setting `TCP_NODELAY`, so a
//! small packet it writes while an earlier one is still unacknowledged
//! waits for the peer's delayed ACK (about 40 ms on Linux). Every command
//! and result would pay that. Accepted sockets inherit `TCP_NODELAY` from
//! their listening socket on Linux, so once rumqttd listens, [`start`]
//! finds that socket among the process's descriptors and sets it there
//! (see [`disable_nagle_on_listener`]), before any client connects.
//!
//! [`start`]: EmbeddedBroker::start
//!
//! # Revoked providers
//! rumqttd checks a login only at connect and has no call to close a
//! client's connection. [`run_revocation_watch`] looks every
//! [`REVOCATION_WATCH_EVERY`] for providers whose tokens are all revoked;
//! for each new one it connects once under the provider's client id (with
//! the registry's login): rumqttd then closes the provider's connection (a
//! client-id takeover), and the bench's reconnection is refused at login.
//!
//! # Lifetime
//! rumqttd 0.20 has no stop: its router and server threads live until the
//! process exits. [`EmbeddedBroker`] therefore only reports where it
//! listens; stopping the registry disconnects the registry's client.

use std::collections::{HashMap, HashSet};
use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use rumqttc::mqttbytes::v4::ConnectReturnCode;
use rumqttd::{Broker, Config, ConnectionSettings, RouterConfig, ServerSettings};
use sha2::{Digest, Sha256};
use shared_protocol::api::Role;

use crate::auth::{Authenticator, TokenLookup};
use crate::broker_gate::Gate;
pub use crate::broker_gate::{Access, GateStats};

/// How often [`run_revocation_watch`] looks for revoked providers.
pub const REVOCATION_WATCH_EVERY: Duration = Duration::from_secs(1);

/// Watch for providers whose tokens have all been revoked (through the
/// API or `cloud-registry token revoke`) until `stop` turns true. Each new
/// one is logged and, with the embedded broker (`kick`: its address and
/// the registry's login), its MQTT connection is closed (see the module
/// docs). Its actions are refused meanwhile by the sessions module (403
/// `provider_credentials_revoked`), whatever the broker.
pub async fn run_revocation_watch(
    db: crate::db::Db,
    kick: Option<(SocketAddr, RegistryLogin)>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let mut known: Option<HashSet<String>> = None;
    loop {
        let revoked = db
            .read(|c| crate::auth::revoked_providers_sync(c))
            .await
            .ok()
            .and_then(Result::ok);
        if let Some(now) = revoked {
            let now: HashSet<String> = now.into_iter().collect();
            // Those revoked before the registry started cannot be
            // connected (their logins are refused): nothing to close.
            if let Some(before) = &known {
                for provider_id in now.difference(before) {
                    tracing::warn!(
                        provider_id,
                        "the provider's tokens are revoked: its actions are refused and its MQTT connection is closed"
                    );
                    if let Some((addr, login)) = &kick {
                        if !close_connection(*addr, login, provider_id).await {
                            tracing::warn!(
                                provider_id,
                                "could not close the MQTT connection of a revoked provider"
                            );
                        }
                    }
                }
            }
            known = Some(now);
        }
        tokio::select! {
            _ = tokio::time::sleep(REVOCATION_WATCH_EVERY) => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Close the connection of `client_id` on the embedded broker at `addr`
/// by connecting under its client id (rumqttd closes the older
/// connection), then leaving. False when the broker did not accept.
async fn close_connection(addr: SocketAddr, login: &RegistryLogin, client_id: &str) -> bool {
    use rumqttc::{AsyncClient, Event, MqttOptions, Packet};
    let mut opts = MqttOptions::new(client_id, addr.ip().to_string(), addr.port());
    opts.set_credentials(login.username.clone(), login.password.clone());
    opts.set_clean_session(true);
    opts.set_keep_alive(Duration::from_secs(5));
    let (client, mut events) = AsyncClient::new(opts, 8);
    let connected = tokio::time::timeout(Duration::from_secs(3), async {
        loop {
            match events.poll().await {
                Ok(Event::Incoming(Packet::ConnAck(_))) => return true,
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    })
    .await
    .unwrap_or(false);
    let _ = client.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_millis(500), async {
        while events.poll().await.is_ok() {}
    })
    .await;
    connected
}

/// Why the embedded broker did not start.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("embedded MQTT broker cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the broker thread: {0}")]
    Thread(std::io::Error),
}

/// Login of the registry's own MQTT client on the embedded broker.
#[derive(Debug, Clone)]
pub struct RegistryLogin {
    pub username: String,
    pub password: String,
}

/// A running embedded broker: the gate on the public address and rumqttd
/// behind it on loopback.
#[derive(Debug, Clone)]
pub struct EmbeddedBroker {
    addr: SocketAddr,
    internal: SocketAddr,
    login: RegistryLogin,
    stats: Arc<GateStats>,
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Whether a client may log in to the embedded broker, and to what: the
/// registry's own client with its per-start secret ([`Access::Full`]), a
/// provider with its own token and its provider id as both user name and
/// client id ([`Access::Provider`]), or an admin ([`Access::Full`]). The
/// token is looked up in the store at every connect, so one created or
/// revoked with the CLI while the registry runs counts at once. `Err`
/// says why not: the CONNACK return code (2 for a provider's client id
/// that is not its provider id, 5 for a token of a role that cannot log
/// in, 3 when the token store cannot be read, 4 otherwise) and words for
/// the log (never the secret).
pub(crate) async fn allow_login(
    auth: &Authenticator,
    registry_user: &str,
    registry_password_hash: &[u8; 32],
    client_id: &str,
    username: &str,
    password: &str,
) -> Result<Access, (ConnectReturnCode, String)> {
    use ConnectReturnCode::{BadClientId, BadUserNamePassword, NotAuthorized, ServiceUnavailable};
    if username == registry_user {
        // Compare digests: equal length, no early exit on the secret.
        return if &digest(password) == registry_password_hash {
            Ok(Access::Full)
        } else {
            Err((
                BadUserNamePassword,
                "wrong secret for the registry's own client".into(),
            ))
        };
    }
    match auth.look_up_stored(password).await {
        TokenLookup::Valid(p) if p.role == Role::Provider => {
            if p.name != username {
                Err((BadUserNamePassword, format!(
                    "the token belongs to provider `{}`, not to user name `{username}` (set provider_id to the token's provider)",
                    p.name
                )))
            } else if client_id != username {
                Err((
                    BadClientId,
                    format!("client id `{client_id}` is not the provider id `{username}`"),
                ))
            } else {
                Ok(Access::Provider(p.name))
            }
        }
        TokenLookup::Valid(p) if matches!(p.role, Role::Admin | Role::SuperAdmin) => {
            if p.name == username {
                Ok(Access::Full)
            } else {
                Err((
                    BadUserNamePassword,
                    format!(
                        "the {} token belongs to `{}`, not to user name `{username}`",
                        p.role, p.name
                    ),
                ))
            }
        }
        TokenLookup::Valid(p) => Err((
            NotAuthorized,
            format!(
                "a {} token (of `{}`) cannot log in to the broker: a bench needs a provider token",
                p.role, p.name
            ),
        )),
        TokenLookup::Revoked { principal } => Err((
            BadUserNamePassword,
            format!("the token was revoked (it belonged to `{principal}`)"),
        )),
        TokenLookup::Unknown => Err((
            BadUserNamePassword,
            "unknown token (not created by this registry)".into(),
        )),
        TokenLookup::Unreadable(e) => Err((
            ServiceUnavailable,
            format!("the token store cannot be read: {e}"),
        )),
    }
}

impl EmbeddedBroker {
    /// Start the broker: rumqttd on a free loopback port, and the gate
    /// ([`crate::broker_gate`]) on `listen` (port 0: a free port is
    /// picked), which checks logins against `auth` and confines each
    /// provider to its own topics under `topic_prefix`. Returns once both
    /// listen (the registry's own client connecting, which
    /// [`crate::app::Registry::start`] waits for, proves rumqttd answers).
    /// `registry_user` is the user name the registry's client will use;
    /// `max_payload_bytes` bounds a packet (remaining length, bytes).
    /// `tls`: the gate accepts MQTT over TLS only, with this
    /// configuration (`None`: plain MQTT). Must run inside a tokio runtime
    /// (the gate is spawned on it; a blocking task of the runtime will do).
    ///
    /// Errors: `listen` is taken, no loopback port is free, no runtime,
    /// or the broker thread cannot be started.
    pub fn start(
        listen: SocketAddr,
        auth: Arc<Authenticator>,
        registry_user: &str,
        max_payload_bytes: usize,
        topic_prefix: &str,
        tls: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
        max_clients: usize,
    ) -> Result<Self, BrokerError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| BrokerError::Thread(std::io::Error::other(e)))?;
        // The public address is ours (the gate's): bound here, so a taken
        // port is reported clearly and port 0 resolves.
        let public = TcpListener::bind(listen).map_err(|source| BrokerError::Bind {
            addr: listen,
            source,
        })?;
        let addr = public.local_addr().map_err(|source| BrokerError::Bind {
            addr: listen,
            source,
        })?;
        public
            .set_nonblocking(true)
            .map_err(|source| BrokerError::Bind { addr, source })?;
        // rumqttd binds its own listener: find a free loopback port for it.
        let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
        let probe = TcpListener::bind(loopback).map_err(|source| BrokerError::Bind {
            addr: loopback,
            source,
        })?;
        let internal = probe.local_addr().map_err(|source| BrokerError::Bind {
            addr: loopback,
            source,
        })?;
        drop(probe);

        let login = RegistryLogin {
            username: registry_user.to_string(),
            password: crate::auth::new_token(),
        };
        let secret_hash = digest(&login.password);
        crate::broker_log::set_broker_packet_limit(max_payload_bytes);
        let mut connections = ConnectionSettings {
            connection_timeout_ms: 10_000,
            max_payload_size: max_payload_bytes,
            max_inflight_count: 200,
            auth: None,
            external_auth: None,
            dynamic_filters: true,
        };
        // Only the gate and the registry's client know the secret: a
        // process on this host that dials rumqttd's port directly gets in
        // with nothing else.
        connections.set_auth_handler(move |client_id: String, username: String, password: String| {
            async move {
                let ok = digest(&password) == secret_hash;
                if !ok {
                    tracing::warn!(client_id = %client_id, username = %username, "MQTT login on the broker's internal port refused: wrong secret");
                }
                ok
            }
        });
        let server = ServerSettings {
            name: "benchlink-v4".into(),
            listen: internal,
            tls: None,
            next_connection_delay_ms: 1,
            connections,
        };
        let config = Config {
            id: 0,
            router: RouterConfig {
                max_connections: crate::config::EMBEDDED_BROKER_MAX_CONNECTIONS,
                max_outgoing_packet_count: 200,
                max_segment_size: 10 * 1024 * 1024,
                max_segment_count: 10,
                custom_segment: None,
                initialized_filters: None,
                shared_subscriptions_strategy: Default::default(),
            },
            v4: Some(HashMap::from([("benchlink".to_string(), server)])),
            ..Default::default()
        };
        std::thread::Builder::new()
            .name("mqtt-broker".into())
            .spawn(move || {
                let mut broker = Broker::new(config);
                if let Err(e) = broker.start() {
                    tracing::error!(error = %e, "embedded MQTT broker stopped");
                }
            })
            .map_err(BrokerError::Thread)?;

        match disable_nagle_on_listener(internal, std::time::Duration::from_secs(5)) {
            Ok(()) => tracing::debug!(%internal, "TCP_NODELAY set on the broker's listener"),
            Err(e) => tracing::warn!(
                %internal,
                error = %e,
                "cannot set TCP_NODELAY on the broker's listener; small MQTT messages may wait ~40 ms"
            ),
        }
        let stats = Arc::new(GateStats::default());
        let gate = Arc::new(Gate {
            auth,
            registry_user: login.username.clone(),
            secret_hash,
            secret: login.password.clone(),
            internal,
            prefix: topic_prefix.to_string(),
            max_packet_bytes: max_payload_bytes,
            stats: stats.clone(),
            tls: tls.clone().map(tokio_rustls::TlsAcceptor::from),
            clients: Arc::new(tokio::sync::Semaphore::new(max_clients)),
            max_clients,
        });
        runtime.spawn(async move {
            match tokio::net::TcpListener::from_std(public) {
                Ok(listener) => gate.serve(listener).await,
                Err(e) => tracing::error!(error = %e, "the MQTT gate cannot listen"),
            }
        });
        tracing::info!(%addr, %internal, tls = tls.is_some(), max_clients, "embedded MQTT broker listening (provider topics isolated)");
        Ok(Self {
            addr,
            internal,
            login,
            stats,
        })
    }

    /// Where the broker listens for benches and admins (the gate).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// rumqttd's own loopback address, for the registry's client (with
    /// [`Self::registry_login`]); nothing else gets in there.
    pub fn internal_addr(&self) -> SocketAddr {
        self.internal
    }

    /// The login for the registry's own client.
    pub fn registry_login(&self) -> &RegistryLogin {
        &self.login
    }

    /// The gate's counters (connections, refusals).
    pub fn gate_stats(&self) -> Arc<GateStats> {
        self.stats.clone()
    }
}

/// Wait (up to `within`) for a listening TCP socket bound to `addr` to
/// appear among this process's descriptors (`/proc/self/fd`) and set
/// `TCP_NODELAY` on it, so that every connection it accepts has it too.
///
/// Errors: no such socket within `within` (rumqttd failed to bind), or the
/// option cannot be set. Linux only; elsewhere it reports Unsupported.
pub fn disable_nagle_on_listener(
    addr: SocketAddr,
    within: std::time::Duration,
) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + within;
    loop {
        if let Some(fd) = find_listener(addr)? {
            return nix::sys::socket::setsockopt(fd, nix::sys::socket::sockopt::TcpNoDelay, &true)
                .map_err(std::io::Error::from);
        }
        if std::time::Instant::now() >= deadline {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no listening socket on {addr} after {within:?}"),
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// The descriptor of this process's listening TCP socket bound to `addr`.
fn find_listener(addr: SocketAddr) -> std::io::Result<Option<std::os::fd::RawFd>> {
    use nix::sys::socket::{getsockname, getsockopt, sockopt, SockaddrStorage};
    if !cfg!(target_os = "linux") {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "finding the listener needs /proc/self/fd",
        ));
    }
    for entry in std::fs::read_dir("/proc/self/fd")? {
        let entry = entry?;
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<std::os::fd::RawFd>().ok())
        else {
            continue;
        };
        let is_socket = std::fs::read_link(entry.path())
            .map(|t| t.to_string_lossy().starts_with("socket:"))
            .unwrap_or(false);
        if !is_socket {
            continue;
        }
        let bound = getsockname::<SockaddrStorage>(fd).ok().and_then(|a| {
            a.as_sockaddr_in()
                .map(|v4| SocketAddr::from((std::net::Ipv4Addr::from(v4.ip()), v4.port())))
                .or_else(|| {
                    a.as_sockaddr_in6()
                        .map(|v6| SocketAddr::from((v6.ip(), v6.port())))
                })
        });
        if bound == Some(addr) && getsockopt(fd, sockopt::AcceptConn).unwrap_or(false) {
            return Ok(Some(fd));
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_listener_found_by_address_passes_no_delay_to_accepted_sockets() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        assert_eq!(
            find_listener(addr).unwrap(),
            Some(listener.as_raw_fd()),
            "the listener is found by its address"
        );
        disable_nagle_on_listener(addr, std::time::Duration::from_secs(1)).unwrap();
        let _client = std::net::TcpStream::connect(addr).unwrap();
        let (accepted, _) = listener.accept().unwrap();
        assert!(
            accepted.nodelay().unwrap(),
            "accepted socket inherits TCP_NODELAY"
        );
    }

    #[tokio::test]
    async fn a_refused_login_says_why() {
        let dir = tempfile::tempdir().unwrap();
        let db = crate::db::Db::open(&dir.path().join("r.sqlite3"), |c| crate::auth::migrate(c))
            .unwrap();
        let auth = Authenticator::load(db).await.unwrap();
        let provider = auth.create_token(Role::Provider, "prov-1").await.unwrap();
        let viewer = auth.create_token(Role::Viewer, "viewer-1").await.unwrap();
        let gone = auth.create_token(Role::Provider, "prov-2").await.unwrap();
        auth.revoke("prov-2").await.unwrap();
        let hash = digest("registry-secret");
        let login = |client: &'static str, user: &'static str, token: String| {
            let auth = auth.clone();
            async move { allow_login(&auth, "registry", &hash, client, user, &token).await }
        };
        assert_eq!(
            login("prov-1", "prov-1", provider.clone()).await,
            Ok(Access::Provider("prov-1".into()))
        );
        let why = |r: Result<Access, (ConnectReturnCode, String)>| r.unwrap_err().1;
        assert!(why(login("x", "x", "blk_nope".into()).await).contains("unknown token"));
        assert!(why(login("prov-2", "prov-2", gone).await).contains("revoked"));
        assert!(why(login("viewer-1", "viewer-1", viewer).await).contains("needs a provider token"));
        assert!(why(login("prov-9", "prov-9", provider.clone()).await)
            .contains("belongs to provider `prov-1`"));
        let wrong_id = login("other", "prov-1", provider).await.unwrap_err();
        assert_eq!(wrong_id.0, ConnectReturnCode::BadClientId);
        assert!(wrong_id.1.contains("client id `other`"));
        assert!(why(login("registry", "registry", "wrong".into()).await).contains("wrong secret"));
    }

    #[test]
    fn no_listener_on_an_address_is_a_clear_timeout() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = taken.local_addr().unwrap();
        drop(taken);
        let err =
            disable_nagle_on_listener(addr, std::time::Duration::from_millis(20)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::TimedOut);
    }
}
