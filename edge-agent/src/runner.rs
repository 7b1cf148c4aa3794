//! Runners: one OS thread per capability, owning its `Box<dyn Driver>`.
//!
//! Commands reach a runner over a bounded channel and run one at a time.
//! The [`Runners`] handle (shared by the dispatcher, the deadline
//! supervisor and the heartbeat) keeps a board of every accepted session:
//! queued, running (with its non-interruptible flag, docs/actions.md) or
//! abandoned. Every session ends with exactly one final `session_update`
//! (completed / failed / cancelled) carrying the artifacts the action wrote
//! to the outbox. An action still running [`RUNNING_REPORT_AFTER`] after it
//! started also sends a `running` update first (from the supervisor's
//! [`Runners::check_deadlines`]); a quick one sends only its final update,
//! which halves the messages and outbox writes of the common case. (Should
//! an action end in the instant its `running` update is being queued, that
//! update may follow the final one; the registry ignores a `running`
//! update for a session that has ended.)
//!
//! - Bad commands (unknown capability, an action the device lacks, a
//!   param outside the capability's `[capabilities.constraints]`) are
//!   refused before anything runs; parameters are checked by the driver
//!   before it touches the device.
//! - Cancellation (`action_cancel`, `lease_revoked`, shutdown): a queued
//!   session is cancelled at once; a running interruptible action gets its
//!   [`CancelToken`] set; a non-interruptible one finishes first.
//! - Fencing (docs/architecture.md "Fencing"): a session whose command's
//!   `not_after` passes while it waits in the queue is refused
//!   (`refused: not_after_passed`) and never runs; the check is made again
//!   when its turn comes.
//! - Deadlines: a session still queued at its deadline fails without
//!   running; a running interruptible one is cancelled at its deadline; a
//!   driver that has not returned [`ABANDON_GRACE`] after it is reported
//!   failed and its capability unhealthy (its late result is still kept in
//!   the outbox, never reported twice).

use std::collections::{BTreeMap, HashMap};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{self, RecvTimeoutError, SyncSender, TrySendError};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde_json::{Map, Value};
use shared_protocol::capability::{
    CapabilityAction, CapabilityRegistration, CapabilityType, HealthStatus,
};
use shared_protocol::constraints::Constraints;
use shared_protocol::mqtt::{ActionCommand, FenceRefusal, MessageType, SessionUpdate};
use shared_protocol::provider::{CapabilityHealthReport, RunningSession};
use shared_protocol::session::SessionStatus;
use shared_protocol::Timestamp;
use tokio::sync::Notify;

use crate::clock::RegistryClock;
use crate::config::CapabilityConfig;
use crate::drivers::{
    ActionOutcome, ActionRequest, CancelToken, Driver, DriverError, DriverHealth,
};
use crate::outbox::{Outbox, OutboxError, SyncAnswer, UpdateKind};
use crate::update_size::{bound_envelope, MAX_ERROR_MESSAGE_CHARS, MAX_SESSION_UPDATE_BYTES};

/// Deadline when a command gives `timeout_ms = 0`, milliseconds.
pub const DEFAULT_TIMEOUT_MS: u32 = 30_000;
/// Longest deadline accepted, milliseconds (longer ones are clamped).
pub const MAX_TIMEOUT_MS: u32 = 600_000;
/// How long after its deadline a driver that has not returned is given up.
pub const ABANDON_GRACE: Duration = Duration::from_secs(5);
/// Actions that may wait behind the running one, per capability.
pub const QUEUE_DEPTH: usize = 64;
/// How long an action runs before a `running` update reports it.
pub const RUNNING_REPORT_AFTER: Duration = Duration::from_millis(100);
/// How often an idle runner refreshes its driver's health.
pub const HEALTH_PERIOD: Duration = Duration::from_secs(5);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Writes session updates to the outbox queue and wakes the link.
#[derive(Clone)]
pub struct UpdateSink {
    outbox: Outbox,
    updates_ready: Arc<Notify>,
    artifacts_ready: Arc<Notify>,
}

impl UpdateSink {
    /// `updates_ready` wakes the link's publisher, `artifacts_ready` the
    /// uploader.
    pub fn new(outbox: Outbox, updates_ready: Arc<Notify>, artifacts_ready: Arc<Notify>) -> Self {
        Self {
            outbox,
            updates_ready,
            artifacts_ready,
        }
    }

    /// Queue `update` for publishing (blocking: SQLite). The update is in
    /// the database when this returns, so a restart does not lose it.
    ///
    /// What is queued is bounded by [`crate::update_size`]: `error_message`
    /// at most [`MAX_ERROR_MESSAGE_CHARS`] characters, the envelope at most
    /// [`MAX_SESSION_UPDATE_BYTES`] (an oversized `result_summary` is
    /// replaced by its size); the status and artifact metadata are kept.
    pub fn emit(&self, update: &SessionUpdate) -> Result<(), OutboxError> {
        let mut env = crate::link::envelope(MessageType::SessionUpdate, update);
        let long_error = update
            .error_message
            .as_deref()
            .is_some_and(|m| m.len() > MAX_ERROR_MESSAGE_CHARS);
        let mut bytes = if long_error {
            Vec::new()
        } else {
            env.to_bytes()
        };
        let mut bounded = None;
        if long_error || bytes.len() > MAX_SESSION_UPDATE_BYTES {
            let mut u = update.clone();
            bytes = bound_envelope(&mut env, &mut u, MAX_SESSION_UPDATE_BYTES);
            if bytes.len() > MAX_SESSION_UPDATE_BYTES {
                tracing::error!(
                    session_id = %update.session_id,
                    size_bytes = bytes.len(),
                    artifacts = update.artifacts.len(),
                    "session update still larger than {MAX_SESSION_UPDATE_BYTES} bytes after shortening (artifact metadata); queued as it is"
                );
            }
            bounded = Some(u);
        }
        let update = bounded.as_ref().unwrap_or(update);
        // The files of these artifacts stay until the broker acknowledged
        // this update (the registry may drop bytes it cannot bind).
        let artifact_ids: Vec<&str> = update
            .artifacts
            .iter()
            .map(|a| a.artifact_id.as_str())
            .collect();
        let kind = if update.status.is_final() {
            UpdateKind::Final
        } else {
            UpdateKind::Progress
        };
        let result = self.outbox.queue_update_with_artifacts(
            &env.message_id,
            &update.session_id,
            &bytes,
            &artifact_ids,
            kind,
        );
        match &result {
            Ok(_) => {
                tracing::info!(
                    session_id = %update.session_id,
                    capability_id = %update.capability_id,
                    status = %update.status,
                    artifacts = update.artifacts.len(),
                    error = update.error_message.as_deref().unwrap_or(""),
                    "session update"
                );
                self.updates_ready.notify_one();
            }
            Err(e) => tracing::error!(
                session_id = %update.session_id,
                "session update could not be queued: {e}"
            ),
        }
        result.map(|_| ())
    }

    /// Emit and log (not return) a failure to queue.
    pub fn emit_logged(&self, update: &SessionUpdate) {
        let _ = self.emit(update);
    }

    /// Answer a `session_sync` entry from the outbox (blocking: SQLite):
    /// an acknowledged update of `session_id` is queued again and the link
    /// woken. See [`Outbox::resend_for_sync`].
    pub fn resend_for_sync(&self, session_id: &str) -> Result<SyncAnswer, OutboxError> {
        let answer = self.outbox.resend_for_sync(session_id)?;
        if answer == SyncAnswer::Requeued {
            self.updates_ready.notify_one();
        }
        Ok(answer)
    }

    fn artifacts_ingested(&self) {
        self.artifacts_ready.notify_one();
    }
}

/// A session update for `session_id` on `capability_id`, now.
pub fn session_update(
    session_id: &str,
    capability_id: &str,
    status: SessionStatus,
    error_message: Option<String>,
) -> SessionUpdate {
    SessionUpdate {
        session_id: session_id.to_string(),
        capability_id: capability_id.to_string(),
        status,
        result_summary: None,
        error_message,
        artifacts: Vec::new(),
        occurred_at: Utc::now(),
        started_at: None,
        refused: None,
    }
}

/// The `failed` update of a command the bench refused by its fence: the
/// action never ran.
pub fn refused_update(
    session_id: &str,
    capability_id: &str,
    why: FenceRefusal,
    detail: &str,
) -> SessionUpdate {
    let mut u = session_update(
        session_id,
        capability_id,
        SessionStatus::Failed,
        Some(format!("refused by the bench ({why}): {detail}")),
    );
    u.refused = Some(why);
    u
}

/// Why a command was refused before anything ran.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    #[error("unknown capability `{capability_id}` on this provider (it has: {known})")]
    UnknownCapability {
        capability_id: String,
        known: String,
    },
    #[error("action `{action}` is not supported by capability `{capability_id}` ({kind}); supported: {supported}")]
    UnsupportedAction {
        capability_id: String,
        kind: CapabilityType,
        action: CapabilityAction,
        supported: String,
    },
    /// A param outside the capability's `[capabilities.constraints]`:
    /// refused before the driver sees it.
    #[error("refused by the bench: {action} on capability `{capability_id}`: {violation}")]
    ConstraintViolated {
        capability_id: String,
        action: CapabilityAction,
        /// The [`shared_protocol::constraints::ConstraintViolation`]'s
        /// message.
        violation: String,
    },
    #[error("capability `{capability_id}` is busy: {depth} actions already wait in its queue")]
    QueueFull { capability_id: String, depth: usize },
    /// The session id is already queued or running (a repeated command):
    /// no update is sent, the first one stands.
    #[error("session `{0}` is already queued or running")]
    DuplicateSession(String),
    #[error("the provider is shutting down")]
    ShuttingDown,
}

/// What [`Runners::cancel_session`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum CancelOutcome {
    /// It was still queued: the returned `cancelled` update must be emitted.
    CancelledQueued(SessionUpdate),
    /// The running interruptible action was asked to stop.
    Signalled,
    /// The running action is non-interruptible: it finishes first.
    Deferred,
    /// Unknown or already finished.
    NotFound,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    Running,
    /// Reported failed by the supervisor; the driver has not returned yet.
    Abandoned,
}

struct SessionEntry {
    capability_id: String,
    lease_id: String,
    action: CapabilityAction,
    timeout_ms: u32,
    deadline: Instant,
    /// The command's `not_after` on this process's monotonic clock (less
    /// the registry clock's uncertainty): it must not start later.
    not_after: Instant,
    phase: Phase,
    started_at: Option<Timestamp>,
    /// When the driver was given the action (monotonic).
    started: Option<Instant>,
    /// The `running` update has been queued.
    running_reported: bool,
    non_interruptible: bool,
    cancel: CancelToken,
    cancel_reason: Option<String>,
    /// The cancel came from the deadline, not from a request.
    timed_out: bool,
    deferred_cancel: Option<String>,
}

#[derive(Default)]
struct Board {
    sessions: HashMap<String, SessionEntry>,
    health: BTreeMap<String, CapHealth>,
    shutting_down: bool,
}

struct CapHealth {
    health: DriverHealth,
    /// Set while a driver overran its deadline by more than the grace.
    stuck: Option<String>,
}

struct RunnerSlot {
    kind: CapabilityType,
    /// The capability's `[capabilities.constraints]`, checked again here
    /// for commands from a registry that does not check them.
    constraints: Constraints,
    supported: Vec<CapabilityAction>,
    tx: SyncSender<RunnerMsg>,
    join: Mutex<Option<JoinHandle<()>>>,
}

enum RunnerMsg {
    Execute(Job),
    Shutdown,
}

struct Job {
    session_id: String,
    capability_id: String,
    action: CapabilityAction,
    params: Map<String, Value>,
}

/// Every capability's runner, and the board of sessions.
pub struct Runners {
    slots: BTreeMap<String, RunnerSlot>,
    board: Arc<Mutex<Board>>,
    sink: UpdateSink,
}

impl Runners {
    /// Start one thread per capability. Each thread first asks its driver
    /// for its supported actions, metadata and health; the returned
    /// registrations carry them. `clock` stamps each final
    /// update's `started_at` in the registry's time; driver errors are
    /// counted in `metrics`.
    pub fn start(
        capabilities: Vec<(CapabilityConfig, Box<dyn Driver>)>,
        outbox: Outbox,
        sink: UpdateSink,
        clock: Arc<RegistryClock>,
        metrics: crate::metrics::EdgeMetrics,
    ) -> std::io::Result<(Runners, Vec<CapabilityRegistration>)> {
        let board = Arc::new(Mutex::new(Board::default()));
        let mut slots = BTreeMap::new();
        let mut registrations = Vec::new();
        for (cap, driver) in capabilities {
            let (tx, rx) = mpsc::sync_channel(QUEUE_DEPTH);
            let (info_tx, info_rx) = mpsc::channel();
            let ctx = RunnerCtx {
                capability_id: cap.id.clone(),
                capability_type: cap.capability_type,
                board: board.clone(),
                outbox: outbox.clone(),
                sink: sink.clone(),
                clock: clock.clone(),
                metrics: metrics.clone(),
            };
            let join = std::thread::Builder::new()
                .name(format!("cap-{}", cap.id))
                .stack_size(512 * 1024)
                .spawn(move || runner_main(ctx, driver, rx, info_tx))?;
            let (supported, mut metadata) = info_rx
                .recv_timeout(Duration::from_secs(30))
                .unwrap_or_else(|_| (cap.capability_type.supported_actions().to_vec(), Map::new()));
            if !cap.regions.is_empty() {
                // What the registry derives evidence from (docs/audit-trail.md).
                metadata.insert(
                    shared_protocol::regions::METADATA_KEY.into(),
                    Value::Object(cap.regions.clone()),
                );
            }
            if !cap.on_release.is_empty() {
                // For the registry's safe-state runs (docs/policy.md).
                metadata.insert(
                    "on_release".into(),
                    Value::Array(cap.on_release.iter().map(|a| a.to_json()).collect()),
                );
            }
            registrations.push(CapabilityRegistration {
                capability_id: cap.id.clone(),
                capability_type: cap.capability_type,
                display_name: cap.display_name.clone(),
                lease_mode: cap.lease_mode,
                preemptible: cap.preemptible,
                supported_actions: supported.clone(),
                evidence_modes: cap.evidence_modes.clone(),
                metadata_json: Some(metadata),
                constraints_json: (!cap.constraints.is_empty()).then(|| cap.constraints.clone()),
                default_priority: cap.default_priority,
                safety_locked: cap.safety_locked,
                tags: cap.tags.clone(),
                location_label: cap.location_label.clone(),
                node_id: None,
            });
            slots.insert(
                cap.id.clone(),
                RunnerSlot {
                    kind: cap.capability_type,
                    constraints: Constraints::from_json(&cap.constraints),
                    supported,
                    tx,
                    join: Mutex::new(Some(join)),
                },
            );
        }
        Ok((Runners { slots, board, sink }, registrations))
    }

    /// The sink session updates go to.
    pub fn sink(&self) -> &UpdateSink {
        &self.sink
    }

    /// Accept `cmd` for its capability's runner (non-blocking); it must
    /// start before `not_after` (the command's fence on this process's
    /// monotonic clock) or is refused. On `Err`, nothing was queued; the
    /// caller reports the rejection (except [`Rejection::DuplicateSession`]).
    pub fn submit(&self, cmd: ActionCommand, not_after: Instant) -> Result<(), Rejection> {
        let Some(slot) = self.slots.get(&cmd.capability_id) else {
            return Err(Rejection::UnknownCapability {
                capability_id: cmd.capability_id.clone(),
                known: if self.slots.is_empty() {
                    "no capabilities".into()
                } else {
                    self.slots.keys().cloned().collect::<Vec<_>>().join(", ")
                },
            });
        };
        if !slot.supported.contains(&cmd.action) {
            return Err(Rejection::UnsupportedAction {
                capability_id: cmd.capability_id.clone(),
                kind: slot.kind,
                action: cmd.action,
                supported: slot
                    .supported
                    .iter()
                    .map(|a| a.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            });
        }
        if let Err(violation) = slot.constraints.check(cmd.action, &cmd.params) {
            return Err(Rejection::ConstraintViolated {
                capability_id: cmd.capability_id.clone(),
                action: cmd.action,
                violation: violation.to_string(),
            });
        }
        let timeout_ms = match cmd.timeout_ms {
            0 => DEFAULT_TIMEOUT_MS,
            t => t.min(MAX_TIMEOUT_MS),
        };
        {
            let mut board = lock(&self.board);
            if board.shutting_down {
                return Err(Rejection::ShuttingDown);
            }
            if board.sessions.contains_key(&cmd.session_id) {
                return Err(Rejection::DuplicateSession(cmd.session_id.clone()));
            }
            board.sessions.insert(
                cmd.session_id.clone(),
                SessionEntry {
                    capability_id: cmd.capability_id.clone(),
                    lease_id: cmd.lease_id.clone(),
                    action: cmd.action,
                    timeout_ms,
                    deadline: Instant::now() + Duration::from_millis(u64::from(timeout_ms)),
                    not_after,
                    phase: Phase::Queued,
                    started_at: None,
                    started: None,
                    running_reported: false,
                    non_interruptible: false,
                    cancel: CancelToken::new(),
                    cancel_reason: None,
                    timed_out: false,
                    deferred_cancel: None,
                },
            );
        }
        let job = Job {
            session_id: cmd.session_id.clone(),
            capability_id: cmd.capability_id.clone(),
            action: cmd.action,
            params: cmd.params,
        };
        match slot.tx.try_send(RunnerMsg::Execute(job)) {
            Ok(()) => Ok(()),
            Err(e) => {
                lock(&self.board).sessions.remove(&cmd.session_id);
                match e {
                    TrySendError::Full(_) => Err(Rejection::QueueFull {
                        capability_id: cmd.capability_id,
                        depth: QUEUE_DEPTH,
                    }),
                    TrySendError::Disconnected(_) => Err(Rejection::ShuttingDown),
                }
            }
        }
    }

    /// Cancel one session (`action_cancel`).
    pub fn cancel_session(&self, session_id: &str, reason: &str) -> CancelOutcome {
        let mut board = lock(&self.board);
        cancel_locked(&mut board, session_id, reason)
    }

    /// Cancel every session of `lease_id` on `capability_id`
    /// (`lease_revoked`). Returns the `cancelled` updates of sessions that
    /// were still queued (to emit) and how many running ones were signalled
    /// or deferred.
    pub fn revoke_lease(
        &self,
        lease_id: &str,
        capability_id: &str,
        reason: &str,
    ) -> (Vec<SessionUpdate>, usize) {
        let mut board = lock(&self.board);
        let ids: Vec<String> = board
            .sessions
            .iter()
            .filter(|(_, s)| s.lease_id == lease_id && s.capability_id == capability_id)
            .map(|(id, _)| id.clone())
            .collect();
        let mut updates = Vec::new();
        let mut running = 0;
        for id in ids {
            match cancel_locked(&mut board, &id, reason) {
                CancelOutcome::CancelledQueued(u) => updates.push(u),
                CancelOutcome::Signalled | CancelOutcome::Deferred => running += 1,
                CancelOutcome::NotFound => {}
            }
        }
        (updates, running)
    }

    /// Enforce deadlines and report long actions (call every few tens of
    /// milliseconds). Returns the updates to emit, in order: `running` for
    /// actions running for [`RUNNING_REPORT_AFTER`] or longer and not yet
    /// reported, then the final ones of sessions that timed out in the
    /// queue or whose driver was given up.
    pub fn check_deadlines(&self) -> Vec<SessionUpdate> {
        let now = Instant::now();
        let mut board = lock(&self.board);
        let mut updates = Vec::new();
        let mut stuck = Vec::new();
        for (id, s) in board.sessions.iter_mut() {
            let long = s
                .started
                .is_some_and(|t| now.duration_since(t) >= RUNNING_REPORT_AFTER);
            if s.phase == Phase::Running && long && !s.running_reported {
                s.running_reported = true;
                updates.push(session_update(
                    id,
                    &s.capability_id,
                    SessionStatus::Running,
                    None,
                ));
            }
        }
        board.sessions.retain(|id, s| {
            if s.phase == Phase::Queued && now >= s.not_after {
                updates.push(refused_update(
                    id,
                    &s.capability_id,
                    FenceRefusal::NotAfterPassed,
                    &format!(
                        "its not_after passed while it waited in the queue of capability `{}`",
                        s.capability_id
                    ),
                ));
                return false;
            }
            if s.phase == Phase::Queued && now >= s.deadline {
                updates.push(session_update(
                    id,
                    &s.capability_id,
                    SessionStatus::Failed,
                    Some(format!(
                        "timed out after {} ms waiting in the queue of capability `{}` (it was busy)",
                        s.timeout_ms, s.capability_id
                    )),
                ));
                return false;
            }
            true
        });
        for (id, s) in board.sessions.iter_mut() {
            if s.phase != Phase::Running || now < s.deadline {
                continue;
            }
            if !s.non_interruptible && !s.cancel.is_cancelled() {
                s.timed_out = true;
                s.cancel.cancel();
            }
            if now >= s.deadline + ABANDON_GRACE {
                s.phase = Phase::Abandoned;
                let msg = format!(
                    "driver did not return within {} ms (+{} ms grace) from `{}`; capability `{}` marked unhealthy",
                    s.timeout_ms,
                    ABANDON_GRACE.as_millis(),
                    s.action,
                    s.capability_id
                );
                updates.push(session_update(
                    id,
                    &s.capability_id,
                    SessionStatus::Failed,
                    Some(msg.clone()),
                ));
                stuck.push((s.capability_id.clone(), msg));
            }
        }
        for (cap, msg) in stuck {
            if let Some(h) = board.health.get_mut(&cap) {
                h.stuck = Some(msg);
            }
        }
        updates
    }

    /// Health per capability for the heartbeat (docs/architecture.md, "Control plane (MQTT)").
    pub fn health_reports(&self) -> Vec<CapabilityHealthReport> {
        let board = lock(&self.board);
        self.slots
            .keys()
            .map(|id| match board.health.get(id) {
                Some(CapHealth {
                    stuck: Some(msg), ..
                }) => CapabilityHealthReport {
                    capability_id: id.clone(),
                    health_status: HealthStatus::Unhealthy,
                    message: Some(msg.clone()),
                    metrics: None,
                },
                Some(h) => CapabilityHealthReport {
                    capability_id: id.clone(),
                    health_status: h.health.status,
                    message: h.health.message.clone(),
                    metrics: None,
                },
                None => CapabilityHealthReport {
                    capability_id: id.clone(),
                    health_status: HealthStatus::Unknown,
                    message: None,
                    metrics: None,
                },
            })
            .collect()
    }

    /// True while `session_id` is queued or running here (its final
    /// update is still to come). False once it ended, including a session
    /// given up at its deadline whose driver has not returned yet (its
    /// `failed` update was emitted then).
    pub fn is_open(&self, session_id: &str) -> bool {
        lock(&self.board)
            .sessions
            .get(session_id)
            .is_some_and(|s| s.phase != Phase::Abandoned)
    }

    /// Sessions executing now, with their non-interruptible flags.
    pub fn running_sessions(&self) -> Vec<RunningSession> {
        let board = lock(&self.board);
        let mut out: Vec<RunningSession> = board
            .sessions
            .iter()
            .filter(|(_, s)| s.phase == Phase::Running)
            .filter_map(|(id, s)| {
                Some(RunningSession {
                    session_id: id.clone(),
                    lease_id: s.lease_id.clone(),
                    capability_id: s.capability_id.clone(),
                    action: s.action,
                    started_at: s.started_at?,
                    non_interruptible: s.non_interruptible,
                })
            })
            .collect();
        out.sort_by(|a, b| a.capability_id.cmp(&b.capability_id));
        out
    }

    /// Capabilities whose driver overran its deadline beyond the grace.
    pub fn stuck_capabilities(&self) -> Vec<(String, String)> {
        lock(&self.board)
            .health
            .iter()
            .filter_map(|(id, h)| h.stuck.clone().map(|m| (id.clone(), m)))
            .collect()
    }

    /// True while every runner thread is alive (none panicked out).
    pub fn all_alive(&self) -> bool {
        self.slots
            .values()
            .all(|s| lock(&s.join).as_ref().is_some_and(|j| !j.is_finished()))
    }

    /// Stop taking commands; cancel queued sessions (their `cancelled`
    /// updates are returned for emitting) and interruptible running
    /// actions. Non-interruptible actions finish.
    pub fn begin_shutdown(&self, reason: &str) -> Vec<SessionUpdate> {
        let mut board = lock(&self.board);
        board.shutting_down = true;
        let ids: Vec<String> = board.sessions.keys().cloned().collect();
        let mut updates = Vec::new();
        for id in ids {
            if let CancelOutcome::CancelledQueued(u) = cancel_locked(&mut board, &id, reason) {
                updates.push(u);
            }
        }
        drop(board);
        for slot in self.slots.values() {
            let _ = slot.tx.try_send(RunnerMsg::Shutdown);
        }
        updates
    }

    /// Wait (blocking) up to `timeout` for every runner thread to end.
    /// Returns the ids of capabilities whose thread is still busy.
    pub fn join(&self, timeout: Duration) -> Vec<String> {
        let until = Instant::now() + timeout;
        let mut left = Vec::new();
        for (id, slot) in self.slots.iter() {
            let Some(join) = lock(&slot.join).take() else {
                continue;
            };
            // The queue may have been full when `begin_shutdown` sent its
            // Shutdown; repeat it until it fits (extra ones are harmless).
            while !join.is_finished() && Instant::now() < until {
                let _ = slot.tx.try_send(RunnerMsg::Shutdown);
                std::thread::sleep(Duration::from_millis(20));
            }
            if join.is_finished() {
                let _ = join.join();
            } else {
                left.push(id.clone());
                *lock(&slot.join) = Some(join);
            }
        }
        left
    }
}

fn cancel_locked(board: &mut Board, session_id: &str, reason: &str) -> CancelOutcome {
    let Some(s) = board.sessions.get_mut(session_id) else {
        return CancelOutcome::NotFound;
    };
    match s.phase {
        Phase::Queued => {
            let cap = s.capability_id.clone();
            board.sessions.remove(session_id);
            CancelOutcome::CancelledQueued(session_update(
                session_id,
                &cap,
                SessionStatus::Cancelled,
                Some(format!("cancelled before it started: {reason}")),
            ))
        }
        Phase::Running if s.non_interruptible => {
            s.deferred_cancel = Some(reason.to_string());
            CancelOutcome::Deferred
        }
        Phase::Running => {
            s.cancel_reason = Some(reason.to_string());
            s.cancel.cancel();
            CancelOutcome::Signalled
        }
        Phase::Abandoned => CancelOutcome::NotFound,
    }
}

// ---------------------------------------------------------------------------
// The runner thread.

struct RunnerCtx {
    capability_id: String,
    capability_type: CapabilityType,
    board: Arc<Mutex<Board>>,
    outbox: Outbox,
    sink: UpdateSink,
    clock: Arc<RegistryClock>,
    metrics: crate::metrics::EdgeMetrics,
}

type RunnerInfo = (Vec<CapabilityAction>, Map<String, Value>);

fn runner_main(
    ctx: RunnerCtx,
    mut driver: Box<dyn Driver>,
    rx: mpsc::Receiver<RunnerMsg>,
    info: mpsc::Sender<RunnerInfo>,
) {
    let kind = driver.capability_type();
    let supported: Vec<CapabilityAction> = driver
        .supported_actions()
        .into_iter()
        .filter(|a| kind.supports(*a))
        .collect();
    let _ = info.send((supported, driver.metadata()));
    ctx.refresh_health(driver.as_mut());
    let mut last_health = Instant::now();
    loop {
        let wait = HEALTH_PERIOD.saturating_sub(last_health.elapsed());
        match rx.recv_timeout(wait) {
            Ok(RunnerMsg::Execute(job)) => ctx.run_job(driver.as_mut(), job),
            Ok(RunnerMsg::Shutdown) | Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
        if last_health.elapsed() >= HEALTH_PERIOD {
            ctx.refresh_health(driver.as_mut());
            last_health = Instant::now();
        }
    }
    // Sessions still queued behind the Shutdown were cancelled by
    // `begin_shutdown`; drop the driver here (closing its device).
    drop(driver);
    tracing::debug!(capability_id = %ctx.capability_id, "runner stopped");
}

impl RunnerCtx {
    fn refresh_health(&self, driver: &mut dyn Driver) {
        let health = match catch_unwind(AssertUnwindSafe(|| driver.health())) {
            Ok(h) => h,
            Err(_) => DriverHealth::unhealthy("driver panicked while reporting health"),
        };
        let mut board = lock(&self.board);
        let entry = board.health.entry(self.capability_id.clone());
        let first = matches!(entry, std::collections::btree_map::Entry::Vacant(_));
        let entry = entry.or_insert(CapHealth {
            health: health.clone(),
            stuck: None,
        });
        // The first reading is logged too when it is not healthy: a device
        // missing at start is what a technician looks for.
        if entry.health != health || (first && health.status != HealthStatus::Healthy) {
            let message = health.message.as_deref().unwrap_or("");
            if health.status == HealthStatus::Healthy {
                tracing::info!(capability_id = %self.capability_id, health = %health.status, "capability health changed");
            } else {
                tracing::warn!(capability_id = %self.capability_id, health = %health.status, message, "capability health changed");
            }
        }
        entry.health = health;
    }

    fn run_job(&self, driver: &mut dyn Driver, job: Job) {
        let non_interruptible = driver.is_non_interruptible(job.action, &job.params);
        // Queued → Running, unless it was cancelled or timed out meanwhile.
        let Some((cancel, deadline)) = self.start_running(&job, non_interruptible) else {
            return;
        };
        let req = ActionRequest {
            session_id: job.session_id.clone(),
            action: job.action,
            params: job.params,
            deadline,
            cancel,
        };
        let started = Instant::now();
        let result = execute_caught(driver, &req);
        let elapsed_ms = started.elapsed().as_millis() as u64;

        // Evidence first: whatever happens to the session, the bytes are
        // kept, also the part a cancelled capture had taken.
        let (result, cancelled_why) = match result {
            Err(DriverError::CancelledPartway { why, partial }) => (Ok(*partial), Some(why)),
            other => (other, None),
        };
        let (artifacts, ingest_error, summary, driver_error) =
            self.keep_evidence(&job.session_id, result, cancelled_why);
        if let Some(e) = &driver_error {
            self.metrics
                .driver_error(&self.capability_id, self.capability_type.as_str(), e);
        }

        let entry = {
            let mut board = lock(&self.board);
            if let Some(h) = board.health.get_mut(&self.capability_id) {
                h.stuck = None;
            }
            board.sessions.remove(&job.session_id)
        };
        let Some(entry) = entry else { return };
        if entry.phase == Phase::Abandoned {
            tracing::warn!(
                session_id = %job.session_id,
                capability_id = %self.capability_id,
                elapsed_ms,
                artifacts = artifacts.len(),
                "driver returned after its session was given up; its artifacts stay in the outbox"
            );
            return;
        }
        if let Some(reason) = &entry.deferred_cancel {
            tracing::info!(
                session_id = %job.session_id,
                "non-interruptible action finished before honouring a cancel ({reason})"
            );
        }
        let mut update = session_update(
            &job.session_id,
            &job.capability_id,
            SessionStatus::Completed,
            None,
        );
        update.artifacts = artifacts;
        update.started_at = entry.started.map(|t| self.clock.at(t));
        // Only an outcome has a summary: a completed action, or the part a
        // cancelled capture kept.
        update.result_summary = summary.map(Value::Object);
        set_outcome(&mut update, &entry, driver_error, ingest_error);
        self.sink.emit_logged(&update);
    }

    /// Queued → Running, unless the session was cancelled or timed out
    /// meanwhile (then `None`; one whose `not_after` passed is refused).
    fn start_running(&self, job: &Job, non_interruptible: bool) -> Option<(CancelToken, Instant)> {
        let mut board = lock(&self.board);
        let s = board.sessions.get_mut(&job.session_id)?;
        if s.phase != Phase::Queued {
            return None;
        }
        if Instant::now() >= s.not_after {
            board.sessions.remove(&job.session_id);
            drop(board);
            self.sink.emit_logged(&refused_update(
                &job.session_id,
                &job.capability_id,
                FenceRefusal::NotAfterPassed,
                "its not_after had passed when its turn came",
            ));
            return None;
        }
        let s = board.sessions.get_mut(&job.session_id)?;
        s.phase = Phase::Running;
        s.started_at = Some(Utc::now());
        s.started = Some(Instant::now());
        s.non_interruptible = non_interruptible;
        Some((s.cancel.clone(), s.deadline))
    }

    /// Keep the artifacts of `result` in the outbox; returns them with the
    /// ingest error, the summary and the driver's error, if any.
    fn keep_evidence(
        &self,
        session_id: &str,
        result: Result<ActionOutcome, DriverError>,
        cancelled_why: Option<String>,
    ) -> Evidence {
        match result {
            Ok(outcome) => {
                let (arts, err) = if outcome.artifacts.is_empty() {
                    (Vec::new(), None)
                } else {
                    match self.outbox.ingest_batch(session_id, outcome.artifacts) {
                        Ok(arts) => {
                            self.sink.artifacts_ingested();
                            (arts, None)
                        }
                        Err(e) => (Vec::new(), Some(e)),
                    }
                };
                let driver_error = cancelled_why.map(DriverError::Cancelled);
                if let (Some(e), Some(_)) = (&err, &driver_error) {
                    tracing::error!(session_id = %session_id, error = %e, "the part a cancelled capture had taken could not be kept");
                }
                (arts, err, Some(outcome.result_summary), driver_error)
            }
            Err(e) => (Vec::new(), None, None, Some(e)),
        }
    }
}

/// Run `req` on `driver`; a panic becomes a device error.
fn execute_caught(
    driver: &mut dyn Driver,
    req: &ActionRequest,
) -> Result<ActionOutcome, DriverError> {
    match catch_unwind(AssertUnwindSafe(|| driver.execute(req))) {
        Ok(r) => r,
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            Err(DriverError::Device(format!("driver panicked: {what}")))
        }
    }
}

/// What an action left: artifacts kept, the outbox's error, the summary,
/// the driver's error.
type Evidence = (
    Vec<shared_protocol::artifact::CapabilityArtifact>,
    Option<OutboxError>,
    Option<Map<String, Value>>,
    Option<DriverError>,
);

/// The final status and error of `update` from what went wrong, if
/// anything: the driver's error first, else the outbox's.
fn set_outcome(
    update: &mut SessionUpdate,
    entry: &SessionEntry,
    driver_error: Option<DriverError>,
    ingest_error: Option<OutboxError>,
) {
    match (driver_error, ingest_error) {
        (None, None) => {}
        (None, Some(e)) => {
            update.status = SessionStatus::Failed;
            update.error_message = Some(e.to_string());
        }
        (Some(DriverError::Cancelled(_)), _) if entry.timed_out => {
            update.status = SessionStatus::Failed;
            update.error_message = Some(format!(
                "timed out after {} ms (cancelled at its deadline)",
                entry.timeout_ms
            ));
        }
        (Some(DriverError::Timeout(_)), _) => {
            // The deadline the command gave, not what the driver
            // measured: one entered after a 1 ms deadline had passed
            // had 0 ms left.
            update.status = SessionStatus::Failed;
            update.error_message = Some(format!("timed out after {} ms", entry.timeout_ms));
        }
        (Some(DriverError::Cancelled(why)), _) => {
            update.status = SessionStatus::Cancelled;
            update.error_message = Some(match &entry.cancel_reason {
                Some(reason) => format!("cancelled: {reason}"),
                None => format!("cancelled: {why}"),
            });
        }
        (Some(e), _) => {
            update.status = SessionStatus::Failed;
            update.error_message = Some(e.to_string());
        }
    }
}
