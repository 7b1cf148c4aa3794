//! Idempotency keys of lease requests: a requester that lost its answer
//! (the connection broke after the registry wrote it) sends the same
//! request with the same key again and gets the same lease(s) instead of
//! a second request.
//!
//! A key belongs to one principal (the same key from another principal is
//! another request) and is kept [`KEY_TTL`] (at most [`MAX_KEYS`], oldest
//! dropped first). Keys are looked up in memory and stored in the
//! `lease_idempotency_keys` table in the same transaction as the leases
//! they made, so a retry after a registry restart still finds them; a
//! restart counts the time since `created_at` on the wall clock, as lease
//! deadlines do. A key whose leases were given up
//! ([`super::LeaseEngine::abandon`]) is forgotten with them, so that the
//! retry of a requester that went away is a new request.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::sql::{params, Connection};
use chrono::SecondsFormat;
use sha2::{Digest, Sha256};
use shared_protocol::Timestamp;
use tokio::time::Instant;

use super::LeaseError;

/// Create the `lease_idempotency_keys` table (idempotent): one row per
/// remembered key, `lease_ids` a JSON array, `created_at` RFC 3339 UTC.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS lease_idempotency_keys (
            principal       TEXT NOT NULL,
            idempotency_key TEXT NOT NULL,
            fingerprint     BLOB NOT NULL,
            lease_ids       TEXT NOT NULL,
            created_at      TEXT NOT NULL,
            PRIMARY KEY (principal, idempotency_key)
        )",
    )
}

/// A change of the stored keys, committed with the lease rows of the same
/// operation.
#[derive(Debug, Clone)]
pub(crate) enum KeyChange {
    Put {
        principal: String,
        key: String,
        fingerprint: [u8; 32],
        lease_ids: Vec<String>,
        created_at: Timestamp,
    },
    Forget {
        principal: String,
        key: String,
    },
}

fn ts(t: &Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

/// Apply `changes` in order (inside the caller's transaction).
pub(crate) fn write(conn: &Connection, changes: &[KeyChange]) -> rusqlite::Result<()> {
    for c in changes {
        match c {
            KeyChange::Put {
                principal,
                key,
                fingerprint,
                lease_ids,
                created_at,
            } => {
                let ids = serde_json::to_string(lease_ids).unwrap_or_else(|_| "[]".to_string());
                conn.prepare_cached(
                    "INSERT INTO lease_idempotency_keys
                         (principal, idempotency_key, fingerprint, lease_ids, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5)
                     ON CONFLICT (principal, idempotency_key) DO UPDATE SET
                         fingerprint = excluded.fingerprint, lease_ids = excluded.lease_ids,
                         created_at = excluded.created_at",
                )?
                .execute(params![
                    principal,
                    key,
                    &fingerprint[..],
                    ids,
                    ts(created_at)
                ])?;
            }
            KeyChange::Forget { principal, key } => {
                conn.prepare_cached(
                    "DELETE FROM lease_idempotency_keys
                     WHERE principal = ?1 AND idempotency_key = ?2",
                )?
                .execute(params![principal, key])?;
            }
        }
    }
    Ok(())
}

/// A stored key: principal, key, fingerprint, lease ids, `created_at`.
pub(crate) type StoredKey = (String, String, [u8; 32], Vec<String>, Timestamp);

/// Delete the keys created before `cutoff` and read the others, oldest
/// first. A row that does not parse is skipped (and logged): a key is a
/// convenience, never a reason not to start.
pub(crate) fn load(conn: &Connection, cutoff: Timestamp) -> rusqlite::Result<Vec<StoredKey>> {
    conn.execute(
        "DELETE FROM lease_idempotency_keys WHERE created_at < ?1",
        params![ts(&cutoff)],
    )?;
    let mut stmt = conn.prepare(
        "SELECT principal, idempotency_key, fingerprint, lease_ids, created_at
         FROM lease_idempotency_keys ORDER BY created_at",
    )?;
    let rows = stmt.query_map([], |r| {
        Ok((
            r.get::<_, String>(0)?,
            r.get::<_, String>(1)?,
            r.get::<_, Vec<u8>>(2)?,
            r.get::<_, String>(3)?,
            r.get::<_, String>(4)?,
        ))
    })?;
    let mut keys = Vec::new();
    for row in rows {
        let (principal, key, fp, ids, created) = row?;
        let parsed = (
            <[u8; 32]>::try_from(fp.as_slice()).ok(),
            serde_json::from_str::<Vec<String>>(&ids).ok(),
            chrono::DateTime::parse_from_rfc3339(&created).ok(),
        );
        match parsed {
            (Some(fp), Some(ids), Some(created)) => {
                keys.push((principal, key, fp, ids, created.with_timezone(&chrono::Utc)))
            }
            _ => tracing::warn!(%principal, %key, "unreadable idempotency key row skipped"),
        }
    }
    Ok(keys)
}

/// How long a key is remembered: 24 h.
pub const KEY_TTL: Duration = Duration::from_secs(24 * 3600);

/// Most keys remembered at once; past it the oldest are forgotten.
pub const MAX_KEYS: usize = 100_000;

/// Longest key, characters.
pub const MAX_KEY_LEN: usize = 255;

/// A client-chosen key naming one lease request (the `Idempotency-Key`
/// header): 1 to [`MAX_KEY_LEN`] visible ASCII characters (a UUID is
/// typical).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct IdempotencyKey(String);

impl IdempotencyKey {
    /// Check `raw`; a structured-field string (`"..."`, as the IETF
    /// draft writes it) is taken without its quotes.
    ///
    /// Errors: `InvalidRequest` naming `Idempotency-Key` for an empty or
    /// too long key, or one with spaces, control or non-ASCII characters.
    pub fn parse(raw: &str) -> Result<Self, LeaseError> {
        let key = raw
            .strip_prefix('"')
            .and_then(|k| k.strip_suffix('"'))
            .unwrap_or(raw);
        if key.is_empty() || key.len() > MAX_KEY_LEN {
            return Err(LeaseError::invalid(
                "Idempotency-Key",
                format!("must be 1 to {MAX_KEY_LEN} characters, got {}", key.len()),
            ));
        }
        if !key.bytes().all(|b| b.is_ascii_graphic()) {
            return Err(LeaseError::invalid(
                "Idempotency-Key",
                "must be visible ASCII characters only (no spaces)",
            ));
        }
        Ok(Self(key.to_string()))
    }

    /// The key as given.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The hash of what a key's request asked for, so that the same key sent
/// with another body is refused instead of answered with a lease for the
/// first body.
pub(crate) fn fingerprint(kind: &str, body: &impl serde::Serialize) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(kind.as_bytes());
    h.update(b"\n");
    h.update(serde_json::to_vec(body).unwrap_or_default());
    h.finalize().into()
}

struct Entry {
    fingerprint: [u8; 32],
    lease_ids: Vec<String>,
    created: Instant,
}

type Owner = (String, IdempotencyKey);

/// The remembered keys (under the engine's state mutex: a lookup and the
/// admission it guards are one step, so two requests with one key sent
/// at once make one lease).
#[derive(Default)]
pub(crate) struct KeyBook {
    entries: HashMap<Owner, Entry>,
    /// Insertion order, for expiry.
    order: VecDeque<(Instant, Owner)>,
    /// Lease id → the key that made it.
    by_lease: HashMap<String, Owner>,
    /// Keys dropped from memory (expired, over the limit, forgotten) whose
    /// rows are still to be deleted by the next commit that carries key
    /// changes ([`KeyBook::take_changes`]).
    changes: Vec<KeyChange>,
}

impl KeyBook {
    /// The lease ids an earlier request of `principal` with `key` made,
    /// `None` when the key is new (or forgotten).
    ///
    /// Errors: `IdempotencyKeyReused` when the earlier request asked for
    /// something else (another body, or the other endpoint).
    pub fn lookup(
        &mut self,
        now: Instant,
        principal: &str,
        key: &IdempotencyKey,
        fingerprint: &[u8; 32],
    ) -> Result<Option<Vec<String>>, LeaseError> {
        self.expire(now);
        let owner = (principal.to_string(), key.clone());
        match self.entries.get(&owner) {
            None => Ok(None),
            Some(e) if &e.fingerprint == fingerprint => Ok(Some(e.lease_ids.clone())),
            Some(_) => Err(LeaseError::IdempotencyKeyReused {
                key: key.as_str().to_string(),
            }),
        }
    }

    /// Remember that `principal`'s request with `key` made `lease_ids`,
    /// at `wall` (its stored `created_at`); the row is written by the
    /// commit that takes [`take_changes`](Self::take_changes).
    pub fn insert(
        &mut self,
        now: Instant,
        wall: Timestamp,
        principal: &str,
        key: &IdempotencyKey,
        fingerprint: [u8; 32],
        lease_ids: Vec<String>,
    ) {
        self.changes.push(KeyChange::Put {
            principal: principal.to_string(),
            key: key.as_str().to_string(),
            fingerprint,
            lease_ids: lease_ids.clone(),
            created_at: wall,
        });
        self.restore(now, principal, key, fingerprint, lease_ids);
    }

    /// Remember a stored key (at start) without writing it again.
    pub fn restore(
        &mut self,
        now: Instant,
        principal: &str,
        key: &IdempotencyKey,
        fingerprint: [u8; 32],
        lease_ids: Vec<String>,
    ) {
        let owner = (principal.to_string(), key.clone());
        for id in &lease_ids {
            self.by_lease.insert(id.clone(), owner.clone());
        }
        self.entries.insert(
            owner.clone(),
            Entry {
                fingerprint,
                lease_ids,
                created: now,
            },
        );
        self.order.push_back((now, owner));
        while self.entries.len() > MAX_KEYS {
            let Some((created, owner)) = self.order.pop_front() else {
                break;
            };
            self.remove_if_created(&owner, created);
        }
    }

    /// Forget the keys that made any of `lease_ids` (their leases were
    /// given up).
    pub fn forget_leases(&mut self, lease_ids: &[String]) {
        for id in lease_ids {
            if let Some(owner) = self.by_lease.remove(id) {
                if let Some(e) = self.entries.remove(&owner) {
                    for other in &e.lease_ids {
                        self.by_lease.remove(other);
                    }
                    self.changes.push(KeyChange::Forget {
                        principal: owner.0.clone(),
                        key: owner.1.as_str().to_string(),
                    });
                }
            }
        }
    }

    /// The row changes not yet handed to a commit.
    pub fn take_changes(&mut self) -> Vec<KeyChange> {
        std::mem::take(&mut self.changes)
    }

    /// Number of keys remembered.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    fn expire(&mut self, now: Instant) {
        while let Some((created, _)) = self.order.front() {
            if now.saturating_duration_since(*created) < KEY_TTL {
                break;
            }
            let Some((created, owner)) = self.order.pop_front() else {
                break;
            };
            self.remove_if_created(&owner, created);
        }
    }

    /// Remove `owner`'s entry if it is the one inserted at `created` (a
    /// key forgotten and used again has a newer entry, which stays).
    fn remove_if_created(&mut self, owner: &Owner, created: Instant) {
        if self
            .entries
            .get(owner)
            .is_some_and(|e| e.created == created)
        {
            if let Some(e) = self.entries.remove(owner) {
                for id in &e.lease_ids {
                    self.by_lease.remove(id);
                }
                self.changes.push(KeyChange::Forget {
                    principal: owner.0.clone(),
                    key: owner.1.as_str().to_string(),
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> IdempotencyKey {
        IdempotencyKey::parse(k).unwrap()
    }

    #[test]
    fn a_key_is_checked() {
        assert!(IdempotencyKey::parse("").is_err());
        assert!(IdempotencyKey::parse("has space").is_err());
        assert!(IdempotencyKey::parse(&"k".repeat(256)).is_err());
        assert!(IdempotencyKey::parse("é").is_err());
        assert_eq!(key("\"8e03978e\"").as_str(), "8e03978e");
    }

    #[test]
    fn a_key_is_per_principal_and_per_body() {
        let now = Instant::now();
        let mut book = KeyBook::default();
        let fp = fingerprint("single", &"a");
        book.insert(
            now,
            chrono::Utc::now(),
            "alice",
            &key("k1"),
            fp,
            vec!["l1".into()],
        );
        assert_eq!(
            book.lookup(now, "alice", &key("k1"), &fp).unwrap(),
            Some(vec!["l1".to_string()])
        );
        assert_eq!(book.lookup(now, "bob", &key("k1"), &fp).unwrap(), None);
        let other = fingerprint("single", &"b");
        assert!(matches!(
            book.lookup(now, "alice", &key("k1"), &other),
            Err(LeaseError::IdempotencyKeyReused { .. })
        ));
    }

    #[test]
    fn a_key_expires_and_is_forgotten_with_its_leases() {
        let now = Instant::now();
        let mut book = KeyBook::default();
        let fp = fingerprint("single", &"a");
        book.insert(
            now,
            chrono::Utc::now(),
            "alice",
            &key("k1"),
            fp,
            vec!["l1".into()],
        );
        book.insert(
            now,
            chrono::Utc::now(),
            "alice",
            &key("k2"),
            fp,
            vec!["l2".into()],
        );
        book.forget_leases(&["l2".to_string()]);
        assert_eq!(book.lookup(now, "alice", &key("k2"), &fp).unwrap(), None);
        let later = now + KEY_TTL;
        assert_eq!(book.lookup(later, "alice", &key("k1"), &fp).unwrap(), None);
        assert_eq!(book.len(), 0);
    }
}
