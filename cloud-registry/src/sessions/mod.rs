//! Sessions and artifacts (seed 001 §2.2.4, §2.2.5, §5.4): actions run on
//! leased hardware and the evidence they leave.
//!
//! # An action's path
//! `POST /api/v1/capability-leases/{lease_id}/actions` ([`Sessions::invoke`])
//! checks, in this order, that the caller holds the lease, that the
//! capability supports the action, that its provider is online and the
//! registry's MQTT link is up, and finally asks the lease engine
//! ([`LeaseEngine::authorize_action`]) — only then is a session stored
//! (`running`, event `session_started`) and `action_invoke` published on
//! the provider's `commands` topic. A refusal leaves no session behind.
//! The provider answers with `session_update`s on its `results` topic
//! ([`ProviderHooks::on_session_update`]); the final one ends the session
//! (`session_completed` / `session_failed`) and carries the metadata of
//! the artifacts it produced.
//!
//! # Artifact bytes
//! `PUT /api/v1/artifacts/{artifact_id}/content` with the provider token and
//! `X-Checksum-Sha256`: the body is streamed to a staging file while it is
//! hashed (never held in memory), compared with the header (and with the
//! metadata's checksum when known), then stored content-addressed in the
//! [`BlobStore`]. A mismatch is `422 checksum_mismatch` and nothing is
//! kept. A repeated PUT of the same bytes answers `200` with the same
//! record.
//!
//! Bytes and metadata travel separately (HTTP and MQTT), so either may come
//! first. Bytes that arrive before their metadata are verified against
//! their header, stored, and *held* for the artifact id and the uploading
//! provider (`artifact_pending_uploads`), answering `201`; when the
//! metadata arrives from the same provider with the same sha256 they are
//! bound and the artifact is `uploaded` at once. Held bytes whose metadata
//! names another sha256 are not bound (logged); the artifact then waits for
//! a correct upload.
//!
//! # Bytes nothing binds
//! Bytes no artifact row binds (held bytes whose metadata never comes, bytes
//! a later PUT under the same id replaced, bytes whose metadata named
//! another sha256) are kept for `sessions.unbound_upload_ttl_seconds` from
//! their first upload ([`unbound`]). The watchdog then drops the held
//! record and deletes the blob, unless an uploaded artifact has the same
//! sha256 (blobs are shared by content) or a younger held upload names it.
//! Each removal is logged at `info`. While a provider holds more than
//! `sessions.max_unbound_bytes_per_provider` such bytes, its uploads of new
//! bytes for artifacts whose metadata is unknown get 409
//! `unbound_upload_limit` (checked before the body is read, from
//! `Content-Length`); uploads for known artifacts are never limited.
//!
//! # When things go wrong
//! - Provider offline or restarted with a new boot id (seed 001 §5.4): its
//!   running sessions end (when it is only unheard since a restart of a
//!   registry with the embedded broker, not before the registry has heard
//!   for a full offline timeout without it coming back), `incomplete_evidence` when some of their
//!   artifacts' bytes are missing, `failed` otherwise; its completed
//!   sessions still waiting for bytes become `incomplete_evidence`. A
//!   session the registry ended this way takes the provider's own final
//!   report if one arrives later (the edge queues its updates across
//!   outages), and an `incomplete_evidence` session the provider had
//!   completed becomes `completed` again once its last artifact arrives.
//! - No final report by the session's deadline (`timeout_ms` plus
//!   `result_grace_ms`, on the monotonic clock: `deadlines.rs`): the
//!   registry fails the session (not while its
//!   MQTT link is down; in the first offline timeout after the link
//!   (re)connects or the registry starts, only sessions sent since: an
//!   older one's report may still be on its way).
//! - The lease ends under a running session (preempted at the end of its
//!   grace period, expired, or released): the registry forwards
//!   `action_cancel` for each running session (besides the `lease_revoked`
//!   the MQTT bridge sends for preemption and expiry); interruptible
//!   actions stop, non-interruptible ones (seed 001 §6.4) finish first. A
//!   session cut this way ends `failed` with the reason first in its
//!   `error_message`, e.g. `lease revoked by preemption: safety_stop (…)`,
//!   then what the provider said, without the reason it repeats
//!   (`… (provider: cancelled)`; [`store::lease_end_message`]).

pub mod api;
pub mod blobs;
mod deadlines;
pub mod error;
pub mod partial;
pub mod store;
pub mod unbound;

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use shared_protocol::artifact::{is_sha256_hex, CapabilityArtifact};
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::lease::{CapabilityLease, LeaseStatus};
use shared_protocol::mqtt::{ActionCancel, ActionCommand, MessageType, SessionSync, SessionUpdate};
use shared_protocol::provider::OnlineStatus;
use shared_protocol::session::{ActionInvokeRequest, CapabilitySession, SessionStatus};
use tokio::sync::{oneshot, watch, RwLock};
use tokio::task::JoinHandle;

pub use blobs::{BlobContent, BlobError, BlobStore, FsBlobStore, StagedBlob};
pub use error::SessionError;
pub use store::{ArtifactFilter, SessionFilter};

use crate::auth::Principal;
use crate::db::{Db, DbError};
use crate::events::EventBus;
use crate::follow::{EventFollower, Followed};
use crate::hearing::Hearing;
use crate::leases::{LeaseEngine, LeaseError};
use crate::mqtt::CommandSender;
use crate::registry::{OfflineReason, ProviderHooks};
use crate::store::Store;
use crate::twins::TwinWatch;
use deadlines::Deadlines;
use store::{UpdateRefused, UploadRecorded, UploadRefused};

/// Bytes an `action_invoke` publish adds to its encoded command: the
/// envelope's other fields, the topic and the MQTT header (a generous
/// bound, so a command that passes the check is never refused by the
/// client).
pub const COMMAND_OVERHEAD_BYTES: usize = 1024;

/// One error layer out of two: a database job's own error (a SQLite
/// error from inside the closure) and the database thread's
/// ([`DbError::Closed`]), as in `db.read(...).await.and_then(flat)`, so a
/// caller handles both in one arm.
fn flat<T, E: Into<DbError>>(result: Result<T, E>) -> Result<T, DbError> {
    result.map_err(Into::into)
}

/// Length of `value` encoded as JSON, bytes (0 if it cannot be encoded),
/// counted without keeping the encoding.
fn encoded_len<T: Serialize>(value: &T) -> usize {
    struct Count(usize);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut n = Count(0);
    match serde_json::to_writer(&mut n, value) {
        Ok(()) => n.0,
        Err(_) => 0,
    }
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
            unbound_upload_ttl_seconds: 7 * 24 * 3600,
            max_unbound_bytes_per_provider: 1024 * 1024 * 1024,
            max_partial_bytes_per_provider: 2 * 1024 * 1024 * 1024,
            partial_upload_ttl_seconds: 24 * 3600,
        }
    }
}

/// Create the tables of sessions, artifacts and held uploads, and the
/// bookkeeping of unbound bytes (idempotent).
pub fn migrate(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    store::migrate(conn)?;
    unbound::migrate(conn)
}

/// How often running sessions are checked against their deadline.
const WATCHDOG_PERIOD: Duration = Duration::from_millis(500);

/// Longest time between two sweeps of unbound bytes.
const MAX_UNBOUND_SWEEP_PERIOD: Duration = Duration::from_secs(60);
/// How far back a session the registry ended by presumption (provider
/// offline, deadline) is still listed in a `session_sync`: the hour for
/// which an edge keeps its acknowledged final updates.
const PRESUMED_SYNC_WINDOW: chrono::Duration = chrono::Duration::hours(1);
/// Most open sessions one provider is asked about at a reconnection (in
/// messages of [`SessionSync::MAX_SESSIONS`]).
const MAX_SYNCED_SESSIONS: usize = 10_000;

/// Most sessions or artifacts one listing returns.
pub const MAX_LIST: usize = 10_000;

/// The sessions service. Create with [`Sessions::new`], attach the MQTT
/// link with [`Sessions::attach_commands`], start its background tasks with
/// [`Sessions::spawn_background`], register it with
/// `CapabilityRegistry::add_hooks`. Share the `Arc`.
pub struct Sessions {
    db: Db,
    bus: EventBus,
    leases: Arc<LeaseEngine>,
    store: Arc<dyn Store>,
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
    /// Per open session sent by this process: its lease and its
    /// command's `not_after`, so judging a report against its fence
    /// reads nothing from the store while the lease lives.
    fences: Mutex<HashMap<String, (String, chrono::DateTime<Utc>)>>,
    /// The open sessions' deadlines on the monotonic clock (see
    /// [`deadlines`]); the watchdog fails those that pass.
    deadlines: Mutex<Deadlines>,
    /// Unfinished resumable uploads (see [`partial`]).
    partials: partial::Partials,
}

/// Whether the registry can hear ([`Hearing`]: `None` while its MQTT link
/// is down, else the monotonic instant of its latest (re)connection or
/// stall's end) and how long after that providers get to report before
/// the registry judges their silence.
struct ReportWindow {
    hearing: Hearing,
    window: Duration,
}

/// Which overdue sessions the watchdog may fail now.
enum Judge {
    /// Every one: the registry has heard for a full window.
    All,
    /// Only those sent after this monotonic instant (on the current MQTT
    /// connection, so their reports had a clear way back).
    SentAfter(tokio::time::Instant),
    /// None: the link is down.
    Nobody,
}

impl ReportWindow {
    fn judge(&self) -> Judge {
        match self.hearing.since() {
            None => Judge::Nobody,
            Some(t) if t.elapsed() >= self.window => Judge::All,
            Some(t) => Judge::SentAfter(tokio::time::Instant::from_std(t)),
        }
    }
}

/// An upload that passed [`Sessions::precheck_upload`]: the declared
/// sha256 (lowercase hex) and, for an artifact whose metadata is unknown,
/// the bytes it counts toward the provider's unbound limit while its body
/// arrives (released on drop).
#[derive(Debug)]
pub struct UploadPermit {
    /// The declared `X-Checksum-Sha256`, lowercase hex.
    pub sha256: String,
    _reservation: Option<unbound::Reservation>,
}

/// What an upload did, for the HTTP answer.
#[derive(Debug, Clone)]
pub struct UploadReceipt {
    /// True when this PUT stored or bound the bytes (201); false for a
    /// repeat of bytes already received (200).
    pub first: bool,
    /// The artifact record, or for bytes held before their metadata:
    /// `{artifact_id, checksum, size_bytes, uploaded: true,
    /// metadata_received: false}`.
    pub record: Value,
}

/// Largest `input_summary` a session keeps, bytes of compact JSON.
pub const INPUT_SUMMARY_MAX_BYTES: usize = 4096;

/// A session's `input_summary` for action parameters `params` (the
/// command to the provider always carries them whole):
/// - `params` as given when their compact JSON takes at most
///   [`INPUT_SUMMARY_MAX_BYTES`] bytes;
/// - otherwise `{"truncated": true, "original_size_bytes": N,
///   "key_count": K, "keys": [...]}`: N the size of the parameters' JSON
///   in bytes, K the number of top-level keys, `keys` those keys in sorted
///   order, as many as fit in [`INPUT_SUMMARY_MAX_BYTES`] (all of them
///   unless there are very many or very long ones).
///
/// So a session, its `session_*` events and every listing stay small
/// whatever the parameters (up to the 1 MiB body limit) hold.
pub fn input_summary(params: &Map<String, Value>) -> Value {
    struct ByteCount(usize);
    impl std::io::Write for ByteCount {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut size = ByteCount(0);
    let _ = serde_json::to_writer(&mut size, params);
    if size.0 <= INPUT_SUMMARY_MAX_BYTES {
        return Value::Object(params.clone());
    }
    let mut keys: Vec<&String> = params.keys().collect();
    keys.sort_unstable();
    let mut summary = json!({
        "truncated": true,
        "original_size_bytes": size.0,
        "key_count": params.len(),
        "keys": [],
    });
    let mut used = summary.to_string().len();
    let mut listed = Vec::new();
    for key in keys {
        // The key as a JSON string, and a comma.
        let cost = serde_json::to_string(key).map_or(usize::MAX, |k| k.len() + 1);
        if used.saturating_add(cost) > INPUT_SUMMARY_MAX_BYTES {
            break;
        }
        used += cost;
        listed.push(Value::String(key.clone()));
    }
    summary["keys"] = Value::Array(listed);
    summary
}

/// The `not_after` of a command sent at `now` under `lease` with a driver
/// deadline of `timeout_ms`: the earliest of that deadline, the lease's
/// `expires_at` and, while it is being preempted, its `grace_until`
/// (docs/architecture.md "Fencing").
fn command_not_after(
    lease: &CapabilityLease,
    now: chrono::DateTime<Utc>,
    timeout_ms: u32,
) -> chrono::DateTime<Utc> {
    let deadline = now + chrono::Duration::milliseconds(i64::from(timeout_ms));
    [Some(deadline), lease.expires_at, lease.grace_until]
        .into_iter()
        .flatten()
        .min()
        .unwrap_or(deadline)
}

fn lease_end_reason(lease: &CapabilityLease) -> Option<String> {
    match lease.status {
        LeaseStatus::Revoked => Some(format!(
            "lease revoked by preemption: {} (lease `{}` of higher priority took over at the end of the grace period)",
            lease.preempt_reason.as_deref().unwrap_or("no reason given"),
            lease.preempted_by.as_deref().unwrap_or("?"),
        )),
        LeaseStatus::Expired => Some("lease expired before the action ended".to_string()),
        LeaseStatus::Released => Some("lease released by its holder before the action ended".to_string()),
        LeaseStatus::Failed => Some("lease failed before the action ended".to_string()),
        _ => None,
    }
}

/// The reason recorded on running sessions for a lease event, if it ends
/// the lease.
fn reason_for_event(ev: &CapabilityEvent) -> Option<String> {
    let why = ev.data.get("reason").and_then(Value::as_str);
    match ev.event_type {
        EventType::LeasePreempted => {
            let field = |k: &str| ev.data.get(k).and_then(Value::as_str).map(str::to_string);
            let (reason, by) = (field("preempt_reason"), field("preempted_by"));
            Some(format!(
                "lease revoked by preemption: {} (lease `{}` of higher priority took over at the end of the grace period)",
                reason.as_deref().unwrap_or("no reason given"),
                by.as_deref().unwrap_or("?"),
            ))
        }
        EventType::LeaseExpired => Some(format!(
            "lease expired ({}) before the action ended",
            why.unwrap_or("ttl_elapsed")
        )),
        EventType::LeaseReleased => Some(match why {
            Some(w) => format!("lease released by its holder ({w}) before the action ended"),
            None => "lease released by its holder before the action ended".to_string(),
        }),
        _ => None,
    }
}

impl Sessions {
    /// A service over `db` (tables from [`migrate`]), publishing on `bus`,
    /// authorizing through `leases`, reading capabilities and providers
    /// from `store`, keeping bytes in `blobs`.
    pub fn new(
        db: Db,
        bus: EventBus,
        leases: Arc<LeaseEngine>,
        store: Arc<dyn Store>,
        blobs: Arc<dyn BlobStore>,
        cfg: SessionsConfig,
    ) -> Arc<Self> {
        Arc::new(Self {
            db,
            bus,
            leases,
            store,
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
            fences: Mutex::new(HashMap::new()),
            deadlines: Mutex::new(Deadlines::default()),
            partials: partial::Partials::new(&blobs.staging_dir()),
            blobs,
            resync_after_full: Mutex::new(HashSet::new()),
        })
    }

    /// Give the service the MQTT link's command queue (once; later calls
    /// are ignored). Until then invocations answer 503
    /// `control_plane_unavailable`.
    pub fn attach_commands(&self, sender: CommandSender) {
        let _ = self.commands.set(sender);
    }

    /// Give the service the registry's twin detection (once): actions on
    /// a provider in conflict are refused with 409 `provider_conflict`.
    pub fn attach_twins(&self, twins: Arc<TwinWatch>) {
        let _ = self.twins.set(twins);
    }

    /// Tell the service when it can hear providers (once; later calls are
    /// ignored): `hearing` from [`crate::mqtt::MqttLink::hearing`],
    /// `window` the heartbeat offline timeout. While the link is down no
    /// session is failed for a passed deadline, and for `window` after it
    /// (re)connects (also after the registry starts, and after the
    /// registry ran again following a stall) only those sent since: the
    /// report of an older one may still be on its way (an edge reconnects
    /// with a backoff of up to 10 s; a stopped registry has unread
    /// reports queued). Without this call deadlines are enforced at once.
    pub fn set_hearing(&self, hearing: Hearing, window: Duration) {
        let _ = self.hearing.set(ReportWindow { hearing, window });
    }

    /// Which overdue sessions may be failed now (see
    /// [`Sessions::set_hearing`]).
    fn judge(&self) -> Judge {
        self.hearing.get().map_or(Judge::All, ReportWindow::judge)
    }

    /// The MQTT packet limit of the registry's link, bytes: an invocation
    /// whose `action_invoke` command (with its envelope, topic and MQTT
    /// header) would be larger is refused with 413 `command_too_large`
    /// before any session exists. 0 (the default) checks nothing.
    pub fn set_max_command_bytes(&self, bytes: usize) {
        self.max_command_bytes.store(bytes, Ordering::Relaxed);
    }

    /// The settings in force.
    pub fn config(&self) -> &SessionsConfig {
        &self.cfg
    }

    /// Start the background tasks until `shutdown` turns true: the
    /// deadline watchdog (which also sweeps unbound bytes), and the
    /// follower of lease events (from `event_id > follow_after`, normally
    /// the log's end at start) that cancels sessions whose lease ended.
    pub fn spawn_background(
        self: &Arc<Self>,
        shutdown: watch::Receiver<bool>,
        follow_after: u64,
    ) -> Vec<JoinHandle<()>> {
        let _ = self.shutdown.set(shutdown.clone());
        vec![
            tokio::spawn(self.clone().run_watchdog(shutdown.clone())),
            tokio::spawn(self.clone().run_lease_follower(shutdown, follow_after)),
        ]
    }

    /// Hand committed events to the bus; a session that ended closes its
    /// non-interruptible window.
    async fn publish(&self, events: impl IntoIterator<Item = CapabilityEvent>) {
        let events: Vec<CapabilityEvent> = events.into_iter().collect();
        let mut closed = Vec::new();
        for ev in &events {
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
            crate::leases::lock(&self.fences).remove(session);
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

    /// A non-interruptible action was sent: open the capability's window
    /// in the lease engine at once, instead of at the provider's next
    /// heartbeat.
    async fn window_opened(&self, capability_id: &str, session_id: &str) {
        let first = {
            let mut w = crate::leases::lock(&self.windows);
            let set = w.entry(capability_id.to_string()).or_default();
            set.insert(session_id.to_string());
            set.len() == 1
        };
        if first {
            self.leases.set_non_interruptible(capability_id, true).await;
        }
    }

    /// Run `action` on the capability of lease `lease_id` for `who` (see
    /// the module doc for the checks). With `wait_ms > 0` waits up to that
    /// long for the session to end and returns it as it is then (still
    /// `running` after the wait); the registry beginning to shut down ends
    /// the wait at once, with the same answer.
    ///
    /// Errors: [`SessionError::Lease`] (404, 403 `not_lease_holder`, 409
    /// with the lease status), `CapabilityNotLeased`, `UnknownCapability`,
    /// `UnsupportedAction` (422), `CommandTooLarge` (413: the command
    /// would not fit the MQTT packet limit), `ProviderOffline`,
    /// `ControlPlaneDown` (503), `Store`. No session exists after an error.
    pub async fn invoke(
        &self,
        who: &Principal,
        lease_id: &str,
        req: ActionInvokeRequest,
    ) -> Result<CapabilitySession, SessionError> {
        let lease = self
            .leases
            .get(lease_id)
            .await
            .ok_or_else(|| LeaseError::NotFound {
                lease_id: lease_id.to_string(),
            })?;
        if lease.principal != who.name {
            return Err(LeaseError::NotHolder {
                lease_id: lease_id.to_string(),
                principal: who.name.clone(),
                holder: lease.principal.clone(),
            }
            .into());
        }
        let capability_id = match &req.capability_id {
            Some(c) if *c != lease.capability_id && !lease.capability_id.is_empty() => {
                return Err(SessionError::CapabilityNotLeased {
                    lease_id: lease_id.to_string(),
                    leased: lease.capability_id.clone(),
                    requested: c.clone(),
                })
            }
            Some(c) => c.clone(),
            None => lease.capability_id.clone(),
        };
        let capability = self
            .store
            .get_capability(&capability_id)
            .await?
            .ok_or_else(|| SessionError::UnknownCapability {
                capability_id: capability_id.clone(),
            })?;
        if !capability.supported_actions.contains(&req.action) {
            return Err(SessionError::UnsupportedAction {
                capability_id,
                action: req.action,
                supported: capability
                    .supported_actions
                    .iter()
                    .map(|a| a.as_str().to_string())
                    .collect(),
            });
        }
        let provider_id = capability.provider_id.clone();
        if let Some(instances) = self.twins.get().and_then(|t| t.conflict(&provider_id)) {
            return Err(SessionError::ProviderConflict {
                provider_id,
                capability_id,
                instances,
            });
        }
        let p = provider_id.clone();
        let revoked = self
            .db
            .read(move |c| crate::auth::provider_credentials_revoked_sync(c, &p))
            .await??;
        if revoked {
            return Err(SessionError::ProviderCredentialsRevoked {
                provider_id,
                capability_id,
            });
        }
        let online = self
            .store
            .get_provider(&provider_id)
            .await?
            .is_some_and(|p| p.online_status == OnlineStatus::Online);
        if !online {
            return Err(SessionError::ProviderOffline {
                provider_id,
                capability_id,
            });
        }
        let commands = self
            .commands
            .get()
            .filter(|c| c.connected())
            .ok_or(SessionError::ControlPlaneDown)?
            .clone();
        let authorized = self
            .leases
            .authorize_action(who, lease_id, &capability_id)
            .await?;

        let now = store::stored_time(Utc::now());
        let sent = tokio::time::Instant::now();
        let timeout_ms = req.timeout_ms.unwrap_or(self.cfg.default_timeout_ms);
        let not_after = command_not_after(&authorized, now, timeout_ms);
        let deadline = now
            + chrono::Duration::milliseconds(
                i64::from(timeout_ms) + self.cfg.result_grace_ms.min(i64::MAX as u64) as i64,
            );
        let session_id = crate::ids::time_ordered("sess_");
        let command = ActionCommand {
            session_id: session_id.clone(),
            lease_id: lease_id.to_string(),
            capability_id: capability_id.clone(),
            action: req.action,
            params: req.params,
            timeout_ms,
            lease_generation: authorized.generation.unwrap_or(0),
            lease_mode: authorized.mode,
            not_after,
        };
        let limit = self.max_command_bytes.load(Ordering::Relaxed);
        if limit > 0 {
            let size = encoded_len(&command) + COMMAND_OVERHEAD_BYTES;
            if size > limit {
                return Err(SessionError::CommandTooLarge {
                    capability_id,
                    size,
                    limit,
                });
            }
        }
        let row = store::SessionRow {
            session: CapabilitySession {
                session_id: session_id.clone(),
                lease_id: lease_id.to_string(),
                capability_id: capability_id.clone(),
                action: req.action,
                started_at: now,
                ended_at: None,
                status: SessionStatus::Running,
                input_summary: input_summary(&command.params),
                result_summary: None,
                artifact_refs: vec![],
                error_message: None,
                late_report: None,
            },
            provider_id: provider_id.clone(),
            principal: who.name.clone(),
            timeout_ms,
            deadline_at: deadline,
            ended_by: None,
            provider_status: None,
            revoke_reason: None,
        };
        let stored = row.clone();
        let started = self
            .db
            .write_grouped(move |c| store::insert_session(c, &stored))
            .await??;
        crate::leases::lock(&self.fences)
            .insert(session_id.clone(), (lease_id.to_string(), not_after));
        // The deadline that counts; `deadline_at` is its wall rendering.
        crate::leases::lock(&self.deadlines).insert(
            &session_id,
            sent,
            deadlines::after(
                sent,
                Duration::from_millis(
                    u64::from(timeout_ms).saturating_add(self.cfg.result_grace_ms),
                ),
            ),
        );
        // Wait before the command leaves, so the end cannot be missed.
        let ended = (req.wait_ms > 0).then(|| self.await_final(&session_id));
        self.publish([started]).await;
        // Before the command leaves: its end (which closes the window)
        // cannot come before the window is open.
        if req.action.non_interruptible_by_default() {
            self.window_opened(&capability_id, &session_id).await;
        }
        if commands
            .send(&provider_id, MessageType::ActionInvoke, &command)
            .is_none()
        {
            let id = session_id.clone();
            let ended = self
                .db
                .write(move |c| {
                    store::end_by_registry(
                        c,
                        &id,
                        SessionStatus::Failed,
                        "the registry's MQTT link stopped; the command was not sent",
                        Utc::now(),
                    )
                })
                .await??;
            if let Some((_, ev)) = ended {
                self.publish([ev]).await;
            }
            return Err(SessionError::ControlPlaneDown);
        }
        tracing::info!(%session_id, lease_id, %capability_id, %provider_id, action = %req.action, "action sent to provider");
        match ended {
            Some(rx) => {
                self.wait_on(
                    rx,
                    &session_id,
                    Duration::from_millis(u64::from(req.wait_ms)),
                )
                .await
            }
            None => Ok(row.session),
        }
    }

    /// Wait up to `timeout` for session `session_id` to end, or until the
    /// registry begins to shut down; returns it as it is then.
    ///
    /// Errors: `SessionNotFound`, `Store`.
    pub async fn wait_final(
        &self,
        session_id: &str,
        timeout: Duration,
    ) -> Result<CapabilitySession, SessionError> {
        let rx = self.await_final(session_id);
        let now = match self.get_session(session_id).await {
            Ok(s) => s,
            Err(e) => {
                self.forget_waiter(session_id);
                return Err(e);
            }
        };
        if now.status.is_final() {
            self.forget_waiter(session_id);
            return Ok(now);
        }
        self.wait_on(rx, session_id, timeout).await
    }

    /// Register to be handed session `session_id` when it ends.
    fn await_final(&self, session_id: &str) -> oneshot::Receiver<CapabilitySession> {
        let (tx, rx) = oneshot::channel();
        crate::leases::lock(&self.finals)
            .entry(session_id.to_string())
            .or_default()
            .push(tx);
        rx
    }

    /// Drop the registrations of session `session_id` whose callers gave up.
    fn forget_waiter(&self, session_id: &str) {
        let mut finals = crate::leases::lock(&self.finals);
        if let Some(list) = finals.get_mut(session_id) {
            list.retain(|tx| !tx.is_closed());
            if list.is_empty() {
                finals.remove(session_id);
            }
        }
    }

    async fn wait_on(
        &self,
        mut rx: oneshot::Receiver<CapabilitySession>,
        session_id: &str,
        timeout: Duration,
    ) -> Result<CapabilitySession, SessionError> {
        let shutting_down = async {
            match self.shutdown.get() {
                // A dropped sender ends the wait too: the registry is gone.
                Some(stop) => {
                    let _ = stop.clone().wait_for(|s| *s).await;
                }
                None => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            ended = tokio::time::timeout(timeout, &mut rx) => {
                if let Ok(Ok(s)) = ended {
                    return Ok(s);
                }
            }
            () = shutting_down => {
                tracing::debug!(session_id, "registry shutting down: a waiting caller gets the session as it is");
            }
        }
        // Not ended within `timeout`, the registry is shutting down (the
        // HTTP server waits for this answer before it stops), or the end
        // could not be read from its event: as it is now.
        drop(rx);
        self.forget_waiter(session_id);
        self.get_session(session_id).await
    }

    /// One session.
    ///
    /// Errors: `SessionNotFound`, `Store`.
    pub async fn get_session(&self, session_id: &str) -> Result<CapabilitySession, SessionError> {
        let id = session_id.to_string();
        self.db
            .read(move |c| store::load_session(c, &id))
            .await??
            .map(|r| r.session)
            .ok_or_else(|| SessionError::SessionNotFound {
                session_id: session_id.to_string(),
            })
    }

    /// Sessions matching `filter`, newest first.
    pub async fn list_sessions(
        &self,
        mut filter: SessionFilter,
    ) -> Result<Vec<CapabilitySession>, SessionError> {
        filter.limit = filter.limit.clamp(1, MAX_LIST);
        let rows = self
            .db
            .read(move |c| store::list_sessions(c, &filter))
            .await??;
        Ok(rows.into_iter().map(|r| r.session).collect())
    }

    /// One artifact's metadata and the provider that produced it.
    ///
    /// Errors: `ArtifactNotFound`, `Store`.
    pub async fn get_artifact(
        &self,
        artifact_id: &str,
    ) -> Result<(CapabilityArtifact, String), SessionError> {
        let id = artifact_id.to_string();
        self.db
            .read(move |c| store::load_artifact(c, &id))
            .await??
            .map(|r| (r.artifact, r.provider_id))
            .ok_or_else(|| SessionError::ArtifactNotFound {
                artifact_id: artifact_id.to_string(),
            })
    }

    /// Artifacts matching `filter`, oldest capture first.
    pub async fn list_artifacts(
        &self,
        mut filter: ArtifactFilter,
    ) -> Result<Vec<CapabilityArtifact>, SessionError> {
        filter.limit = filter.limit.clamp(1, MAX_LIST);
        let rows = self
            .db
            .read(move |c| store::list_artifacts(c, &filter))
            .await??;
        Ok(rows.into_iter().map(|r| r.artifact).collect())
    }

    /// An uploaded artifact's metadata and bytes.
    ///
    /// Errors: `ArtifactNotFound`, `ArtifactNotUploaded` (only metadata),
    /// `Blob`, `Store`.
    pub async fn open_artifact(
        &self,
        artifact_id: &str,
    ) -> Result<(CapabilityArtifact, String, BlobContent), SessionError> {
        let (artifact, provider) = self.get_artifact(artifact_id).await?;
        if !artifact.uploaded {
            return Err(SessionError::ArtifactNotUploaded {
                artifact_id: artifact_id.to_string(),
            });
        }
        let content = self.blobs.open(&artifact.checksum).await?.ok_or_else(|| {
            tracing::error!(artifact_id, checksum = %artifact.checksum, "artifact marked uploaded but its blob is missing");
            SessionError::ArtifactNotUploaded {
                artifact_id: artifact_id.to_string(),
            }
        })?;
        Ok((artifact, provider, content))
    }

    /// Check an upload before its body is read: the caller may upload this
    /// artifact, and the declared sha256 agrees with the metadata (when
    /// known). Returns the declared sha256 in lowercase and, for an
    /// artifact whose metadata is unknown, the reservation that counts its
    /// declared length toward the provider's unbound bytes: keep the
    /// permit until [`Sessions::finish_upload`] has returned.
    ///
    /// Errors: `BadChecksumHeader`, `NotArtifactOwner`, `ChecksumMismatch`
    /// (against the recorded checksum), `TooLarge` (declared length),
    /// `UnboundLimit` (no metadata yet and the provider holds too many
    /// unbound bytes), `Store`.
    pub async fn precheck_upload(
        &self,
        who: &Principal,
        artifact_id: &str,
        declared_sha256: Option<&str>,
        content_length: Option<u64>,
    ) -> Result<UploadPermit, SessionError> {
        let declared = declared_sha256
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| is_sha256_hex(s))
            .ok_or(SessionError::BadChecksumHeader)?;
        if content_length.is_some_and(|n| n > self.cfg.max_artifact_bytes) {
            return Err(SessionError::TooLarge {
                artifact_id: artifact_id.to_string(),
                limit: self.cfg.max_artifact_bytes,
            });
        }
        let id = artifact_id.to_string();
        if let Some(meta) = self
            .db
            .read(move |c| store::load_artifact(c, &id))
            .await??
        {
            if meta.provider_id != who.name {
                return Err(SessionError::NotArtifactOwner {
                    artifact_id: artifact_id.to_string(),
                    owner: meta.provider_id,
                    caller: who.name.clone(),
                });
            }
            if meta.artifact.checksum != declared {
                return Err(SessionError::ChecksumMismatch {
                    artifact_id: artifact_id.to_string(),
                    what: "recorded",
                    expected: meta.artifact.checksum,
                    actual: declared,
                });
            }
            return Ok(UploadPermit {
                sha256: declared,
                _reservation: None,
            });
        }
        let reservation = self
            .check_unbound_limit(who, artifact_id, &declared, content_length)
            .await?;
        Ok(UploadPermit {
            sha256: declared,
            _reservation: reservation,
        })
    }

    /// Bytes for an artifact whose metadata is unknown are about to come:
    /// refuse them when, with what `who` already stores unbound and what
    /// its other such uploads are sending now, they would take it over
    /// `max_unbound_bytes_per_provider`; otherwise count them as in flight
    /// until the returned reservation drops. An upload without
    /// `Content-Length` counts as `max_artifact_bytes`. Bytes the provider
    /// already stored (a repeated upload) add nothing and always pass; so
    /// does everything when the limit is 0.
    ///
    /// Errors: `UnboundLimit`, `Store`.
    async fn check_unbound_limit(
        &self,
        who: &Principal,
        artifact_id: &str,
        sha256: &str,
        content_length: Option<u64>,
    ) -> Result<Option<unbound::Reservation>, SessionError> {
        let limit = self.cfg.max_unbound_bytes_per_provider;
        if limit == 0 {
            return Ok(None);
        }
        let incoming = content_length.unwrap_or(self.cfg.max_artifact_bytes);
        // Before the stored usage is read (see `InFlight::reserve`).
        let (in_flight, reservation) = self.unbound_in_flight.reserve(&who.name, incoming);
        let (p, a, s) = (
            who.name.clone(),
            artifact_id.to_string(),
            sha256.to_string(),
        );
        let usage = self
            .db
            .read(move |c| unbound::unbound_usage(c, &p, &a, &s))
            .await??;
        if usage.already_stored {
            return Ok(None);
        }
        if usage
            .bytes
            .saturating_add(in_flight)
            .saturating_add(incoming)
            <= limit
        {
            return Ok(Some(reservation));
        }
        tracing::warn!(artifact_id, provider_id = %who.name, unbound_bytes = usage.bytes, in_flight, incoming, limit, "artifact upload refused: the provider holds too many bytes no metadata has named");
        Err(SessionError::UnboundLimit {
            provider_id: who.name.clone(),
            artifact_id: artifact_id.to_string(),
            held: usage.bytes,
            in_flight,
            incoming,
            limit,
            hint: if content_length.is_none() {
                " (the upload declared no Content-Length, so it counts as the largest artifact allowed, sessions.max_artifact_bytes: send Content-Length)"
            } else {
                ""
            },
        })
    }

    /// Remove resumable uploads not written for
    /// `partial_upload_ttl_seconds`; each removal is logged.
    async fn sweep_partials(&self) {
        let ttl = Duration::from_secs(self.cfg.partial_upload_ttl_seconds.max(1));
        for s in self.partials.sweep(ttl).await {
            tracing::info!(file = %s.file, provider = %s.provider, size_bytes = s.size_bytes, ttl_seconds = ttl.as_secs(), "unfinished resumable upload removed: not continued in time");
        }
    }

    /// What the registry holds of `who`'s upload of `artifact_id` with
    /// bytes hashing to `declared_sha256` (64 hex):
    /// `{artifact_id, checksum, complete, received_bytes,
    /// metadata_received}`. `complete: true` when the whole bytes are
    /// stored (bound to the artifact, or held for it until its metadata
    /// arrives: `metadata_received: false`); otherwise `received_bytes` is
    /// the length of the unfinished resumable upload (0 when none), where a
    /// ranged PUT continues.
    ///
    /// Errors: `BadChecksumHeader`, `NotArtifactOwner`, `ChecksumMismatch`
    /// (the metadata recorded another sha256), `Blob`, `Store`.
    pub async fn upload_status(
        &self,
        who: &Principal,
        artifact_id: &str,
        declared_sha256: Option<&str>,
    ) -> Result<Value, SessionError> {
        let declared = declared_sha256
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| is_sha256_hex(s))
            .ok_or(SessionError::BadChecksumHeader)?;
        let (id, provider) = (artifact_id.to_string(), who.name.clone());
        let (meta, held) = self
            .db
            .read(move |c| {
                let meta = store::load_artifact(c, &id)?;
                let held = store::held_upload(c, &id, &provider)?;
                Ok::<_, rusqlite::Error>((meta, held))
            })
            .await??;
        let mut metadata_received = false;
        let mut complete = None;
        if let Some(meta) = meta {
            if meta.provider_id != who.name {
                return Err(SessionError::NotArtifactOwner {
                    artifact_id: artifact_id.to_string(),
                    owner: meta.provider_id,
                    caller: who.name.clone(),
                });
            }
            if meta.artifact.checksum != declared {
                return Err(SessionError::ChecksumMismatch {
                    artifact_id: artifact_id.to_string(),
                    what: "recorded",
                    expected: meta.artifact.checksum,
                    actual: declared,
                });
            }
            metadata_received = true;
            if meta.artifact.uploaded && self.blobs.exists(&declared).await? {
                complete = Some(meta.artifact.size_bytes);
            }
        } else if let Some((sha, size)) = held {
            if sha == declared && self.blobs.exists(&declared).await? {
                complete = Some(size);
            }
        }
        let received = match complete {
            Some(n) => n,
            None => {
                self.partials
                    .held(&self.partials.path(&who.name, artifact_id, &declared))
                    .await
            }
        };
        Ok(json!({
            "artifact_id": artifact_id,
            "checksum": declared,
            "complete": complete.is_some(),
            "received_bytes": received,
            "metadata_received": metadata_received,
        }))
    }

    /// Open the unfinished resumable upload of (`who`, `artifact_id`,
    /// `sha256`) to append `range` to it: claimed for this request until
    /// the returned [`partial::Claim`] drops. `range.start` 0 begins
    /// afresh; any other start must equal the bytes held.
    ///
    /// Errors: `UploadBusy` (another ranged PUT writes it),
    /// `OffsetMismatch` (409 with the bytes held), `PartialLimit`, `Blob`.
    pub async fn resume_partial(
        &self,
        who: &Principal,
        artifact_id: &str,
        sha256: &str,
        range: partial::ContentRange,
    ) -> Result<(StagedBlob, partial::Claim), SessionError> {
        let path = self.partials.path(&who.name, artifact_id, sha256);
        let claim = self
            .partials
            .claim(&path)
            .ok_or_else(|| SessionError::UploadBusy {
                artifact_id: artifact_id.to_string(),
            })?;
        let held = self.partials.held(&path).await;
        if range.start != 0 && range.start != held {
            return Err(SessionError::OffsetMismatch {
                artifact_id: artifact_id.to_string(),
                held,
                start: range.start,
            });
        }
        let limit = self.cfg.max_partial_bytes_per_provider;
        if limit > 0 {
            let others = self.partials.provider_bytes(&who.name, &path).await;
            if others.saturating_add(range.total) > limit {
                tracing::warn!(artifact_id, provider_id = %who.name, others, total = range.total, limit, "resumable upload refused: the provider's unfinished uploads are over the limit");
                return Err(SessionError::PartialLimit {
                    artifact_id: artifact_id.to_string(),
                    held: others,
                    incoming: range.total,
                    limit,
                });
            }
        }
        let staged = StagedBlob::resume(&path, range.start == 0).await?;
        Ok((staged, claim))
    }

    /// A new staging file for an upload's body.
    pub async fn stage(&self) -> Result<StagedBlob, SessionError> {
        Ok(StagedBlob::create(&self.blobs.staging_dir()).await?)
    }

    /// Take a fully received upload: compare its hash with the declared
    /// one, store it, and mark the artifact uploaded (or hold the bytes
    /// until its metadata arrives). Emits `artifact_uploaded` the first
    /// time.
    ///
    /// Errors: `ChecksumMismatch` (nothing stored), `NotArtifactOwner`,
    /// `Blob`, `Store`.
    pub async fn finish_upload(
        &self,
        who: &Principal,
        artifact_id: &str,
        declared_sha256: &str,
        mut staged: StagedBlob,
    ) -> Result<UploadReceipt, SessionError> {
        let actual = staged.finish().await?;
        let size = staged.size_bytes();
        if actual != declared_sha256 {
            staged.discard();
            tracing::warn!(artifact_id, provider_id = %who.name, declared = %declared_sha256, %actual, size_bytes = size, "artifact upload refused: checksum mismatch");
            return Err(SessionError::ChecksumMismatch {
                artifact_id: artifact_id.to_string(),
                what: "X-Checksum-Sha256",
                expected: declared_sha256.to_string(),
                actual,
            });
        }
        // Until the row is committed, the sweep of unbound bytes must not
        // delete the blob (`put` may have found it already stored).
        let gc = self.blob_gc.read().await;
        self.blobs.put(&actual, staged).await?;
        let (id, provider, sum) = (artifact_id.to_string(), who.name.clone(), actual.clone());
        let recorded = self
            .db
            .write(move |c| {
                let now = Utc::now();
                let recorded = store::record_upload(c, &id, &provider, &sum, size, now);
                // Bytes no artifact row binds are kept only for the grace
                // time: track them (also those a refusal left behind).
                if !matches!(recorded, Ok(UploadRecorded::Bound { .. })) {
                    let noted = unbound::note_unbound(c, &provider, &sum, &id, size, now);
                    match (&recorded, noted) {
                        (_, Ok(())) => {}
                        (Ok(_), Err(e)) => return Err(UploadRefused::from(e)),
                        (Err(_), Err(e)) if crate::storage::is_sqlite_full(&e) => {
                            crate::storage::note_full("artifact upload", &e)
                        }
                        (Err(_), Err(e)) => {
                            tracing::error!(artifact_id = %id, error = %e, "cannot track the bytes of a refused upload")
                        }
                    }
                }
                recorded
            })
            .await?;
        drop(gc);
        match recorded {
            Ok(UploadRecorded::Bound {
                artifact,
                first,
                events,
            }) => {
                self.publish(events).await;
                if first {
                    tracing::info!(artifact_id, session_id = %artifact.session_id, size_bytes = size, "artifact uploaded");
                }
                Ok(UploadReceipt {
                    first,
                    record: serde_json::to_value(&artifact).unwrap_or(Value::Null),
                })
            }
            Ok(UploadRecorded::Held {
                artifact_id,
                checksum,
                size_bytes,
                first,
            }) => {
                if first {
                    tracing::info!(%artifact_id, provider_id = %who.name, size_bytes, "artifact bytes held until their metadata arrives");
                }
                Ok(UploadReceipt {
                    first,
                    record: json!({
                        "artifact_id": artifact_id,
                        "checksum": checksum,
                        "size_bytes": size_bytes,
                        "uploaded": true,
                        "metadata_received": false,
                    }),
                })
            }
            Err(UploadRefused::NotOwner { artifact_id, owner }) => {
                Err(SessionError::NotArtifactOwner {
                    artifact_id,
                    owner,
                    caller: who.name.clone(),
                })
            }
            Err(UploadRefused::ChecksumMismatch {
                artifact_id,
                expected,
                actual,
            }) => Err(SessionError::ChecksumMismatch {
                artifact_id,
                what: "recorded",
                expected,
                actual,
            }),
            Err(UploadRefused::Sqlite(e)) => Err(SessionError::Store(e)),
        }
    }

    /// Apply one `session_update` from `provider_id`; refusals are logged
    /// (there is nobody to answer on MQTT). False when the update could
    /// not be stored (the store failed: the same update sent again must be
    /// applied, not dropped as a duplicate); true when it was stored, had
    /// nothing to store, or was refused for good. An update lost to a full
    /// disk is asked for again (`session_sync`) once the store is writable.
    pub async fn apply_update(&self, provider_id: &str, update: SessionUpdate) -> bool {
        if !update.status.is_final()
            && update.artifacts.is_empty()
            && update.result_summary.is_none()
        {
            // "Started running": nothing to store (the session has been
            // `running` since it was sent).
            tracing::debug!(provider_id, session_id = %update.session_id, "session running at the provider");
            return true;
        }
        let lease_reason = if matches!(
            update.status,
            SessionStatus::Failed | SessionStatus::Cancelled
        ) {
            self.lease_reason_for(&update).await
        } else {
            None
        };
        let fence_end = if update.status.is_final() && update.started_at.is_some() {
            self.fence_end_for(&update).await
        } else {
            None
        };
        let provider = provider_id.to_string();
        let session_id = update.session_id.clone();
        let applied = self
            .db
            .write_grouped(move |c| {
                store::apply_update(c, &provider, &update, lease_reason, fence_end, Utc::now())
            })
            .await;
        let error = match applied {
            Ok(Ok(out)) => {
                for why in &out.ignored_artifacts {
                    tracing::warn!(provider_id, %session_id, "artifact metadata ignored: {why}");
                }
                if let Some(s) = &out.session {
                    tracing::debug!(provider_id, %session_id, status = %s.status, "session update applied");
                }
                self.publish(out.events).await;
                return true;
            }
            Ok(Err(UpdateRefused::Sqlite(e))) => e.to_string(),
            Ok(Err(refused)) => {
                tracing::warn!(provider_id, %session_id, "session update refused: {refused}");
                return true;
            }
            Err(e) => e.to_string(),
        };
        if crate::storage::is_full(&error) {
            crate::storage::note_full("session update", &error);
            tracing::warn!(
                provider_id,
                %session_id,
                "session update not stored: the store is full; it is asked for again once space is freed"
            );
            crate::leases::lock(&self.resync_after_full).insert(provider_id.to_string());
        } else {
            tracing::error!(provider_id, %session_id, error = %error, "session update not stored");
        }
        false
    }

    /// Once the store is writable again, ask each provider whose session
    /// update a full disk kept from being stored to send it again.
    async fn resync_after_full(&self) {
        if crate::storage::is_store_full() {
            return;
        }
        let providers: Vec<String> = crate::leases::lock(&self.resync_after_full)
            .drain()
            .collect();
        for provider_id in providers {
            tracing::info!(
                provider_id,
                "the store is writable again: asking the provider for the session updates it could not store"
            );
            self.sync_open_sessions(&provider_id).await;
        }
    }

    /// When the authority of `update`'s command ended ([`store::fence_end`]):
    /// `None` when the session or its lease cannot be read.
    async fn fence_end_for(&self, update: &SessionUpdate) -> Option<chrono::DateTime<Utc>> {
        let known = crate::leases::lock(&self.fences)
            .get(&update.session_id)
            .cloned();
        if let Some((lease_id, not_after)) = known {
            let lease = self.leases.get(&lease_id).await?;
            return Some(match lease.ended_at.filter(|_| lease.status.is_final()) {
                Some(ended) if ended < not_after => ended,
                _ => not_after,
            });
        }
        // Sent before a restart of the registry: from the store.
        let id = update.session_id.clone();
        let row = self
            .db
            .read(move |c| store::load_session(c, &id))
            .await
            .ok()?
            .ok()??;
        let lease = self.leases.get(&row.session.lease_id).await?;
        let ended = lease.ended_at.filter(|_| lease.status.is_final());
        Some(store::fence_end(&row, ended))
    }

    /// Why the lease under an update's session ended, when it ended before
    /// the update's `occurred_at` (a failure after a revocation is the
    /// revocation's doing).
    async fn lease_reason_for(&self, update: &SessionUpdate) -> Option<String> {
        let id = update.session_id.clone();
        let row = self
            .db
            .read(move |c| store::load_session(c, &id))
            .await
            .ok()?
            .ok()??;
        if row.revoke_reason.is_some() {
            return None;
        }
        let lease = self.leases.get(&row.session.lease_id).await?;
        let ended_first = lease
            .ended_at
            .is_some_and(|t| t <= update.occurred_at + chrono::Duration::seconds(1));
        if lease.status.is_final() && ended_first {
            lease_end_reason(&lease)
        } else {
            None
        }
    }

    /// A provider went away (`why`, e.g. "provider `p` went offline"): end
    /// its running sessions (seed 001 §5.4).
    pub async fn provider_lost(&self, provider_id: &str, why: String) {
        let p = provider_id.to_string();
        match self
            .db
            .write(move |c| store::provider_lost(c, &p, &why, Utc::now()))
            .await
            .and_then(flat)
        {
            Ok(events) => {
                if !events.is_empty() {
                    tracing::warn!(
                        provider_id,
                        sessions = events.len(),
                        "sessions of a lost provider ended (failed / incomplete_evidence)"
                    );
                }
                self.withdraw_invokes(&events);
                self.publish(events).await;
            }
            Err(e) => {
                tracing::error!(provider_id, error = %e, "cannot end the sessions of a lost provider")
            }
        }
    }

    /// Send `provider_id` a `session_sync` listing the sessions still open
    /// on it, and those the registry ended by presumption in the last hour
    /// (none: nothing is sent). The provider reports again those it
    /// has ended and fails those it never received (see
    /// [`SessionSync`]): a final update that reached the broker while the
    /// registry was not subscribed is recovered at the provider's next
    /// reconnection instead of failing at the session's deadline.
    pub async fn sync_open_sessions(&self, provider_id: &str) {
        let Some(commands) = self.commands.get() else {
            return;
        };
        let p = provider_id.to_string();
        let presumed_since = Utc::now() - PRESUMED_SYNC_WINDOW;
        let open = match self
            .db
            .read(move |c| store::open_sessions_of(c, &p, presumed_since, MAX_SYNCED_SESSIONS))
            .await
            .and_then(flat)
        {
            Ok(open) => open,
            Err(e) => {
                tracing::error!(provider_id, error = %e, "cannot list open sessions to sync");
                return;
            }
        };
        if open.is_empty() {
            return;
        }
        tracing::info!(
            provider_id,
            sessions = open.len(),
            "asking the provider to report its open sessions again"
        );
        for chunk in open.chunks(SessionSync::MAX_SESSIONS) {
            commands.send(
                provider_id,
                MessageType::SessionSync,
                &SessionSync {
                    sessions: chunk.to_vec(),
                },
            );
        }
    }

    /// Fail sessions past their deadline; every so often (a quarter of
    /// the unbound-bytes grace time, between 0.5 s and 60 s) sweep unbound
    /// bytes.
    async fn run_watchdog(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(WATCHDOG_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let sweep_every = (Duration::from_secs(self.cfg.unbound_upload_ttl_seconds) / 4)
            .clamp(WATCHDOG_PERIOD, MAX_UNBOUND_SWEEP_PERIOD);
        let mut last_sweep = Instant::now();
        self.restore_deadlines().await;
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.wait_for(|s| *s) => break,
            }
            self.resync_after_full().await;
            let sent_after = match self.judge() {
                Judge::Nobody => continue,
                Judge::SentAfter(t) => Some(t),
                Judge::All => {
                    self.judge_unheard_since_restart().await;
                    None
                }
            };
            self.fail_overdue(sent_after).await;
            if last_sweep.elapsed() >= sweep_every {
                last_sweep = Instant::now();
                self.sweep_unbound().await;
                self.sweep_partials().await;
            }
        }
    }

    /// Rebuild the monotonic deadlines of the sessions the store holds
    /// open (sent by an earlier run of the registry) from their wall-clock
    /// `deadline_at` (see [`deadlines`]).
    async fn restore_deadlines(&self) {
        match self
            .db
            .read(|c| store::open_deadlines(c))
            .await
            .and_then(flat)
        {
            Ok(open) => {
                let (now, wall_now) = (tokio::time::Instant::now(), Utc::now());
                let mut d = crate::leases::lock(&self.deadlines);
                for (session_id, deadline_at) in &open {
                    d.restore(
                        session_id,
                        deadlines::instant_of(now, wall_now, *deadline_at),
                    );
                }
                if !open.is_empty() {
                    tracing::info!(
                        sessions = open.len(),
                        "deadlines of the open sessions restored"
                    );
                }
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot read the open sessions' deadlines; they are not enforced")
            }
        }
    }

    /// Fail the sessions whose monotonic deadline has passed (with
    /// `sent_after`, only those sent after it) and withdraw their
    /// `action_invoke` if the MQTT link still holds it.
    async fn fail_overdue(&self, sent_after: Option<tokio::time::Instant>) {
        let due =
            crate::leases::lock(&self.deadlines).overdue(tokio::time::Instant::now(), sent_after);
        if due.is_empty() {
            return;
        }
        let ids = due.clone();
        match self
            .db
            .write(move |c| store::fail_overdue(c, &ids, Utc::now()))
            .await
            .and_then(flat)
        {
            Ok(events) => {
                {
                    // Also those that had ended meanwhile.
                    let mut d = crate::leases::lock(&self.deadlines);
                    for id in &due {
                        d.remove(id);
                    }
                }
                for ev in &events {
                    tracing::warn!(session_id = ?ev.session_id, "session failed: no report from its provider before the deadline");
                }
                self.withdraw_invokes(&events);
                self.publish(events).await;
            }
            Err(e) => tracing::error!(error = %e, "session deadline check failed"),
        }
    }

    /// Sessions the registry ended itself (`events`): an `action_invoke`
    /// for one that the MQTT link still holds (the link was down) is not
    /// sent.
    fn withdraw_invokes(&self, events: &[CapabilityEvent]) {
        let Some(commands) = self.commands.get() else {
            return;
        };
        for session_id in events.iter().filter_map(|ev| ev.session_id.as_deref()) {
            commands.withdraw(session_id);
        }
    }

    /// Providers marked offline at a restart of a registry with the
    /// embedded broker that are still offline now that the registry has
    /// heard for a full window: their open sessions end (running ones
    /// `failed` or `incomplete_evidence`, completed ones still missing
    /// bytes `incomplete_evidence`), as for any provider gone offline.
    async fn judge_unheard_since_restart(&self) {
        let pending = std::mem::take(&mut *crate::leases::lock(&self.unheard_since_restart));
        for provider_id in pending {
            let online = match self.store.get_provider(&provider_id).await {
                Ok(p) => p.is_some_and(|p| p.online_status == OnlineStatus::Online),
                Err(e) => {
                    tracing::error!(%provider_id, error = %e, "cannot read a provider unheard since the restart");
                    continue;
                }
            };
            if !online {
                self.provider_lost(
                    &provider_id,
                    format!(
                        "provider `{provider_id}` did not reconnect after the registry restarted"
                    ),
                )
                .await;
            }
        }
    }

    /// Drop held uploads and delete blobs that no artifact bound within
    /// `unbound_upload_ttl_seconds` (see [`unbound`]); each removal is
    /// logged. Database work runs on the database threads, file deletion in
    /// the blob store (off the async workers). A blob whose file cannot be
    /// deleted stays listed and is tried again at the next sweep.
    async fn sweep_unbound(&self) {
        let Some(cutoff) = i64::try_from(self.cfg.unbound_upload_ttl_seconds)
            .ok()
            .and_then(chrono::Duration::try_seconds)
            .and_then(|ttl| Utc::now().checked_sub_signed(ttl))
        else {
            return;
        };
        match self
            .db
            .read(move |c| unbound::anything_before(c, cutoff))
            .await
            .and_then(flat)
        {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => {
                tracing::error!(error = %e, "unbound artifact bytes: cannot look for expired uploads");
                return;
            }
        }
        // No upload may record a blob between the choice and the deletion.
        let _gc = self.blob_gc.write().await;
        let expired = match self
            .db
            .write(move |c| unbound::expire_unbound(c, cutoff))
            .await
            .and_then(flat)
        {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "unbound artifact bytes: sweep failed");
                return;
            }
        };
        let ttl_seconds = self.cfg.unbound_upload_ttl_seconds;
        for d in &expired.dropped {
            tracing::info!(
                artifact_id = %d.artifact_id,
                provider_id = %d.provider_id,
                size_bytes = d.size_bytes,
                sha256 = %d.sha256,
                ttl_seconds,
                "held artifact bytes dropped: no metadata named them in time"
            );
        }
        let mut deleted = Vec::new();
        for blob in expired.doomed {
            let (provider_id, artifact_id) = blob.uploads.first().cloned().unwrap_or_default();
            match self.blobs.delete(&blob.sha256).await {
                Ok(file_found) => {
                    tracing::info!(
                        %artifact_id,
                        %provider_id,
                        size_bytes = blob.size_bytes,
                        sha256 = %blob.sha256,
                        uploads = blob.uploads.len(),
                        file_found,
                        ttl_seconds,
                        "unbound artifact bytes deleted: no artifact bound them in time"
                    );
                    deleted.push(blob.sha256);
                }
                Err(e) => {
                    tracing::error!(%artifact_id, %provider_id, sha256 = %blob.sha256, error = %e, "cannot delete unbound artifact bytes; the next sweep tries again")
                }
            }
        }
        if deleted.is_empty() {
            return;
        }
        let forgotten = self
            .db
            .write(move |c| {
                let tx = c.transaction()?;
                for sha256 in &deleted {
                    unbound::forget_deleted(&tx, sha256, cutoff)?;
                }
                tx.commit()
            })
            .await;
        match forgotten.and_then(flat) {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(error = %e, "unbound artifact bytes: deleted files stay listed")
            }
        }
    }

    /// Follow lease events; when a lease ends under running sessions,
    /// record why and send `action_cancel` for each.
    async fn run_lease_follower(self: Arc<Self>, mut shutdown: watch::Receiver<bool>, after: u64) {
        let mut follower = EventFollower::new(self.bus.clone(), after);
        loop {
            let next = tokio::select! {
                n = follower.next() => n,
                _ = shutdown.wait_for(|s| *s) => break,
            };
            let ev = match next {
                Ok(Followed::Event(ev)) => ev,
                Ok(Followed::Gap { .. }) => continue,
                Ok(Followed::Closed) => break,
                Err(e) => {
                    tracing::error!(error = %e, "event log unreadable; session cancellation paused");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
            let (Some(reason), Some(lease_id)) = (reason_for_event(&ev), ev.lease_id.clone())
            else {
                continue;
            };
            self.lease_ended(&lease_id, reason).await;
        }
    }

    async fn lease_ended(&self, lease_id: &str, reason: String) {
        // Most leases end with no action running: find that out on the
        // reader instead of a write transaction per lease.
        let id = lease_id.to_string();
        match self
            .db
            .read(move |c| store::has_open_sessions(c, &id))
            .await
            .and_then(flat)
        {
            Ok(false) => return,
            Ok(true) => {}
            Err(e) => {
                tracing::warn!(lease_id, error = %e, "cannot look up the sessions of an ended lease")
            }
        }
        // The deadline that counts is monotonic; `deadline` is its wall
        // rendering, stored for a restart.
        let grace = Duration::from_millis(self.cfg.revoke_grace_ms);
        let until = deadlines::after(tokio::time::Instant::now(), grace);
        let deadline = Utc::now()
            + chrono::Duration::milliseconds(self.cfg.revoke_grace_ms.min(i64::MAX as u64) as i64);
        let (id, why) = (lease_id.to_string(), reason.clone());
        let rows = match self
            .db
            .write(move |c| store::lease_ended(c, &id, &why, deadline))
            .await
            .and_then(flat)
        {
            Ok(rows) => rows,
            Err(e) => {
                tracing::error!(lease_id, error = %e, "cannot mark the sessions of an ended lease");
                return;
            }
        };
        {
            let mut d = crate::leases::lock(&self.deadlines);
            for row in &rows {
                d.shorten(&row.session.session_id, until);
            }
        }
        let Some(commands) = self.commands.get() else {
            return;
        };
        for row in rows {
            tracing::info!(lease_id, session_id = %row.session.session_id, provider_id = %row.provider_id, %reason, "lease ended under a running session: cancelling it");
            commands.send(
                &row.provider_id,
                MessageType::ActionCancel,
                &ActionCancel {
                    session_id: row.session.session_id.clone(),
                    reason: reason.clone(),
                },
            );
        }
    }
}

#[async_trait::async_trait]
impl ProviderHooks for Sessions {
    async fn on_provider_restarted(&self, provider_id: &str) {
        self.provider_lost(
            provider_id,
            format!("provider `{provider_id}` restarted (new boot id)"),
        )
        .await;
    }

    async fn on_provider_offline(&self, provider_id: &str, reason: OfflineReason) {
        if reason == OfflineReason::RegistryRestarted {
            // Not heard since the registry (and its embedded broker)
            // restarted says nothing about the bench: a planned restart
            // leaves its edge running, and it reconnects with its sessions'
            // results. Failing them now would be a false failure that the
            // results then reverse. They end by the provider's report, by
            // its restart (new boot id: `on_provider_restarted`), or, if it
            // is still offline once the registry has heard for a full
            // window, then (`judge_unheard_since_restart`).
            tracing::info!(provider_id, "provider not heard since the registry restarted; its open sessions wait for its return");
            crate::leases::lock(&self.unheard_since_restart).push(provider_id.to_string());
            return;
        }
        self.provider_lost(
            provider_id,
            format!("provider `{provider_id}` went offline ({reason})"),
        )
        .await;
    }

    async fn on_provider_announced_online(&self, provider_id: &str) {
        self.sync_open_sessions(provider_id).await;
    }

    async fn on_session_update(&self, provider_id: &str, update: SessionUpdate) -> bool {
        self.apply_update(provider_id, update).await
    }
}
