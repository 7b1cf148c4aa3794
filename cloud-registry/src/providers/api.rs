//! The HTTP face of providers and capabilities (seed 001 §2.2.1, §2.2.2,
//! §4.1-§4.3; docs/http-api.md):
//! - `POST /api/v1/capability-providers/register`,
//!   `POST /api/v1/capabilities/register`, `POST /api/v1/capabilities/heartbeat`:
//!   the provider itself (token role `provider`, principal = `provider_id`)
//!   or an admin;
//! - `GET /api/v1/capability-providers[?online_status=online|offline]`,
//!   `GET /api/v1/capability-providers/{provider_id}`,
//!   `GET /api/v1/capabilities[?type=&provider_id=&status=&tag=]`,
//!   `GET /api/v1/capabilities/{capability_id}`,
//!   `GET /api/v1/capabilities/{capability_id}/health-history[?limit=N]`:
//!   any role.
//!
//! A capability's `status` is `leased` while a lease holds it (asked of the
//! lease engine at read time); otherwise the stored `available`, `offline`
//! or `maintenance`; its `health_status` is `unhealthy`, with
//! `health_check_reason`, while a failed registry health check holds it
//! out (docs/policy.md "Health checks"). Also the HTTP mapping of
//! [`StoreError`].

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use shared_protocol::api::{ErrorBody, Role};
use shared_protocol::capability::{
    Capability, CapabilityBatchRegisterRequest, CapabilityBatchRegisterResponse, CapabilityStatus,
    CapabilityType, HealthStatus,
};
use shared_protocol::provider::{
    CapabilityProvider, HeartbeatRequest, HeartbeatResponse, OnlineStatus, ProviderRegisterRequest,
    ProviderRegisterResponse,
};
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::store::{CapabilityFilter, ProviderFilter, StoreError};
use super::Providers;
use crate::api::{parse_one, ApiQuery};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::ValidJson;

/// What the provider and capability handlers read.
#[derive(Clone)]
pub struct ProvidersApi {
    pub providers: Arc<Providers>,
    /// For `status: leased` of capabilities.
    pub leases: Arc<crate::leases::LeaseEngine>,
}

/// The provider and capability routes (relative to `/api/v1`).
pub fn routes(state: ProvidersApi) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(register_provider))
        .routes(routes!(list_providers))
        .routes(routes!(get_provider))
        .routes(routes!(register))
        .routes(routes!(heartbeat))
        .routes(routes!(list))
        .routes(routes!(get_one))
        .routes(routes!(health_history))
        .with_state(state)
}

/// Answer of `GET /capability-providers`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct ProviderList {
    providers: Vec<CapabilityProvider>,
}

/// Answer of `GET /capabilities`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct CapabilityList {
    capabilities: Vec<Capability>,
}

/// Answer of `GET /capabilities/{capability_id}/health-history`.
#[derive(utoipa::ToSchema)]
#[allow(dead_code)]
struct HealthHistory {
    capability_id: String,
    /// Newest first.
    snapshots: Vec<super::store::HealthSnapshot>,
}

impl From<StoreError> for ApiError {
    /// 404 `not_found`, 409 with the conflict's code and details, 500 for
    /// a backend failure.
    fn from(e: StoreError) -> Self {
        match e {
            StoreError::NotFound { kind, id } => ApiError::not_found(kind, &id),
            StoreError::Conflict {
                code,
                message,
                details,
            } => ApiError::conflict(code, message).with_details(details),
            StoreError::Backend(m) => ApiError::internal(m),
        }
    }
}

/// Ok for an admin, or a `provider` token whose principal is `provider_id`.
/// Otherwise 403: `provider_mismatch` for another provider's token,
/// `forbidden` for other roles.
pub fn require_provider_or_admin(who: &Principal, provider_id: &str) -> ApiResult<()> {
    if who.is_admin() {
        return Ok(());
    }
    who.require(&[Role::Provider, Role::Admin])?;
    if who.name != provider_id {
        return Err(ApiError::new(
            axum::http::StatusCode::FORBIDDEN,
            "provider_mismatch",
            format!(
                "principal `{}` may only act for its own provider id, not `{provider_id}`",
                who.name
            ),
        )
        .with_details(json!({ "principal": who.name, "provider_id": provider_id })));
    }
    Ok(())
}

/// Register (or re-register) a provider: the provider itself or an admin.
#[utoipa::path(post, path = "/capability-providers/register", tag = "providers",
    request_body = ProviderRegisterRequest,
    responses(
        (status = 200, body = ProviderRegisterResponse),
        (status = 403, description = "`provider_mismatch`: a provider token acting for another provider id, or `forbidden`", body = ErrorBody),
        (status = 409, description = "A conflict with what is stored (its code and details)", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
    ))]
async fn register_provider(
    State(st): State<ProvidersApi>,
    who: Principal,
    ValidJson(req): ValidJson<ProviderRegisterRequest>,
) -> ApiResult<Json<ProviderRegisterResponse>> {
    require_provider_or_admin(&who, &req.provider_id)?;
    Ok(Json(st.providers.register_provider(&who.name, req).await?))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ProviderListQuery {
    #[param(value_type = Option<OnlineStatus>)]
    online_status: Option<String>,
}

/// Every provider (any role).
#[utoipa::path(get, path = "/capability-providers", tag = "providers",
    params(ProviderListQuery),
    responses((status = 200, body = ProviderList)))]
async fn list_providers(
    State(st): State<ProvidersApi>,
    _who: Principal,
    ApiQuery(q): ApiQuery<ProviderListQuery>,
) -> ApiResult<Json<Value>> {
    let filter = ProviderFilter {
        online_status: parse_one::<OnlineStatus>("online_status", q.online_status.as_deref())?,
    };
    let providers = st.providers.store().list_providers(filter).await?;
    Ok(Json(json!({ "providers": providers })))
}

/// One provider (any role).
#[utoipa::path(get, path = "/capability-providers/{provider_id}", tag = "providers",
    params(("provider_id" = String, Path)),
    responses(
        (status = 200, body = CapabilityProvider),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn get_provider(
    State(st): State<ProvidersApi>,
    _who: Principal,
    Path(provider_id): Path<String>,
) -> ApiResult<Json<CapabilityProvider>> {
    st.providers
        .store()
        .get_provider(&provider_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("provider", &provider_id))
}

/// Register a provider's capabilities (the provider itself or an admin).
#[utoipa::path(post, path = "/capabilities/register", tag = "capabilities",
    request_body = CapabilityBatchRegisterRequest,
    responses(
        (status = 200, body = CapabilityBatchRegisterResponse),
        (status = 404, description = "`not_found`: the provider is not registered", body = ErrorBody),
        (status = 403, description = "`provider_mismatch`: a provider token acting for another provider id, or `forbidden`", body = ErrorBody),
        (status = 409, description = "A conflict with what is stored (its code and details)", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
    ))]
async fn register(
    State(st): State<ProvidersApi>,
    who: Principal,
    ValidJson(req): ValidJson<CapabilityBatchRegisterRequest>,
) -> ApiResult<Json<CapabilityBatchRegisterResponse>> {
    require_provider_or_admin(&who, &req.provider_id)?;
    Ok(Json(
        st.providers.register_capabilities(&who.name, req).await?,
    ))
}

/// A provider's heartbeat over HTTP (the provider itself or an admin).
#[utoipa::path(post, path = "/capabilities/heartbeat", tag = "capabilities",
    request_body = HeartbeatRequest,
    responses(
        (status = 200, body = HeartbeatResponse),
        (status = 404, description = "`not_found`: the provider is not registered", body = ErrorBody),
        (status = 403, description = "`provider_mismatch`: a provider token acting for another provider id, or `forbidden`", body = ErrorBody),
        (status = 409, description = "A conflict with what is stored (its code and details)", body = ErrorBody),
        (status = 507, description = "`storage_full`", body = ErrorBody),
    ))]
async fn heartbeat(
    State(st): State<ProvidersApi>,
    who: Principal,
    ValidJson(req): ValidJson<HeartbeatRequest>,
) -> ApiResult<Json<HeartbeatResponse>> {
    require_provider_or_admin(&who, &req.provider_id)?;
    Ok(Json(st.providers.heartbeat(&who.name, req).await?))
}

/// What the lease engine knows that the store does not: which
/// capabilities are held, and which a failed health check holds out
/// (with why).
struct Overlay {
    held: HashSet<String>,
    check_failures: HashMap<String, String>,
}

impl Overlay {
    async fn read(leases: &crate::leases::LeaseEngine) -> Self {
        Self {
            held: leases.held_capabilities().await,
            check_failures: leases.check_failures(),
        }
    }

    /// Show `leased` for held capabilities that are otherwise available,
    /// and `health_status: unhealthy` with `health_check_reason` for those
    /// a failed health check holds out (docs/policy.md "Health checks").
    fn apply(&self, mut caps: Vec<Capability>) -> Vec<Capability> {
        for c in &mut caps {
            if c.status == CapabilityStatus::Available && self.held.contains(&c.capability_id) {
                c.status = CapabilityStatus::Leased;
            }
            if let Some(reason) = self.check_failures.get(&c.capability_id) {
                c.health_status = HealthStatus::Unhealthy;
                c.health_check_reason = Some(reason.clone());
            }
        }
        caps
    }
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct ListQuery {
    #[serde(rename = "type")]
    #[param(value_type = Option<CapabilityType>)]
    capability_type: Option<String>,
    provider_id: Option<String>,
    #[param(value_type = Option<CapabilityStatus>)]
    status: Option<String>,
    tag: Option<String>,
}

/// Capabilities, filtered (any role).
#[utoipa::path(get, path = "/capabilities", tag = "capabilities",
    params(ListQuery),
    responses((status = 200, body = CapabilityList)))]
async fn list(
    State(st): State<ProvidersApi>,
    _who: Principal,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Value>> {
    let status = parse_one::<CapabilityStatus>("status", q.status.as_deref())?;
    let filter = CapabilityFilter {
        capability_type: parse_one::<CapabilityType>("type", q.capability_type.as_deref())?,
        provider_id: q.provider_id.filter(|s| !s.is_empty()),
        // `leased` and `available` are told apart only after the overlay.
        status: status
            .filter(|s| !matches!(s, CapabilityStatus::Leased | CapabilityStatus::Available)),
        // Stored tags are NFC (shared_protocol::validate::nfc): match the
        // same spelling.
        tag: q.tag.filter(|s| !s.is_empty()).map(|mut t| {
            shared_protocol::validate::nfc(&mut t);
            t
        }),
    };
    let caps = st.providers.store().list_capabilities(filter).await?;
    let caps: Vec<Capability> = Overlay::read(&st.leases)
        .await
        .apply(caps)
        .into_iter()
        .filter(|c| status.is_none_or(|s| c.status == s))
        .collect();
    Ok(Json(json!({ "capabilities": caps })))
}

/// One capability (any role).
#[utoipa::path(get, path = "/capabilities/{capability_id}", tag = "capabilities",
    params(("capability_id" = String, Path)),
    responses(
        (status = 200, body = Capability),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn get_one(
    State(st): State<ProvidersApi>,
    _who: Principal,
    Path(capability_id): Path<String>,
) -> ApiResult<Json<Capability>> {
    let cap = st
        .providers
        .store()
        .get_capability(&capability_id)
        .await?
        .ok_or_else(|| ApiError::not_found("capability", &capability_id))?;
    Ok(Json(
        Overlay::read(&st.leases).await.apply(vec![cap]).remove(0),
    ))
}

#[derive(Deserialize, utoipa::IntoParams)]
#[into_params(parameter_in = Query)]
struct HistoryQuery {
    /// At least 1, default 100; more than 10000 reads 10000.
    #[param(minimum = 1)]
    limit: Option<usize>,
}

/// A capability's health snapshots, newest first (any role).
#[utoipa::path(get, path = "/capabilities/{capability_id}/health-history", tag = "capabilities",
    params(("capability_id" = String, Path), HistoryQuery),
    responses(
        (status = 200, body = HealthHistory),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn health_history(
    State(st): State<ProvidersApi>,
    _who: Principal,
    Path(capability_id): Path<String>,
    ApiQuery(q): ApiQuery<HistoryQuery>,
) -> ApiResult<Json<Value>> {
    if st
        .providers
        .store()
        .get_capability(&capability_id)
        .await?
        .is_none()
    {
        return Err(ApiError::not_found("capability", &capability_id));
    }
    let limit = crate::api::list_limit(q.limit, 100, 10_000)?;
    let snapshots = st
        .providers
        .store()
        .health_history(&capability_id, limit)
        .await?;
    Ok(Json(
        json!({ "capability_id": capability_id, "snapshots": snapshots }),
    ))
}
