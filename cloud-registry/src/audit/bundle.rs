//! Audit bundles (docs/audit-trail.md "Audit bundles"): one tar holding an
//! audit request's records, the chain segment that covers them with its
//! signed checkpoint, and the bytes of its artifacts, for
//! `benchlink verify-bundle` to check offline.
//!
//! - [`build`]: gather the records on the read connection, sign a
//!   checkpoint when none covers the audit's last event, spool the blobs,
//!   write the tar to an unlinked temporary file;
//! - [`router`]: `GET /audit-requests/{id}/bundle` streams it.

use std::collections::{BTreeMap, HashSet};
use std::io::{Seek, SeekFrom, Write};
use std::sync::Arc;

use crate::sql::{params, Connection, OptionalExtension};
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use ed25519_dalek::SigningKey;
use futures::StreamExt;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};
use shared_protocol::api::ErrorBody;
use shared_protocol::artifact::CapabilityArtifact;
use shared_protocol::chain::{BundleFile, BundleManifest, BUNDLE_FORMAT};
use shared_protocol::session::CapabilitySession;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

use super::error::AuditError;
use super::model::ClaimInfo;
use super::service::AuditService;
use crate::auth::Principal;
use crate::db::Db;
use crate::error::{ApiError, ApiResult};
use crate::events::chain::{self, Checkpoint};
use crate::leases::LeaseEngine;
use crate::sessions::sql::{self as session_sql, ArtifactFilter, SessionFilter};
use crate::sessions::BlobStore;

/// What the bundle route needs: the audit service (role checks, the
/// request record), the store, the signing key (a checkpoint when none
/// covers the audit yet), the lease engine and the artifact bytes.
#[derive(Clone)]
pub struct BundleApi {
    pub audit: Arc<AuditService>,
    pub db: Db,
    pub key: Arc<SigningKey>,
    pub leases: Arc<LeaseEngine>,
    pub blobs: Arc<dyn BlobStore>,
}

/// `GET /audit-requests/{id}/bundle`, relative to `/api/v1`.
pub fn router(api: BundleApi) -> OpenApiRouter {
    OpenApiRouter::new()
        .routes(routes!(get_bundle))
        .with_state(api)
}

/// The audit bundle of one request: a tar (`manifest.json` first, see
/// docs/audit-trail.md "Audit bundles").
#[utoipa::path(get, path = "/audit-requests/{audit_request_id}/bundle", tag = "audit",
    params(("audit_request_id" = String, Path)),
    responses(
        (status = 200, description = "The bundle, a tar archive", content_type = "application/x-tar", body = Vec<u8>),
        (status = 403, description = "`forbidden` (role `provider`)", body = ErrorBody),
        (status = 404, description = "`not_found`", body = ErrorBody),
    ))]
async fn get_bundle(
    State(api): State<BundleApi>,
    who: Principal,
    Path(id): Path<String>,
) -> ApiResult<Response> {
    let (file, size) = build(&api, &who, &id).await?;
    let file = tokio::fs::File::from_std(file);
    let stream = futures::stream::unfold(file, |mut f| async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 64 * 1024];
        match f.read(&mut buf).await {
            Ok(0) => None,
            Ok(n) => {
                buf.truncate(n);
                Some((Ok::<_, std::io::Error>(bytes::Bytes::from(buf)), f))
            }
            Err(e) => Some((Err(e), f)),
        }
    });
    let name = format!(
        "audit-bundle-{}.tar",
        id.replace(
            |c: char| !c.is_ascii_alphanumeric() && c != '-' && c != '_',
            "_"
        )
    );
    Ok((
        [
            (header::CONTENT_TYPE, "application/x-tar".to_string()),
            (header::CONTENT_LENGTH, size.to_string()),
            (
                header::CONTENT_DISPOSITION,
                format!("attachment; filename=\"{name}\""),
            ),
        ],
        Body::from_stream(stream),
    )
        .into_response())
}

/// The records of one audit, as read from the store.
struct Gathered {
    claims: Vec<ClaimInfo>,
    /// `(claim_id, record)` of each stored result.
    results: Vec<(String, Value)>,
    sessions: Vec<CapabilitySession>,
    artifacts: Vec<CapabilityArtifact>,
    lease_ids: Vec<String>,
    /// The first and last event that names the audit, its leases,
    /// sessions or artifacts.
    first: u64,
    last: u64,
}

/// Build the bundle of request `id` for `who` into an unlinked temporary
/// file (next to the artifact staging files), rewound; answers it and its
/// length in bytes.
///
/// Errors: `Forbidden` / `NotFound` as for reading the request; 500 for the
/// store or the disk.
pub async fn build(
    api: &BundleApi,
    who: &Principal,
    id: &str,
) -> Result<(std::fs::File, u64), ApiError> {
    let record = api.audit.get(who, id).await?;
    let key = id.to_string();
    let g = api
        .db
        .read(move |c| gather(c, &key))
        .await
        .map_err(AuditError::from)?
        .map_err(ApiError::internal)?;
    let mut leases = Vec::new();
    for l in &g.lease_ids {
        if let Some(lease) = api.leases.get(l).await {
            leases.push(lease);
        }
    }
    let last = g.last;
    let mut cp = api
        .db
        .read(move |c| covering_checkpoint(c, last))
        .await
        .map_err(AuditError::from)?
        .map_err(ApiError::internal)?;
    if cp.is_none() {
        let k = api.key.clone();
        api.db
            .write(move |c| chain::checkpoint(c, &k))
            .await
            .map_err(AuditError::from)?
            .map_err(ApiError::internal)?;
        cp = api
            .db
            .read(move |c| covering_checkpoint(c, last))
            .await
            .map_err(AuditError::from)?
            .map_err(ApiError::internal)?;
    }
    let cp = cp.ok_or_else(|| ApiError::internal("no checkpoint covers the audit's events"))?;
    let (first, upto) = (g.first.max(1), cp.event_id);
    let segment = api
        .db
        .read(move |c| chain::segment(c, first, upto))
        .await
        .map_err(AuditError::from)?
        .map_err(ApiError::internal)?;

    // The artifact bytes, spooled from the blob store (which may stream).
    let staging = api.blobs.staging_dir();
    let mut blobs: Vec<(String, std::fs::File, u64)> = Vec::new();
    let mut without_bytes = Vec::new();
    let mut seen = HashSet::new();
    for a in &g.artifacts {
        if !seen.insert(a.checksum.clone()) {
            continue;
        }
        let content = match api.blobs.open(&a.checksum).await {
            Ok(Some(c)) if a.uploaded => c,
            Ok(_) | Err(_) => {
                without_bytes.push(a.artifact_id.clone());
                continue;
            }
        };
        let dir = staging.clone();
        let spool = tokio::task::spawn_blocking(move || tempfile::tempfile_in(dir))
            .await
            .map_err(ApiError::internal)?
            .map_err(ApiError::internal)?;
        let mut out = tokio::fs::File::from_std(spool);
        let mut stream = content.stream;
        let mut size = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(ApiError::internal)?;
            size += chunk.len() as u64;
            tokio::io::AsyncWriteExt::write_all(&mut out, &chunk)
                .await
                .map_err(ApiError::internal)?;
        }
        tokio::io::AsyncWriteExt::flush(&mut out)
            .await
            .map_err(ApiError::internal)?;
        blobs.push((a.checksum.clone(), out.into_std().await, size));
    }

    let mut files: Vec<(String, Vec<u8>)> = Vec::new();
    let json_file = |v: &Value| serde_json::to_vec_pretty(v).unwrap_or_default();
    files.push(("request.json".into(), json_file(&json!(record))));
    for c in &g.claims {
        files.push((format!("claims/{}.json", c.claim_id), json_file(&json!(c))));
    }
    for (claim_id, r) in &g.results {
        files.push((format!("results/{claim_id}.json"), json_file(r)));
    }
    files.push(("leases.json".into(), json_file(&json!(leases))));
    files.push(("sessions.json".into(), json_file(&json!(g.sessions))));
    files.push(("artifacts.json".into(), json_file(&json!(g.artifacts))));
    let mut events = Vec::new();
    for row in &segment {
        serde_json::to_writer(&mut events, row).map_err(ApiError::internal)?;
        events.push(b'\n');
    }
    files.push(("events.jsonl".into(), events));
    files.push(("checkpoint.json".into(), json_file(&json!(cp))));

    let manifest = BundleManifest {
        format: BUNDLE_FORMAT.to_string(),
        audit_request_id: id.to_string(),
        created_at: chrono::Utc::now().to_rfc3339(),
        files: Vec::new(),
        artifacts_without_bytes: without_bytes,
        public_key_hint: Some(hex::encode(api.key.verifying_key().as_bytes())),
    };
    tokio::task::spawn_blocking(move || write_tar(manifest, files, blobs, &staging))
        .await
        .map_err(ApiError::internal)?
        .map_err(ApiError::internal)
}

/// Write the tar: `manifest.json` (listing every other file with its
/// SHA-256 and size), the record files, then `artifacts/<sha256>`.
fn write_tar(
    mut manifest: BundleManifest,
    files: Vec<(String, Vec<u8>)>,
    mut blobs: Vec<(String, std::fs::File, u64)>,
    staging: &std::path::Path,
) -> std::io::Result<(std::fs::File, u64)> {
    for (path, bytes) in &files {
        manifest.files.push(BundleFile {
            path: path.clone(),
            sha256: hex::encode(Sha256::digest(bytes)),
            size: bytes.len() as u64,
        });
    }
    for (sha, file, size) in &mut blobs {
        file.seek(SeekFrom::Start(0))?;
        let mut h = Sha256::new();
        std::io::copy(file, &mut HashWriter(&mut h))?;
        file.seek(SeekFrom::Start(0))?;
        manifest.files.push(BundleFile {
            path: format!("artifacts/{sha}"),
            sha256: hex::encode(h.finalize()),
            size: *size,
        });
    }
    let out = tempfile::tempfile_in(staging)?;
    let mut tar = tar::Builder::new(out);
    let mtime = chrono::Utc::now().timestamp().max(0) as u64;
    let add = |tar: &mut tar::Builder<std::fs::File>,
               path: &str,
               size: u64,
               data: &mut dyn std::io::Read|
     -> std::io::Result<()> {
        let mut h = tar::Header::new_ustar();
        h.set_size(size);
        h.set_mode(0o644);
        h.set_mtime(mtime);
        h.set_entry_type(tar::EntryType::Regular);
        tar.append_data(&mut h, path, data)
    };
    let manifest_bytes = serde_json::to_vec_pretty(&manifest)?;
    add(
        &mut tar,
        "manifest.json",
        manifest_bytes.len() as u64,
        &mut manifest_bytes.as_slice(),
    )?;
    for (path, bytes) in &files {
        add(&mut tar, path, bytes.len() as u64, &mut bytes.as_slice())?;
    }
    for (sha, file, size) in &mut blobs {
        add(&mut tar, &format!("artifacts/{sha}"), *size, file)?;
    }
    let mut out = tar.into_inner()?;
    out.flush()?;
    let len = out.seek(SeekFrom::End(0))?;
    out.seek(SeekFrom::Start(0))?;
    Ok((out, len))
}

/// `Write` into a running SHA-256.
struct HashWriter<'a>(&'a mut Sha256);

impl Write for HashWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.update(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// The oldest stored checkpoint at or after event `last`.
fn covering_checkpoint(conn: &Connection, last: u64) -> rusqlite::Result<Option<Checkpoint>> {
    conn.query_row(
        "SELECT event_id, hash, signed_at, public_key, signature FROM event_checkpoints
         WHERE event_id >= ?1 ORDER BY event_id, checkpoint_id LIMIT 1",
        params![last as i64],
        |r| {
            Ok(Checkpoint {
                event_id: r.get::<_, i64>(0)? as u64,
                hash: r.get(1)?,
                signed_at: r.get(2)?,
                public_key: r.get(3)?,
                signature: r.get(4)?,
            })
        },
    )
    .optional()
}

/// Read what request `id` involves: its claims and results, the leases of
/// its claims, their sessions, those sessions' artifacts (and the ones its
/// results cite), and the span of events naming any of them.
fn gather(conn: &Connection, id: &str) -> rusqlite::Result<Gathered> {
    const ALL: usize = i64::MAX as usize;
    let mut claims = Vec::new();
    {
        let mut stmt = conn.prepare(
            "SELECT claim_id FROM audit_claims WHERE audit_request_id = ?1 ORDER BY attempt",
        )?;
        let ids: Vec<String> = stmt
            .query_map(params![id], |r| r.get(0))?
            .collect::<Result<_, _>>()?;
        for c in ids {
            if let Some(claim) = super::sql::load_claim(conn, &c)? {
                claims.push(claim);
            }
        }
    }
    let mut results = Vec::new();
    let mut cited: Vec<String> = Vec::new();
    {
        let mut stmt = conn.prepare(
            "SELECT result_id, claim_id, submitted_by, received_at, result_json
             FROM audit_results WHERE audit_request_id = ?1 ORDER BY result_id",
        )?;
        let rows = stmt.query_map(params![id], |r| {
            Ok((
                r.get::<_, i64>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, String>(3)?,
                r.get::<_, String>(4)?,
            ))
        })?;
        for row in rows {
            let (result_id, claim_id, by, at, text) = row?;
            let result: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
            if let Some(refs) = result.get("artifact_refs").and_then(Value::as_array) {
                cited.extend(refs.iter().filter_map(Value::as_str).map(str::to_string));
            }
            results.push((
                claim_id.clone(),
                json!({
                    "result_id": result_id,
                    "claim_id": claim_id,
                    "submitted_by": by,
                    "received_at": at,
                    "result": result,
                }),
            ));
        }
    }
    let mut lease_ids: Vec<String> = Vec::new();
    for c in &claims {
        for l in &c.lease_ids {
            if !lease_ids.contains(l) {
                lease_ids.push(l.clone());
            }
        }
    }
    let mut sessions = Vec::new();
    let mut artifacts: BTreeMap<String, CapabilityArtifact> = BTreeMap::new();
    for l in &lease_ids {
        let found = session_sql::list_sessions(
            conn,
            &SessionFilter {
                lease_id: Some(l.clone()),
                limit: ALL,
                ..SessionFilter::default()
            },
        )?;
        for s in found.into_iter().rev() {
            for a in session_sql::list_artifacts(
                conn,
                &ArtifactFilter {
                    session_id: Some(s.session.session_id.clone()),
                    lease_id: None,
                    uploaded: None,
                    derived_from: None,
                    limit: ALL,
                },
            )? {
                artifacts.insert(a.artifact.artifact_id.clone(), a.artifact);
            }
            sessions.push(s.session);
        }
    }
    for a in cited {
        if let std::collections::btree_map::Entry::Vacant(slot) = artifacts.entry(a) {
            if let Some(row) = session_sql::load_artifact(conn, slot.key())? {
                slot.insert(row.artifact);
            }
        }
    }
    let session_ids: HashSet<&str> = sessions.iter().map(|s| s.session_id.as_str()).collect();
    let leases: HashSet<&str> = lease_ids.iter().map(String::as_str).collect();
    let (mut first, mut last) = (0u64, 0u64);
    {
        // No index serves this (events are read by id only): one pass.
        let mut stmt = conn.prepare(
            "SELECT event_id, audit_request_id, lease_id, session_id, artifact_id FROM events
             ORDER BY event_id",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(r) = rows.next()? {
            let named = |col: usize, set: &dyn Fn(&str) -> bool| -> rusqlite::Result<bool> {
                Ok(r.get::<_, Option<String>>(col)?.is_some_and(|v| set(&v)))
            };
            if named(1, &|a| a == id)?
                || named(2, &|l| leases.contains(l))?
                || named(3, &|s| session_ids.contains(s))?
                || named(4, &|a| artifacts.contains_key(a))?
            {
                let event_id = r.get::<_, i64>(0)? as u64;
                if first == 0 {
                    first = event_id;
                }
                last = event_id;
            }
        }
    }
    Ok(Gathered {
        claims,
        results,
        sessions,
        artifacts: artifacts.into_values().collect(),
        lease_ids,
        first,
        last,
    })
}
