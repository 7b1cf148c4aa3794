//! The lease engine (seed 001 §2.1 Lease Manager and Preemption Manager,
//! §2.2.3, §5, §6): who may use which capability, until when, and who
//! gives way to whom. It knows nothing of HTTP or MQTT; the API and the
//! MQTT bridge call [`LeaseEngine`] and read the events it appends.
//!
//! # Model
//! One in-memory model (the capability directory, the holders of each
//! capability, the wait queue, the live leases) behind one mutex, and
//! SQLite as its durable copy. The mutex is a `std::sync::Mutex` held only
//! for the synchronous decision of one operation, never across an `.await`
//! (cheaper than an async mutex or an actor round trip; waiting for the
//! commit happens after it is released).
//!
//! # Durability
//! Every transition writes the lease row (`capability_leases`) and its
//! event row (`events`, the append-only audit log) in one transaction on
//! the database's writer thread; only after that commit does the caller get
//! its answer and are the events published on the [`EventBus`].
//! Transitions queued while a commit is in flight are committed together in
//! the next transaction (group commit, see `commit.rs`). SQLite runs in WAL
//! mode with `synchronous=NORMAL`: an answered operation survives the
//! registry being killed with SIGKILL; a power loss may lose the last
//! commits but never leaves a lease row without its event or the reverse.
//!
//! # Time
//! Expiry, grace periods and queue timeouts run on a monotonic clock
//! ([`LeaseClock`], `tokio::time::Instant` in production); `expires_at`,
//! `grace_until` on the wire are their wall-clock rendering, computed when
//! the deadline is set. A background sweeper (every `sweep_interval_ms`,
//! default 250 ms) expires leases, ends grace periods, times out waiting
//! requests and grants what was freed; operations on a single lease also
//! settle it first, so a lease past its deadline is never renewed or acted
//! on even if the sweeper has not reached it yet.
//!
//! Across a restart each lease keeps its *wall-clock* deadline: the row
//! stores `expires_at` / `grace_until` / the queue timeout as wall times,
//! and [`LeaseEngine::start`] turns each back into a monotonic deadline
//! ("now + (expires_at − wall now)"). The trade-off: time the registry was
//! down counts against leases (a holder could not renew while it was down,
//! and a lease past its `expires_at` expires at the first sweep), and a
//! wall-clock step while the registry was down shifts the deadlines by the
//! step. Storing the remaining duration instead would hand holders extra
//! time equal to the outage, keeping hardware locked by holders that may
//! have vanished with the registry; a lab prefers the deadline it was told.
//!
//! # Policy decisions
//! - `mode` must be the capability's own `lease_mode` (absent: that mode);
//!   an exclusive capability has at most one holder, a shared one any number
//!   of holders in its shared mode.
//! - A provider that is offline: requests naming only its capabilities are
//!   refused with [`LeaseError::CapabilityOffline`] (nothing could run on
//!   them); requests already waiting stay queued (until their
//!   `queue_timeout_seconds`, if any) and are granted when it comes back;
//!   existing leases stay until released or expired. Going offline also
//!   closes the capability's non-interruptible window (no action can be
//!   running through a disconnected provider as far as the registry can
//!   tell; the next heartbeat reopens it if needed).
//! - Expiry, like revocation, waits while the capability is inside a
//!   non-interruptible window (seed 001 §6.4): a robot press is not cut by
//!   a TTL either.
//! - A request with `preempt_if_needed` whose `preempt_reason` is missing or
//!   not on the whitelist is not refused: it waits without preempting.
//! - A waiting request that started a preemption waits for that capability
//!   while the grace period runs; if it is withdrawn or times out, the
//!   preempted lease is still revoked at the end of its grace period (a
//!   preemption cannot be taken back) and the capability goes to the next
//!   waiter.
//! - Withdrawing (releasing) one waiting lease of a group withdraws the whole
//!   group; a queue timeout fails the whole group.
//! - A request whose caller went away before it took the answer (an HTTP
//!   client that disconnected while the request was committed, while it
//!   waited for the grant, or before its response was taken) is given up
//!   ([`Unanswered`], [`LeaseEngine::abandon`]): withdrawn while
//!   `requested`, released if it was `granted` meanwhile, so that nobody
//!   holds a capability that no one knows about; events as for a release,
//!   with `reason: "client_disconnected"` and actor `system`.
//! - A request may carry an [`IdempotencyKey`]: the same principal sending
//!   the same request with the same key again gets the same lease(s)
//!   (see `idempotency.rs`).
//! - Queue timeout: the lease becomes `failed` with event `lease_expired`
//!   and `reason: "queue_timeout"` (seed 001 §7 has no `lease_failed`).
//! - Queue aging (`[policy.queue_aging]`, `aging.rs`): a waiting request
//!   ranks by its own priority plus a boost that grows with its age on
//!   the monotonic clock (across a restart: since its stored
//!   `requested_at`); preemption ignores the boost.
//! - `granted` → `active` (first action, [`LeaseEngine::begin_action`])
//!   is persisted without an event (§7 has none; the session records it).
//!
//! # Events
//! `data` is the lease JSON ([`CapabilityLease`]) after the transition,
//! plus `notice` ([`shared_protocol::lease::PreemptNotice`]) on
//! `lease_preempt_requested` and `reason` on `lease_expired` (`ttl_elapsed`,
//! `queue_timeout`), `lease_preempted` (`grace_period_ended`) and on
//! `lease_release_requested` / `lease_released` when the holder gave one.
//! Events caused by the engine itself carry actor `system`.

mod aging;
pub mod api;
mod clock;
mod commit;
mod error;
mod idempotency;
mod lifecycle;
mod model;
mod preemption;
mod queue;
mod safe_state;
mod sql;
mod unanswered;

use std::collections::HashSet;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use shared_protocol::capability::{
    Capability, CapabilityStatus, CapabilityType, HealthStatus, LeaseMode,
};
use shared_protocol::lease::{
    CapabilityLease, HolderType, LeaseGroup, LeaseGroupRequest, LeaseRenewRequest, LeaseRequest,
    LeaseStatus,
};
use shared_protocol::Validate;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::task::JoinHandle;

pub use aging::QueueAging;
pub use clock::{LeaseClock, ManualClock, SystemClock};
pub use error::LeaseError;
pub use idempotency::{IdempotencyKey, KEY_TTL as IDEMPOTENCY_KEY_TTL};
pub use safe_state::{
    is_safe_state, principal as safe_state_principal, release_actions, ReleaseAction,
    SAFE_STATE_PRINCIPAL, SAFE_STATE_PURPOSE,
};

/// Create the lease engine's tables (leases, idempotency keys);
/// idempotent. [`LeaseEngine::start`] runs it too.
pub fn migrate(conn: &crate::sql::Connection) -> rusqlite::Result<()> {
    sql::migrate(conn)?;
    idempotency::migrate(conn)
}
pub use unanswered::{AnswerStats, Stage, Unanswered};

use crate::auth::Principal;
use crate::db::Db;
use crate::events::EventBus;
use clock::Now;
use commit::{Counters, View};
use model::{unavailable, State, Tx, Want, SYSTEM_ACTOR};
use queue::{Admission, NewMember};

/// Most leases one group request may ask for (the protocol's limit).
pub use shared_protocol::validate::limits::MAX_GROUP_MEMBERS;

/// `reason` of the `lease_released` event of a lease given up by
/// [`LeaseEngine::abandon`]: its requester went away before it was told
/// the lease id.
pub const CLIENT_DISCONNECTED: &str = "client_disconnected";

/// Lease engine settings (the `[leases]` table of the registry's
/// configuration).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct LeaseConfig {
    /// Longest lease a request or renewal may ask for, seconds (3600).
    pub max_duration_seconds: u32,
    /// Grace period a preempted holder gets, seconds (10).
    pub default_grace_period_seconds: u32,
    /// `preempt_reason` values that allow preemption (seed 001 §6.2).
    pub preempt_reason_whitelist: Vec<String>,
    /// How often the sweeper runs, milliseconds (250).
    pub sweep_interval_ms: u64,
    /// Most requests that may wait at once (a group counts once); more are
    /// refused with [`LeaseError::QueueFull`] (10 000).
    pub max_queue_len: usize,
    /// Queue aging, from `[policy.queue_aging]` (not a `[leases]` key);
    /// `None`: waiters rank by their own priority only.
    #[serde(skip)]
    pub queue_aging: Option<QueueAging>,
}

impl Default for LeaseConfig {
    fn default() -> Self {
        Self {
            max_duration_seconds: 3600,
            default_grace_period_seconds: 10,
            preempt_reason_whitelist: [
                "safety_stop",
                "human_operator_override",
                "chief_audit",
                "hardware_audit_deadline",
            ]
            .map(String::from)
            .to_vec(),
            sweep_interval_ms: 250,
            max_queue_len: 10_000,
            queue_aging: None,
        }
    }
}

/// What the engine needs to know about one capability (from registration,
/// provider status and heartbeats).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CapabilityInfo {
    /// e.g. `cam-front-01`.
    pub capability_id: String,
    /// The provider exposing it (for [`LeaseEngine::set_provider_online`]
    /// and the events' `provider_id`).
    pub provider_id: String,
    /// For `capability_selector.node_id`.
    pub node_id: String,
    /// For selectors and requirements.
    pub capability_type: CapabilityType,
    /// For selector `tags` and requirement `preferred_node_tags`.
    pub tags: Vec<String>,
    /// How it may be shared; a lease always holds it in this mode.
    pub lease_mode: LeaseMode,
    /// Seed 001 §6.2 condition 1.
    pub preemptible: bool,
    /// Never preempted (§6.2 condition 2).
    pub safety_locked: bool,
    /// 0..=100; informational (every request carries its own priority).
    pub default_priority: u8,
    /// Whether its provider is online; offline capabilities are not granted.
    pub online: bool,
    /// Inside a non-interruptible window (seed 001 §6.4, from heartbeats):
    /// no preemption starts and no revocation or expiry happens meanwhile.
    pub non_interruptible: bool,
    /// `Some(reason)` while an admin has it in maintenance (the reason may
    /// be empty when not known, e.g. after a restart): never granted
    /// meanwhile (docs/policy.md "Maintenance").
    #[serde(default)]
    pub maintenance: Option<String>,
    /// Its provider last reported it `unhealthy`: never granted meanwhile
    /// (docs/policy.md "Health gating").
    #[serde(default)]
    pub unhealthy: bool,
    /// Actions run by the safe-state holder whenever the last lease on it
    /// ends (from `metadata_json.on_release`; docs/policy.md "Safe state
    /// on release").
    #[serde(default)]
    pub on_release: Vec<ReleaseAction>,
    /// `Some(reason)` while the registry itself holds it out of service (a
    /// failed health check or safe-state run,
    /// [`LeaseEngine::set_check_unhealthy`]): granted to nobody but the
    /// health check's own system lease ([`is_health_check`]). Heartbeats
    /// and re-registrations never clear it.
    #[serde(default)]
    pub check_failed: Option<String>,
}

impl CapabilityInfo {
    /// The engine's view of a stored capability. `online`: its provider's
    /// status; a stored `maintenance` status and an `unhealthy` health
    /// keep it from being granted.
    pub fn from_capability(c: &Capability, online: bool) -> Self {
        Self {
            capability_id: c.capability_id.clone(),
            provider_id: c.provider_id.clone(),
            node_id: c.node_id.clone(),
            capability_type: c.capability_type,
            tags: c.tags.clone(),
            lease_mode: c.lease_mode,
            preemptible: c.preemptible,
            safety_locked: c.safety_locked,
            default_priority: c.default_priority,
            online,
            non_interruptible: false,
            maintenance: (c.status == CapabilityStatus::Maintenance).then(String::new),
            unhealthy: c.health_status == HealthStatus::Unhealthy,
            on_release: release_actions(&c.capability_id, &c.metadata_json),
            check_failed: None,
        }
    }

    /// True when a lease may be granted on it now: its provider is online,
    /// it is not in maintenance and not `unhealthy` (as reported, or as
    /// the registry found).
    pub fn grantable(&self) -> bool {
        self.online && self.maintenance.is_none() && !self.is_unhealthy()
    }

    /// Reported `unhealthy` by its provider, or found so by the registry.
    pub fn is_unhealthy(&self) -> bool {
        self.unhealthy || self.check_failed.is_some()
    }

    /// [`grantable`](Self::grantable) for a lease of `holder_type` held
    /// by `principal`: the health check's own system lease
    /// ([`is_health_check`]) may also be granted one held out by a failed
    /// check (so that a passing check can bring it back).
    pub fn grantable_to(&self, holder_type: HolderType, principal: &str) -> bool {
        if self.check_failed.is_some() && is_health_check(holder_type, principal) {
            self.online && self.maintenance.is_none() && !self.unhealthy
        } else {
            self.grantable()
        }
    }
}

/// The principal the registry's health checks hold their system leases
/// as (docs/policy.md "Health checks").
pub const HEALTH_CHECK_PRINCIPAL: &str = "system:health-check";

/// True for a health check's lease: `holder_type: system` held by
/// [`HEALTH_CHECK_PRINCIPAL`].
pub fn is_health_check(holder_type: HolderType, principal: &str) -> bool {
    holder_type == HolderType::System && principal == HEALTH_CHECK_PRINCIPAL
}

/// Which leases [`LeaseEngine::list`] returns; every given field must match.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct LeaseFilter {
    /// Leases on this capability.
    pub capability_id: Option<String>,
    /// The holding principal's name.
    pub principal: Option<String>,
    /// Leases in exactly this status.
    pub status: Option<LeaseStatus>,
    /// The leases of one group request.
    pub lease_group_id: Option<String>,
    /// Only leases in a holding status (`granted`, `active`,
    /// `renew_pending`, `preempt_requested`, `grace_period`).
    pub active_only: bool,
    /// At most this many, newest first.
    pub limit: Option<usize>,
}

/// Lock a mutex, ignoring poisoning (no code panics while holding these
/// locks; if one ever did, the model is still the best information there
/// is).
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Why a lease duration's upper bound is what it is (said after the range
/// in a refusal).
pub(crate) const MAX_DURATION_WHY: &str = "the registry's longest lease";

/// Why a requirement's `min_duration_seconds` may not exceed a bound.
pub(crate) const MIN_DURATION_WHY: &str = "at most the requested_duration_seconds";

/// `requested_duration_seconds` must lie in `1..=max_duration_seconds`;
/// otherwise [`LeaseError::out_of_range`] naming the configured maximum
/// (the protocol's own limit of 86400 s is never the one in force: the
/// configuration cannot go above it).
pub(crate) fn check_duration(cfg: &LeaseConfig, seconds: u32) -> Result<(), LeaseError> {
    if (1..=cfg.max_duration_seconds).contains(&seconds) {
        Ok(())
    } else {
        Err(LeaseError::out_of_range(
            "requested_duration_seconds",
            seconds,
            1,
            cfg.max_duration_seconds,
            Some(MAX_DURATION_WHY),
        ))
    }
}

/// `holder_ref` must name the caller: its principal name, or a sub-holder
/// of it (`<principal>:<thread>`, `<principal>/<thread>`). Admins may give
/// any holder_ref.
fn check_holder_ref(holder: &Principal, holder_ref: &str) -> Result<(), LeaseError> {
    let own = holder_ref == holder.name
        || holder_ref
            .strip_prefix(holder.name.as_str())
            .is_some_and(|rest| rest.starts_with(':') || rest.starts_with('/'));
    if own || holder.is_admin() {
        Ok(())
    } else {
        Err(LeaseError::invalid(
            "holder_ref",
            format!(
                "`{holder_ref}` is not the caller `{}` (use `{}` or `{}:<sub-holder>`)",
                holder.name, holder.name, holder.name
            ),
        ))
    }
}

type Commit = Option<oneshot::Receiver<Result<(), String>>>;

async fn committed(rx: Commit) -> Result<(), LeaseError> {
    match rx {
        None => Ok(()),
        Some(rx) => match rx.await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(message)) => Err(LeaseError::Unavailable { message }),
            Err(_) => Err(LeaseError::Unavailable {
                message: "the lease committer stopped".to_string(),
            }),
        },
    }
}

/// The lease engine. Create with [`LeaseEngine::start`]; share the `Arc`.
pub struct LeaseEngine {
    cfg: LeaseConfig,
    db: Db,
    clock: Arc<dyn LeaseClock>,
    pub(crate) state: Mutex<State>,
    view: Arc<Mutex<View>>,
    stop: watch::Sender<bool>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
    /// The lab's principal policy (`crate::policy::principal`), set once
    /// after start; unset: no limits.
    principal_policy: std::sync::OnceLock<crate::policy::principal::PrincipalPolicy>,
    counters: Arc<Counters>,
    /// Answered and given-up requests.
    answers: unanswered::AnswerCounters,
    /// Idempotency keys; locked only while `state` is held.
    keys: Mutex<idempotency::KeyBook>,
}

/// A request's answer before its requester has taken it (see
/// [`LeaseEngine::request_unanswered`]).
pub struct Requested<T> {
    /// The lease (or group) as committed.
    pub answer: T,
    /// Gives the leases up when dropped before
    /// [`answered`](Unanswered::answered).
    pub unanswered: Unanswered,
    /// True when an earlier request with the same idempotency key made
    /// these leases (`unanswered` is then empty: nothing to give up).
    pub replayed: bool,
}

impl<T> Requested<T> {
    /// The answer, handed over: the leases are kept.
    pub fn answered(self) -> T {
        self.unanswered.answered();
        self.answer
    }
}

/// What the group committer has done since the engine started.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CommitStats {
    /// SQLite transactions committed.
    pub commits: u64,
    /// Operations (requests, releases, sweeps...) they carried.
    pub operations: u64,
    /// Lease rows written (after coalescing several changes of one lease).
    pub rows: u64,
    /// Events appended.
    pub events: u64,
    /// Time the writer thread spent in these transactions, microseconds.
    pub writer_busy_us: u64,
}

impl LeaseEngine {
    /// Create the table if needed, load every persisted live lease (each
    /// keeps its wall-clock deadline, see the module doc), and start the
    /// committer and the sweeper tasks on the current runtime.
    ///
    /// The capability directory starts empty: the registry must
    /// [`upsert_capability`](Self::upsert_capability) every known capability
    /// after start (leases on capabilities not yet upserted keep holding
    /// them; nothing is granted on them until then).
    ///
    /// Errors: [`LeaseError::Store`] when the table cannot be created or a
    /// row cannot be read; [`LeaseError::InvalidRequest`] for a zero
    /// `sweep_interval_ms`.
    pub async fn start(db: Db, bus: EventBus, cfg: LeaseConfig) -> Result<Arc<Self>, LeaseError> {
        Self::start_with_clock(db, bus, cfg, Arc::new(SystemClock)).await
    }

    /// [`start`](Self::start) with another clock (tests, simulations).
    pub async fn start_with_clock(
        db: Db,
        bus: EventBus,
        cfg: LeaseConfig,
        clock: Arc<dyn LeaseClock>,
    ) -> Result<Arc<Self>, LeaseError> {
        if cfg.sweep_interval_ms == 0 {
            return Err(LeaseError::invalid(
                "sweep_interval_ms",
                "must be at least 1",
            ));
        }
        db.write(|c| migrate(c)).await??;
        let (rows, next_seq, next_generation, counts) = db.read(|c| sql::load_live(c)).await??;
        let now = Now::read(&*clock);
        let cutoff = now.wall - idempotency::KEY_TTL;
        let stored_keys = db.write(move |c| idempotency::load(c, cutoff)).await??;
        let mut keys = idempotency::KeyBook::default();
        for (principal, key, fp, ids, created_at) in stored_keys {
            let Ok(key) = IdempotencyKey::parse(&key) else {
                continue;
            };
            // Its age on the wall clock, as lease deadlines across a restart.
            let age = (now.wall - created_at).to_std().unwrap_or_default();
            let created = now.instant.checked_sub(age).unwrap_or(now.instant);
            keys.restore(created, &principal, &key, fp, ids);
        }
        let (sender, receiver) = mpsc::unbounded_channel();
        let mut state = State::new(sender);
        state.load(rows.clone(), next_seq, next_generation, &Now::read(&*clock));
        let mut view = View::default();
        view.load(&rows, &counts);
        let (stop, stop_rx) = watch::channel(false);
        let engine = Arc::new(Self {
            cfg,
            db: db.clone(),
            clock,
            state: Mutex::new(state),
            view: Arc::new(Mutex::new(view)),
            stop,
            tasks: Mutex::new(Vec::new()),
            principal_policy: std::sync::OnceLock::new(),
            counters: Arc::new(Counters::default()),
            answers: Default::default(),
            keys: Mutex::new(keys),
        });
        tracing::info!(
            live_leases = rows.len(),
            "lease engine started with persisted leases"
        );
        let committer = tokio::spawn(commit::run(
            receiver,
            db,
            bus,
            engine.view.clone(),
            Arc::downgrade(&engine),
            engine.counters.clone(),
        ));
        let sweeper = tokio::spawn(sweeper(
            Arc::downgrade(&engine),
            stop_rx,
            Duration::from_millis(engine.cfg.sweep_interval_ms),
        ));
        lock(&engine.tasks).extend([committer, sweeper]);
        Ok(engine)
    }

    /// Enforce `policy` on every request from now on (once; a second call
    /// is ignored). An empty policy is not installed.
    pub fn set_principal_policy(&self, policy: crate::policy::principal::PrincipalPolicy) {
        if !policy.is_empty() {
            let _ = self.principal_policy.set(policy);
        }
    }

    /// Record grants (`benchlink_lease_wait_seconds`), ends of granted
    /// leases (`benchlink_lease_hold_seconds`) and the queue depth in
    /// `metrics` from now on (docs/install-registry.md "Metrics").
    pub fn attach_metrics(&self, metrics: crate::metrics::LeaseMetrics) {
        let mut st = lock(&self.state);
        metrics.set_queue_depth(st.queue_len());
        st.metrics = Some(metrics);
    }

    /// The principal policy's limits for `holder`, if any apply.
    fn limits(&self, holder: &Principal) -> Option<crate::policy::principal::Limits> {
        self.principal_policy.get()?.limits(holder)
    }

    /// The settings in force.
    pub fn config(&self) -> &LeaseConfig {
        &self.cfg
    }

    fn now(&self) -> Now {
        Now::read(&*self.clock)
    }

    fn ready(st: &State) -> Result<(), LeaseError> {
        match unavailable(st) {
            Some(why) => Err(LeaseError::Unavailable {
                message: why.to_string(),
            }),
            None => Ok(()),
        }
    }

    /// Queue `tx` for commit (nothing to wait for when it is empty).
    fn submit(st: &mut State, tx: Tx) -> Result<Commit, LeaseError> {
        if tx.is_empty() {
            return Ok(None);
        }
        Self::send_piece(st, tx)
    }

    /// A commit of nothing, done once everything submitted before it is
    /// committed (pieces commit in order).
    fn barrier(st: &mut State) -> Result<Commit, LeaseError> {
        Self::send_piece(st, Tx::default())
    }

    fn send_piece(st: &mut State, tx: Tx) -> Result<Commit, LeaseError> {
        // Every change of the queue is in a piece: its depth is current.
        if let Some(m) = &st.metrics {
            m.set_queue_depth(st.queue_len());
        }
        let sender = st.sender.as_ref().ok_or_else(|| LeaseError::Unavailable {
            message: "shut down".to_string(),
        })?;
        let (done, rx) = oneshot::channel();
        if sender
            .send(model::Piece {
                tx,
                done: Some(done),
            })
            .is_err()
        {
            st.available = false;
            return Err(LeaseError::Unavailable {
                message: "the lease committer stopped".to_string(),
            });
        }
        Ok(Some(rx))
    }

    fn check_duration(&self, seconds: u32) -> Result<(), LeaseError> {
        check_duration(&self.cfg, seconds)
    }

    /// Ask for a lease on one capability (`capability_id`, or a free
    /// capability matching `capability_selector`). Answers after the
    /// commit with the lease `granted`, or `requested` when it has to wait
    /// (possibly after starting a preemption for it); use
    /// [`wait_granted`](Self::wait_granted) to wait for the grant. While a
    /// selector request waits, its `capability_id` is empty; the grant sets
    /// it.
    ///
    /// `queue_timeout_seconds`: a waiting request becomes `failed` after
    /// that long (0: at the next sweep unless granted at once).
    ///
    /// Events: `lease_requested`, then `lease_granted` when granted at once,
    /// and `lease_preempt_requested` for a holder it preempts.
    ///
    /// Cancellation: dropping this future after the request was admitted
    /// (while its commit is in flight) gives the lease up, as
    /// [`abandon`](Self::abandon) does; once it has answered, the lease
    /// is the caller's.
    ///
    /// Errors: `InvalidRequest` (a field out of range; a duration outside
    /// 1..=`max_duration_seconds`, checked first so that the message names
    /// the configured maximum; `holder_ref` not the caller's; `mode` not
    /// the capability's), `UnknownCapability`, `NoMatchingCapability`,
    /// `CapabilityOffline`, `QueueFull`, `Unavailable`.
    pub async fn request(
        self: &Arc<Self>,
        holder: &Principal,
        req: LeaseRequest,
    ) -> Result<CapabilityLease, LeaseError> {
        Ok(self.request_unanswered(holder, req, None).await?.answered())
    }

    /// [`request`](Self::request) for a caller that has to hand the answer
    /// on (an HTTP handler): the leases are guarded by
    /// [`Requested::unanswered`] from the moment they are admitted, before
    /// the first `.await`, so dropping this future, or the guard before
    /// [`Unanswered::answered`], gives them up. With `key`, a request of
    /// the same principal with the same key (and the same body) that is
    /// still remembered is answered with its lease as committed now
    /// (`replayed`), and nothing new is requested.
    ///
    /// Errors: as [`request`](Self::request); `IdempotencyKeyReused` when
    /// `key` was used for another body; `Unavailable` when the first
    /// request with `key` was not stored (the key is forgotten; sending
    /// it again makes a new request).
    pub async fn request_unanswered(
        self: &Arc<Self>,
        holder: &Principal,
        req: LeaseRequest,
        key: Option<&IdempotencyKey>,
    ) -> Result<Requested<CapabilityLease>, LeaseError> {
        self.check_duration(req.requested_duration_seconds)?;
        req.validate()?;
        check_holder_ref(holder, &req.holder_ref)?;
        let limits = self.limits(holder);
        if let Some(l) = &limits {
            l.check_request(
                req.priority,
                req.requested_duration_seconds,
                req.preempt_if_needed,
                req.preempt_reason.as_deref(),
            )?;
        }
        let fingerprint = key.map(|_| idempotency::fingerprint("request", &req));
        let admitted = {
            let mut st = lock(&self.state);
            Self::ready(&st)?;
            let now = self.now();
            match self.replay_of(&mut st, &now, holder, key, fingerprint.as_ref())? {
                Some(replay) => Err(replay),
                None => {
                    let member = resolve_single(&st, &req, &holder.name)?;
                    if let Some(l) = &limits {
                        match (&req.capability_id, &req.capability_selector) {
                            (Some(id), _) => {
                                if let Some(info) = st.dir.get(id) {
                                    l.check_capability(info)?;
                                }
                            }
                            (None, Some(s)) => l.check_selector(s)?,
                            (None, None) => {}
                        }
                        l.check_concurrent(st.live_leases_of(&holder.name), 1)?;
                    }
                    let mut tx = Tx::default();
                    let ids = st.admit(
                        &mut tx,
                        &now,
                        &self.cfg,
                        Admission {
                            principal: holder.name.clone(),
                            holder_type: req.holder_type,
                            holder_ref: req.holder_ref,
                            project_id: req.project_id,
                            purpose: req.purpose,
                            priority: req.priority,
                            requested_duration_seconds: req.requested_duration_seconds,
                            evidence_required: req.evidence_required,
                            preempt_if_needed: req.preempt_if_needed,
                            preempt_reason: req.preempt_reason,
                            queue_timeout_seconds: req.queue_timeout_seconds,
                            lease_group_id: None,
                            members: vec![member],
                        },
                    )?;
                    self.remember(&mut tx, &now, holder, key, fingerprint, &ids);
                    let lease = ids.first().and_then(|id| st.snapshot(id));
                    Ok((ids, lease, Self::submit(&mut st, tx)))
                }
            }
        };
        let (ids, lease, rx) = match admitted {
            Ok(a) => a,
            Err((ids, rx)) => {
                let lease = self.replayed(ids, rx).await?.into_iter().next();
                let lease = lease.ok_or_else(|| LeaseError::Unavailable {
                    message: "the replayed lease vanished".to_string(),
                })?;
                return Ok(self.replay(lease));
            }
        };
        // Outside the state lock (the guard's drop takes it) and before
        // any await: from here a dropped future gives the lease up.
        let unanswered = Unanswered::new(self.clone(), ids);
        committed(rx?).await?;
        let answer = lease.ok_or_else(|| LeaseError::Unavailable {
            message: "the new lease vanished before it was answered".to_string(),
        })?;
        Ok(Requested {
            answer,
            unanswered,
            replayed: false,
        })
    }

    /// A replayed answer: nothing to give up.
    fn replay<T>(self: &Arc<Self>, answer: T) -> Requested<T> {
        Requested {
            answer,
            unanswered: Unanswered::new(self.clone(), Vec::new()),
            replayed: true,
        }
    }

    /// With `key`: the lease ids of the earlier request it names and a
    /// commit barrier behind that request's commit (`Err`, to return
    /// early), or `None` for a new request.
    #[allow(clippy::type_complexity)]
    fn replay_of(
        &self,
        st: &mut State,
        now: &Now,
        holder: &Principal,
        key: Option<&IdempotencyKey>,
        fingerprint: Option<&[u8; 32]>,
    ) -> Result<Option<(Vec<String>, Commit)>, LeaseError> {
        let (Some(key), Some(fp)) = (key, fingerprint) else {
            return Ok(None);
        };
        let Some(ids) = lock(&self.keys).lookup(now.instant, &holder.name, key, fp)? else {
            return Ok(None);
        };
        Ok(Some((ids, Self::barrier(st)?)))
    }

    /// Remember `key` for `ids`; its row goes into `tx`, the commit of the
    /// leases it made.
    fn remember(
        &self,
        tx: &mut Tx,
        now: &Now,
        holder: &Principal,
        key: Option<&IdempotencyKey>,
        fingerprint: Option<[u8; 32]>,
        ids: &[String],
    ) {
        if let (Some(key), Some(fp)) = (key, fingerprint) {
            let mut book = lock(&self.keys);
            book.insert(now.instant, now.wall, &holder.name, key, fp, ids.to_vec());
            tx.keys.extend(book.take_changes());
        }
    }

    /// The leases of a replayed request as committed once `barrier` is.
    async fn replayed(
        &self,
        ids: Vec<String>,
        barrier: Commit,
    ) -> Result<Vec<CapabilityLease>, LeaseError> {
        committed(barrier).await?;
        let mut leases = Vec::with_capacity(ids.len());
        for id in &ids {
            match self.get(id).await {
                Some(l) => leases.push(l),
                None => {
                    // Its commit failed and the model was reloaded without it.
                    lock(&self.keys).forget_leases(&ids);
                    return Err(LeaseError::Unavailable {
                        message: "the first request with this Idempotency-Key was not stored; \
                                  send it again"
                            .to_string(),
                    });
                }
            }
        }
        Ok(leases)
    }

    /// Ask for several capabilities at once (an audit task's
    /// `capability_requirements`, seed 001 §13): every lease is granted in
    /// the same commit, or all wait together; the group never holds part of
    /// its capabilities while waiting for the rest. Each lease gets the
    /// same `lease_group_id`.
    ///
    /// A requirement with `preempt_if_needed` lets the group preempt (with
    /// the group's `preempt_reason`). Requirements pick distinct
    /// capabilities greedily in order (preferred tags first).
    ///
    /// Errors: as [`request`](Self::request); `InvalidRequest` for a
    /// repeated capability id, more than [`MAX_GROUP_MEMBERS`] members, or a
    /// requirement's `min_duration_seconds` above the requested duration.
    pub async fn request_group(
        self: &Arc<Self>,
        holder: &Principal,
        req: LeaseGroupRequest,
    ) -> Result<LeaseGroup, LeaseError> {
        Ok(self
            .request_group_unanswered(holder, req, None)
            .await?
            .answered())
    }

    /// [`request_group`](Self::request_group) with the guard and the
    /// idempotency key of [`request_unanswered`](Self::request_unanswered).
    ///
    /// Errors: as those two.
    pub async fn request_group_unanswered(
        self: &Arc<Self>,
        holder: &Principal,
        req: LeaseGroupRequest,
        key: Option<&IdempotencyKey>,
    ) -> Result<Requested<LeaseGroup>, LeaseError> {
        self.check_duration(req.requested_duration_seconds)?;
        req.validate()?;
        check_holder_ref(holder, &req.holder_ref)?;
        let count = req.capability_ids.len() + req.requirements.len();
        if count > MAX_GROUP_MEMBERS {
            return Err(LeaseError::invalid(
                "capability_ids",
                format!("{count} capabilities asked; at most {MAX_GROUP_MEMBERS} per group"),
            ));
        }
        let limits = self.limits(holder);
        if let Some(l) = &limits {
            let preempting =
                req.preempt_if_needed || req.requirements.iter().any(|r| r.preempt_if_needed);
            l.check_request(
                req.priority,
                req.requested_duration_seconds,
                preempting,
                req.preempt_reason.as_deref(),
            )?;
            for r in &req.requirements {
                l.check_requirement(r)?;
            }
        }
        let fingerprint = key.map(|_| idempotency::fingerprint("request-group", &req));
        let group_id = format!("lgrp_{}", uuid::Uuid::new_v4().simple());
        let admitted = {
            let mut st = lock(&self.state);
            Self::ready(&st)?;
            let now = self.now();
            match self.replay_of(&mut st, &now, holder, key, fingerprint.as_ref())? {
                Some(replay) => Err(replay),
                None => {
                    let members = resolve_group(&st, &req)?;
                    if let Some(l) = &limits {
                        for id in &req.capability_ids {
                            if let Some(info) = st.dir.get(id) {
                                l.check_capability(info)?;
                            }
                        }
                        l.check_concurrent(st.live_leases_of(&holder.name), members.len())?;
                    }
                    let preempt_if_needed = req.preempt_if_needed
                        || req.requirements.iter().any(|r| r.preempt_if_needed);
                    let mut tx = Tx::default();
                    let ids = st.admit(
                        &mut tx,
                        &now,
                        &self.cfg,
                        Admission {
                            principal: holder.name.clone(),
                            holder_type: req.holder_type,
                            holder_ref: req.holder_ref,
                            project_id: req.project_id,
                            purpose: req.purpose,
                            priority: req.priority,
                            requested_duration_seconds: req.requested_duration_seconds,
                            evidence_required: req.evidence_required,
                            preempt_if_needed,
                            preempt_reason: req.preempt_reason,
                            queue_timeout_seconds: req.queue_timeout_seconds,
                            lease_group_id: Some(group_id.clone()),
                            members,
                        },
                    )?;
                    self.remember(&mut tx, &now, holder, key, fingerprint, &ids);
                    let leases: Vec<CapabilityLease> =
                        ids.iter().filter_map(|id| st.snapshot(id)).collect();
                    Ok((ids, leases, Self::submit(&mut st, tx)))
                }
            }
        };
        let group_of = |group_id: String, leases: Vec<CapabilityLease>| LeaseGroup {
            lease_group_id: group_id,
            status: leases
                .first()
                .map(|l| l.status)
                .unwrap_or(LeaseStatus::Requested),
            leases,
        };
        let (ids, leases, rx) = match admitted {
            Ok(a) => a,
            Err((ids, rx)) => {
                let leases = self.replayed(ids, rx).await?;
                let group_id = leases
                    .first()
                    .and_then(|l| l.lease_group_id.clone())
                    .unwrap_or_default();
                return Ok(self.replay(group_of(group_id, leases)));
            }
        };
        // As in `request_unanswered`: guarded before any await.
        let unanswered = Unanswered::new(self.clone(), ids);
        committed(rx?).await?;
        Ok(Requested {
            answer: group_of(group_id, leases),
            unanswered,
            replayed: false,
        })
    }

    /// Wait until lease `lease_id` leaves `requested` (granted, or failed /
    /// withdrawn) and return it as committed; after `timeout` return it as
    /// it is then (still `requested`).
    ///
    /// Errors: `NotFound`.
    pub async fn wait_granted(
        &self,
        lease_id: &str,
        timeout: Duration,
    ) -> Result<CapabilityLease, LeaseError> {
        let rx = {
            let mut view = lock(&self.view);
            match view.leases.get(lease_id) {
                Some(l) if l.status != LeaseStatus::Requested => return Ok(l.clone()),
                Some(_) => {
                    let (tx, rx) = oneshot::channel();
                    let ws = view.waiters.entry(lease_id.to_string()).or_default();
                    ws.retain(|w| !w.is_closed());
                    ws.push(tx);
                    Some(rx)
                }
                None => None,
            }
        };
        if let Some(rx) = rx {
            if let Ok(Ok(lease)) = tokio::time::timeout(timeout, rx).await {
                return Ok(lease);
            }
        }
        self.get(lease_id)
            .await
            .ok_or_else(|| LeaseError::NotFound {
                lease_id: lease_id.to_string(),
            })
    }

    /// Give up leases whose requester went away before it was told their
    /// ids (what a dropped [`Unanswered`] does; e.g. an HTTP client that
    /// disconnected before its answer was written): a lease still
    /// `requested` is withdrawn with its whole
    /// group (`released`), and one `granted` but not yet acted on is
    /// released, its capability going to the next waiter in the same
    /// commit. Leases in any other status (in use, being preempted, ended)
    /// and unknown ids are left as they are.
    ///
    /// Events: `lease_release_requested`, `lease_released`, both with
    /// `reason: "client_disconnected"` ([`CLIENT_DISCONNECTED`]) and actor
    /// `system`. Answers after the commit.
    ///
    /// Errors: `Unavailable` (nothing was changed).
    pub async fn abandon(&self, lease_ids: &[String]) -> Result<(), LeaseError> {
        let rx = self.give_up(lease_ids)?;
        committed(rx).await
    }

    /// The model change of [`abandon`](Self::abandon), without waiting for
    /// its commit (for a drop guard); also forgets the idempotency keys
    /// that made these leases.
    pub(crate) fn give_up(&self, lease_ids: &[String]) -> Result<Commit, LeaseError> {
        let mut st = lock(&self.state);
        Self::ready(&st)?;
        let now = self.now();
        let mut tx = Tx::default();
        for id in lease_ids {
            st.settle(&mut tx, &now, &self.cfg, id);
            let unclaimed = st.leases.get(id).is_some_and(|e| {
                matches!(
                    e.lease.status,
                    LeaseStatus::Requested | LeaseStatus::Granted
                )
            });
            if unclaimed {
                st.release(
                    &mut tx,
                    &now,
                    &self.cfg,
                    id,
                    SYSTEM_ACTOR,
                    Some(CLIENT_DISCONNECTED),
                );
            }
        }
        {
            let mut book = lock(&self.keys);
            book.forget_leases(lease_ids);
            tx.keys.extend(book.take_changes());
        }
        Self::submit(&mut st, tx)
    }

    /// Requests answered and given up since start (for metrics).
    pub fn answer_stats(&self) -> AnswerStats {
        self.answers.stats()
    }

    /// A lease that is not live (final, or unknown): the answer for
    /// `operation` on it.
    async fn not_live(
        &self,
        holder: Option<&Principal>,
        lease_id: &str,
        operation: &'static str,
        admin_may: bool,
    ) -> Result<CapabilityLease, LeaseError> {
        let lease = {
            let st = lock(&self.state);
            st.recent_final.get(lease_id).cloned()
        };
        let lease = match lease {
            Some(l) => l,
            None => {
                let id = lease_id.to_string();
                self.db
                    .read(move |c| sql::load_one(c, &id))
                    .await??
                    .ok_or_else(|| LeaseError::NotFound {
                        lease_id: lease_id.to_string(),
                    })?
            }
        };
        if let Some(holder) = holder {
            check_holder(holder, &lease, admin_may)?;
        }
        if operation == "release" && lease.status == LeaseStatus::Released {
            return Ok(lease);
        }
        Err(LeaseError::status(lease_id, lease.status, operation))
    }

    /// Run `op` on live lease `lease_id` after checking the caller holds it
    /// (unless `holder` is `None`: checked already) and settling a passed
    /// deadline; `None` when the lease is not live.
    async fn on_live<T: Send>(
        &self,
        holder: Option<&Principal>,
        lease_id: &str,
        operation: &'static str,
        admin_may: bool,
        op: impl FnOnce(&mut State, &mut Tx, &Now) -> Result<T, LeaseError>,
    ) -> Option<Result<T, LeaseError>> {
        let (result, rx) = {
            let mut st = lock(&self.state);
            if let Err(e) = Self::ready(&st) {
                return Some(Err(e));
            }
            let lease = st.leases.get(lease_id)?;
            if let Some(Err(e)) = holder.map(|h| check_holder(h, &lease.lease, admin_may)) {
                return Some(Err(e));
            }
            let now = self.now();
            let mut tx = Tx::default();
            st.settle(&mut tx, &now, &self.cfg, lease_id);
            let result = if st.leases.contains_key(lease_id) {
                op(&mut st, &mut tx, &now)
            } else {
                let status = st
                    .snapshot(lease_id)
                    .map(|l| l.status)
                    .unwrap_or(LeaseStatus::Expired);
                Err(LeaseError::status(lease_id, status, operation))
            };
            match Self::submit(&mut st, tx) {
                Ok(rx) => (result, rx),
                Err(e) => return Some(Err(e)),
            }
        };
        if let Err(e) = committed(rx).await {
            return Some(Err(e));
        }
        Some(result)
    }

    /// Extend a held lease: new `expires_at` = now + the requested duration
    /// (default: the duration first requested), at most
    /// `max_duration_seconds`. Only the holding principal may renew.
    /// Event: `lease_renewed`.
    ///
    /// Errors: `NotFound`, `NotHolder`, `Expired` (nothing changes),
    /// `NotUsable` for `requested`, `preempt_requested`, `grace_period`
    /// (renewal is refused during a grace period), `released`, `revoked`,
    /// `failed`; `InvalidRequest` for a duration above the maximum.
    pub async fn renew(
        &self,
        holder: &Principal,
        lease_id: &str,
        req: LeaseRenewRequest,
    ) -> Result<CapabilityLease, LeaseError> {
        if let Some(d) = req.requested_duration_seconds {
            self.check_duration(d)?;
        }
        req.validate()?;
        let cfg = self.cfg.clone();
        let actor = holder.name.clone();
        // The lab's policy is checked once the caller is known to hold the
        // lease: anyone else is told `NotHolder`, not the holder's limits.
        let limits = self.limits(holder);
        let done = self
            .on_live(Some(holder), lease_id, "renew", false, |st, tx, now| {
                if let (Some(l), Some(d)) = (&limits, req.requested_duration_seconds) {
                    l.check_duration(d)?;
                }
                st.renew(
                    tx,
                    now,
                    &cfg,
                    lease_id,
                    &actor,
                    req.requested_duration_seconds,
                )
            })
            .await;
        match done {
            Some(r) => r,
            None => self.not_live(Some(holder), lease_id, "renew", false).await,
        }
    }

    /// Give a lease back (the holder, or an admin). A held lease becomes
    /// `released` and its capability goes to the next waiter in the same
    /// commit (during a grace period: to the preempting request at once).
    /// A waiting request is withdrawn (`released`) with its whole group.
    /// Releasing an already released lease answers it again (idempotent).
    /// Events: `lease_release_requested`, `lease_released` (with `reason`).
    ///
    /// Errors: `NotFound`, `NotHolder`, `Expired`, `NotUsable` (`revoked`,
    /// `failed`).
    pub async fn release(
        &self,
        holder: &Principal,
        lease_id: &str,
        reason: Option<String>,
    ) -> Result<CapabilityLease, LeaseError> {
        let cfg = self.cfg.clone();
        let actor = holder.name.clone();
        let done = self
            .on_live(Some(holder), lease_id, "release", true, |st, tx, now| {
                st.release(tx, now, &cfg, lease_id, &actor, reason.as_deref())
                    .ok_or_else(|| LeaseError::NotFound {
                        lease_id: lease_id.to_string(),
                    })
            })
            .await;
        match done {
            Some(r) => r,
            None => self.not_live(Some(holder), lease_id, "release", true).await,
        }
    }

    /// The lease check of an action, made once and first: lease
    /// `lease_id` exists, `holder` holds it and, as last committed, it is
    /// in a holding status (so an ended lease is refused as such, before
    /// the action's own checks). Reads only; the status is judged again
    /// when the action commits its use ([`LeaseEngine::begin_action`]),
    /// after the action's other checks, so that a refused action never
    /// activates a lease.
    ///
    /// Errors: `NotFound` (also when the store cannot be read), `NotHolder`,
    /// `Expired`, `NotUsable` (`requested` or final).
    pub async fn check_action(
        &self,
        holder: &Principal,
        lease_id: &str,
    ) -> Result<CapabilityLease, LeaseError> {
        let lease = self
            .get(lease_id)
            .await
            .ok_or_else(|| LeaseError::NotFound {
                lease_id: lease_id.to_string(),
            })?;
        check_holder(holder, &lease, false)?;
        if !lease.status.holds_capability() {
            return Err(LeaseError::status(lease_id, lease.status, "act"));
        }
        Ok(lease)
    }

    /// Commit the use of lease `lease_id` by an action on `capability_id`
    /// whose holder [`LeaseEngine::check_action`] checked: the lease covers
    /// that capability and is in a holding status (`granted`, `active`,
    /// `renew_pending`, or finishing up in `preempt_requested` /
    /// `grace_period`), also after a deadline that passed meanwhile is
    /// settled. The first action moves `granted` to `active`.
    ///
    /// Errors: `NotFound`, `Expired`, `NotUsable` (`requested` or final),
    /// `InvalidRequest` (field `capability_id`) when the lease covers
    /// another capability.
    pub async fn begin_action(
        &self,
        lease_id: &str,
        capability_id: &str,
    ) -> Result<CapabilityLease, LeaseError> {
        self.act(None, lease_id, capability_id).await
    }

    /// [`LeaseEngine::check_action`]'s holder check and
    /// [`LeaseEngine::begin_action`] in one call.
    ///
    /// Errors: as both.
    pub async fn authorize_action(
        &self,
        holder: &Principal,
        lease_id: &str,
        capability_id: &str,
    ) -> Result<CapabilityLease, LeaseError> {
        self.act(Some(holder), lease_id, capability_id).await
    }

    async fn act(
        &self,
        holder: Option<&Principal>,
        lease_id: &str,
        capability_id: &str,
    ) -> Result<CapabilityLease, LeaseError> {
        let done = self
            .on_live(holder, lease_id, "act", false, |st, tx, _| {
                st.authorize(tx, lease_id, capability_id)
            })
            .await;
        match done {
            Some(r) => r,
            None => self.not_live(holder, lease_id, "act", false).await,
        }
    }

    /// A lease as last committed (live leases from memory, others from the
    /// table). `None` when unknown or the store cannot be read.
    pub async fn get(&self, lease_id: &str) -> Option<CapabilityLease> {
        if let Some(l) = lock(&self.view).leases.get(lease_id) {
            return Some(l.clone());
        }
        let id = lease_id.to_string();
        match self.db.read(move |c| sql::load_one(c, &id)).await {
            Ok(Ok(l)) => l,
            Ok(Err(e)) => {
                tracing::error!(lease_id, error = %e, "cannot read lease");
                None
            }
            Err(e) => {
                tracing::error!(lease_id, error = %e, "cannot read lease");
                None
            }
        }
    }

    /// Committed leases matching `filter`, newest first (empty when the
    /// store cannot be read; the error is logged).
    pub async fn list(&self, filter: LeaseFilter) -> Vec<CapabilityLease> {
        match self.try_list(filter).await {
            Ok(v) => v,
            Err(e) => {
                tracing::error!(error = %e, "cannot list leases");
                Vec::new()
            }
        }
    }

    /// [`list`](Self::list) that reports a store failure.
    pub async fn try_list(&self, filter: LeaseFilter) -> Result<Vec<CapabilityLease>, LeaseError> {
        Ok(self.db.read(move |c| sql::list(c, &filter)).await??)
    }

    /// Every registered capability as the engine sees it (type, tags,
    /// lease mode, online), in no particular order.
    pub async fn directory(&self) -> Vec<CapabilityInfo> {
        lock(&self.state).dir.values().cloned().collect()
    }

    /// Ids of capabilities with at least one committed lease in a holding
    /// status.
    pub async fn held_capabilities(&self) -> HashSet<String> {
        lock(&self.view)
            .leases
            .values()
            .filter(|l| l.status.holds_capability())
            .map(|l| l.capability_id.clone())
            .collect()
    }

    /// Number of leases ever stored in each status, every status listed
    /// (for metrics). Counted from the table at start and kept up to date
    /// by every commit, so this reads no rows; it never fails (the
    /// `Result` is kept for callers written against a store read).
    pub async fn counts_by_status(&self) -> Result<Vec<(LeaseStatus, u64)>, LeaseError> {
        Ok(lock(&self.view).counts())
    }

    /// Group-commit counters since start.
    pub fn commit_stats(&self) -> CommitStats {
        use std::sync::atomic::Ordering::Relaxed;
        let c = &self.counters;
        CommitStats {
            commits: c.commits.load(Relaxed),
            operations: c.operations.load(Relaxed),
            rows: c.rows.load(Relaxed),
            events: c.events.load(Relaxed),
            writer_busy_us: c.writer_busy_us.load(Relaxed),
        }
    }

    /// Whether the engine still works: its committer and sweeper tasks are
    /// running (they end only at [`LeaseEngine::shutdown`]). For the
    /// service watchdog (`crate::notify`); `Err` names what stopped.
    pub fn tasks_alive(&self) -> Result<(), &'static str> {
        if lock(&self.tasks).iter().any(|t| t.is_finished()) {
            return Err("a lease engine task (committer or sweeper) has stopped");
        }
        Ok(())
    }

    /// Number of waiting requests (a group counts once).
    pub fn queue_len(&self) -> usize {
        lock(&self.state).queue_len()
    }

    /// Apply a change of the model made by `change` (which returns the
    /// capabilities that changed), then sweep and grant; waits for the
    /// commit. Errors are logged: directory updates come from providers and
    /// have nobody to answer to.
    async fn directory_change(
        &self,
        what: &str,
        change: impl FnOnce(&mut State) -> HashSet<String>,
    ) {
        let rx = {
            let mut st = lock(&self.state);
            let dirty = change(&mut st);
            if Self::ready(&st).is_err() {
                return;
            }
            let now = self.now();
            let mut tx = Tx::default();
            st.sweep(&mut tx, &now, &self.cfg, dirty);
            Self::submit(&mut st, tx)
        };
        let result = match rx {
            Ok(rx) => committed(rx).await,
            Err(e) => Err(e),
        };
        if let Err(e) = result {
            tracing::error!(change = what, error = %e, "lease engine could not apply a directory change");
        }
    }

    /// Register or update a capability (registration, re-registration,
    /// status). Waiting selector and requirement requests that it matches
    /// may be granted on it.
    ///
    /// An open non-interruptible window stays open across an upsert (a
    /// re-registration does not know about running actions); only
    /// [`set_non_interruptible`](Self::set_non_interruptible) or the
    /// provider going offline closes it.
    pub async fn upsert_capability(&self, mut info: CapabilityInfo) {
        self.directory_change("upsert_capability", |st| {
            let id = info.capability_id.clone();
            if let Some(old) = st.dir.get(&id) {
                if old.non_interruptible {
                    info.non_interruptible = true;
                }
                // The store knows the status, the engine the reason.
                if info.maintenance.is_some() && old.maintenance.is_some() {
                    info.maintenance = old.maintenance.clone();
                }
                // Only the registry's own check clears what it found.
                info.check_failed = old.check_failed.clone();
            }
            st.dir.insert(id.clone(), info);
            st.refresh_candidates();
            HashSet::from([id])
        })
        .await
    }

    /// A provider went online or offline: its capabilities become grantable
    /// or not (see the module doc for what offline means for leases).
    pub async fn set_provider_online(&self, provider_id: &str, online: bool) {
        self.directory_change("set_provider_online", |st| {
            let mut changed = HashSet::new();
            for info in st.dir.values_mut().filter(|i| i.provider_id == provider_id) {
                info.online = online;
                if !online {
                    info.non_interruptible = false;
                }
                changed.insert(info.capability_id.clone());
            }
            changed
        })
        .await
    }

    /// A capability entered (`true`) or left (`false`) a non-interruptible
    /// window (seed 001 §6.4). Leaving it lets a revocation or expiry that
    /// was held back happen at once, and a preemption that it blocked
    /// start.
    pub async fn set_non_interruptible(&self, capability_id: &str, active: bool) {
        self.directory_change("set_non_interruptible", |st| {
            match st.dir.get_mut(capability_id) {
                Some(info) => info.non_interruptible = active,
                None => tracing::debug!(capability_id, "window change for an unknown capability"),
            }
            HashSet::from([capability_id.to_string()])
        })
        .await
    }

    /// Put capabilities into maintenance (`reason: Some`) or take them out
    /// (`None`); docs/policy.md "Maintenance". Entering: nothing is granted
    /// on them meanwhile, and every holder gets a preemption-style notice
    /// (`lease_preempt_requested`, `preempt_reason: "maintenance"`) and the
    /// grace period, then is revoked as a preempted holder is. Leaving:
    /// the registry's own unhealthy verdict is cleared (the admin repaired
    /// it; [`set_check_unhealthy`](Self::set_check_unhealthy)) and waiting
    /// requests may be granted on them. Unknown ids are skipped.
    /// Returns the leases that were told, as committed.
    ///
    /// Errors: `Unavailable` (nothing was changed).
    pub async fn set_maintenance(
        &self,
        capability_ids: &[String],
        reason: Option<&str>,
    ) -> Result<Vec<CapabilityLease>, LeaseError> {
        let (told, rx) = {
            let mut st = lock(&self.state);
            Self::ready(&st)?;
            let now = self.now();
            let mut tx = Tx::default();
            let mut told = Vec::new();
            let mut dirty = HashSet::new();
            for id in capability_ids {
                let Some(info) = st.dir.get_mut(id) else {
                    continue;
                };
                let was_in_maintenance = info.maintenance.is_some();
                info.maintenance = reason.map(str::to_string);
                dirty.insert(id.clone());
                // Out of maintenance means repaired: the registry's own
                // verdict (a failed check or safe-state run) goes with it.
                if reason.is_none() && was_in_maintenance {
                    if let Some(why) = info.check_failed.take() {
                        tracing::info!(capability_id = %id, verdict = %why, "maintenance ended: the registry's unhealthy verdict is cleared");
                    }
                }
                let Some(r) = reason else { continue };
                let holders = st.holders.get(id).cloned().unwrap_or_default();
                // A safe-state run finishes first: it is what makes the
                // capability safe to work on.
                let holders = holders
                    .into_iter()
                    .filter(|h| st.leases.get(h).is_none_or(|e| !is_safe_state(&e.lease)));
                for h in holders.collect::<Vec<_>>() {
                    st.settle(&mut tx, &now, &self.cfg, &h);
                    let before = st.leases.get(&h).map(|e| e.lease.status);
                    st.start_withdrawal(&mut tx, &now, &self.cfg, &h, r);
                    if st.leases.get(&h).map(|e| e.lease.status) != before {
                        told.push(h);
                    }
                }
            }
            st.sweep(&mut tx, &now, &self.cfg, dirty);
            let told: Vec<CapabilityLease> = told.iter().filter_map(|id| st.snapshot(id)).collect();
            (told, Self::submit(&mut st, tx)?)
        };
        committed(rx).await?;
        Ok(told)
    }

    /// A capability's reported health changed: `unhealthy` ones are not
    /// granted (docs/policy.md "Health gating"); when it is healthy again
    /// the queue may move. Existing leases are left as they are.
    pub async fn set_unhealthy(&self, capability_id: &str, unhealthy: bool) {
        self.directory_change("set_unhealthy", |st| {
            if let Some(info) = st.dir.get_mut(capability_id) {
                info.unhealthy = unhealthy;
            }
            HashSet::from([capability_id.to_string()])
        })
        .await
    }

    /// The registry's own health verdict on `capability_id`, from a health
    /// check or a safe-state run (docs/policy.md "Health checks", "Safe
    /// state on release"): `unhealthy: true` (with `reason`, shown in
    /// `GET /capabilities/{id}`; `None` is kept as an empty reason) keeps
    /// it from being granted, as a provider-reported `unhealthy` does,
    /// except to the health check's own system lease
    /// ([`is_health_check`]); `false` clears it and lets the queue move.
    /// Requests by id wait meanwhile (or get 503 `capability_unhealthy`
    /// with `queue_timeout_seconds: 0`); selector requests skip it;
    /// existing leases are left as they are. Heartbeats and
    /// re-registrations never change it. Writes no event: the caller
    /// records why. Returns whether the verdict changed; unknown ids are
    /// ignored (`false`).
    pub async fn set_check_unhealthy(
        &self,
        capability_id: &str,
        unhealthy: bool,
        reason: Option<String>,
    ) -> bool {
        let mut changed = false;
        self.directory_change("set_check_unhealthy", |st| {
            if let Some(info) = st.dir.get_mut(capability_id) {
                changed = info.check_failed.is_some() != unhealthy;
                info.check_failed = unhealthy.then(|| reason.clone().unwrap_or_default());
            }
            HashSet::from([capability_id.to_string()])
        })
        .await;
        if changed {
            tracing::warn!(
                capability_id,
                unhealthy,
                reason = reason.as_deref().unwrap_or(""),
                "registry health verdict changed"
            );
        }
        changed
    }

    /// The capabilities the registry holds out of service itself, with
    /// each one's reason (see [`set_check_unhealthy`](Self::set_check_unhealthy)).
    pub fn check_failures(&self) -> std::collections::HashMap<String, String> {
        let st = lock(&self.state);
        st.dir
            .values()
            .filter_map(|i| Some((i.capability_id.clone(), i.check_failed.clone()?)))
            .collect()
    }

    /// Safe-state runs that may start now: committed, holding leases of
    /// [`SAFE_STATE_PRINCIPAL`] whose capability's provider is online,
    /// each with its capability's `on_release` actions (empty when the
    /// capability no longer has any, or is unknown), oldest first.
    pub fn pending_safe_states(&self) -> Vec<(CapabilityLease, Vec<ReleaseAction>)> {
        let committed: Vec<CapabilityLease> = lock(&self.view)
            .leases
            .values()
            .filter(|l| is_safe_state(l) && l.status.holds_capability())
            .cloned()
            .collect();
        let st = lock(&self.state);
        let mut runs: Vec<(CapabilityLease, Vec<ReleaseAction>)> = committed
            .into_iter()
            .filter(|l| st.leases.contains_key(&l.lease_id))
            .filter_map(|l| match st.dir.get(&l.capability_id) {
                Some(info) if !info.online => None,
                Some(info) => {
                    let actions = info.on_release.clone();
                    Some((l, actions))
                }
                None => Some((l, Vec::new())),
            })
            .collect();
        runs.sort_by(|a, b| a.0.lease_id.cmp(&b.0.lease_id));
        runs
    }

    /// End safe-state lease `lease_id` (`released`, actor
    /// [`SAFE_STATE_PRINCIPAL`], `reason`); its capability goes to the next
    /// waiter in the same commit.
    ///
    /// Errors: as [`release`](Self::release).
    pub async fn end_safe_state(
        &self,
        lease_id: &str,
        reason: &str,
    ) -> Result<CapabilityLease, LeaseError> {
        self.release(&safe_state::principal(), lease_id, Some(reason.to_string()))
            .await
    }

    /// Check that `capability_id` may be removed: no lease holds it and no
    /// waiting request names it by id.
    ///
    /// Errors: `CapabilityInUse` naming those leases.
    pub fn check_removable(&self, capability_id: &str) -> Result<(), LeaseError> {
        let st = lock(&self.state);
        let mut lease_ids: Vec<String> = st.holders.get(capability_id).cloned().unwrap_or_default();
        lease_ids.extend(
            st.leases
                .values()
                .filter(|e| {
                    e.lease.status == LeaseStatus::Requested
                        && e.book.want.fixed_capability() == Some(capability_id)
                })
                .map(|e| e.lease.lease_id.clone()),
        );
        if lease_ids.is_empty() {
            Ok(())
        } else {
            lease_ids.sort();
            Err(LeaseError::CapabilityInUse {
                capability_id: capability_id.to_string(),
                lease_ids,
            })
        }
    }

    /// Forget a removed capability: selector requests no longer consider
    /// it. Call after [`check_removable`](Self::check_removable) passed and
    /// the store removed it.
    pub async fn remove_capability(&self, capability_id: &str) {
        self.directory_change("remove_capability", |st| {
            st.dir.remove(capability_id);
            st.refresh_candidates();
            HashSet::new()
        })
        .await
    }

    /// Run one sweep now (expiries, grace ends, queue timeouts, grants) and
    /// wait for its commit. The sweeper task does this every
    /// `sweep_interval_ms`; tests with a [`ManualClock`] call it after
    /// advancing the clock.
    pub async fn sweep_now(&self) {
        self.directory_change("sweep", |_| HashSet::new()).await
    }

    /// Reload the model from the table (after a failed commit), keep the
    /// directory, and accept operations again.
    async fn reload(&self) -> Result<(), LeaseError> {
        let (rows, next_seq, next_generation, counts) =
            self.db.read(|c| sql::load_live(c)).await??;
        lock(&self.view).load(&rows, &counts);
        let mut st = lock(&self.state);
        let now = self.now();
        st.load(rows, next_seq, next_generation, &now);
        st.refresh_candidates();
        st.available = true;
        let mut tx = Tx::default();
        let all = st.all_capabilities();
        st.sweep(&mut tx, &now, &self.cfg, all);
        // Nobody waits for this one; its result shows in the model.
        let _ = Self::submit(&mut st, tx);
        tracing::warn!("lease model reloaded from the store after a failed commit");
        Ok(())
    }

    /// Stop the sweeper, let the committer write everything queued, and
    /// wait for both. Operations after this answer `Unavailable`.
    pub async fn shutdown(&self) {
        let _ = self.stop.send(true);
        lock(&self.state).sender = None;
        let tasks = std::mem::take(&mut *lock(&self.tasks));
        for t in tasks {
            if let Err(e) = t.await {
                tracing::error!(error = %e, "lease engine task ended badly");
            }
        }
    }
}

fn check_holder(
    holder: &Principal,
    lease: &CapabilityLease,
    admin_may: bool,
) -> Result<(), LeaseError> {
    if lease.principal == holder.name || (admin_may && holder.is_admin()) {
        Ok(())
    } else {
        Err(LeaseError::NotHolder {
            lease_id: lease.lease_id.clone(),
            principal: holder.name.clone(),
            holder: lease.principal.clone(),
        })
    }
}

/// The one lease of a single request.
fn resolve_single(
    st: &State,
    req: &LeaseRequest,
    principal: &str,
) -> Result<NewMember, LeaseError> {
    if let Some(id) = &req.capability_id {
        let info = st
            .dir
            .get(id)
            .ok_or_else(|| LeaseError::UnknownCapability {
                capability_id: id.clone(),
            })?;
        let mode = match req.mode {
            Some(m) if m != info.lease_mode => {
                return Err(LeaseError::invalid(
                    "mode",
                    format!(
                        "capability `{id}` is leased `{}`; `{m}` is not offered",
                        info.lease_mode
                    ),
                ))
            }
            Some(m) => m,
            None => info.lease_mode,
        };
        check_in_service(
            info,
            req.queue_timeout_seconds,
            is_health_check(req.holder_type, principal),
        )?;
        return Ok(NewMember {
            want: Want::Capability {
                capability_id: id.clone(),
                mode,
            },
            candidates: vec![id.clone()],
            capability_id: id.clone(),
            mode,
        });
    }
    let Some(selector) = &req.capability_selector else {
        return Err(LeaseError::invalid(
            "capability_id",
            "one of capability_id or capability_selector is required",
        ));
    };
    let want = Want::Selector {
        selector: selector.clone(),
        mode: req.mode,
    };
    let candidates = want.candidates(&st.dir);
    let member = matched(
        "capability_selector",
        &serde_json::json!(selector),
        st,
        want,
        candidates,
    )?;
    Ok(member)
}

/// A request naming `info` by id: refused when it is in maintenance (409
/// `capability_in_maintenance`, whether its provider is online or not:
/// an admin's decision outlasts an outage) or its provider is offline
/// (503 `capability_offline`); when it is `unhealthy` or held out by the
/// registry's own verdict (unless `health_check`: the check's own lease),
/// it waits unless the request asked not to (`queue_timeout_seconds: 0`,
/// 503 `capability_unhealthy`).
fn check_in_service(
    info: &CapabilityInfo,
    queue_timeout: Option<u32>,
    health_check: bool,
) -> Result<(), LeaseError> {
    if let Some(reason) = &info.maintenance {
        return Err(LeaseError::CapabilityInMaintenance {
            capability_id: info.capability_id.clone(),
            reason: reason.clone(),
        });
    }
    if !info.online {
        return Err(LeaseError::CapabilityOffline {
            capability_ids: vec![info.capability_id.clone()],
        });
    }
    let check_failed = info.check_failed.is_some() && !health_check;
    if (info.unhealthy || check_failed) && queue_timeout == Some(0) {
        return Err(LeaseError::CapabilityUnhealthy {
            capability_ids: vec![info.capability_id.clone()],
        });
    }
    Ok(())
}

/// A member for a selector or requirement, refused when nothing matches
/// or everything matching is offline.
fn matched(
    field: &str,
    selector: &serde_json::Value,
    st: &State,
    want: Want,
    candidates: Vec<String>,
) -> Result<NewMember, LeaseError> {
    if candidates.is_empty() {
        return Err(LeaseError::NoMatchingCapability {
            field: field.to_string(),
            selector: selector.to_string(),
        });
    }
    if !candidates
        .iter()
        .any(|c| st.dir.get(c).is_some_and(|i| i.online))
    {
        return Err(LeaseError::CapabilityOffline {
            capability_ids: candidates,
        });
    }
    let mode = want
        .mode()
        .or_else(|| st.dir.get(&candidates[0]).map(|i| i.lease_mode))
        .unwrap_or(LeaseMode::Exclusive);
    Ok(NewMember {
        want,
        candidates,
        capability_id: String::new(),
        mode,
    })
}

/// The leases of a group request, capability ids first, then requirements.
fn resolve_group(st: &State, req: &LeaseGroupRequest) -> Result<Vec<NewMember>, LeaseError> {
    let mut members = Vec::new();
    let mut seen = HashSet::new();
    for (i, id) in req.capability_ids.iter().enumerate() {
        if !seen.insert(id.as_str()) {
            return Err(LeaseError::invalid(
                format!("capability_ids[{i}]"),
                format!("`{id}` appears twice"),
            ));
        }
        let info = st
            .dir
            .get(id)
            .ok_or_else(|| LeaseError::UnknownCapability {
                capability_id: id.clone(),
            })?;
        check_in_service(info, req.queue_timeout_seconds, false)?;
        members.push(NewMember {
            want: Want::Capability {
                capability_id: id.clone(),
                mode: info.lease_mode,
            },
            candidates: vec![id.clone()],
            capability_id: id.clone(),
            mode: info.lease_mode,
        });
    }
    for (i, r) in req.requirements.iter().enumerate() {
        let field = format!("requirements[{i}]");
        if let Some(min) = r.min_duration_seconds {
            if min > req.requested_duration_seconds {
                return Err(LeaseError::out_of_range(
                    format!("{field}.min_duration_seconds"),
                    min,
                    1,
                    req.requested_duration_seconds,
                    Some(MIN_DURATION_WHY),
                ));
            }
        }
        let want = Want::Requirement {
            requirement: r.clone(),
        };
        let candidates = want.candidates(&st.dir);
        members.push(matched(
            &field,
            &serde_json::json!(r),
            st,
            want,
            candidates,
        )?);
    }
    Ok(members)
}

/// The sweeper task: one sweep per interval until the engine is dropped or
/// shut down.
async fn sweeper(
    engine: std::sync::Weak<LeaseEngine>,
    mut stop: watch::Receiver<bool>,
    interval: Duration,
) {
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = stop.changed() => {
                if changed.is_err() || *stop.borrow() {
                    break;
                }
            }
        }
        let Some(engine) = engine.upgrade() else {
            break;
        };
        engine.sweep_now().await;
    }
}
