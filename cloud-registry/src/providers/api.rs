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
//! or `maintenance`. Also the HTTP mapping of [`StoreError`].

use std::collections::HashSet;
use std::sync::Arc;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use shared_protocol::capability::{
    Capability, CapabilityBatchRegisterRequest, CapabilityBatchRegisterResponse, CapabilityStatus,
    CapabilityType,
};
use shared_protocol::provider::{
    CapabilityProvider, HeartbeatRequest, HeartbeatResponse, OnlineStatus, ProviderRegisterRequest,
    ProviderRegisterResponse,
};

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
pub fn routes(state: ProvidersApi) -> Router {
    Router::new()
        .route("/capability-providers/register", post(register_provider))
        .route("/capability-providers", get(list_providers))
        .route("/capability-providers/{provider_id}", get(get_provider))
        .route("/capabilities/register", post(register))
        .route("/capabilities/heartbeat", post(heartbeat))
        .route("/capabilities", get(list))
        .route("/capabilities/{capability_id}", get(get_one))
        .route(
            "/capabilities/{capability_id}/health-history",
            get(health_history),
        )
        .with_state(state)
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

async fn register_provider(
    State(st): State<ProvidersApi>,
    who: Principal,
    ValidJson(req): ValidJson<ProviderRegisterRequest>,
) -> ApiResult<Json<ProviderRegisterResponse>> {
    require_provider_or_admin(&who, &req.provider_id)?;
    Ok(Json(st.providers.register_provider(&who.name, req).await?))
}

#[derive(Deserialize)]
struct ProviderListQuery {
    online_status: Option<String>,
}

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

async fn heartbeat(
    State(st): State<ProvidersApi>,
    who: Principal,
    ValidJson(req): ValidJson<HeartbeatRequest>,
) -> ApiResult<Json<HeartbeatResponse>> {
    require_provider_or_admin(&who, &req.provider_id)?;
    Ok(Json(st.providers.heartbeat(&who.name, req).await?))
}

/// Show `leased` for held capabilities that are otherwise available.
fn overlay(mut caps: Vec<Capability>, held: &HashSet<String>) -> Vec<Capability> {
    for c in &mut caps {
        if c.status == CapabilityStatus::Available && held.contains(&c.capability_id) {
            c.status = CapabilityStatus::Leased;
        }
    }
    caps
}

#[derive(Deserialize)]
struct ListQuery {
    #[serde(rename = "type")]
    capability_type: Option<String>,
    provider_id: Option<String>,
    status: Option<String>,
    tag: Option<String>,
}

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
    let held = st.leases.held_capabilities().await;
    let caps: Vec<Capability> = overlay(caps, &held)
        .into_iter()
        .filter(|c| status.is_none_or(|s| c.status == s))
        .collect();
    Ok(Json(json!({ "capabilities": caps })))
}

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
    let held = st.leases.held_capabilities().await;
    Ok(Json(overlay(vec![cap], &held).remove(0)))
}

#[derive(Deserialize)]
struct HistoryQuery {
    limit: Option<usize>,
}

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
