//! The event log's hash chain as both ends see it (docs/audit-trail.md):
//! the registry computes it when it appends an event, an auditor
//! recomputes it from an audit bundle's `events.jsonl`. Pure functions
//! and the bundle's file shapes; no I/O.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// `prev_hash` of the first event: 64 zeros.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";

/// What a checkpoint signs is prefixed with this, so a signature made for
/// anything else never passes as one.
pub const CHECKPOINT_DOMAIN: &str = "benchlink-event-checkpoint-v1";

/// The fields of an event row the hash covers, as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainRow {
    pub event_id: u64,
    pub event_type: String,
    /// RFC 3339, as stored.
    pub occurred_at: String,
    pub actor: String,
    pub provider_id: Option<String>,
    pub capability_id: Option<String>,
    pub lease_id: Option<String>,
    pub session_id: Option<String>,
    pub artifact_id: Option<String>,
    pub audit_request_id: Option<String>,
    /// The `data` column's JSON text, byte for byte.
    pub data: String,
}

/// The row as one JSON array, fields in column order (`null` for absent
/// ones); `data` is its stored text as a JSON string, so no
/// re-serialisation can change what was hashed.
pub fn canonical(row: &ChainRow) -> String {
    serde_json::json!([
        row.event_id,
        row.event_type,
        row.occurred_at,
        row.actor,
        row.provider_id,
        row.capability_id,
        row.lease_id,
        row.session_id,
        row.artifact_id,
        row.audit_request_id,
        row.data,
    ])
    .to_string()
}

/// `hash` of `row` after `prev_hash`: lowercase hex SHA-256 of
/// `prev_hash`, `\n`, [`canonical`].
pub fn row_hash(prev_hash: &str, row: &ChainRow) -> String {
    let mut h = Sha256::new();
    h.update(prev_hash.as_bytes());
    h.update(b"\n");
    h.update(canonical(row).as_bytes());
    hex::encode(h.finalize())
}

/// Lowercase hex SHA-256 of `record` in canonical JSON: object keys sorted
/// by their bytes at every level, no whitespace, numbers and strings as
/// serde_json writes them. An event carries this digest of a record too
/// large to carry whole (an audit request's `request_sha256`, a result's
/// `result_sha256`), so the chain covers every field of it and an auditor
/// recomputes it from the bundle's copy.
pub fn record_digest(record: &serde_json::Value) -> String {
    fn write(v: &serde_json::Value, out: &mut String) {
        use serde_json::Value;
        match v {
            Value::Object(map) => {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&map[k], out);
                }
                out.push('}');
            }
            Value::Array(items) => {
                out.push('[');
                for (i, item) in items.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(item, out);
                }
                out.push(']');
            }
            other => out.push_str(&other.to_string()),
        }
    }
    let mut text = String::new();
    write(record, &mut text);
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The bytes a checkpoint's Ed25519 signature covers:
/// `benchlink-event-checkpoint-v1\n{event_id}\n{hash}\n{signed_at}`.
pub fn checkpoint_message(event_id: u64, hash: &str, signed_at: &str) -> String {
    format!("{CHECKPOINT_DOMAIN}\n{event_id}\n{hash}\n{signed_at}")
}

/// `format` of an audit bundle's `manifest.json`.
pub const BUNDLE_FORMAT: &str = "benchlink-audit-bundle-v1";

/// One line of a bundle's `events.jsonl`: a stored event row with its
/// chain columns, every field as stored (`data` is the JSON text).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainedRow {
    #[serde(flatten)]
    pub row: ChainRow,
    /// The previous row's `hash` (hex).
    pub prev_hash: String,
    /// `row_hash(prev_hash, row)` as stored (hex).
    pub hash: String,
}

/// An audit bundle's `manifest.json`: what the archive holds.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BundleManifest {
    /// [`BUNDLE_FORMAT`].
    pub format: String,
    pub audit_request_id: String,
    /// RFC 3339, when the registry built the bundle.
    pub created_at: String,
    /// Every other file of the archive, in archive order.
    pub files: Vec<BundleFile>,
    /// Artifacts of the audit whose bytes the registry no longer holds
    /// (or never received), so they are not in `artifacts/`.
    #[serde(default)]
    pub artifacts_without_bytes: Vec<String>,
    /// The registry's public key (hex) as a hint only: a verifier checks
    /// with the key it got through another channel.
    pub public_key_hint: Option<String>,
}

/// One file of a bundle, as listed in its manifest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BundleFile {
    /// Path inside the archive, e.g. `sessions.json`, `artifacts/<sha256>`.
    pub path: String,
    /// Lowercase hex SHA-256 of the file's bytes.
    pub sha256: String,
    /// Bytes.
    pub size: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_digest_ignores_key_order_and_sees_every_value() {
        let a = serde_json::json!({"b": [1, {"y": "x", "x": 0.92}], "a": null});
        let b = serde_json::json!({"a": null, "b": [1, {"x": 0.92, "y": "x"}]});
        assert_eq!(record_digest(&a), record_digest(&b));
        let c = serde_json::json!({"a": null, "b": [1, {"x": 0.93, "y": "x"}]});
        assert_ne!(record_digest(&a), record_digest(&c));
        let d = serde_json::json!({"a": null, "b": [{"x": 0.92, "y": "x"}, 1]});
        assert_ne!(record_digest(&a), record_digest(&d));
        // A round trip through text (what a bundle's reader does) keeps it.
        let text = serde_json::to_string_pretty(&a).unwrap();
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(record_digest(&a), record_digest(&back));
    }

    #[test]
    fn a_chained_row_is_one_flat_json_object() {
        let row = ChainRow {
            event_id: 3,
            event_type: "lease_granted".into(),
            occurred_at: "2026-12-02T10:00:00+00:00".into(),
            actor: "a".into(),
            provider_id: None,
            capability_id: Some("cam-01".into()),
            lease_id: None,
            session_id: None,
            artifact_id: None,
            audit_request_id: None,
            data: r#"{"x": 1}"#.into(),
        };
        let line = ChainedRow {
            hash: row_hash(GENESIS, &row),
            row,
            prev_hash: GENESIS.into(),
        };
        let text = serde_json::to_string(&line).unwrap();
        assert!(text.contains(r#""data":"{\"x\": 1}""#), "{text}");
        let back: ChainedRow = serde_json::from_str(&text).unwrap();
        assert_eq!(back, line);
        assert_eq!(back.hash, row_hash(&back.prev_hash, &back.row));
    }
}
