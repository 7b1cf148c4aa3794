//! The event log's hash chain and its signed checkpoints
//! (docs/audit-trail.md).
//!
//! - every row carries `prev_hash` (the previous row's `hash`, [`GENESIS`]
//!   for event 1) and `hash` = SHA-256 of `prev_hash`, a newline and the
//!   row's [`canonical`] encoding: changing, deleting or reordering a row
//!   breaks the chain at that row;
//! - a checkpoint signs the chain head (`event_id`, `hash`) with the
//!   registry's Ed25519 key ([`SigningKeyFile`]): cutting events off the
//!   end is caught by a checkpoint past the new end, or by one an auditor
//!   kept ([`Checkpoint`] as JSON);
//! - [`verify`] walks the chain and names the first bad event; the
//!   registry runs [`verify_tail`] at start.

use std::path::{Path, PathBuf};

use crate::sql::{params, Connection, OptionalExtension};
use chrono::Utc;
use ed25519_dalek::{Signature, Signer, SigningKey, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};

pub use shared_protocol::chain::{canonical, row_hash, ChainRow, GENESIS};

/// `[audit_log]`: the chain's signing key and checkpoints.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AuditLogConfig {
    /// The registry's Ed25519 signing key (32 bytes, hex, mode 0600),
    /// created at first start; the public key goes beside it as
    /// `{file}.pub`. Default: the store file's path with
    /// `.signing-key` appended. A relative path is relative to the config
    /// file's directory.
    pub signing_key_file: Option<PathBuf>,
    /// How often a checkpoint of the chain head is signed when the head
    /// moved, seconds (also once at shutdown). Default 60; 1 to 86 400.
    pub checkpoint_interval_seconds: u64,
    /// Events the registry verifies at start, counted back from the end
    /// (the newest checkpoint is checked too). Default 10 000; 0 skips.
    pub verify_at_start: u64,
    /// Start on a broken chain (and extend it) instead of refusing.
    /// Default false; `serve --accept-broken-chain` sets it once.
    pub accept_broken_chain: bool,
}

impl Default for AuditLogConfig {
    fn default() -> Self {
        Self {
            signing_key_file: None,
            checkpoint_interval_seconds: 60,
            verify_at_start: 10_000,
            accept_broken_chain: false,
        }
    }
}

impl AuditLogConfig {
    /// The key file for a store at `store` (see `signing_key_file`).
    pub fn key_path(&self, store: &Path) -> PathBuf {
        self.signing_key_file.clone().unwrap_or_else(|| {
            let mut p = store.as_os_str().to_os_string();
            p.push(".signing-key");
            PathBuf::from(p)
        })
    }
}

/// The newest row's `(event_id, hash)`, or `(0, GENESIS)` on an empty log.
pub fn head(conn: &Connection) -> rusqlite::Result<(u64, String)> {
    let row: Option<(i64, Option<String>)> = conn
        .prepare_cached("SELECT event_id, hash FROM events ORDER BY event_id DESC LIMIT 1")?
        .query_row([], |r| Ok((r.get(0)?, r.get(1)?)))
        .optional()?;
    Ok(match row {
        Some((id, hash)) => (id as u64, hash.unwrap_or_default()),
        None => (0, GENESIS.to_string()),
    })
}

/// Add the chain's columns and the checkpoint table; an older store's
/// rows are chained once, in order, here (the append-only triggers are
/// dropped for that and created again by the caller).
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let has_hash: bool = conn.has_column("events", "hash")?;
    if !has_hash {
        conn.execute_batch(
            "ALTER TABLE events ADD COLUMN prev_hash TEXT;
             ALTER TABLE events ADD COLUMN hash TEXT;
             DROP TRIGGER IF EXISTS events_no_update;",
        )?;
        let rows = read_rows(conn, 0, u64::MAX)?;
        let mut prev = GENESIS.to_string();
        let mut stmt =
            conn.prepare("UPDATE events SET prev_hash = ?1, hash = ?2 WHERE event_id = ?3")?;
        for row in rows {
            let hash = row_hash(&prev, &row);
            stmt.execute(params![prev, hash, row.event_id as i64])?;
            prev = hash;
        }
    }
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS event_checkpoints (
            checkpoint_id INTEGER PRIMARY KEY AUTOINCREMENT,
            event_id      INTEGER NOT NULL,
            hash          TEXT NOT NULL,
            signed_at     TEXT NOT NULL,
            public_key    TEXT NOT NULL,
            signature     TEXT NOT NULL
        );",
    )?;
    conn.append_only("event_checkpoints", "event_checkpoints is append-only")
}

/// Stored rows with `after < event_id <= upto`, oldest first, with their
/// stored `(prev_hash, hash)`.
fn read_rows(conn: &Connection, after: u64, upto: u64) -> rusqlite::Result<Vec<ChainRow>> {
    Ok(read_stored(conn, after, upto, usize::MAX)?
        .into_iter()
        .map(|(row, _, _)| row)
        .collect())
}

type Stored = (ChainRow, Option<String>, Option<String>);

fn read_stored(
    conn: &Connection,
    after: u64,
    upto: u64,
    limit: usize,
) -> rusqlite::Result<Vec<Stored>> {
    let mut stmt = conn.prepare_cached(
        "SELECT event_id, event_type, occurred_at, actor, provider_id, capability_id, lease_id,
                session_id, artifact_id, audit_request_id, data, prev_hash, hash
         FROM events WHERE event_id > ?1 AND event_id <= ?2 ORDER BY event_id LIMIT ?3",
    )?;
    let upto = i64::try_from(upto).unwrap_or(i64::MAX);
    let limit = i64::try_from(limit).unwrap_or(i64::MAX);
    let rows = stmt.query_map(params![after as i64, upto, limit], |r| {
        Ok((
            ChainRow {
                event_id: r.get::<_, i64>(0)? as u64,
                event_type: r.get(1)?,
                occurred_at: r.get(2)?,
                actor: r.get(3)?,
                provider_id: r.get(4)?,
                capability_id: r.get(5)?,
                lease_id: r.get(6)?,
                session_id: r.get(7)?,
                artifact_id: r.get(8)?,
                audit_request_id: r.get(9)?,
                data: r.get(10)?,
            },
            r.get(11)?,
            r.get(12)?,
        ))
    })?;
    rows.collect()
}

/// Stored rows `first..=last` with their chain columns, oldest first, as
/// an audit bundle's `events.jsonl` carries them (a row without chain
/// columns, impossible after [`migrate`], has them empty).
pub fn segment(
    conn: &Connection,
    first: u64,
    last: u64,
) -> rusqlite::Result<Vec<shared_protocol::chain::ChainedRow>> {
    Ok(
        read_stored(conn, first.saturating_sub(1), last, usize::MAX)?
            .into_iter()
            .map(
                |(row, prev_hash, hash)| shared_protocol::chain::ChainedRow {
                    row,
                    prev_hash: prev_hash.unwrap_or_default(),
                    hash: hash.unwrap_or_default(),
                },
            )
            .collect(),
    )
}

/// A signed statement that the chain's event `event_id` has `hash`.
/// Its JSON is what `cloud-registry audit-log checkpoint` prints and
/// `verify --checkpoint FILE` reads.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub event_id: u64,
    /// The chain's `hash` at `event_id` (hex).
    pub hash: String,
    /// RFC 3339, when it was signed.
    pub signed_at: String,
    /// The registry's Ed25519 public key (hex, 32 bytes).
    pub public_key: String,
    /// Ed25519 signature (hex, 64 bytes) of
    /// `benchlink-event-checkpoint-v1\n{event_id}\n{hash}\n{signed_at}`.
    pub signature: String,
}

impl Checkpoint {
    fn message(event_id: u64, hash: &str, signed_at: &str) -> String {
        shared_protocol::chain::checkpoint_message(event_id, hash, signed_at)
    }

    /// Sign the head `(event_id, hash)` now with `key`.
    pub fn sign(key: &SigningKey, event_id: u64, hash: &str) -> Checkpoint {
        let signed_at = Utc::now().to_rfc3339();
        let sig = key.sign(Self::message(event_id, hash, &signed_at).as_bytes());
        Checkpoint {
            event_id,
            hash: hash.to_string(),
            signed_at,
            public_key: hex::encode(key.verifying_key().as_bytes()),
            signature: hex::encode(sig.to_bytes()),
        }
    }

    /// Check the signature against `public_key` (hex); the key it names
    /// itself is not trusted.
    ///
    /// Errors: a malformed key or signature, or one that does not verify.
    pub fn check_signature(&self, public_key: &str) -> Result<(), String> {
        let key = parse_public_key(public_key)?;
        let sig: [u8; 64] = hex::decode(&self.signature)
            .ok()
            .and_then(|b| b.try_into().ok())
            .ok_or("the signature is not 64 hex-encoded bytes")?;
        key.verify(
            Self::message(self.event_id, &self.hash, &self.signed_at).as_bytes(),
            &Signature::from_bytes(&sig),
        )
        .map_err(|_| "the signature does not verify with the registry's public key".to_string())
    }
}

/// An Ed25519 public key from 64 hex digits.
///
/// Errors: not 32 hex-encoded bytes, or not a valid curve point.
pub fn parse_public_key(hex_key: &str) -> Result<VerifyingKey, String> {
    let bytes: [u8; 32] = hex::decode(hex_key.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
        .ok_or("the public key is not 32 hex-encoded bytes")?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| format!("the public key is invalid: {e}"))
}

/// Store a checkpoint of the current head, unless the newest one already
/// covers it. Returns the checkpoint written, if any.
pub fn checkpoint(conn: &Connection, key: &SigningKey) -> rusqlite::Result<Option<Checkpoint>> {
    let (event_id, hash) = head(conn)?;
    if event_id == 0 {
        return Ok(None);
    }
    if latest_checkpoint(conn)?.is_some_and(|c| c.event_id == event_id) {
        return Ok(None);
    }
    let c = Checkpoint::sign(key, event_id, &hash);
    conn.execute(
        "INSERT INTO event_checkpoints (event_id, hash, signed_at, public_key, signature)
         VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            c.event_id as i64,
            c.hash,
            c.signed_at,
            c.public_key,
            c.signature
        ],
    )?;
    Ok(Some(c))
}

/// The newest stored checkpoint.
pub fn latest_checkpoint(conn: &Connection) -> rusqlite::Result<Option<Checkpoint>> {
    Ok(checkpoints(conn, 1)?.into_iter().next())
}

/// Stored checkpoints, newest first, at most `limit`.
pub fn checkpoints(conn: &Connection, limit: usize) -> rusqlite::Result<Vec<Checkpoint>> {
    let mut stmt = conn.prepare_cached(
        "SELECT event_id, hash, signed_at, public_key, signature FROM event_checkpoints
         ORDER BY checkpoint_id DESC LIMIT ?1",
    )?;
    let rows = stmt.query_map(params![i64::try_from(limit).unwrap_or(i64::MAX)], |r| {
        Ok(Checkpoint {
            event_id: r.get::<_, i64>(0)? as u64,
            hash: r.get(1)?,
            signed_at: r.get(2)?,
            public_key: r.get(3)?,
            signature: r.get(4)?,
        })
    })?;
    rows.collect()
}

/// Where and why the chain is broken.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ChainError {
    #[error("event {event_id}: {reason}")]
    Event { event_id: u64, reason: String },
    #[error("checkpoint of event {event_id} (signed {signed_at}): {reason}")]
    Checkpoint {
        event_id: u64,
        signed_at: String,
        reason: String,
    },
    #[error("sqlite: {0}")]
    Sqlite(String),
}

impl From<rusqlite::Error> for ChainError {
    fn from(e: rusqlite::Error) -> Self {
        ChainError::Sqlite(e.to_string())
    }
}

impl ChainError {
    /// The first bad event's id (for a checkpoint: the event it names).
    pub fn event_id(&self) -> Option<u64> {
        match self {
            ChainError::Event { event_id, .. } | ChainError::Checkpoint { event_id, .. } => {
                Some(*event_id)
            }
            ChainError::Sqlite(_) => None,
        }
    }
}

/// What [`verify`] found on a sound chain.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verified {
    /// Events checked: `first..=last` (0 and 0 on an empty log).
    pub first: u64,
    pub last: u64,
    /// The head's hash.
    pub head_hash: String,
    /// Checkpoints whose signature and hash were checked.
    pub checkpoints: usize,
    /// The newest checkpoint's event id, if any.
    pub newest_checkpoint: Option<u64>,
}

/// Walk events `after+1..` in order and check each row's `prev_hash`,
/// its `hash` against its contents, and that no id is skipped; then every
/// stored checkpoint (and `extra`, e.g. one an auditor kept) against
/// `public_key` and the chain. `after` = 0 checks the whole log from
/// [`GENESIS`]; otherwise the row at `after` is trusted as the start.
///
/// Errors: the first break found, naming its event ([`ChainError`]).
pub fn verify(
    conn: &Connection,
    after: u64,
    public_key: Option<&str>,
    extra: &[Checkpoint],
) -> Result<Verified, ChainError> {
    const BATCH: usize = 10_000;
    let mut prev = if after == 0 {
        GENESIS.to_string()
    } else {
        conn.query_row(
            "SELECT hash FROM events WHERE event_id = ?1",
            params![after as i64],
            |r| r.get::<_, Option<String>>(0),
        )
        .optional()?
        .flatten()
        .unwrap_or_default()
    };
    let mut expected = after + 1;
    let mut cursor = after;
    let mut first = 0;
    loop {
        let rows = read_stored(conn, cursor, u64::MAX, BATCH)?;
        if rows.is_empty() {
            break;
        }
        for (row, prev_hash, hash) in &rows {
            let bad = |reason: String| ChainError::Event {
                event_id: row.event_id,
                reason,
            };
            if row.event_id != expected {
                return Err(ChainError::Event {
                    event_id: expected,
                    reason: format!(
                        "missing: the log goes from event {} to event {}",
                        expected - 1,
                        row.event_id
                    ),
                });
            }
            if prev_hash.as_deref() != Some(prev.as_str()) {
                return Err(bad(format!(
                    "prev_hash {} is not the previous event's hash {prev}: an event before it was changed, removed or moved",
                    prev_hash.as_deref().unwrap_or("(none)")
                )));
            }
            let computed = row_hash(&prev, row);
            if hash.as_deref() != Some(computed.as_str()) {
                return Err(bad(
                    "its hash does not match its contents: the row was changed".into(),
                ));
            }
            if first == 0 {
                first = row.event_id;
            }
            prev = computed;
            expected += 1;
        }
        cursor = rows.last().map(|(r, _, _)| r.event_id).unwrap_or(cursor);
    }
    let last = expected - 1;
    let mut all = checkpoints(conn, usize::MAX)?;
    let newest_checkpoint = all.first().map(|c| c.event_id);
    all.extend(extra.iter().cloned());
    let mut checked = 0;
    for c in &all {
        let bad = |reason: String| ChainError::Checkpoint {
            event_id: c.event_id,
            signed_at: c.signed_at.clone(),
            reason,
        };
        if let Some(pk) = public_key {
            c.check_signature(pk).map_err(bad)?;
        }
        if c.event_id > last {
            return Err(bad(format!(
                "it was signed at event {} but the log ends at event {last}: events were cut off the end",
                c.event_id
            )));
        }
        if c.event_id <= after {
            continue;
        }
        let stored: Option<Option<String>> = conn
            .query_row(
                "SELECT hash FROM events WHERE event_id = ?1",
                params![c.event_id as i64],
                |r| r.get(0),
            )
            .optional()?;
        if stored.flatten().as_deref() != Some(c.hash.as_str()) {
            return Err(bad(
                "the chain's hash at that event differs from the signed one: the log was rewritten"
                    .into(),
            ));
        }
        checked += 1;
    }
    Ok(Verified {
        first,
        last,
        head_hash: if last == 0 { GENESIS.to_string() } else { prev },
        checkpoints: checked,
        newest_checkpoint,
    })
}

/// [`verify`] of the newest `n` events and every checkpoint within them,
/// what the registry runs at start.
pub fn verify_tail(
    conn: &Connection,
    n: u64,
    public_key: Option<&str>,
) -> Result<Verified, ChainError> {
    let (last, _) = head(conn)?;
    verify(conn, last.saturating_sub(n), public_key, &[])
}

/// The registry's Ed25519 signing key, in a file of 64 hex digits
/// (mode 0600), with the public key in `{file}.pub`.
pub struct SigningKeyFile {
    pub key: SigningKey,
    pub path: PathBuf,
}

impl SigningKeyFile {
    /// Read the key at `path`, or create it (and `{path}.pub`) when the
    /// file does not exist.
    ///
    /// Errors: unreadable, not 32 hex-encoded bytes, readable by group or
    /// others, or not writable when it must be created.
    pub fn load_or_create(path: &Path) -> Result<SigningKeyFile, String> {
        use std::os::unix::fs::PermissionsExt;
        let shown = path.display();
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let mode = std::fs::metadata(path)
                    .map_err(|e| format!("{shown}: {e}"))?
                    .permissions()
                    .mode();
                if mode & 0o077 != 0 {
                    return Err(format!(
                        "signing key {shown} has mode {:04o}; others may read it: chmod 600 {shown}",
                        mode & 0o777
                    ));
                }
                let bytes: [u8; 32] = hex::decode(text.trim())
                    .ok()
                    .and_then(|b| b.try_into().ok())
                    .ok_or_else(|| format!("signing key {shown} is not 32 hex-encoded bytes"))?;
                let key = SigningKey::from_bytes(&bytes);
                Self::write_public(path, &key)?;
                Ok(SigningKeyFile {
                    key,
                    path: path.to_path_buf(),
                })
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let key = SigningKey::generate(&mut rand::rngs::OsRng);
                if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                }
                crate::app::write_private(path, &hex::encode(key.to_bytes()))
                    .map_err(|e| format!("write signing key {shown}: {e}"))?;
                Self::write_public(path, &key)?;
                tracing::info!(key = %shown, "created the event log's signing key");
                Ok(SigningKeyFile {
                    key,
                    path: path.to_path_buf(),
                })
            }
            Err(e) => Err(format!("signing key {shown}: {e}")),
        }
    }

    /// The public key (hex).
    pub fn public_hex(&self) -> String {
        hex::encode(self.key.verifying_key().as_bytes())
    }

    /// `{path}.pub`.
    pub fn public_path(path: &Path) -> PathBuf {
        let mut p = path.as_os_str().to_os_string();
        p.push(".pub");
        PathBuf::from(p)
    }

    fn write_public(path: &Path, key: &SigningKey) -> Result<(), String> {
        let pub_path = Self::public_path(path);
        let text = format!("{}\n", hex::encode(key.verifying_key().as_bytes()));
        if std::fs::read_to_string(&pub_path).ok().as_deref() == Some(text.as_str()) {
            return Ok(());
        }
        std::fs::write(&pub_path, text).map_err(|e| format!("write {}: {e}", pub_path.display()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(id: u64, data: &str) -> ChainRow {
        ChainRow {
            event_id: id,
            event_type: "lease_granted".into(),
            occurred_at: "2026-12-02T10:00:00+00:00".into(),
            actor: "audit:a".into(),
            provider_id: None,
            capability_id: Some("cam-01".into()),
            lease_id: Some("lease_1".into()),
            session_id: None,
            artifact_id: None,
            audit_request_id: None,
            data: data.into(),
        }
    }

    #[test]
    fn the_hash_covers_every_field_and_the_previous_hash() {
        let base = row(1, r#"{"a":1}"#);
        let h = row_hash(GENESIS, &base);
        assert_eq!(h.len(), 64);
        assert_eq!(h, row_hash(GENESIS, &base.clone()), "deterministic");
        let mut other = base.clone();
        other.data = r#"{"a":2}"#.into();
        assert_ne!(h, row_hash(GENESIS, &other));
        let mut moved = base.clone();
        moved.event_id = 2;
        assert_ne!(h, row_hash(GENESIS, &moved));
        let mut none = base.clone();
        none.capability_id = None;
        assert_ne!(h, row_hash(GENESIS, &none), "null is not the empty string");
        assert_ne!(h, row_hash(&h, &base));
    }

    #[test]
    fn a_checkpoint_verifies_only_with_its_key_and_contents() {
        let key = SigningKey::from_bytes(&[7; 32]);
        let c = Checkpoint::sign(&key, 42, &"ab".repeat(32));
        let pk = hex::encode(key.verifying_key().as_bytes());
        c.check_signature(&pk).unwrap();
        let mut moved = c.clone();
        moved.event_id = 41;
        assert!(moved.check_signature(&pk).is_err());
        let other = SigningKey::from_bytes(&[8; 32]);
        let e = c
            .check_signature(&hex::encode(other.verifying_key().as_bytes()))
            .unwrap_err();
        assert!(e.contains("does not verify"), "{e}");
    }
}
