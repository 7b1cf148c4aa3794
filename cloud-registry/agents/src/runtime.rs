//! The run loop: a model proposes tool calls, the registry decides and runs
//! them, every model call and tool call is one recorded step, until the model
//! gives a final answer or a limit ends the run (docs/earth-command.md, "With a
//! model").
//!
//! Protocol choice per run: provider-native tools when the gateway starts
//! native, else the JSON tool-call protocol. A native refusal (HTTP 400
//! about tools, malformed `tool_calls`) switches the run to the JSON protocol
//! and restarts the conversation. A reply that is neither a tool call nor a
//! final answer is a failed `llm` step; the model gets one retry with the
//! parse error, a second bad reply ends the loop ([`LoopOutcome::InvalidOutput`]).
//!
//! Stopping: `POST /runs/{id}/stop` marks the run and its running steps in
//! the store first, then signals the loop, which abandons the call in flight
//! (the select below) and records nothing more.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use chrono::Utc;
use registry_core::auth::Principal;
use serde_json::{json, Value};
use shared_protocol::agent::{
    AgentMessage, AgentProposal, AgentRun, FinalAnswer, ProposalStatus, RunStatus, RunType,
    StepStatus, StepType, ToolDescriptor,
};
use shared_protocol::api::Role;
use tokio::sync::watch;

use crate::config::AgentsConfig;
use crate::earth::geo::SharedCatalog;
use crate::earth::sources::EarthSources;
use crate::error::AgentError;
use crate::integrations::Integrations;
use crate::model::{message, ChatReply, ModelError, ModelGateway};
use crate::policy::ApplyMode;
use crate::prompts::{self, PromptRegistry};
use crate::proposals::mask_secrets;
use crate::protocol::{self, ProtocolError};
use crate::store::{NewStep, RunFinish, Store, StoreError};
use crate::tools::{self, FollowUp, ToolContext, ToolError, ToolMode, ToolOutput, ToolRegistry};
use crate::websearch::WebSearch;

/// Most characters of model content kept in a step.
const MAX_STEP_TEXT: usize = 8000;

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut out: String = s.chars().take(n).collect();
        out.push('…');
        out
    }
}

/// Stop signals of the runs this process is driving.
#[derive(Debug, Default)]
pub(crate) struct ActiveRuns {
    senders: Mutex<HashMap<i64, watch::Sender<bool>>>,
}

/// Removes a run from [`ActiveRuns`] when its driver ends.
pub(crate) struct ActiveGuard {
    runs: Arc<ActiveRuns>,
    run_id: i64,
}

impl Drop for ActiveGuard {
    fn drop(&mut self) {
        if let Ok(mut m) = self.runs.senders.lock() {
            m.remove(&self.run_id);
        }
    }
}

impl ActiveRuns {
    /// Register a run; the receiver turns true when it is stopped.
    pub(crate) fn register(self: &Arc<Self>, run_id: i64) -> (watch::Receiver<bool>, ActiveGuard) {
        let (tx, rx) = watch::channel(false);
        if let Ok(mut m) = self.senders.lock() {
            m.insert(run_id, tx);
        }
        (
            rx,
            ActiveGuard {
                runs: Arc::clone(self),
                run_id,
            },
        )
    }

    /// Signal a run's driver to stop (no-op when none is active).
    pub(crate) fn signal(&self, run_id: i64) {
        if let Ok(m) = self.senders.lock() {
            if let Some(tx) = m.get(&run_id) {
                let _ = tx.send(true);
            }
        }
    }
}

/// A run being driven: its record, its stop signal and its tool-step count.
pub(crate) struct RunHandle {
    pub run: AgentRun,
    cancel: watch::Receiver<bool>,
    /// Tool steps recorded so far (the limit counts failed ones too).
    pub tool_steps: u32,
    /// Missing-data notes collected from tools.
    pub missing: Vec<String>,
}

impl RunHandle {
    pub(crate) fn new(run: AgentRun, cancel: watch::Receiver<bool>) -> RunHandle {
        RunHandle {
            run,
            cancel,
            tool_steps: 0,
            missing: Vec::new(),
        }
    }

    /// True once the run was stopped.
    pub(crate) fn is_stopped(&self) -> bool {
        *self.cancel.borrow()
    }

    /// Resolves when the run is stopped.
    pub(crate) async fn stopped(&self) {
        let mut rx = self.cancel.clone();
        let _ = rx.wait_for(|v| *v).await;
    }

    pub(crate) fn note(&mut self, note: impl Into<String>) {
        let n = note.into();
        if !self.missing.contains(&n) {
            self.missing.push(n);
        }
    }
}

/// How a model loop ended.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum LoopOutcome {
    Final(FinalAnswer),
    /// Two replies in a row were not protocol messages.
    InvalidOutput(String),
    /// The model asked for more tool calls than the limit allows.
    StepLimit {
        limit: u32,
        requested: String,
    },
    /// The model did not finish within the model-call limit.
    LlmCallLimit(u32),
    /// The model could not be called.
    ModelFailed(String),
    /// The run was stopped.
    Stopped,
}

impl LoopOutcome {
    /// A sentence for the run's `error` and the response's missing data.
    pub(crate) fn describe(&self) -> String {
        match self {
            LoopOutcome::Final(_) => "completed".into(),
            LoopOutcome::InvalidOutput(e) => {
                format!("the model twice returned output that is not a valid tool call or final answer ({e})")
            }
            LoopOutcome::StepLimit { limit, requested } => format!(
                "the model exceeded the tool step limit of {limit}; `{requested}` was not run"
            ),
            LoopOutcome::LlmCallLimit(n) => {
                format!("the model did not finish within {n} model calls")
            }
            LoopOutcome::ModelFailed(e) => format!("the model could not be used: {e}"),
            LoopOutcome::Stopped => "the run was stopped".into(),
        }
    }
}

/// A tool call the loop made, for fallbacks that reuse its results.
#[derive(Debug, Clone)]
pub(crate) struct ToolRecord {
    pub name: String,
    pub output: Option<Value>,
}

/// What the loop is asked to do.
pub(crate) struct LoopSpec {
    /// Role and task prompt; the protocol instructions are appended.
    pub system: String,
    pub user: String,
    /// Tools offered and allowed; `None` = every tool the role may use.
    pub allowed_tools: Option<Vec<&'static str>>,
}

/// The loop's result.
pub(crate) struct LoopResult {
    pub outcome: LoopOutcome,
    pub tool_records: Vec<ToolRecord>,
}

/// The run engine: what a run needs (the tables, the entity catalog, the
/// tool registry, the model gateway, the prompts, the limits) and the stop
/// signals of the runs this process drives. [`AgentService`] holds one;
/// the Earth command ([`crate::earth::command`]) runs on it too.
///
/// [`AgentService`]: crate::service::AgentService
pub(crate) struct Runtime {
    pub store: Store,
    pub catalog: Arc<SharedCatalog>,
    /// Applied datasource settings laid over `catalog`.
    pub sources: Arc<EarthSources>,
    /// The clients applied integration settings reach (`model` and `web`
    /// are the same gateways as below).
    pub integrations: Integrations,
    pub config: AgentsConfig,
    pub tools: ToolRegistry,
    pub model: Arc<ModelGateway>,
    pub web: Arc<WebSearch>,
    pub prompts: Arc<PromptRegistry>,
    pub active: Arc<ActiveRuns>,
}

impl Runtime {
    /// A tool context for a run of `principal`.
    pub(crate) fn tool_context(
        &self,
        principal: &Principal,
        run_id: Option<i64>,
        mode: ToolMode,
    ) -> ToolContext {
        ToolContext {
            catalog: self.catalog.current(),
            sources: Arc::clone(&self.sources),
            integrations: self.integrations.clone(),
            store: self.store.clone(),
            web: Arc::clone(&self.web),
            prompts: Arc::clone(&self.prompts),
            principal: principal.clone(),
            run_id,
            mode,
        }
    }

    /// Run one tool call as a recorded `tool` step. Refusals (unregistered,
    /// not allowed here, invalid arguments, denied, timeout) become a failed
    /// step with the error; the tool is not executed then.
    pub(crate) async fn run_tool_step(
        &self,
        h: &mut RunHandle,
        ctx: &ToolContext,
        name: &str,
        args: Value,
        allowed: Option<&[&'static str]>,
    ) -> Result<Result<ToolOutput, String>, StoreError> {
        h.tool_steps += 1;
        let step = self
            .store
            .append_step(
                h.run.id,
                NewStep::running(
                    StepType::Tool,
                    clip(name, 200),
                    json!({"tool": name, "arguments": mask_secrets(&args)}),
                ),
            )
            .await?;
        let result = if allowed.is_some_and(|a| !a.contains(&name))
            && self.tools.descriptors().iter().any(|d| d.name == name)
        {
            Err(format!(
                "`{name}` denied: not available in {} runs",
                h.run.run_type.as_str()
            ))
        } else {
            tokio::select! {
                r = self.tools.execute(ctx, name, args) => r.map_err(|e| e.to_string()),
                _ = h.stopped() => return Ok(Err("run stopped".into())),
            }
        };
        match &result {
            Ok(out) => {
                for n in &out.missing_data {
                    h.note(n.clone());
                }
                self.store
                    .finish_step(step.id, Ok(out.value.clone()), out.evidence.clone())
                    .await?;
            }
            Err(e) => {
                self.store
                    .finish_step(step.id, Err(e.clone()), Vec::new())
                    .await?;
            }
        }
        if let Ok(out) = &result {
            if let Some(FollowUp::AutoApply { proposal_id }) = out.follow_up {
                self.auto_apply(h, ctx, proposal_id).await?;
            }
        }
        Ok(result)
    }

    /// Apply a just-made low-risk proposal when auto-apply is on and the run
    /// belongs to a super_admin; recorded as a `policy` step.
    async fn auto_apply(
        &self,
        h: &mut RunHandle,
        ctx: &ToolContext,
        proposal_id: i64,
    ) -> Result<(), StoreError> {
        if !self.config.proposals.auto_apply_low_risk || ctx.principal.role != Role::SuperAdmin {
            return Ok(());
        }
        let started = Utc::now();
        let outcome = self
            .apply_proposal_with_mode(&ctx.principal, proposal_id, ApplyMode::Auto)
            .await
            .map(|p| json!({"proposal_id": p.id, "status": p.status}))
            .map_err(|e| e.to_string());
        self.store
            .append_step(
                h.run.id,
                NewStep::finished(
                    StepType::Policy,
                    "proposal.auto_apply",
                    json!({"proposal_id": proposal_id, "mode": "auto"}),
                    started,
                    outcome,
                ),
            )
            .await?;
        Ok(())
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

    /// Drive the model until a final answer or a limit.
    pub(crate) async fn model_loop(
        &self,
        h: &mut RunHandle,
        ctx: &ToolContext,
        spec: &LoopSpec,
    ) -> Result<LoopResult, StoreError> {
        let offered: Vec<_> = self
            .tools
            .offered(&ctx.principal)
            .into_iter()
            .filter(|d| {
                spec.allowed_tools
                    .as_ref()
                    .is_none_or(|a| a.contains(&d.name.as_str()))
            })
            .collect();
        let mut conv = Conversation::new(spec, offered, self.model.starts_native());
        let max_calls = self.config.limits.max_llm_calls;
        let mut outcome = LoopOutcome::LlmCallLimit(max_calls);
        for _call in 0..max_calls.max(1) {
            if h.is_stopped() {
                outcome = LoopOutcome::Stopped;
                break;
            }
            if let Some(end) = self.model_turn(h, ctx, &mut conv).await? {
                outcome = end;
                break;
            }
        }
        Ok(LoopResult {
            outcome,
            tool_records: conv.records,
        })
    }

    /// One model call, recorded as an `llm` step, and what its reply asks
    /// for: `Some` outcome when the loop ends here, `None` to call the model
    /// again. A native refusal switches the conversation to the JSON
    /// protocol and starts it over.
    async fn model_turn(
        &self,
        h: &mut RunHandle,
        ctx: &ToolContext,
        conv: &mut Conversation<'_>,
    ) -> Result<Option<LoopOutcome>, StoreError> {
        let native = conv.native;
        let input = json!({
            "protocol": if native { "native" } else { "json" },
            "model": self.model.model(),
            "messages": conv.messages.len(),
            "last_message": clip(conv.messages.last().and_then(|m| m["content"].as_str()).unwrap_or(""), 2000),
            "tools": conv.offered.iter().map(|d| d.name.as_str()).collect::<Vec<_>>(),
        });
        let step = match self
            .store
            .append_step(
                h.run.id,
                NewStep::running(StepType::Llm, "chat.completions", input),
            )
            .await
        {
            Ok(s) => s,
            Err(StoreError::RunFinal { .. }) => return Ok(Some(LoopOutcome::Stopped)),
            Err(e) => return Err(e),
        };
        let tools_arg = native.then_some(conv.native_tools.as_slice());
        let reply: Result<ChatReply, ModelError> = tokio::select! {
            r = self.model.chat(&conv.messages, tools_arg) => r,
            _ = h.stopped() => return Ok(Some(LoopOutcome::Stopped)),
        };
        let reply = match reply {
            Ok(r) => r,
            Err(e) if native && e.rejects_native_tools() => {
                self.store
                    .finish_step(
                        step.id,
                        Err(format!("{e}; switching to the JSON tool-call protocol")),
                        Vec::new(),
                    )
                    .await?;
                self.model.note_native_refused();
                conv.restart(false);
                return Ok(None);
            }
            Err(e) => {
                self.store
                    .finish_step(step.id, Err(e.to_string()), Vec::new())
                    .await?;
                return Ok(Some(LoopOutcome::ModelFailed(e.to_string())));
            }
        };
        let output = reply_output(&reply);
        if native && !reply.tool_calls.is_empty() {
            self.store
                .finish_step(step.id, Ok(output), Vec::new())
                .await?;
            conv.messages.push(reply.message.clone());
            return self.native_tool_calls(h, ctx, conv, &reply).await;
        }
        self.json_reply(h, ctx, conv, step.id, output, &reply).await
    }

    /// Provider-native tool calls: each one a tool step, its result sent
    /// back as a `tool` message; the step limit ends the loop.
    async fn native_tool_calls(
        &self,
        h: &mut RunHandle,
        ctx: &ToolContext,
        conv: &mut Conversation<'_>,
        reply: &ChatReply,
    ) -> Result<Option<LoopOutcome>, StoreError> {
        let limit = self.config.limits.max_tool_steps;
        for call in &reply.tool_calls {
            if h.tool_steps >= limit {
                self.record_step_limit(h, &call.name).await?;
                return Ok(Some(LoopOutcome::StepLimit {
                    limit,
                    requested: call.name.clone(),
                }));
            }
            let r = self
                .run_tool_step(
                    h,
                    ctx,
                    &call.name,
                    Value::Object(call.arguments.clone()),
                    conv.spec.allowed_tools.as_deref(),
                )
                .await?;
            if h.is_stopped() {
                return Ok(Some(LoopOutcome::Stopped));
            }
            let content = match &r {
                Ok(o) => o.value.to_string(),
                Err(e) => json!({"error": e}).to_string(),
            };
            conv.records.push(ToolRecord {
                name: call.name.clone(),
                output: r.ok().map(|o| o.value),
            });
            conv.messages
                .push(json!({"role": "tool", "tool_call_id": call.id, "content": content}));
        }
        Ok(None)
    }

    /// A JSON protocol reply: a final answer ends the loop; a tool call is
    /// one tool step (the step limit ends the loop); anything else is a
    /// failed `llm` step, and the second in a row ends the loop.
    async fn json_reply(
        &self,
        h: &mut RunHandle,
        ctx: &ToolContext,
        conv: &mut Conversation<'_>,
        step_id: i64,
        output: Value,
        reply: &ChatReply,
    ) -> Result<Option<LoopOutcome>, StoreError> {
        let text = reply.content.clone().unwrap_or_default();
        match protocol::parse_agent_message(&text) {
            Ok(AgentMessage::Final(f)) => {
                self.store
                    .finish_step(step_id, Ok(output), Vec::new())
                    .await?;
                Ok(Some(LoopOutcome::Final(f)))
            }
            Ok(AgentMessage::ToolCall(call)) => {
                self.store
                    .finish_step(step_id, Ok(output), Vec::new())
                    .await?;
                conv.bad_replies = 0;
                let limit = self.config.limits.max_tool_steps;
                if h.tool_steps >= limit {
                    self.record_step_limit(h, &call.tool).await?;
                    return Ok(Some(LoopOutcome::StepLimit {
                        limit,
                        requested: call.tool.clone(),
                    }));
                }
                let r = self
                    .run_tool_step(
                        h,
                        ctx,
                        &call.tool,
                        Value::Object(call.arguments.clone()),
                        conv.spec.allowed_tools.as_deref(),
                    )
                    .await?;
                if h.is_stopped() {
                    return Ok(Some(LoopOutcome::Stopped));
                }
                conv.messages.push(message("assistant", text.clone()));
                conv.messages.push(message(
                    "user",
                    match &r {
                        Ok(o) => format!("TOOL_RESULT {}:\n{}", call.tool, o.value),
                        Err(e) => format!("TOOL_ERROR {}: {e}", call.tool),
                    },
                ));
                conv.records.push(ToolRecord {
                    name: call.tool.clone(),
                    output: r.ok().map(|o| o.value),
                });
                Ok(None)
            }
            Err(e) => {
                conv.bad_replies += 1;
                let err = invalid_reply_error(&e);
                self.store
                    .finish_step_with(
                        step_id,
                        StepStatus::Failed,
                        Some(output),
                        Some(err.clone()),
                        Vec::new(),
                    )
                    .await?;
                if conv.bad_replies >= 2 {
                    return Ok(Some(LoopOutcome::InvalidOutput(e.to_string())));
                }
                conv.messages.push(message("assistant", text));
                conv.messages.push(message(
                    "user",
                    format!(
                        "{err}. No tool was run. Reply again with exactly one JSON object: \
                         {{\"type\": \"tool_call\", ...}} or {{\"type\": \"final\", ...}}."
                    ),
                ));
                Ok(None)
            }
        }
    }

    async fn record_step_limit(
        &self,
        h: &mut RunHandle,
        requested: &str,
    ) -> Result<(), StoreError> {
        let limit = self.config.limits.max_tool_steps;
        let started = Utc::now();
        self.store
            .append_step(
                h.run.id,
                NewStep::finished(
                    StepType::Policy,
                    "tool_step_limit",
                    json!({"requested_tool": requested, "tool_steps": h.tool_steps, "limit": limit}),
                    started,
                    Err(format!("tool step limit of {limit} reached; `{requested}` was not run")),
                ),
            )
            .await?;
        Ok(())
    }

    /// The background driver of a non-Earth run.
    pub(crate) async fn drive_run(
        &self,
        run: AgentRun,
        principal: Principal,
        cancel: watch::Receiver<bool>,
    ) -> Result<(), AgentError> {
        let run = match self.store.set_run_status(run.id, RunStatus::Running).await {
            Ok(r) => r,
            Err(StoreError::RunFinal { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let mut h = RunHandle::new(run, cancel);
        let ctx = self.tool_context(&principal, Some(h.run.id), ToolMode::Run);
        let task_prompt = match h.run.run_type {
            RunType::SituationalAwareness => self.prompts.get(prompts::SITUATIONAL_ASSESSMENT),
            RunType::ConfigProposal => self.prompts.get(prompts::CONFIG_PROPOSAL),
            _ => String::new(),
        };
        let system = format!(
            "{}\n\n{task_prompt}",
            self.prompts.get(prompts::RUNTIME_SYSTEM)
        );
        let user = serde_json::to_string_pretty(&json!({
            "objective": h.run.objective,
            "input": h.run.input,
            "context": h.run.context,
        }))
        .unwrap_or_default();
        let spec = LoopSpec {
            system,
            user,
            allowed_tools: None,
        };
        let result = match self.model_loop(&mut h, &ctx, &spec).await {
            Ok(r) => r,
            Err(StoreError::RunFinal { .. }) => return Ok(()),
            Err(e) => return Err(e.into()),
        };
        let finish = match result.outcome {
            LoopOutcome::Stopped => return Ok(()),
            LoopOutcome::Final(f) => {
                let pending = self
                    .store
                    .get_run_detail(&h.run.public_id)
                    .await?
                    .map(|d| {
                        d.proposals
                            .iter()
                            .any(|p| p.status == ProposalStatus::Pending)
                    })
                    .unwrap_or(false);
                let mut md = f.summary.clone();
                if !f.result.is_null() {
                    md.push_str("\n\n```json\n");
                    md.push_str(&serde_json::to_string_pretty(&f.result).unwrap_or_default());
                    md.push_str("\n```\n");
                }
                for n in &h.missing {
                    md.push_str(&format!("\n- missing: {n}"));
                }
                RunFinish {
                    status: if pending {
                        RunStatus::WaitingApproval
                    } else {
                        RunStatus::Completed
                    },
                    result_markdown: Some(md),
                    result_json: Some(
                        json!({"summary": f.summary, "result": f.result, "missing_data": h.missing}),
                    ),
                    error: None,
                }
            }
            other => RunFinish {
                status: RunStatus::Failed,
                result_markdown: None,
                result_json: Some(json!({"missing_data": h.missing})),
                error: Some(other.describe()),
            },
        };
        match self.store.finish_run(h.run.id, Vec::new(), finish).await {
            Ok(_) | Err(StoreError::RunFinal { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

/// A model loop's conversation: the tools offered, the protocol in use, the
/// messages so far, the bad replies in a row and the tool calls made.
struct Conversation<'s> {
    spec: &'s LoopSpec,
    offered: Vec<ToolDescriptor>,
    native_tools: Vec<Value>,
    /// Provider-native tool calls (else the JSON protocol).
    native: bool,
    messages: Vec<Value>,
    bad_replies: u32,
    records: Vec<ToolRecord>,
}

impl<'s> Conversation<'s> {
    fn new(spec: &'s LoopSpec, offered: Vec<ToolDescriptor>, native: bool) -> Self {
        let native_tools = protocol::openai_tools(&offered);
        let mut c = Conversation {
            spec,
            offered,
            native_tools,
            native,
            messages: Vec::new(),
            bad_replies: 0,
            records: Vec::new(),
        };
        c.restart(native);
        c
    }

    /// Start over: the system message (the spec's prompt and the protocol
    /// instructions of `native` or the JSON protocol) and the user message.
    fn restart(&mut self, native: bool) {
        self.native = native;
        let proto = if native {
            protocol::native_protocol_instructions().to_string()
        } else {
            protocol::json_protocol_instructions(&self.offered)
        };
        self.messages = vec![
            message("system", format!("{}\n\n{proto}", self.spec.system)),
            message("user", self.spec.user.clone()),
        ];
    }
}

/// The `llm` step's output: the reply, secrets masked, content clipped.
fn reply_output(reply: &ChatReply) -> Value {
    let masked_calls: Vec<Value> = reply
        .tool_calls
        .iter()
        .map(|c| json!({"id": c.id, "name": c.name, "arguments": mask_secrets(&Value::Object(c.arguments.clone()))}))
        .collect();
    json!({
        "content": reply.content.as_deref().map(|c| clip(&redact_text(c), MAX_STEP_TEXT)),
        "tool_calls": masked_calls,
        "finish_reason": reply.finish_reason,
        "usage": reply.usage,
        "model": reply.model,
    })
}

/// Model text with the values of secret fields in its JSON masked, so a
/// model that echoes an API key does not leave it in the step log.
fn redact_text(text: &str) -> String {
    if let Some(obj) = protocol::first_json_object(text) {
        let v = Value::Object(obj);
        let masked = mask_secrets(&v);
        if masked != v {
            return format!("[secret values masked] {masked}");
        }
    }
    text.to_string()
}

fn invalid_reply_error(e: &ProtocolError) -> String {
    format!("invalid tool call: {e}")
}
