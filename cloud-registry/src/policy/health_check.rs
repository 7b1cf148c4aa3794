//! Health checks (docs/policy.md "Health checks"): per capability type an
//! action the registry runs on each capability of that type under a
//! system lease, every `interval_seconds` and/or after
//! `after_failed_sessions` failed sessions in a row. A failed check holds
//! the capability out of service
//! ([`LeaseEngine::set_check_unhealthy`]) until a later check passes.
//! - [`HealthCheckConfig`]: one `[policy.health_checks.<type>]` table and
//!   its `check-config` problems;
//! - [`HealthChecks`]: the runner (one background task; each check runs
//!   in a task of its own, at most one per capability at a time).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::Utc;
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use shared_protocol::api::Role;
use shared_protocol::capability::{CapabilityAction, CapabilityType, HealthStatus};
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::lease::{HolderType, LeaseRequest, LeaseStatus};
use shared_protocol::session::{ActionInvokeRequest, SessionStatus, MAX_WAIT_MS};
use tokio::sync::{broadcast, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::auth::Principal;
use crate::db::Db;
use crate::events::{self, EventBus, NewEvent};
use crate::leases::{lock, LeaseEngine, HEALTH_CHECK_PRINCIPAL};
use crate::providers::ProviderStore;
use crate::sessions::Sessions;

/// `timeout_seconds` when a check gives none.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 30;

/// Longest `timeout_seconds`: the registry waits the timeout plus
/// [`END_GRACE`] for the session to end, at most an action's longest
/// wait (300 s).
pub const MAX_TIMEOUT_SECONDS: u32 = 290;

/// How often a capability that a check failed is checked again when its
/// type has no `interval_seconds` (only `after_failed_sessions`), seconds.
pub const RETRY_SECONDS: u64 = 60;

/// Priority of a check's lease: the highest, so it is next when the
/// current holder lets go; it never preempts.
pub const CHECK_PRIORITY: u8 = 100;

/// `purpose` of a check's lease.
pub const CHECK_PURPOSE: &str = "health check";

/// `project_id` of a check's lease.
pub const CHECK_PROJECT: &str = "system";

/// How long after the driver deadline the registry still waits for the
/// session's end before calling the check timed out.
const END_GRACE: Duration = Duration::from_secs(10);

/// How often the runner looks for checks that are due.
const TICK: Duration = Duration::from_millis(250);

/// One `[policy.health_checks.<capability_type>]` table.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheckConfig {
    /// The action to run; one of the type's actions (e.g. `measure_output` for
    /// `programmable_power_supply`, `expect_pattern` for `serial_port`).
    pub action: CapabilityAction,
    /// Its parameters, as in `POST …/actions` (default: none).
    #[serde(default)]
    pub params: Map<String, Value>,
    /// Check every capability of the type this often, seconds (at least
    /// 1). Absent: no periodic check.
    #[serde(default)]
    pub interval_seconds: Option<u32>,
    /// Check a capability after this many sessions in a row on it ended
    /// `failed` (at least 1; a `completed` session starts the count
    /// again). Absent: no such trigger.
    #[serde(default)]
    pub after_failed_sessions: Option<u32>,
    /// The driver deadline of the check's action, seconds
    /// (1..=[`MAX_TIMEOUT_SECONDS`], default [`DEFAULT_TIMEOUT_SECONDS`]).
    /// A session still running [`END_GRACE`] after it fails the check.
    #[serde(default = "default_timeout")]
    pub timeout_seconds: u32,
}

fn default_timeout() -> u32 {
    DEFAULT_TIMEOUT_SECONDS
}

impl HealthCheckConfig {
    /// Problems of the table for capability type `t`, as `(dotted key,
    /// message)`.
    pub fn problems(&self, t: CapabilityType) -> Vec<(String, String)> {
        let key = |field: &str| format!("policy.health_checks.{t}.{field}");
        let mut out = Vec::new();
        if !t.supported_actions().contains(&self.action) {
            let offered: Vec<&str> = t.supported_actions().iter().map(|a| a.as_str()).collect();
            out.push((
                key("action"),
                format!(
                    "`{}` is not an action of `{t}` (one of: {})",
                    self.action,
                    offered.join(", ")
                ),
            ));
        }
        if self.interval_seconds.is_none() && self.after_failed_sessions.is_none() {
            out.push((
                format!("policy.health_checks.{t}"),
                "needs interval_seconds or after_failed_sessions (or both)".to_string(),
            ));
        }
        if self.interval_seconds == Some(0) {
            out.push((key("interval_seconds"), "must be at least 1".to_string()));
        }
        if self.after_failed_sessions == Some(0) {
            out.push((
                key("after_failed_sessions"),
                "must be at least 1".to_string(),
            ));
        }
        if !(1..=MAX_TIMEOUT_SECONDS).contains(&self.timeout_seconds) {
            out.push((
                key("timeout_seconds"),
                format!(
                    "{} is out of range 1..={MAX_TIMEOUT_SECONDS}",
                    self.timeout_seconds
                ),
            ));
        }
        out
    }

    /// When to check a capability again after a check ended with
    /// `failed`: the interval, or [`RETRY_SECONDS`] while failed when
    /// there is none; `None`: only the session trigger.
    fn next_after(&self, failed: bool) -> Option<Duration> {
        match self.interval_seconds {
            Some(s) => Some(Duration::from_secs(u64::from(s))),
            None if failed => Some(Duration::from_secs(RETRY_SECONDS)),
            None => None,
        }
    }
}

/// Problems of every `[policy.health_checks.*]` table (see
/// [`HealthCheckConfig::problems`]).
pub fn problems(checks: &BTreeMap<CapabilityType, HealthCheckConfig>) -> Vec<(String, String)> {
    checks.iter().flat_map(|(t, c)| c.problems(*t)).collect()
}

/// What the runner remembers of one capability.
#[derive(Debug, Default)]
struct Track {
    /// When the next periodic (or retry) check is due.
    next_due: Option<Instant>,
    /// Sessions in a row that ended `failed` (not counting checks).
    failed_in_row: u32,
    /// The session trigger fired: check at the next tick.
    triggered: bool,
    /// A check is running.
    running: bool,
    /// The last check failed (the capability is held out).
    failed: bool,
}

/// How a check ended.
enum Verdict {
    /// The session completed.
    Passed,
    /// The session failed or timed out: why.
    Failed(String),
}

/// The health check runner. Create with [`HealthChecks::new`], start with
/// [`HealthChecks::spawn`].
pub struct HealthChecks {
    checks: BTreeMap<CapabilityType, HealthCheckConfig>,
    leases: Arc<LeaseEngine>,
    sessions: Arc<Sessions>,
    store: Arc<dyn ProviderStore>,
    db: Db,
    bus: EventBus,
    /// By capability id, for capabilities of a configured type.
    tracks: Mutex<HashMap<String, Track>>,
    /// The leases of running checks (their sessions do not count as the
    /// capability's own).
    own_leases: Mutex<HashSet<String>>,
}

/// The principal a check runs as.
fn checker() -> Principal {
    Principal {
        name: HEALTH_CHECK_PRINCIPAL.to_string(),
        role: Role::Admin,
    }
}

impl HealthChecks {
    /// A runner of `checks` (valid, see [`problems`]) through `leases`
    /// and `sessions`; reads capabilities from `store`, appends its
    /// events to `db` and publishes them on `bus`.
    pub fn new(
        checks: BTreeMap<CapabilityType, HealthCheckConfig>,
        leases: Arc<LeaseEngine>,
        sessions: Arc<Sessions>,
        store: Arc<dyn ProviderStore>,
        db: Db,
        bus: EventBus,
    ) -> Arc<Self> {
        Arc::new(Self {
            checks,
            leases,
            sessions,
            store,
            db,
            bus,
            tracks: Mutex::new(HashMap::new()),
            own_leases: Mutex::new(HashSet::new()),
        })
    }

    /// Start the runner: it watches session ends and starts due checks
    /// until `shutdown` turns true (a check in flight then gives its lease
    /// up, or leaves it to expire if its action was already sent). With no
    /// check configured the task ends at once.
    pub fn spawn(self: &Arc<Self>, mut shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        let me = self.clone();
        tokio::spawn(async move {
            if me.checks.is_empty() {
                return;
            }
            let mut events = me.bus.subscribe();
            let stop = shutdown.clone();
            let mut tick = tokio::time::interval(TICK);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                if *shutdown.borrow() {
                    break;
                }
                tokio::select! {
                    _ = shutdown.changed() => {}
                    _ = tick.tick() => me.start_due(&stop).await,
                    ev = events.recv() => match ev {
                        Ok(ev) => me.on_event(&ev),
                        Err(broadcast::error::RecvError::Lagged(n)) => {
                            tracing::warn!(missed = n, "health checks missed session events");
                        }
                        Err(broadcast::error::RecvError::Closed) => break,
                    },
                }
            }
        })
    }

    /// Count a session end toward its capability's
    /// `after_failed_sessions`.
    fn on_event(&self, ev: &CapabilityEvent) {
        let failed = match ev.event_type {
            EventType::SessionFailed => true,
            EventType::SessionCompleted => false,
            _ => return,
        };
        let Some(cap) = &ev.capability_id else { return };
        if ev
            .lease_id
            .as_ref()
            .is_some_and(|l| lock(&self.own_leases).contains(l))
        {
            return;
        }
        let Some(limit) = self.type_of(ev).and_then(|c| c.after_failed_sessions) else {
            return;
        };
        let mut tracks = lock(&self.tracks);
        let t = tracks.entry(cap.clone()).or_default();
        if !failed {
            t.failed_in_row = 0;
            return;
        }
        t.failed_in_row += 1;
        if t.failed_in_row >= limit {
            t.failed_in_row = 0;
            t.triggered = true;
            tracing::info!(capability_id = %cap, failed_sessions = limit, "failed sessions in a row: health check due");
        }
    }

    /// The check of the capability an event names (from the session's
    /// action, whose type is the capability's).
    fn type_of(&self, ev: &CapabilityEvent) -> Option<&HealthCheckConfig> {
        let action: CapabilityAction = ev
            .data
            .get("action")
            .and_then(|a| serde_json::from_value(a.clone()).ok())?;
        self.checks.get(&action.capability_type())
    }

    /// Start every check that is due on a capability that could run it
    /// (online, not in maintenance).
    async fn start_due(self: &Arc<Self>, shutdown: &watch::Receiver<bool>) {
        let now = Instant::now();
        for info in self.leases.directory().await {
            let Some(cfg) = self.checks.get(&info.capability_type) else {
                continue;
            };
            if !info.online || info.maintenance.is_some() {
                continue;
            }
            {
                let mut tracks = lock(&self.tracks);
                let t = tracks.entry(info.capability_id.clone()).or_default();
                if t.running {
                    continue;
                }
                if t.next_due.is_none() && !t.failed {
                    // First sight: the periodic check is due at once.
                    t.next_due = cfg.interval_seconds.map(|_| now);
                }
                let due = t.triggered || t.next_due.is_some_and(|d| d <= now);
                if !due {
                    continue;
                }
                t.triggered = false;
                t.running = true;
            }
            let me = self.clone();
            let cfg = cfg.clone();
            let mut stop = shutdown.clone();
            tokio::spawn(async move {
                let id = info.capability_id;
                let done = tokio::select! {
                    v = me.check_once(&id, &cfg) => v,
                    _ = async { let _ = stop.wait_for(|s| *s).await; } => None,
                };
                let failed = match done {
                    Some((verdict, lease_id, session_id)) => {
                        me.record(&id, verdict, &lease_id, &session_id).await
                    }
                    None => lock(&me.tracks).get(&id).is_some_and(|t| t.failed),
                };
                let mut tracks = lock(&me.tracks);
                let t = tracks.entry(id).or_default();
                t.running = false;
                t.next_due = cfg.next_after(failed).map(|d| Instant::now() + d);
            });
        }
    }

    /// Run one check of `capability_id`: request the system lease, wait
    /// for it (behind any current holder), run the action, release.
    /// Answers the verdict with the lease and session ids, or `None` when
    /// nothing was run (the capability went away, is offline, does not
    /// offer the action, the link is down...; logged).
    async fn check_once(
        &self,
        capability_id: &str,
        cfg: &HealthCheckConfig,
    ) -> Option<(Verdict, String, String)> {
        let offered = match self.store.get_capability(capability_id).await {
            Ok(Some(c)) => c.supported_actions.contains(&cfg.action),
            Ok(None) => return None,
            Err(e) => {
                tracing::warn!(capability_id, error = %e, "health check: capability not readable");
                return None;
            }
        };
        if !offered {
            tracing::warn!(capability_id, action = %cfg.action, "health check skipped: the capability does not offer its action");
            return None;
        }
        let who = checker();
        let duration = (cfg.timeout_seconds + END_GRACE.as_secs() as u32 + 30)
            .min(self.leases.config().max_duration_seconds);
        let req = LeaseRequest {
            capability_id: Some(capability_id.to_string()),
            capability_selector: None,
            holder_type: HolderType::System,
            holder_ref: HEALTH_CHECK_PRINCIPAL.to_string(),
            project_id: CHECK_PROJECT.to_string(),
            purpose: CHECK_PURPOSE.to_string(),
            priority: CHECK_PRIORITY,
            requested_duration_seconds: duration,
            evidence_required: false,
            preempt_if_needed: false,
            preempt_reason: None,
            mode: None,
            queue_timeout_seconds: None,
        };
        let lease = match self.leases.request(&who, req).await {
            Ok(l) => l,
            Err(e) => {
                tracing::info!(capability_id, error = %e, "health check not started");
                return None;
            }
        };
        let lease_id = lease.lease_id.clone();
        lock(&self.own_leases).insert(lease_id.clone());
        let verdict = self.run_on(&who, &lease_id, lease.status, cfg).await;
        if let Err(e) = self
            .leases
            .release(&who, &lease_id, Some("health check done".to_string()))
            .await
        {
            tracing::debug!(lease_id, error = %e, "health check lease not released");
        }
        lock(&self.own_leases).remove(&lease_id);
        verdict.map(|(v, s)| (v, lease_id, s))
    }

    /// Wait for the grant of `lease_id`, run the check's action under it.
    async fn run_on(
        &self,
        who: &Principal,
        lease_id: &str,
        status: LeaseStatus,
        cfg: &HealthCheckConfig,
    ) -> Option<(Verdict, String)> {
        let mut status = status;
        while status == LeaseStatus::Requested {
            status = match self
                .leases
                .wait_granted(lease_id, Duration::from_secs(3600))
                .await
            {
                Ok(l) => l.status,
                Err(_) => return None,
            };
        }
        if status != LeaseStatus::Granted {
            return None;
        }
        let timeout_ms = cfg.timeout_seconds * 1000;
        let wait_ms = (timeout_ms + END_GRACE.as_millis() as u32).min(MAX_WAIT_MS);
        let req = ActionInvokeRequest {
            action: cfg.action,
            params: cfg.params.clone(),
            wait_ms,
            capability_id: None,
            timeout_ms: Some(timeout_ms),
        };
        let session = match self.sessions.invoke(who, lease_id, req).await {
            Ok(s) => s,
            Err(e) => {
                tracing::info!(lease_id, error = %e, "health check action not sent");
                return None;
            }
        };
        let verdict = match session.status {
            SessionStatus::Completed => Verdict::Passed,
            SessionStatus::Running | SessionStatus::Pending => Verdict::Failed(format!(
                "health check {} did not end within {} s",
                cfg.action,
                wait_ms / 1000
            )),
            other => Verdict::Failed(format!(
                "health check {} {other}: {}",
                cfg.action,
                session
                    .error_message
                    .as_deref()
                    .unwrap_or("no error message")
            )),
        };
        Some((verdict, session.session_id))
    }

    /// Apply a verdict: hold the capability out or let it back, and on a
    /// change append `capability_health_changed`. Returns whether it is
    /// held out now.
    async fn record(
        &self,
        capability_id: &str,
        verdict: Verdict,
        lease_id: &str,
        session_id: &str,
    ) -> bool {
        let (failed, reason) = match verdict {
            Verdict::Passed => (false, None),
            Verdict::Failed(r) => (true, Some(r)),
        };
        let was = lock(&self.tracks)
            .get(capability_id)
            .is_some_and(|t| t.failed);
        self.leases
            .set_check_unhealthy(capability_id, failed, reason.clone())
            .await;
        if let Some(t) = lock(&self.tracks).get_mut(capability_id) {
            t.failed = failed;
        }
        tracing::info!(capability_id, failed, reason = ?reason, session_id, "health check ended");
        if was != failed {
            self.changed(capability_id, failed, reason, lease_id, session_id)
                .await;
        }
        failed
    }

    /// Append and publish the `capability_health_changed` of a check that
    /// took a capability out (`failed`) or brought it back.
    async fn changed(
        &self,
        capability_id: &str,
        failed: bool,
        reason: Option<String>,
        lease_id: &str,
        session_id: &str,
    ) {
        let cap = match self.store.get_capability(capability_id).await {
            Ok(Some(c)) => c,
            _ => return,
        };
        let (previous, now) = if failed {
            (cap.health_status, HealthStatus::Unhealthy)
        } else {
            (HealthStatus::Unhealthy, cap.health_status)
        };
        let ev = NewEvent::new(
            EventType::CapabilityHealthChanged,
            HEALTH_CHECK_PRINCIPAL,
            json!({
                "capability_id": capability_id,
                "provider_id": cap.provider_id,
                "previous_health_status": previous,
                "health_status": now,
                "previous_status": cap.status,
                "status": cap.status,
                "message": reason,
                "reason": if failed { "health_check_failed" } else { "health_check_passed" },
                "lease_id": lease_id,
                "session_id": session_id,
                "checked_at": Utc::now(),
            }),
        )
        .provider(cap.provider_id.clone())
        .capability(capability_id)
        .lease(lease_id)
        .session(session_id);
        match self.db.write(move |c| events::append(c, ev)).await {
            Ok(Ok(ev)) => self.bus.publish([ev]),
            Ok(Err(e)) => {
                tracing::warn!(capability_id, error = %e, "health check event not stored")
            }
            Err(e) => tracing::warn!(capability_id, error = %e, "health check event not stored"),
        }
    }
}
