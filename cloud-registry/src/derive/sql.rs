//! The durable side of derived evidence: which sources were handled
//! (`derivation_sources`) and what came of each kind
//! (`artifact_derivations`: `derived` with the artifact id, or `failed`
//! with the reason). A derived artifact, its `artifact_derivations` row and
//! its event commit together, so a source never gets two artifacts of one
//! kind.

use crate::sql::{params, Connection, OptionalExtension};
use serde_json::{json, Value};
use shared_protocol::artifact::{ArtifactType, CapabilityArtifact};
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::Timestamp;

use crate::events::{append, NewEvent};
use crate::sessions::sql::{self as session_sql, ArtifactRow, SessionRow};

/// Create the two tables (idempotent). When `derivation_sources` is new,
/// every artifact uploaded before is marked handled: evidence is derived
/// from what arrives from then on, not from a store's whole history.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    let existed = conn.has_table("derivation_sources")?;
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS derivation_sources (
            source_artifact_id TEXT PRIMARY KEY,
            handled_at         TEXT NOT NULL
        );
        CREATE TABLE IF NOT EXISTS artifact_derivations (
            source_artifact_id  TEXT NOT NULL,
            artifact_type       TEXT NOT NULL,
            status              TEXT NOT NULL,
            derived_artifact_id TEXT,
            reason              TEXT,
            decided_at          TEXT NOT NULL,
            PRIMARY KEY (source_artifact_id, artifact_type)
        );",
    )?;
    if !existed {
        conn.execute(
            "INSERT INTO derivation_sources (source_artifact_id, handled_at)
             SELECT artifact_id, ?1 FROM capability_artifacts WHERE uploaded = 1
             ON CONFLICT DO NOTHING",
            params![session_sql::ts(&chrono::Utc::now())],
        )?;
    }
    Ok(())
}

/// A source to derive from, as stored.
#[derive(Debug, Clone)]
pub struct Source {
    pub artifact: ArtifactRow,
    pub session: SessionRow,
    /// Kinds already decided (derived or failed) for it.
    pub decided: Vec<ArtifactType>,
}

/// The source `artifact_id` when it is uploaded, not itself derived, and
/// not yet handled; `None` otherwise.
pub fn load_source(conn: &Connection, artifact_id: &str) -> rusqlite::Result<Option<Source>> {
    let handled = conn
        .prepare_cached("SELECT 1 FROM derivation_sources WHERE source_artifact_id = ?1")?
        .exists(params![artifact_id])?;
    if handled {
        return Ok(None);
    }
    let derived: Option<Option<String>> = conn
        .query_row(
            "SELECT derived_from FROM capability_artifacts WHERE artifact_id = ?1",
            params![artifact_id],
            |r| r.get(0),
        )
        .optional()?;
    if !matches!(derived, Some(None)) {
        return Ok(None);
    }
    let Some(artifact) = session_sql::load_artifact(conn, artifact_id)? else {
        return Ok(None);
    };
    if !artifact.artifact.uploaded {
        return Ok(None);
    }
    let Some(session) = session_sql::load_session(conn, &artifact.artifact.session_id)? else {
        return Ok(None);
    };
    let mut stmt = conn.prepare_cached(
        "SELECT artifact_type FROM artifact_derivations WHERE source_artifact_id = ?1",
    )?;
    let decided = stmt
        .query_map(params![artifact_id], |r| r.get::<_, String>(0))?
        .filter_map(|t| t.ok().and_then(|t| t.parse().ok()))
        .collect();
    Ok(Some(Source {
        artifact,
        session,
        decided,
    }))
}

/// Uploaded artifacts of `types`, not derived themselves and not handled
/// yet, oldest first, at most `limit`: what a restart (or a full queue)
/// left to derive.
pub fn pending_sources(
    conn: &Connection,
    types: &[ArtifactType],
    limit: usize,
) -> rusqlite::Result<Vec<String>> {
    if types.is_empty() {
        return Ok(Vec::new());
    }
    // The names are the enum's own wire strings: safe to inline.
    let list = types
        .iter()
        .map(|t| format!("'{}'", t.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    let mut stmt = conn.prepare(&format!(
        "SELECT a.artifact_id FROM capability_artifacts a
         WHERE a.uploaded = 1 AND a.derived_from IS NULL AND a.artifact_type IN ({list})
           AND NOT EXISTS (SELECT 1 FROM derivation_sources d
                           WHERE d.source_artifact_id = a.artifact_id)
         ORDER BY a.rowid LIMIT ?1"
    ))?;
    let rows = stmt.query_map(params![limit as i64], |r| r.get(0))?;
    rows.collect()
}

/// Store a derived artifact and its event, unless `source` already has a
/// decision for its type (then `None`).
pub fn record_derived(
    conn: &mut Connection,
    source: &Source,
    artifact: &CapabilityArtifact,
    now: Timestamp,
) -> rusqlite::Result<Option<CapabilityEvent>> {
    let tx = conn.transaction()?;
    let src = &source.artifact.artifact.artifact_id;
    if decided(&tx, src, artifact.artifact_type)? {
        return Ok(None);
    }
    let ev = session_sql::insert_derived_artifact(
        &tx,
        &source.artifact.provider_id,
        &source.session,
        artifact,
        src,
        now,
    )?;
    tx.execute(
        "INSERT INTO artifact_derivations (source_artifact_id, artifact_type, status,
             derived_artifact_id, reason, decided_at)
         VALUES (?1, ?2, 'derived', ?3, NULL, ?4)",
        params![
            src,
            artifact.artifact_type.as_str(),
            artifact.artifact_id,
            session_sql::ts(&now)
        ],
    )?;
    tx.commit()?;
    Ok(Some(ev))
}

/// Record that deriving `kind` from `source` failed for `reason` and
/// append `artifact_derivation_failed`, unless it was decided already.
pub fn record_failed(
    conn: &mut Connection,
    source: &Source,
    kind: ArtifactType,
    deriver: &str,
    reason: &str,
    now: Timestamp,
) -> rusqlite::Result<Option<CapabilityEvent>> {
    let tx = conn.transaction()?;
    let a = &source.artifact.artifact;
    if decided(&tx, &a.artifact_id, kind)? {
        return Ok(None);
    }
    tx.execute(
        "INSERT INTO artifact_derivations (source_artifact_id, artifact_type, status,
             derived_artifact_id, reason, decided_at)
         VALUES (?1, ?2, 'failed', NULL, ?3, ?4)",
        params![a.artifact_id, kind.as_str(), reason, session_sql::ts(&now)],
    )?;
    let s = &source.session.session;
    let data: Value = json!({
        "source_artifact_id": a.artifact_id,
        "source_sha256": a.checksum,
        "artifact_type": kind,
        "deriver": deriver,
        "reason": reason,
    });
    let ev = append(
        &tx,
        NewEvent::new(EventType::ArtifactDerivationFailed, "registry", data)
            .provider(source.artifact.provider_id.clone())
            .capability(s.capability_id.clone())
            .lease(s.lease_id.clone())
            .session(s.session_id.clone())
            .artifact(a.artifact_id.clone()),
    )?;
    tx.commit()?;
    Ok(Some(ev))
}

/// Mark `source_artifact_id` handled: nothing more is derived from it.
pub fn mark_handled(
    conn: &Connection,
    source_artifact_id: &str,
    now: Timestamp,
) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT INTO derivation_sources (source_artifact_id, handled_at) VALUES (?1, ?2)
         ON CONFLICT DO NOTHING",
        params![source_artifact_id, session_sql::ts(&now)],
    )?;
    Ok(())
}

fn decided(conn: &Connection, source: &str, kind: ArtifactType) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT 1 FROM artifact_derivations WHERE source_artifact_id = ?1 AND artifact_type = ?2",
    )?
    .exists(params![source, kind.as_str()])
}
