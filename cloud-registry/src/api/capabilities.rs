//! Capabilities (seed 001 §2.2.2, §4.2, §4.3):
//! - `POST /api/v1/capabilities/register`, `POST /api/v1/capabilities/heartbeat`:
//!   the provider itself or an admin;
//! - `GET /api/v1/capabilities[?type=&provider_id=&status=&tag=]`,
//!   `GET /api/v1/capabilities/{capability_id}`,
//!   `GET /api/v1/capabilities/{capability_id}/health-history[?limit=N]`:
//!   any role.
//!
//! `status` is `leased` while a lease holds the capability (asked of the
//! lease engine at read time); otherwise the stored `available`, `offline`
//! or `maintenance`.

use std::collections::HashSet;

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use shared_protocol::capability::{
    Capability, CapabilityBatchRegisterRequest, CapabilityBatchRegisterResponse, CapabilityStatus,
    CapabilityType,
};
use shared_protocol::provider::{HeartbeatRequest, HeartbeatResponse};

use super::providers::require_provider_or_admin;
use super::{parse_one, ApiQuery, ApiState};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::ValidJson;
use crate::store::CapabilityFilter;

pub(super) fn routes() -> axum::Router<ApiState> {
    Router::new()
        .route("/capabilities/register", post(register))
        .route("/capabilities/heartbeat", post(heartbeat))
        .route("/capabilities", get(list))
        .route("/capabilities/{capability_id}", get(get_one))
        .route(
            "/capabilities/{capability_id}/health-history",
            get(health_history),
        )
}

async fn register(
    State(st): State<ApiState>,
    who: Principal,
    ValidJson(req): ValidJson<CapabilityBatchRegisterRequest>,
) -> ApiResult<Json<CapabilityBatchRegisterResponse>> {
    require_provider_or_admin(&who, &req.provider_id)?;
    Ok(Json(
        st.registry.register_capabilities(&who.name, req).await?,
    ))
}

async fn heartbeat(
    State(st): State<ApiState>,
    who: Principal,
    ValidJson(req): ValidJson<HeartbeatRequest>,
) -> ApiResult<Json<HeartbeatResponse>> {
    require_provider_or_admin(&who, &req.provider_id)?;
    Ok(Json(st.registry.heartbeat(&who.name, req).await?))
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
    State(st): State<ApiState>,
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
    let caps = st.registry.store().list_capabilities(filter).await?;
    let held = st.leases.held_capabilities().await;
    let caps: Vec<Capability> = overlay(caps, &held)
        .into_iter()
        .filter(|c| status.is_none_or(|s| c.status == s))
        .collect();
    Ok(Json(json!({ "capabilities": caps })))
}

async fn get_one(
    State(st): State<ApiState>,
    _who: Principal,
    Path(capability_id): Path<String>,
) -> ApiResult<Json<Capability>> {
    let cap = st
        .registry
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
    State(st): State<ApiState>,
    _who: Principal,
    Path(capability_id): Path<String>,
    ApiQuery(q): ApiQuery<HistoryQuery>,
) -> ApiResult<Json<Value>> {
    if st
        .registry
        .store()
        .get_capability(&capability_id)
        .await?
        .is_none()
    {
        return Err(ApiError::not_found("capability", &capability_id));
    }
    let limit = super::list_limit(q.limit, 100, 10_000)?;
    let snapshots = st
        .registry
        .store()
        .health_history(&capability_id, limit)
        .await?;
    Ok(Json(
        json!({ "capability_id": capability_id, "snapshots": snapshots }),
    ))
}
