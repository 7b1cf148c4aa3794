//! Bearer-token authentication: every request carries
//! `Authorization: Bearer <token>`; the token maps to a principal and a role.
//!
//! Tokens are random 256-bit strings shown once at creation
//! (`cloud-registry token create --role R --name N`); only their SHA-256 is
//! stored. A provider's token doubles as its MQTT password, with the
//! provider id as MQTT user name.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use rusqlite::{params, Connection};
use sha2::{Digest, Sha256};
use shared_protocol::api::Role;

use crate::db::{Db, DbError};
use crate::error::ApiError;

/// Who is calling: the token's principal name and role.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// Unique name, e.g. `audit:multimodal-auditor-01` or a provider id.
    pub name: String,
    pub role: Role,
}

impl Principal {
    /// Ok when the principal has one of `roles` (`super_admin` passes every
    /// check); otherwise 403 `forbidden` naming the roles allowed.
    pub fn require(&self, roles: &[Role]) -> Result<(), ApiError> {
        if self.role == Role::SuperAdmin || roles.contains(&self.role) {
            return Ok(());
        }
        let allowed: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
        Err(ApiError::forbidden(format!(
            "role `{}` may not do this; allowed: {}",
            self.role,
            allowed.join(", ")
        ))
        .with_details(serde_json::json!({ "role": self.role, "allowed_roles": allowed })))
    }

    /// True for `admin` and `super_admin`.
    pub fn is_admin(&self) -> bool {
        matches!(self.role, Role::Admin | Role::SuperAdmin)
    }
}

/// Token store with an in-memory cache of hashes (a request never touches
/// SQLite to authenticate).
pub struct Authenticator {
    db: Db,
    by_hash: RwLock<HashMap<String, Principal>>,
}

/// Create the `api_tokens` table.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS api_tokens (
            token_hash TEXT PRIMARY KEY,
            principal  TEXT NOT NULL,
            role       TEXT NOT NULL,
            created_at TEXT NOT NULL,
            revoked_at TEXT
        );
        CREATE INDEX IF NOT EXISTS api_tokens_principal ON api_tokens(principal);",
    )
}

/// Lowercase hex SHA-256 of a token.
pub fn hash_token(token: &str) -> String {
    hex::encode(Sha256::digest(token.as_bytes()))
}

/// A fresh random token: `blk_` and 64 hex digits (244 random bits from two
/// v4 UUIDs).
pub fn new_token() -> String {
    format!(
        "blk_{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    )
}

/// Insert a token for `principal` with `role` using an open connection
/// (the CLI path). Returns the plaintext token, which is not stored.
pub fn create_token_sync(conn: &Connection, role: Role, principal: &str) -> rusqlite::Result<String> {
    let token = new_token();
    conn.execute(
        "INSERT INTO api_tokens (token_hash, principal, role, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![
            hash_token(&token),
            principal,
            role.as_str(),
            chrono::Utc::now().to_rfc3339()
        ],
    )?;
    Ok(token)
}

impl Authenticator {
    /// Load every non-revoked token hash from the store.
    pub async fn load(db: Db) -> Result<Arc<Self>, DbError> {
        let rows = db
            .read(|conn| -> rusqlite::Result<Vec<(String, String, String)>> {
                let mut stmt = conn.prepare(
                    "SELECT token_hash, principal, role FROM api_tokens WHERE revoked_at IS NULL",
                )?;
                let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)))?;
                rows.collect()
            })
            .await??;
        let mut by_hash = HashMap::new();
        for (hash, name, role) in rows {
            match role.parse::<Role>() {
                Ok(role) => {
                    by_hash.insert(hash, Principal { name, role });
                }
                Err(e) => tracing::warn!(principal = %name, error = %e, "token with unknown role ignored"),
            }
        }
        Ok(Arc::new(Self {
            db,
            by_hash: RwLock::new(by_hash),
        }))
    }

    /// Create and store a token; returns the plaintext (shown once).
    pub async fn create_token(&self, role: Role, principal: &str) -> Result<String, DbError> {
        let name = principal.to_string();
        let token = self
            .db
            .write(move |conn| create_token_sync(conn, role, &name))
            .await??;
        if let Ok(mut map) = self.by_hash.write() {
            map.insert(
                hash_token(&token),
                Principal {
                    name: principal.to_string(),
                    role,
                },
            );
        }
        Ok(token)
    }

    /// The principal of a plaintext token, if it is known and not revoked.
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let hash = hash_token(token);
        self.by_hash.read().ok()?.get(&hash).cloned()
    }
}

/// The extractor: handlers take a `Principal` argument. Needs an
/// `Extension<Arc<Authenticator>>` layer on the router.
impl<S: Send + Sync> FromRequestParts<S> for Principal {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Self::Rejection> {
        let auth = parts
            .extensions
            .get::<Arc<Authenticator>>()
            .ok_or_else(|| ApiError::internal("authenticator layer missing"))?;
        let header = parts
            .headers
            .get(axum::http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .ok_or_else(|| ApiError::unauthenticated("missing `Authorization: Bearer <token>` header"))?;
        let token = header
            .strip_prefix("Bearer ")
            .ok_or_else(|| ApiError::unauthenticated("expected a Bearer token"))?;
        auth.authenticate(token.trim())
            .ok_or_else(|| ApiError::unauthenticated("unknown or revoked token"))
    }
}
