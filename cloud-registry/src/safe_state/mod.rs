//! The safe-state runner (docs/policy.md "Safe state on release"): runs
//! the `on_release` actions of capabilities the lease engine handed to the
//! safe-state holder ([`crate::leases::SAFE_STATE_PRINCIPAL`]) when their
//! last lease ended, then releases that lease so the queue moves on.
//!
//! Each action goes through [`Sessions::invoke`] as that principal, so
//! fencing, sessions, events and artifacts apply as for any holder (the
//! action budgets do not: a safety action is never refused for being one
//! too many). A run whose provider is offline waits until it is back; a
//! failed or timed-out action marks the capability unhealthy
//! ([`LeaseEngine::set_check_unhealthy`]) with a `capability_health_changed`
//! event, and the lease ends anyway. Runs left over by a restart are found
//! again at start (their leases are persisted) and run from their first
//! action.

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;
use shared_protocol::event::EventType;
use shared_protocol::session::{ActionInvokeRequest, SessionStatus, MAX_WAIT_MS};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::events::{EventBus, NewEvent};
use crate::leases::{lock, LeaseEngine, ReleaseAction};
use crate::sessions::{SessionError, Sessions};

/// How often the runner looks for pending runs.
pub const POLL_INTERVAL: Duration = Duration::from_millis(250);

/// `reason` of the `lease_released` event of a safe-state lease whose
/// actions all completed.
pub const DONE_REASON: &str = "safe_state_done";

/// `reason` of the `lease_released` event of a safe-state lease whose
/// actions failed, and of the `capability_health_changed` event.
pub const FAILED_REASON: &str = "on_release_failed";

/// How one run ended.
enum Outcome {
    /// Every action completed.
    Done,
    /// An action failed: the message says which and why; the session, if
    /// one was started.
    Failed {
        message: String,
        session_id: Option<String>,
    },
    /// Nothing decided (the provider went offline, the registry is
    /// stopping): the lease stays, and the run starts again later.
    Later,
}

/// The runner's shared parts.
struct Runner {
    leases: Arc<LeaseEngine>,
    sessions: Arc<Sessions>,
    bus: EventBus,
    /// Safe-state leases with a run in progress.
    running: Mutex<HashSet<String>>,
    shutdown: watch::Receiver<bool>,
}

/// Start the runner; it stops when `shutdown` turns true.
pub fn spawn(
    leases: Arc<LeaseEngine>,
    sessions: Arc<Sessions>,
    bus: EventBus,
    shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let runner = Arc::new(Runner {
        leases,
        sessions,
        bus,
        running: Mutex::new(HashSet::new()),
        shutdown: shutdown.clone(),
    });
    tokio::spawn(poll(runner, shutdown))
}

async fn poll(runner: Arc<Runner>, mut shutdown: watch::Receiver<bool>) {
    let mut tick = tokio::time::interval(POLL_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            changed = shutdown.changed() => {
                if changed.is_err() || *shutdown.borrow() {
                    break;
                }
            }
        }
        for (lease, actions) in runner.leases.pending_safe_states() {
            if !lock(&runner.running).insert(lease.lease_id.clone()) {
                continue;
            }
            let r = runner.clone();
            tokio::spawn(async move {
                let id = lease.lease_id.clone();
                r.run(&id, &lease.capability_id, &actions).await;
                lock(&r.running).remove(&id);
            });
        }
    }
}

impl Runner {
    fn stopping(&self) -> bool {
        *self.shutdown.borrow()
    }

    /// Run `actions` under safe-state lease `lease_id` on `capability_id`
    /// and settle the outcome.
    async fn run(&self, lease_id: &str, capability_id: &str, actions: &[ReleaseAction]) {
        let outcome = self.act(lease_id, actions).await;
        let reason = match outcome {
            Outcome::Later => return,
            Outcome::Done => {
                if self
                    .leases
                    .set_check_unhealthy(capability_id, false, None)
                    .await
                {
                    self.health_event(capability_id, lease_id, "healthy", None, None)
                        .await;
                }
                DONE_REASON
            }
            Outcome::Failed {
                message,
                session_id,
            } => {
                tracing::warn!(lease_id, capability_id, %message, "on_release action failed; capability marked unhealthy");
                // Before the lease ends: no waiter is granted in between.
                self.leases
                    .set_check_unhealthy(capability_id, true, Some(message.clone()))
                    .await;
                self.health_event(
                    capability_id,
                    lease_id,
                    "unhealthy",
                    Some(&message),
                    session_id.as_deref(),
                )
                .await;
                FAILED_REASON
            }
        };
        match self.leases.end_safe_state(lease_id, reason).await {
            Ok(_) => tracing::info!(lease_id, capability_id, reason, "safe-state run ended"),
            Err(e) => {
                tracing::warn!(lease_id, capability_id, error = %e, "safe-state lease could not be released")
            }
        }
    }

    /// Each action in turn, stopping at the first failure.
    async fn act(&self, lease_id: &str, actions: &[ReleaseAction]) -> Outcome {
        let who = crate::leases::safe_state_principal();
        for a in actions {
            let req = ActionInvokeRequest {
                action: a.action,
                params: a.params.clone(),
                wait_ms: MAX_WAIT_MS,
                capability_id: None,
                timeout_ms: None,
            };
            match self.sessions.invoke(&who, lease_id, req).await {
                Ok(s) if s.status == SessionStatus::Completed => {}
                Ok(_) if self.stopping() => return Outcome::Later,
                Ok(s) => {
                    let why = match (s.status, &s.error_message) {
                        (SessionStatus::Running, _) => "still running after its wait".to_string(),
                        (status, Some(m)) => format!("{status}: {m}"),
                        (status, None) => status.to_string(),
                    };
                    return Outcome::Failed {
                        message: format!("on_release {}: {why}", a.action),
                        session_id: Some(s.session_id),
                    };
                }
                Err(SessionError::ProviderOffline { .. } | SessionError::ControlPlaneDown) => {
                    return Outcome::Later
                }
                Err(_) if self.stopping() => return Outcome::Later,
                Err(e) => {
                    return Outcome::Failed {
                        message: format!("on_release {}: {e}", a.action),
                        session_id: None,
                    }
                }
            }
        }
        Outcome::Done
    }

    /// `capability_health_changed` for the registry's own verdict.
    async fn health_event(
        &self,
        capability_id: &str,
        lease_id: &str,
        health_status: &str,
        message: Option<&str>,
        session_id: Option<&str>,
    ) {
        let provider_id = self
            .leases
            .directory()
            .await
            .into_iter()
            .find(|i| i.capability_id == capability_id)
            .map(|i| i.provider_id);
        let mut ev = NewEvent::new(
            EventType::CapabilityHealthChanged,
            crate::leases::SAFE_STATE_PRINCIPAL,
            json!({
                "capability_id": capability_id,
                "provider_id": provider_id,
                "health_status": health_status,
                "source": "safe_state",
                "reason": if health_status == "unhealthy" { FAILED_REASON } else { DONE_REASON },
                "message": message,
                "lease_id": lease_id,
                "session_id": session_id,
            }),
        )
        .capability(capability_id)
        .lease(lease_id);
        if let Some(p) = provider_id {
            ev = ev.provider(p);
        }
        if let Some(s) = session_id {
            ev = ev.session(s);
        }
        if let Err(e) = self.bus.emit(ev).await {
            tracing::error!(capability_id, error = %e, "cannot record the health verdict");
        }
    }
}
