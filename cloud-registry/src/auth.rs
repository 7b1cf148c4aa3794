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
pub fn create_token_sync(
    conn: &Connection,
    role: Role,
    principal: &str,
) -> rusqlite::Result<String> {
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
                Err(e) => {
                    tracing::warn!(principal = %name, error = %e, "token with unknown role ignored")
                }
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

    /// The principal of a plaintext token, if it is in the cache. Tokens
    /// created by another process (the `token create` CLI) reach the cache
    /// through [`Authenticator::authenticate_fresh`].
    pub fn authenticate(&self, token: &str) -> Option<Principal> {
        let hash = hash_token(token);
        self.by_hash.read().ok()?.get(&hash).cloned()
    }

    /// Like [`Authenticator::authenticate`], but on a cache miss looks the
    /// hash up in the store (read connection) and caches what it finds, so a
    /// token created with the CLI while the registry runs works at once.
    /// Unknown tokens are not cached.
    pub async fn authenticate_fresh(&self, token: &str) -> Option<Principal> {
        if let Some(p) = self.authenticate(token) {
            return Some(p);
        }
        let hash = hash_token(token);
        let key = hash.clone();
        let row = self
            .db
            .read(move |conn| {
                conn.query_row(
                    "SELECT principal, role FROM api_tokens WHERE token_hash = ?1 AND revoked_at IS NULL",
                    params![key],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?)),
                )
                .ok()
            })
            .await
            .ok()
            .flatten()?;
        let principal = Principal {
            name: row.0,
            role: row.1.parse().ok()?,
        };
        if let Ok(mut map) = self.by_hash.write() {
            map.insert(hash, principal.clone());
        }
        Some(principal)
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
            .ok_or_else(|| {
                ApiError::unauthenticated("missing `Authorization: Bearer <token>` header")
            })?;
        let token = header
            .strip_prefix("Bearer ")
            .ok_or_else(|| ApiError::unauthenticated("expected a Bearer token"))?;
        auth.authenticate_fresh(token.trim())
            .await
            .ok_or_else(|| ApiError::unauthenticated("unknown or revoked token"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_token_created_by_another_process_authenticates_without_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.db");
        let db = Db::open(&path, |c| migrate(c)).unwrap();
        let auth = Authenticator::load(db).await.unwrap();
        // The CLI writes through its own connection while the registry runs.
        let cli = Connection::open(&path).unwrap();
        let token = create_token_sync(&cli, Role::AuditAgent, "audit:led-01").unwrap();
        assert_eq!(auth.authenticate(&token), None, "not in the cache yet");
        let p = auth
            .authenticate_fresh(&token)
            .await
            .expect("found in the store");
        assert_eq!(p.name, "audit:led-01");
        assert_eq!(p.role, Role::AuditAgent);
        assert_eq!(
            auth.authenticate(&token),
            Some(p),
            "cached after the lookup"
        );
        assert_eq!(auth.authenticate_fresh("blk_unknown").await, None);
    }
}
