//! Bearer-token authentication: every request carries
//! `Authorization: Bearer <token>`; the token maps to a principal and a role.
//!
//! Tokens are random 256-bit strings shown once at creation
//! (`cloud-registry token create --role R --name N`); only their SHA-256 is
//! stored. A provider's token doubles as its MQTT password, with the
//! provider id as MQTT user name.
//!
//! Revoking (`cloud-registry token revoke --name N` or
//! `DELETE /api/v1/tokens/{name}`) marks every token of the principal
//! revoked. Through the API the running registry forgets them at once;
//! a revocation by the CLI reaches its cache within
//! [`REVOCATION_CHECK_INTERVAL`] (checked on the next HTTP request).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use crate::sql::{params, Connection, OptionalExtension};
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
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

/// Token store with an in-memory cache of hashes (a request touches
/// SQLite to authenticate only on a cache miss, and at most once per
/// [`REVOCATION_CHECK_INTERVAL`] to learn of revocations made by the CLI).
pub struct Authenticator {
    db: Db,
    by_hash: RwLock<HashMap<String, Principal>>,
    /// When the store was last asked for revoked tokens.
    revocations_checked: Mutex<Instant>,
}

/// How stale the cache may be about tokens revoked by another process
/// (`cloud-registry token revoke`).
pub const REVOCATION_CHECK_INTERVAL: Duration = Duration::from_secs(1);

/// One stored token as `token list` and `GET /api/v1/tokens` show it:
/// never the secret, nor its hash.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize, utoipa::ToSchema)]
pub struct TokenInfo {
    /// The principal, e.g. `provider-lab-01` or `audit:led-01`.
    pub name: String,
    pub role: Role,
    /// RFC 3339, UTC.
    pub created_at: String,
    pub revoked: bool,
    /// RFC 3339, UTC; absent while the token is valid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revoked_at: Option<String>,
}

/// Every stored token, oldest first (rows with an unknown role are
/// skipped).
pub fn list_tokens_sync(conn: &Connection) -> rusqlite::Result<Vec<TokenInfo>> {
    let mut stmt = conn.prepare(
        "SELECT principal, role, created_at, revoked_at FROM api_tokens
         ORDER BY created_at, principal",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, String>(2)?,
            r.get::<_, Option<String>>(3)?,
        ))
    })?;
    let mut out = Vec::new();
    for row in rows {
        let (name, role, created_at, revoked_at) = row?;
        if let Ok(role) = role.parse::<Role>() {
            out.push(TokenInfo {
                name,
                role,
                created_at,
                revoked: revoked_at.is_some(),
                revoked_at,
            });
        }
    }
    Ok(out)
}

/// What revoking a principal's tokens found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Revoked {
    /// No token was ever created for that name.
    UnknownName,
    /// This many tokens were valid and are now revoked (0: all of them
    /// were revoked already).
    Tokens(usize),
}

/// Revoke every valid token of `principal` (one transaction).
pub fn revoke_tokens_sync(conn: &mut Connection, principal: &str) -> rusqlite::Result<Revoked> {
    let tx = conn.transaction()?;
    let known: i64 = tx.query_row(
        "SELECT count(*) FROM api_tokens WHERE principal = ?1",
        params![principal],
        |r| r.get(0),
    )?;
    if known == 0 {
        return Ok(Revoked::UnknownName);
    }
    let n = tx.execute(
        "UPDATE api_tokens SET revoked_at = ?2 WHERE principal = ?1 AND revoked_at IS NULL",
        params![principal, chrono::Utc::now().to_rfc3339()],
    )?;
    tx.commit()?;
    Ok(Revoked::Tokens(n))
}

/// The roles of the valid tokens of `principal`.
pub fn token_roles_sync(conn: &Connection, principal: &str) -> rusqlite::Result<Vec<Role>> {
    let mut stmt = conn.prepare(
        "SELECT DISTINCT role FROM api_tokens WHERE principal = ?1 AND revoked_at IS NULL",
    )?;
    let roles = stmt.query_map(params![principal], |r| r.get::<_, String>(0))?;
    let mut out = Vec::new();
    for role in roles {
        if let Ok(role) = role?.parse() {
            out.push(role);
        }
    }
    Ok(out)
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

/// Why a token was not created.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// `principal` already has tokens (revoked ones included) of another
    /// role: a token under its name would act as it with other rights.
    #[error("principal `{principal}` already has `{existing}` tokens; a principal keeps one role (create a `{existing}` token for it, or choose another name)")]
    RoleConflict { principal: String, existing: String },
}

/// Insert a token for `principal` with `role` using an open connection
/// (the write thread, or the CLI's own connection). Returns the plaintext
/// token, which is not stored. A principal keeps one role: the check and
/// the insert share one immediate transaction, so two creators cannot
/// race past it.
///
/// Errors: [`TokenError::RoleConflict`], or the store cannot be written.
pub fn create_token_sync(
    conn: &mut Connection,
    role: Role,
    principal: &str,
) -> Result<String, TokenError> {
    let tx = conn.transaction_with_behavior(crate::sql::TransactionBehavior::Immediate)?;
    if let Some(existing) = principal_role_sync(&tx, principal)? {
        if existing != role.as_str() {
            return Err(TokenError::RoleConflict {
                principal: principal.to_string(),
                existing,
            });
        }
    }
    let token = new_token();
    tx.execute(
        "INSERT INTO api_tokens (token_hash, principal, role, created_at) VALUES (?1, ?2, ?3, ?4)",
        params![
            hash_token(&token),
            principal,
            role.as_str(),
            chrono::Utc::now().to_rfc3339()
        ],
    )?;
    tx.commit()?;
    Ok(token)
}

/// True when `provider_id` has provider tokens and every one is revoked (a
/// provider that never had a token, e.g. registered by an admin, is not).
pub fn provider_credentials_revoked_sync(
    conn: &Connection,
    provider_id: &str,
) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT COUNT(*) > 0 AND COUNT(*) = COUNT(revoked_at)
         FROM api_tokens WHERE principal = ?1 AND role = 'provider'",
    )?
    .query_row([provider_id], |r| r.get(0))
}

/// The providers that have provider tokens, every one revoked.
pub fn revoked_providers_sync(conn: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT principal FROM api_tokens WHERE role = 'provider'
         GROUP BY principal HAVING COUNT(*) = COUNT(revoked_at)",
    )?;
    let rows = stmt.query_map([], |r| r.get(0))?;
    rows.collect()
}

/// The role of the tokens already issued to `principal` (revoked ones
/// included), if any: a principal keeps one role for its whole life.
fn principal_role_sync(conn: &Connection, principal: &str) -> rusqlite::Result<Option<String>> {
    conn.query_row(
        "SELECT role FROM api_tokens WHERE principal = ?1 ORDER BY created_at LIMIT 1",
        [principal],
        |r| r.get(0),
    )
    .optional()
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
            revocations_checked: Mutex::new(Instant::now()),
        }))
    }

    /// Every stored token (see [`list_tokens_sync`]).
    pub async fn list(&self) -> Result<Vec<TokenInfo>, DbError> {
        Ok(self.db.read(|conn| list_tokens_sync(conn)).await??)
    }

    /// The roles of the valid tokens of `principal` (empty when none).
    pub async fn roles_of(&self, principal: &str) -> Result<Vec<Role>, DbError> {
        let name = principal.to_string();
        Ok(self
            .db
            .read(move |conn| token_roles_sync(conn, &name))
            .await??)
    }

    /// Revoke every valid token of `principal` and drop them from the
    /// cache, so their next request is 401 and their next MQTT login is
    /// refused.
    pub async fn revoke(&self, principal: &str) -> Result<Revoked, DbError> {
        let name = principal.to_string();
        let revoked = self
            .db
            .write(move |conn| revoke_tokens_sync(conn, &name))
            .await??;
        if let Ok(mut map) = self.by_hash.write() {
            map.retain(|_, p| p.name != principal);
        }
        Ok(revoked)
    }

    /// Drop from the cache every token the store marks revoked (by this
    /// process or another), at most once per [`REVOCATION_CHECK_INTERVAL`].
    async fn forget_revoked(&self) {
        {
            let Ok(mut checked) = self.revocations_checked.lock() else {
                return;
            };
            if checked.elapsed() < REVOCATION_CHECK_INTERVAL {
                return;
            }
            *checked = Instant::now();
        }
        let revoked = self
            .db
            .read(|conn| -> rusqlite::Result<Vec<String>> {
                let mut stmt =
                    conn.prepare("SELECT token_hash FROM api_tokens WHERE revoked_at IS NOT NULL")?;
                let rows = stmt.query_map([], |r| r.get(0))?;
                rows.collect()
            })
            .await;
        match revoked {
            Ok(Ok(hashes)) if !hashes.is_empty() => {
                if let Ok(mut map) = self.by_hash.write() {
                    for h in hashes {
                        if let Some(p) = map.remove(&h) {
                            tracing::info!(principal = %p.name, "revoked token dropped from the cache");
                        }
                    }
                }
            }
            Ok(Ok(_)) => {}
            Ok(Err(e)) => tracing::warn!(error = %e, "cannot read revoked tokens"),
            Err(e) => tracing::warn!(error = %e, "cannot read revoked tokens"),
        }
    }

    /// Create and store a token; returns the plaintext (shown once).
    ///
    /// Errors: [`TokenError::RoleConflict`], or the store cannot be written.
    pub async fn create_token(&self, role: Role, principal: &str) -> Result<String, TokenError> {
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
    /// Unknown tokens are not cached. Tokens revoked by the CLI are dropped
    /// from the cache first (checked at most once per
    /// [`REVOCATION_CHECK_INTERVAL`]).
    pub async fn authenticate_fresh(&self, token: &str) -> Option<Principal> {
        self.forget_revoked().await;
        if let Some(p) = self.authenticate(token) {
            return Some(p);
        }
        self.authenticate_stored(token).await
    }

    /// The principal of a token as stored right now (one read on the read
    /// connection); MQTT logins use it so that a token created or revoked
    /// with the CLI while the registry runs is honoured at the next
    /// connect. The
    /// cache follows what was read (a valid token is added, a revoked one
    /// dropped). `None`: unknown, revoked, or the store cannot be read.
    pub async fn authenticate_stored(&self, token: &str) -> Option<Principal> {
        match self.look_up_stored(token).await {
            TokenLookup::Valid(p) => Some(p),
            _ => None,
        }
    }

    /// What the store says of a token right now, for messages that tell
    /// why a login was refused ([`TokenLookup`]); updates the cache like
    /// [`Authenticator::authenticate_stored`].
    pub async fn look_up_stored(&self, token: &str) -> TokenLookup {
        let hash = hash_token(token);
        let key = hash.clone();
        let row = self
            .db
            .read(move |conn| {
                conn.query_row(
                    "SELECT principal, role, revoked_at IS NOT NULL FROM api_tokens WHERE token_hash = ?1",
                    params![key],
                    |r| Ok((r.get::<_, String>(0)?, r.get::<_, String>(1)?, r.get::<_, bool>(2)?)),
                )
                .optional()
            })
            .await;
        let row = match row
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
        {
            Ok(row) => row,
            Err(e) => {
                tracing::warn!(error = %e, "cannot read a token");
                return TokenLookup::Unreadable(e);
            }
        };
        let Ok(mut map) = self.by_hash.write() else {
            return TokenLookup::Unreadable("token cache poisoned".into());
        };
        match row {
            Some((name, role, false)) => {
                let Ok(role) = role.parse() else {
                    return TokenLookup::Unreadable(format!("unknown role `{role}` stored"));
                };
                let principal = Principal { name, role };
                map.insert(hash, principal.clone());
                TokenLookup::Valid(principal)
            }
            Some((name, _, true)) => {
                map.remove(&hash);
                TokenLookup::Revoked { principal: name }
            }
            None => TokenLookup::Unknown,
        }
    }
}

/// A token as the store knows it ([`Authenticator::look_up_stored`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TokenLookup {
    /// Live, of this principal and role.
    Valid(Principal),
    /// Revoked; it belonged to `principal`.
    Revoked { principal: String },
    /// No token with this hash was ever created here.
    Unknown,
    /// The store could not be read (why).
    Unreadable(String),
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
        let token = bearer_token(&parts.headers)?;
        auth.authenticate_fresh(token)
            .await
            .ok_or_else(|| ApiError::unauthenticated("unknown or revoked token"))
    }
}

/// The token of an `Authorization: Bearer <token>` header (the scheme in
/// any letter case, RFC 9110 §11.1), trimmed. 401 `unauthenticated` when
/// the header is missing or not a Bearer token.
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Result<&str, ApiError> {
    let header = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .ok_or_else(|| {
            ApiError::unauthenticated("missing `Authorization: Bearer <token>` header")
        })?;
    header
        .split_once(' ')
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| token.trim())
        .ok_or_else(|| ApiError::unauthenticated("expected a Bearer token"))
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
        let mut cli = Connection::open(&path).unwrap();
        let token = create_token_sync(&mut cli, Role::AuditAgent, "audit:led-01").unwrap();
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

    #[tokio::test]
    async fn a_token_revoked_by_another_process_stops_working_within_the_check_interval() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("registry.db");
        let db = Db::open(&path, |c| migrate(c)).unwrap();
        let auth = Authenticator::load(db).await.unwrap();
        let token = auth.create_token(Role::Operator, "op-1").await.unwrap();
        let other = auth.create_token(Role::Viewer, "viewer-1").await.unwrap();
        assert!(auth.authenticate_fresh(&token).await.is_some());

        let mut cli = Connection::open(&path).unwrap();
        assert_eq!(
            revoke_tokens_sync(&mut cli, "op-1").unwrap(),
            Revoked::Tokens(1)
        );
        assert_eq!(
            revoke_tokens_sync(&mut cli, "op-1").unwrap(),
            Revoked::Tokens(0)
        );
        assert_eq!(
            revoke_tokens_sync(&mut cli, "nobody").unwrap(),
            Revoked::UnknownName
        );
        tokio::time::sleep(REVOCATION_CHECK_INTERVAL + Duration::from_millis(50)).await;
        assert_eq!(auth.authenticate_fresh(&token).await, None);
        assert_eq!(auth.authenticate(&token), None, "gone from the cache");
        assert!(auth.authenticate_fresh(&other).await.is_some());

        let list = list_tokens_sync(&cli).unwrap();
        let op = list.iter().find(|t| t.name == "op-1").unwrap();
        assert!(op.revoked && op.revoked_at.is_some());
        let viewer = list.iter().find(|t| t.name == "viewer-1").unwrap();
        assert!(!viewer.revoked && viewer.revoked_at.is_none());
    }
}
