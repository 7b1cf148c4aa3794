//! Leases (seed 001 §2.2.3, §5, §6), all through [`LeaseEngine`]:
//! - `POST /api/v1/capability-leases/request[?wait_seconds=N]`: one
//!   capability (by id or `capability_selector`);
//! - `POST /api/v1/capability-leases/request-group[?wait_seconds=N]`:
//!   several capabilities, all granted together or none;
//! - `POST /api/v1/capability-leases/{lease_id}/renew` (body optional);
//! - `POST /api/v1/capability-leases/{lease_id}/release` (body optional);
//! - `GET /api/v1/capability-leases[?capability_id=&principal=&status=&lease_group_id=&active_only=&limit=]`;
//! - `GET /api/v1/capability-leases/{lease_id}`.
//!
//! Roles: `audit_agent`, `operator`, `admin`, `super_admin` request, renew
//! and release; `viewer` may only read; `provider` tokens have no access to
//! leases. The holder is always the token's principal; `holder_ref` must be
//! the principal's name or a sub-holder `{principal}:{thread}` (admins may
//! name any holder) — checked by the engine. Renew and release are for the
//! holding principal (403 `not_lease_holder` otherwise; admins may release
//! any lease).
//!
//! A request answers 201 with the lease when granted at once, 202 when it
//! waits in the queue (`status: requested`); `?wait_seconds=N` first waits
//! that long for the grant (0..=300; more is 400 `invalid_query`, nothing
//! is requested). When the registry begins to shut down, a waiting request
//! is answered at once with its lease as it is (202 while still
//! `requested`), so the client keeps its lease id and the shutdown does
//! not wait for it.
//!
//! A client that goes away before it has its answer never learns its
//! lease ids, so its request is given up ([`Unanswered`]: withdrawn from
//! the queue, or released if granted). The guard lives from the engine's
//! admission on, through the commit and the wait, and inside the response
//! body ([`AnswerBody`]) until hyper takes the body's bytes: hyper drops
//! the handler's future, or a response not yet written, when it reads the
//! end of the connection (FIN or RST) while the request is in progress
//! (HTTP/1.1 without half-close). A close that arrives after the answer
//! was written cannot be told from a client that read it; for that,
//! `Idempotency-Key` (a retry gets the same lease, `Idempotent-Replayed:
//! true`) and `GET /capability-leases?principal=` (see docs/http-api.md).

use std::time::Duration;

use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::{Body, Bytes, HttpBody};
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use shared_protocol::api::{ErrorBody, Role};
use shared_protocol::lease::{
    CapabilityLease, LeaseGroup, LeaseGroupRequest, LeaseReleaseRequest, LeaseRenewRequest,
    LeaseRequest, LeaseStatus, MAX_PRIORITY,
};
use shared_protocol::validate::{Validate, ValidationError};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use crate::api::{parse_in_range, parse_one, ApiQuery, OptionalJson};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::ValidJson;
use crate::leases::{
    IdempotencyKey, LeaseConfig, LeaseError, LeaseFilter, Requested, Stage, Unanswered,
};

/// Roles that may hold leases.
pub const LEASE_ROLES: &[Role] = &[Role::AuditAgent, Role::Operator, Role::Admin];

/// Roles that may read leases.
pub const LEASE_READ_ROLES: &[Role] =
    &[Role::AuditAgent, Role::Operator, Role::Admin, Role::Viewer];

/// Longest `wait_seconds` accepted; more is refused with 400
/// `invalid_query`.
pub const MAX_WAIT_SECONDS: u64 = 300;

/// What the lease handlers use.
#[derive(Clone)]
pub struct LeasesApi {
    pub leases: std::sync::Arc<super::LeaseEngine>,
    /// Turns true when the registry shuts down (ends waits for a grant).
    pub shutdown: tokio::sync::watch::Receiver<bool>,
}

/// The lease routes (relative to `/api/v1`).
pub fn routes(state: LeasesApi) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(request))
        .routes(routes!(request_group))
        .routes(routes!(renew))
        .routes(routes!(release))
        .routes(routes!(list))
        .routes(routes!(get_one))
        .with_state(state)
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct WaitQuery {
    /// Wait this long for the grant before answering, 0..=300 seconds.
    #[param(value_type = Option<u64>, maximum = 300)]
    wait_seconds: Option<String>,
}

/// Answer of `GET /capability-leases`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct LeaseList {
    /// Newest first.
    leases: Vec<CapabilityLease>,
}

/// How long to wait for the grant: `None` for no wait (absent or 0); 400
/// `invalid_query` for anything but a whole number up to
/// [`MAX_WAIT_SECONDS`].
fn wait_of(q: &WaitQuery) -> Result<Option<Duration>, ApiError> {
    let seconds = parse_in_range(
        "wait_seconds",
        q.wait_seconds.as_deref(),
        0,
        MAX_WAIT_SECONDS,
    )?;
    Ok(seconds.filter(|s| *s > 0).map(Duration::from_secs))
}

/// A lease body read as a JSON object first: its whole-number fields are
/// checked against the ranges the registry enforces (see
/// [`LeaseBody::read`]) before they are read into the protocol's integer
/// types, whose own limits (255 for the `u8` priority, 4294967295 for
/// seconds) are not the ones in force.
#[derive(Default, Deserialize)]
#[serde(transparent)]
struct LeaseBody(serde_json::Map<String, Value>);

impl Validate for LeaseBody {
    /// Nothing here: [`LeaseBody::read`] checks the numbers, then parses
    /// and validates the body as its protocol type.
    fn validate(&self) -> Result<(), ValidationError> {
        Ok(())
    }
}

/// A whole-number field of a lease body and the range in force for it.
struct Range {
    /// The field as errors name it, e.g. `requirements[0].min_duration_seconds`.
    field: String,
    /// Where it is in the body (a JSON pointer).
    pointer: String,
    min: u64,
    max: u64,
    /// May be absent or `null`.
    optional: bool,
    /// Said after the range in a refusal.
    why: Option<&'static str>,
}

impl Range {
    fn top(field: &str, min: u64, max: u64, optional: bool, why: Option<&'static str>) -> Self {
        Self {
            field: field.to_string(),
            pointer: format!("/{field}"),
            min,
            max,
            optional,
            why,
        }
    }

    /// `requested_duration_seconds`: 1..=`leases.max_duration_seconds`.
    fn duration(cfg: &LeaseConfig, optional: bool) -> Self {
        Self::top(
            "requested_duration_seconds",
            1,
            u64::from(cfg.max_duration_seconds),
            optional,
            Some(crate::leases::MAX_DURATION_WHY),
        )
    }

    /// The numbers of a single or group request: `priority` 0..=100,
    /// `requested_duration_seconds` 1..=`leases.max_duration_seconds`,
    /// `queue_timeout_seconds` 0..=4294967295, and each requirement's
    /// `min_duration_seconds` 1..=the requested duration.
    fn of_request(cfg: &LeaseConfig, body: &LeaseBody) -> Vec<Self> {
        let mut ranges = vec![
            Self::top("priority", 0, u64::from(MAX_PRIORITY), false, None),
            Self::duration(cfg, false),
            Self::top("queue_timeout_seconds", 0, u64::from(u32::MAX), true, None),
        ];
        let requested = body
            .0
            .get("requested_duration_seconds")
            .and_then(Value::as_u64)
            .unwrap_or(u64::from(cfg.max_duration_seconds));
        let requirements = body
            .0
            .get("requirements")
            .and_then(Value::as_array)
            .map_or(0, Vec::len);
        ranges.extend((0..requirements).map(|i| Self {
            field: format!("requirements[{i}].min_duration_seconds"),
            pointer: format!("/requirements/{i}/min_duration_seconds"),
            min: 1,
            max: requested,
            optional: true,
            why: Some(crate::leases::MIN_DURATION_WHY),
        }));
        ranges
    }

    /// Ok when `value` is a whole number in range (or may be and is
    /// absent); otherwise the refusal, worded as the lease engine's.
    fn check(&self, value: Option<&Value>) -> Result<(), LeaseError> {
        let n = match value {
            None | Some(Value::Null) if self.optional => return Ok(()),
            // serde names a missing field.
            None => return Ok(()),
            Some(Value::Number(n)) => n
                .as_u64()
                .map(i128::from)
                .or_else(|| n.as_i64().map(i128::from)),
            Some(_) => None,
        };
        match n {
            Some(n) if n >= i128::from(self.min) && n <= i128::from(self.max) => Ok(()),
            Some(n) => Err(LeaseError::out_of_range(
                self.field.clone(),
                n,
                self.min,
                self.max,
                self.why,
            )),
            None => Err(LeaseError::InvalidRequest {
                field: self.field.clone(),
                message: format!(
                    "expected a whole number from {} to {}, got {}",
                    self.min,
                    self.max,
                    value.unwrap_or(&Value::Null)
                ),
            }),
        }
    }
}

impl LeaseBody {
    /// Refuse a number outside its range with 422 `invalid_field` naming
    /// the field ("priority: 300 is out of range 0..=100", the lease
    /// engine's words), or a value that is not a whole number ("priority:
    /// expected a whole number from 0 to 100, got \"high\""); then parse
    /// and validate the body as `T` (errors as [`ValidJson`]'s).
    fn read<T: DeserializeOwned + Validate>(self, ranges: &[Range]) -> Result<T, ApiError> {
        let body = Value::Object(self.0);
        for r in ranges {
            r.check(body.pointer(&r.pointer))?;
        }
        Ok(shared_protocol::parse_value(body)?)
    }
}

/// The `Idempotency-Key` request header: names one lease request, so
/// that sending it again (after a lost answer) answers the same lease.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// Set to `true` on an answer replayed for an `Idempotency-Key` seen
/// before.
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// The request's `Idempotency-Key`, if any.
///
/// Errors: 400 `invalid_header` (`details.header`) for a key that is not
/// 1 to 255 visible ASCII characters, or given twice.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<IdempotencyKey>, ApiError> {
    let mut values = headers.get_all(IDEMPOTENCY_KEY).iter();
    let Some(value) = values.next() else {
        return Ok(None);
    };
    let bad = |message: String| {
        ApiError::new(StatusCode::BAD_REQUEST, "invalid_header", message)
            .with_details(json!({ "header": "Idempotency-Key" }))
    };
    if values.next().is_some() {
        return Err(bad("header `Idempotency-Key` given twice".to_string()));
    }
    let text = value
        .to_str()
        .map_err(|_| bad("header `Idempotency-Key`: not visible ASCII".to_string()))?;
    IdempotencyKey::parse(text)
        .map(Some)
        .map_err(|e| bad(format!("header {e}")))
}

/// A response body that holds the request's [`Unanswered`] guard until
/// hyper has taken the body's bytes (its last frame was polled): a
/// connection that hyper drops before that, because it read the client's
/// FIN or RST while the answer waited, drops the body and gives the
/// leases up. Taken is not delivered: hyper may still fail to write the
/// bytes, and the peer may be gone after the kernel took them.
struct AnswerBody {
    inner: Body,
    unanswered: Option<Unanswered>,
}

impl HttpBody for AnswerBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, axum::Error>>> {
        let this = &mut *self;
        let frame = Pin::new(&mut this.inner).poll_frame(cx);
        let taken = match &frame {
            Poll::Ready(None) => true,
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            // An error: the answer will not be written; the guard drops
            // with the body.
            Poll::Ready(Some(Err(_))) | Poll::Pending => false,
        };
        if taken {
            if let Some(u) = this.unanswered.take() {
                u.answered();
            }
        }
        frame
    }

    fn is_end_stream(&self) -> bool {
        // Never empty before the guard is settled, so that hyper polls
        // the frame (an empty body would be dropped unpolled).
        self.unanswered.is_none() && self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

/// The JSON answer of a lease request: `status`, `value`, and
/// `Idempotent-Replayed: true` for a replay; its body holds `unanswered`
/// until hyper takes it ([`AnswerBody`]).
fn answer<T: Serialize>(
    status: StatusCode,
    value: &T,
    mut unanswered: Unanswered,
    replayed: bool,
) -> Response {
    unanswered.set_stage(Stage::AnswerNotTaken);
    let (mut parts, body) = (status, Json(value)).into_response().into_parts();
    if replayed {
        parts
            .headers
            .insert(IDEMPOTENT_REPLAYED, HeaderValue::from_static("true"));
    }
    let body = AnswerBody {
        inner: body,
        unanswered: Some(unanswered),
    };
    Response::from_parts(parts, Body::new(body))
}

/// [`crate::leases::LeaseEngine::wait_granted`] that also ends when the registry begins to
/// shut down, with the lease as it is then.
///
/// Errors: `NotFound`.
async fn wait_granted(
    st: &LeasesApi,
    lease_id: &str,
    wait: Duration,
) -> Result<CapabilityLease, LeaseError> {
    let mut stop = st.shutdown.clone();
    let shutting_down = async move {
        // A dropped sender ends the wait too: the registry is gone.
        let _ = stop.wait_for(|s| *s).await;
    };
    tokio::select! {
        lease = st.leases.wait_granted(lease_id, wait) => return lease,
        () = shutting_down => {}
    }
    tracing::debug!(
        lease_id,
        "registry shutting down: a waiting lease request gets its lease as it is"
    );
    st.leases
        .get(lease_id)
        .await
        .ok_or_else(|| LeaseError::NotFound {
            lease_id: lease_id.to_string(),
        })
}

fn created_or_accepted(status: LeaseStatus) -> StatusCode {
    if status == LeaseStatus::Requested {
        StatusCode::ACCEPTED
    } else {
        StatusCode::CREATED
    }
}

/// Request one capability (by id or `capability_selector`); roles
/// `audit_agent`, `operator`, `admin`.
#[utoipa::path(post, path = "/capability-leases/request", tag = "leases",
    params(WaitQuery, ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters: a retry answers the same lease")),
    request_body = LeaseRequest,
    responses(
        (status = 201, description = "Granted", body = CapabilityLease),
        (status = 202, description = "Queued (`status: requested`)", body = CapabilityLease),
        (status = 403, description = "`forbidden`; `not_lease_holder` for a `holder_ref` the caller may not name; `policy_denied` beyond the principal policy (`details.rule`, docs/policy.md)", body = ErrorBody),
        (status = 404, description = "`not_found` (capability) or `no_matching_capability` for a selector", body = ErrorBody),
        (status = 422, description = "`invalid_field` naming the field, or `idempotency_key_reused`", body = ErrorBody),
        (status = 503, description = "`capability_offline`, `queue_full` or `unavailable`", body = ErrorBody),
        (status = 507, description = "`storage_full`: the store's disk is full; nothing was stored", body = ErrorBody),
    ))]
async fn request(
    State(st): State<LeasesApi>,
    who: Principal,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<WaitQuery>,
    ValidJson(body): ValidJson<LeaseBody>,
) -> ApiResult<Response> {
    who.require(LEASE_ROLES)?;
    let ranges = Range::of_request(st.leases.config(), &body);
    let req: LeaseRequest = body.read(&ranges)?;
    let wait = wait_of(&q)?;
    let key = idempotency_key(&headers)?;
    // From here until hyper takes the answer, a dropped future or body
    // gives the lease up.
    let Requested {
        answer: mut lease,
        mut unanswered,
        replayed,
    } = st
        .leases
        .request_unanswered(&who, req, key.as_ref())
        .await?;
    if let (LeaseStatus::Requested, Some(wait)) = (lease.status, wait) {
        unanswered.set_stage(Stage::WaitingForGrant);
        lease = wait_granted(&st, &lease.lease_id, wait).await?;
    }
    Ok(answer(
        created_or_accepted(lease.status),
        &lease,
        unanswered,
        replayed,
    ))
}

/// Request several capabilities, granted all together or none.
#[utoipa::path(post, path = "/capability-leases/request-group", tag = "leases",
    params(WaitQuery, ("Idempotency-Key" = Option<String>, Header, description = "1 to 255 visible ASCII characters: a retry answers the same group")),
    request_body = LeaseGroupRequest,
    responses(
        (status = 201, description = "Granted", body = LeaseGroup),
        (status = 202, description = "Queued (`status: requested`)", body = LeaseGroup),
        (status = 403, description = "`forbidden`; `not_lease_holder` for a `holder_ref` the caller may not name; `policy_denied` beyond the principal policy (`details.rule`, docs/policy.md)", body = ErrorBody),
        (status = 404, description = "`not_found` (capability) or `no_matching_capability` for a selector", body = ErrorBody),
        (status = 422, description = "`invalid_field` naming the field, or `idempotency_key_reused`", body = ErrorBody),
        (status = 503, description = "`capability_offline`, `queue_full` or `unavailable`", body = ErrorBody),
        (status = 507, description = "`storage_full`: the store's disk is full; nothing was stored", body = ErrorBody),
    ))]
async fn request_group(
    State(st): State<LeasesApi>,
    who: Principal,
    headers: HeaderMap,
    ApiQuery(q): ApiQuery<WaitQuery>,
    ValidJson(body): ValidJson<LeaseBody>,
) -> ApiResult<Response> {
    who.require(LEASE_ROLES)?;
    let ranges = Range::of_request(st.leases.config(), &body);
    let req: LeaseGroupRequest = body.read(&ranges)?;
    let wait = wait_of(&q)?;
    let key = idempotency_key(&headers)?;
    let Requested {
        answer: mut group,
        mut unanswered,
        replayed,
    } = st
        .leases
        .request_group_unanswered(&who, req, key.as_ref())
        .await?;
    if let (LeaseStatus::Requested, Some(wait)) = (group.status, wait) {
        unanswered.set_stage(Stage::WaitingForGrant);
        // Members are granted together: waiting on the first is enough,
        // then every member is read back as committed.
        if let Some(first) = group.leases.first() {
            wait_granted(&st, &first.lease_id, wait).await?;
        }
        let mut leases = Vec::with_capacity(group.leases.len());
        for l in &group.leases {
            leases.push(
                st.leases
                    .get(&l.lease_id)
                    .await
                    .unwrap_or_else(|| l.clone()),
            );
        }
        group.status = leases.first().map(|l| l.status).unwrap_or(group.status);
        group.leases = leases;
    }
    Ok(answer(
        created_or_accepted(group.status),
        &group,
        unanswered,
        replayed,
    ))
}

/// Renew a held lease (body optional).
#[utoipa::path(post, path = "/capability-leases/{lease_id}/renew", tag = "leases",
    params(("lease_id" = String, Path)),
    request_body(content = Option<LeaseRenewRequest>, description = "Optional; empty keeps the lease's duration"),
    responses(
        (status = 200, body = CapabilityLease),
        (status = 403, description = "`not_lease_holder`: another principal holds the lease; `policy_denied`: longer than the principal policy's `max_lease_seconds`", body = ErrorBody),
        (status = 404, description = "`not_found`: no such lease", body = ErrorBody),
        (status = 409, description = "`lease_not_usable` or `lease_expired` (`details.lease_status`)", body = ErrorBody),
        (status = 503, description = "`unavailable`", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
        (status = 422, description = "`invalid_field`", body = ErrorBody),
    ))]
async fn renew(
    State(st): State<LeasesApi>,
    who: Principal,
    Path(lease_id): Path<String>,
    OptionalJson(body): OptionalJson<LeaseBody>,
) -> ApiResult<Json<CapabilityLease>> {
    who.require(LEASE_ROLES)?;
    let req: LeaseRenewRequest = body.read(&[Range::duration(st.leases.config(), true)])?;
    Ok(Json(st.leases.renew(&who, &lease_id, req).await?))
}

/// Release a lease (body optional; admins may release any lease).
#[utoipa::path(post, path = "/capability-leases/{lease_id}/release", tag = "leases",
    params(("lease_id" = String, Path)),
    request_body(content = Option<LeaseReleaseRequest>, description = "Optional"),
    responses(
        (status = 200, body = CapabilityLease),
        (status = 403, description = "`not_lease_holder`: another principal holds the lease", body = ErrorBody),
        (status = 404, description = "`not_found`: no such lease", body = ErrorBody),
        (status = 409, description = "`lease_not_usable` or `lease_expired` (`details.lease_status`)", body = ErrorBody),
        (status = 503, description = "`unavailable`", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
    ))]
async fn release(
    State(st): State<LeasesApi>,
    who: Principal,
    Path(lease_id): Path<String>,
    OptionalJson(req): OptionalJson<LeaseReleaseRequest>,
) -> ApiResult<Json<CapabilityLease>> {
    who.require(LEASE_ROLES)?;
    Ok(Json(st.leases.release(&who, &lease_id, req.reason).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    capability_id: Option<String>,
    /// The holding principal.
    principal: Option<String>,
    #[param(value_type = Option<LeaseStatus>)]
    status: Option<String>,
    lease_group_id: Option<String>,
    active_only: Option<bool>,
    /// At least 1, default 500; more than 10000 reads 10000.
    #[param(minimum = 1)]
    limit: Option<usize>,
}

/// Leases, newest first (every role but `provider`).
#[utoipa::path(get, path = "/capability-leases", tag = "leases",
    params(ListQuery),
    responses((status = 200, body = LeaseList)))]
async fn list(
    State(st): State<LeasesApi>,
    who: Principal,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Value>> {
    who.require(LEASE_READ_ROLES)?;
    let filter = LeaseFilter {
        capability_id: q.capability_id.filter(|s| !s.is_empty()),
        principal: q.principal.filter(|s| !s.is_empty()),
        status: parse_one::<LeaseStatus>("status", q.status.as_deref())?,
        lease_group_id: q.lease_group_id.filter(|s| !s.is_empty()),
        active_only: q.active_only.unwrap_or(false),
        limit: Some(crate::api::list_limit(q.limit, 500, 10_000)?),
    };
    let leases = st.leases.try_list(filter).await?;
    Ok(Json(json!({ "leases": leases })))
}

/// One lease (every role but `provider`).
#[utoipa::path(get, path = "/capability-leases/{lease_id}", tag = "leases",
    params(("lease_id" = String, Path)),
    responses(
        (status = 200, body = CapabilityLease),
        (status = 404, description = "`not_found`: no such lease", body = ErrorBody),
    ))]
async fn get_one(
    State(st): State<LeasesApi>,
    who: Principal,
    Path(lease_id): Path<String>,
) -> ApiResult<Json<CapabilityLease>> {
    who.require(LEASE_READ_ROLES)?;
    st.leases
        .get(&lease_id)
        .await
        .map(Json)
        .ok_or_else(|| ApiError::not_found("lease", &lease_id))
}

impl From<LeaseError> for ApiError {
    /// 404 `not_found` (lease, capability) / `no_matching_capability`,
    /// 403 `not_lease_holder` / `policy_denied` (`details.rule`), 409 `lease_not_usable` / `lease_expired`
    /// with `details.lease_status`, 422 `invalid_field` naming the field,
    /// 422 `idempotency_key_reused`,
    /// 503 `capability_offline` / `queue_full` / `unavailable`, 507
    /// `storage_full` when the store's disk is full, 500 for another store
    /// failure.
    fn from(e: LeaseError) -> Self {
        let message = e.to_string();
        match e {
            LeaseError::NotFound { lease_id } => ApiError::not_found("lease", &lease_id),
            LeaseError::NotHolder {
                lease_id,
                principal,
                holder: _,
            } => ApiError::new(StatusCode::FORBIDDEN, "not_lease_holder", message)
                .with_details(json!({ "lease_id": lease_id, "principal": principal })),
            LeaseError::NotUsable {
                lease_id,
                status,
                operation,
            } => ApiError::conflict("lease_not_usable", message).with_details(json!({
                "lease_id": lease_id,
                "lease_status": status,
                "operation": operation,
            })),
            LeaseError::Expired { lease_id } => ApiError::conflict("lease_expired", message)
                .with_details(json!({
                    "lease_id": lease_id,
                    "lease_status": LeaseStatus::Expired,
                })),
            LeaseError::UnknownCapability { capability_id } => {
                ApiError::not_found("capability", &capability_id)
            }
            LeaseError::CapabilityOffline { capability_ids } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "capability_offline",
                message,
            )
            .with_details(json!({ "capability_ids": capability_ids })),
            LeaseError::CapabilityInMaintenance {
                capability_id,
                reason,
            } => ApiError::conflict("capability_in_maintenance", message)
                .with_details(json!({ "capability_id": capability_id, "reason": reason })),
            LeaseError::CapabilityUnhealthy { capability_ids } => ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "capability_unhealthy",
                message,
            )
            .with_details(
                json!({ "capability_ids": capability_ids, "health_status": "unhealthy" }),
            ),
            LeaseError::PolicyDenied {
                rule, limit, value, ..
            } => ApiError::new(StatusCode::FORBIDDEN, "policy_denied", message)
                .with_details(json!({ "rule": rule, "limit": limit, "value": value })),
            LeaseError::CapabilityInUse {
                capability_id,
                lease_ids,
            } => ApiError::conflict("capability_leased", message)
                .with_details(json!({ "capability_id": capability_id, "lease_ids": lease_ids })),
            LeaseError::NoMatchingCapability { field, selector } => {
                let selector = serde_json::from_str::<serde_json::Value>(&selector)
                    .unwrap_or(serde_json::Value::String(selector));
                ApiError::new(StatusCode::NOT_FOUND, "no_matching_capability", message)
                    .with_details(json!({ "field": field, "selector": selector }))
            }
            LeaseError::QueueFull { limit } => {
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, "queue_full", message)
                    .with_details(json!({ "limit": limit }))
            }
            LeaseError::InvalidRequest { field, message } => {
                ApiError::invalid_field(&field, format!("{field}: {message}"))
            }
            LeaseError::IdempotencyKeyReused { key } => ApiError::new(
                StatusCode::UNPROCESSABLE_ENTITY,
                "idempotency_key_reused",
                message,
            )
            .with_details(json!({ "header": "Idempotency-Key", "key": key })),
            // A commit refused for lack of space, or the recovery after
            // it while the disk is still full: the same answer as every
            // other write path.
            LeaseError::Unavailable { message }
                if crate::storage::is_full(&message)
                    || (crate::storage::is_store_full() && message.contains("recovering")) =>
            {
                ApiError::storage_full(&message)
            }
            LeaseError::Unavailable { .. } => ApiError::unavailable(message),
            LeaseError::Store(e) => ApiError::internal(e),
        }
    }
}
