//! Composition of the registry: database and migrations, token store, event
//! bus, lease engine, providers, sessions, MQTT (embedded broker or
//! external), the HTTP API, and one shutdown signal for all of it.
//!
//! # Adding a feature module
//! A feature module (providers, leases, agents, audit tasks, sessions)
//! provides `pub fn migrate(conn: &crate::sql::Connection) -> rusqlite::Result<()>`
//! (idempotent `CREATE TABLE IF NOT EXISTS ...`) and, in its `api.rs`, an
//! axum `Router` built from its own state. To plug it in:
//! 1. add `("name", module::migrate)` to [`MIGRATIONS`] (and one to
//!    [`SCHEMA_VERSION`] when a release changes the tables);
//! 2. start its service in [`Registry::start`] and merge its router there
//!    (e.g. `.nest("/api/v1/agents", agents::router(h))`) before
//!    [`build_router`] adds the layers.
//!
//! Its handlers take a [`crate::auth::Principal`] argument: the
//! `Extension(Arc<Authenticator>)` layer is applied to the whole router, as
//! are the body limit and the JSON fallbacks.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::sql::{params, Connection};
use axum::extract::DefaultBodyLimit;
use axum::{Extension, Router};
use ed25519_dalek::SigningKey;
use serde_json::json;
use shared_protocol::api::Role;
use shared_protocol::capability::Capability;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use utoipa_axum::router::OpenApiRouter;

use crate::agents::earth::entities::{EntityCatalog, EntityError};
use crate::agents::{self, AgentError, AgentService};
use crate::api;
use crate::audit::{self, AuditService};
use crate::auth::{self, Authenticator};
use crate::broker::{BrokerError, EmbeddedBroker};
use crate::config::{Config, MqttMode};
use crate::db::{Db, DbError};
use crate::events::api::EventsApi;
use crate::events::{self, EventBus};
use crate::health::{HealthState, MqttHealth};
use crate::leases::api::LeasesApi;
use crate::leases::{self, CapabilityInfo, LeaseEngine, LeaseError};
use crate::mqtt::{MqttLink, MqttSettings};
use crate::providers::api::ProvidersApi;
use crate::providers::sqlite::{self, SqliteProviderStore};
use crate::providers::{LeaseSync, ProviderSettings, Providers};
use crate::sessions::{self, BlobBackend, BlobsConfig, FsBlobStore, S3BlobStore, Sessions};
use crate::tokens::api::TokensApi;

/// Smallest MQTT packet limit of the embedded broker and the registry's
/// client, bytes: an edge's session update may take 256 KiB.
const MIN_MQTT_PACKET_BYTES: usize = 320 * 1024;

/// A feature module's migration.
pub type MigrateFn = fn(&Connection) -> rusqlite::Result<()>;

/// Every module's tables, in the order they are created.
pub const MIGRATIONS: &[(&str, MigrateFn)] = &[
    ("events", events::migrate),
    ("auth", auth::migrate),
    ("providers", sqlite::migrate),
    ("leases", leases::migrate),
    ("sessions", sessions::migrate),
    ("derive", crate::derive::sql::migrate),
    ("audit", audit::migrate),
    ("agents", agents::migrate),
    ("cluster", crate::cluster::migrate),
];

/// Run every migration in one transaction.
pub fn migrate_all(conn: &mut Connection) -> rusqlite::Result<()> {
    // IMMEDIATE: take the write lock first (waiting behind a running
    // registry's commits) rather than read the schema and then try to
    // write, which fails at once with `database is locked` when another
    // connection committed in between (a CLI command while the registry
    // runs).
    let tx = conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
    tx.execute_batch(
        "CREATE TABLE IF NOT EXISTS schema_versions (
            version    INTEGER NOT NULL UNIQUE,
            applied_at TEXT NOT NULL,
            applied_by TEXT NOT NULL
        )",
    )?;
    let stored: Option<i64> =
        tx.query_row("SELECT MAX(version) FROM schema_versions", [], |r| r.get(0))?;
    if let Some(v) = stored.filter(|v| *v > SCHEMA_VERSION) {
        return Err(rusqlite::Error::SqliteFailure(
            rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ERROR),
            Some(format!(
                "the store is at schema version {v}, newer than this registry's {SCHEMA_VERSION}: \
                 run cloud-registry {} or newer on it (nothing was changed)",
                env!("CARGO_PKG_VERSION")
            )),
        ));
    }
    for (name, migrate) in MIGRATIONS {
        tracing::debug!(module = name, "migrating");
        migrate(&tx)?;
    }
    if stored.is_none_or(|v| v < SCHEMA_VERSION) {
        let now = chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true);
        tx.execute(
            "INSERT INTO schema_versions (version, applied_at, applied_by) VALUES (?1, ?2, ?3)
             ON CONFLICT (version) DO NOTHING",
            params![
                SCHEMA_VERSION,
                now,
                format!("cloud-registry {}", env!("CARGO_PKG_VERSION"))
            ],
        )?;
        tracing::info!(from = ?stored, to = SCHEMA_VERSION, "store schema migrated");
    }
    tx.commit()
}

/// The store's schema version this registry migrates to: one more with
/// each release whose migrations change the tables. `schema_versions`
/// keeps one row per version a store reached (`version`, `applied_at`
/// RFC 3339 UTC, `applied_by` the registry's version); a registry refuses a
/// store at a newer version than its own (a replica not yet upgraded, a
/// downgrade) before touching it.
pub const SCHEMA_VERSION: i64 = 1;

/// Principal name of the token made for `auth.bootstrap_admin_token_file`.
pub const BOOTSTRAP_ADMIN: &str = "bootstrap-admin";

/// Why the registry did not start.
#[derive(Debug, thiserror::Error)]
pub enum AppError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("store: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error(transparent)]
    Broker(#[from] BrokerError),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot resolve MQTT broker {host}:{port}")]
    Resolve { host: String, port: u16 },
    #[error("the registry's MQTT client could not connect to the embedded broker at {0}")]
    MqttConnect(SocketAddr),
    #[error("store: {0}")]
    Store(#[from] crate::providers::StoreError),
    #[error("lease engine: {0}")]
    Lease(#[from] LeaseError),
    #[error("artifact store: {0}")]
    Blob(#[from] sessions::BlobError),
    #[error("store {0} is in use by another registry process (one registry per store)")]
    StoreInUse(String),
    #[error("Earth entity data: {0}")]
    Entities(#[from] EntityError),
    #[error("agent runtime: {0}")]
    Agents(#[from] AgentError),
    #[error("background task failed: {0}")]
    Join(#[from] tokio::task::JoinError),
    #[error(transparent)]
    Token(#[from] auth::TokenError),
    #[error("event log signing key: {0}")]
    SigningKey(String),
    /// A TLS certificate, key or CA file named by `key` cannot be used.
    #[error("`{key}`: {source}")]
    Tls {
        key: &'static str,
        source: crate::tls::TlsFileError,
    },
    #[error("the event log's hash chain is broken at {0}; `cloud-registry audit-log verify` tells more; start with `serve --accept-broken-chain` to extend it anyway (docs/audit-trail.md)")]
    ChainBroken(#[from] events::chain::ChainError),
    /// Another replica leads under this standby's `replica_id` or
    /// `advertise_url` (a configuration copied without changing them).
    #[error("another replica holds the store's lock, yet the leader row names this replica ({leader_replica} at {leader_url}; this one is {replica} at {url}): give each replica its own [cluster] replica_id and advertise_url (docs/scale.md \"Replicas\")")]
    SameAsLeader {
        replica: String,
        url: String,
        leader_replica: String,
        leader_url: String,
    },
    /// The store's newest checkpoint was signed with another key than
    /// this registry's: a replica (or a registry moved to a new machine)
    /// without the key file of the registry that signed it.
    #[error("the store's checkpoints are signed with key {store_key}, this registry's key is {own_key} ({path}): replicas of one store, and a registry moved to another machine, use one key: copy `audit_log.signing_key_file` (mode 0600) from the registry that signed them (docs/scale.md \"Replicas\"); a registry that signs with another key leaves a chain no single key verifies")]
    ForeignSigningKey {
        /// The newest checkpoint's public key (hex, first 16 digits).
        store_key: String,
        /// This registry's public key (hex, first 16 digits).
        own_key: String,
        /// This registry's key file.
        path: String,
    },
}

/// `Err(ForeignSigningKey)` when the newest checkpoint's public key
/// `stored` (hex) is not `own` (hex), the key file being `path`.
pub(crate) fn same_signing_key(
    stored: Option<&str>,
    own: &str,
    path: &Path,
) -> Result<(), AppError> {
    match stored {
        Some(k) if !k.eq_ignore_ascii_case(own) => Err(AppError::ForeignSigningKey {
            store_key: k.chars().take(16).collect(),
            own_key: own.chars().take(16).collect(),
            path: path.display().to_string(),
        }),
        _ => Ok(()),
    }
}

/// Take an exclusive advisory lock on `{store}.lock`, so a second registry
/// on the same SQLite file refuses to start instead of granting the same
/// exclusive capability a second time. The lock ends with the process,
/// also when it is killed.
///
/// Errors: the lock file cannot be created, or another process still
/// holds it after [`STORE_LOCK_WAIT`].
pub fn lock_store(store: &Path) -> Result<std::fs::File, AppError> {
    let mut name = store.as_os_str().to_owned();
    name.push(".lock");
    let lock_path = PathBuf::from(name);
    if let Some(dir) = lock_path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|source| AppError::Io {
            what: format!("create directory for {}", lock_path.display()),
            source,
        })?;
    }
    let file = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&lock_path)
        .map_err(|source| AppError::Io {
            what: format!("open {}", lock_path.display()),
            source,
        })?;
    // A holder that is going away (a registry stopping, or a process
    // forked while the lock was open and not yet exec'd) lets go within
    // moments: ask again for up to STORE_LOCK_WAIT before refusing.
    let deadline = std::time::Instant::now() + STORE_LOCK_WAIT;
    loop {
        match file.try_lock() {
            Ok(()) => return Ok(file),
            Err(std::fs::TryLockError::WouldBlock) if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                return Err(AppError::StoreInUse(store.display().to_string()))
            }
            Err(std::fs::TryLockError::Error(source)) => {
                return Err(AppError::Io {
                    what: format!("lock {}", lock_path.display()),
                    source,
                })
            }
        }
    }
}

/// How long [`lock_store`] waits for another holder of the store's lock
/// to let go before it refuses with [`AppError::StoreInUse`].
pub const STORE_LOCK_WAIT: Duration = Duration::from_secs(1);

/// Open the SQLite file and run every migration.
pub fn open_db(path: &Path) -> Result<Db, DbError> {
    Db::open(path, migrate_all)
}

/// The PostgreSQL advisory lock key of `schema`: the first 8 bytes of
/// sha256(`benchlink-store:` + schema), as a signed 64-bit integer.
pub fn schema_lock_key(schema: &str) -> i64 {
    use sha2::Digest;
    let d = sha2::Sha256::digest(format!("benchlink-store:{schema}").as_bytes());
    i64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]])
}

/// What keeps a second registry off the store while this one runs.
pub enum StoreLock {
    /// SQLite: the `flock` of `<store>.lock` ([`lock_store`]).
    File(std::fs::File),
    /// PostgreSQL: the store's writer session holds the schema's advisory
    /// lock ([`schema_lock_key`], [`crate::sql::pg::PgConn::try_fence`]);
    /// the server lets it go when the session ends (the registry stopped
    /// or was killed). The flag turns true if the session reopened and
    /// found the lock taken: this registry then writes no more.
    Postgres(Arc<std::sync::atomic::AtomicBool>),
}

/// Open the writer session of `store`'s PostgreSQL schema and take the
/// schema's advisory lock on it, asking again for up to
/// [`STORE_LOCK_WAIT`].
///
/// Errors: [`AppError::StoreInUse`] while another registry holds it; the
/// server cannot be reached.
pub fn lock_store_postgres(
    store: &crate::config::StoreConfig,
) -> Result<crate::cluster::LockedWriter, AppError> {
    let url = store.url.as_deref().unwrap_or_default();
    let mut conn = crate::sql::pg::PgConn::connect(url, &store.schema)?;
    let key = schema_lock_key(&store.schema);
    let deadline = std::time::Instant::now() + STORE_LOCK_WAIT;
    loop {
        if let Some(lost) = conn.try_fence(key)? {
            return Ok((conn, lost));
        }
        if std::time::Instant::now() >= deadline {
            return Err(AppError::StoreInUse(store.describe()));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Open the store `[store]` names and run every migration: the SQLite
/// file, or the PostgreSQL schema.
///
/// Errors: the store cannot be opened or migrated.
pub fn open_store(store: &crate::config::StoreConfig) -> Result<Db, DbError> {
    match (store.backend, store.url.as_deref()) {
        (crate::config::StoreBackend::Postgres, Some(url)) => {
            Db::open_postgres(url, &store.schema, migrate_all)
        }
        (crate::config::StoreBackend::Postgres, None) => Err(DbError::Open {
            path: PathBuf::from("store.url"),
            source: rusqlite::Error::InvalidPath(PathBuf::from(
                "store.url is required with backend = \"postgres\"",
            )),
        }),
        (crate::config::StoreBackend::Sqlite, _) => open_db(&store.path),
    }
}

/// [`open_store`] on PostgreSQL with `writer` (holding the lock) as the
/// writing session.
///
/// Errors: the store cannot be opened or migrated.
pub fn open_store_on(
    store: &crate::config::StoreConfig,
    writer: crate::sql::pg::PgConn,
) -> Result<Db, DbError> {
    let url = store.url.as_deref().unwrap_or_default();
    Db::open_postgres_on(writer, url, &store.schema, migrate_all)
}

/// The id of the newest event (0 when the log is empty).
pub async fn last_event_id(db: &Db) -> Result<u64, DbError> {
    Ok(db.read(|c| events::last_id(c)).await??)
}

/// Create a token without a running registry (`cloud-registry token
/// create`). A running registry accepts it at once: it looks a token it
/// has not seen up in the store on first use.
///
/// Errors: the store cannot be opened or written, or `name` already has
/// tokens of another role ([`auth::TokenError::RoleConflict`]).
pub fn create_token_offline(config: &Config, role: Role, name: &str) -> Result<String, AppError> {
    let db = open_store(&config.store)?;
    let name = name.to_string();
    Ok(db.write_blocking(move |c| auth::create_token_sync(c, role, &name))??)
}

/// Make sure `path` holds a valid `super_admin` token: reuse the one in
/// the file, or create one and write it with mode 0600.
/// The artifact store `[blobs]` asks for: files under `artifact_dir`, or a
/// bucket (uploads staged in `artifact_dir/staging`) that must answer now:
/// a registry that cannot store evidence does not start.
///
/// Errors: [`AppError::Blob`] naming the directory, or the bucket and the
/// server's reason.
async fn open_blob_store(
    config: &BlobsConfig,
    artifact_dir: PathBuf,
) -> Result<Arc<dyn sessions::BlobStore>, AppError> {
    match config.backend {
        BlobBackend::Fs => Ok(Arc::new(
            tokio::task::spawn_blocking(move || FsBlobStore::open(&artifact_dir)).await??,
        )),
        BlobBackend::S3 => {
            let config = config.clone();
            let store = tokio::task::spawn_blocking(move || {
                S3BlobStore::new(&config, &artifact_dir.join("staging"))
            })
            .await??;
            store.check_reachable().await?;
            tracing::info!(bucket = store.bucket(), "artifact bytes in S3");
            Ok(Arc::new(store))
        }
    }
}

async fn ensure_bootstrap_token(auth: &Authenticator, path: &Path) -> Result<String, AppError> {
    let io = |what: &str, source| AppError::Io {
        what: format!("{what} {}", path.display()),
        source,
    };
    if let Ok(existing) = std::fs::read_to_string(path) {
        let existing = existing.trim().to_string();
        if auth
            .authenticate(&existing)
            .is_some_and(|p| p.role == Role::SuperAdmin)
        {
            return Ok(existing);
        }
    }
    let token = auth.create_token(Role::SuperAdmin, BOOTSTRAP_ADMIN).await?;
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| io("create directory for", e))?;
    }
    write_private(path, &token).map_err(|e| io("write", e))?;
    Ok(token)
}

pub(crate) fn write_private(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    // An existing file keeps its old mode on open: set it.
    f.set_permissions(std::fs::Permissions::from_mode(0o600))?;
    writeln!(f, "{text}")?;
    f.sync_all()
}

/// A standby's signing key file and public key (hex), loaded (or created)
/// before it stands by, so that one that could not take over says so at
/// once; `None` with `audit_log.accept_broken_chain`.
///
/// Errors: a bad key file.
async fn standby_signing_key(config: &Config) -> Result<Option<(PathBuf, String)>, AppError> {
    if config.audit_log.accept_broken_chain {
        return Ok(None);
    }
    let (path, key) = load_signing_key(config).await?;
    Ok(Some((path, key.public_hex())))
}

/// The event log's signing key file (`audit_log.signing_key_file`, or
/// beside the store) and the key in it, created when missing.
///
/// Errors: a bad key file.
async fn load_signing_key(
    config: &Config,
) -> Result<(PathBuf, events::chain::SigningKeyFile), AppError> {
    let key_path = config.audit_log.key_path(&config.store.path);
    let path = key_path.clone();
    let key = tokio::task::spawn_blocking(move || {
        events::chain::SigningKeyFile::load_or_create(&key_path)
    })
    .await?
    .map_err(AppError::SigningKey)?;
    Ok((path, key))
}

/// Load (or create) the event log's signing key and verify the chain's
/// tail with it (`audit_log.verify_at_start` events and the checkpoints
/// among them).
///
/// Errors: a bad key file; a broken chain unless
/// `audit_log.accept_broken_chain`.
async fn open_chain(config: &Config, db: &Db) -> Result<Arc<SigningKey>, AppError> {
    let (path, key) = load_signing_key(config).await?;
    let public = key.public_hex();
    if !config.audit_log.accept_broken_chain {
        let newest = db.read(|c| events::chain::latest_checkpoint(c)).await??;
        same_signing_key(
            newest.as_ref().map(|c| c.public_key.as_str()),
            &public,
            &path,
        )?;
    }
    let n = config.audit_log.verify_at_start;
    if n > 0 {
        let t0 = Instant::now();
        match db
            .read(move |c| events::chain::verify_tail(c, n, Some(&public)))
            .await?
        {
            Ok(v) => tracing::info!(
                first = v.first,
                last = v.last,
                checkpoints = v.checkpoints,
                ms = t0.elapsed().as_millis() as u64,
                "event log chain verified"
            ),
            Err(e) if config.audit_log.accept_broken_chain => tracing::error!(
                error = %e,
                "the event log's hash chain is broken; extending it as accept_broken_chain says"
            ),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(Arc::new(key.key))
}

/// Sign a checkpoint of the chain head every `every` when it moved, and
/// once more at shutdown.
async fn run_checkpoints(
    db: Db,
    key: Arc<SigningKey>,
    every: Duration,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let stopping = tokio::select! {
            _ = tick.tick() => false,
            _ = shutdown.changed() => true,
        };
        let k = key.clone();
        match db.write(move |c| events::chain::checkpoint(c, &k)).await {
            Ok(Ok(Some(c))) => {
                tracing::debug!(event_id = c.event_id, "event log checkpoint signed")
            }
            Ok(Ok(None)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "event log checkpoint failed"),
            Err(e) => tracing::warn!(error = %e, "event log checkpoint failed"),
        }
        if stopping || *shutdown.borrow() {
            break;
        }
    }
}

/// The registry's link to the lease engine (see [`LeaseSync`]).
struct EngineSync(Arc<LeaseEngine>);

#[async_trait::async_trait]
impl LeaseSync for EngineSync {
    async fn capability_upserted(&self, capability: &Capability, online: bool) {
        self.0
            .upsert_capability(CapabilityInfo::from_capability(capability, online))
            .await;
    }
    async fn provider_online(&self, provider_id: &str, online: bool) {
        self.0.set_provider_online(provider_id, online).await;
    }
    async fn non_interruptible(&self, capability_id: &str, in_window: bool) {
        self.0.set_non_interruptible(capability_id, in_window).await;
    }
    async fn health_changed(&self, capability_id: &str, unhealthy: bool) {
        self.0.set_unhealthy(capability_id, unhealthy).await;
    }
}

/// Build the whole HTTP router from `routes` (every feature's router,
/// already with its state; full paths): the authenticator extension, body
/// limit and JSON fallbacks, inside the request id and access log
/// ([`crate::access_log`]), which records each request's duration in
/// `http`.
pub fn build_router(
    routes: Router,
    auth: Arc<Authenticator>,
    body_limit_bytes: usize,
    http: crate::metrics::HttpMetrics,
) -> Router {
    crate::access_log::layer(
        api::with_fallbacks(routes)
            .layer(DefaultBodyLimit::max(body_limit_bytes))
            .layer(Extension(crate::extract::BodyLimit(body_limit_bytes)))
            .layer(Extension(auth)),
        http,
    )
}

/// Compose the documented routes: `v1` (relative to `/api/v1`), `root`
/// (full paths, also served at the root: `/healthz`, `/metrics`,
/// `/time`), `sessions` (full paths), `agents` (under `/api/v1/agents`),
/// `geo` (under `/api/v1/visualization/geo`), and
/// `GET /api/v1/openapi.json`. Answers the axum router and the finished
/// OpenAPI document it serves ([`crate::openapi`]).
pub fn api_routes(
    v1: OpenApiRouter,
    root: OpenApiRouter,
    sessions: OpenApiRouter,
    agents: OpenApiRouter,
    geo: OpenApiRouter,
) -> (Router, utoipa::openapi::OpenApi) {
    let (doc_route, doc_cell) = crate::openapi::router();
    let (router, document) = OpenApiRouter::with_openapi(crate::openapi::base())
        .nest("/api/v1", v1)
        .merge(root)
        .merge(sessions)
        .nest("/api/v1/agents", agents)
        .nest("/api/v1/visualization/geo", geo)
        .merge(doc_route)
        .split_for_parts();
    let document = crate::openapi::finish(document);
    crate::openapi::set_document(&doc_cell, &document);
    (router, document)
}

/// The embedded broker's client cap for this process: `[mqtt]
/// max_clients` lowered to what the descriptor limit leaves
/// ([`crate::config::gate_client_cap`]; the soft limit is raised to the
/// hard one first). Logged with a warning when the limit lowered it.
fn gate_client_cap(config: &Config) -> usize {
    let nofile = match crate::fdlimit::raise_nofile_to_hard() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the file-descriptor limit");
            crate::fdlimit::nofile_limits().map_or(1024, |(soft, _)| soft)
        }
    };
    let configured = config.mqtt.max_clients;
    let cap = crate::config::gate_client_cap(nofile, config.http.max_connections, configured);
    if configured.is_some_and(|c| c > cap) {
        tracing::warn!(
            nofile,
            max_clients = cap,
            configured = configured.unwrap_or_default(),
            "the file-descriptor limit leaves room for fewer MQTT clients than \
             `mqtt.max_clients` (3 descriptors each); raise LimitNOFILE"
        );
    }
    cap
}

/// The listener's limits from `[http]`, with `max_connections` lowered to
/// what the file-descriptor limit leaves after [`crate::config::FD_RESERVE`]
/// (logged when it is). Raises the soft `RLIMIT_NOFILE` to the hard limit
/// first and logs both figures.
fn http_limits(config: &Config) -> crate::http_server::HttpLimits {
    let wanted = config.http.max_connections;
    let mut max_connections = wanted;
    match crate::fdlimit::raise_nofile_to_hard() {
        Ok(nofile) => {
            let room = nofile.saturating_sub(crate::config::FD_RESERVE).max(1);
            if (wanted as u64) > room {
                max_connections = room as usize;
                tracing::warn!(
                    nofile,
                    max_connections,
                    configured = wanted,
                    reserve = crate::config::FD_RESERVE,
                    "the file-descriptor limit leaves room for fewer HTTP connections \
                     than `http.max_connections`; raise LimitNOFILE"
                );
            }
            tracing::info!(
                nofile,
                max_connections,
                "file-descriptor limit (RLIMIT_NOFILE)"
            );
        }
        Err(e) => tracing::warn!(error = %e, "cannot raise the file-descriptor limit"),
    }
    crate::http_server::HttpLimits {
        header_read_timeout: Duration::from_millis(config.http.header_read_timeout_ms),
        body_read_timeout: Duration::from_millis(config.http.body_read_timeout_ms),
        max_connections,
    }
}

/// The TLS configurations `config` asks for, read from their files.
struct TlsSetup {
    /// `[http] tls_cert_file` / `tls_key_file`.
    http: Option<tokio_rustls::TlsAcceptor>,
    /// `[mqtt] tls_cert_file` / `tls_key_file` (the embedded broker's gate).
    mqtt_gate: Option<Arc<tokio_rustls::rustls::ServerConfig>>,
    /// `[mqtt] tls` (and `ca_file`) on an external broker.
    mqtt_client: Option<Arc<tokio_rustls::rustls::ClientConfig>>,
}

/// Read the TLS files of `config` (on a blocking thread).
///
/// Errors: [`AppError::Tls`] naming the key of a file that cannot be used.
async fn load_tls(config: &Config) -> Result<TlsSetup, AppError> {
    let http = (
        config.http.tls_cert_file.clone(),
        config.http.tls_key_file.clone(),
    );
    let gate = (
        config.mqtt.tls_cert_file.clone(),
        config.mqtt.tls_key_file.clone(),
    );
    let client = (config.mqtt.mode == MqttMode::External && config.mqtt.tls)
        .then(|| config.mqtt.ca_file.clone());
    tokio::task::spawn_blocking(move || {
        let server = |(cert, key): (Option<PathBuf>, Option<PathBuf>),
                      keys: (&'static str, &'static str),
                      alpn: &[&[u8]]| match (cert, key) {
            (Some(c), Some(k)) => {
                crate::tls::server_config(&c, &k, alpn)
                    .map(Some)
                    .map_err(|source| AppError::Tls {
                        key: if matches!(source, crate::tls::TlsFileError::NoKey { .. }) {
                            keys.1
                        } else {
                            keys.0
                        },
                        source,
                    })
            }
            (None, None) => Ok(None),
            (Some(_), None) | (None, Some(_)) => Err(AppError::Tls {
                key: keys.0,
                source: crate::tls::TlsFileError::Mismatch {
                    cert: keys.0.into(),
                    key: keys.1.into(),
                    reason: "set both or neither".into(),
                },
            }),
        };
        let http = server(
            http,
            ("http.tls_cert_file", "http.tls_key_file"),
            &[b"http/1.1"],
        )?
        .map(tokio_rustls::TlsAcceptor::from);
        let mqtt_gate = server(gate, ("mqtt.tls_cert_file", "mqtt.tls_key_file"), &[])?;
        let mqtt_client =
            match client {
                Some(ca) => Some(crate::tls::client_config(ca.as_deref()).map_err(|source| {
                    AppError::Tls {
                        key: "mqtt.ca_file",
                        source,
                    }
                })?),
                None => None,
            };
        Ok(TlsSetup {
            http,
            mqtt_gate,
            mqtt_client,
        })
    })
    .await?
}

/// Entry point for starting the registry in-process or from `main`.
pub struct Registry;

/// A started registry. Drop does not stop it; call
/// [`RunningRegistry::shutdown`].
pub struct RunningRegistry {
    /// Where the HTTP API listens (the real port when 0 was configured).
    pub http_addr: SocketAddr,
    /// The MQTT broker (embedded: where it listens; external: the resolved
    /// broker address).
    pub mqtt_addr: SocketAddr,
    /// `embedded` or `external`.
    pub mqtt_mode: MqttMode,
    /// `https` when `[http]` has a certificate, else `http`.
    pub http_scheme: &'static str,
    /// True when MQTT is over TLS: the embedded broker's public address,
    /// or the registry's connection to an external broker.
    pub mqtt_tls: bool,
    /// The `super_admin` token of `auth.bootstrap_admin_token_file`, when
    /// configured.
    pub admin_token: Option<String>,
    /// Providers and capabilities (registration, liveness).
    pub providers: Arc<Providers>,
    pub auth: Arc<Authenticator>,
    pub leases: Arc<LeaseEngine>,
    /// Actions, sessions and artifacts.
    pub sessions: Arc<Sessions>,
    /// Audit tasks (seed 001 §8-§14).
    pub audit: Arc<AuditService>,
    /// Agent runtime and the Earth command (seed 000).
    pub agents: Arc<AgentService>,
    pub bus: EventBus,
    pub db: Db,
    mqtt: MqttLink,
    /// Held for the registry's life: one registry per store.
    store_lock: StoreLock,
    /// With `[cluster] enabled`: this replica's id and its epoch.
    cluster: Option<(String, i64)>,
    shutdown_tx: watch::Sender<bool>,
    http: JoinHandle<()>,
    background: Vec<JoinHandle<()>>,
}

impl Registry {
    /// Start everything described by `config` and return once the HTTP API
    /// accepts connections and the MQTT client is connected (embedded
    /// mode; external mode waits up to 5 s and then goes on, reporting
    /// `degraded` on `/healthz` until connected).
    ///
    /// Errors: database, ports in use, embedded broker not coming up.
    pub async fn start(config: Config) -> Result<RunningRegistry, AppError> {
        Self::start_replica(config, Box::new(|_| {})).await
    }

    /// [`Registry::start`]; with `[cluster] enabled`, while another replica
    /// leads, this one first stands by ([`crate::cluster::stand_by`]),
    /// calling `on_standby` with the leader's URL, and returns once it has
    /// taken over.
    ///
    /// Errors: as [`Registry::start`].
    pub async fn start_replica(
        config: Config,
        on_standby: Box<dyn FnOnce(Option<String>) + Send>,
    ) -> Result<RunningRegistry, AppError> {
        // Bind first: a taken port fails before anything else starts.
        let listener =
            crate::http_server::bind(config.http.listen).map_err(|source| AppError::Io {
                what: format!("cannot listen for HTTP on {}", config.http.listen),
                source,
            })?;
        let http_addr = listener.local_addr().map_err(|source| AppError::Io {
            what: "HTTP listener address".into(),
            source,
        })?;
        let tls = load_tls(&config).await?;
        let http_scheme = if tls.http.is_some() { "https" } else { "http" };
        let mqtt_tls = tls.mqtt_gate.is_some() || tls.mqtt_client.is_some();
        let replica = config.cluster.replica_id(http_addr.port());
        let advertise = config.cluster.advertise_url(http_scheme, http_addr);
        // It may wait up to STORE_LOCK_WAIT: not on a runtime worker.
        let store_path = config.store.path.clone();
        let sqlite = config.store.backend == crate::config::StoreBackend::Sqlite;
        let store_for_lock = config.store.clone();
        let (listener, store_lock, writer) = if sqlite {
            let f = tokio::task::spawn_blocking(move || lock_store(&store_path)).await??;
            (listener, StoreLock::File(f), None)
        } else if config.cluster.enabled {
            let (listener, (w, lost)) = crate::cluster::stand_by(
                &config.store,
                &config.cluster,
                listener,
                crate::cluster::ForwarderSetup {
                    limits: http_limits(&config),
                    tls: tls.http.clone(),
                    replica: replica.clone(),
                    own_url: advertise.clone(),
                    signing_key: standby_signing_key(&config).await?,
                },
                on_standby,
            )
            .await?;
            (listener, StoreLock::Postgres(lost), Some(w))
        } else {
            let (w, lost) =
                tokio::task::spawn_blocking(move || lock_store_postgres(&store_for_lock)).await??;
            (listener, StoreLock::Postgres(lost), Some(w))
        };
        let store_dir = config
            .store
            .path
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
            .unwrap_or(std::path::Path::new("."));
        crate::storage::set_store_dir(store_dir);
        crate::storage::start_probe();
        let store_config = config.store.clone();
        let db = tokio::task::spawn_blocking(move || match writer {
            Some(w) => open_store_on(&store_config, w),
            None => open_store(&store_config),
        })
        .await??;
        let cluster = match config.cluster.enabled {
            true => {
                let (r, u) = (replica.clone(), advertise.clone());
                let epoch = db
                    .write(move |c| crate::cluster::record_leader(c, &r, &u))
                    .await??;
                tracing::info!(replica = %replica, url = %advertise, epoch, "this replica leads");
                Some((replica, epoch))
            }
            // A registry on PostgreSQL without `[cluster]` holds the lock
            // too: replicas of the schema forward to it, not to the URL of
            // whichever replica led before it.
            false if !sqlite => {
                let (r, u) = (replica.clone(), advertise.clone());
                db.write(move |c| crate::cluster::record_leader(c, &r, &u))
                    .await??;
                None
            }
            false => None,
        };
        let signing = open_chain(&config, &db).await?;
        let auth = Authenticator::load(db.clone()).await?;
        let admin_token = match &config.auth.bootstrap_admin_token_file {
            Some(p) => Some(ensure_bootstrap_token(&auth, p).await?),
            None => None,
        };
        let bus = EventBus::new(db.clone());
        let store = Arc::new(SqliteProviderStore::new(db.clone()));
        let lease_config = crate::leases::LeaseConfig {
            queue_aging: config.policy.queue_aging.clone(),
            ..config.leases.clone()
        };
        let engine = LeaseEngine::start(db.clone(), bus.clone(), lease_config).await?;
        // This registry's own figures (never a process-global recorder).
        let metrics = crate::metrics::Metrics::new();
        engine.attach_metrics(metrics.leases.clone());
        engine.set_principal_policy(crate::policy::principal::PrincipalPolicy::new(
            crate::policy::principal::PrincipalPolicyConfig {
                roles: config.policy.roles.clone(),
                principals: config.policy.principals.clone(),
            },
        ));
        let providers = Providers::new(
            store,
            bus.clone(),
            Arc::new(EngineSync(engine.clone())),
            ProviderSettings {
                heartbeat_interval_seconds: config.heartbeat.interval_seconds,
                offline_after: config.heartbeat.offline_after(),
                snapshot_min_interval: Duration::from_secs(u64::from(
                    config.health.snapshot_min_interval_seconds,
                )),
                twins: crate::twins::TwinSettings {
                    clear_after: Duration::from_secs(u64::from(
                        config.heartbeat.conflict_clear_seconds,
                    )),
                    ..Default::default()
                },
            },
        );
        let artifact_dir = config.sessions.artifact_dir.clone().unwrap_or_else(|| {
            config
                .store
                .path
                .parent()
                .map(|d| d.join("artifacts"))
                .unwrap_or_else(|| PathBuf::from("artifacts"))
        });
        let blobs = open_blob_store(&config.blobs, artifact_dir).await?;
        let sessions = Sessions::new(
            db.clone(),
            bus.clone(),
            engine.clone(),
            providers.store().clone(),
            blobs.clone(),
            config.sessions.clone(),
        );
        let audit = AuditService::new(
            db.clone(),
            bus.clone(),
            engine.clone(),
            config.audit.clone(),
        );
        let earth = config.agents.earth_data();
        let catalog = Arc::new(EntityCatalog::load_with_remote(&earth).await?);
        let stats = catalog.stats();
        tracing::info!(load_ms = stats.load_ms, counts = ?stats.counts, "Earth entity data loaded");
        let agents = Arc::new(
            AgentService::new(db.clone(), catalog, config.agents.clone())
                .await?
                .with_events(Arc::new(events::agent_sink::AgentEventLog::start(
                    bus.clone(),
                ))),
        );
        // Before MQTT starts, so no session update is missed.
        providers.add_hooks(sessions.clone());
        // The embedded broker starts with us: nobody can be connected yet,
        // so a provider the store holds as online (from before a restart)
        // is offline until it is heard again. Before the API answers. An
        // external broker may still hold the providers' connections: the
        // liveness monitor's full window applies to them instead.
        if config.mqtt.mode == MqttMode::Embedded {
            let marked = providers.mark_unheard_providers_offline().await?;
            if !marked.is_empty() {
                tracing::info!(
                    providers = marked.len(),
                    "providers online before the restart are offline until they reconnect"
                );
            }
        }
        let synced = providers.sync_lease_engine().await?;
        tracing::info!(
            capabilities = synced,
            "lease engine told about stored capabilities"
        );

        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        // Large enough for an action's params (the HTTP body limit) and for
        // the largest session update an edge sends (256 KiB, plus the
        // envelope and topic), whatever the body limit.
        let max_packet = config.http.body_limit_bytes.max(MIN_MQTT_PACKET_BYTES);
        let mut kick = None;
        let mut gate_stats = None;
        let (mqtt_addr, settings) = match config.mqtt.mode {
            MqttMode::Embedded => {
                let listen = config.mqtt.listen;
                let a = auth.clone();
                let user = config.mqtt.client_id.clone();
                let prefix = config.mqtt.topic_prefix.clone();
                let gate_tls = tls.mqtt_gate.clone();
                let max_clients = gate_client_cap(&config);
                let broker = tokio::task::spawn_blocking(move || {
                    EmbeddedBroker::start(
                        listen,
                        a,
                        &user,
                        max_packet,
                        &prefix,
                        gate_tls,
                        max_clients,
                    )
                })
                .await??;
                let login = broker.registry_login().clone();
                gate_stats = Some(broker.gate_stats());
                // The registry's client (and the revocation kick) talk to
                // rumqttd directly: only benches and admins pass the gate.
                let internal = broker.internal_addr();
                kick = Some((internal, login.clone()));
                (
                    broker.addr(),
                    MqttSettings {
                        host: internal.ip().to_string(),
                        port: internal.port(),
                        client_id: config.mqtt.client_id.clone(),
                        username: Some(login.username),
                        password: Some(login.password),
                        topic_prefix: config.mqtt.topic_prefix.clone(),
                        keep_alive: Duration::from_secs(u64::from(config.mqtt.keep_alive_seconds)),
                        max_packet_bytes: max_packet,
                        // The embedded broker starts and stops with the
                        // registry: there is no queue to come back to.
                        persistent_session: false,
                        // Loopback to rumqttd, behind the gate.
                        tls: None,
                    },
                )
            }
            MqttMode::External => {
                let (host, port) = (config.mqtt.host.clone(), config.mqtt.port);
                let addr = tokio::net::lookup_host((host.as_str(), port))
                    .await
                    .ok()
                    .and_then(|mut a| a.next())
                    .ok_or_else(|| AppError::Resolve {
                        host: host.clone(),
                        port,
                    })?;
                (
                    addr,
                    MqttSettings {
                        host,
                        port,
                        client_id: config.mqtt.client_id.clone(),
                        username: config.mqtt.username.clone(),
                        password: config.mqtt.password.clone(),
                        topic_prefix: config.mqtt.topic_prefix.clone(),
                        keep_alive: Duration::from_secs(u64::from(config.mqtt.keep_alive_seconds)),
                        max_packet_bytes: max_packet,
                        // The broker outlives the registry: it queues the
                        // providers' QoS 1 messages while the registry is
                        // away (session updates must not be lost).
                        persistent_session: true,
                        tls: tls.mqtt_client.clone(),
                    },
                )
            }
        };
        let forward_after = last_event_id(&db).await?;
        let live = Arc::new(crate::live::LiveFrames::default());
        let mqtt = MqttLink::start(
            settings,
            providers.clone(),
            bus.clone(),
            forward_after,
            sessions.clone(),
            live.clone(),
        );
        sessions.attach_commands(mqtt.command_sender());
        sessions.attach_twins(providers.twins().clone());
        sessions.attach_budgets(Arc::new(crate::budgets::ActionBudgets::new(
            config.policy.budgets.clone(),
        )));
        sessions.set_hearing(mqtt.hearing(), config.heartbeat.offline_after());
        sessions.set_max_command_bytes(max_packet);
        sessions.attach_metrics(metrics.actions.clone());
        let connected = mqtt.wait_connected(Duration::from_secs(5)).await;
        if !connected {
            if config.mqtt.mode == MqttMode::Embedded {
                mqtt.stop().await;
                engine.shutdown().await;
                return Err(AppError::MqttConnect(mqtt_addr));
            }
            tracing::warn!(%mqtt_addr, "MQTT broker not reachable yet; retrying in the background");
        }

        let health = crate::health::routes(HealthState {
            http_scheme,
            providers: providers.clone(),
            leases: engine.clone(),
            db: db.clone(),
            mqtt: MqttHealth {
                mode: match config.mqtt.mode {
                    MqttMode::Embedded => "embedded",
                    MqttMode::External => "external",
                },
                addr: mqtt_addr.to_string(),
                tls: mqtt_tls,
                connected: {
                    let flag = mqtt.connected_flag();
                    Arc::new(move || flag.load(std::sync::atomic::Ordering::Relaxed))
                },
                stats: mqtt.stats(),
                gate: gate_stats,
            },
            metrics: metrics.clone(),
            cluster: cluster.clone(),
        });
        let v1 = OpenApiRouter::new()
            .merge(crate::providers::api::routes(ProvidersApi {
                providers: providers.clone(),
                leases: engine.clone(),
            }))
            .merge(crate::policy::maintenance::routes(
                crate::policy::maintenance::MaintenanceApi {
                    providers: providers.clone(),
                    leases: engine.clone(),
                },
            ))
            .merge(crate::leases::api::routes(LeasesApi {
                leases: engine.clone(),
                shutdown: shutdown_rx.clone(),
            }))
            .merge(crate::events::api::routes(EventsApi {
                auth: auth.clone(),
                bus: bus.clone(),
                db: db.clone(),
                shutdown: shutdown_rx.clone(),
                subscribers: metrics.event_subscribers.clone(),
            }))
            .merge(crate::tokens::api::routes(TokensApi { auth: auth.clone() }))
            .merge(crate::live::routes(crate::live::LiveApi {
                frames: live.clone(),
                providers: providers.clone(),
                leases: engine.clone(),
                shutdown: shutdown_rx.clone(),
            }))
            .merge(audit::router(audit.clone()))
            .merge(audit::bundle::router(audit::bundle::BundleApi {
                audit: audit.clone(),
                db: db.clone(),
                key: signing.clone(),
                leases: engine.clone(),
                blobs: blobs.clone(),
            }))
            .merge(health.clone());
        let (routes, document) = api_routes(
            v1,
            health,
            sessions::api::router(sessions.clone()),
            agents::router(agents.clone()),
            agents::geo_router(agents.clone()),
        );
        let routes = routes.merge(crate::console::router());
        tracing::debug!(paths = document.paths.paths.len(), "OpenAPI document built");
        // Inside the authenticator layer, which it reads.
        let routes = match crate::budgets::RateLimiter::new(&config.policy.rate_limit) {
            Some(limiter) => routes.layer(axum::middleware::from_fn_with_state(
                limiter,
                crate::budgets::RateLimiter::middleware,
            )),
            None => routes,
        };
        let app = build_router(
            routes,
            auth.clone(),
            config.http.body_limit_bytes,
            metrics.http.clone(),
        );
        let limits = http_limits(&config);
        let http = tokio::spawn(crate::http_server::serve(
            listener,
            app,
            limits,
            tls.http.clone(),
            shutdown_rx.clone(),
        ));
        let mut background = vec![tokio::spawn(
            providers
                .clone()
                .run_liveness_monitor(mqtt.hearing(), shutdown_rx.clone()),
        )];
        background.push(sessions.spawn_background(shutdown_rx.clone()));
        let (_deriver, derive_tasks) = crate::derive::Deriver::start(
            db.clone(),
            bus.clone(),
            sessions.clone(),
            providers.store().clone(),
            Some(agents.speech_gateway()),
            config.derived_evidence.clone(),
            shutdown_rx.clone(),
        );
        background.extend(derive_tasks);
        background.push(crate::safe_state::spawn(
            engine.clone(),
            sessions.clone(),
            bus.clone(),
            shutdown_rx.clone(),
        ));
        background.push(audit.spawn_sweeper(shutdown_rx.clone()));
        background.push(
            crate::policy::health_check::HealthChecks::new(
                config.policy.health_checks.clone(),
                engine.clone(),
                sessions.clone(),
                providers.store().clone(),
                db.clone(),
                bus.clone(),
            )
            .spawn(shutdown_rx.clone()),
        );
        background.push(tokio::spawn(run_checkpoints(
            db.clone(),
            signing,
            Duration::from_secs(config.audit_log.checkpoint_interval_seconds),
            shutdown_rx.clone(),
        )));
        background.push(tokio::spawn(crate::broker::run_revocation_watch(
            db.clone(),
            kick,
            shutdown_rx.clone(),
        )));
        tracing::info!(%http_addr, http_scheme, %mqtt_addr, mqtt_tls, "registry ready");
        Ok(RunningRegistry {
            http_addr,
            mqtt_addr,
            mqtt_mode: config.mqtt.mode,
            http_scheme,
            mqtt_tls,
            admin_token,
            providers,
            auth,
            leases: engine,
            sessions,
            audit,
            agents,
            bus,
            db,
            mqtt,
            store_lock,
            cluster,
            shutdown_tx,
            http,
            background,
        })
    }
}

impl RunningRegistry {
    /// The one line `serve` prints on stdout when ready:
    /// `{"event":"ready","http":"127.0.0.1:8080","http_scheme":"http",
    /// "url":"http://127.0.0.1:8080","mqtt":"127.0.0.1:18830",
    /// "mqtt_tls":false,"mqtt_mode":"embedded"}` (`https` and
    /// `"mqtt_tls":true` with TLS; with `[cluster] enabled` also
    /// `"replica"` and `"epoch"`).
    pub fn ready_line(&self) -> String {
        let mut line = json!({
            "event": "ready",
            "http": self.http_addr.to_string(),
            "http_scheme": self.http_scheme,
            "url": self.base_url(),
            "mqtt": self.mqtt_addr.to_string(),
            "mqtt_tls": self.mqtt_tls,
            "mqtt_mode": match self.mqtt_mode {
                MqttMode::Embedded => "embedded",
                MqttMode::External => "external",
            },
        });
        if let Some((replica, epoch)) = &self.cluster {
            line["replica"] = json!(replica);
            line["epoch"] = json!(epoch);
        }
        line.to_string()
    }

    /// With `[cluster] enabled`: this replica's id and its epoch (how many
    /// takeovers the store has seen, this one included).
    pub fn cluster(&self) -> Option<(&str, i64)> {
        self.cluster.as_ref().map(|(r, e)| (r.as_str(), *e))
    }

    /// True once the store's writer session reopened and found the
    /// PostgreSQL advisory lock taken by another registry: this one writes
    /// no more and must stop (`serve` exits with status 75).
    pub fn lost_store_lock(&self) -> bool {
        match &self.store_lock {
            StoreLock::Postgres(lost) => lost.load(std::sync::atomic::Ordering::SeqCst),
            StoreLock::File(_) => false,
        }
    }

    /// `{http_scheme}://{http_addr}`.
    pub fn base_url(&self) -> String {
        format!("{}://{}", self.http_scheme, self.http_addr)
    }

    /// The database file.
    pub fn db_path(&self) -> PathBuf {
        self.db.path().to_path_buf()
    }

    /// What keeps the registry from serving, if anything, for the systemd
    /// watchdog ([`crate::notify`]): the HTTP server has stopped, a lease
    /// engine task has stopped, the engine's state is not free within
    /// `limit`, or the store's writer does not take the write lock within
    /// `limit` (`BEGIN IMMEDIATE; ROLLBACK`, which writes nothing, so a
    /// full disk is not a problem here; `/healthz` reports that). An
    /// unreachable external broker is not one either: a restart would not
    /// bring it back.
    pub async fn health_problem(&self, limit: Duration) -> Option<String> {
        if self.http.is_finished() {
            return Some("the HTTP server has stopped".into());
        }
        if let Err(e) = self.leases.tasks_alive() {
            return Some(e.into());
        }
        let leases = self.leases.clone();
        let engine = tokio::task::spawn_blocking(move || leases.queue_len());
        if !matches!(tokio::time::timeout(limit, engine).await, Ok(Ok(_))) {
            return Some(format!(
                "the lease engine's state is not free within {} ms",
                limit.as_millis()
            ));
        }
        let probe = self
            .db
            .write(|c| c.execute_batch("BEGIN IMMEDIATE; ROLLBACK"));
        match tokio::time::timeout(limit, probe).await {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(e))) => Some(format!("the store does not take writes: {e}")),
            Ok(Err(e)) => Some(format!("the store's writer: {e}")),
            Err(_) => Some(format!(
                "the store's writer does not answer within {} ms",
                limit.as_millis()
            )),
        }
    }

    /// Stop: signal every task, let HTTP finish in-flight requests (SSE
    /// streams end), disconnect MQTT, stop the lease engine.
    pub async fn shutdown(self) {
        let _ = self.shutdown_tx.send(true);
        if tokio::time::timeout(Duration::from_secs(10), self.http)
            .await
            .is_err()
        {
            tracing::warn!("HTTP server did not finish within 10 s");
        }
        self.leases.shutdown().await;
        self.mqtt.stop().await;
        for t in self.background {
            let _ = tokio::time::timeout(Duration::from_secs(3), t).await;
        }
        // Last: the next registry on a PostgreSQL store may take over now.
        if matches!(self.store_lock, StoreLock::Postgres(_)) {
            let released = self.db.write(|c| c.release_fence()).await;
            let problem = match released {
                Ok(Ok(())) => None,
                Ok(Err(e)) => Some(e.to_string()),
                Err(e) => Some(e.to_string()),
            };
            if let Some(e) = problem {
                tracing::warn!(error = %e, "cannot let go of the store's lock; it goes with the session");
            }
        }
        tracing::info!("registry stopped");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The schema version is recorded once; a store at a newer version is
    /// refused before anything in it changes.
    #[test]
    fn a_store_from_a_newer_registry_is_refused_untouched() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.sqlite3");
        drop(open_db(&path).unwrap());
        drop(open_db(&path).unwrap());
        let c = Connection::open(&path).unwrap();
        let versions: Vec<i64> = c
            .prepare("SELECT version FROM schema_versions")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        assert_eq!(versions, [SCHEMA_VERSION]);
        c.execute(
            "INSERT INTO schema_versions VALUES (?1, 'now', 'cloud-registry 9.0.0')",
            [SCHEMA_VERSION + 1],
        )
        .unwrap();
        c.execute_batch("DROP TABLE cluster_leader").unwrap();
        drop(c);
        let err = open_db(&path).err().expect("refused").to_string();
        assert!(
            err.contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
            "{err}"
        );
        assert!(err.contains("newer than this registry"), "{err}");
        let c = Connection::open(&path).unwrap();
        assert!(!c.has_table("cluster_leader").unwrap(), "no migration ran");
    }

    /// A command-line tool opening the store (migrations included) while
    /// the registry commits steadily (here several thousand commits a
    /// second, with the short gaps between them that requests leave)
    /// waits its turn instead of failing with `database is locked`.
    /// (SQLite's write lock is not fair: against a writer that never lets
    /// go for more than a yield, a waiter can starve past its busy
    /// timeout whatever it does.)
    #[test]
    fn opening_the_store_while_another_connection_commits_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.sqlite3");
        drop(open_db(&path).unwrap());
        Connection::open(&path)
            .unwrap()
            .execute_batch("CREATE TABLE busy_probe (n INTEGER NOT NULL)")
            .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let writer = {
            let (path, stop) = (path.clone(), stop.clone());
            std::thread::spawn(move || {
                let c = Connection::open(&path).unwrap();
                let mut n = 0i64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    c.execute("INSERT INTO busy_probe (n) VALUES (?1)", [n])
                        .unwrap();
                    n += 1;
                    std::thread::sleep(Duration::from_micros(100));
                }
                n
            })
        };
        let mut failures = Vec::new();
        for _ in 0..40 {
            if let Err(e) = open_db(&path) {
                failures.push(e.to_string());
            }
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let commits = writer.join().unwrap();
        assert!(commits > 0, "the other connection committed meanwhile");
        assert!(failures.is_empty(), "{failures:?}");
    }
}
