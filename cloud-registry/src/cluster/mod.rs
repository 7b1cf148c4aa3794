//! Replicas on one PostgreSQL schema (docs/scale.md "Replicas").
//!
//! The replica whose store writer holds the schema's advisory lock
//! ([`crate::app::schema_lock_key`]) is the leader: it runs the lease
//! engine, MQTT and the whole API. The others stand by ([`stand_by`]):
//! they forward every HTTP request to the leader's URL, which the leader
//! records in the `cluster_leader` row ([`record_leader`]), and ask for
//! the lock every `takeover_poll_ms`; the server lets the lock go when the
//! leader's session ends (the process stopped or was killed), and the
//! first standby to get it starts the registry on its own listener.
//! - [`ClusterConfig`] is `[cluster]`;
//! - [`forward`] is the standby's proxy.

mod forward;

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use serde::Deserialize;
use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::app::AppError;
use crate::sql::pg::PgConn;
use crate::sql::{params, Connection};

pub use forward::{FORWARDED_BY, SERVED_BY};

/// `[cluster]`: this registry as one of several replicas on one
/// PostgreSQL schema and one external broker.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterConfig {
    /// Run as a replica: stand by while another replica leads instead of
    /// refusing to start. Needs `[store] backend = "postgres"` and an
    /// external broker. Default false.
    pub enabled: bool,
    /// This replica's name in logs, the ready line and `cluster_leader`
    /// (1 to 64 of `A-Za-z0-9._-`). Default: the host name and the HTTP
    /// port, `host-8080`.
    pub replica_id: Option<String>,
    /// The URL the other replicas forward requests to while this one
    /// leads, `http://10.0.0.5:8080`. Default: the scheme and
    /// `[http] listen` (which must then not be a wildcard address).
    pub advertise_url: Option<String>,
    /// How often a standby asks for the lock, ms (50 to 10,000; default
    /// 500). Takeover takes this plus the registry's start (docs/scale.md).
    pub takeover_poll_ms: u64,
    /// How long a standby waits to connect to the leader before it answers
    /// 503 `leader_unavailable`, ms (50 to 30,000; default 1,000).
    pub forward_connect_timeout_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        Self {
            enabled: false,
            replica_id: None,
            advertise_url: None,
            takeover_poll_ms: 500,
            forward_connect_timeout_ms: 1_000,
        }
    }
}

impl ClusterConfig {
    /// The configured replica id, or `<host>-<port>`.
    pub fn replica_id(&self, http_port: u16) -> String {
        if let Some(id) = &self.replica_id {
            return id.clone();
        }
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .unwrap_or_else(|| "registry".into());
        format!("{host}-{http_port}")
    }

    /// The configured advertise URL, or `scheme://addr`.
    pub fn advertise_url(&self, scheme: &str, addr: std::net::SocketAddr) -> String {
        match &self.advertise_url {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => format!("{scheme}://{addr}"),
        }
    }
}

/// Who leads: the `cluster_leader` row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leader {
    /// Its `replica_id`.
    pub replica: String,
    /// Its advertise URL.
    pub url: String,
    /// How many times a replica took the lead on this store (1 for the
    /// first): each takeover adds one.
    pub epoch: i64,
}

/// Create the `cluster_leader` table (idempotent): at most one row,
/// `slot = 'leader'`, with `replica`, `url`, `epoch` and `since` (RFC 3339
/// UTC).
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS cluster_leader (
            slot    TEXT PRIMARY KEY,
            replica TEXT NOT NULL,
            url     TEXT NOT NULL,
            epoch   INTEGER NOT NULL,
            since   TEXT NOT NULL
        )",
    )
}

/// Record `replica` at `url` as the leader and return its epoch (one more
/// than the last leader's). Run by the store's writer, which holds the
/// lock: two replicas never write it at once.
///
/// Errors: the store refuses the write.
pub fn record_leader(conn: &Connection, replica: &str, url: &str) -> rusqlite::Result<i64> {
    let since = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
    conn.query_row(
        "INSERT INTO cluster_leader (slot, replica, url, epoch, since)
         VALUES ('leader', ?1, ?2, 1, ?3)
         ON CONFLICT (slot) DO UPDATE SET replica = excluded.replica,
             url = excluded.url, epoch = cluster_leader.epoch + 1, since = excluded.since
         RETURNING epoch",
        params![replica, url, since],
        |r| r.get(0),
    )
}

/// The `cluster_leader` row, read on `conn` (`None` before any leader,
/// or before the store was ever migrated).
fn read_leader(conn: &mut PgConn) -> Option<Leader> {
    let row = conn
        .client()
        .query_opt(
            "SELECT replica, url, epoch FROM cluster_leader WHERE slot = 'leader'",
            &[],
        )
        .ok()??;
    Some(Leader {
        replica: row.try_get(0).ok()?,
        url: row.try_get(1).ok()?,
        epoch: row.try_get(2).ok()?,
    })
}

/// The public key (hex) of the store's newest event-log checkpoint, read
/// on `conn` (`None` before any, or before the store was migrated).
fn newest_checkpoint_key(conn: &mut PgConn) -> Option<String> {
    conn.client()
        .query_opt(
            "SELECT public_key FROM event_checkpoints ORDER BY checkpoint_id DESC LIMIT 1",
            &[],
        )
        .ok()
        .flatten()
        .and_then(|row| row.try_get(0).ok())
}

/// How long the leader row may name this standby's own id or URL before
/// it stops: longer than the moment after a restart in which the row
/// still names this replica as the leader it was.
const SAME_AS_LEADER_FOR: Duration = Duration::from_secs(5);

/// The store's writer session, holding the advisory lock, and the flag
/// that turns true if it is ever lost ([`PgConn::try_fence`]).
pub type LockedWriter = (PgConn, Arc<AtomicBool>);

/// Ask for the lock once on `conn`: `Some(lost flag)` once this session
/// holds it, `None` while another does (the caller reads who leads).
fn poll_once(mut conn: PgConn, key: i64) -> (PgConn, Result<Option<Arc<AtomicBool>>, AppError>) {
    let got = conn.try_fence(key).map_err(AppError::Sqlite);
    (conn, got)
}

/// What a standby's forwarder needs from the registry's start.
pub struct ForwarderSetup {
    /// The registry's HTTP limits and TLS acceptor (the forwarder serves
    /// the registry's own listener).
    pub limits: crate::http_server::HttpLimits,
    pub tls: Option<tokio_rustls::TlsAcceptor>,
    /// This replica's id (sent to the leader in [`FORWARDED_BY`]).
    pub replica: String,
    /// This replica's advertise URL (never forwarded to).
    pub own_url: String,
    /// This replica's event-log signing key file and public key (hex):
    /// checked against the store's newest checkpoint before standing by
    /// (`None`: not checked).
    pub signing_key: Option<(std::path::PathBuf, String)>,
}

/// Wait until this replica may lead, serving `listener` as a standby
/// meanwhile: every request is forwarded to the leader. Calls `on_standby`
/// once, with the leader's URL when known, if it has to wait at all.
/// Returns the listener (no longer served) and the locked writer session.
///
/// Errors: the server cannot be reached at the first attempt (later
/// failures are logged and retried), or the listener cannot be shared.
pub async fn stand_by(
    store: &crate::config::StoreConfig,
    cluster: &ClusterConfig,
    listener: TcpListener,
    forwarder: ForwarderSetup,
    on_standby: Box<dyn FnOnce(Option<String>) + Send>,
) -> Result<(TcpListener, LockedWriter), AppError> {
    let url = store.url.clone().unwrap_or_default();
    let schema = store.schema.clone();
    let key = crate::app::schema_lock_key(&store.schema);
    let (conn, first) = tokio::task::spawn_blocking(move || {
        let conn = PgConn::connect(&url, &schema).map_err(AppError::Sqlite)?;
        Ok::<_, AppError>(poll_once(conn, key))
    })
    .await??;
    // Held in a guard from here: every way out of this function (an error,
    // or the future dropped) ends the session off the runtime's workers.
    let mut session = Session(Some(conn));
    if let Some(lost) = first? {
        return Ok((listener, (session.take(), lost)));
    }
    // A standby that could never take over says so now, not when the
    // leader dies: its key must be the one the leader signs with (and
    // again at every poll below).
    if let Some((path, own)) = forwarder.signing_key.clone() {
        let mut conn = session.take();
        let (c, stored) = tokio::task::spawn_blocking(move || {
            let stored = newest_checkpoint_key(&mut conn);
            (conn, stored)
        })
        .await?;
        session.0 = Some(c);
        crate::app::same_signing_key(stored.as_deref(), &own, &path)?;
    }
    // Standing by: serve a duplicate of the listener's socket, so the
    // registry gets the original back when this one stops accepting.
    let std_listener = listener.into_std().map_err(|source| AppError::Io {
        what: "HTTP listener".into(),
        source,
    })?;
    let dup = std_listener
        .try_clone()
        .and_then(|l| {
            l.set_nonblocking(true)?;
            TcpListener::from_std(l)
        })
        .map_err(|source| AppError::Io {
            what: "sharing the HTTP listener with the standby's forwarder".into(),
            source,
        })?;
    let leader = Arc::new(RwLock::new(None::<Leader>));
    let (stop_tx, stop_rx) = watch::channel(false);
    let router = forward::router(forward::Forwarder::new(
        leader.clone(),
        forwarder.replica.clone(),
        forwarder.own_url.clone(),
        Duration::from_millis(cluster.forward_connect_timeout_ms),
    ));
    let serving = tokio::spawn(crate::http_server::serve(
        dup,
        router,
        forwarder.limits,
        forwarder.tls,
        stop_rx,
    ));
    let mut conn = session.take();
    let (c, known) = tokio::task::spawn_blocking(move || {
        let known = read_leader(&mut conn);
        (conn, known)
    })
    .await?;
    session.0 = Some(c);
    let shown = known.as_ref().map(|l| l.url.clone());
    if let Ok(mut l) = leader.write() {
        *l = known;
    }
    on_standby(shown);
    let every = Duration::from_millis(cluster.takeover_poll_ms);
    let check_key = forwarder.signing_key.is_some();
    // Since when the leader row has named this replica (its id or its URL)
    // while another session holds the lock: two replicas configured alike.
    let mut named_us_since: Option<std::time::Instant> = None;
    let lost = loop {
        tokio::time::sleep(every).await;
        let conn = session.take();
        let (c, got, known, stored) = tokio::task::spawn_blocking(move || {
            let (mut c, got) = poll_once(conn, key);
            let (known, stored) = match &got {
                Ok(None) => (
                    read_leader(&mut c),
                    check_key.then(|| newest_checkpoint_key(&mut c)).flatten(),
                ),
                _ => (None, None),
            };
            (c, got, known, stored)
        })
        .await?;
        session.0 = Some(c);
        // The leader's checkpoints may appear only after this standby
        // started (both started at once): checked at every poll.
        if let Some((path, own)) = &forwarder.signing_key {
            if let Err(e) = crate::app::same_signing_key(stored.as_deref(), own, path) {
                let _ = stop_tx.send(true);
                serving.abort();
                return Err(e);
            }
        }
        match got {
            Ok(Some(lost)) => break lost,
            Ok(None) => {
                let named_us = known
                    .as_ref()
                    .filter(|k| k.replica == forwarder.replica || k.url == forwarder.own_url);
                match named_us {
                    None => named_us_since = None,
                    Some(k) => {
                        let since = named_us_since.get_or_insert_with(std::time::Instant::now);
                        if since.elapsed() >= SAME_AS_LEADER_FOR {
                            let _ = stop_tx.send(true);
                            serving.abort();
                            return Err(AppError::SameAsLeader {
                                replica: forwarder.replica.clone(),
                                url: forwarder.own_url.clone(),
                                leader_replica: k.replica.clone(),
                                leader_url: k.url.clone(),
                            });
                        }
                    }
                }
                if let (Some(k), Ok(mut l)) = (known, leader.write()) {
                    if l.as_ref() != Some(&k) {
                        tracing::info!(leader = %k.replica, url = %k.url, epoch = k.epoch, "standing by; forwarding requests to the leader");
                    }
                    *l = Some(k);
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "standby cannot ask for the store's lock; asking again")
            }
        }
    };
    // Stop accepting at once: requests already forwarded finish on their
    // own; new connections wait in the backlog for the registry.
    let _ = stop_tx.send(true);
    serving.abort();
    let _ = serving.await;
    let listener = TcpListener::from_std(std_listener).map_err(|source| AppError::Io {
        what: "HTTP listener".into(),
        source,
    })?;
    tracing::info!("this replica holds the store's lock: taking over");
    Ok((listener, (session.take(), lost)))
}

/// The standby's PostgreSQL session. The synchronous client blocks when
/// it is dropped, which a runtime worker must not do: a guard still
/// holding it ends it on a thread of its own.
struct Session(Option<PgConn>);

impl Session {
    /// The session, out of the guard.
    ///
    /// Panics: when taken twice without being put back (a bug here).
    fn take(&mut self) -> PgConn {
        self.0
            .take()
            .expect("the standby's session is in its guard")
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(conn) = self.0.take() {
            std::thread::spawn(move || drop(conn));
        }
    }
}
