//! HTTP handlers of the audit-task protocol (paths relative to `/api/v1`):
//!
//! | method | path | body → answer |
//! |---|---|---|
//! | POST | `/audit-requests` | `AuditTaskRequest` → 201 `AuditRequestRecord` |
//! | GET | `/audit-requests?status&audit_type&project_id&priority_min&priority_max&order&limit&offset` | → `AuditRequestPage` |
//! | GET | `/audit-requests/{id}` | → `AuditRequestRecord` |
//! | POST | `/audit-requests/claim` | `ClaimRequest` → 200 `ClaimedTask` or 204 |
//! | POST | `/audit-requests/{id}/extend` | `ExtendRequest` (optional) → `ExtendedClaim` |
//! | POST | `/audit-requests/{id}/release` | `ReleaseRequest` (optional) → `AuditRequestRecord` |
//! | POST | `/audit-requests/{id}/cancel` | `ReleaseRequest` (optional) → `AuditRequestRecord` |
//! | POST | `/audit-requests/{id}/result` | `AuditTaskResult` → `AuditRequestRecord` |
//! | GET | `/audit-requests/{id}/result` | → `AuditTaskResult` |
//! | POST | `/threads` | `ThreadRegistration` → 201 (new) / 200 (updated) `ThreadRecord` |
//! | GET | `/threads?node_id&role&label` | → `{"threads": [...]}` |
//! | GET | `/threads/{thread_ref}` | → `ThreadRecord` |
//! | POST | `/threads/{thread_ref}/messages` | `MessagePost` → 201 `ThreadMessage` |
//! | GET | `/threads/{thread_ref}/messages?after&limit` | → `{"messages": [...], "next_after"}` |
//!
//! Every handler authenticates with `Principal` (the router needs the
//! `Extension(Arc<Authenticator>)` layer); errors are the JSON error body.
//! Bodies are held to the text and list limits of [`super::limits`]
//! (422 `invalid_field` naming the field).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::json;
use shared_protocol::api::ErrorBody;
use shared_protocol::audit::{AuditRequestStatus, AuditTaskRequest, AuditTaskResult, AuditType};
use shared_protocol::Validate;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::AuditError;
use super::model::{
    AuditRequestFilter, AuditRequestPage, AuditRequestRecord, ClaimRequest, ExtendRequest,
    ExtendedClaim, ListOrder, MessagePost, ReleaseRequest, ThreadFilter, ThreadMessage,
    ThreadRecord, ThreadRegistration,
};
use super::service::AuditService;
use crate::api::{parse_one, ApiQuery};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::ValidJson;

type Svc = State<Arc<AuditService>>;

/// The audit-task and thread routes, relative to `/api/v1` (mount with
/// `.nest("/api/v1", audit::router(svc))`).
pub fn router(svc: Arc<AuditService>) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(create, list))
        .routes(routes!(claim))
        .routes(routes!(get_one))
        .routes(routes!(extend))
        .routes(routes!(release))
        .routes(routes!(cancel))
        .routes(routes!(post_result, get_result))
        .routes(routes!(register_thread, list_threads))
        .routes(routes!(get_thread))
        .routes(routes!(post_message, list_messages))
        .with_state(svc)
}

/// Answer of `GET /threads`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct ThreadList {
    threads: Vec<ThreadRecord>,
}

/// Answer of `GET /threads/{thread_ref}/messages`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct MessageList {
    messages: Vec<ThreadMessage>,
    /// Pass as `after` for the next page.
    next_after: u64,
}

/// A body that may be empty (then `T::default()`), else JSON parsed and
/// validated like [`ValidJson`].
fn optional_body<T: DeserializeOwned + Validate + Default>(body: &Bytes) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    crate::extract::parse_object(body)
}

/// Create an audit task.
#[utoipa::path(post, path = "/audit-requests", tag = "audit",
    request_body = AuditTaskRequest,
    responses(
        (status = 201, body = AuditRequestRecord),
        (status = 404, description = "`not_found` or `no_matching_capability`", body = ErrorBody),
        (status = 409, description = "`duplicate_audit_request`", body = ErrorBody),
        (status = 422, description = "`invalid_field` or `unsatisfiable_requirement`", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
    ))]
async fn create(
    State(svc): Svc,
    who: Principal,
    ValidJson(req): ValidJson<AuditTaskRequest>,
) -> ApiResult<(StatusCode, Json<AuditRequestRecord>)> {
    super::limits::check(&req)?;
    let record = svc.create(&who, req).await?;
    Ok((StatusCode::CREATED, Json(record)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    #[param(value_type = Option<AuditRequestStatus>)]
    status: Option<String>,
    #[param(value_type = Option<AuditType>)]
    audit_type: Option<String>,
    project_id: Option<String>,
    priority_min: Option<u8>,
    priority_max: Option<u8>,
    /// `queue` (default) or `newest`.
    #[param(pattern = "^(queue|newest)?$")]
    order: Option<String>,
    limit: Option<u32>,
    offset: Option<u32>,
}

/// Audit tasks, a page at a time.
#[utoipa::path(get, path = "/audit-requests", tag = "audit",
    params(ListQuery),
    responses((status = 200, body = AuditRequestPage)))]
async fn list(
    State(svc): Svc,
    who: Principal,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<AuditRequestPage>> {
    let order = match q.order.as_deref() {
        None | Some("") | Some("queue") => ListOrder::Queue,
        Some("newest") => ListOrder::Newest,
        Some(other) => {
            return Err(ApiError::invalid_query(
                "order",
                format!("unknown value `{other}`, expected one of: queue, newest"),
            ))
        }
    };
    // A query problem like any other: 400 naming the parameter (the
    // service's own check answers 422 for a body field).
    if let (Some(lo), Some(hi)) = (q.priority_min, q.priority_max) {
        if lo > hi {
            return Err(ApiError::invalid_query(
                "priority_min",
                format!("{lo} is above priority_max {hi}"),
            ));
        }
    }
    let filter = AuditRequestFilter {
        status: parse_one::<AuditRequestStatus>("status", q.status.as_deref())?,
        audit_type: parse_one::<AuditType>("audit_type", q.audit_type.as_deref())?,
        project_id: q.project_id.filter(|p| !p.is_empty()),
        priority_min: q.priority_min,
        priority_max: q.priority_max,
        order,
        limit: q.limit.unwrap_or(0),
        offset: q.offset.unwrap_or(0),
    };
    Ok(Json(svc.list(&who, filter).await?))
}

/// One audit task.
#[utoipa::path(get, path = "/audit-requests/{audit_request_id}", tag = "audit",
    params(("audit_request_id" = String, Path)),
    responses(
        (status = 200, body = AuditRequestRecord),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn get_one(
    State(svc): Svc,
    who: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<AuditRequestRecord>> {
    Ok(Json(svc.get(&who, &id).await?))
}

/// 200 with a `ClaimedTask`, or 204 when nothing was claimable within
/// `wait_ms`.
#[utoipa::path(post, path = "/audit-requests/claim", tag = "audit",
    request_body = ClaimRequest,
    responses(
        (status = 200, description = "A claimed task", body = super::model::ClaimedTask),
        (status = 204, description = "Nothing claimable within `wait_ms`"),
        (status = 503, description = "`unavailable` or `capability_offline` from the lease engine", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
    ))]
async fn claim(
    State(svc): Svc,
    who: Principal,
    ValidJson(req): ValidJson<ClaimRequest>,
) -> ApiResult<Response> {
    Ok(match svc.claim(&who, req).await? {
        Some(task) => Json(task).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

/// Extend a claim (body optional).
#[utoipa::path(post, path = "/audit-requests/{audit_request_id}/extend", tag = "audit",
    params(("audit_request_id" = String, Path)),
    request_body(content = Option<ExtendRequest>, description = "Optional"),
    responses(
        (status = 200, body = ExtendedClaim),
        (status = 403, description = "`not_claim_holder` or `forbidden`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`claim_expired`, `claim_ended`, `not_claimed` or `not_queued`", body = ErrorBody),
    ))]
async fn extend(
    State(svc): Svc,
    who: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<ExtendedClaim>> {
    let req: ExtendRequest = optional_body(&body)?;
    Ok(Json(svc.extend(&who, &id, req).await?))
}

/// Give a claimed task back to the queue (body optional).
#[utoipa::path(post, path = "/audit-requests/{audit_request_id}/release", tag = "audit",
    params(("audit_request_id" = String, Path)),
    request_body(content = Option<ReleaseRequest>, description = "Optional"),
    responses(
        (status = 200, body = AuditRequestRecord),
        (status = 403, description = "`not_claim_holder` or `forbidden`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`claim_expired`, `claim_ended`, `not_claimed` or `not_queued`", body = ErrorBody),
    ))]
async fn release(
    State(svc): Svc,
    who: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<AuditRequestRecord>> {
    let req: ReleaseRequest = optional_body(&body)?;
    Ok(Json(svc.release(&who, &id, req).await?))
}

/// Cancel a task (body optional).
#[utoipa::path(post, path = "/audit-requests/{audit_request_id}/cancel", tag = "audit",
    params(("audit_request_id" = String, Path)),
    request_body(content = Option<ReleaseRequest>, description = "Optional"),
    responses(
        (status = 200, body = AuditRequestRecord),
        (status = 403, description = "`not_claim_holder` or `forbidden`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`claim_expired`, `claim_ended`, `not_claimed` or `not_queued`", body = ErrorBody),
    ))]
async fn cancel(
    State(svc): Svc,
    who: Principal,
    Path(id): Path<String>,
    body: Bytes,
) -> ApiResult<Json<AuditRequestRecord>> {
    let req: ReleaseRequest = optional_body(&body)?;
    Ok(Json(svc.cancel(&who, &id, req).await?))
}

/// Submit the result of a claimed task.
#[utoipa::path(post, path = "/audit-requests/{audit_request_id}/result", tag = "audit",
    params(("audit_request_id" = String, Path)),
    request_body = AuditTaskResult,
    responses(
        (status = 200, body = AuditRequestRecord),
        (status = 403, description = "`not_claim_holder` or `forbidden`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`claim_expired`, `claim_ended`, `not_claimed` or `not_queued`", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
    ))]
async fn post_result(
    State(svc): Svc,
    who: Principal,
    Path(id): Path<String>,
    ValidJson(result): ValidJson<AuditTaskResult>,
) -> ApiResult<Json<AuditRequestRecord>> {
    super::limits::check(&result)?;
    Ok(Json(svc.submit_result(&who, &id, result).await?))
}

/// A finished task's result.
#[utoipa::path(get, path = "/audit-requests/{audit_request_id}/result", tag = "audit",
    params(("audit_request_id" = String, Path)),
    responses(
        (status = 200, body = AuditTaskResult),
        (status = 404, description = "`not_found` or `no_result`", body = ErrorBody),
    ))]
async fn get_result(
    State(svc): Svc,
    who: Principal,
    Path(id): Path<String>,
) -> ApiResult<Json<AuditTaskResult>> {
    Ok(Json(svc.result(&who, &id).await?))
}

/// Register (or refresh) an agent thread.
#[utoipa::path(post, path = "/threads", tag = "audit",
    request_body = ThreadRegistration,
    responses(
        (status = 200, description = "Already registered", body = ThreadRecord),
        (status = 201, description = "Registered", body = ThreadRecord),
        (status = 409, description = "A conflict with the stored thread", body = ErrorBody),
    ))]
async fn register_thread(
    State(svc): Svc,
    who: Principal,
    ValidJson(reg): ValidJson<ThreadRegistration>,
) -> ApiResult<(StatusCode, Json<ThreadRecord>)> {
    super::limits::check(&reg)?;
    let (record, created) = svc.register_thread(&who, reg).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(record)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ThreadQuery {
    node_id: Option<String>,
    role: Option<String>,
    label: Option<String>,
}

/// Agent threads.
#[utoipa::path(get, path = "/threads", tag = "audit",
    params(ThreadQuery),
    responses((status = 200, body = ThreadList)))]
async fn list_threads(
    State(svc): Svc,
    who: Principal,
    ApiQuery(q): ApiQuery<ThreadQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let filter = ThreadFilter {
        node_id: q.node_id.filter(|s| !s.is_empty()),
        role: q.role.filter(|s| !s.is_empty()),
        label: q.label.filter(|s| !s.is_empty()),
    };
    let threads = svc.threads(&who, filter).await?;
    Ok(Json(json!({ "threads": threads })))
}

/// One agent thread.
#[utoipa::path(get, path = "/threads/{thread_ref}", tag = "audit",
    params(("thread_ref" = String, Path)),
    responses(
        (status = 200, body = ThreadRecord),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn get_thread(
    State(svc): Svc,
    who: Principal,
    Path(thread_ref): Path<String>,
) -> ApiResult<Json<ThreadRecord>> {
    Ok(Json(svc.thread(&who, &thread_ref).await?))
}

/// Post a message to a thread.
#[utoipa::path(post, path = "/threads/{thread_ref}/messages", tag = "audit",
    params(("thread_ref" = String, Path)),
    request_body = MessagePost,
    responses(
        (status = 201, body = ThreadMessage),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn post_message(
    State(svc): Svc,
    who: Principal,
    Path(thread_ref): Path<String>,
    ValidJson(msg): ValidJson<MessagePost>,
) -> ApiResult<(StatusCode, Json<ThreadMessage>)> {
    super::limits::check(&msg)?;
    let message = svc.post_message(&who, &thread_ref, msg).await?;
    Ok((StatusCode::CREATED, Json(message)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct MessagesQuery {
    after: Option<u64>,
    limit: Option<u32>,
}

/// A thread's messages after `after`.
#[utoipa::path(get, path = "/threads/{thread_ref}/messages", tag = "audit",
    params(("thread_ref" = String, Path), MessagesQuery),
    responses(
        (status = 200, body = MessageList),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn list_messages(
    State(svc): Svc,
    who: Principal,
    Path(thread_ref): Path<String>,
    ApiQuery(q): ApiQuery<MessagesQuery>,
) -> ApiResult<Json<serde_json::Value>> {
    let after = q.after.unwrap_or(0);
    let messages = svc
        .messages(&who, &thread_ref, after, q.limit.unwrap_or(0))
        .await?;
    let next_after = messages.last().map(|m| m.message_id).unwrap_or(after);
    Ok(Json(
        json!({ "messages": messages, "next_after": next_after }),
    ))
}

impl From<AuditError> for ApiError {
    /// 403 `forbidden` / `not_claim_holder`, 404 `not_found` / `no_result`,
    /// 409 `duplicate_audit_request` / `claim_expired` / `claim_ended` /
    /// `not_claimed`, 422 `invalid_field` with `details.field` /
    /// `unsatisfiable_requirement` with `details.requirements`, the lease
    /// engine's own codes, 500 for the store.
    fn from(e: AuditError) -> Self {
        let message = e.to_string();
        match e {
            AuditError::Forbidden { role, allowed, .. } => ApiError::forbidden(message)
                .with_details(json!({ "role": role, "allowed_roles": allowed })),
            AuditError::NotFound { kind, id } => ApiError::not_found(kind, &id),
            AuditError::NoResult {
                audit_request_id,
                status,
            } => ApiError::new(StatusCode::NOT_FOUND, "no_result", message)
                .with_details(json!({ "audit_request_id": audit_request_id, "status": status })),
            AuditError::Duplicate { audit_request_id } => {
                ApiError::conflict("duplicate_audit_request", message)
                    .with_details(json!({ "audit_request_id": audit_request_id }))
            }
            AuditError::Invalid { field, message } => {
                ApiError::invalid_field(&field, format!("{field}: {message}"))
            }
            AuditError::InvalidFields { errors } => {
                let first = errors.first().map(|(f, _)| f.clone()).unwrap_or_default();
                let list: Vec<serde_json::Value> = errors
                    .iter()
                    .map(|(f, m)| json!({ "field": f, "message": m }))
                    .collect();
                ApiError::invalid_field(&first, message)
                    .with_details(json!({ "field": first, "errors": list }))
            }
            AuditError::Unsatisfiable { failing } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unsatisfiable_requirement",
                message,
            )
            .with_details(json!({ "requirements": failing })),
            AuditError::NotClaimHolder {
                audit_request_id,
                principal,
            } => ApiError::new(StatusCode::FORBIDDEN, "not_claim_holder", message).with_details(
                json!({ "audit_request_id": audit_request_id, "principal": principal }),
            ),
            AuditError::ClaimExpired {
                audit_request_id,
                claim_id,
                expired_at,
            } => ApiError::conflict("claim_expired", message).with_details(json!({
                "audit_request_id": audit_request_id,
                "claim_id": claim_id,
                "expired_at": expired_at,
            })),
            AuditError::ClaimEnded {
                audit_request_id,
                claim_id,
                reason,
            } => ApiError::conflict("claim_ended", message).with_details(json!({
                "audit_request_id": audit_request_id,
                "claim_id": claim_id,
                "end_reason": reason,
            })),
            AuditError::NotClaimed {
                audit_request_id,
                status,
            } => ApiError::conflict("not_claimed", message)
                .with_details(json!({ "audit_request_id": audit_request_id, "status": status })),
            AuditError::NotQueued {
                audit_request_id,
                status,
            } => ApiError::conflict("not_queued", message)
                .with_details(json!({ "audit_request_id": audit_request_id, "status": status })),
            AuditError::Lease(e) => e.into(),
            AuditError::Db(e) => ApiError::internal(e),
            AuditError::Sqlite(e) => ApiError::internal(e),
        }
    }
}
