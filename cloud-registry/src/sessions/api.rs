//! HTTP handlers of sessions and artifacts (seed 001 §2.2.4, §2.2.5;
//! docs/architecture.md "Artifact bytes"):
//!
//! - `POST /api/v1/capability-leases/{lease_id}/actions`: body
//!   [`ActionInvokeRequest`]; the lease holder (`audit_agent`, `operator`,
//!   `admin`). Answers the session: `200` once it has ended (completed or
//!   failed: look at `status` and `error_message`), `202` while it still
//!   runs (`wait_ms` 0, the wait ran out, or the registry began to shut
//!   down during the wait); `429 action_budget_exceeded` with
//!   `Retry-After` when an actuator action is over a `[policy.budgets]`
//!   budget (nothing sent); `422 constraint_violated` for a param outside
//!   the capability's `constraints_json` and `409
//!   action_not_allowed_in_shared_lease` for an action that changes the
//!   device under a `shared_stream` lease (nothing sent, no session);
//! - `GET /api/v1/capability-leases/{lease_id}/sessions`: the lease's
//!   sessions, newest first;
//! - `GET /api/v1/sessions[?lease_id=&capability_id=&provider_id=&status=&limit=]`,
//!   `GET /api/v1/sessions/{session_id}`;
//! - `PUT /api/v1/artifacts/{artifact_id}/content`: artifact bytes from the
//!   provider that produced them (`provider` token), header
//!   `X-Checksum-Sha256`; `201` when stored, `200` for a repeat of the
//!   same bytes, `422 checksum_mismatch` (nothing stored), `413
//!   body_too_large` above `sessions.max_artifact_bytes`. With
//!   `Content-Range: bytes START-END/TOTAL` the PUT is one piece of a
//!   resumable upload: appended to what the registry holds (START 0 or
//!   the bytes held, else `409 upload_offset_mismatch`), `202` with
//!   `{artifact_id, checksum, received_bytes, size_bytes, complete: false}`
//!   and `Range: bytes=0-N` until the last piece, which is verified whole
//!   and answered as a plain PUT;
//! - `GET /api/v1/artifacts/{artifact_id}/content/upload-status`: header
//!   `X-Checksum-Sha256` (or `?sha256=`); what the registry holds of that
//!   upload, `{artifact_id, checksum, complete, received_bytes,
//!   metadata_received}` (see [`Sessions::upload_status`]);
//! - `GET /api/v1/artifacts[?session_id=&lease_id=&uploaded=&derived_from=&limit=]`,
//!   `GET /api/v1/artifacts/{artifact_id}` (metadata),
//!   `GET /api/v1/artifacts/{artifact_id}/content` (the bytes, with
//!   `Content-Type`, `Content-Length`, `X-Checksum-Sha256` and
//!   `Accept-Ranges: bytes`; one byte range in `Range` answers `206` with
//!   `Content-Range`, a range past the end `416` with `Content-Range:
//!   bytes */LEN`; `409 artifact_not_uploaded` while only the metadata is
//!   known; `503 blob_store_unavailable` when the object store cannot be
//!   reached, for uploads too).
//!
//! Reading sessions and artifacts: `audit_agent`, `operator`, `admin`,
//! `viewer`; a provider reads only its own artifacts.

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header::{ACCEPT_RANGES, CONTENT_LENGTH, CONTENT_RANGE, CONTENT_TYPE, RANGE};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use futures::StreamExt;
use serde::Deserialize;
use serde_json::{json, Value};
use shared_protocol::api::{ErrorBody, Role};
use shared_protocol::artifact::CapabilityArtifact;
use shared_protocol::session::{ActionInvokeRequest, CapabilitySession, SessionStatus};
use shared_protocol::validate::check_id;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::partial::ContentRange;
use super::{
    ArtifactFilter, BlobContent, BlobError, Download, SessionError, SessionFilter, Sessions,
    UploadReceipt,
};
use crate::api::{parse_one, ApiQuery};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::ValidJson;
use crate::leases::api::{LEASE_READ_ROLES, LEASE_ROLES};

/// The header carrying the body's sha256 (lowercase hex).
pub const CHECKSUM_HEADER: &str = "x-checksum-sha256";

/// Roles that may read artifacts (a provider only its own).
const ARTIFACT_READ_ROLES: &[Role] = &[
    Role::AuditAgent,
    Role::Operator,
    Role::Admin,
    Role::Viewer,
    Role::Provider,
];

/// The routes, with `svc` as state; merge into the main router (under the
/// authenticator layer).
pub fn router(svc: Arc<Sessions>) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(invoke))
        .routes(routes!(lease_sessions))
        .routes(routes!(list_sessions))
        .routes(routes!(get_session))
        .routes(routes!(list_artifacts))
        .routes(routes!(get_artifact))
        .routes(routes!(upload, download))
        .routes(routes!(upload_status))
        .with_state(svc)
}

/// Answer of the session lists.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct SessionList {
    /// Newest first.
    sessions: Vec<CapabilitySession>,
}

/// Answer of `GET /api/v1/artifacts`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct ArtifactList {
    artifacts: Vec<CapabilityArtifact>,
}

fn status_of(s: &CapabilitySession) -> StatusCode {
    if s.status.is_final() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    }
}

/// Run an action on a leased capability (the lease holder).
#[utoipa::path(post, path = "/api/v1/capability-leases/{lease_id}/actions", tag = "sessions",
    params(("lease_id" = String, Path)),
    request_body = ActionInvokeRequest,
    responses(
        (status = 200, description = "The session ended (look at `status` and `error_message`)", body = CapabilitySession),
        (status = 202, description = "The session still runs", body = CapabilitySession),
        (status = 403, description = "`not_lease_holder`, `provider_credentials_revoked` or `forbidden`", body = ErrorBody),
        (status = 404, description = "`not_found`: no such lease or capability", body = ErrorBody),
        (status = 409, description = "`lease_not_usable`, `lease_expired`, `provider_conflict` or `action_not_allowed_in_shared_lease` (a `shared_stream` holder asked for an action that changes the device)", body = ErrorBody),
        (status = 413, description = "`command_too_large`: the encoded command is over the MQTT packet limit", body = ErrorBody),
        (status = 422, description = "`invalid_field`, `unsupported_action` or `constraint_violated` (a param outside the capability's `constraints_json`)", body = ErrorBody),
        (status = 503, description = "`provider_offline` or `control_plane_unavailable`", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
    ))]
async fn invoke(
    State(svc): State<Arc<Sessions>>,
    who: Principal,
    Path(lease_id): Path<String>,
    ValidJson(req): ValidJson<ActionInvokeRequest>,
) -> ApiResult<(StatusCode, Json<CapabilitySession>)> {
    who.require(LEASE_ROLES)?;
    let session = svc.invoke(&who, &lease_id, req).await?;
    Ok((status_of(&session), Json(session)))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct SessionQuery {
    lease_id: Option<String>,
    capability_id: Option<String>,
    provider_id: Option<String>,
    #[param(value_type = Option<SessionStatus>)]
    status: Option<String>,
    /// At least 1, default 500.
    #[param(minimum = 1)]
    limit: Option<usize>,
}

/// The filters of a lease's session list.
#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
#[allow(dead_code)]
struct LeaseSessionQuery {
    #[param(value_type = Option<SessionStatus>)]
    status: Option<String>,
    /// At least 1, default 500.
    #[param(minimum = 1)]
    limit: Option<usize>,
}

fn nonempty(s: Option<String>) -> Option<String> {
    s.filter(|s| !s.is_empty())
}

/// Sessions, newest first (every role but `provider`).
#[utoipa::path(get, path = "/api/v1/sessions", tag = "sessions",
    params(SessionQuery),
    responses((status = 200, body = SessionList)))]
async fn list_sessions(
    State(svc): State<Arc<Sessions>>,
    who: Principal,
    ApiQuery(q): ApiQuery<SessionQuery>,
) -> ApiResult<Json<Value>> {
    who.require(LEASE_READ_ROLES)?;
    let sessions = svc
        .list_sessions(SessionFilter {
            lease_id: nonempty(q.lease_id),
            capability_id: nonempty(q.capability_id),
            provider_id: nonempty(q.provider_id),
            status: parse_one::<SessionStatus>("status", q.status.as_deref())?,
            limit: crate::api::list_limit(q.limit, 500, super::MAX_LIST)?,
        })
        .await?;
    Ok(Json(json!({ "sessions": sessions })))
}

/// A lease's sessions, newest first (every role but `provider`).
#[utoipa::path(get, path = "/api/v1/capability-leases/{lease_id}/sessions", tag = "sessions",
    params(("lease_id" = String, Path), LeaseSessionQuery),
    responses(
        (status = 200, body = SessionList),
        (status = 404, description = "`not_found`: no such lease", body = ErrorBody),
    ))]
async fn lease_sessions(
    State(svc): State<Arc<Sessions>>,
    who: Principal,
    Path(lease_id): Path<String>,
    ApiQuery(q): ApiQuery<SessionQuery>,
) -> ApiResult<Json<Value>> {
    who.require(LEASE_READ_ROLES)?;
    if svc.leases.get(&lease_id).await.is_none() {
        return Err(ApiError::not_found("lease", &lease_id));
    }
    let sessions = svc
        .list_sessions(SessionFilter {
            lease_id: Some(lease_id),
            status: parse_one::<SessionStatus>("status", q.status.as_deref())?,
            limit: crate::api::list_limit(q.limit, 500, super::MAX_LIST)?,
            ..Default::default()
        })
        .await?;
    Ok(Json(json!({ "sessions": sessions })))
}

/// One session (every role but `provider`).
#[utoipa::path(get, path = "/api/v1/sessions/{session_id}", tag = "sessions",
    params(("session_id" = String, Path)),
    responses(
        (status = 200, body = CapabilitySession),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn get_session(
    State(svc): State<Arc<Sessions>>,
    who: Principal,
    Path(session_id): Path<String>,
) -> ApiResult<Json<CapabilitySession>> {
    who.require(LEASE_READ_ROLES)?;
    Ok(Json(svc.get_session(&session_id).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ArtifactQuery {
    session_id: Option<String>,
    lease_id: Option<String>,
    /// Only artifacts whose bytes did (`true`) or did not arrive.
    uploaded: Option<bool>,
    /// Only the evidence the registry derived from this artifact
    /// (`detection_json`, `ocr_text`, `transcript`; each has
    /// `metadata_json.derived_from` = this id).
    derived_from: Option<String>,
    /// At least 1, default 500.
    #[param(minimum = 1)]
    limit: Option<usize>,
}

/// Artifact records (every role but `provider`).
#[utoipa::path(get, path = "/api/v1/artifacts", tag = "artifacts",
    params(ArtifactQuery),
    responses(
        (status = 200, body = ArtifactList),
        (status = 400, description = "`invalid_query`: a bad parameter, e.g. an empty `derived_from`", body = ErrorBody),
        (status = 404, description = "`not_found`: `derived_from` names no artifact", body = ErrorBody),
    ))]
async fn list_artifacts(
    State(svc): State<Arc<Sessions>>,
    who: Principal,
    ApiQuery(q): ApiQuery<ArtifactQuery>,
) -> ApiResult<Json<Value>> {
    who.require(LEASE_READ_ROLES)?;
    let derived_from = match q.derived_from {
        Some(id) if id.is_empty() => {
            return Err(ApiError::invalid_query(
                "derived_from",
                "is empty; give the id of the artifact whose derived evidence to list",
            ))
        }
        Some(id) => {
            // An unknown source is a 404, not an empty list: a typo must
            // not read as "nothing was derived".
            svc.get_artifact(&id).await?;
            Some(id)
        }
        None => None,
    };
    let artifacts = svc
        .list_artifacts(ArtifactFilter {
            session_id: nonempty(q.session_id),
            lease_id: nonempty(q.lease_id),
            uploaded: q.uploaded,
            derived_from,
            limit: crate::api::list_limit(q.limit, 500, super::MAX_LIST)?,
        })
        .await?;
    Ok(Json(json!({ "artifacts": artifacts })))
}

/// A provider may only see its own artifacts.
fn check_reader(who: &Principal, artifact_id: &str, owner: &str) -> Result<(), ApiError> {
    if who.role == Role::Provider && who.name != owner {
        return Err(SessionError::NotArtifactOwner {
            artifact_id: artifact_id.to_string(),
            owner: owner.to_string(),
            caller: who.name.clone(),
        }
        .into());
    }
    Ok(())
}

/// One artifact's metadata (a provider: only its own).
#[utoipa::path(get, path = "/api/v1/artifacts/{artifact_id}", tag = "artifacts",
    params(("artifact_id" = String, Path)),
    responses(
        (status = 200, body = CapabilityArtifact),
        (status = 403, description = "`not_artifact_owner` or `forbidden`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn get_artifact(
    State(svc): State<Arc<Sessions>>,
    who: Principal,
    Path(artifact_id): Path<String>,
) -> ApiResult<Json<CapabilityArtifact>> {
    who.require(ARTIFACT_READ_ROLES)?;
    let (artifact, owner) = svc.get_artifact(&artifact_id).await?;
    check_reader(&who, &artifact_id, &owner)?;
    Ok(Json(artifact))
}

/// The artifact's bytes, with its `Content-Type` and `X-Checksum-Sha256`
/// (the checksum of the whole artifact, also on a `206`). A single byte
/// range in `Range` (`bytes=0-99`, `bytes=100-`, `bytes=-50`) answers `206`
/// with `Content-Range`; several ranges, or a header that is not a valid
/// range, get the whole body (`200`).
#[utoipa::path(get, path = "/api/v1/artifacts/{artifact_id}/content", tag = "artifacts",
    params(("artifact_id" = String, Path),
        ("Range" = Option<String>, Header, description = "One byte range: `bytes=FIRST-LAST`, `bytes=FIRST-` or `bytes=-SUFFIX_LENGTH`")),
    responses(
        (status = 200, description = "The bytes, of the artifact's `content_type`", content_type = "application/octet-stream", body = crate::openapi::Binary,
            headers(("X-Checksum-Sha256" = String, description = "sha256 of the bytes, lowercase hex"),
                ("Accept-Ranges" = String, description = "`bytes`"))),
        (status = 206, description = "The bytes of the one range asked for", content_type = "application/octet-stream", body = crate::openapi::Binary,
            headers(("Content-Range" = String, description = "`bytes FIRST-LAST/TOTAL`"),
                ("X-Checksum-Sha256" = String, description = "sha256 of the whole artifact, lowercase hex"))),
        (status = 403, description = "`not_artifact_owner` or `forbidden`", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
        (status = 409, description = "`artifact_not_uploaded`: only the metadata is known", body = ErrorBody),
        (status = 416, description = "`range_not_satisfiable`: the range starts past the end", body = ErrorBody,
            headers(("Content-Range" = String, description = "`bytes */TOTAL`"))),
        (status = 503, description = "`blob_store_unavailable`: the object store cannot be reached", body = ErrorBody),
    ))]
async fn download(
    State(svc): State<Arc<Sessions>>,
    who: Principal,
    Path(artifact_id): Path<String>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    who.require(ARTIFACT_READ_ROLES)?;
    let range = headers.get(RANGE).and_then(|v| v.to_str().ok());
    let (artifact, owner, download) = svc.open_artifact(&artifact_id, range).await?;
    check_reader(&who, &artifact_id, &owner)?;
    let (status, content) = match download {
        Download::Unsatisfiable { total } => {
            let mut resp = ApiError::new(
                StatusCode::RANGE_NOT_SATISFIABLE,
                "range_not_satisfiable",
                format!("artifact `{artifact_id}` has {total} bytes; the range asked for holds none of them"),
            )
            .with_details(json!({ "artifact_id": artifact_id, "size_bytes": total }))
            .into_response();
            if let Ok(v) = HeaderValue::from_str(&format!("bytes */{total}")) {
                resp.headers_mut().insert(CONTENT_RANGE, v);
            }
            return Ok(resp);
        }
        Download::Whole(content) => (StatusCode::OK, content),
        Download::Part {
            range,
            total,
            content,
        } => {
            let value = format!("bytes {}-{}/{total}", range.start, range.end - 1);
            let mut resp = part_response(&artifact, content);
            *resp.status_mut() = StatusCode::PARTIAL_CONTENT;
            if let Ok(v) = HeaderValue::from_str(&value) {
                resp.headers_mut().insert(CONTENT_RANGE, v);
            }
            return Ok(resp);
        }
    };
    let mut resp = part_response(&artifact, content);
    *resp.status_mut() = status;
    resp.headers_mut()
        .insert(ACCEPT_RANGES, HeaderValue::from_static("bytes"));
    Ok(resp)
}

/// The body `content` with the artifact's `Content-Type`, the length and
/// `X-Checksum-Sha256`.
fn part_response(artifact: &CapabilityArtifact, content: BlobContent) -> Response {
    let content_type = HeaderValue::from_str(&artifact.content_type)
        .unwrap_or_else(|_| HeaderValue::from_static("application/octet-stream"));
    let mut resp = Body::from_stream(content.stream).into_response();
    let h = resp.headers_mut();
    h.insert(CONTENT_TYPE, content_type);
    h.insert(CONTENT_LENGTH, HeaderValue::from(content.size_bytes));
    if let Ok(v) = HeaderValue::from_str(&artifact.checksum) {
        h.insert(CHECKSUM_HEADER, v);
    }
    resp
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct StatusQuery {
    /// The upload's sha256, when not in `X-Checksum-Sha256`.
    sha256: Option<String>,
}

/// What the registry holds of an upload (the uploading `provider`):
/// `{artifact_id, checksum, complete, received_bytes, metadata_received}`.
#[utoipa::path(get, path = "/api/v1/artifacts/{artifact_id}/content/upload-status", tag = "artifacts",
    params(("artifact_id" = String, Path), StatusQuery,
        ("X-Checksum-Sha256" = Option<String>, Header, description = "The upload's sha256, lowercase hex")),
    responses(
        (status = 200, body = serde_json::Value),
        (status = 409, description = "A conflict with the upload's state", body = ErrorBody),
        (status = 422, description = "`invalid_field`: `artifact_id` is no valid id, or `checksum_mismatch`", body = ErrorBody),
    ))]
async fn upload_status(
    State(svc): State<Arc<Sessions>>,
    who: Principal,
    Path(artifact_id): Path<String>,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<StatusQuery>,
) -> ApiResult<Json<Value>> {
    who.require(&[Role::Provider])?;
    check_id("artifact_id", &artifact_id)
        .map_err(|e| ApiError::invalid_field(&e.field, e.to_string()))?;
    let declared = headers
        .get(CHECKSUM_HEADER)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or(q.sha256);
    Ok(Json(
        svc.upload_status(&who, &artifact_id, declared.as_deref())
            .await?,
    ))
}

/// Upload artifact bytes (the producing `provider`); with `Content-Range`
/// one piece of a resumable upload.
#[utoipa::path(put, path = "/api/v1/artifacts/{artifact_id}/content", tag = "artifacts",
    params(("artifact_id" = String, Path),
        ("X-Checksum-Sha256" = Option<String>, Header, description = "sha256 of the whole artifact, lowercase hex"),
        ("Content-Range" = Option<String>, Header, description = "`bytes START-END/TOTAL` for one piece of a resumable upload")),
    request_body(content = crate::openapi::Binary, content_type = "application/octet-stream", description = "The bytes"),
    responses(
        (status = 200, description = "A repeat of bytes already stored", body = serde_json::Value),
        (status = 201, description = "Stored: the artifact record (or, before its metadata, `{artifact_id, checksum, size_bytes, uploaded, metadata_received}`)", body = serde_json::Value),
        (status = 202, description = "A piece stored: `{artifact_id, checksum, received_bytes, size_bytes, complete: false}`, header `Range: bytes=0-N`", body = serde_json::Value),
        (status = 403, description = "`forbidden` or `not_artifact_owner`", body = ErrorBody),
        (status = 409, description = "`upload_offset_mismatch`, `upload_in_progress`, `unbound_upload_limit` or `partial_upload_limit`", body = ErrorBody),
        (status = 413, description = "`body_too_large`: over `sessions.max_artifact_bytes`", body = ErrorBody),
        (status = 422, description = "`checksum_mismatch` (nothing stored) or `invalid_field`", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
    ))]
async fn upload(
    State(svc): State<Arc<Sessions>>,
    who: Principal,
    Path(artifact_id): Path<String>,
    headers: HeaderMap,
    body: Body,
) -> ApiResult<Response> {
    who.require(&[Role::Provider])?;
    check_id("artifact_id", &artifact_id)
        .map_err(|e| ApiError::invalid_field(&e.field, e.to_string()))?;
    let declared = headers.get(CHECKSUM_HEADER).and_then(|v| v.to_str().ok());
    let length = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(range) = headers.get(CONTENT_RANGE) {
        let range = range
            .to_str()
            .map_err(|_| SessionError::BadContentRange("not ASCII".into()))
            .and_then(|v| ContentRange::parse(v).map_err(SessionError::BadContentRange))?;
        if let Some(n) = length.filter(|n| *n != range.body_len()) {
            return Err(SessionError::BadContentRange(format!(
                "it covers {} bytes but Content-Length is {n}",
                range.body_len()
            ))
            .into());
        }
        return upload_range(svc, who, artifact_id, declared, range, body).await;
    }
    // Held until the upload is recorded: its declared length counts toward
    // the provider's unbound bytes meanwhile (unknown artifacts only).
    let permit = svc
        .precheck_upload(&who, &artifact_id, declared, length)
        .await?;
    let limit = svc.config().max_artifact_bytes;
    let mut staged = svc.stage().await?;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| SessionError::Interrupted {
            artifact_id: artifact_id.clone(),
            received: staged.size_bytes(),
            message: e.to_string(),
        })?;
        if staged.size_bytes() + chunk.len() as u64 > limit {
            return Err(SessionError::TooLarge {
                artifact_id: artifact_id.clone(),
                limit,
            }
            .into());
        }
        staged.write(&chunk).await.map_err(SessionError::from)?;
    }
    let receipt = svc
        .finish_upload(&who, &artifact_id, &permit.sha256, staged)
        .await?;
    drop(permit);
    Ok(uploaded(receipt))
}

/// The answer to an upload that completed: 201 with the record when this
/// PUT stored or bound the bytes, 200 for a repeat.
fn uploaded(receipt: UploadReceipt) -> Response {
    let status = if receipt.first {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    (status, Json(receipt.record)).into_response()
}

/// One piece of a resumable upload (see the module doc): appended to the
/// partial file, which is kept when the connection breaks.
async fn upload_range(
    svc: Arc<Sessions>,
    who: Principal,
    artifact_id: String,
    declared: Option<&str>,
    range: ContentRange,
    body: Body,
) -> ApiResult<Response> {
    let permit = svc
        .precheck_upload(&who, &artifact_id, declared, Some(range.total))
        .await?;
    let (mut staged, _claim) = svc
        .resume_partial(&who, &artifact_id, &permit.sha256, range)
        .await?;
    let end = range.end + 1;
    let mut stream = body.into_data_stream();
    while let Some(chunk) = stream.next().await {
        let chunk = match chunk {
            Ok(c) => c,
            Err(e) => {
                let received = staged.suspend().await.unwrap_or(0);
                tracing::info!(%artifact_id, provider_id = %who.name, received_bytes = received, total_bytes = range.total, "resumable upload broke off; its bytes are kept for a later ranged PUT");
                return Err(SessionError::Interrupted {
                    artifact_id,
                    received,
                    message: e.to_string(),
                }
                .into());
            }
        };
        if staged.size_bytes() + chunk.len() as u64 > end {
            let received = staged.suspend().await.unwrap_or(0);
            return Err(SessionError::BadContentRange(format!(
                "the body goes past END ({}); {received} bytes are held",
                range.end
            ))
            .into());
        }
        staged.write(&chunk).await.map_err(SessionError::from)?;
    }
    let received = staged.size_bytes();
    if received < end {
        let received = staged.suspend().await.unwrap_or(received);
        return Err(SessionError::BadContentRange(format!(
            "the body ended at byte {received}, before END ({}); {received} bytes are held",
            range.end
        ))
        .into());
    }
    if received < range.total {
        staged.suspend().await.map_err(SessionError::from)?;
        let mut resp = (
            StatusCode::ACCEPTED,
            Json(json!({
                "artifact_id": artifact_id,
                "checksum": permit.sha256,
                "received_bytes": received,
                "size_bytes": range.total,
                "complete": false,
            })),
        )
            .into_response();
        if let Ok(v) = HeaderValue::from_str(&format!("bytes=0-{}", received - 1)) {
            resp.headers_mut().insert(RANGE, v);
        }
        return Ok(resp);
    }
    let receipt = svc
        .finish_upload(&who, &artifact_id, &permit.sha256, staged)
        .await?;
    drop(permit);
    Ok(uploaded(receipt))
}

impl From<SessionError> for ApiError {
    fn from(e: SessionError) -> Self {
        let message = e.to_string();
        match e {
            SessionError::Lease(l) => l.into(),
            SessionError::UnsupportedAction {
                capability_id,
                action,
                supported,
            } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "unsupported_action",
                message,
            )
            .with_details(json!({
                "field": "action",
                "action": action,
                "capability_id": capability_id,
                "supported_actions": supported,
            })),
            SessionError::ConstraintViolated {
                capability_id,
                action,
                violation,
            } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "constraint_violated",
                message,
            )
            .with_details(json!({
                "constraint": violation.constraint,
                "limit": violation.limit,
                "value": violation.value,
                "param": violation.param,
                "capability_id": capability_id,
                "action": action,
            })),
            SessionError::NotAllowedInSharedLease {
                lease_id,
                capability_id,
                action,
                mode,
                allowed,
            } => ApiError::new(
                StatusCode::CONFLICT,
                "action_not_allowed_in_shared_lease",
                message,
            )
            .with_details(json!({
                "action": action,
                "lease_mode": mode,
                "allowed_actions": allowed,
                "lease_id": lease_id,
                "capability_id": capability_id,
            })),
            SessionError::CapabilityNotLeased {
                lease_id,
                leased,
                requested,
            } => ApiError::invalid_field("capability_id", message).with_details(json!({
                "field": "capability_id",
                "lease_id": lease_id,
                "leased_capability_id": leased,
                "capability_id": requested,
            })),
            SessionError::UnknownCapability { capability_id } => {
                ApiError::not_found("capability", &capability_id)
            }
            SessionError::ProviderOffline {
                provider_id,
                capability_id,
            } => ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "provider_offline", message)
                .with_details(json!({
                    "provider_id": provider_id,
                    "capability_id": capability_id,
                })),
            SessionError::ProviderCredentialsRevoked {
                provider_id,
                capability_id,
            } => ApiError::new(
                StatusCode::FORBIDDEN,
                "provider_credentials_revoked",
                message,
            )
            .with_details(json!({
                "provider_id": provider_id,
                "capability_id": capability_id,
            })),
            SessionError::ProviderConflict {
                provider_id,
                capability_id,
                instances,
            } => ApiError::new(StatusCode::CONFLICT, "provider_conflict", message).with_details(
                json!({
                    "provider_id": provider_id,
                    "capability_id": capability_id,
                    "instances": instances,
                }),
            ),
            SessionError::ControlPlaneDown => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "control_plane_unavailable",
                message,
            ),
            SessionError::CommandTooLarge {
                capability_id,
                size,
                limit,
            } => ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "command_too_large", message)
                .with_details(json!({
                    "capability_id": capability_id,
                    "encoded_bytes": size,
                    "limit_bytes": limit,
                })),
            SessionError::BudgetExceeded(b) => ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "action_budget_exceeded",
                message,
            )
            .with_details(json!({
                "budget": b.budget,
                "limit": b.limit,
                "window_seconds": b.window_seconds,
                "retry_after_seconds": b.retry_after_seconds,
                "capability_type": b.capability_type,
                "action": b.action,
            })),
            SessionError::SessionNotFound { session_id } => {
                ApiError::not_found("session", &session_id)
            }
            SessionError::ArtifactNotFound { artifact_id } => {
                ApiError::not_found("artifact", &artifact_id)
            }
            SessionError::ArtifactNotUploaded { artifact_id } => {
                ApiError::conflict("artifact_not_uploaded", message)
                    .with_details(json!({ "artifact_id": artifact_id, "uploaded": false }))
            }
            SessionError::ArtifactBytesMissing {
                artifact_id,
                checksum,
            } => ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "artifact_bytes_missing",
                message,
            )
            .with_details(json!({ "artifact_id": artifact_id, "checksum": checksum })),
            SessionError::NotArtifactOwner {
                artifact_id,
                owner: _,
                caller,
            } => ApiError::new(StatusCode::FORBIDDEN, "not_artifact_owner", message)
                .with_details(json!({ "artifact_id": artifact_id, "principal": caller })),
            SessionError::ChecksumMismatch {
                artifact_id,
                what,
                expected,
                actual,
            } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "checksum_mismatch",
                message,
            )
            .with_details(json!({
                "artifact_id": artifact_id,
                "expected": expected,
                "expected_from": what,
                "actual": actual,
            })),
            SessionError::BadChecksumHeader => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_checksum_header", message)
                    .with_details(json!({ "header": "X-Checksum-Sha256" }))
            }
            SessionError::TooLarge { artifact_id, limit } => {
                ApiError::new(StatusCode::PAYLOAD_TOO_LARGE, "body_too_large", message)
                    .with_details(json!({ "artifact_id": artifact_id, "limit_bytes": limit }))
            }
            SessionError::UnboundLimit {
                provider_id,
                artifact_id,
                held,
                in_flight,
                incoming,
                limit,
                ..
            } => ApiError::conflict("unbound_upload_limit", message).with_details(json!({
                "provider_id": provider_id,
                "artifact_id": artifact_id,
                "unbound_bytes": held,
                "in_flight_bytes": in_flight,
                "incoming_bytes": incoming,
                "limit_bytes": limit,
            })),
            SessionError::Interrupted {
                artifact_id,
                received,
                ..
            } => ApiError::new(StatusCode::BAD_REQUEST, "upload_interrupted", message)
                .with_details(json!({ "artifact_id": artifact_id, "received_bytes": received })),
            SessionError::BadContentRange(_) => {
                ApiError::new(StatusCode::BAD_REQUEST, "invalid_content_range", message)
            }
            SessionError::OffsetMismatch {
                artifact_id,
                held,
                start,
            } => ApiError::new(StatusCode::CONFLICT, "upload_offset_mismatch", message)
                .with_details(json!({
                    "artifact_id": artifact_id,
                    "received_bytes": held,
                    "start": start,
                })),
            SessionError::UploadBusy { artifact_id } => {
                ApiError::new(StatusCode::CONFLICT, "upload_in_progress", message)
                    .with_details(json!({ "artifact_id": artifact_id }))
            }
            SessionError::PartialLimit {
                artifact_id,
                held,
                incoming,
                limit,
            } => ApiError::new(StatusCode::CONFLICT, "partial_upload_limit", message).with_details(
                json!({
                    "artifact_id": artifact_id,
                    "held_bytes": held,
                    "incoming_bytes": incoming,
                    "limit_bytes": limit,
                }),
            ),
            SessionError::Blob(e @ BlobError::Remote { .. }) => {
                tracing::error!(error = %e, "blob store unreachable");
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "blob_store_unavailable",
                    "the artifact store cannot be reached; try again later",
                )
            }
            SessionError::Blob(e) => ApiError::internal(e),
            SessionError::Store(e) => ApiError::internal(e),
        }
    }
}
