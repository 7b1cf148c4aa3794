//! Sessions and artifacts (seed 001 §2.2.4, §2.2.5, §5.4): actions run on
//! leased hardware and the evidence they leave (docs/architecture.md
//! "Artifact bytes (HTTP)", "Fencing"; docs/actions.md). One file per job:
//! - [`dispatch`]: an action's path, [`Sessions::invoke`], and waiting for
//!   a session to end;
//! - [`reads`]: sessions and artifacts by id or filter;
//! - [`uploads`]: artifact bytes over HTTP (checksums, held bytes,
//!   resumable uploads: [`partial`]; bytes nothing binds: [`unbound`]);
//! - [`ingest`]: the providers' `session_update`s and `session_sync`;
//! - [`supervise`]: the deadline watchdog ([`deadlines`]), lost providers,
//!   sweeps, and the sessions of a lease that ended;
//! - [`sql`]: the tables and their reads and writes; [`blobs`]: the
//!   content-addressed blob store on disk, [`blobs_s3`] in a bucket,
//!   [`blob_config`] the `[blobs]` table; [`byte_range`]: `Range` requests
//!   on downloads; [`error`]: [`SessionError`]; [`api`]: the routes and the
//!   HTTP mapping of [`SessionError`].

pub mod api;
pub mod blob_config;
pub mod blobs;
pub mod blobs_s3;
pub mod byte_range;
mod deadlines;
mod dispatch;
pub mod error;
mod ingest;
pub mod partial;
mod reads;
pub mod sql;
mod supervise;
pub mod unbound;
mod uploads;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::session::CapabilitySession;
use tokio::sync::{oneshot, watch, RwLock};

pub use blob_config::{BlobBackend, BlobsConfig};
pub use blobs::{BlobContent, BlobError, BlobStore, FsBlobStore, StagedBlob};
pub use blobs_s3::S3BlobStore;
pub use dispatch::{input_summary, COMMAND_OVERHEAD_BYTES, INPUT_SUMMARY_MAX_BYTES};
pub use error::SessionError;
pub use reads::Download;
pub use sql::{ArtifactFilter, SessionFilter};
pub use uploads::{UploadPermit, UploadReceipt};

use crate::budgets::ActionBudgets;
use crate::db::{Db, DbError};
use crate::events::EventBus;
use crate::leases::LeaseEngine;
use crate::mqtt::CommandSender;
use crate::providers::ProviderStore;
use crate::twins::TwinWatch;
use deadlines::Deadlines;
use supervise::ReportWindow;

/// One error layer out of two: a database job's own error (a SQLite
/// error from inside the closure) and the database thread's
/// ([`DbError::Closed`]), as in `db.read(...).await.and_then(flat)`, so a
/// caller handles both in one arm.
fn flat<T, E: Into<DbError>>(result: Result<T, E>) -> Result<T, DbError> {
    result.map_err(Into::into)
}

/// The `[sessions]` table of the registry's configuration.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SessionsConfig {
    /// Directory of the content-addressed artifact store. Default: the
    /// directory `artifacts` next to the SQLite file.
    pub artifact_dir: Option<PathBuf>,
    /// Largest artifact a provider may upload, bytes (512 MiB). Larger
    /// bodies get 413 `body_too_large`; this limit, not
    /// `http.body_limit_bytes`, applies to artifact uploads.
    pub max_artifact_bytes: u64,
    /// Driver deadline sent when an invocation gives no `timeout_ms`,
    /// milliseconds (30 000).
    pub default_timeout_ms: u32,
    /// How long after the driver deadline the registry still waits for the
    /// provider's report before failing a session, milliseconds (15 000).
    pub result_grace_ms: u64,
    /// After the lease under a running session ends, how long the provider
    /// has to report the session's end before the registry fails it,
    /// milliseconds (15 000). A non-interruptible action holds up
    /// revocation until it finishes, so this only covers the report.
    pub revoke_grace_ms: u64,
    /// After a lease with `evidence_required` ends, how long its sessions'
    /// artifact bytes may still take to arrive before those sessions
    /// become `incomplete_evidence`, milliseconds (30 000; seed 001 §5.4,
    /// docs/policy.md "Evidence at lease end"). A session returns to
    /// `completed` when its last bytes arrive later.
    pub evidence_grace_ms: u64,
    /// How long bytes that no artifact binds are kept from their first
    /// upload, seconds (604800, 7 days). Bytes uploaded before their metadata must
    /// be bound within this time (the metadata arrives), or they are
    /// deleted; a blob an uploaded artifact shares is never deleted. At
    /// least 1.
    pub unbound_upload_ttl_seconds: u64,
    /// Most bytes a provider may hold that no artifact binds, bytes (1 GiB);
    /// beyond it, uploads of new bytes for unknown artifact ids are refused
    /// with 409 `unbound_upload_limit` until the metadata binds some or
    /// they expire. 0: no limit.
    pub max_unbound_bytes_per_provider: u64,
    /// Most bytes of unfinished resumable uploads (ranged PUTs) a provider
    /// may have the registry keep, bytes (2 GiB); beyond it a ranged PUT
    /// gets 409 `partial_upload_limit`. 0: no limit.
    pub max_partial_bytes_per_provider: u64,
    /// How long an unfinished resumable upload is kept after its last
    /// write, seconds (86400, a day). At least 1.
    pub partial_upload_ttl_seconds: u64,
}

impl Default for SessionsConfig {
    fn default() -> Self {
        Self {
            artifact_dir: None,
            max_artifact_bytes: 512 * 1024 * 1024,
            default_timeout_ms: 30_000,
            result_grace_ms: 15_000,
            revoke_grace_ms: 15_000,
            evidence_grace_ms: 30_000,
            unbound_upload_ttl_seconds: 7 * 24 * 3600,
            max_unbound_bytes_per_provider: 1024 * 1024 * 1024,
            max_partial_bytes_per_provider: 2 * 1024 * 1024 * 1024,
            partial_upload_ttl_seconds: 24 * 3600,
        }
    }
}

/// Create the tables of sessions, artifacts and held uploads, and the
/// bookkeeping of unbound bytes (idempotent).
pub fn migrate(conn: &crate::sql::Connection) -> rusqlite::Result<()> {
    sql::migrate(conn)?;
    unbound::migrate(conn)
}

/// Most sessions or artifacts one listing returns.
pub const MAX_LIST: usize = 10_000;

/// The sessions service. Create with [`Sessions::new`], attach the MQTT
/// link with [`Sessions::attach_commands`], start its background tasks with
/// [`Sessions::spawn_background`], register it with
/// `Providers::add_hooks`. Share the `Arc`.
pub struct Sessions {
    db: Db,
    bus: EventBus,
    leases: Arc<LeaseEngine>,
    providers: Arc<dyn ProviderStore>,
    blobs: Arc<dyn BlobStore>,
    commands: OnceLock<CommandSender>,
    twins: OnceLock<Arc<TwinWatch>>,
    cfg: SessionsConfig,
    /// Per capability, the sessions of non-interruptible actions (seed 001
    /// §6.4) sent and not yet ended: while there is one, the lease engine
    /// holds revocation and preemption back.
    windows: Mutex<HashMap<String, HashSet<String>>>,
    /// The registry's shutdown signal (from [`Sessions::spawn_background`]):
    /// when it turns true, callers waiting for a session to end are
    /// answered at once with the session as it is.
    shutdown: OnceLock<watch::Receiver<bool>>,
    /// Callers waiting for a session to end (`wait_ms`), by session id:
    /// woken with the final session when its `session_completed` /
    /// `session_failed` event is published.
    finals: Mutex<HashMap<String, Vec<oneshot::Sender<CapabilitySession>>>>,
    /// Uploads hold it (shared) from storing a blob until its row is
    /// committed; the sweep of unbound bytes holds it (exclusive) from
    /// choosing blobs until their files are gone. So an upload can never
    /// find a blob already stored that the sweep then deletes.
    blob_gc: RwLock<()>,
    /// Declared bytes of uploads for unknown artifacts whose bodies are
    /// arriving, per provider: they count toward the unbound-bytes limit.
    unbound_in_flight: unbound::InFlight,
    /// Largest MQTT packet the registry's link sends, bytes (0: not
    /// checked); see [`Sessions::set_max_command_bytes`].
    max_command_bytes: AtomicUsize,
    /// Providers with a session update that could not be stored because
    /// the store's disk was full: once it is writable again, each is sent
    /// a `session_sync` so that its edge sends the update again.
    resync_after_full: Mutex<HashSet<String>>,
    /// Whether the registry can hear its providers' reports; see
    /// [`Sessions::set_hearing`].
    hearing: OnceLock<ReportWindow>,
    /// Providers marked offline because a registry with the embedded
    /// broker restarted before they reconnected: once the registry has
    /// heard for a full window, those still offline lose their sessions.
    unheard_since_restart: Mutex<Vec<String>>,
    /// The open sessions' deadlines on the monotonic clock, and the fences
    /// of those this process sent (see [`deadlines`]); the watchdog fails
    /// those that pass.
    deadlines: Mutex<Deadlines>,
    /// Unfinished resumable uploads (see [`partial`]).
    partials: partial::Partials,
    /// The lab's actuator budgets (`[policy.budgets]`), checked before
    /// an action is sent; see [`Sessions::attach_budgets`].
    budgets: OnceLock<Arc<ActionBudgets>>,
    /// Ended leases with `evidence_required` whose sessions' evidence is
    /// judged once the monotonic instant passes (`evidence_grace_ms`
    /// after the end): lease id by due instant.
    evidence_due: Mutex<Vec<(std::time::Instant, String)>>,
    /// Called with each `artifact_uploaded` event once it is committed
    /// (the deriving of evidence, `crate::derive`); see
    /// [`Sessions::on_artifact_uploaded`].
    uploaded_hook: OnceLock<UploadedHook>,
    /// Where action round trips are recorded; see
    /// [`Sessions::attach_metrics`].
    metrics: OnceLock<crate::metrics::ActionMetrics>,
}

/// What [`Sessions::on_artifact_uploaded`] registers.
pub type UploadedHook = Arc<dyn Fn(&CapabilityEvent) + Send + Sync>;

impl Sessions {
    /// A service over `db` (tables from [`migrate`]), publishing on `bus`,
    /// authorizing through `leases`, reading capabilities and providers
    /// from `providers`, keeping bytes in `blobs`.
    pub fn new(
        db: Db,
        bus: EventBus,
        leases: Arc<LeaseEngine>,
        providers: Arc<dyn ProviderStore>,
        blobs: Arc<dyn BlobStore>,
        cfg: SessionsConfig,
    ) -> Arc<Self> {
        Arc::new(Self {
            db,
            bus,
            leases,
            providers,
            commands: OnceLock::new(),
            twins: OnceLock::new(),
            cfg,
            windows: Mutex::new(HashMap::new()),
            shutdown: OnceLock::new(),
            finals: Mutex::new(HashMap::new()),
            blob_gc: RwLock::new(()),
            unbound_in_flight: unbound::InFlight::default(),
            max_command_bytes: AtomicUsize::new(0),
            hearing: OnceLock::new(),
            unheard_since_restart: Mutex::new(Vec::new()),
            deadlines: Mutex::new(Deadlines::default()),
            partials: partial::Partials::new(&blobs.staging_dir()),
            blobs,
            resync_after_full: Mutex::new(HashSet::new()),
            budgets: OnceLock::new(),
            evidence_due: Mutex::new(Vec::new()),
            uploaded_hook: OnceLock::new(),
            metrics: OnceLock::new(),
        })
    }

    /// Give the service the MQTT link's command queue (once; later calls
    /// are ignored). Until then invocations answer 503
    /// `control_plane_unavailable`.
    pub fn attach_commands(&self, sender: CommandSender) {
        let _ = self.commands.set(sender);
    }

    /// Record each action's round trip (its command leaving to the
    /// provider's final result) in `metrics` (once; later calls are
    /// ignored): `benchlink_action_round_trip_seconds`.
    pub fn attach_metrics(&self, metrics: crate::metrics::ActionMetrics) {
        let _ = self.metrics.set(metrics);
    }

    /// Give the service the lab's action budgets (once): an actuator
    /// action over one is refused with 429 `action_budget_exceeded`
    /// before anything is sent (docs/policy.md "Action budgets").
    pub fn attach_budgets(&self, budgets: Arc<ActionBudgets>) {
        let _ = self.budgets.set(budgets);
    }

    /// Give the service the registry's twin detection (once): actions on
    /// a provider in conflict are refused with 409 `provider_conflict`.
    pub fn attach_twins(&self, twins: Arc<TwinWatch>) {
        let _ = self.twins.set(twins);
    }

    /// The MQTT packet limit of the registry's link, bytes: an invocation
    /// whose `action_invoke` command (with its envelope, topic and MQTT
    /// header) would be larger is refused with 413 `command_too_large`
    /// before any session exists. 0 (the default) checks nothing.
    pub fn set_max_command_bytes(&self, bytes: usize) {
        self.max_command_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Call `hook` (once; later calls are ignored) with every
    /// `artifact_uploaded` event after its transaction committed, whatever
    /// path bound the bytes (an upload after the metadata, or metadata
    /// after held bytes). It must not block.
    pub fn on_artifact_uploaded(&self, hook: UploadedHook) {
        let _ = self.uploaded_hook.set(hook);
    }

    /// Hold off the sweep of unbound bytes while bytes just stored in the
    /// blob store are not yet bound by a committed artifact row (as an
    /// upload does): keep the guard until the row is committed.
    pub async fn hold_blobs(&self) -> tokio::sync::RwLockReadGuard<'_, ()> {
        self.blob_gc.read().await
    }

    /// The blob store of artifact bytes.
    pub fn blobs(&self) -> &Arc<dyn BlobStore> {
        &self.blobs
    }

    /// The settings in force.
    pub fn config(&self) -> &SessionsConfig {
        &self.cfg
    }

    /// Hand committed events to the bus; a session that ended closes its
    /// non-interruptible window.
    async fn publish(&self, events: impl IntoIterator<Item = CapabilityEvent>) {
        let events: Vec<CapabilityEvent> = events.into_iter().collect();
        let mut closed = Vec::new();
        for ev in &events {
            if ev.event_type == EventType::ArtifactUploaded {
                if let Some(hook) = self.uploaded_hook.get() {
                    hook(ev);
                }
                continue;
            }
            if !matches!(
                ev.event_type,
                EventType::SessionCompleted | EventType::SessionFailed
            ) {
                continue;
            }
            let (Some(cap), Some(session)) = (&ev.capability_id, &ev.session_id) else {
                continue;
            };
            crate::leases::lock(&self.deadlines).remove(session);
            let waiting = crate::leases::lock(&self.finals).remove(session);
            if let Some(waiting) = waiting {
                if let Ok(s) = CapabilitySession::deserialize(&ev.data) {
                    for w in waiting {
                        let _ = w.send(s.clone());
                    }
                }
            }
            let mut w = crate::leases::lock(&self.windows);
            if let Some(set) = w.get_mut(cap) {
                if set.remove(session) && set.is_empty() {
                    w.remove(cap);
                    closed.push(cap.clone());
                }
            }
        }
        self.bus.publish(events);
        for cap in closed {
            self.leases.set_non_interruptible(&cap, false).await;
        }
    }
}
