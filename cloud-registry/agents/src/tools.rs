//! Tool registry (docs/earth-command.md, "Runs, steps, evidence,
//! proposals"): every tool declares name,
//! description, input and output JSON Schema, permission (a role) and
//! side-effect level. The model may ask for any tool; the registry decides:
//! only registered tools run, arguments must validate, the caller's role
//! must allow the tool, `write` tools run only while a proposal is applied,
//! and each call is bounded by the tool timeout (sync tools run on the
//! blocking pool). Every refusal is a typed [`ToolError`] that the runtime
//! records as a failed step; nothing is executed then.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use serde_json::{json, Map, Value};
use shared_protocol::agent::{EvidenceType, SideEffectLevel, ToolDescriptor};
use shared_protocol::earth::EarthDomain;

use crate::earth::entities::{
    EntityCatalog, EntityFilters, EntityQuery, EntityQueryResult, GeoLayerData,
};
use crate::earth::sources::{DatasourceSpec, EarthSources};
use crate::integrations::Integrations;
use crate::policy;
use crate::prompts::PromptRegistry;
use crate::proposals::{self, ApplyError, ProposalDraft};
use crate::store::{NewEvidence, Store};
use crate::websearch::{WebSearch, NOT_CONFIGURED_NOTE};
use registry_core::auth::Principal;

/// `earth.find_entities`.
pub const FIND_ENTITIES: &str = "earth.find_entities";
/// `earth.get_entity`.
pub const GET_ENTITY: &str = "earth.get_entity";
/// `earth.list_domains`.
pub const LIST_DOMAINS: &str = "earth.list_domains";
/// `web.search`.
pub const WEB_SEARCH: &str = "web.search";
/// `agents.propose_config` (side effect: proposal).
pub const PROPOSE_CONFIG: &str = "agents.propose_config";
/// `agents.apply_setting` (side effect: write; proposal apply only).
pub const APPLY_SETTING: &str = "agents.apply_setting";

/// Where a tool is being run from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolMode {
    /// Inside an agent run, on a model's (or the resolver's) request.
    Run,
    /// While an administrator applies a proposal.
    ProposalApply,
}

/// What a tool can reach. Cheap to clone.
#[derive(Clone)]
pub struct ToolContext {
    pub catalog: Arc<EntityCatalog>,
    /// Where an applied `datasource_config` setting takes effect.
    pub sources: Arc<EarthSources>,
    /// Where an applied `external_integration` setting takes effect.
    pub integrations: Integrations,
    pub store: Store,
    pub web: Arc<WebSearch>,
    pub prompts: Arc<PromptRegistry>,
    /// Who the run (or the apply) is for; tool permissions are checked
    /// against this principal's role.
    pub principal: Principal,
    /// Store id of the run, when inside one.
    pub run_id: Option<i64>,
    pub mode: ToolMode,
}

/// Something the runtime must do after a tool returns.
#[derive(Debug, Clone, PartialEq)]
pub enum FollowUp {
    /// Apply this low-risk proposal now (auto-apply is enabled and the run
    /// belongs to a super_admin).
    AutoApply { proposal_id: i64 },
}

/// A tool's result: the JSON the model sees (and the step stores), plus
/// evidence and missing-data notes for the run.
#[derive(Debug, Clone, Default)]
pub struct ToolOutput {
    pub value: Value,
    pub evidence: Vec<NewEvidence>,
    pub missing_data: Vec<String>,
    pub follow_up: Option<FollowUp>,
}

impl ToolOutput {
    fn value(value: Value) -> ToolOutput {
        ToolOutput {
            value,
            ..Default::default()
        }
    }
}

/// Why a tool call did not produce a result. Each names the tool.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ToolError {
    #[error("tool `{tool}` is not registered; registered tools: {registered}")]
    Unregistered { tool: String, registered: String },
    #[error("invalid arguments for `{tool}`: {}", errors.join("; "))]
    InvalidArguments { tool: String, errors: Vec<String> },
    #[error("`{tool}` denied: {reason}")]
    Denied { tool: String, reason: String },
    #[error("`{tool}` timed out after {ms} ms")]
    TimedOut { tool: String, ms: u64 },
    #[error("`{tool}` failed: {message}")]
    Failed { tool: String, message: String },
    #[error("`{tool}` returned output that breaks its schema: {}", errors.join("; "))]
    InvalidOutput { tool: String, errors: Vec<String> },
}

type BlockingFn = dyn Fn(&ToolContext, Value) -> Result<ToolOutput, String> + Send + Sync;
type AsyncFn =
    dyn Fn(ToolContext, Value) -> BoxFuture<'static, Result<ToolOutput, String>> + Send + Sync;
type CheckFn = fn(&Value) -> Result<(), Vec<String>>;

enum Handler {
    /// CPU or file work: runs on the blocking pool.
    Blocking(Arc<BlockingFn>),
    Async(Arc<AsyncFn>),
}

struct Tool {
    descriptor: ToolDescriptor,
    input: jsonschema::Validator,
    output: jsonschema::Validator,
    /// Checks JSON Schema cannot express (e.g. filters per domain).
    check: Option<CheckFn>,
    handler: Handler,
}

/// Why the registry could not be built.
#[derive(Debug, thiserror::Error)]
#[error("tool `{tool}`: {message}")]
pub struct RegistryError {
    pub tool: String,
    pub message: String,
}

/// The whitelist of tools.
pub struct ToolRegistry {
    tools: BTreeMap<String, Tool>,
    timeout: Duration,
}

impl std::fmt::Debug for ToolRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ToolRegistry")
            .field("tools", &self.tools.keys().collect::<Vec<_>>())
            .field("timeout", &self.timeout)
            .finish()
    }
}

impl ToolRegistry {
    /// An empty registry whose calls time out after `timeout`.
    pub fn empty(timeout: Duration) -> ToolRegistry {
        ToolRegistry {
            tools: BTreeMap::new(),
            timeout,
        }
    }

    /// The standard tools: earth.find_entities, earth.get_entity,
    /// earth.list_domains, web.search, agents.propose_config,
    /// agents.apply_setting.
    pub fn standard(timeout: Duration) -> Result<ToolRegistry, RegistryError> {
        let mut r = ToolRegistry::empty(timeout);
        r.register_blocking(
            descriptor(
                FIND_ENTITIES,
                "Find Earth entities of one domain by filters. Returns matching entity ids, names and \
                 coordinates (the only ids a plan may use), the total count and missing-data notes.",
                EntityQuery::json_schema(),
                find_output_schema(),
                "viewer",
                SideEffectLevel::Read,
            ),
            Some(check_find_arguments),
            Arc::new(|ctx: &ToolContext, args: Value| {
                let q = EntityQuery::from_tool_arguments(args).map_err(|e| e.to_string())?;
                let r = ctx.catalog.find(&q);
                Ok(find_output(&q, &r))
            }),
        )?;
        r.register_blocking(
            descriptor(
                GET_ENTITY,
                "Get one Earth entity by id with its properties and current coordinates.",
                json!({
                    "type": "object", "additionalProperties": false, "required": ["entity_id"],
                    "properties": {"entity_id": {"type": "string", "minLength": 1, "maxLength": 200}}
                }),
                json!({"type": "object", "required": ["entity"], "properties": {"entity": {"type": "object"}}}),
                "viewer",
                SideEffectLevel::Read,
            ),
            None,
            Arc::new(|ctx: &ToolContext, args: Value| {
                let id = args.get("entity_id").and_then(Value::as_str).unwrap_or_default();
                let e = ctx
                    .catalog
                    .get(id)
                    .ok_or_else(|| format!("no entity with id `{id}`"))?;
                let evidence = entity_evidence(
                    e.domain,
                    &format!("entity {id}"),
                    &[(e.entity_id.as_str(), e.name.as_str())],
                    json!({"entity_id": id}),
                );
                Ok(ToolOutput {
                    value: json!({"entity": e}),
                    evidence: vec![evidence],
                    ..Default::default()
                })
            }),
        )?;
        r.register_blocking(
            descriptor(
                LIST_DOMAINS,
                "List the six Earth domains with entity counts, whether data is configured, and the \
                 filters each domain accepts.",
                json!({"type": "object", "additionalProperties": false, "properties": {}}),
                json!({"type": "object", "required": ["domains"], "properties": {"domains": {"type": "array"}}}),
                "viewer",
                SideEffectLevel::Read,
            ),
            None,
            Arc::new(|ctx: &ToolContext, _args: Value| {
                let stats = ctx.catalog.stats();
                let domains: Vec<Value> = EarthDomain::ALL
                    .iter()
                    .map(|d| {
                        json!({
                            "domain": d.as_str(),
                            "count": stats.counts.get(d).copied().unwrap_or(0),
                            "configured": !stats.unconfigured.contains(d),
                            "filters": EntityFilters::applicable(*d),
                        })
                    })
                    .collect();
                Ok(ToolOutput::value(json!({"domains": domains})))
            }),
        )?;
        r.register_async(
            descriptor(
                WEB_SEARCH,
                "Search the web (when configured). Returns titles, URLs and snippets; when web search is \
                 not configured it returns no results and a missing-data note.",
                json!({
                    "type": "object", "additionalProperties": false, "required": ["query"],
                    "properties": {
                        "query": {"type": "string", "minLength": 1, "maxLength": 500},
                        "limit": {"type": "integer", "minimum": 1, "maximum": 10}
                    }
                }),
                json!({
                    "type": "object", "required": ["configured", "results"],
                    "properties": {"configured": {"type": "boolean"}, "results": {"type": "array"}}
                }),
                "viewer",
                SideEffectLevel::Read,
            ),
            None,
            Arc::new(|ctx: ToolContext, args: Value| -> BoxFuture<'static, Result<ToolOutput, String>> {
                Box::pin(async move { web_search(&ctx, &args).await })
            }),
        )?;
        r.register_async(
            descriptor(
                PROPOSE_CONFIG,
                "Propose a change to one datasource_config, ai_prompt or external_integration setting. \
                 Creates a proposal for review; never applies it. Secret fields are rejected.",
                propose_input_schema(),
                json!({
                    "type": "object", "required": ["proposal_id", "status", "risk_level"],
                    "properties": {"proposal_id": {"type": "integer"}, "status": {"type": "string"},
                                   "risk_level": {"type": "string"}}
                }),
                "admin",
                SideEffectLevel::Proposal,
            ),
            None,
            Arc::new(|ctx: ToolContext, args: Value| -> BoxFuture<'static, Result<ToolOutput, String>> {
                Box::pin(async move { propose_config(&ctx, args).await })
            }),
        )?;
        r.register_async(
            descriptor(
                APPLY_SETTING,
                "Write a proposal's after_payload to its setting. Runs only while an administrator \
                 applies the proposal.",
                json!({
                    "type": "object", "additionalProperties": false, "required": ["proposal_id", "mode"],
                    "properties": {"proposal_id": {"type": "integer", "minimum": 1},
                                   "mode": {"type": "string", "enum": ["auto", "manual"]}}
                }),
                json!({"type": "object", "required": ["proposal"], "properties": {"proposal": {"type": "object"}}}),
                "admin",
                SideEffectLevel::Write,
            ),
            None,
            Arc::new(|ctx: ToolContext, args: Value| -> BoxFuture<'static, Result<ToolOutput, String>> {
                Box::pin(async move { apply_setting(&ctx, &args).await })
            }),
        )?;
        Ok(r)
    }

    fn insert(
        &mut self,
        d: ToolDescriptor,
        check: Option<CheckFn>,
        handler: Handler,
    ) -> Result<(), RegistryError> {
        let err = |m: String| RegistryError {
            tool: d.name.clone(),
            message: m,
        };
        let input = jsonschema::validator_for(&d.input_schema)
            .map_err(|e| err(format!("input schema: {e}")))?;
        let output = jsonschema::validator_for(&d.output_schema)
            .map_err(|e| err(format!("output schema: {e}")))?;
        if d.permission.parse::<shared_protocol::api::Role>().is_err() {
            return Err(err(format!("permission `{}` is not a role", d.permission)));
        }
        self.tools.insert(
            d.name.clone(),
            Tool {
                descriptor: d,
                input,
                output,
                check,
                handler,
            },
        );
        Ok(())
    }

    /// Register a synchronous tool (run on the blocking pool).
    pub fn register_blocking(
        &mut self,
        d: ToolDescriptor,
        check: Option<CheckFn>,
        f: Arc<BlockingFn>,
    ) -> Result<(), RegistryError> {
        self.insert(d, check, Handler::Blocking(f))
    }

    /// Register an async tool.
    pub fn register_async(
        &mut self,
        d: ToolDescriptor,
        check: Option<CheckFn>,
        f: Arc<AsyncFn>,
    ) -> Result<(), RegistryError> {
        self.insert(d, check, Handler::Async(f))
    }

    /// Every registered tool.
    pub fn descriptors(&self) -> Vec<ToolDescriptor> {
        self.tools.values().map(|t| t.descriptor.clone()).collect()
    }

    /// The tools offered to a model in a run for `principal`: allowed by
    /// role, and not `write` (those never run in a run).
    pub fn offered(&self, principal: &Principal) -> Vec<ToolDescriptor> {
        self.tools
            .values()
            .map(|t| &t.descriptor)
            .filter(|d| d.side_effect_level != SideEffectLevel::Write)
            .filter(|d| policy::role_allows(principal.role, &d.permission))
            .cloned()
            .collect()
    }

    /// Validate and run one tool call. Nothing runs unless the tool is
    /// registered, the arguments validate, the role allows it and the
    /// side-effect level fits the mode.
    pub async fn execute(
        &self,
        ctx: &ToolContext,
        name: &str,
        args: Value,
    ) -> Result<ToolOutput, ToolError> {
        let tool = self
            .tools
            .get(name)
            .ok_or_else(|| ToolError::Unregistered {
                tool: name.to_string(),
                registered: self.tools.keys().cloned().collect::<Vec<_>>().join(", "),
            })?;
        let d = &tool.descriptor;
        let errors: Vec<String> = tool
            .input
            .iter_errors(&args)
            .map(|e| {
                let p = e.instance_path().to_string();
                if p.is_empty() {
                    e.to_string()
                } else {
                    format!("{p}: {e}")
                }
            })
            .collect();
        if !errors.is_empty() {
            return Err(ToolError::InvalidArguments {
                tool: name.to_string(),
                errors,
            });
        }
        if let Some(check) = tool.check {
            check(&args).map_err(|errors| ToolError::InvalidArguments {
                tool: name.to_string(),
                errors,
            })?;
        }
        if !policy::role_allows(ctx.principal.role, &d.permission) {
            return Err(ToolError::Denied {
                tool: name.to_string(),
                reason: format!(
                    "role `{}` may not use it (needs `{}`)",
                    ctx.principal.role, d.permission
                ),
            });
        }
        match (d.side_effect_level, ctx.mode) {
            (SideEffectLevel::Write, ToolMode::Run) => {
                return Err(ToolError::Denied {
                    tool: name.to_string(),
                    reason: "write tools run only while an administrator applies a proposal".into(),
                })
            }
            (SideEffectLevel::Proposal, ToolMode::Run) if ctx.run_id.is_none() => {
                return Err(ToolError::Denied {
                    tool: name.to_string(),
                    reason: "proposal tools run only inside an agent run".into(),
                })
            }
            _ => {}
        }
        let ms = self.timeout.as_millis() as u64;
        let result = match &tool.handler {
            Handler::Blocking(f) => {
                let f = Arc::clone(f);
                let ctx = ctx.clone();
                let task = tokio::task::spawn_blocking(move || f(&ctx, args));
                match tokio::time::timeout(self.timeout, task).await {
                    Err(_) => {
                        return Err(ToolError::TimedOut {
                            tool: name.to_string(),
                            ms,
                        })
                    }
                    Ok(Err(join)) => Err(format!("tool task died: {join}")),
                    Ok(Ok(r)) => r,
                }
            }
            Handler::Async(f) => {
                match tokio::time::timeout(self.timeout, f(ctx.clone(), args)).await {
                    Err(_) => {
                        return Err(ToolError::TimedOut {
                            tool: name.to_string(),
                            ms,
                        })
                    }
                    Ok(r) => r,
                }
            }
        };
        let out = result.map_err(|message| ToolError::Failed {
            tool: name.to_string(),
            message,
        })?;
        let errors: Vec<String> = tool
            .output
            .iter_errors(&out.value)
            .map(|e| e.to_string())
            .collect();
        if !errors.is_empty() {
            return Err(ToolError::InvalidOutput {
                tool: name.to_string(),
                errors,
            });
        }
        Ok(out)
    }
}

fn descriptor(
    name: &str,
    description: &str,
    input_schema: Value,
    output_schema: Value,
    permission: &str,
    side_effect_level: SideEffectLevel,
) -> ToolDescriptor {
    ToolDescriptor {
        name: name.to_string(),
        description: description.to_string(),
        input_schema,
        output_schema,
        permission: permission.to_string(),
        side_effect_level,
    }
}

fn check_find_arguments(args: &Value) -> Result<(), Vec<String>> {
    EntityQuery::from_tool_arguments(args.clone())
        .map(|_| ())
        .map_err(|e| vec![e.to_string()])
}

fn find_output_schema() -> Value {
    json!({
        "type": "object",
        "required": ["domain", "total_matched", "truncated", "entities", "missing_data"],
        "properties": {
            "domain": {"type": "string"},
            "total_matched": {"type": "integer", "minimum": 0},
            "truncated": {"type": "boolean"},
            "entities": {"type": "array", "items": {
                "type": "object", "required": ["entity_id", "name"],
                "properties": {"entity_id": {"type": "string"}, "name": {"type": "string"}}
            }},
            "missing_data": {"type": "array", "items": {"type": "string"}}
        }
    })
}

/// Evidence of an entity match: `content` is one `id<TAB>name` line per
/// entity (hashed by the store), `source` the domain's data source.
pub fn entity_evidence(
    domain: EarthDomain,
    title: &str,
    items: &[(&str, &str)],
    metadata: Value,
) -> NewEvidence {
    let mut content = String::with_capacity(items.len() * 40);
    for (id, name) in items {
        content.push_str(id);
        content.push('\t');
        content.push_str(name);
        content.push('\n');
    }
    NewEvidence {
        step_id: None,
        evidence_type: EvidenceType::EntityMatch,
        source: format!("earth_entities:{}", domain.as_str()),
        title: title.to_string(),
        url: None,
        content,
        metadata,
    }
}

/// The `earth.find_entities` output for a query and its result: compact
/// entities (id, name, country, coordinates), counts and notes, plus one
/// entity_match evidence. Shared by the tool and the deterministic resolver
/// so both record the same step shape.
pub fn find_output(q: &EntityQuery, r: &EntityQueryResult) -> ToolOutput {
    let entities: Vec<Value> = r
        .entities
        .iter()
        .map(|e| {
            let mut m = Map::new();
            m.insert("entity_id".into(), json!(e.entity_id));
            m.insert("name".into(), json!(e.name));
            if let Some(c) = &e.country {
                m.insert("country".into(), json!(c));
            }
            if let (Some(lat), Some(lon)) = (e.lat, e.lon) {
                m.insert("lat".into(), json!((lat * 1e4).round() / 1e4));
                m.insert("lon".into(), json!((lon * 1e4).round() / 1e4));
            }
            Value::Object(m)
        })
        .collect();
    let filters = serde_json::to_value(&q.filters).unwrap_or_default();
    let items: Vec<(&str, &str)> = r
        .entities
        .iter()
        .map(|e| (e.entity_id.as_str(), e.name.as_str()))
        .collect();
    let evidence = entity_evidence(
        q.domain,
        &format!(
            "{} matching {}: {} of {}",
            q.domain.as_str(),
            filters,
            r.entities.len(),
            r.total_matched
        ),
        &items,
        json!({"domain": q.domain, "filters": filters, "limit": q.limit,
               "total_matched": r.total_matched, "truncated": r.truncated}),
    );
    ToolOutput {
        value: json!({
            "domain": q.domain,
            "total_matched": r.total_matched,
            "truncated": r.truncated,
            "entities": entities,
            "missing_data": r.missing_data,
        }),
        evidence: vec![evidence],
        missing_data: r.missing_data.clone(),
        follow_up: None,
    }
}

async fn web_search(ctx: &ToolContext, args: &Value) -> Result<ToolOutput, String> {
    let query = args
        .get("query")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let limit = args.get("limit").and_then(Value::as_u64).unwrap_or(5) as usize;
    if !ctx.web.is_configured() {
        return Ok(ToolOutput {
            value: json!({"configured": false, "results": [], "missing_data": [NOT_CONFIGURED_NOTE]}),
            missing_data: vec![NOT_CONFIGURED_NOTE.to_string()],
            ..Default::default()
        });
    }
    let results = ctx.web.search(query, limit).await?;
    let evidence = results
        .iter()
        .map(|r| NewEvidence {
            step_id: None,
            evidence_type: EvidenceType::WebSearch,
            source: "web_search".into(),
            title: r.title.clone(),
            url: Some(r.url.clone()),
            content: r.snippet.clone(),
            metadata: json!({"query": query}),
        })
        .collect();
    Ok(ToolOutput {
        value: json!({"configured": true, "results": results}),
        evidence,
        ..Default::default()
    })
}

fn propose_input_schema() -> Value {
    json!({
        "type": "object", "additionalProperties": false,
        "required": ["proposal_type", "target", "changes", "rationale"],
        "properties": {
            "proposal_type": {"type": "string", "enum": ["datasource_config", "ai_prompt", "external_integration"]},
            "target": {"type": "object"},
            "changes": {"type": "object", "minProperties": 1},
            "rationale": {"type": "string", "minLength": 1, "maxLength": 4000},
            "risk_level": {"type": "string", "enum": ["low", "medium", "high"]}
        }
    })
}

/// The value in force for a target when the settings table has no row: the
/// current prompt text for `ai_prompt`, `{}` otherwise.
pub fn fallback_current(
    prompts: &PromptRegistry,
    draft_type: shared_protocol::agent::ProposalType,
    target: &Value,
) -> Value {
    use shared_protocol::agent::ProposalType;
    match draft_type {
        ProposalType::AiPrompt => match policy::target_key(draft_type, target) {
            Some(k) if crate::prompts::default_text(&k).is_some() => {
                json!({"text": prompts.get(&k)})
            }
            _ => json!({}),
        },
        _ => json!({}),
    }
}

async fn propose_config(ctx: &ToolContext, args: Value) -> Result<ToolOutput, String> {
    let draft: ProposalDraft =
        serde_json::from_value(args).map_err(|e| format!("arguments: {e}"))?;
    let run_id = ctx
        .run_id
        .ok_or("proposal tools run only inside an agent run")?;
    let fallback = fallback_current(&ctx.prompts, draft.proposal_type, &draft.target);
    let d = draft.clone();
    let p = ctx
        .store
        .db()
        .write(move |conn| proposals::create_sync(conn, run_id, &d, &fallback))
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?;
    ctx.store.publish(crate::events::AgentEvent::proposal(
        &p,
        true,
        &ctx.principal.name,
    ));
    if p.status == shared_protocol::agent::ProposalStatus::Rejected {
        return Err(format!(
            "proposal {} rejected by policy: {}",
            p.id,
            p.error.clone().unwrap_or_default()
        ));
    }
    Ok(ToolOutput {
        value: json!({"proposal_id": p.id, "status": p.status, "risk_level": p.risk_level}),
        follow_up: (p.risk_level == shared_protocol::agent::ProposalRiskLevel::Low)
            .then_some(FollowUp::AutoApply { proposal_id: p.id }),
        ..Default::default()
    })
}

/// What a `datasource_config` proposal loads before its setting is
/// written: the spec and its fetched features (`None` when disabled).
type PreparedSource = (DatasourceSpec, Option<GeoLayerData>);

/// Reads and fetches the source a `datasource_config` value names.
/// Errors: one sentence (bad spec, fetch or parse failure).
async fn prepare_source(
    ctx: &ToolContext,
    key: &str,
    value: &Value,
) -> Result<PreparedSource, String> {
    let mut spec = DatasourceSpec::from_setting(key, value)?;
    if !spec.enabled {
        return Ok((spec, None));
    }
    let full = spec.timeout;
    spec.timeout = full.min(ctx.sources.apply_fetch_limit());
    let data = spec.fetch().await?;
    spec.timeout = full;
    Ok((spec, Some(data)))
}

async fn apply_setting(ctx: &ToolContext, args: &Value) -> Result<ToolOutput, String> {
    let id = args
        .get("proposal_id")
        .and_then(Value::as_i64)
        .unwrap_or_default();
    let mode = match args.get("mode").and_then(Value::as_str) {
        Some("auto") => policy::ApplyMode::Auto,
        _ => policy::ApplyMode::Manual,
    };
    let p = ctx
        .store
        .get_proposal(id)
        .await
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("proposal {id} not found"))?;
    let fallback = fallback_current(&ctx.prompts, p.proposal_type, &p.target);
    let by = ctx.principal.name.clone();
    let role = ctx.principal.role;
    let key = policy::target_key(p.proposal_type, &p.target).unwrap_or_default();
    // A datasource is fetched before its setting is written, under the
    // sources' lock: one that cannot be loaded fails the proposal and
    // leaves setting and catalog as they were.
    let is_source = p.proposal_type == shared_protocol::agent::ProposalType::DatasourceConfig;
    let _sources_guard = if is_source {
        Some(ctx.sources.lock().await)
    } else {
        None
    };
    let mut prepared = None;
    let loadable = is_source
        && matches!(
            p.status,
            shared_protocol::agent::ProposalStatus::Pending
                | shared_protocol::agent::ProposalStatus::Approved
        )
        && !policy::assess_proposal(
            p.proposal_type,
            &p.target,
            &p.before_payload,
            &p.after_payload,
            Some(p.risk_level),
        )
        .must_reject();
    let applied = if loadable {
        match prepare_source(ctx, &key, &p.after_payload).await {
            Ok(ready) => {
                prepared = Some(ready);
                None
            }
            Err(error) => Some(
                ctx.store
                    .db()
                    .write(move |conn| proposals::fail_sync(conn, id, role, mode, &error))
                    .await
                    .map_err(|e| e.to_string())?,
            ),
        }
    } else {
        None
    };
    let applied = match applied {
        Some(Ok(failed)) => Err(ApplyError::Failed(Box::new(failed))),
        Some(Err(e)) => Err(e),
        None => ctx
            .store
            .db()
            .write(move |conn| proposals::apply_sync(conn, id, &by, role, mode, &fallback))
            .await
            .map_err(|e| e.to_string())?,
    };
    // Applied, or saved as rejected/failed with its error: either way the
    // proposal changed (a proposal not found or not pending did not).
    if matches!(
        applied,
        Ok(_) | Err(ApplyError::Rejected(_)) | Err(ApplyError::Failed(_))
    ) {
        ctx.store
            .publish_proposal(id, false, &ctx.principal.name)
            .await;
    }
    match applied {
        Ok(p) => {
            use shared_protocol::agent::ProposalType;
            match p.proposal_type {
                ProposalType::AiPrompt => {
                    if let Some(text) = p.after_payload.get("text").and_then(Value::as_str) {
                        ctx.prompts
                            .set_override(&key, text)
                            .map_err(|e| e.to_string())?;
                    }
                }
                ProposalType::DatasourceConfig => {
                    if let Some((spec, data)) = prepared {
                        ctx.sources.install(spec, data).await;
                    }
                }
                ProposalType::ExternalIntegration => {
                    ctx.integrations.apply(&key, &p.after_payload)?;
                }
            }
            Ok(ToolOutput::value(json!({"proposal": p})))
        }
        Err(ApplyError::Rejected(p)) | Err(ApplyError::Failed(p)) => {
            Err(serde_json::to_string(&json!({
                "proposal_id": p.id, "status": p.status, "error": p.error
            }))
            .unwrap_or_default())
        }
        Err(e) => Err(e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WebSearchConfig;
    use registry_core::db::Db;
    use shared_protocol::api::Role;

    fn ctx(role: Role, mode: ToolMode, dir: &tempfile::TempDir) -> ToolContext {
        let db = Db::open(&dir.path().join("t.db"), |c| crate::store::migrate(c)).unwrap();
        let web = Arc::new(WebSearch::new(&WebSearchConfig::default()));
        let shared = Arc::new(crate::earth::geo::SharedCatalog::new(Arc::new(
            EntityCatalog::default(),
        )));
        ToolContext {
            catalog: Arc::new(EntityCatalog::default()),
            sources: Arc::new(EarthSources::new(shared, Duration::from_secs(5))),
            integrations: Integrations {
                model: Arc::new(crate::model::ModelGateway::new(&Default::default())),
                speech: Arc::new(crate::speech::SpeechGateway::new(&Default::default())),
                web: Arc::clone(&web),
            },
            store: Store::new(db),
            web,
            prompts: Arc::new(PromptRegistry::new(&Default::default()).unwrap()),
            principal: Principal {
                name: "t".into(),
                role,
            },
            run_id: Some(1),
            mode,
        }
    }

    fn slow_registry(timeout_ms: u64) -> ToolRegistry {
        let mut r = ToolRegistry::standard(Duration::from_millis(timeout_ms)).unwrap();
        let schema = json!({"type": "object"});
        r.register_blocking(
            descriptor(
                "test.slow_sync",
                "sleeps",
                schema.clone(),
                schema.clone(),
                "viewer",
                SideEffectLevel::Read,
            ),
            None,
            Arc::new(|_: &ToolContext, _| {
                std::thread::sleep(Duration::from_millis(400));
                Ok(ToolOutput::value(json!({})))
            }),
        )
        .unwrap();
        r.register_async(
            descriptor(
                "test.slow_async",
                "sleeps",
                schema.clone(),
                schema,
                "viewer",
                SideEffectLevel::Read,
            ),
            None,
            Arc::new(
                |_: ToolContext, _| -> BoxFuture<'static, Result<ToolOutput, String>> {
                    Box::pin(async {
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        Ok(ToolOutput::value(json!({})))
                    })
                },
            ),
        )
        .unwrap();
        r
    }

    #[tokio::test]
    async fn slow_tools_time_out_sync_and_async() {
        let dir = tempfile::tempdir().unwrap();
        let r = slow_registry(50);
        let c = ctx(Role::Viewer, ToolMode::Run, &dir);
        for name in ["test.slow_sync", "test.slow_async"] {
            let e = r.execute(&c, name, json!({})).await.unwrap_err();
            assert_eq!(
                e,
                ToolError::TimedOut {
                    tool: name.into(),
                    ms: 50
                }
            );
        }
    }

    #[tokio::test]
    async fn refusals_name_the_tool_and_the_reason() {
        let dir = tempfile::tempdir().unwrap();
        let r = ToolRegistry::standard(Duration::from_secs(5)).unwrap();
        let viewer = ctx(Role::Viewer, ToolMode::Run, &dir);
        assert!(matches!(
            r.execute(&viewer, "shell.exec", json!({})).await,
            Err(ToolError::Unregistered { .. })
        ));
        assert!(matches!(
            r.execute(&viewer, FIND_ENTITIES, json!({"domain": "weather"}))
                .await,
            Err(ToolError::InvalidArguments { .. })
        ));
        let e = r
            .execute(&viewer, PROPOSE_CONFIG, json!({"proposal_type": "ai_prompt",
                "target": {"prompt_key": "agents.roles.bgp"}, "changes": {"text": "x"}, "rationale": "r"}))
            .await
            .unwrap_err();
        assert!(matches!(e, ToolError::Denied { .. }), "{e}");
        let admin = ctx(Role::Admin, ToolMode::Run, &dir);
        let e = r
            .execute(
                &admin,
                APPLY_SETTING,
                json!({"proposal_id": 1, "mode": "manual"}),
            )
            .await
            .unwrap_err();
        assert!(e.to_string().contains("write tools run only"), "{e}");
        let out = r.execute(&viewer, LIST_DOMAINS, json!({})).await.unwrap();
        assert_eq!(out.value["domains"].as_array().unwrap().len(), 6);
    }
}
