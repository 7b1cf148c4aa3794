//! Offline check of an audit bundle (docs/audit-trail.md "Audit bundles"):
//! [`verify`] reads the tar with nothing but the registry's public key and
//! answers the audit's timeline, or the first failure naming the file and
//! the reason. `benchlink verify-bundle` prints either.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::io::Read;

use ed25519_dalek::{Signature, Verifier, VerifyingKey};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use shared_protocol::chain::{
    self, checkpoint_message, row_hash, BundleManifest, ChainedRow, BUNDLE_FORMAT,
};

/// The first thing wrong with a bundle: the file it is about (a path in
/// the archive, or `archive` / `public key`) and why.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BundleError {
    pub file: String,
    pub reason: String,
}

impl std::fmt::Display for BundleError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.file, self.reason)
    }
}

impl std::error::Error for BundleError {}

fn fail<T>(file: impl Into<String>, reason: impl Into<String>) -> Result<T, BundleError> {
    Err(BundleError {
        file: file.into(),
        reason: reason.into(),
    })
}

/// A bundle's `checkpoint.json`: the registry's signed statement that the
/// chain's event `event_id` has `hash`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BundleCheckpoint {
    pub event_id: u64,
    pub hash: String,
    /// RFC 3339.
    pub signed_at: String,
    /// The key the registry names (not trusted).
    pub public_key: String,
    /// Ed25519 signature (hex) of [`checkpoint_message`].
    pub signature: String,
}

/// One line of the timeline: an event of the segment that names the
/// audit, one of its leases, sessions or artifacts.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TimelineEntry {
    pub event_id: u64,
    /// RFC 3339, as stored.
    pub occurred_at: String,
    pub event_type: String,
    pub lease_id: Option<String>,
    pub session_id: Option<String>,
    pub artifact_id: Option<String>,
    /// A few words from the event's data (action and status, decision, …).
    pub text: String,
}

/// What a sound bundle holds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct VerifiedBundle {
    pub audit_request_id: String,
    /// Events `first..=last` chained; `last` is the checkpoint's.
    pub first_event: u64,
    pub last_event: u64,
    pub checkpoint: BundleCheckpoint,
    /// Files whose SHA-256 and size matched the manifest.
    pub files: usize,
    /// Artifact files whose bytes match their `artifact_uploaded` event.
    pub artifacts: usize,
    /// Artifacts the bundle lists without bytes.
    pub artifacts_without_bytes: Vec<String>,
    /// Events of the segment about other work (carried for the chain).
    pub other_events: usize,
    /// What the chain covers only in part (records whose events predate
    /// `request_sha256` / `result_sha256`), one line each.
    pub notes: Vec<String>,
    pub timeline: Vec<TimelineEntry>,
}

/// Parse a public key: 64 hex digits (surrounding white space ignored).
///
/// Errors: not 32 hex-encoded bytes or not a curve point.
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, BundleError> {
    let bytes: [u8; 32] = match hex::decode(text.trim())
        .ok()
        .and_then(|b| b.try_into().ok())
    {
        Some(b) => b,
        None => return fail("public key", "not 32 hex-encoded bytes"),
    };
    VerifyingKey::from_bytes(&bytes).or_else(|e| fail("public key", format!("invalid: {e}")))
}

/// A file read from the archive: JSON and text files are kept, artifact
/// bytes only hashed.
struct Entry {
    sha256: String,
    size: u64,
    bytes: Option<Vec<u8>>,
}

fn read_archive(r: impl Read) -> Result<BTreeMap<String, Entry>, BundleError> {
    let bad = |e: std::io::Error| BundleError {
        file: "archive".into(),
        reason: format!("not a readable tar: {e}"),
    };
    let mut archive = tar::Archive::new(r);
    let mut out = BTreeMap::new();
    for entry in archive.entries().map_err(bad)? {
        let mut entry = entry.map_err(bad)?;
        if entry.header().entry_type() != tar::EntryType::Regular {
            let path = entry
                .path()
                .map(|p| p.display().to_string())
                .unwrap_or_default();
            return fail(path, "not a regular file (a bundle holds only files)");
        }
        let path = match entry.path() {
            Ok(p) => p.to_string_lossy().into_owned(),
            Err(e) => return Err(bad(e)),
        };
        let keep = !path.starts_with("artifacts/");
        let mut h = Sha256::new();
        let mut kept = Vec::new();
        let mut size = 0u64;
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = entry.read(&mut buf).map_err(bad)?;
            if n == 0 {
                break;
            }
            h.update(&buf[..n]);
            size += n as u64;
            if keep {
                kept.extend_from_slice(&buf[..n]);
            }
        }
        let e = Entry {
            sha256: hex::encode(h.finalize()),
            size,
            bytes: keep.then_some(kept),
        };
        if out.insert(path.clone(), e).is_some() {
            return fail(path, "appears twice in the archive");
        }
    }
    Ok(out)
}

fn json_of<T: serde::de::DeserializeOwned>(
    files: &BTreeMap<String, Entry>,
    path: &str,
) -> Result<T, BundleError> {
    let Some(bytes) = files.get(path).and_then(|e| e.bytes.as_ref()) else {
        return fail(path, "missing from the bundle");
    };
    serde_json::from_slice(bytes).or_else(|e| fail(path, format!("not the expected JSON: {e}")))
}

fn str_at<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

/// Check the bundle read from `r` against `public_key` (the registry's,
/// obtained apart from the bundle) and answer what it proves.
///
/// Checks, in order: the manifest lists every file with its SHA-256 and
/// size; `events.jsonl` chains (each `hash` recomputed, each `prev_hash`
/// the previous row's, ids without gaps); `checkpoint.json` is signed by
/// `public_key` and names the segment's last event and hash; every
/// `artifacts/<sha256>` file has those bytes and an `artifact_uploaded`
/// event with that checksum; every record (request, claims, results,
/// leases, sessions, artifacts) is named by the chained events and agrees
/// with what they carry.
///
/// Errors: the first failure ([`BundleError`]).
pub fn verify(r: impl Read, public_key: &str) -> Result<VerifiedBundle, BundleError> {
    let key = parse_public_key(public_key)?;
    let files = read_archive(r)?;

    // 1. The manifest.
    let manifest: BundleManifest = json_of(&files, "manifest.json")?;
    if manifest.format != BUNDLE_FORMAT {
        return fail(
            "manifest.json",
            format!("format `{}` is not {BUNDLE_FORMAT}", manifest.format),
        );
    }
    let mut listed = HashSet::new();
    for f in &manifest.files {
        let Some(e) = files.get(&f.path) else {
            return fail(
                &f.path,
                "listed in the manifest but missing from the archive",
            );
        };
        if e.sha256 != f.sha256 || e.size != f.size {
            return fail(
                &f.path,
                format!(
                    "its SHA-256 {} ({} bytes) is not the manifest's {} ({} bytes): the file was changed",
                    e.sha256, e.size, f.sha256, f.size
                ),
            );
        }
        listed.insert(f.path.as_str());
    }
    if let Some(extra) = files
        .keys()
        .find(|p| *p != "manifest.json" && !listed.contains(p.as_str()))
    {
        return fail(extra, "in the archive but not listed in the manifest");
    }

    // 2. The chain segment.
    let Some(text) = files.get("events.jsonl").and_then(|e| e.bytes.as_ref()) else {
        return fail("events.jsonl", "missing from the bundle");
    };
    let text = String::from_utf8_lossy(text);
    let mut rows: Vec<ChainedRow> = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let row: ChainedRow = serde_json::from_str(line).or_else(|e| {
            fail(
                "events.jsonl",
                format!("line {}: not an event row: {e}", n + 1),
            )
        })?;
        if let Some(prev) = rows.last() {
            if row.row.event_id != prev.row.event_id + 1 {
                return fail(
                    "events.jsonl",
                    format!(
                        "event {}: missing: the segment goes from event {} to event {}",
                        prev.row.event_id + 1,
                        prev.row.event_id,
                        row.row.event_id
                    ),
                );
            }
            if row.prev_hash != prev.hash {
                return fail(
                    "events.jsonl",
                    format!(
                        "event {}: prev_hash {} is not the previous event's hash {}",
                        row.row.event_id, row.prev_hash, prev.hash
                    ),
                );
            }
        }
        if row_hash(&row.prev_hash, &row.row) != row.hash {
            return fail(
                "events.jsonl",
                format!(
                    "event {}: its hash does not match its contents: the row was changed",
                    row.row.event_id
                ),
            );
        }
        rows.push(row);
    }
    let (Some(first), Some(last)) = (rows.first(), rows.last()) else {
        return fail("events.jsonl", "holds no events");
    };
    let (first_event, last_event) = (first.row.event_id, last.row.event_id);

    // 3. The checkpoint.
    let cp: BundleCheckpoint = json_of(&files, "checkpoint.json")?;
    let sig: Option<[u8; 64]> = hex::decode(&cp.signature)
        .ok()
        .and_then(|b| b.try_into().ok());
    let Some(sig) = sig else {
        return fail(
            "checkpoint.json",
            "the signature is not 64 hex-encoded bytes",
        );
    };
    if key
        .verify(
            checkpoint_message(cp.event_id, &cp.hash, &cp.signed_at).as_bytes(),
            &Signature::from_bytes(&sig),
        )
        .is_err()
    {
        return fail(
            "checkpoint.json",
            "the signature does not verify with the registry's public key",
        );
    }
    if cp.event_id != last_event || cp.hash != last.hash {
        return fail(
            "checkpoint.json",
            format!(
                "it signs event {} with hash {} but the segment ends at event {last_event} with hash {}",
                cp.event_id, cp.hash, last.hash
            ),
        );
    }

    // 4. Artifact bytes against their chained checksums.
    let mut uploaded: HashMap<String, Value> = HashMap::new();
    for r in rows
        .iter()
        .filter(|r| r.row.event_type == "artifact_uploaded")
    {
        let data: Value = serde_json::from_str(&r.row.data).unwrap_or(Value::Null);
        if let Some(id) = &r.row.artifact_id {
            uploaded.insert(id.clone(), data);
        }
    }
    let checksums: HashSet<&str> = uploaded
        .values()
        .filter_map(|d| str_at(d, "checksum"))
        .collect();
    let mut artifact_files = 0;
    for (path, e) in files.iter().filter(|(p, _)| p.starts_with("artifacts/")) {
        let name = &path["artifacts/".len()..];
        if e.sha256 != name {
            return fail(
                path,
                format!(
                    "its bytes have SHA-256 {}, not the one it is named by",
                    e.sha256
                ),
            );
        }
        if !checksums.contains(name) {
            return fail(
                path,
                "no artifact_uploaded event in the segment has this checksum",
            );
        }
        artifact_files += 1;
    }

    // 5. Records against the events.
    let ev_data =
        |r: &ChainedRow| serde_json::from_str::<Value>(&r.row.data).unwrap_or(Value::Null);
    let id = manifest.audit_request_id.clone();
    let mut uncovered: Vec<String> = Vec::new();
    let record: Value = json_of(&files, "request.json")?;
    let request = record.get("request").cloned().unwrap_or(Value::Null);
    if str_at(&request, "audit_request_id") != Some(id.as_str()) {
        return fail(
            "request.json",
            format!("is not the record of audit request {id}"),
        );
    }
    let of_request: Vec<&ChainedRow> = rows
        .iter()
        .filter(|r| r.row.audit_request_id.as_deref() == Some(id.as_str()))
        .collect();
    let Some(created) = of_request
        .iter()
        .find(|r| r.row.event_type == "audit_task_created")
    else {
        return fail(
            "request.json",
            format!("no audit_task_created event of {id} in the segment"),
        );
    };
    let carried = ev_data(created);
    for field in ["audit_type", "project_id", "task_id", "priority"] {
        if carried.get(field) != request.get(field) {
            return fail(
                "request.json",
                format!("`{field}` differs from event {}'s", created.row.event_id),
            );
        }
    }
    // Every other field (objective, acceptance criteria, …) through the
    // digest the event carries; events written before it existed have none.
    match carried.get("request_sha256").and_then(Value::as_str) {
        Some(digest) if digest != chain::record_digest(&request) => {
            return fail(
                "request.json",
                format!(
                    "the request differs from the one event {} recorded (request_sha256)",
                    created.row.event_id
                ),
            );
        }
        Some(_) => {}
        None => uncovered.push(format!(
            "request.json: event {} predates request_sha256; only audit_type, project_id, \
             task_id and priority are checked",
            created.row.event_id
        )),
    }
    for (path, _) in files.iter().filter(|(p, _)| p.starts_with("claims/")) {
        let claim: Value = json_of(&files, path)?;
        let claimed = of_request.iter().find(|r| {
            r.row.event_type == "audit_task_claimed"
                && ev_data(r).pointer("/claim/claim_id") == claim.get("claim_id")
        });
        let Some(ev) = claimed else {
            return fail(path, "no audit_task_claimed event carries this claim");
        };
        let carried = ev_data(ev);
        for field in [
            "principal",
            "agent_ref",
            "lease_ids",
            "lease_group_id",
            "attempt",
        ] {
            if carried.pointer(&format!("/claim/{field}")) != claim.get(field) {
                return fail(
                    path,
                    format!("`{field}` differs from event {}'s", ev.row.event_id),
                );
            }
        }
    }
    for (path, _) in files.iter().filter(|(p, _)| p.starts_with("results/")) {
        let record: Value = json_of(&files, path)?;
        let completed = of_request.iter().find(|r| {
            r.row.event_type == "audit_task_completed"
                && ev_data(r).get("claim_id") == record.get("claim_id")
        });
        let Some(ev) = completed else {
            return fail(path, "no audit_task_completed event carries this result");
        };
        let carried = ev_data(ev);
        let result = record.get("result").cloned().unwrap_or(Value::Null);
        let pairs = [
            ("decision", result.get("decision")),
            ("confidence", result.get("confidence")),
            ("result_status", result.get("status")),
            ("audit_type", result.get("audit_type")),
            ("artifact_refs", result.get("artifact_refs")),
        ];
        for (field, mine) in pairs {
            if carried.get(field) != mine {
                return fail(
                    path,
                    format!("`{field}` differs from event {}'s", ev.row.event_id),
                );
            }
        }
        match carried.get("result_sha256").and_then(Value::as_str) {
            Some(digest) if digest != chain::record_digest(&result) => {
                return fail(
                    path,
                    format!(
                        "the result differs from the one event {} recorded (result_sha256)",
                        ev.row.event_id
                    ),
                );
            }
            Some(_) => {}
            None => uncovered.push(format!(
                "{path}: event {} predates result_sha256; findings are counted, not compared",
                ev.row.event_id
            )),
        }
        let findings = result
            .get("findings")
            .and_then(Value::as_array)
            .map_or(0, Vec::len) as u64;
        if carried.get("findings").and_then(Value::as_u64) != Some(findings) {
            return fail(
                path,
                format!(
                    "holds {findings} finding(s), event {} says otherwise",
                    ev.row.event_id
                ),
            );
        }
    }
    let leases: Vec<Value> = json_of(&files, "leases.json")?;
    for l in &leases {
        let lease_id = str_at(l, "lease_id").unwrap_or_default();
        let of_lease = |r: &&ChainedRow| r.row.lease_id.as_deref() == Some(lease_id);
        if !rows.iter().any(|r| of_lease(&r)) {
            return fail(
                "leases.json",
                format!("lease {lease_id}: no event of it in the segment"),
            );
        }
        // What a lease was asked for never changes: every event of it
        // carries the same.
        let newest = rows
            .iter()
            .rev()
            .filter(of_lease)
            .find(|r| r.row.event_type.starts_with("lease_"));
        if let Some(ev) = newest {
            let carried = ev_data(ev);
            for field in [
                "principal",
                "holder_type",
                "holder_ref",
                "project_id",
                "purpose",
                "priority",
                "requested_duration_seconds",
                "evidence_required",
                "mode",
            ] {
                if carried.get(field) != l.get(field) {
                    return fail(
                        "leases.json",
                        format!(
                            "lease {lease_id}: `{field}` differs from event {}'s",
                            ev.row.event_id
                        ),
                    );
                }
            }
        }
        // The newest event naming a capability (a queued lease may have
        // none yet).
        let named = rows
            .iter()
            .rev()
            .filter(of_lease)
            .find(|r| r.row.capability_id.is_some());
        if let Some(ev) =
            named.filter(|ev| ev.row.capability_id.as_deref() != str_at(l, "capability_id"))
        {
            return fail(
                "leases.json",
                format!(
                    "lease {lease_id}: capability_id differs from event {}'s",
                    ev.row.event_id
                ),
            );
        }
    }
    let sessions: Vec<Value> = json_of(&files, "sessions.json")?;
    for s in &sessions {
        let sid = str_at(s, "session_id").unwrap_or_default();
        let last_ev = rows.iter().rev().find(|r| {
            r.row.session_id.as_deref() == Some(sid)
                && matches!(
                    r.row.event_type.as_str(),
                    "session_started" | "session_completed" | "session_failed"
                )
        });
        let Some(ev) = last_ev else {
            return fail(
                "sessions.json",
                format!("session {sid}: no session event of it in the segment"),
            );
        };
        let carried = ev_data(ev);
        for field in [
            "lease_id",
            "capability_id",
            "action",
            "status",
            "started_at",
            "ended_at",
            "input_summary",
            "result_summary",
            "error_message",
            "artifact_refs",
        ] {
            if carried.get(field) != s.get(field) {
                return fail(
                    "sessions.json",
                    format!(
                        "session {sid}: `{field}` differs from event {} ({})",
                        ev.row.event_id, ev.row.event_type
                    ),
                );
            }
        }
    }
    let artifacts: Vec<Value> = json_of(&files, "artifacts.json")?;
    for a in &artifacts {
        let aid = str_at(a, "artifact_id").unwrap_or_default();
        let uploaded_bytes = a.get("uploaded").and_then(Value::as_bool) == Some(true);
        if !uploaded_bytes {
            continue;
        }
        let Some(carried) = uploaded.get(aid) else {
            return fail(
                "artifacts.json",
                format!("artifact {aid}: no artifact_uploaded event of it in the segment"),
            );
        };
        // Every field the event carries whole: what derived evidence says
        // (`metadata_json`: colours, text) and when it was captured too.
        for field in [
            "checksum",
            "size_bytes",
            "session_id",
            "artifact_type",
            "content_type",
            "captured_at",
            "duration_ms",
            "metadata_json",
        ] {
            if carried.get(field) != a.get(field) {
                return fail(
                    "artifacts.json",
                    format!("artifact {aid}: `{field}` differs from its artifact_uploaded event"),
                );
            }
        }
        // Evidence the registry derived: it names its source's bytes, as
        // the chained event says, and the source in the bundle has them.
        let derived = |v: &Value, key: &str| {
            v.get("metadata_json")
                .and_then(|m| m.get(key))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        if let Some(source) = derived(a, "derived_from") {
            for key in ["derived_from", "source_sha256"] {
                if derived(carried, key) != derived(a, key) {
                    return fail(
                        "artifacts.json",
                        format!("artifact {aid}: `metadata_json.{key}` differs from its artifact_uploaded event"),
                    );
                }
            }
            let want = derived(a, "source_sha256").unwrap_or_default();
            let found = artifacts
                .iter()
                .find(|s| str_at(s, "artifact_id") == Some(source.as_str()));
            match found.and_then(|s| str_at(s, "checksum")) {
                None => {
                    return fail(
                        "artifacts.json",
                        format!("artifact {aid}: derived from {source}, which is not in the bundle"),
                    )
                }
                Some(have) if have != want => {
                    return fail(
                        "artifacts.json",
                        format!(
                            "artifact {aid}: derived from {source} with SHA-256 {want}, but that artifact's is {have}"
                        ),
                    )
                }
                Some(_) => {}
            }
        }
        let sha = str_at(a, "checksum").unwrap_or_default();
        if !files.contains_key(&format!("artifacts/{sha}"))
            && !manifest.artifacts_without_bytes.iter().any(|x| x == aid)
        {
            return fail(
                format!("artifacts/{sha}"),
                format!("artifact {aid}: its bytes are missing and the manifest does not say why"),
            );
        }
    }

    // The timeline: the events about this audit.
    let lease_ids: HashSet<&str> = leases
        .iter()
        .filter_map(|l| str_at(l, "lease_id"))
        .collect();
    let session_ids: HashSet<&str> = sessions
        .iter()
        .filter_map(|s| str_at(s, "session_id"))
        .collect();
    let artifact_ids: HashSet<&str> = artifacts
        .iter()
        .filter_map(|a| str_at(a, "artifact_id"))
        .collect();
    let mut timeline = Vec::new();
    for r in &rows {
        let c = &r.row;
        let hit =
            |v: &Option<String>, set: &HashSet<&str>| v.as_deref().is_some_and(|x| set.contains(x));
        if c.audit_request_id.as_deref() == Some(id.as_str())
            || hit(&c.lease_id, &lease_ids)
            || hit(&c.session_id, &session_ids)
            || hit(&c.artifact_id, &artifact_ids)
        {
            timeline.push(TimelineEntry {
                event_id: c.event_id,
                occurred_at: c.occurred_at.clone(),
                event_type: c.event_type.clone(),
                lease_id: c.lease_id.clone(),
                session_id: c.session_id.clone(),
                artifact_id: c.artifact_id.clone(),
                text: summary(&c.event_type, &ev_data(r)),
            });
        }
    }
    Ok(VerifiedBundle {
        audit_request_id: id,
        first_event,
        last_event,
        other_events: rows.len() - timeline.len(),
        checkpoint: cp,
        files: manifest.files.len(),
        artifacts: artifact_files,
        artifacts_without_bytes: manifest.artifacts_without_bytes,
        notes: uncovered,
        timeline,
    })
}

/// A few words about an event from its data.
fn summary(event_type: &str, d: &Value) -> String {
    let s = |k: &str| str_at(d, k).unwrap_or("").to_string();
    match event_type {
        t if t.starts_with("session_") => format!("{} {}", s("action"), s("status")),
        "artifact_uploaded" => format!(
            "{} {} bytes sha256 {}",
            s("artifact_type"),
            d.get("size_bytes").and_then(Value::as_u64).unwrap_or(0),
            s("checksum").get(..12).unwrap_or("")
        ),
        "audit_task_claimed" => format!(
            "claimed by {}",
            d.pointer("/claim/agent_ref")
                .and_then(Value::as_str)
                .unwrap_or("")
        ),
        "audit_task_completed" => format!("{} decision {}", s("result_status"), s("decision")),
        "audit_task_released" => format!("released: {}", s("reason")),
        t if t.starts_with("lease_") => s("status"),
        _ => String::new(),
    }
    .trim()
    .to_string()
}

impl VerifiedBundle {
    /// The human answer: a summary line, then one line per timeline entry
    /// (`time  event_type  lease=… session=… artifact=…  text`).
    pub fn render(&self) -> String {
        let mut out = format!(
            "ok: audit request {}: events {}..{} chained; checkpoint at event {} (signed {}) verified; {} file(s), {} artifact(s) checked; {} other event(s) of the log in the segment\n",
            self.audit_request_id,
            self.first_event,
            self.last_event,
            self.checkpoint.event_id,
            self.checkpoint.signed_at,
            self.files,
            self.artifacts,
            self.other_events
        );
        for a in &self.artifacts_without_bytes {
            out.push_str(&format!("note: artifact {a} has no bytes in the bundle\n"));
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        for t in &self.timeline {
            let mut ids = String::new();
            for (k, v) in [
                ("lease", &t.lease_id),
                ("session", &t.session_id),
                ("artifact", &t.artifact_id),
            ] {
                if let Some(v) = v {
                    ids.push_str(&format!(" {k}={v}"));
                }
            }
            out.push_str(&format!(
                "{}  {:<22}{}  {}\n",
                t.occurred_at, t.event_type, ids, t.text
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ed25519_dalek::{Signer, SigningKey};
    use serde_json::json;
    use shared_protocol::chain::{BundleFile, ChainRow};

    const SHA_OF_BYTES: &str = "evidence bytes";

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[7; 32])
    }

    fn public(k: &SigningKey) -> String {
        hex::encode(k.verifying_key().as_bytes())
    }

    fn sha(b: &[u8]) -> String {
        hex::encode(Sha256::digest(b))
    }

    /// The files of a small sound bundle: one audit, one lease, one
    /// session with one uploaded artifact, one unrelated event, in
    /// events 10..=14.
    fn files() -> Vec<(String, Vec<u8>)> {
        files_with_derived(None)
    }

    /// [`files`], and with `Some(source_sha256)` also a `detection_json`
    /// derived from `art_1` naming that checksum as its source's, uploaded
    /// in event 15 (the checkpoint then at 15).
    fn files_with_derived(source_sha256: Option<&str>) -> Vec<(String, Vec<u8>)> {
        let bytes = SHA_OF_BYTES.as_bytes().to_vec();
        let art_sha = sha(&bytes);
        let session = json!({"session_id": "sess_1", "lease_id": "lease_1",
            "capability_id": "cam-01", "action": "capture_image", "status": "completed",
            "started_at": "2026-12-02T10:00:01Z", "result_summary": {"voltage_v": 3.3}});
        let artifact = json!({"artifact_id": "art_1", "session_id": "sess_1",
            "artifact_type": "image", "checksum": art_sha, "size_bytes": bytes.len(),
            "uploaded": true});
        let ev = |id: u64,
                  t: &str,
                  lease: Option<&str>,
                  s: Option<&str>,
                  a: Option<&str>,
                  req: Option<&str>,
                  data: Value| ChainRow {
            event_id: id,
            event_type: t.into(),
            occurred_at: format!("2026-12-02T10:00:{id:02}Z"),
            actor: "x".into(),
            provider_id: None,
            capability_id: lease.map(|_| "cam-01".to_string()),
            lease_id: lease.map(str::to_string),
            session_id: s.map(str::to_string),
            artifact_id: a.map(str::to_string),
            audit_request_id: req.map(str::to_string),
            data: data.to_string(),
        };
        let derived_bytes = b"{\"regions\": []}".to_vec();
        let derived = source_sha256.map(|src| {
            json!({"artifact_id": "art_2", "session_id": "sess_1",
                "artifact_type": "detection_json", "checksum": sha(&derived_bytes),
                "size_bytes": derived_bytes.len(), "uploaded": true,
                "metadata_json": {"derived_from": "art_1", "source_sha256": src}})
        });
        let mut rows = vec![
            ev(
                10,
                "audit_task_created",
                None,
                None,
                None,
                Some("req_1"),
                json!({"priority": 50}),
            ),
            ev(
                11,
                "lease_granted",
                Some("lease_1"),
                None,
                None,
                None,
                json!({"status": "active"}),
            ),
            ev(
                12,
                "lease_granted",
                None,
                None,
                None,
                None,
                json!({"other": "work"}),
            ),
            ev(
                13,
                "session_completed",
                Some("lease_1"),
                Some("sess_1"),
                None,
                None,
                session.clone(),
            ),
            ev(
                14,
                "artifact_uploaded",
                Some("lease_1"),
                Some("sess_1"),
                Some("art_1"),
                None,
                artifact.clone(),
            ),
        ];
        if let Some(d) = &derived {
            rows.push(ev(
                15,
                "artifact_uploaded",
                Some("lease_1"),
                Some("sess_1"),
                Some("art_2"),
                None,
                d.clone(),
            ));
        }
        let head = rows.len() as u64 + 9;
        let mut prev = "ab".repeat(32);
        let mut events = String::new();
        for row in rows {
            let hash = row_hash(&prev, &row);
            let line = ChainedRow {
                row,
                prev_hash: prev.clone(),
                hash: hash.clone(),
            };
            events.push_str(&serde_json::to_string(&line).unwrap());
            events.push('\n');
            prev = hash;
        }
        let k = key();
        let signed_at = "2026-12-02T10:01:00Z";
        let sig = k.sign(checkpoint_message(head, &prev, signed_at).as_bytes());
        let cp = json!({"event_id": head, "hash": prev, "signed_at": signed_at,
            "public_key": public(&k), "signature": hex::encode(sig.to_bytes())});
        vec![
            (
                "request.json".into(),
                json!({"request": {"audit_request_id": "req_1", "priority": 50}})
                    .to_string()
                    .into_bytes(),
            ),
            (
                "leases.json".into(),
                json!([{"lease_id": "lease_1", "capability_id": "cam-01"}])
                    .to_string()
                    .into_bytes(),
            ),
            (
                "sessions.json".into(),
                json!([session]).to_string().into_bytes(),
            ),
            (
                "artifacts.json".into(),
                json!(std::iter::once(artifact)
                    .chain(derived.clone())
                    .collect::<Vec<_>>())
                .to_string()
                .into_bytes(),
            ),
            ("events.jsonl".into(), events.into_bytes()),
            ("checkpoint.json".into(), cp.to_string().into_bytes()),
            (format!("artifacts/{art_sha}"), bytes),
        ]
        .into_iter()
        .chain(derived.map(|d| {
            (
                format!("artifacts/{}", d["checksum"].as_str().unwrap()),
                derived_bytes.clone(),
            )
        }))
        .collect()
    }

    /// A tar of `files` with a manifest listing them (as they are, so a
    /// changed file passes the manifest check and meets the deeper one).
    fn tar_of(files: &[(String, Vec<u8>)]) -> Vec<u8> {
        let manifest = BundleManifest {
            format: BUNDLE_FORMAT.into(),
            audit_request_id: "req_1".into(),
            created_at: "2026-12-02T10:01:00Z".into(),
            files: files
                .iter()
                .map(|(p, b)| BundleFile {
                    path: p.clone(),
                    sha256: sha(b),
                    size: b.len() as u64,
                })
                .collect(),
            artifacts_without_bytes: vec![],
            public_key_hint: None,
        };
        let mut all = vec![(
            "manifest.json".to_string(),
            serde_json::to_vec(&manifest).unwrap(),
        )];
        all.extend(files.iter().cloned());
        let mut tar = tar::Builder::new(Vec::new());
        for (p, b) in &all {
            let mut h = tar::Header::new_ustar();
            h.set_size(b.len() as u64);
            h.set_mode(0o644);
            tar.append_data(&mut h, p, b.as_slice()).unwrap();
        }
        tar.into_inner().unwrap()
    }

    fn change(path_prefix: &str, f: impl Fn(&mut Vec<u8>)) -> Vec<(String, Vec<u8>)> {
        let mut fs = files();
        let (_, b) = fs
            .iter_mut()
            .find(|(p, _)| p.starts_with(path_prefix))
            .unwrap();
        f(b);
        fs
    }

    fn replace(b: &mut Vec<u8>, from: &str, to: &str) {
        let s = String::from_utf8(b.clone()).unwrap();
        assert!(s.contains(from), "{from} not in {s}");
        *b = s.replacen(from, to, 1).into_bytes();
    }

    #[test]
    fn a_sound_bundle_verifies_and_names_the_audits_events() {
        let v = verify(tar_of(&files()).as_slice(), &public(&key())).unwrap();
        assert_eq!((v.first_event, v.last_event), (10, 14));
        assert_eq!(v.artifacts, 1);
        assert_eq!(v.other_events, 1, "event 12 is about other work");
        let types: Vec<&str> = v.timeline.iter().map(|t| t.event_type.as_str()).collect();
        assert_eq!(
            types,
            [
                "audit_task_created",
                "lease_granted",
                "session_completed",
                "artifact_uploaded"
            ]
        );
        assert!(v.render().contains("session=sess_1"), "{}", v.render());
    }

    #[test]
    fn one_flipped_byte_in_an_artifact_fails_at_the_manifest() {
        let mut t = tar_of(&files());
        let at = t
            .windows(SHA_OF_BYTES.len())
            .position(|w| w == SHA_OF_BYTES.as_bytes())
            .unwrap();
        t[at] ^= 1;
        let e = verify(t.as_slice(), &public(&key())).unwrap_err();
        assert!(e.file.starts_with("artifacts/"), "{e}");
        assert!(e.reason.contains("the file was changed"), "{e}");
    }

    #[test]
    fn changed_artifact_bytes_with_a_matching_manifest_fail_against_their_name() {
        let fs = change("artifacts/", |b| b[0] ^= 1);
        let e = verify(tar_of(&fs).as_slice(), &public(&key())).unwrap_err();
        assert!(e.file.starts_with("artifacts/"), "{e}");
        assert!(e.reason.contains("not the one it is named by"), "{e}");
    }

    #[test]
    fn a_changed_event_breaks_the_chain() {
        let fs = change("events.jsonl", |b| {
            replace(b, "capture_image", "capture_imagf")
        });
        let e = verify(tar_of(&fs).as_slice(), &public(&key())).unwrap_err();
        assert_eq!(e.file, "events.jsonl");
        assert!(
            e.reason.contains("event 13: its hash does not match"),
            "{e}"
        );
    }

    #[test]
    fn a_removed_event_is_named() {
        let fs = change("events.jsonl", |b| {
            let s = String::from_utf8(b.clone()).unwrap();
            let kept: Vec<&str> = s
                .lines()
                .filter(|l| !l.contains("\"event_id\":12"))
                .collect();
            *b = (kept.join("\n") + "\n").into_bytes();
        });
        let e = verify(tar_of(&fs).as_slice(), &public(&key())).unwrap_err();
        assert!(e.reason.contains("event 12: missing"), "{e}");
    }

    #[test]
    fn a_session_record_that_differs_from_its_event_fails() {
        let fs = change("sessions.json", |b| replace(b, "completed", "failed"));
        let e = verify(tar_of(&fs).as_slice(), &public(&key())).unwrap_err();
        assert_eq!(e.file, "sessions.json");
        assert!(
            e.reason
                .contains("session sess_1: `status` differs from event 13"),
            "{e}"
        );
    }

    #[test]
    fn a_measured_value_or_a_lease_field_changed_in_its_record_fails() {
        let fs = change("sessions.json", |b| replace(b, "3.3", "5.0"));
        let e = verify(tar_of(&fs).as_slice(), &public(&key())).unwrap_err();
        assert_eq!(e.file, "sessions.json");
        assert!(e.reason.contains("`result_summary` differs"), "{e}");
        let fs = change("leases.json", |b| {
            replace(b, "\"lease_id\"", "\"priority\":99,\"lease_id\"")
        });
        let e = verify(tar_of(&fs).as_slice(), &public(&key())).unwrap_err();
        assert_eq!(e.file, "leases.json");
        assert!(e.reason.contains("`priority` differs from event 11"), "{e}");
    }

    #[test]
    fn a_derived_artifact_must_name_its_sources_checksum() {
        let source = sha(SHA_OF_BYTES.as_bytes());
        verify(
            tar_of(&files_with_derived(Some(&source))).as_slice(),
            &public(&key()),
        )
        .expect("a derived artifact naming its source's bytes verifies");
        let e = verify(
            tar_of(&files_with_derived(Some(&"0".repeat(64)))).as_slice(),
            &public(&key()),
        )
        .unwrap_err();
        assert_eq!(e.file, "artifacts.json");
        assert!(
            e.reason.contains("derived from art_1 with SHA-256 000"),
            "{e}"
        );
    }

    #[test]
    fn an_artifact_record_that_differs_from_its_event_fails() {
        let fs = change("artifacts.json", |b| replace(b, "\"image\"", "\"audio\""));
        let e = verify(tar_of(&fs).as_slice(), &public(&key())).unwrap_err();
        assert_eq!(e.file, "artifacts.json");
        assert!(e.reason.contains("artifact_type"), "{e}");
    }

    #[test]
    fn another_key_or_a_moved_checkpoint_fails_at_the_checkpoint() {
        let other = public(&SigningKey::from_bytes(&[8; 32]));
        let e = verify(tar_of(&files()).as_slice(), &other).unwrap_err();
        assert_eq!(e.file, "checkpoint.json");
        assert!(e.reason.contains("does not verify"), "{e}");
        let fs = change("checkpoint.json", |b| {
            replace(b, "\"event_id\":14", "\"event_id\":13")
        });
        let e = verify(tar_of(&fs).as_slice(), &public(&key())).unwrap_err();
        assert!(e.reason.contains("does not verify"), "{e}");
        let e = verify(tar_of(&files()).as_slice(), "zz").unwrap_err();
        assert_eq!(e.file, "public key");
    }

    #[test]
    fn a_file_the_manifest_does_not_list_fails() {
        // The artifact file is left out of the manifest.
        let mut fs = files();
        let manifest_files: Vec<(String, Vec<u8>)> = fs.drain(..fs.len() - 1).collect();
        let hidden = fs.pop().unwrap();
        let mut t = tar_of(&manifest_files);
        // Strip the two zero end blocks, append the unlisted file.
        t.truncate(t.len() - 1024);
        let mut b = tar::Builder::new(t);
        let mut h = tar::Header::new_ustar();
        h.set_size(hidden.1.len() as u64);
        b.append_data(&mut h, &hidden.0, hidden.1.as_slice())
            .unwrap();
        let t = b.into_inner().unwrap();
        let e = verify(t.as_slice(), &public(&key())).unwrap_err();
        assert_eq!(e.file, hidden.0);
        assert!(e.reason.contains("not listed in the manifest"), "{e}");
    }

    #[test]
    fn what_is_not_a_tar_is_named() {
        let e = verify(&b"not a tar at all"[..], &public(&key())).unwrap_err();
        assert!(e.file == "archive" || e.file == "manifest.json", "{e}");
    }
}
