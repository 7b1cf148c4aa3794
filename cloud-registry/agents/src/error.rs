//! The agent service's error type, free of HTTP: [`crate::api`] gives each
//! variant its status and code.

use registry_core::db::DbError;
use shared_protocol::agent::{AgentProposal, ProposalStatus, RunType};

use crate::policy::ApplyRefusal;
use crate::speech::SpeechError;
use crate::store::StoreError;

/// Errors of the agent service; each maps to one HTTP status and code
/// (the mapping is in [`crate::api`]).
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
