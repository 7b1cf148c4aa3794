//! Agent runtime data model and tool protocol (seed 000 "Data Model",
//! "Agent Tool Protocol", "Policy").

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::validate::{Validate, ValidationError};
use crate::Timestamp;

wire_enum! {
    /// seed 000 AgentRun `run_type`.
    pub enum RunType {
        EarthCommand = "earth_command",
        SituationalAwareness = "situational_awareness",
        ConfigProposal = "config_proposal",
        Diagnostic = "diagnostic",
    }
}

wire_enum! {
    /// seed 000 AgentRun `status`.
    pub enum RunStatus {
        Queued = "queued",
        Running = "running",
        WaitingApproval = "waiting_approval",
        Completed = "completed",
        Failed = "failed",
        Stopped = "stopped",
    }
}

impl RunStatus {
    /// True for `completed`, `failed`, `stopped`.
    pub fn is_final(self) -> bool {
        matches!(
            self,
            RunStatus::Completed | RunStatus::Failed | RunStatus::Stopped
        )
    }
}

wire_enum! {
    /// seed 000 AgentStep `step_type`.
    pub enum StepType {
        Llm = "llm",
        Tool = "tool",
        Policy = "policy",
        Action = "action",
        Transcription = "transcription",
    }
}

wire_enum! {
    /// seed 000 AgentStep `status`.
    pub enum StepStatus {
        Pending = "pending",
        Running = "running",
        Completed = "completed",
        Failed = "failed",
        Skipped = "skipped",
    }
}

wire_enum! {
    /// seed 000 AgentEvidence `evidence_type`.
    pub enum EvidenceType {
        InternalRecord = "internal_record",
        WebSearch = "web_search",
        WebFetch = "web_fetch",
        EntityMatch = "entity_match",
        Transcription = "transcription",
    }
}

wire_enum! {
    /// seed 000 AgentProposal `proposal_type`.
    pub enum ProposalType {
        DatasourceConfig = "datasource_config",
        AiPrompt = "ai_prompt",
        ExternalIntegration = "external_integration",
    }
}

wire_enum! {
    /// seed 000 AgentProposal `status`.
    pub enum ProposalStatus {
        Pending = "pending",
        Approved = "approved",
        Applied = "applied",
        Rejected = "rejected",
        Failed = "failed",
    }
}

wire_enum! {
    /// seed 000 AgentProposal `risk_level`.
    pub enum ProposalRiskLevel {
        Low = "low",
        Medium = "medium",
        High = "high",
    }
}

wire_enum! {
    /// What running a tool may change (seed 000 "Tool Policy").
    pub enum SideEffectLevel {
        /// Runs directly.
        Read = "read",
        /// May only create proposals.
        Proposal = "proposal",
        /// Runs only while a proposal is applied.
        Write = "write",
    }
}

/// seed 000 "AgentRun". `id` is the store's integer key; `public_id`
/// (`agent_…`, the store's column name) is what clients use in paths and
/// is `run_id` on the wire, as in every other answer that names a run
/// (the Earth command's, steps', evidence's, proposals').
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentRun {
    pub id: i64,
    #[serde(rename = "run_id")]
    pub public_id: String,
    pub run_type: RunType,
    pub status: RunStatus,
    pub title: String,
    pub objective: String,
    /// Original input: text, and audio metadata when spoken.
    pub input: Value,
    pub context: Value,
    pub result_markdown: Option<String>,
    /// Structured output; the Earth action plan for `earth_command`.
    pub result_json: Option<Value>,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub request_id: Option<String>,
    /// The principal that created the run.
    pub created_by: String,
    #[schema(value_type = String, format = DateTime)]
    pub created_at: Timestamp,
    #[schema(value_type = String, format = DateTime)]
    pub updated_at: Timestamp,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub completed_at: Option<Timestamp>,
    pub error: Option<String>,
}

/// seed 000 "AgentStep".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentStep {
    pub id: i64,
    /// The run's public id (`agent_…`, its `run_id`), not the store's
    /// integer key.
    pub run_id: String,
    /// 0-based, gap-free within a run.
    pub step_index: u32,
    pub step_type: StepType,
    pub status: StepStatus,
    /// e.g. `earth.find_entities`.
    pub name: String,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub started_at: Option<Timestamp>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub completed_at: Option<Timestamp>,
    pub duration_ms: Option<u64>,
}

/// seed 000 "AgentEvidence".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentEvidence {
    pub id: i64,
    /// The run's public id (`agent_…`, its `run_id`), not the store's
    /// integer key.
    pub run_id: String,
    pub step_id: Option<i64>,
    pub evidence_type: EvidenceType,
    /// Source id, e.g. `tle:celestrak_active_2020-10-26`.
    pub source: String,
    pub title: String,
    pub url: Option<String>,
    pub content: String,
    /// Lowercase hex sha256 of `content`.
    pub content_hash: Option<String>,
    pub metadata: Value,
    #[schema(value_type = String, format = DateTime)]
    pub retrieved_at: Timestamp,
}

/// seed 000 "AgentProposal".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentProposal {
    pub id: i64,
    /// The run's public id (`agent_…`, its `run_id`), not the store's
    /// integer key.
    pub run_id: String,
    pub proposal_type: ProposalType,
    pub status: ProposalStatus,
    pub risk_level: ProposalRiskLevel,
    pub target: Value,
    pub before_payload: Value,
    pub after_payload: Value,
    pub rationale: String,
    pub policy_result: Value,
    pub applied_by: Option<String>,
    #[schema(value_type = Option<String>, format = DateTime)]
    pub applied_at: Option<Timestamp>,
    pub error: Option<String>,
}

/// A run with everything recorded under it (`GET /api/v1/agents/runs/{run_id}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct AgentRunDetail {
    pub run: AgentRun,
    pub steps: Vec<AgentStep>,
    pub evidence: Vec<AgentEvidence>,
    pub proposals: Vec<AgentProposal>,
}

/// `POST /api/v1/agents/runs` body.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CreateRunRequest {
    pub run_type: RunType,
    pub title: String,
    pub objective: String,
    #[serde(default)]
    pub input: Value,
    #[serde(default)]
    pub context: Value,
}

impl Validate for CreateRunRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        if self.title.trim().is_empty() || self.title.chars().count() > 200 {
            return Err(ValidationError::new("title", "must be 1 to 200 characters"));
        }
        Ok(())
    }
}

/// A model's request to run a tool (seed 000 "Example JSON tool call").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolCall {
    /// A registered tool name, e.g. `earth.find_entities`.
    pub tool: String,
    #[serde(default)]
    pub arguments: Map<String, Value>,
}

/// A model's final answer (seed 000 "Example final response").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct FinalAnswer {
    pub summary: String,
    #[serde(default)]
    pub result: Value,
}

/// One message of the JSON tool-call protocol, told apart by `type`
/// (`tool_call` or `final`; seed 000 "Agent Tool Protocol").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentMessage {
    ToolCall(ToolCall),
    Final(FinalAnswer),
}

/// How a tool is described to the model and the policy (seed 000 "Tool
/// Policy": name, description, input schema, output schema, permission,
/// side-effect level).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct ToolDescriptor {
    pub name: String,
    pub description: String,
    /// JSON Schema of `arguments`.
    pub input_schema: Value,
    /// JSON Schema of the tool's output.
    pub output_schema: Value,
    /// The role needed to run it, e.g. `operator`.
    pub permission: String,
    pub side_effect_level: SideEffectLevel,
}
