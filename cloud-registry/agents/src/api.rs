//! HTTP routes of the agent runtime, relative to `/api/v1/agents`
//! (docs/earth-command.md, "Endpoints"). Handlers are thin: authenticate, check the
//! role, call [`AgentService`], map errors to the JSON error body.
//!
//! | method | path | body → answer |
//! |---|---|---|
//! | POST | `/runs` | `CreateRunRequest` → 201 `AgentRunDetail` |
//! | GET | `/runs?run_type=&status=&created_by=&before_id=&limit=` | `{"runs": [AgentRun]}` |
//! | GET | `/runs/{run_id}` | `AgentRunDetail` |
//! | POST | `/runs/{run_id}/stop` | `AgentRunDetail` (409 `run_already_final`) |
//! | GET | `/proposals?status=&limit=` | `{"proposals": [AgentProposal]}` |
//! | POST | `/proposals/{proposal_id}/apply` | `{"confirm": bool}` → `AgentProposal` |
//! | POST | `/proposals/{proposal_id}/reject` | `{"reason": "..."}` → `AgentProposal` |
//! | POST | `/earth/command` | `EarthCommandRequest` → `EarthCommandResponse` |
//! | GET | `/earth/stats` | entity catalog load figures |
//! | POST | `/speech/transcriptions` | multipart `file`, `language`, `provider`, `source` → `SpeechTranscriptionResponse` |
//! | GET | `/prompts` | `{"prompts": [PromptEntry]}` |
//! | GET | `/tools` | `{"tools": [ToolDescriptor]}` |
//!
//! [`geo_router`] serves the map layers under `/api/v1/visualization/geo`:
//! `GET /{layer}?at=` → GeoJSON FeatureCollection (docs/earth-command.md,
//! "Layers").

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, Multipart, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::Json;
use chrono::Utc;
use registry_core::auth::Principal;
use registry_core::error::{ApiError, ApiResult};
use registry_core::extract::{list_limit, ApiQuery, ValidJson};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shared_protocol::agent::ToolDescriptor;
use shared_protocol::agent::{
    AgentProposal, AgentRun, AgentRunDetail, CreateRunRequest, ProposalStatus, RunStatus, RunType,
};
use shared_protocol::api::{ErrorBody, Role};
use shared_protocol::earth::{EarthCommandRequest, EarthCommandResponse};
use shared_protocol::speech::SpeechTranscriptionResponse;
use shared_protocol::Validate;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::earth::entities::Layer;
use crate::earth::geo::{layer_time, LayerCache};
use crate::error::AgentError;
use crate::policy::ApplyRefusal;
use crate::prompts::PromptEntry;
use crate::service::AgentService;
use crate::speech::{AudioUpload, SpeechError};
use crate::store::{AudioInfo, RunFilter, StoreError, TranscriptionRecord};

/// Roles that may read runs and use the Earth command (every role but
/// `provider`).
const READERS: [Role; 4] = [Role::Viewer, Role::Operator, Role::AuditAgent, Role::Admin];
/// Default and largest page of `GET /runs`.
const DEFAULT_LIST: usize = 50;
const MAX_LIST: usize = 500;
/// Extra multipart overhead allowed over the audio limit, bytes.
const MULTIPART_SLACK: usize = 1024 * 1024;

/// The agent routes, relative to `/api/v1/agents`. Needs an
/// `Extension(Arc<Authenticator>)` layer (for [`Principal`]).
pub fn router(svc: Arc<AgentService>) -> OpenApiRouter {
    let audio_limit = svc.config().speech.max_audio_bytes() + MULTIPART_SLACK;
    // Its own router so that the larger body limit applies to it alone.
    let speech = OpenApiRouter::new()
        .routes(routes!(transcribe))
        .layer(DefaultBodyLimit::max(audio_limit));
    OpenApiRouter::new()
        .routes(routes!(create_run, list_runs))
        .routes(routes!(get_run))
        .routes(routes!(stop_run))
        .routes(routes!(list_proposals))
        .routes(routes!(apply_proposal))
        .routes(routes!(reject_proposal))
        .routes(routes!(earth_command))
        .routes(routes!(earth_stats))
        .merge(speech)
        .routes(routes!(list_prompts))
        .routes(routes!(list_tools))
        .with_state(svc)
}

/// `GET /proposals` answer (for the OpenAPI document).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct ProposalList {
    proposals: Vec<AgentProposal>,
}

/// `GET /prompts` answer (for the OpenAPI document): `{key, text, source,
/// default_text}` rows.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct PromptList {
    prompts: Vec<serde_json::Map<String, Value>>,
}

/// `GET /tools` answer (for the OpenAPI document).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct ToolList {
    tools: Vec<ToolDescriptor>,
}

/// The multipart body of `POST /speech/transcriptions` (for the OpenAPI
/// document).
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct TranscriptionUpload {
    /// The audio.
    #[schema(value_type = String, format = Binary)]
    file: Vec<u8>,
    /// Default the configured language (`zh`).
    language: Option<String>,
    /// Must name the configured provider.
    provider: Option<String>,
    /// Default `earth_command`.
    source: Option<String>,
}

/// The map layer routes, relative to `/api/v1/visualization/geo`:
/// `GET /{layer}` for every [`Layer`] (`satellites`, `compute-centers`,
/// `cables`, `landing-points`, `bgp-events`, `vessels`, `news`). Same
/// roles as the Earth command; needs the same `Extension(Arc<Authenticator>)`
/// layer as [`router`].
pub fn geo_router(svc: Arc<AgentService>) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(geo_layer))
        .with_state(svc)
}

/// The HTTP form of an agent error: one status and code per variant.
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
            AgentError::Speech(SpeechError::Audio(_)) => {
                ApiError::new(StatusCode::UNSUPPORTED_MEDIA_TYPE, "unsupported_audio", msg)
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

fn request_id(headers: &HeaderMap) -> Option<String> {
    headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(|s| s.chars().take(128).collect())
}

/// Start an agent run.
#[utoipa::path(post, path = "/runs", tag = "agents",
    params(("X-Request-Id" = Option<String>, Header, description = "Kept with the run (first 128 characters)")),
    request_body = CreateRunRequest,
    responses(
        (status = 201, body = AgentRunDetail),
        (status = 503, description = "`model_not_configured`", body = ErrorBody),
    ))]
async fn create_run(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    headers: HeaderMap,
    ValidJson(req): ValidJson<CreateRunRequest>,
) -> ApiResult<(StatusCode, Json<AgentRunDetail>)> {
    match req.run_type {
        RunType::EarthCommand => principal.require(&READERS)?,
        RunType::ConfigProposal => principal.require(&[Role::Admin])?,
        _ => principal.require(&[Role::Operator, Role::AuditAgent, Role::Admin])?,
    }
    let detail = svc
        .create_run(&principal, req, request_id(&headers))
        .await?;
    Ok((StatusCode::CREATED, Json(detail)))
}

/// `GET /runs` query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct RunListQuery {
    #[param(value_type = Option<RunType>)]
    pub run_type: Option<String>,
    #[param(value_type = Option<RunStatus>)]
    pub status: Option<String>,
    pub created_by: Option<String>,
    pub before_id: Option<i64>,
    pub limit: Option<usize>,
}

/// `GET /runs` answer.
#[derive(Debug, Serialize, Deserialize, utoipa::ToSchema)]
pub struct RunList {
    pub runs: Vec<AgentRun>,
}

/// Agent runs, newest first.
#[utoipa::path(get, path = "/runs", tag = "agents",
    params(RunListQuery),
    responses(
        (status = 200, body = RunList),
        (status = 422, description = "`invalid_field`: an unknown `run_type` or `status`", body = ErrorBody),
    ))]
async fn list_runs(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    ApiQuery(q): ApiQuery<RunListQuery>,
) -> ApiResult<Json<RunList>> {
    principal.require(&READERS)?;
    let run_type = q
        .run_type
        .as_deref()
        .map(str::parse::<RunType>)
        .transpose()
        .map_err(|e| ApiError::invalid_field("run_type", e.to_string()))?;
    let status = q
        .status
        .as_deref()
        .map(str::parse::<RunStatus>)
        .transpose()
        .map_err(|e| ApiError::invalid_field("status", e.to_string()))?;
    let runs = svc
        .store()
        .list_runs(RunFilter {
            run_type,
            status,
            created_by: q.created_by,
            before_id: q.before_id,
            limit: list_limit(q.limit, DEFAULT_LIST, MAX_LIST)?,
        })
        .await
        .map_err(AgentError::from)?;
    Ok(Json(RunList { runs }))
}

/// One run with its steps, evidence and proposals.
#[utoipa::path(get, path = "/runs/{run_id}", tag = "agents",
    params(("run_id" = String, Path)),
    responses(
        (status = 200, body = AgentRunDetail),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn get_run(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    Path(run_id): Path<String>,
) -> ApiResult<Json<AgentRunDetail>> {
    principal.require(&READERS)?;
    Ok(Json(svc.run_detail(&run_id).await?))
}

/// Stop a run.
#[utoipa::path(post, path = "/runs/{run_id}/stop", tag = "agents",
    params(("run_id" = String, Path)),
    responses(
        (status = 200, body = AgentRunDetail),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`run_already_final`", body = ErrorBody),
    ))]
async fn stop_run(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    Path(run_id): Path<String>,
) -> ApiResult<Json<AgentRunDetail>> {
    principal.require(&[Role::Viewer, Role::Operator, Role::AuditAgent, Role::Admin])?;
    Ok(Json(svc.stop_run(&principal, &run_id).await?))
}

/// `GET /proposals` query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct ProposalListQuery {
    #[param(value_type = Option<ProposalStatus>)]
    pub status: Option<String>,
    pub limit: Option<usize>,
}

/// Agent proposals (admin).
#[utoipa::path(get, path = "/proposals", tag = "agents",
    params(ProposalListQuery),
    responses(
        (status = 200, body = ProposalList),
        (status = 422, description = "`invalid_field`: an unknown `status`", body = ErrorBody),
    ))]
async fn list_proposals(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    ApiQuery(q): ApiQuery<ProposalListQuery>,
) -> ApiResult<Json<Value>> {
    principal.require(&[Role::Admin])?;
    let status = q
        .status
        .as_deref()
        .map(str::parse::<ProposalStatus>)
        .transpose()
        .map_err(|e| ApiError::invalid_field("status", e.to_string()))?;
    let proposals = svc
        .store()
        .list_proposals(status, list_limit(q.limit, DEFAULT_LIST, MAX_LIST)?)
        .await
        .map_err(AgentError::from)?;
    Ok(Json(json!({"proposals": proposals})))
}

/// `POST /proposals/{id}/apply` body; an empty body means
/// `{"confirm": false}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ApplyProposalRequest {
    /// Explicit manual confirmation (admins must confirm; high risk always
    /// needs it: docs/earth-command.md, "Proposal policy").
    #[serde(default)]
    pub confirm: bool,
}

impl Validate for ApplyProposalRequest {
    fn validate(&self) -> Result<(), shared_protocol::ValidationError> {
        Ok(())
    }
}

/// `POST /proposals/{id}/reject` body.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RejectProposalRequest {
    #[serde(default)]
    pub reason: String,
}

impl Validate for RejectProposalRequest {
    fn validate(&self) -> Result<(), shared_protocol::ValidationError> {
        if self.reason.chars().count() > 2000 {
            return Err(shared_protocol::ValidationError::new(
                "reason",
                "longer than 2000 characters",
            ));
        }
        Ok(())
    }
}

fn optional_body<T: serde::de::DeserializeOwned + Validate + Default>(
    body: &Bytes,
) -> ApiResult<T> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    Ok(shared_protocol::parse_json(body)?)
}

/// The `{proposal_id}` of a proposal route, named so that a value that is
/// not an integer is refused naming it (400 `invalid_path`).
#[derive(Deserialize)]
struct ProposalPath {
    proposal_id: i64,
}

/// Apply a pending proposal (body optional: `{"confirm": false}`).
#[utoipa::path(post, path = "/proposals/{proposal_id}/apply", tag = "agents",
    params(("proposal_id" = i64, Path)),
    request_body(content = Option<ApplyProposalRequest>, description = "Optional"),
    responses(
        (status = 200, body = AgentProposal),
        (status = 403, description = "`forbidden` or `confirmation_required`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`proposal_not_pending` or `proposal_apply_failed`", body = ErrorBody),
        (status = 422, description = "`invalid_field` or `proposal_rejected`", body = ErrorBody),
    ))]
async fn apply_proposal(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    Path(ProposalPath { proposal_id }): Path<ProposalPath>,
    body: Bytes,
) -> ApiResult<Json<AgentProposal>> {
    let req: ApplyProposalRequest = optional_body(&body)?;
    Ok(Json(
        svc.apply_proposal(&principal, proposal_id, req.confirm)
            .await?,
    ))
}

/// Reject a pending proposal (body optional).
#[utoipa::path(post, path = "/proposals/{proposal_id}/reject", tag = "agents",
    params(("proposal_id" = i64, Path)),
    request_body(content = Option<RejectProposalRequest>, description = "Optional"),
    responses(
        (status = 200, body = AgentProposal),
        (status = 403, description = "`forbidden` or `confirmation_required`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`proposal_not_pending` or `proposal_apply_failed`", body = ErrorBody),
    ))]
async fn reject_proposal(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    Path(ProposalPath { proposal_id }): Path<ProposalPath>,
    body: Bytes,
) -> ApiResult<Json<AgentProposal>> {
    let req: RejectProposalRequest = optional_body(&body)?;
    Ok(Json(
        svc.reject_proposal(&principal, proposal_id, req.reason)
            .await?,
    ))
}

/// Run an Earth command.
#[utoipa::path(post, path = "/earth/command", tag = "earth",
    params(("X-Request-Id" = Option<String>, Header, description = "Kept with the run")),
    request_body = EarthCommandRequest,
    responses(
        (status = 200, body = EarthCommandResponse),
        (status = 404, description = "`not_found`: e.g. an unknown `transcription_id`", body = ErrorBody),
        (status = 409, description = "`run_stopped`", body = ErrorBody),
        (status = 503, description = "`model_not_configured`", body = ErrorBody),
    ))]
async fn earth_command(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    headers: HeaderMap,
    ValidJson(req): ValidJson<EarthCommandRequest>,
) -> ApiResult<Json<EarthCommandResponse>> {
    principal.require(&READERS)?;
    Ok(Json(
        svc.earth_command(&principal, req, request_id(&headers))
            .await?,
    ))
}

/// The Earth entity catalog's load figures.
#[utoipa::path(get, path = "/earth/stats", tag = "earth",
    responses((status = 200, body = serde_json::Value)))]
async fn earth_stats(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
) -> ApiResult<Json<Value>> {
    principal.require(&READERS)?;
    Ok(Json(json!(svc.catalog().stats())))
}

/// `GET /visualization/geo/{layer}` query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
pub struct LayerQuery {
    /// RFC 3339 time the satellites are positioned at; default now.
    pub at: Option<String>,
}

/// Furthest `?at=` may lie from the registry's clock (days). SGP4's work
/// grows with the distance from a TLE's epoch, and positions decades away
/// mean nothing.
pub const MAX_AT_DISTANCE_DAYS: i64 = 3653;

/// Parses `?at=`: RFC 3339 (a `+` offset that arrived as a space is
/// accepted), within [`MAX_AT_DISTANCE_DAYS`] of now. Errors: 400
/// `invalid_query` naming `at`.
fn parse_at(raw: &str) -> ApiResult<chrono::DateTime<Utc>> {
    let t = raw.trim().replace(' ', "+");
    let at = chrono::DateTime::parse_from_rfc3339(&t)
        .map(|d| d.with_timezone(&Utc))
        .map_err(|e| {
            ApiError::invalid_query(
                "at",
                format!(
                    "expected an RFC 3339 time such as 2026-12-02T05:00:00Z, got `{raw}` ({e})"
                ),
            )
        })?;
    let distance = (at - Utc::now()).num_days().abs();
    if distance > MAX_AT_DISTANCE_DAYS {
        return Err(ApiError::invalid_query(
            "at",
            format!(
                "`{raw}` is {distance} days from now; satellites are placed at most {MAX_AT_DISTANCE_DAYS} days (10 years) either side of the registry's clock"
            ),
        ));
    }
    Ok(at)
}

/// One map layer as GeoJSON (`application/geo+json`) with an ETag.
/// `If-None-Match` with the current ETag answers 304 without a body.
/// `Cache-Control`: `private, max-age=1` for satellites at the current time,
/// `private, no-cache` (revalidate with the ETag) otherwise. Errors: 404 for
/// an unknown layer, 400 for a bad `at`, 403 for providers.
#[utoipa::path(get, path = "/{layer}", tag = "earth",
    params(
        ("layer" = String, Path, description = "`satellites`, `compute-centers`, `cables`, `landing-points`, `bgp-events`, `vessels` or `news`"),
        LayerQuery,
        ("If-None-Match" = Option<String>, Header, description = "An ETag from an earlier answer"),
    ),
    responses(
        (status = 200, description = "A GeoJSON FeatureCollection", content_type = "application/geo+json", body = serde_json::Value,
            headers(("ETag" = String), ("Cache-Control" = String))),
        (status = 304, description = "Not modified since the given ETag"),
        (status = 404, description = "`not_found`: no such layer (`details.layers`)", body = ErrorBody),
    ))]
async fn geo_layer(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    Path(layer): Path<String>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<LayerQuery>,
) -> ApiResult<axum::response::Response> {
    use axum::http::header;
    use axum::response::IntoResponse;

    principal.require(&READERS)?;
    let Some(layer) = Layer::from_path(&layer) else {
        let known: Vec<&str> = Layer::ALL.iter().map(|l| l.as_str()).collect();
        return Err(ApiError::not_found("layer", &layer)
            .with_details(json!({"layer": layer, "layers": known})));
    };
    let explicit = q.at.as_deref().map(parse_at).transpose()?;
    let at = layer_time(explicit.unwrap_or_else(Utc::now));
    let catalog = svc.catalog();
    let cache_control = if layer.is_timed() && explicit.is_none() {
        "private, max-age=1"
    } else {
        "private, no-cache"
    };
    let etag = LayerCache::etag(&catalog, layer, at);
    let matches = headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| {
            let t = t.trim();
            t == "*" || t.trim_start_matches("W/") == etag
        });
    if matches {
        return Ok((
            StatusCode::NOT_MODIFIED,
            [
                (header::ETAG, etag),
                (header::CACHE_CONTROL, cache_control.to_string()),
            ],
        )
            .into_response());
    }
    let built = svc.layers().get(catalog, layer, at).await?;
    Ok((
        [
            (header::CONTENT_TYPE, "application/geo+json".to_string()),
            (header::ETAG, built.etag),
            (header::CACHE_CONTROL, cache_control.to_string()),
        ],
        built.body,
    )
        .into_response())
}

/// The agent prompts and their overrides.
#[utoipa::path(get, path = "/prompts", tag = "agents",
    responses((status = 200, body = PromptList)))]
async fn list_prompts(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
) -> ApiResult<Json<Value>> {
    principal.require(&READERS)?;
    let prompts: Vec<PromptEntry> = svc.prompts().list();
    Ok(Json(json!({"prompts": prompts})))
}

/// The agent tools.
#[utoipa::path(get, path = "/tools", tag = "agents",
    responses((status = 200, body = ToolList)))]
async fn list_tools(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
) -> ApiResult<Json<Value>> {
    principal.require(&READERS)?;
    Ok(Json(json!({"tools": svc.tools().descriptors()})))
}

fn multipart_error(e: axum::extract::multipart::MultipartError) -> ApiError {
    let status = e.status();
    if status == StatusCode::PAYLOAD_TOO_LARGE {
        ApiError::new(status, "audio_too_large", e.body_text())
    } else {
        ApiError::bad_request(format!("malformed multipart body: {}", e.body_text()))
    }
}

fn check_word(field: &str, v: &str, max: usize) -> ApiResult<()> {
    if v.is_empty()
        || v.len() > max
        || !v
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-'))
    {
        return Err(ApiError::invalid_field(
            field,
            format!("`{v}` must be 1 to {max} letters, digits, _ or -"),
        ));
    }
    Ok(())
}

/// `POST /speech/transcriptions`: multipart `file` (required), `language`
/// (default the configured one, `zh`), `provider` (must name the configured
/// provider), `source` (default `earth_command`). The transcription is
/// stored; its id is `metadata.transcription_id`, which an Earth command
/// passes as `transcription_id`.
#[utoipa::path(post, path = "/speech/transcriptions", tag = "speech",
    request_body(content = TranscriptionUpload, content_type = "multipart/form-data"),
    responses(
        (status = 200, body = SpeechTranscriptionResponse),
        (status = 413, description = "`audio_too_large`", body = ErrorBody),
        (status = 422, description = "`invalid_field`: no `file`, an empty one, or a bad `language`, `provider` or `source`", body = ErrorBody),
        (status = 502, description = "`asr_provider_error`", body = ErrorBody),
        (status = 503, description = "`asr_not_configured`", body = ErrorBody),
        (status = 504, description = "`asr_timeout`", body = ErrorBody),
    ))]
async fn transcribe(
    State(svc): State<Arc<AgentService>>,
    principal: Principal,
    mut multipart: Multipart,
) -> ApiResult<Json<SpeechTranscriptionResponse>> {
    principal.require(&READERS)?;
    if !svc.speech().is_configured() {
        return Err(AgentError::Speech(SpeechError::NotConfigured).into());
    }
    let cfg = svc.speech().config().clone();
    let limit = cfg.max_audio_bytes();
    let mut audio: Option<(Vec<u8>, Option<String>, Option<String>)> = None;
    let mut too_large: Option<usize> = None;
    let mut language = cfg.language.clone();
    let mut provider: Option<String> = None;
    let mut source = "earth_command".to_string();
    while let Some(mut field) = multipart.next_field().await.map_err(multipart_error)? {
        let name = field.name().unwrap_or_default().to_string();
        match name.as_str() {
            "file" => {
                let file_name = field.file_name().map(str::to_string);
                let content_type = field.content_type().map(str::to_string);
                let mut buf: Vec<u8> = Vec::new();
                let mut size = 0usize;
                while let Some(chunk) = field.chunk().await.map_err(multipart_error)? {
                    size += chunk.len();
                    // Keep reading (and discarding) past the limit so the
                    // client receives the 413 instead of a reset connection.
                    if size <= limit {
                        buf.extend_from_slice(&chunk);
                    }
                }
                if size > limit {
                    too_large = Some(size);
                }
                audio = Some((buf, file_name, content_type));
            }
            "language" => {
                let v = field
                    .text()
                    .await
                    .map_err(multipart_error)?
                    .trim()
                    .to_string();
                if !v.is_empty() {
                    check_word("language", &v, 16)?;
                    language = v;
                }
            }
            "provider" => {
                let v = field
                    .text()
                    .await
                    .map_err(multipart_error)?
                    .trim()
                    .to_string();
                if !v.is_empty() {
                    provider = Some(v);
                }
            }
            "source" => {
                let v = field
                    .text()
                    .await
                    .map_err(multipart_error)?
                    .trim()
                    .to_string();
                if !v.is_empty() {
                    check_word("source", &v, 64)?;
                    source = v;
                }
            }
            _ => {}
        }
    }
    if let Some(size) = too_large {
        return Err(AgentError::Speech(SpeechError::TooLarge { size, limit }).into());
    }
    let (bytes, file_name, content_type) = audio.ok_or_else(|| {
        ApiError::invalid_field(
            "file",
            "the multipart field `file` with the audio is required",
        )
    })?;
    if bytes.is_empty() {
        return Err(ApiError::invalid_field("file", "the audio file is empty"));
    }
    if let Some(p) = &provider {
        if p != cfg.provider.as_str() {
            return Err(ApiError::invalid_field(
                "provider",
                format!(
                    "provider `{p}` is not configured; the configured provider is `{}`",
                    cfg.provider.as_str()
                ),
            ));
        }
    }
    let sha256 = hex::encode(Sha256::digest(&bytes));
    let size_bytes = bytes.len() as u64;
    let upload = AudioUpload {
        bytes: bytes.into(),
        file_name: file_name.clone(),
        content_type: content_type.clone(),
    };
    let t = svc
        .speech()
        .transcribe(upload, &language)
        .await
        .map_err(AgentError::from)?;
    let transcription_id = format!("tr_{}", uuid::Uuid::new_v4().simple());
    let mut metadata = t.metadata.clone();
    metadata.insert("transcription_id".into(), json!(transcription_id));
    metadata.insert(
        "language".into(),
        json!(t.language.clone().unwrap_or_else(|| language.clone())),
    );
    metadata.insert("requested_language".into(), json!(language));
    metadata.insert("source".into(), json!(source));
    metadata.insert("request_ms".into(), json!(t.request_ms));
    metadata.insert("audio_bytes".into(), json!(size_bytes));
    let record = TranscriptionRecord {
        transcription_id: transcription_id.clone(),
        text: t.text.clone(),
        language: language.clone(),
        provider: cfg.provider.as_str().to_string(),
        model: cfg.model.clone(),
        source,
        duration_ms: t.audio_duration_ms,
        confidence: t.confidence,
        metadata: Value::Object(metadata.clone()),
        audio: AudioInfo {
            file_name,
            content_type,
            size_bytes,
            sha256,
        },
        created_by: principal.name.clone(),
        created_at: Utc::now(),
    };
    svc.store()
        .insert_transcription(record)
        .await
        .map_err(AgentError::from)?;
    Ok(Json(SpeechTranscriptionResponse {
        text: t.text,
        provider: cfg.provider.as_str().to_string(),
        model: cfg.model,
        duration_ms: t.audio_duration_ms,
        confidence: t.confidence,
        metadata,
    }))
}
