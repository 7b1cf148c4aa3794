//! Artifact bytes that no artifact row binds ("unbound" bytes): what a
//! provider uploaded under an artifact id whose metadata has not arrived
//! (yet, or ever), and what such an upload left behind when it was
//! replaced or refused.
//!
//! Table `artifact_unbound_blobs` has one row per provider and sha256 that
//! provider stored without an artifact row to bind them to, from the first
//! such upload on. The sweep ([`expire_unbound`]) runs with a cutoff
//! (`now - sessions.unbound_upload_ttl_seconds`):
//!
//! - held uploads (`artifact_pending_uploads`) received before the cutoff
//!   are dropped: their metadata did not come in time;
//! - a blob whose rows here are all older than the cutoff is deleted unless
//!   an uploaded artifact has its sha256 (the store is content-addressed:
//!   the same bytes may be another artifact's evidence) or a held upload
//!   still names it. Rows of blobs an artifact binds are simply forgotten.
//!
//! The functions run on a database thread; deleting the files is the
//! caller's (off the async workers), between [`expire_unbound`] and
//! [`forget_deleted`].
//!
//! Uploads still arriving count too: [`InFlight`] keeps, per provider, the
//! declared lengths of the uploads for unknown artifacts whose bodies are
//! being received, so parallel uploads cannot together pass the
//! per-provider limit that each alone would respect.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use crate::sql::{params, Connection, OptionalExtension};
use shared_protocol::Timestamp;

use super::sql::ts;

/// Create the table and the indexes the sweep and the per-provider limit
/// look through (idempotent). Held uploads from before the table existed
/// are entered with their own reception time.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS artifact_unbound_blobs (
            provider_id TEXT NOT NULL,
            sha256      TEXT NOT NULL,
            artifact_id TEXT NOT NULL,
            size_bytes  INTEGER NOT NULL,
            received_at TEXT NOT NULL,
            PRIMARY KEY (provider_id, sha256)
        );
        CREATE INDEX IF NOT EXISTS artifact_unbound_blobs_sha256
            ON artifact_unbound_blobs(sha256);
        CREATE INDEX IF NOT EXISTS artifact_unbound_blobs_received
            ON artifact_unbound_blobs(received_at);
        CREATE INDEX IF NOT EXISTS artifact_pending_uploads_sha256
            ON artifact_pending_uploads(sha256);
        CREATE INDEX IF NOT EXISTS artifact_pending_uploads_received
            ON artifact_pending_uploads(received_at);
        CREATE INDEX IF NOT EXISTS capability_artifacts_checksum
            ON capability_artifacts(checksum);
        INSERT INTO artifact_unbound_blobs
            (provider_id, sha256, artifact_id, size_bytes, received_at)
            SELECT provider_id, sha256, artifact_id, size_bytes, received_at
            FROM artifact_pending_uploads WHERE true
            ON CONFLICT DO NOTHING;",
    )
}

/// Record that `provider_id` stored the bytes `sha256` (`size_bytes`
/// long) under `artifact_id` at `now` and no artifact row binds them. A
/// later upload of the same bytes by the same provider keeps the first
/// row, so repeating an upload does not extend its grace time.
pub fn note_unbound(
    conn: &Connection,
    provider_id: &str,
    sha256: &str,
    artifact_id: &str,
    size_bytes: u64,
    now: Timestamp,
) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "INSERT INTO artifact_unbound_blobs
             (provider_id, sha256, artifact_id, size_bytes, received_at)
         VALUES (?1, ?2, ?3, ?4, ?5) ON CONFLICT DO NOTHING",
    )?
    .execute(params![
        provider_id,
        sha256,
        artifact_id,
        size_bytes.min(i64::MAX as u64) as i64,
        ts(&now)
    ])?;
    Ok(())
}

/// A provider's unbound bytes, for the per-provider limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UnboundUsage {
    /// Bytes of the distinct blobs the provider stored that no uploaded
    /// artifact has the sha256 of.
    pub bytes: u64,
    /// Whether an upload of the bytes asked about would add nothing: the
    /// provider already stored them (unbound, or bound since), or holds
    /// them for the very artifact id asked about.
    pub already_stored: bool,
}

/// How many unbound bytes `provider_id` holds, and whether uploading
/// `sha256` under `artifact_id` would add to them.
pub fn unbound_usage(
    conn: &Connection,
    provider_id: &str,
    artifact_id: &str,
    sha256: &str,
) -> rusqlite::Result<UnboundUsage> {
    let bytes: i64 = conn
        .prepare_cached(
            "SELECT COALESCE(SUM(u.size_bytes), 0) FROM artifact_unbound_blobs u
             WHERE u.provider_id = ?1
               AND NOT EXISTS (SELECT 1 FROM capability_artifacts a
                               WHERE a.checksum = u.sha256 AND a.uploaded = 1)",
        )?
        .query_row(params![provider_id], |r| r.get(0))?;
    let already_stored: bool = conn
        .prepare_cached(
            "SELECT EXISTS (SELECT 1 FROM artifact_unbound_blobs
                            WHERE provider_id = ?1 AND sha256 = ?3)
                 OR EXISTS (SELECT 1 FROM artifact_pending_uploads
                            WHERE artifact_id = ?2 AND provider_id = ?1 AND sha256 = ?3)",
        )?
        .query_row(params![provider_id, artifact_id, sha256], |r| r.get(0))?;
    Ok(UnboundUsage {
        bytes: bytes.max(0) as u64,
        already_stored,
    })
}

/// Whether anything was received before `cutoff` and may be due for the
/// sweep (a cheap look on the reader before taking the sweep's locks).
pub fn anything_before(conn: &Connection, cutoff: Timestamp) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM artifact_pending_uploads WHERE received_at < ?1)
             OR EXISTS (SELECT 1 FROM artifact_unbound_blobs WHERE received_at < ?1)",
    )?
    .query_row(params![ts(&cutoff)], |r| r.get(0))
}

/// A held upload the sweep dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DroppedUpload {
    /// The artifact id the bytes were PUT under.
    pub artifact_id: String,
    /// The provider that PUT them.
    pub provider_id: String,
    /// Their sha256 (lowercase hex).
    pub sha256: String,
    /// Their length, bytes.
    pub size_bytes: u64,
}

/// A blob the sweep found unbound past the cutoff: delete its file, then
/// call [`forget_deleted`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoomedBlob {
    /// The blob's sha256 (lowercase hex).
    pub sha256: String,
    /// Its length, bytes.
    pub size_bytes: u64,
    /// Who stored these bytes and under which artifact id (first upload
    /// of each provider), oldest first.
    pub uploads: Vec<(String, String)>,
}

/// What [`expire_unbound`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expired {
    /// Held uploads removed (their rows are gone).
    pub dropped: Vec<DroppedUpload>,
    /// Blobs to delete (their rows stay until [`forget_deleted`]).
    pub doomed: Vec<DoomedBlob>,
}

/// The sweep's database half, in one transaction: drop held uploads
/// received before `cutoff`, forget rows of blobs an uploaded artifact
/// binds, and list the blobs nothing references any more whose rows are
/// all older than `cutoff`. A blob another held upload or a provider's
/// newer upload still names is kept.
///
/// The caller must keep new uploads from being recorded until it has
/// deleted the listed files (a new upload of the same bytes would find the
/// file about to go).
pub fn expire_unbound(conn: &mut Connection, cutoff: Timestamp) -> rusqlite::Result<Expired> {
    let cutoff = ts(&cutoff);
    let tx = conn.transaction()?;
    let mut out = Expired::default();
    {
        let mut stmt = tx.prepare_cached(
            "DELETE FROM artifact_pending_uploads WHERE received_at < ?1
             RETURNING artifact_id, provider_id, sha256, size_bytes",
        )?;
        let rows = stmt.query_map(params![cutoff], |r| {
            Ok(DroppedUpload {
                artifact_id: r.get(0)?,
                provider_id: r.get(1)?,
                sha256: r.get(2)?,
                size_bytes: r.get::<_, i64>(3)?.max(0) as u64,
            })
        })?;
        out.dropped = rows.collect::<rusqlite::Result<_>>()?;
    }
    let expired: Vec<(String, String, String, u64)> = {
        let mut stmt = tx.prepare_cached(
            "SELECT sha256, provider_id, artifact_id, size_bytes FROM artifact_unbound_blobs
             WHERE received_at < ?1 ORDER BY sha256, received_at",
        )?;
        let rows = stmt.query_map(params![cutoff], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                r.get(2)?,
                r.get::<_, i64>(3)?.max(0) as u64,
            ))
        })?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut by_sha: Vec<DoomedBlob> = Vec::new();
    for (sha256, provider_id, artifact_id, size_bytes) in expired {
        match by_sha.last_mut() {
            Some(b) if b.sha256 == sha256 => b.uploads.push((provider_id, artifact_id)),
            _ => by_sha.push(DoomedBlob {
                sha256,
                size_bytes,
                uploads: vec![(provider_id, artifact_id)],
            }),
        }
    }
    for blob in by_sha {
        let bound: bool = tx
            .prepare_cached(
                "SELECT EXISTS (SELECT 1 FROM capability_artifacts
                                WHERE checksum = ?1 AND uploaded = 1)",
            )?
            .query_row(params![blob.sha256], |r| r.get(0))?;
        let held = !bound
            && tx
                .prepare_cached("SELECT 1 FROM artifact_pending_uploads WHERE sha256 = ?1 LIMIT 1")?
                .query_row(params![blob.sha256], |r| r.get::<_, i64>(0))
                .optional()?
                .is_some();
        if held {
            // A held upload within its grace time still names the bytes.
            continue;
        }
        let newer = !bound
            && tx
                .prepare_cached(
                    "SELECT 1 FROM artifact_unbound_blobs
                     WHERE sha256 = ?1 AND received_at >= ?2 LIMIT 1",
                )?
                .query_row(params![blob.sha256, cutoff], |r| r.get::<_, i64>(0))
                .optional()?
                .is_some();
        if bound || newer {
            // Bound: the blob is evidence now. Newer: another provider's
            // row, within its grace time, decides later.
            tx.prepare_cached(
                "DELETE FROM artifact_unbound_blobs WHERE sha256 = ?1 AND received_at < ?2",
            )?
            .execute(params![blob.sha256, cutoff])?;
            continue;
        }
        out.doomed.push(blob);
    }
    tx.commit()?;
    Ok(out)
}

/// The file of blob `sha256` was deleted: forget its rows received before
/// `cutoff` (the same cutoff [`expire_unbound`] was given).
pub fn forget_deleted(conn: &Connection, sha256: &str, cutoff: Timestamp) -> rusqlite::Result<()> {
    conn.prepare_cached(
        "DELETE FROM artifact_unbound_blobs WHERE sha256 = ?1 AND received_at < ?2",
    )?
    .execute(params![sha256, ts(&cutoff)])?;
    Ok(())
}

/// Bytes of uploads for unknown artifacts being received now, per
/// provider id (in memory: nothing is in flight after a restart).
#[derive(Debug, Clone, Default)]
pub struct InFlight(Arc<Mutex<HashMap<String, u64>>>);

impl InFlight {
    /// Count `bytes` more for `provider_id` until the returned reservation
    /// is dropped. Returns the bytes the provider's other uploads had in
    /// flight just before, and the reservation.
    ///
    /// Reserve *before* reading the stored usage: an upload that finishes
    /// in between is then counted once in the store, once here or both
    /// times (a cautious refusal, retried), never not at all.
    pub fn reserve(&self, provider_id: &str, bytes: u64) -> (u64, Reservation) {
        let mut m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        let slot = m.entry(provider_id.to_string()).or_insert(0);
        let before = *slot;
        *slot = slot.saturating_add(bytes);
        (
            before,
            Reservation {
                map: self.clone(),
                provider_id: provider_id.to_string(),
                bytes,
            },
        )
    }

    /// Bytes in flight for `provider_id` now.
    pub fn bytes(&self, provider_id: &str) -> u64 {
        let m = self.0.lock().unwrap_or_else(|p| p.into_inner());
        m.get(provider_id).copied().unwrap_or(0)
    }
}

/// Bytes counted in [`InFlight`] while an upload's body arrives; released
/// on drop (after the upload's row is committed, or when it fails).
#[derive(Debug)]
pub struct Reservation {
    map: InFlight,
    provider_id: String,
    bytes: u64,
}

impl Drop for Reservation {
    fn drop(&mut self) {
        let mut m = self.map.0.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(slot) = m.get_mut(&self.provider_id) {
            *slot = slot.saturating_sub(self.bytes);
            if *slot == 0 {
                m.remove(&self.provider_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sessions::sql::{self, UploadRecorded};
    use chrono::{Duration, TimeZone, Utc};

    fn at(minute: u32) -> Timestamp {
        Utc.with_ymd_and_hms(2026, 1, 1, 0, minute, 0).unwrap()
    }

    fn sha(c: char) -> String {
        c.to_string().repeat(64)
    }

    /// A registry store in a real SQLite file.
    fn open(dir: &tempfile::TempDir) -> Connection {
        let mut conn = Connection::open(dir.path().join("registry.sqlite3")).unwrap();
        let tx = conn.transaction().unwrap();
        crate::events::migrate(&tx).unwrap();
        sql::migrate(&tx).unwrap();
        migrate(&tx).unwrap();
        tx.commit().unwrap();
        conn
    }

    /// What the upload path does for bytes no artifact row binds: the
    /// held row, and this table's row.
    fn upload(conn: &mut Connection, provider: &str, artifact: &str, sum: &str, when: Timestamp) {
        let r = sql::record_upload(conn, artifact, provider, sum, 100, when).unwrap();
        assert!(matches!(r, UploadRecorded::Held { .. }), "{r:?}");
        note_unbound(conn, provider, sum, artifact, 100, when).unwrap();
    }

    /// An artifact row whose bytes (`sum`) are uploaded.
    fn bound_artifact(conn: &Connection, artifact: &str, sum: &str) {
        conn.execute(
            "INSERT INTO capability_artifacts (artifact_id, session_id, provider_id,
                 artifact_type, storage_uri, content_type, captured_at, checksum, size_bytes,
                 metadata_json, uploaded, uploaded_at, received_at)
             VALUES (?1, 'sess_1', 'bench-a', 'image', '', 'image/jpeg', ?3, ?2, 100, '{}', 1,
                 ?3, ?3)",
            params![artifact, sum, ts(&at(0))],
        )
        .unwrap();
    }

    fn doomed(e: &Expired) -> Vec<String> {
        e.doomed.iter().map(|b| b.sha256.clone()).collect()
    }

    fn rows(conn: &Connection, table: &str) -> i64 {
        conn.query_row(&format!("SELECT COUNT(*) FROM {table}"), [], |r| r.get(0))
            .unwrap()
    }

    #[test]
    fn held_bytes_past_the_cutoff_are_dropped_and_their_blob_listed() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir);
        upload(&mut conn, "bench-a", "art-stray", &sha('a'), at(0));
        upload(&mut conn, "bench-a", "art-young", &sha('b'), at(50));
        assert!(!anything_before(&conn, at(0)).unwrap());
        assert!(anything_before(&conn, at(1)).unwrap());

        let e = expire_unbound(&mut conn, at(30)).unwrap();
        assert_eq!(
            e.dropped,
            [DroppedUpload {
                artifact_id: "art-stray".into(),
                provider_id: "bench-a".into(),
                sha256: sha('a'),
                size_bytes: 100,
            }]
        );
        assert_eq!(doomed(&e), [sha('a')]);
        assert_eq!(
            e.doomed[0].uploads,
            [("bench-a".to_string(), "art-stray".to_string())]
        );
        assert_eq!(
            rows(&conn, "artifact_pending_uploads"),
            1,
            "the young one stays"
        );
        forget_deleted(&conn, &sha('a'), at(30)).unwrap();
        assert_eq!(rows(&conn, "artifact_unbound_blobs"), 1);
        assert_eq!(
            expire_unbound(&mut conn, at(30)).unwrap(),
            Expired::default()
        );
    }

    #[test]
    fn a_blob_an_uploaded_artifact_has_is_never_listed_but_its_rows_are_forgotten() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir);
        bound_artifact(&conn, "art-bound", &sha('c'));
        // The same bytes once more under an id no metadata names.
        upload(&mut conn, "bench-a", "art-copy", &sha('c'), at(0));
        let e = expire_unbound(&mut conn, at(30)).unwrap();
        assert_eq!(e.dropped.len(), 1, "the held copy is dropped");
        assert!(e.doomed.is_empty(), "the blob is art-bound's evidence");
        assert_eq!(rows(&conn, "artifact_unbound_blobs"), 0);
    }

    #[test]
    fn bytes_replaced_under_the_same_artifact_id_are_listed_once_past_the_cutoff() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir);
        upload(&mut conn, "bench-a", "art-x", &sha('d'), at(0));
        upload(&mut conn, "bench-a", "art-x", &sha('e'), at(20));
        assert_eq!(rows(&conn, "artifact_pending_uploads"), 1);
        let e = expire_unbound(&mut conn, at(10)).unwrap();
        assert!(e.dropped.is_empty());
        assert_eq!(doomed(&e), [sha('d')], "no row names the replaced bytes");
        forget_deleted(&conn, &sha('d'), at(10)).unwrap();
        let e = expire_unbound(&mut conn, at(30)).unwrap();
        assert_eq!(e.dropped.len(), 1);
        assert_eq!(doomed(&e), [sha('e')]);
    }

    #[test]
    fn a_blob_a_held_upload_or_a_newer_upload_names_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir);
        // bench-a: the same bytes under two ids, the second much later.
        upload(&mut conn, "bench-a", "art-1", &sha('f'), at(0));
        upload(&mut conn, "bench-a", "art-2", &sha('f'), at(40));
        // bench-a then bench-b store the same bytes.
        upload(&mut conn, "bench-a", "art-3", &sha('9'), at(0));
        upload(&mut conn, "bench-b", "art-4", &sha('9'), at(40));
        conn.execute(
            "DELETE FROM artifact_pending_uploads WHERE artifact_id IN ('art-3', 'art-4')",
            [],
        )
        .unwrap();

        let e = expire_unbound(&mut conn, at(30)).unwrap();
        assert_eq!(e.dropped.len(), 1, "art-1 only");
        assert!(e.doomed.is_empty(), "{e:?}");
        let e = expire_unbound(&mut conn, at(50)).unwrap();
        assert_eq!(e.dropped.len(), 1, "art-2");
        assert_eq!(doomed(&e), [sha('9'), sha('f')]);
    }

    #[test]
    fn usage_counts_each_unbound_blob_once_and_not_bound_ones() {
        let dir = tempfile::tempdir().unwrap();
        let mut conn = open(&dir);
        let now = at(0) + Duration::seconds(1);
        upload(&mut conn, "bench-a", "art-1", &sha('a'), now);
        upload(&mut conn, "bench-a", "art-2", &sha('a'), now);
        upload(&mut conn, "bench-a", "art-3", &sha('b'), now);
        upload(&mut conn, "bench-b", "art-4", &sha('c'), now);
        let u = unbound_usage(&conn, "bench-a", "art-9", &sha('d')).unwrap();
        assert_eq!(
            u,
            UnboundUsage {
                bytes: 200,
                already_stored: false
            }
        );
        assert!(
            unbound_usage(&conn, "bench-a", "art-9", &sha('a'))
                .unwrap()
                .already_stored
        );
        bound_artifact(&conn, "art-bound", &sha('b'));
        assert_eq!(
            unbound_usage(&conn, "bench-a", "art-9", &sha('d'))
                .unwrap()
                .bytes,
            100
        );
    }

    #[test]
    fn in_flight_bytes_count_until_their_reservation_drops() {
        let f = InFlight::default();
        let (before, a) = f.reserve("bench-a", 300);
        assert_eq!(before, 0);
        let (before, b) = f.reserve("bench-a", 200);
        assert_eq!(before, 300);
        let (before, _c) = f.reserve("bench-b", 50);
        assert_eq!(before, 0, "providers are counted apart");
        drop(a);
        assert_eq!(f.bytes("bench-a"), 200);
        drop(b);
        assert_eq!(f.bytes("bench-a"), 0);
        assert_eq!(f.bytes("bench-b"), 50);
    }
}
