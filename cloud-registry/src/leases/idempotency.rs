//! Idempotency keys of lease requests: a requester that lost its answer
//! (the connection broke after the registry wrote it) sends the same
//! request with the same key again and gets the same lease(s) instead of
//! a second request.
//!
//! A key belongs to one principal (the same key from another principal is
//! another request), is kept [`KEY_TTL`] on the monotonic clock (at most
//! [`MAX_KEYS`], oldest dropped first), and lives in memory only: it is
//! not kept across a registry restart. A key whose leases were given up
//! ([`super::LeaseEngine::abandon`]) is forgotten with them, so that the
//! retry of a requester that went away is a new request.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use super::LeaseError;

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

    /// Remember that `principal`'s request with `key` made `lease_ids`.
    pub fn insert(
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
                }
            }
        }
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
        book.insert(now, "alice", &key("k1"), fp, vec!["l1".into()]);
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
        book.insert(now, "alice", &key("k1"), fp, vec!["l1".into()]);
        book.insert(now, "alice", &key("k2"), fp, vec!["l2".into()]);
        book.forget_leases(&["l2".to_string()]);
        assert_eq!(book.lookup(now, "alice", &key("k2"), &fp).unwrap(), None);
        let later = now + KEY_TTL;
        assert_eq!(book.lookup(later, "alice", &key("k1"), &fp).unwrap(), None);
        assert_eq!(book.len(), 0);
    }
}
