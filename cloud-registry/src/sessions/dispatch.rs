//! Dispatch: running an action ([`Sessions::invoke`]) and waiting for its
//! session to end.
//!
//! # An action's path
//! `POST /api/v1/capability-leases/{lease_id}/actions` ([`Sessions::invoke`])
//! checks, in this order, that the caller holds the lease (the one lease
//! check, [`LeaseEngine::check_action`]), that the capability supports the
//! action and its params are within the capability's `constraints_json`
//! (422 `constraint_violated`), that its provider is online, that a
//! `shared_stream` lease runs only a capture, stream or read (409
//! `action_not_allowed_in_shared_lease`), that the registry's MQTT link is
//! up, that an actuator action fits the lab's budgets (`crate::budgets`:
//! 429 `action_budget_exceeded`), and finally commits the lease's use
//! ([`LeaseEngine::begin_action`]: refused when the lease is not in a
//! holding status) — only then is a
//! session stored (`running`, event `session_started`) and `action_invoke`
//! published on the provider's `commands` topic. A refusal leaves no
//! session behind.
//! The provider answers with `session_update`s on its `results` topic
//! ([`ProviderHooks::on_session_update`]); the final one ends the session
//! (`session_completed` / `session_failed`) and carries the metadata of
//! the artifacts it produced.
//!

use std::sync::atomic::Ordering;
use std::time::Duration;

use chrono::Utc;
use serde::Serialize;
use serde_json::{json, Map, Value};
use shared_protocol::capability::{CapabilityAction, LeaseMode};
use shared_protocol::constraints::Constraints;
use shared_protocol::lease::CapabilityLease;
use shared_protocol::mqtt::{ActionCommand, MessageType};
use shared_protocol::provider::OnlineStatus;
use shared_protocol::session::{ActionInvokeRequest, CapabilitySession, SessionStatus};
use tokio::sync::oneshot;

use super::error::SessionError;
use super::sql;

use super::deadlines::{self, Fence};
use super::Sessions;
use crate::auth::Principal;
use crate::mqtt::CommandSender;

/// Bytes an `action_invoke` publish adds to its encoded command: the
/// envelope's other fields, the topic and the MQTT header (a generous
/// bound, so a command that passes the check is never refused by the
/// client).
pub const COMMAND_OVERHEAD_BYTES: usize = 1024;

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

/// A session about to be sent: its row, when it was sent on the monotonic
/// clock, and how long the caller waits for its end (`wait_ms`).
struct Invoked {
    row: sql::SessionRow,
    sent: tokio::time::Instant,
    wait_ms: u32,
}

impl Sessions {
    /// A non-interruptible action was sent: open the capability's window
    /// in the lease engine at once, instead of at the provider's next
    /// heartbeat.
    pub(super) async fn window_opened(&self, capability_id: &str, session_id: &str) {
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
    /// `UnsupportedAction`, `ConstraintViolated` (422),
    /// `NotAllowedInSharedLease` (409), `CommandTooLarge` (413: the command
    /// would not fit the MQTT packet limit), `BudgetExceeded` (429),
    /// `ProviderOffline`,
    /// `ControlPlaneDown` (503), `Store`. No session exists after an error.
    pub async fn invoke(
        &self,
        who: &Principal,
        lease_id: &str,
        req: ActionInvokeRequest,
    ) -> Result<CapabilitySession, SessionError> {
        let lease = self.leases.check_action(who, lease_id).await?;
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
        let provider_id = self
            .check_target(&capability_id, req.action, &req.params)
            .await?;
        if lease.mode == LeaseMode::SharedStream && !req.action.allowed_in_shared_stream() {
            return Err(SessionError::NotAllowedInSharedLease {
                lease_id: lease_id.to_string(),
                capability_id,
                action: req.action,
                mode: lease.mode,
                allowed: req
                    .action
                    .capability_type()
                    .supported_actions()
                    .iter()
                    .filter(|a| a.allowed_in_shared_stream())
                    .map(|a| a.as_str().to_string())
                    .collect(),
            });
        }
        let commands = self
            .commands
            .get()
            .filter(|c| c.connected())
            .ok_or(SessionError::ControlPlaneDown)?
            .clone();
        // Counted before the lease's use is committed, given back when a
        // later check refuses: a refused action spends no budget. The
        // safe-state holder's actions are not counted (crate::safe_state).
        let spent = match self.budgets.get() {
            Some(b) if !crate::leases::is_safe_state(&lease) => b.spend(
                req.action.capability_type(),
                req.action,
                lease_id,
                &who.name,
            )?,
            _ => None,
        };
        let refund = |e: SessionError| {
            if let (Some(b), Some(s)) = (self.budgets.get(), spent) {
                b.refund(s);
            }
            e
        };
        let prepared = async {
            let authorized = self.leases.begin_action(lease_id, &capability_id).await?;
            let (command, invoked) =
                self.prepare(who, &authorized, capability_id, provider_id, req)?;
            let stored = invoked.row.clone();
            let started = self
                .db
                .write_grouped(move |c| sql::insert_session(c, &stored))
                .await??;
            Ok::<_, SessionError>((command, invoked, started))
        };
        let (command, invoked, started) = prepared.await.map_err(refund)?;
        let session_id = command.session_id.clone();
        self.track(&command, &invoked);
        // Wait before the command leaves, so the end cannot be missed.
        let ended = (invoked.wait_ms > 0).then(|| self.await_final(&session_id));
        self.publish([started]).await;
        // Before the command leaves: its end (which closes the window)
        // cannot come before the window is open.
        if command.action.non_interruptible_by_default() {
            self.window_opened(&command.capability_id, &session_id)
                .await;
        }
        self.send_invoke(&commands, &invoked, &command).await?;
        match ended {
            Some(rx) => {
                self.wait_on(
                    rx,
                    &session_id,
                    Duration::from_millis(u64::from(invoked.wait_ms)),
                )
                .await
            }
            None => Ok(invoked.row.session),
        }
    }

    /// The checks of an action's target: capability `capability_id` exists
    /// and supports `action`, `params` are within its `constraints_json`
    /// (`shared_protocol::constraints`; keys this version does not know are
    /// ignored), and its provider is in no twin conflict, has its
    /// credentials and is online. Returns the provider's id.
    ///
    /// Errors: `UnknownCapability`, `UnsupportedAction`,
    /// `ConstraintViolated`, `ProviderConflict`,
    /// `ProviderCredentialsRevoked`, `ProviderOffline`, `Store`.
    async fn check_target(
        &self,
        capability_id: &str,
        action: CapabilityAction,
        params: &Map<String, Value>,
    ) -> Result<String, SessionError> {
        let capability = self
            .providers
            .get_capability(capability_id)
            .await?
            .ok_or_else(|| SessionError::UnknownCapability {
                capability_id: capability_id.to_string(),
            })?;
        if !capability.supported_actions.contains(&action) {
            return Err(SessionError::UnsupportedAction {
                capability_id: capability_id.to_string(),
                action,
                supported: capability
                    .supported_actions
                    .iter()
                    .map(|a| a.as_str().to_string())
                    .collect(),
            });
        }
        Constraints::from_json(&capability.constraints_json)
            .check(action, params)
            .map_err(|violation| SessionError::ConstraintViolated {
                capability_id: capability_id.to_string(),
                action,
                violation,
            })?;
        let provider_id = capability.provider_id.clone();
        let capability_id = capability_id.to_string();
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
            .providers
            .get_provider(&provider_id)
            .await?
            .is_some_and(|p| p.online_status == OnlineStatus::Online);
        if !online {
            return Err(SessionError::ProviderOffline {
                provider_id,
                capability_id,
            });
        }
        Ok(provider_id)
    }

    /// The command and the session row of an action authorized under
    /// `lease` (with its fence, docs/architecture.md "Fencing").
    ///
    /// Errors: `CommandTooLarge`.
    fn prepare(
        &self,
        who: &Principal,
        lease: &CapabilityLease,
        capability_id: String,
        provider_id: String,
        req: ActionInvokeRequest,
    ) -> Result<(ActionCommand, Invoked), SessionError> {
        let now = sql::stored_time(Utc::now());
        let sent = tokio::time::Instant::now();
        let timeout_ms = req.timeout_ms.unwrap_or(self.cfg.default_timeout_ms);
        let not_after = command_not_after(lease, now, timeout_ms);
        let deadline = now
            + chrono::Duration::milliseconds(
                i64::from(timeout_ms) + self.cfg.result_grace_ms.min(i64::MAX as u64) as i64,
            );
        let session_id = crate::ids::time_ordered("sess_");
        let command = ActionCommand {
            session_id: session_id.clone(),
            lease_id: lease.lease_id.clone(),
            capability_id: capability_id.clone(),
            action: req.action,
            params: req.params,
            timeout_ms,
            lease_generation: lease.generation.unwrap_or(0),
            lease_mode: lease.mode,
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
        let row = sql::SessionRow {
            session: CapabilitySession {
                session_id,
                lease_id: lease.lease_id.clone(),
                capability_id,
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
            provider_id,
            principal: who.name.clone(),
            timeout_ms,
            deadline_at: deadline,
            ended_by: None,
            provider_status: None,
            revoke_reason: None,
        };
        Ok((
            command,
            Invoked {
                row,
                sent,
                wait_ms: req.wait_ms,
            },
        ))
    }

    /// Note a stored session's deadline on the monotonic clock (the one
    /// that counts; `deadline_at` is its wall rendering) and its fence.
    fn track(&self, command: &ActionCommand, invoked: &Invoked) {
        let grace = u64::from(command.timeout_ms).saturating_add(self.cfg.result_grace_ms);
        crate::leases::lock(&self.deadlines).insert(
            &command.session_id,
            invoked.sent,
            deadlines::after(invoked.sent, Duration::from_millis(grace)),
            Some(Fence {
                lease_id: command.lease_id.clone(),
                not_after: command.not_after,
            }),
        );
    }

    /// Publish `command`; when the MQTT link stopped meanwhile, end the
    /// stored session (`failed`) instead.
    ///
    /// Errors: `ControlPlaneDown` (the command was not sent), `Store`.
    async fn send_invoke(
        &self,
        commands: &CommandSender,
        invoked: &Invoked,
        command: &ActionCommand,
    ) -> Result<(), SessionError> {
        let provider_id = &invoked.row.provider_id;
        let session_id = &command.session_id;
        if commands
            .send(provider_id, MessageType::ActionInvoke, command)
            .is_some()
        {
            tracing::info!(%session_id, lease_id = %command.lease_id, capability_id = %command.capability_id, %provider_id, action = %command.action, "action sent to provider");
            return Ok(());
        }
        let id = session_id.clone();
        let ended = self
            .db
            .write(move |c| {
                sql::end_by_registry(
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
        Err(SessionError::ControlPlaneDown)
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
    pub(super) fn await_final(&self, session_id: &str) -> oneshot::Receiver<CapabilitySession> {
        let (tx, rx) = oneshot::channel();
        crate::leases::lock(&self.finals)
            .entry(session_id.to_string())
            .or_default()
            .push(tx);
        rx
    }

    /// Drop the registrations of session `session_id` whose callers gave up.
    pub(super) fn forget_waiter(&self, session_id: &str) {
        let mut finals = crate::leases::lock(&self.finals);
        if let Some(list) = finals.get_mut(session_id) {
            list.retain(|tx| !tx.is_closed());
            if list.is_empty() {
                finals.remove(session_id);
            }
        }
    }

    pub(super) async fn wait_on(
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
}
