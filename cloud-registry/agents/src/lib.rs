//! Agent runtime (seed 000): runs, steps, evidence and proposals; the tool
//! registry and policy; the OpenAI-compatible model and speech gateways; the
//! prompt registry; the Earth command.
//!
//! Wiring (the registry app does this):
//! ```ignore
//! let db = Db::open(path, |c| { agents::migrate(c)?; /* other modules */ Ok(()) })?;
//! let catalog = Arc::new(EntityCatalog::load_with_remote(&cfg.agents.earth_data()).await?);
//! let svc = Arc::new(AgentService::new(db, catalog, cfg.agents.clone()).await?);
//! let app = Router::new().nest("/api/v1/agents", agents::router(svc))
//!     .layer(Extension(authenticator));
//! ```
//!
//! Module map: [`store`] (tables), [`runtime`] (run loop, stop),
//! [`tools`] (registry), [`policy`] (rules), [`proposals`] (create/apply),
//! [`model`] (chat gateway), [`protocol`] (JSON tool-call parsing),
//! [`prompts`], [`speech`] (ASR gateway), [`websearch`], [`api`] (HTTP),
//! [`earth`] (entity service, resolver, validator, command).

pub mod api;
pub mod config;
pub mod earth;
pub mod model;
pub mod policy;
pub mod prompts;
pub mod proposals;
pub mod protocol;
pub mod runtime;
pub mod speech;
pub mod store;
pub mod tools;
pub mod websearch;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use serde_json::json;
use shared_protocol::agent::{AgentProposal, ProposalStatus, ProposalType, RunType};

pub use api::router;
pub use config::AgentsConfig;

use crate::auth::Principal;
use crate::db::{Db, DbError};
use crate::error::ApiError;
use earth::entities::EntityCatalog;
use model::ModelGateway;
use policy::{ApplyMode, ApplyRefusal};
use prompts::PromptRegistry;
use speech::{SpeechError, SpeechGateway};
use store::{Store, StoreError};
use tools::{ToolError, ToolMode, ToolRegistry};
use websearch::WebSearch;

/// Create the agent runtime's tables (`agent_runs`, `agent_steps`,
/// `agent_evidence`, `agent_proposals`, `agent_settings`,
/// `agent_transcriptions`) and indexes. Idempotent.
pub fn migrate(conn: &rusqlite::Connection) -> rusqlite::Result<()> {
    store::migrate(conn)
}

/// Errors of the agent service; each maps to one HTTP status and code.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Invalid `[agents]` configuration (at start).
    #[error("invalid agents configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("{kind} `{id}` not found")]
    NotFound { kind: &'static str, id: String },
    #[error("{0}")]
    Forbidden(String),
    #[error("invalid field `{field}`: {message}")]
    Invalid { field: String, message: String },
    /// 503 `model_not_configured`.
    #[error("{0} runs need a model; set agents.model.base_url and agents.model.model")]
    ModelNotConfigured(RunType),
    /// 409 `run_stopped`: the run was stopped while the request ran.
    #[error("run {0} was stopped")]
    RunStopped(String),
    /// 403 `confirmation_required` (or `forbidden`) from the proposal policy.
    #[error(transparent)]
    ApplyRefused(#[from] ApplyRefusal),
    /// 409 `proposal_not_pending`.
    #[error("proposal {id} is {status}; only pending or approved proposals can be applied")]
    ProposalNotPending { id: i64, status: ProposalStatus },
    /// 422 `proposal_rejected`: secret fields or schema errors.
    #[error("proposal {} rejected: {}", .0.id, .0.error.clone().unwrap_or_default())]
    ProposalRejected(Box<AgentProposal>),
    /// 409 `proposal_apply_failed`: the error is saved on the proposal.
    #[error("proposal {} failed: {}", .0.id, .0.error.clone().unwrap_or_default())]
    ProposalFailed(Box<AgentProposal>),
    #[error(transparent)]
    Speech(#[from] SpeechError),
    #[error("internal: {0}")]
    Internal(String),
}

impl From<DbError> for AgentError {
    fn from(e: DbError) -> Self {
        AgentError::Store(StoreError::Db(e))
    }
}

impl From<AgentError> for ApiError {
    fn from(e: AgentError) -> Self {
        let msg = e.to_string();
        match e {
            AgentError::NotFound { kind, id } => ApiError::not_found(kind, &id),
            AgentError::Store(StoreError::NotFound { kind, id }) => ApiError::not_found(kind, &id),
            AgentError::Store(StoreError::RunFinal { run_id, status }) => ApiError::conflict(
                "run_already_final",
                format!("run {run_id} is already {status}"),
            )
            .with_details(json!({"run_id": run_id, "status": status})),
            AgentError::Forbidden(m) => ApiError::forbidden(m),
            AgentError::Invalid { field, message } => ApiError::invalid_field(&field, message),
            AgentError::ModelNotConfigured(t) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "model_not_configured", msg)
                    .with_details(json!({"run_type": t}))
            }
            AgentError::RunStopped(id) => {
                ApiError::conflict("run_stopped", msg).with_details(json!({"run_id": id}))
            }
            AgentError::ApplyRefused(ApplyRefusal::Forbidden(_)) => ApiError::forbidden(msg),
            AgentError::ApplyRefused(ApplyRefusal::ConfirmationRequired(_)) => {
                ApiError::new(StatusCode::FORBIDDEN, "confirmation_required", msg)
            }
            AgentError::ProposalNotPending { id, status } => {
                ApiError::conflict("proposal_not_pending", msg)
                    .with_details(json!({"proposal_id": id, "status": status}))
            }
            AgentError::ProposalRejected(p) => {
                ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, "proposal_rejected", msg)
                    .with_details(json!({"proposal": p}))
            }
            AgentError::ProposalFailed(p) => ApiError::conflict("proposal_apply_failed", msg)
                .with_details(json!({"proposal": p})),
            AgentError::Speech(SpeechError::NotConfigured) => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "asr_not_configured", msg)
            }
            AgentError::Speech(SpeechError::TooLarge { size, limit }) => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "audio_too_large", msg)
                    .with_details(json!({"size_bytes": size, "limit_bytes": limit}))
            }
            AgentError::Speech(SpeechError::Timeout(_)) => {
                ApiError::new(StatusCode::GATEWAY_TIMEOUT, "asr_timeout", msg)
            }
            AgentError::Speech(_) => {
                ApiError::new(StatusCode::BAD_GATEWAY, "asr_provider_error", msg)
            }
            AgentError::Config(_) | AgentError::Store(_) | AgentError::Internal(_) => {
                ApiError::internal(msg)
            }
        }
    }
}

/// The agent runtime: everything the `/api/v1/agents` routes use. Build one
/// per process and share it in an `Arc`.
pub struct AgentService {
    pub(crate) store: Store,
    pub(crate) catalog: Arc<EntityCatalog>,
    pub(crate) config: AgentsConfig,
    pub(crate) tools: ToolRegistry,
    pub(crate) model: ModelGateway,
    pub(crate) speech: SpeechGateway,
    pub(crate) web: Arc<WebSearch>,
    pub(crate) prompts: Arc<PromptRegistry>,
    pub(crate) active: Arc<runtime::ActiveRuns>,
}

impl std::fmt::Debug for AgentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentService")
            .field("model_configured", &self.model.is_configured())
            .field("speech_configured", &self.speech.is_configured())
            .field("tools", &self.tools)
            .finish()
    }
}

impl AgentService {
    /// Build the service over the registry database (whose migrations must
    /// include [`migrate`]) and a loaded entity catalog. Loads stored prompt
    /// overrides and marks runs a previous process left running as failed.
    ///
    /// Errors: [`AgentError::Config`] for an unknown prompt key or a bad tool
    /// schema; store errors.
    pub async fn new(
        db: Db,
        catalog: Arc<EntityCatalog>,
        config: AgentsConfig,
    ) -> Result<AgentService, AgentError> {
        let prompts =
            PromptRegistry::new(&config.prompts).map_err(|e| AgentError::Config(e.to_string()))?;
        let tools =
            ToolRegistry::standard(Duration::from_millis(config.limits.tool_timeout_ms.max(1)))
                .map_err(|e| AgentError::Config(e.to_string()))?;
        let store = Store::new(db);
        for s in store
            .list_settings(policy::setting_kind(ProposalType::AiPrompt))
            .await?
        {
            if let Some(text) = s.value.get("text").and_then(|t| t.as_str()) {
                if let Err(e) = prompts.set_override(&s.key, text) {
                    tracing::warn!(key = %s.key, error = %e, "stored prompt override ignored");
                }
            }
        }
        let interrupted = store.fail_interrupted_runs().await?;
        if interrupted > 0 {
            tracing::warn!(
                runs = interrupted,
                "agent runs left running by a previous process marked failed"
            );
        }
        Ok(AgentService {
            model: ModelGateway::new(&config.model),
            speech: SpeechGateway::new(&config.speech),
            web: Arc::new(WebSearch::new(&config.web_search)),
            prompts: Arc::new(prompts),
            tools,
            store,
            catalog,
            config,
            active: Arc::new(runtime::ActiveRuns::default()),
        })
    }

    /// The agent tables.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The Earth entity catalog.
    pub fn catalog(&self) -> &Arc<EntityCatalog> {
        &self.catalog
    }

    /// The prompt registry.
    pub fn prompts(&self) -> &PromptRegistry {
        &self.prompts
    }

    /// The tool registry.
    pub fn tools(&self) -> &ToolRegistry {
        &self.tools
    }

    /// The configuration in force.
    pub fn config(&self) -> &AgentsConfig {
        &self.config
    }

    /// True when a chat model is configured.
    pub fn model_configured(&self) -> bool {
        self.model.is_configured()
    }

    /// `POST /proposals/{id}/apply` (seed 000 "Proposal Policy"): the
    /// policy gate for `principal`'s role and `confirm`, then the
    /// `agents.apply_setting` write tool. A refused attempt is noted on the
    /// proposal; a rejected or failed application is saved with its error.
    pub async fn apply_proposal(
        &self,
        principal: &Principal,
        id: i64,
        confirm: bool,
    ) -> Result<AgentProposal, AgentError> {
        let p = self
            .store
            .get_proposal(id)
            .await?
            .ok_or_else(|| AgentError::NotFound {
                kind: "proposal",
                id: id.to_string(),
            })?;
        match p.status {
            ProposalStatus::Pending | ProposalStatus::Approved => {}
            ProposalStatus::Rejected => return Err(AgentError::ProposalRejected(Box::new(p))),
            status => return Err(AgentError::ProposalNotPending { id, status }),
        }
        let mode = match policy::apply_gate(principal.role, p.risk_level, confirm) {
            Ok(m) => m,
            Err(refusal) => {
                let (name, role, reason) =
                    (principal.name.clone(), principal.role, refusal.to_string());
                self.store
                    .db()
                    .write(move |conn| {
                        proposals::record_refusal_sync(conn, id, &name, role, &reason)
                    })
                    .await??;
                return Err(refusal.into());
            }
        };
        self.apply_proposal_with_mode(principal, id, mode).await
    }

    /// Apply a proposal the gate already allowed, through the write tool.
    pub(crate) async fn apply_proposal_with_mode(
        &self,
        principal: &Principal,
        id: i64,
        mode: ApplyMode,
    ) -> Result<AgentProposal, AgentError> {
        let ctx = self.tool_context(principal, None, ToolMode::ProposalApply);
        let args = json!({"proposal_id": id, "mode": mode});
        match self.tools.execute(&ctx, tools::APPLY_SETTING, args).await {
            Ok(out) => serde_json::from_value(out.value["proposal"].clone())
                .map_err(|e| AgentError::Internal(format!("apply output: {e}"))),
            Err(ToolError::Failed { message, .. }) => {
                let p = self
                    .store
                    .get_proposal(id)
                    .await?
                    .ok_or_else(|| AgentError::NotFound {
                        kind: "proposal",
                        id: id.to_string(),
                    })?;
                Err(match p.status {
                    ProposalStatus::Rejected => AgentError::ProposalRejected(Box::new(p)),
                    ProposalStatus::Failed => AgentError::ProposalFailed(Box::new(p)),
                    ProposalStatus::Applied => AgentError::ProposalNotPending {
                        id,
                        status: p.status,
                    },
                    _ => AgentError::Internal(message),
                })
            }
            Err(ToolError::Denied { reason, .. }) => Err(AgentError::Forbidden(reason)),
            Err(e) => Err(AgentError::Internal(e.to_string())),
        }
    }

    /// `POST /proposals/{id}/reject`: an admin rejects a pending proposal.
    pub async fn reject_proposal(
        &self,
        principal: &Principal,
        id: i64,
        reason: String,
    ) -> Result<AgentProposal, AgentError> {
        if !principal.is_admin() {
            return Err(AgentError::ApplyRefused(ApplyRefusal::Forbidden(
                principal.role,
            )));
        }
        let by = principal.name.clone();
        match self
            .store
            .db()
            .write(move |conn| proposals::reject_sync(conn, id, &by, &reason))
            .await?
        {
            Ok(p) => Ok(p),
            Err(proposals::ApplyError::NotFound(id)) => Err(AgentError::NotFound {
                kind: "proposal",
                id: id.to_string(),
            }),
            Err(proposals::ApplyError::NotPending { id, status }) => {
                Err(AgentError::ProposalNotPending { id, status })
            }
            Err(e) => Err(AgentError::Internal(e.to_string())),
        }
    }
}
