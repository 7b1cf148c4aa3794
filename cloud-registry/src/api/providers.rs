//! Providers (seed 001 §2.2.1, §4.1):
//! - `POST /api/v1/capability-providers/register`: the provider itself
//!   (token role `provider`, principal = `provider_id`) or an admin;
//! - `GET /api/v1/capability-providers[?online_status=online|offline]`,
//!   `GET /api/v1/capability-providers/{provider_id}`: any role.

use axum::extract::{Path, State};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use shared_protocol::provider::{
    CapabilityProvider, OnlineStatus, ProviderRegisterRequest, ProviderRegisterResponse,
};

use super::{parse_one, ApiQuery, ApiState};
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::ValidJson;
use crate::store::ProviderFilter;

pub(super) fn routes() -> axum::Router<ApiState> {
    Router::new()
        .route("/capability-providers/register", post(register))
        .route("/capability-providers", get(list))
        .route("/capability-providers/{provider_id}", get(get_one))
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

async fn register(
    State(st): State<ApiState>,
    who: Principal,
    ValidJson(req): ValidJson<ProviderRegisterRequest>,
) -> ApiResult<Json<ProviderRegisterResponse>> {
    require_provider_or_admin(&who, &req.provider_id)?;
    Ok(Json(st.registry.register_provider(&who.name, req).await?))
}

#[derive(Deserialize)]
struct ListQuery {
    online_status: Option<String>,
}

async fn list(
    State(st): State<ApiState>,
    _who: Principal,
    ApiQuery(q): ApiQuery<ListQuery>,
) -> ApiResult<Json<Value>> {
    let filter = ProviderFilter {
        online_status: parse_one::<OnlineStatus>("online_status", q.online_status.as_deref())?,
    };
    let providers = st.registry.store().list_providers(filter).await?;
    Ok(Json(json!({ "providers": providers })))
}

async fn get_one(
    State(st): State<ApiState>,
    _who: Principal,
    Path(provider_id): Path<String>,
) -> ApiResult<Json<CapabilityProvider>> {
    st.registry
        .store()
        .get_provider(&provider_id)
        .await?
        .map(Json)
        .ok_or_else(|| ApiError::not_found("provider", &provider_id))
}
