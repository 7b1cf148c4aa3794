//! `POST /api/v1/agents/earth/command` (docs/earth-command.md, "An Earth command"): one
//! command becomes one `earth_command` run with its steps:
//!
//! 1. `transcription` — when the command came from speech
//!    (`transcription_id`), the stored transcription, with its evidence;
//! 2. `llm` and `tool` steps — the model loop when a model is configured;
//!    otherwise (or when the model fails) the deterministic resolver's
//!    `earth.find_entities` queries, each a `tool` step with `entity_match`
//!    evidence;
//! 3. `policy` — the plan passes the safety rules ([`super::validate`]);
//! 4. `action` — the validated action plan returned to the Earth client.

use chrono::Utc;
use registry_core::auth::Principal;
use serde_json::{json, Value};
use shared_protocol::agent::{CreateRunRequest, EvidenceType, RunStatus, RunType, StepType};
use shared_protocol::earth::{
    EarthAction, EarthCommandRequest, EarthCommandResponse, EarthCommandSource, EarthDomain,
    HighlightMode, HighlightStyle, MatchedEntity, ResultPanelItem,
};

use super::entities::{EntityQuery, EntityQueryResult};
use super::resolver::{self, Interpretation, Lang, PlanLimits, ResolvedPlan, PROBE_ORDER};
use super::validate::{self, ValidationLimits};
use crate::error::AgentError;
use crate::prompts;
use crate::runtime::{LoopOutcome, LoopSpec, RunHandle, Runtime, ToolRecord};
use crate::store::{NewEvidence, NewRun, NewStep, RunFinish, StoreError, TranscriptionRecord};
use crate::tools::{self, ToolMode, FIND_ENTITIES, GET_ENTITY, LIST_DOMAINS, WEB_SEARCH};
use crate::websearch::NOT_CONFIGURED_NOTE;

/// Tools an Earth command's model may use: reads only, no proposals.
pub const EARTH_TOOLS: [&str; 4] = [FIND_ENTITIES, GET_ENTITY, LIST_DOMAINS, WEB_SEARCH];

/// Most `missing_data` lines in a response.
const MAX_MISSING: usize = 50;
/// Most `matched_entities` in a response.
const MAX_MATCHED: usize = 1000;

/// Where the plan came from (recorded in the policy step).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PlanSource {
    Model,
    Deterministic,
    /// The model failed; the resolver answered.
    Fallback,
    /// The model failed and the tool budget was spent: the last
    /// `earth.find_entities` result of the model's own calls.
    PartialFromTools,
}

impl PlanSource {
    fn as_str(self) -> &'static str {
        match self {
            PlanSource::Model => "model",
            PlanSource::Deterministic => "deterministic",
            PlanSource::Fallback => "deterministic_fallback",
            PlanSource::PartialFromTools => "partial_from_tool_results",
        }
    }
}

/// A plan before validation.
struct Candidate {
    source: PlanSource,
    plan: ResolvedPlan,
}

/// `POST /runs` with `run_type: earth_command`: the command is
/// `input.input_text` (else `objective`), with optional `input.source`,
/// `input.transcription_id`, `input.client_context`.
pub fn request_from_run(req: &CreateRunRequest) -> Result<EarthCommandRequest, AgentError> {
    let mut body = req.input.as_object().cloned().unwrap_or_default();
    if !body.contains_key("input_text") {
        body.insert("input_text".into(), json!(req.objective));
    }
    if !body.contains_key("source") {
        body.insert("source".into(), json!("text"));
    }
    shared_protocol::parse_value::<EarthCommandRequest>(Value::Object(body)).map_err(|e| {
        AgentError::Invalid {
            field: format!("input.{}", e.field().unwrap_or("")),
            message: e.to_string(),
        }
    })
}

fn title_of(text: &str) -> String {
    let t = text.trim();
    if t.is_empty() {
        return "(empty command)".into();
    }
    let mut s: String = t.chars().take(80).collect();
    if t.chars().count() > 80 {
        s.push('…');
    }
    s
}

/// Run one Earth command on `rt` and persist it as a run. Errors: an
/// unknown `transcription_id` (not found), the run being stopped meanwhile
/// (conflict), store failures.
pub(crate) async fn run(
    rt: &Runtime,
    principal: &Principal,
    req: EarthCommandRequest,
    request_id: Option<String>,
) -> Result<EarthCommandResponse, AgentError> {
    EarthCommand { rt }.run(principal, req, request_id).await
}

/// One Earth command being run, on the run engine.
struct EarthCommand<'a> {
    rt: &'a Runtime,
}

impl EarthCommand<'_> {
    async fn run(
        &self,
        principal: &Principal,
        req: EarthCommandRequest,
        request_id: Option<String>,
    ) -> Result<EarthCommandResponse, AgentError> {
        let transcription = match &req.transcription_id {
            Some(id) => Some(self.rt.store.get_transcription(id).await?.ok_or_else(|| {
                AgentError::NotFound {
                    kind: "transcription",
                    id: id.clone(),
                }
            })?),
            None => None,
        };
        let text = match (&transcription, req.input_text.trim().is_empty()) {
            (Some(t), true) => t.text.clone(),
            _ => req.input_text.clone(),
        };
        let interp = resolver::interpret(&text);
        let use_model = self.rt.model.is_configured();
        let run = self
            .rt
            .store
            .create_run(NewRun {
                run_type: RunType::EarthCommand,
                status: RunStatus::Running,
                title: title_of(&text),
                objective: text.clone(),
                input: json!({
                    "input_text": req.input_text,
                    "source": req.source,
                    "transcription_id": req.transcription_id,
                    "client_context": req.client_context,
                }),
                context: json!({
                    "locale": req.client_context.locale,
                    "visible_layers": req.client_context.visible_layers,
                    "language": interp.lang,
                    "planner": if use_model { "model" } else { "deterministic" },
                    "interpretation": interp,
                }),
                provider: use_model.then(|| self.rt.model.provider()),
                model: if use_model {
                    self.rt.model.model()
                } else {
                    None
                },
                request_id,
                created_by: principal.name.clone(),
            })
            .await?;
        let (cancel, _guard) = self.rt.active.register(run.id);
        let mut h = RunHandle::new(run, cancel);
        match self
            .earth_command_steps(&mut h, principal, &req, &text, &interp, transcription)
            .await
        {
            Err(AgentError::Store(StoreError::RunFinal { run_id, .. })) => {
                Err(AgentError::RunStopped(run_id))
            }
            Err(e @ AgentError::RunStopped(_)) => Err(e),
            Err(e) => {
                // Leave no run "running" behind a failed request.
                let finish = RunFinish {
                    status: RunStatus::Failed,
                    result_markdown: None,
                    result_json: None,
                    error: Some(e.to_string()),
                };
                if let Err(se) = self.rt.store.finish_run(h.run.id, Vec::new(), finish).await {
                    tracing::warn!(run_id = %h.run.public_id, error = %se, "cannot mark the failed run");
                }
                Err(e)
            }
            ok => ok,
        }
    }

    async fn earth_command_steps(
        &self,
        h: &mut RunHandle,
        principal: &Principal,
        req: &EarthCommandRequest,
        text: &str,
        interp: &Interpretation,
        transcription: Option<TranscriptionRecord>,
    ) -> Result<EarthCommandResponse, AgentError> {
        if let Some(t) = transcription {
            self.record_transcription_step(h, &t, req.source).await?;
        }
        let ctx = self
            .rt
            .tool_context(principal, Some(h.run.id), ToolMode::Run);
        let limits = PlanLimits {
            max_highlight: self.rt.config.limits.max_highlight_entities,
            panel_items: self.rt.config.limits.result_panel_items,
        };
        let mut run_error: Option<String> = None;

        let candidate = if self.rt.model.is_configured() {
            let spec = LoopSpec {
                system: format!(
                    "{}\n\n{}",
                    self.rt.prompts.get(prompts::RUNTIME_SYSTEM),
                    self.rt.prompts.get(prompts::EARTH_COMMAND)
                ),
                user: earth_user_message(text, req, interp),
                allowed_tools: Some(EARTH_TOOLS.to_vec()),
            };
            let result = self.rt.model_loop(h, &ctx, &spec).await?;
            match result.outcome {
                LoopOutcome::Final(f) => Candidate {
                    source: PlanSource::Model,
                    plan: plan_from_final(&f, interp.lang),
                },
                LoopOutcome::Stopped => {
                    return Err(AgentError::RunStopped(h.run.public_id.clone()))
                }
                other => {
                    let why = other.describe();
                    h.note(why.clone());
                    run_error = Some(why);
                    self.fallback_plan(h, &ctx, interp, limits, &result.tool_records)
                        .await?
                }
            }
        } else {
            Candidate {
                source: PlanSource::Deterministic,
                plan: self.resolve_deterministic(h, &ctx, interp, limits).await?,
            }
        };

        if h.is_stopped() {
            return Err(AgentError::RunStopped(h.run.public_id.clone()));
        }
        self.finish_earth_command(h, interp, candidate, run_error)
            .await
    }

    async fn record_transcription_step(
        &self,
        h: &mut RunHandle,
        t: &TranscriptionRecord,
        source: EarthCommandSource,
    ) -> Result<(), AgentError> {
        let started = Utc::now();
        let evidence = NewEvidence {
            step_id: None,
            evidence_type: EvidenceType::Transcription,
            source: format!("asr:{}:{}", t.provider, t.model),
            title: format!("speech transcription {}", t.transcription_id),
            url: None,
            content: t.text.clone(),
            metadata: json!({"audio": t.audio, "language": t.language, "duration_ms": t.duration_ms,
                             "confidence": t.confidence}),
        };
        let step = NewStep::finished(
            StepType::Transcription,
            "speech.transcription",
            json!({"transcription_id": t.transcription_id, "source": source}),
            started,
            Ok(json!({
                "text": t.text, "provider": t.provider, "model": t.model, "language": t.language,
                "duration_ms": t.duration_ms, "confidence": t.confidence, "created_at": t.created_at,
            })),
        );
        self.rt
            .store
            .append_step_with_evidence(h.run.id, step, vec![evidence])
            .await?;
        Ok(())
    }

    /// Run one entity query on the blocking pool and record it as an
    /// `earth.find_entities` tool step with its evidence.
    async fn recorded_find(
        &self,
        h: &mut RunHandle,
        q: EntityQuery,
    ) -> Result<(EntityQuery, EntityQueryResult), AgentError> {
        h.tool_steps += 1;
        let started = Utc::now();
        let catalog = self.rt.catalog.current();
        let q2 = q.clone();
        let r = tokio::task::spawn_blocking(move || catalog.find(&q2))
            .await
            .map_err(|e| AgentError::Internal(format!("entity query task died: {e}")))?;
        let out = tools::find_output(&q, &r);
        for n in &out.missing_data {
            h.note(n.clone());
        }
        let input = json!({"tool": FIND_ENTITIES, "arguments": serde_json::to_value(&q).unwrap_or_default()});
        let step = NewStep::finished(StepType::Tool, FIND_ENTITIES, input, started, Ok(out.value));
        self.rt
            .store
            .append_step_with_evidence(h.run.id, step, out.evidence)
            .await?;
        Ok((q, r))
    }

    /// The deterministic plan: the resolver's queries (or name probes), each
    /// a recorded tool step, then [`resolver::build_plan`].
    async fn resolve_deterministic(
        &self,
        h: &mut RunHandle,
        _ctx: &tools::ToolContext,
        interp: &Interpretation,
        limits: PlanLimits,
    ) -> Result<ResolvedPlan, AgentError> {
        let budget = self
            .rt
            .config
            .limits
            .max_tool_steps
            .saturating_sub(h.tool_steps) as usize;
        let mut results = Vec::new();
        if interp.probe {
            for d in PROBE_ORDER.iter().take(budget) {
                let (q, r) = self
                    .recorded_find(h, resolver::probe_query(interp, *d, limits.max_highlight))
                    .await?;
                let hit = r.total_matched > 0;
                results.push((q, r));
                if hit {
                    break;
                }
            }
        } else {
            for q in resolver::queries(interp, limits.max_highlight)
                .into_iter()
                .take(budget)
            {
                results.push(self.recorded_find(h, q).await?);
            }
        }
        let mut plan = resolver::build_plan(interp, &results, limits);
        let wants_news = results.iter().any(|(q, _)| q.domain == EarthDomain::News);
        if wants_news && !self.rt.web.is_configured() {
            plan.missing_data.push(NOT_CONFIGURED_NOTE.to_string());
        }
        Ok(plan)
    }

    /// After a model failure: the resolver when it understood the command and
    /// tool steps remain; else the model's last successful entity query;
    /// else a clarification.
    async fn fallback_plan(
        &self,
        h: &mut RunHandle,
        ctx: &tools::ToolContext,
        interp: &Interpretation,
        limits: PlanLimits,
        records: &[ToolRecord],
    ) -> Result<Candidate, AgentError> {
        let needed = if interp.probe {
            1
        } else {
            resolver::queries(interp, limits.max_highlight).len()
        };
        let remaining = self
            .rt
            .config
            .limits
            .max_tool_steps
            .saturating_sub(h.tool_steps) as usize;
        if interp.is_actionable() && needed <= remaining {
            let plan = self.resolve_deterministic(h, ctx, interp, limits).await?;
            if !plan.clarification_needed {
                return Ok(Candidate {
                    source: PlanSource::Fallback,
                    plan,
                });
            }
        }
        if let Some(out) = records
            .iter()
            .rev()
            .filter(|r| r.name == FIND_ENTITIES)
            .find_map(|r| r.output.as_ref())
        {
            if let Some(plan) = plan_from_find_output(out, interp.lang, limits) {
                return Ok(Candidate {
                    source: PlanSource::PartialFromTools,
                    plan,
                });
            }
        }
        Ok(Candidate {
            source: PlanSource::Fallback,
            plan: resolver::clarification(interp.lang),
        })
    }

    /// Validate (policy step), record the action step, finish the run.
    async fn finish_earth_command(
        &self,
        h: &mut RunHandle,
        interp: &Interpretation,
        candidate: Candidate,
        run_error: Option<String>,
    ) -> Result<EarthCommandResponse, AgentError> {
        let lang = interp.lang;
        let started = Utc::now();
        let Candidate { source, mut plan } = candidate;
        let n_in = plan.actions.len();
        let vlimits = ValidationLimits {
            max_highlight: self.rt.config.limits.max_highlight_entities,
            max_panel_items: self.rt.config.limits.result_panel_items,
        };
        let fallback_title = match lang {
            Lang::Zh => "地球指令结果",
            Lang::En => "Earth command results",
        };
        let catalog = self.rt.catalog.current();
        let resolver_matched = std::mem::take(&mut plan.matched_entities);
        let actions = std::mem::take(&mut plan.actions);
        let (validated, matched) = tokio::task::spawn_blocking(move || {
            let v = validate::validate_actions(actions, &catalog, vlimits, fallback_title);
            let matched = matched_for(&v.actions, resolver_matched, &catalog);
            (v, matched)
        })
        .await
        .map_err(|e| AgentError::Internal(format!("plan validation task died: {e}")))?;

        let mut missing: Vec<String> = Vec::new();
        let mut add = |n: &str| {
            if let Some(t) = validate::safe_text(n, 500) {
                if !missing.contains(&t) && missing.len() < MAX_MISSING {
                    missing.push(t);
                }
            }
        };
        for n in &plan.missing_data {
            add(n);
        }
        for n in &h.missing {
            add(n);
        }
        for n in &validated.notes {
            add(n);
        }

        let clarification = plan.clarification_needed;
        let mut actions = if clarification {
            Vec::new()
        } else {
            validated.actions.clone()
        };
        let mut summary = validate::safe_text(&plan.summary, 1000)
            .filter(|s| lang != Lang::Zh || resolver::detect_lang(s) == Lang::Zh)
            .unwrap_or_else(|| generated_summary(&actions, lang));
        let mut confidence = plan.confidence.clamp(0.0, 1.0);
        if !validated.rejected_ids.is_empty() {
            confidence = confidence.min(0.5);
        }
        if !clarification && n_in > 0 && actions.is_empty() {
            summary = match lang {
                Lang::Zh => "操作计划未通过安全校验，已全部丢弃。".into(),
                Lang::En => "The action plan failed the safety checks and was dropped.".into(),
            };
            confidence = 0.0;
        }
        if clarification {
            confidence = confidence.min(0.3);
            actions.clear();
        }

        let policy_step = NewStep::finished(
            StepType::Policy,
            "earth.plan_validation",
            json!({"plan_source": source.as_str(), "actions": n_in}),
            started,
            Ok(json!({
                "accepted_actions": validated.actions.len(),
                "dropped_actions": validated.dropped_actions,
                "rejected_entity_ids": validated.rejected_ids.iter().take(50).collect::<Vec<_>>(),
                "rejected_entity_id_count": validated.rejected_ids.len(),
                "notes": validated.notes,
            })),
        );
        let action_step = NewStep::finished(
            StepType::Action,
            "earth.action_plan",
            json!({"summary": summary}),
            Utc::now(),
            Ok(json!({"actions": actions, "clarification_needed": clarification})),
        );
        let mut evidence = Vec::new();
        if source != PlanSource::Deterministic && !matched.is_empty() {
            // The tool steps carry the model's queries; this records what the
            // validated plan finally points at.
            let items: Vec<(&str, &str)> = matched
                .iter()
                .map(|e| (e.entity_id.as_str(), e.name.as_str()))
                .collect();
            let domain = matched[0].domain;
            evidence.push(tools::entity_evidence(
                domain,
                &format!("entities in the validated plan: {}", items.len()),
                &items,
                json!({"plan_source": source.as_str()}),
            ));
        }
        let response = EarthCommandResponse {
            run_id: h.run.public_id.clone(),
            summary: summary.clone(),
            actions,
            matched_entities: matched,
            confidence,
            missing_data: missing,
            clarification_needed: clarification,
        };
        let mut md = summary.clone();
        for n in &response.missing_data {
            md.push_str(&format!("\n- {n}"));
        }
        self.rt
            .store
            .finish_run(
                h.run.id,
                vec![(policy_step, Vec::new()), (action_step, evidence)],
                RunFinish {
                    status: RunStatus::Completed,
                    result_markdown: Some(md),
                    result_json: Some(stored_result(&response)),
                    error: run_error,
                },
            )
            .await?;
        Ok(response)
    }
}

/// The response as stored in `result_json`: complete, except that matched
/// entities keep only id, domain and name (their full records are one
/// `earth.get_entity` away, and a 500-satellite answer would otherwise store
/// every orbital element again).
fn stored_result(response: &EarthCommandResponse) -> Value {
    let mut v = serde_json::to_value(response).unwrap_or_default();
    v["matched_entities"] = Value::Array(
        response
            .matched_entities
            .iter()
            .map(|e| json!({"entity_id": e.entity_id, "domain": e.domain, "name": e.name}))
            .collect(),
    );
    v
}

/// The user message of an Earth command's model loop.
fn earth_user_message(text: &str, req: &EarthCommandRequest, interp: &Interpretation) -> String {
    let mut ctx = json!({
        "command": text,
        "language": interp.lang,
        "locale": req.client_context.locale,
        "visible_layers": req.client_context.visible_layers,
    });
    if interp.is_actionable() {
        ctx["keyword_hint"] = json!({
            "verb": interp.verb,
            "domains": interp.domains,
            "region": interp.region,
        });
    }
    format!(
        "Earth command from the operator:\n{text}\n\nContext (JSON):\n{}",
        serde_json::to_string_pretty(&ctx).unwrap_or_default()
    )
}

/// A model's final answer as a plan candidate: `result.actions` parsed (the
/// ones that are not allowed actions dropped with notes), plus
/// `confidence`, `missing_data`, `clarification_needed`.
fn plan_from_final(f: &shared_protocol::agent::FinalAnswer, lang: Lang) -> ResolvedPlan {
    let r = &f.result;
    let mut notes = Vec::new();
    let raw: Vec<Value> = r
        .get("actions")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let actions = validate::parse_actions(&raw, &mut notes);
    let mut missing: Vec<String> = r
        .get("missing_data")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    missing.extend(notes);
    let clarification = r
        .get("clarification_needed")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let confidence = r
        .get("confidence")
        .and_then(Value::as_f64)
        .filter(|c| c.is_finite())
        .unwrap_or(0.7);
    let summary = if f.summary.trim().is_empty() && clarification {
        resolver::clarification(lang).summary
    } else {
        f.summary.clone()
    };
    ResolvedPlan {
        summary,
        actions,
        matched_entities: Vec::new(),
        missing_data: missing,
        confidence,
        clarification_needed: clarification,
    }
}

/// A partial plan from an `earth.find_entities` output the model obtained:
/// show the layer, highlight the returned ids, open the panel.
fn plan_from_find_output(out: &Value, lang: Lang, limits: PlanLimits) -> Option<ResolvedPlan> {
    let domain: EarthDomain = serde_json::from_value(out.get("domain")?.clone()).ok()?;
    let entities = out.get("entities")?.as_array()?;
    if entities.is_empty() {
        return None;
    }
    let ids: Vec<String> = entities
        .iter()
        .filter_map(|e| e.get("entity_id").and_then(Value::as_str))
        .take(limits.max_highlight)
        .map(str::to_string)
        .collect();
    let items: Vec<ResultPanelItem> = entities
        .iter()
        .take(limits.panel_items)
        .filter_map(|e| {
            Some(ResultPanelItem {
                entity_id: e.get("entity_id")?.as_str()?.to_string(),
                label: e.get("name")?.as_str()?.to_string(),
                subtitle: e.get("country").and_then(Value::as_str).map(str::to_string),
            })
        })
        .collect();
    let n = ids.len();
    let (summary, title) = match lang {
        Lang::Zh => (
            format!("模型未完成；已按其最后一次查询结果高亮 {n} 个对象。"),
            format!("部分结果（{n}）"),
        ),
        Lang::En => (
            format!("The model did not finish; highlighted the {n} entities of its last query."),
            format!("Partial results ({n})"),
        ),
    };
    Some(ResolvedPlan {
        summary,
        actions: vec![
            EarthAction::ShowLayer {
                layer: domain,
                enabled: true,
            },
            EarthAction::HighlightEntities {
                domain,
                entity_ids: ids,
                style: Some(HighlightStyle {
                    color: resolver::domain_color(domain).to_string(),
                    mode: Some(HighlightMode::Glow),
                }),
                reason: None,
            },
            EarthAction::OpenResultPanel { title, items },
        ],
        matched_entities: Vec::new(),
        missing_data: Vec::new(),
        confidence: 0.4,
        clarification_needed: false,
    })
}

/// The entities the validated plan points at: those it highlights or
/// focuses on, and those its filters select (so that a filter's count and
/// its `matched_entities` agree), from the resolver's matches when it made
/// the plan, else looked up in the catalog. At most [`MAX_MATCHED`].
fn matched_for(
    actions: &[EarthAction],
    resolver_matched: Vec<MatchedEntity>,
    catalog: &super::entities::EntityCatalog,
) -> Vec<MatchedEntity> {
    let mut out: Vec<MatchedEntity> = Vec::new();
    let mut seen = std::collections::HashSet::new();
    // The resolver's order (name, then id), for a filter's matches.
    let resolver_order: Vec<(String, EarthDomain)> = resolver_matched
        .iter()
        .map(|e| (e.entity_id.clone(), e.domain))
        .collect();
    let mut by_id: std::collections::HashMap<String, MatchedEntity> = resolver_matched
        .into_iter()
        .map(|e| (e.entity_id.clone(), e))
        .collect();
    for a in actions {
        let ids: Vec<String> = match a {
            EarthAction::HighlightEntities { entity_ids, .. } => entity_ids.clone(),
            EarthAction::FocusView {
                entity_id: Some(id),
                ..
            } => vec![id.clone()],
            EarthAction::FilterEntities {
                domain, filters, ..
            } => {
                let from_resolver: Vec<String> = resolver_order
                    .iter()
                    .filter(|(_, d)| d == domain)
                    .map(|(id, _)| id.clone())
                    .collect();
                if from_resolver.is_empty() {
                    filter_matches(catalog, *domain, filters, MAX_MATCHED - out.len())
                        .into_iter()
                        .map(|e| {
                            let id = e.entity_id.clone();
                            by_id.entry(id.clone()).or_insert(e);
                            id
                        })
                        .collect()
                } else {
                    from_resolver
                }
            }
            _ => continue,
        };
        for id in ids {
            if out.len() >= MAX_MATCHED {
                return out;
            }
            if !seen.insert(id.clone()) {
                continue;
            }
            if let Some(e) = by_id.remove(id.as_str()) {
                out.push(e);
            } else if let Some(e) = catalog.get(&id) {
                out.push(e);
            }
        }
    }
    out
}

/// The first `limit` entities a validated `filter_entities` selects (none
/// when its filters do not form a query, which validation has ruled out).
fn filter_matches(
    catalog: &super::entities::EntityCatalog,
    domain: EarthDomain,
    filters: &serde_json::Map<String, Value>,
    limit: usize,
) -> Vec<MatchedEntity> {
    let limit = limit.min(super::entities::MAX_LIMIT);
    let q = json!({"domain": domain, "filters": filters, "limit": limit});
    match EntityQuery::from_tool_arguments(q) {
        Ok(q) => catalog.find(&q).entities,
        Err(_) => Vec::new(),
    }
}

/// A summary made from the actions, for model summaries that are unsafe or
/// in the wrong language.
fn generated_summary(actions: &[EarthAction], lang: Lang) -> String {
    let highlighted: usize = actions
        .iter()
        .map(|a| match a {
            EarthAction::HighlightEntities { entity_ids, .. } => entity_ids.len(),
            _ => 0,
        })
        .sum();
    match (lang, highlighted) {
        (Lang::Zh, 0) => format!("已生成 {} 个地球操作。", actions.len()),
        (Lang::Zh, n) => format!("已高亮 {n} 个对象。"),
        (Lang::En, 0) => format!("Prepared {} Earth actions.", actions.len()),
        (Lang::En, n) => format!("Highlighted {n} entities."),
    }
}
