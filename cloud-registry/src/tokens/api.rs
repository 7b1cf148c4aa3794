//! Bearer tokens over HTTP (admin only, but `whoami`):
//!
//! - `GET /api/v1/auth/whoami` (any valid token): `{"principal", "role"}`
//!   of the calling token; 401 `unauthenticated` without one.
//! - `POST /api/v1/auth/tokens`: mint a token.
//! - `GET /api/v1/tokens`: list every token, `{"tokens": [{"name", "role",
//!   "created_at", "revoked", "revoked_at"?}]}`, oldest first; never a
//!   secret.
//! - `DELETE /api/v1/tokens/{name}`: revoke every valid token of principal
//!   `name`; answer `{"name", "revoked_tokens"}` (0 when all were revoked
//!   already). 404 `not_found` when no token was ever made for `name`. An
//!   `admin` may not revoke `admin` or `super_admin` tokens (403 naming
//!   the principal's role). The
//!   running registry forgets the tokens at once: their next request is
//!   401 `unauthenticated`.
//!
//! Minting:
//! Body `{"role": "provider", "name": "provider-lab-01"}`; answer
//! `{"token", "principal", "role"}` (the token is shown only here). An
//! `admin` may mint `operator`, `audit_agent`, `provider` and `viewer`
//! tokens; only a `super_admin` may mint `admin` or `super_admin` ones.
//! Unlike `cloud-registry token create`, a token minted here works at once
//! (the running registry's token cache learns it).

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::Json;
use serde::{Deserialize, Serialize};
use shared_protocol::api::{ErrorBody, Role};
use shared_protocol::validate::{check_id, Validate, ValidationError};

use crate::auth::{Principal, Revoked, TokenError, TokenInfo};
use crate::error::{ApiError, ApiResult};
use crate::extract::ValidJson;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// What the token handlers use.
#[derive(Clone)]
pub struct TokensApi {
    pub auth: std::sync::Arc<crate::auth::Authenticator>,
}

/// The token routes (relative to `/api/v1`).
pub fn routes(state: TokensApi) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(whoami))
        .routes(routes!(create))
        .routes(routes!(list))
        .routes(routes!(revoke))
        .with_state(state)
}

/// Answer of `GET /api/v1/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenList {
    /// Oldest first; revoked tokens included.
    pub tokens: Vec<TokenInfo>,
}

/// Answer of `DELETE /api/v1/tokens/{name}`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokensRevoked {
    /// The principal.
    pub name: String,
    /// Tokens that were valid and are now revoked.
    pub revoked_tokens: usize,
}

/// Answer of `GET /api/v1/auth/whoami`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct WhoAmI {
    /// The token's principal name.
    pub principal: String,
    /// The token's role.
    pub role: Role,
}

/// The calling token's principal and role.
#[utoipa::path(get, path = "/auth/whoami", tag = "tokens",
    responses((status = 200, body = WhoAmI)))]
async fn whoami(who: Principal) -> Json<WhoAmI> {
    Json(WhoAmI {
        principal: who.name,
        role: who.role,
    })
}

/// Every token, oldest first, never a secret (admin).
#[utoipa::path(get, path = "/tokens", tag = "tokens",
    responses((status = 200, body = TokenList)))]
async fn list(State(st): State<TokensApi>, who: Principal) -> ApiResult<Json<TokenList>> {
    who.require(&[Role::Admin])?;
    Ok(Json(TokenList {
        tokens: st.auth.list().await?,
    }))
}

/// Revoke every valid token of principal `name` (admin; only a
/// `super_admin` revokes admin tokens).
#[utoipa::path(delete, path = "/tokens/{name}", tag = "tokens",
    params(("name" = String, Path, description = "The principal")),
    responses(
        (status = 200, body = TokensRevoked),
        (status = 404, description = "`not_found`: no token was ever made for `name`", body = ErrorBody),
        (status = 422, description = "`invalid_field`: `name` is no valid id", body = ErrorBody),
    ))]
async fn revoke(
    State(st): State<TokensApi>,
    who: Principal,
    Path(name): Path<String>,
) -> ApiResult<Json<TokensRevoked>> {
    who.require(&[Role::Admin])?;
    check_id("name", &name).map_err(|e| ApiError::invalid_field("name", e.to_string()))?;
    if who.role != Role::SuperAdmin {
        let roles = st.auth.roles_of(&name).await?;
        if let Some(role) = roles
            .into_iter()
            .find(|r| matches!(r, Role::Admin | Role::SuperAdmin))
        {
            let article = if role == Role::Admin { "an" } else { "a" };
            return Err(only_super_admin(
                &who,
                format!(
                    "only a super_admin may revoke the tokens of `{name}`, which is {article} `{role}`"
                ),
            ));
        }
    }
    match st.auth.revoke(&name).await? {
        Revoked::UnknownName => Err(ApiError::not_found("token", &name)),
        Revoked::Tokens(n) => {
            tracing::info!(by = %who.name, principal = %name, tokens = n, "tokens revoked");
            Ok(Json(TokensRevoked {
                name,
                revoked_tokens: n,
            }))
        }
    }
}

/// 403 `forbidden` for what only a `super_admin` may do, with the details
/// of [`Principal::require`]'s refusal (`role` of the caller,
/// `allowed_roles`).
fn only_super_admin(who: &Principal, message: String) -> ApiError {
    ApiError::forbidden(message).with_details(serde_json::json!({
        "role": who.role,
        "allowed_roles": [Role::SuperAdmin],
    }))
}

/// Body of `POST /api/v1/auth/tokens`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
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
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
pub struct TokenCreated {
    pub token: String,
    pub principal: String,
    pub role: Role,
}

/// Mint a token; the secret is shown only in this answer (admin; only a
/// `super_admin` mints `admin` or `super_admin` tokens).
#[utoipa::path(post, path = "/auth/tokens", tag = "tokens",
    request_body = TokenCreateRequest,
    responses(
        (status = 201, body = TokenCreated),
        (status = 409, description = "`principal_role_conflict`: the name has tokens of another role", body = ErrorBody),
    ))]
async fn create(
    State(st): State<TokensApi>,
    who: Principal,
    ValidJson(req): ValidJson<TokenCreateRequest>,
) -> ApiResult<(StatusCode, Json<TokenCreated>)> {
    who.require(&[Role::Admin])?;
    if matches!(req.role, Role::Admin | Role::SuperAdmin) && who.role != Role::SuperAdmin {
        return Err(only_super_admin(
            &who,
            format!("only a super_admin may create `{}` tokens", req.role),
        ));
    }
    let token = st
        .auth
        .create_token(req.role, &req.name)
        .await
        .map_err(|e| match e {
            TokenError::RoleConflict { .. } => {
                ApiError::conflict("principal_role_conflict", e.to_string())
            }
            TokenError::Db(e) => ApiError::from(e),
            TokenError::Sqlite(e) => ApiError::from(crate::db::DbError::Sqlite(e)),
        })?;
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
