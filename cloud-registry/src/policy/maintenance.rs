//! Maintenance (docs/policy.md "Maintenance", docs/http-api.md):
//! - `POST /api/v1/capabilities/{id}/maintenance` `{"reason"}` and
//!   `DELETE` of the same path: one capability into and out of
//!   maintenance;
//! - `POST` / `DELETE /api/v1/capability-providers/{id}/maintenance`:
//!   every capability of a provider;
//! - `DELETE /api/v1/capabilities/{id}`: remove a retired capability (it
//!   must be in maintenance, with no lease holding it or waiting for it).
//!
//! Admins only. The store records the status and its event first, then
//! the lease engine stops granting and tells the holders (a
//! preemption-style notice with the grace period,
//! `preempt_reason: "maintenance"`).

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::Json;
use chrono::Utc;
use serde::{Deserialize, Serialize};
use shared_protocol::api::{ErrorBody, Role};
use shared_protocol::capability::Capability;
use shared_protocol::lease::CapabilityLease;
use shared_protocol::validate::{check_display_text, Validate, ValidationError};

use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::ValidJson;
use crate::leases::LeaseEngine;
use crate::providers::store::CapabilityFilter;
use crate::providers::Providers;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// Longest maintenance reason, characters.
pub const MAX_REASON_CHARS: usize = 500;

/// What the maintenance handlers use.
#[derive(Clone)]
pub struct MaintenanceApi {
    pub providers: Arc<Providers>,
    pub leases: Arc<LeaseEngine>,
}

/// The maintenance routes (relative to `/api/v1`).
pub fn routes(state: MaintenanceApi) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(capability_start, capability_end))
        .routes(routes!(provider_start, provider_end))
        .routes(routes!(remove))
        .with_state(state)
}

/// `DELETE /capabilities/{capability_id}` answer.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct Removed {
    pub capability_id: String,
    /// Always true.
    pub removed: bool,
}

/// `POST …/maintenance` body.
#[derive(Debug, Clone, Deserialize, Serialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MaintenanceRequest {
    /// Why (shown in events, refusals and to holders): 1..=500
    /// characters, no control characters.
    pub reason: String,
}

impl Validate for MaintenanceRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        let n = self.reason.trim().chars().count();
        if n == 0 || self.reason.chars().count() > MAX_REASON_CHARS {
            return Err(ValidationError::new(
                "reason",
                format!("must be 1..={MAX_REASON_CHARS} characters, not blank"),
            ));
        }
        check_display_text("reason", &self.reason)
    }
}

/// The answer of a maintenance change.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct MaintenanceResponse {
    /// Every capability named, as stored now.
    pub capabilities: Vec<Capability>,
    /// Holders told to give way (now `grace_period`).
    pub notified_leases: Vec<CapabilityLease>,
}

async fn apply(
    st: &MaintenanceApi,
    who: &Principal,
    ids: Vec<String>,
    reason: Option<String>,
) -> ApiResult<Json<MaintenanceResponse>> {
    let change = st
        .providers
        .store()
        .set_maintenance(&who.name, ids.clone(), reason.clone(), Utc::now())
        .await?;
    st.providers.bus().publish(change.events.clone());
    let notified_leases = st.leases.set_maintenance(&ids, reason.as_deref()).await?;
    tracing::info!(principal = %who.name, capabilities = ?ids, reason = ?reason, notified = notified_leases.len(), "maintenance changed");
    Ok(Json(MaintenanceResponse {
        capabilities: change.capabilities,
        notified_leases,
    }))
}

/// Put a capability into maintenance (admin).
#[utoipa::path(post, path = "/capabilities/{capability_id}/maintenance", tag = "maintenance",
    request_body = MaintenanceRequest,
    params(("capability_id" = String, Path, description = "The capability")),
    responses(
        (status = 200, body = MaintenanceResponse),
        (status = 404, description = "`not_found`: no such capability", body = ErrorBody),
    ))]
async fn capability_start(
    State(st): State<MaintenanceApi>,
    who: Principal,
    Path(capability_id): Path<String>,
    ValidJson(req): ValidJson<MaintenanceRequest>,
) -> ApiResult<Json<MaintenanceResponse>> {
    who.require(&[Role::Admin])?;
    apply(&st, &who, vec![capability_id], Some(req.reason)).await
}

/// Take a capability out of maintenance (admin).
#[utoipa::path(delete, path = "/capabilities/{capability_id}/maintenance", tag = "maintenance",
    params(("capability_id" = String, Path, description = "The capability")),
    responses(
        (status = 200, body = MaintenanceResponse),
        (status = 404, description = "`not_found`: no such capability", body = ErrorBody),
    ))]
async fn capability_end(
    State(st): State<MaintenanceApi>,
    who: Principal,
    Path(capability_id): Path<String>,
) -> ApiResult<Json<MaintenanceResponse>> {
    who.require(&[Role::Admin])?;
    apply(&st, &who, vec![capability_id], None).await
}

async fn provider_ids(st: &MaintenanceApi, provider_id: &str) -> ApiResult<Vec<String>> {
    if st
        .providers
        .store()
        .get_provider(provider_id)
        .await?
        .is_none()
    {
        return Err(ApiError::not_found("provider", provider_id));
    }
    let caps = st
        .providers
        .store()
        .list_capabilities(CapabilityFilter {
            provider_id: Some(provider_id.to_string()),
            ..Default::default()
        })
        .await?;
    Ok(caps.into_iter().map(|c| c.capability_id).collect())
}

/// Put every capability of a provider into maintenance (admin).
#[utoipa::path(post, path = "/capability-providers/{provider_id}/maintenance", tag = "maintenance",
    request_body = MaintenanceRequest,
    params(("provider_id" = String, Path, description = "The provider")),
    responses(
        (status = 200, body = MaintenanceResponse),
        (status = 404, description = "`not_found`: no such provider", body = ErrorBody),
    ))]
async fn provider_start(
    State(st): State<MaintenanceApi>,
    who: Principal,
    Path(provider_id): Path<String>,
    ValidJson(req): ValidJson<MaintenanceRequest>,
) -> ApiResult<Json<MaintenanceResponse>> {
    who.require(&[Role::Admin])?;
    let ids = provider_ids(&st, &provider_id).await?;
    apply(&st, &who, ids, Some(req.reason)).await
}

/// Take every capability of a provider out of maintenance (admin).
#[utoipa::path(delete, path = "/capability-providers/{provider_id}/maintenance", tag = "maintenance",
    params(("provider_id" = String, Path, description = "The provider")),
    responses(
        (status = 200, body = MaintenanceResponse),
        (status = 404, description = "`not_found`: no such provider", body = ErrorBody),
    ))]
async fn provider_end(
    State(st): State<MaintenanceApi>,
    who: Principal,
    Path(provider_id): Path<String>,
) -> ApiResult<Json<MaintenanceResponse>> {
    who.require(&[Role::Admin])?;
    let ids = provider_ids(&st, &provider_id).await?;
    apply(&st, &who, ids, None).await
}

/// Remove a retired capability: it must be in maintenance and neither
/// held nor waited for (admin).
#[utoipa::path(delete, path = "/capabilities/{capability_id}", tag = "maintenance",
    params(("capability_id" = String, Path, description = "The capability")),
    responses(
        (status = 200, body = Removed),
        (status = 404, description = "`not_found`: no such capability", body = ErrorBody),
        (status = 409, description = "`capability_not_in_maintenance` or `capability_leased`", body = ErrorBody),
    ))]
async fn remove(
    State(st): State<MaintenanceApi>,
    who: Principal,
    Path(capability_id): Path<String>,
) -> ApiResult<Json<Removed>> {
    who.require(&[Role::Admin])?;
    // In maintenance nothing new is granted on it, so nothing can take it
    // between this check and the delete.
    st.leases.check_removable(&capability_id)?;
    let ev = st
        .providers
        .store()
        .remove_capability(&who.name, &capability_id, Utc::now())
        .await?;
    st.providers.bus().publish(vec![ev]);
    st.leases.remove_capability(&capability_id).await;
    Ok(Json(Removed {
        capability_id,
        removed: true,
    }))
}
