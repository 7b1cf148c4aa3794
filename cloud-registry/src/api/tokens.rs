//! `POST /api/v1/auth/tokens`: mint a bearer token (admin only).
//!
//! Body `{"role": "provider", "name": "provider-lab-01"}`; answer
//! `{"token", "principal", "role"}` (the token is shown only here). An
//! `admin` may mint `operator`, `audit_agent`, `provider` and `viewer`
//! tokens; only a `super_admin` may mint `admin` or `super_admin` ones.
//! Unlike `cloud-registry token create`, a token minted here works at once
//! (the running registry's token cache learns it).

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::post;
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use shared_protocol::api::Role;
use shared_protocol::validate::{check_id, Validate, ValidationError};

use super::ApiState;
use crate::auth::Principal;
use crate::error::{ApiError, ApiResult};
use crate::extract::ValidJson;

pub(super) fn routes() -> axum::Router<ApiState> {
    Router::new().route("/auth/tokens", post(create))
}

/// Body of `POST /api/v1/auth/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenCreateRequest {
    pub role: Role,
    /// The principal, e.g. a provider id or `audit:hardware-auditor-01`.
    pub name: String,
}

impl Validate for TokenCreateRequest {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("name", &self.name)
    }
}

/// Answer of `POST /api/v1/auth/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenCreated {
    pub token: String,
    pub principal: String,
    pub role: Role,
}

async fn create(
    State(st): State<ApiState>,
    who: Principal,
    ValidJson(req): ValidJson<TokenCreateRequest>,
) -> ApiResult<(StatusCode, Json<TokenCreated>)> {
    who.require(&[Role::Admin])?;
    if matches!(req.role, Role::Admin | Role::SuperAdmin) && who.role != Role::SuperAdmin {
        return Err(ApiError::forbidden(format!(
            "only a super_admin may create `{}` tokens",
            req.role
        )));
    }
    let token = st.auth.create_token(req.role, &req.name).await?;
    tracing::info!(by = %who.name, principal = %req.name, role = %req.role, "token created");
    Ok((
        StatusCode::CREATED,
        Json(TokenCreated {
            token,
            principal: req.name,
            role: req.role,
        }),
    ))
}
