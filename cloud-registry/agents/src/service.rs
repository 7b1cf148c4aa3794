//! [`AgentService`]: the one entry point of the agent routes. It builds the
//! run engine ([`crate::runtime::Runtime`]), creates and stops runs, hands
//! Earth commands to [`crate::earth::command`], and gates proposals
//! (docs/earth-command.md, "Runs, steps, evidence, proposals").

use std::sync::Arc;
use std::time::Duration;

use registry_core::auth::Principal;
use registry_core::db::Db;
use shared_protocol::agent::{
    AgentProposal, AgentRunDetail, CreateRunRequest, ProposalStatus, ProposalType, RunStatus,
    RunType,
};
use shared_protocol::earth::{EarthCommandRequest, EarthCommandResponse};

use crate::config::AgentsConfig;
use crate::earth;
use crate::earth::entities::EntityCatalog;
use crate::earth::geo::{LayerCache, SharedCatalog};
use crate::earth::sources::EarthSources;
use crate::error::AgentError;
use crate::events::{AgentEvent, AgentEventSink};
use crate::integrations::Integrations;
use crate::model::ModelGateway;
use crate::policy::{self, ApplyRefusal};
use crate::prompts::PromptRegistry;
use crate::proposals;
use crate::runtime::{ActiveRuns, Runtime};
use crate::speech::SpeechGateway;
use crate::store::{NewRun, Store};
use crate::tools::ToolRegistry;
use crate::websearch::WebSearch;

/// The agent runtime: everything the `/api/v1/agents` routes use. Build one
/// per process and share it in an `Arc`.
pub struct AgentService {
    rt: Runtime,
    speech: Arc<SpeechGateway>,
    layers: LayerCache,
}

impl std::fmt::Debug for AgentService {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AgentService")
            .field("model_configured", &self.rt.model.is_configured())
            .field("speech_configured", &self.speech.is_configured())
            .field("tools", &self.rt.tools)
            .finish()
    }
}

impl AgentService {
    /// Build the service over the registry database (whose migrations must
    /// include [`crate::migrate`]) and a loaded entity catalog. Loads stored prompt
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
        let speech = Arc::new(SpeechGateway::new(&config.speech));
        let model = Arc::new(ModelGateway::new(&config.model));
        let web = Arc::new(WebSearch::new(&config.web_search));
        let integrations = Integrations {
            model: Arc::clone(&model),
            speech: Arc::clone(&speech),
            web: Arc::clone(&web),
        };
        for s in store
            .list_settings(policy::setting_kind(ProposalType::ExternalIntegration))
            .await?
        {
            if let Err(e) = integrations.apply(&s.key, &s.value) {
                tracing::warn!(key = %s.key, error = %e, "stored integration setting ignored");
            }
        }
        let shared = Arc::new(SharedCatalog::new(catalog));
        // Below the apply tool's timeout, so a slow source fails the
        // proposal cleanly instead of timing the tool out.
        let tool_timeout = Duration::from_millis(config.limits.tool_timeout_ms.max(1));
        let sources = Arc::new(EarthSources::new(
            Arc::clone(&shared),
            tool_timeout.mul_f64(0.8).max(Duration::from_millis(1)),
        ));
        let stored: Vec<(String, serde_json::Value)> = store
            .list_settings(policy::setting_kind(ProposalType::DatasourceConfig))
            .await?
            .into_iter()
            .map(|s| (s.key, s.value))
            .collect();
        sources.load_stored(stored).await;
        Ok(AgentService {
            speech,
            layers: LayerCache::default(),
            rt: Runtime {
                model,
                web,
                prompts: Arc::new(prompts),
                tools,
                store,
                catalog: shared,
                sources,
                integrations,
                config,
                active: Arc::new(ActiveRuns::default()),
            },
        })
    }

    /// The same service handing every run and proposal change to `sink`
    /// (the registry's event log). Call before the first run.
    pub fn with_events(mut self, sink: Arc<dyn AgentEventSink>) -> AgentService {
        self.rt.store = self.rt.store.clone().with_events(sink);
        self
    }

    /// The agent tables.
    pub fn store(&self) -> &Store {
        &self.rt.store
    }

    /// The Earth entity catalog in force now (a snapshot: a later reload or
    /// an applied datasource does not change it).
    pub fn catalog(&self) -> Arc<EntityCatalog> {
        self.rt.catalog.current()
    }

    /// The serialized map layers (docs/earth-command.md, "Layers").
    pub fn layers(&self) -> &LayerCache {
        &self.layers
    }

    /// The prompt registry.
    pub fn prompts(&self) -> &PromptRegistry {
        &self.rt.prompts
    }

    /// The tool registry.
    pub fn tools(&self) -> &ToolRegistry {
        &self.rt.tools
    }

    /// The configuration in force.
    pub fn config(&self) -> &AgentsConfig {
        &self.rt.config
    }

    /// The speech gateway, shared (the registry's derived evidence
    /// transcribes audio clips through it).
    pub fn speech_gateway(&self) -> Arc<SpeechGateway> {
        Arc::clone(&self.speech)
    }

    /// The speech gateway.
    pub(crate) fn speech(&self) -> &SpeechGateway {
        &self.speech
    }

    /// True when a chat model is configured.
    pub fn model_configured(&self) -> bool {
        self.rt.model.is_configured()
    }

    /// `POST /proposals/{id}/apply` (docs/earth-command.md, "Proposal policy"): the
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
            .rt
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
                self.rt
                    .store
                    .db()
                    .write(move |conn| {
                        proposals::record_refusal_sync(conn, id, &name, role, &reason)
                    })
                    .await??;
                self.rt
                    .store
                    .publish_proposal(id, false, &principal.name)
                    .await;
                return Err(refusal.into());
            }
        };
        self.rt.apply_proposal_with_mode(principal, id, mode).await
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
            .rt
            .store
            .db()
            .write(move |conn| proposals::reject_sync(conn, id, &by, &reason))
            .await?
        {
            Ok(p) => {
                self.rt
                    .store
                    .publish(AgentEvent::proposal(&p, false, &principal.name));
                Ok(p)
            }
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

    /// `POST /runs`: create a run. Earth commands run at once (the run is
    /// complete when this returns); other run types need a model and run in
    /// the background (the run is returned `queued`).
    pub async fn create_run(
        self: &Arc<Self>,
        principal: &Principal,
        req: CreateRunRequest,
        request_id: Option<String>,
    ) -> Result<AgentRunDetail, AgentError> {
        if req.run_type == RunType::EarthCommand {
            let cmd = earth::command::request_from_run(&req)?;
            let resp = self.earth_command(principal, cmd, request_id).await?;
            return self.run_detail(&resp.run_id).await;
        }
        if !self.rt.model.is_configured() {
            return Err(AgentError::ModelNotConfigured(req.run_type));
        }
        let run = self
            .rt
            .store
            .create_run(NewRun {
                run_type: req.run_type,
                status: RunStatus::Queued,
                title: req.title.trim().to_string(),
                objective: req.objective.clone(),
                input: req.input.clone(),
                context: req.context.clone(),
                provider: Some(self.rt.model.provider()),
                model: self.rt.model.model(),
                request_id,
                created_by: principal.name.clone(),
            })
            .await?;
        let (cancel, guard) = self.rt.active.register(run.id);
        let svc = Arc::clone(self);
        let principal = principal.clone();
        let public_id = run.public_id.clone();
        tokio::spawn(async move {
            let _guard = guard;
            let run_id = run.public_id.clone();
            if let Err(e) = svc.rt.drive_run(run, principal, cancel).await {
                tracing::error!(run_id = %run_id, error = %e, "agent run driver failed");
            }
        });
        self.run_detail(&public_id).await
    }

    /// `POST /runs/{run_id}/stop`: stop a run that has not ended. Errors:
    /// not found; 409 when it already ended.
    pub async fn stop_run(
        &self,
        principal: &Principal,
        public_id: &str,
    ) -> Result<AgentRunDetail, AgentError> {
        let run = self
            .rt
            .store
            .get_run(public_id)
            .await?
            .ok_or_else(|| AgentError::NotFound {
                kind: "run",
                id: public_id.to_string(),
            })?;
        if run.created_by != principal.name && !principal.is_admin() {
            return Err(AgentError::Forbidden(format!(
                "only the creator of run {public_id} or an admin may stop it"
            )));
        }
        self.rt.store.stop_run(public_id, &principal.name).await?;
        self.rt.active.signal(run.id);
        self.run_detail(public_id).await
    }

    /// A run with its steps, evidence and proposals.
    pub async fn run_detail(&self, public_id: &str) -> Result<AgentRunDetail, AgentError> {
        self.rt
            .store
            .get_run_detail(public_id)
            .await?
            .ok_or_else(|| AgentError::NotFound {
                kind: "run",
                id: public_id.to_string(),
            })
    }

    /// `POST /earth/command`: run one Earth command and persist it as a run
    /// ([`crate::earth::command`]). Errors: an unknown `transcription_id`
    /// (not found), the run being stopped meanwhile (conflict), store
    /// failures.
    pub async fn earth_command(
        &self,
        principal: &Principal,
        req: EarthCommandRequest,
        request_id: Option<String>,
    ) -> Result<EarthCommandResponse, AgentError> {
        earth::command::run(&self.rt, principal, req, request_id).await
    }
}
