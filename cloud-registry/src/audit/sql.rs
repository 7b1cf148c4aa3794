//! The audit tables (seed 001 §14: `audit_requests`, `audit_results`,
//! `audit_findings`, `thread_registry`, `inter_thread_messages`, plus
//! `audit_claims`, `audit_dependencies` and the result's used capabilities
//! and artifacts) and the row-level reads and writes on them. Everything
//! here is synchronous and runs on a database thread, inside the caller's
//! transaction.

use crate::sql::types::Value as SqlValue;
use crate::sql::{params, params_from_iter, Connection, OptionalExtension, Row};
use chrono::{DateTime, SecondsFormat, Utc};
use shared_protocol::audit::{
    AuditDecision, AuditRequestStatus, AuditResultStatus, AuditTaskRequest, AuditTaskResult,
    AuditType,
};
use shared_protocol::Timestamp;

use super::model::{AuditRequestFilter, AuditRequestRecord, ClaimEndReason, ClaimInfo, ListOrder};

/// Create the audit tables and indexes (idempotent). `audit_results` and
/// `audit_findings` refuse UPDATE and DELETE: an accepted result is
/// evidence and is never rewritten.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS audit_requests (
            audit_request_id  TEXT PRIMARY KEY,
            queue_seq         INTEGER NOT NULL UNIQUE,
            audit_type        TEXT NOT NULL,
            project_id        TEXT NOT NULL,
            task_id           TEXT NOT NULL,
            priority          INTEGER NOT NULL,
            status            TEXT NOT NULL,
            requirements_sig  TEXT,
            request_json      TEXT NOT NULL,
            created_by        TEXT NOT NULL,
            created_at        TEXT NOT NULL,
            updated_at        TEXT NOT NULL,
            attempts          INTEGER NOT NULL DEFAULT 0,
            claim_id          TEXT,
            claim_expires_ms  INTEGER,
            reserved_token    TEXT,
            reserved_until_ms INTEGER,
            failure_reason    TEXT
        );
        CREATE INDEX IF NOT EXISTS audit_requests_queue
            ON audit_requests(status, priority DESC, queue_seq);
        CREATE INDEX IF NOT EXISTS audit_requests_claim_expiry
            ON audit_requests(status, claim_expires_ms);
        CREATE INDEX IF NOT EXISTS audit_requests_project ON audit_requests(project_id);

        CREATE TABLE IF NOT EXISTS audit_dependencies (
            audit_request_id TEXT NOT NULL REFERENCES audit_requests(audit_request_id),
            position         INTEGER NOT NULL,
            depends_on       TEXT NOT NULL REFERENCES audit_requests(audit_request_id),
            PRIMARY KEY (audit_request_id, depends_on)
        );
        CREATE INDEX IF NOT EXISTS audit_dependencies_target ON audit_dependencies(depends_on);

        CREATE TABLE IF NOT EXISTS audit_claims (
            claim_id          TEXT PRIMARY KEY,
            audit_request_id  TEXT NOT NULL REFERENCES audit_requests(audit_request_id),
            attempt           INTEGER NOT NULL,
            principal         TEXT NOT NULL,
            agent_ref         TEXT NOT NULL,
            claimed_at        TEXT NOT NULL,
            expires_ms        INTEGER NOT NULL,
            visibility_timeout_seconds INTEGER NOT NULL,
            lease_group_id    TEXT,
            lease_ids         TEXT NOT NULL,
            ended_at          TEXT,
            end_reason        TEXT
        );
        CREATE INDEX IF NOT EXISTS audit_claims_request
            ON audit_claims(audit_request_id, principal);

        CREATE TABLE IF NOT EXISTS audit_results (
            result_id         INTEGER PRIMARY KEY AUTOINCREMENT,
            audit_request_id  TEXT NOT NULL REFERENCES audit_requests(audit_request_id),
            claim_id          TEXT NOT NULL UNIQUE REFERENCES audit_claims(claim_id),
            audit_type        TEXT NOT NULL,
            status            TEXT NOT NULL,
            decision          TEXT NOT NULL,
            confidence        REAL NOT NULL,
            summary           TEXT NOT NULL,
            duration_ms       INTEGER NOT NULL,
            completed_at      TEXT NOT NULL,
            submitted_by      TEXT NOT NULL,
            received_at       TEXT NOT NULL,
            result_json       TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS audit_results_request ON audit_results(audit_request_id);

        CREATE TABLE IF NOT EXISTS audit_findings (
            result_id         INTEGER NOT NULL REFERENCES audit_results(result_id),
            finding_id        TEXT NOT NULL,
            audit_request_id  TEXT NOT NULL,
            severity          TEXT NOT NULL,
            title             TEXT NOT NULL,
            description       TEXT NOT NULL,
            evidence_ref_ids  TEXT NOT NULL,
            suggested_fix     TEXT,
            PRIMARY KEY (result_id, finding_id)
        );
        CREATE INDEX IF NOT EXISTS audit_findings_request
            ON audit_findings(audit_request_id, severity);

        CREATE TABLE IF NOT EXISTS audit_result_capabilities (
            result_id     INTEGER NOT NULL REFERENCES audit_results(result_id),
            capability_id TEXT NOT NULL,
            PRIMARY KEY (result_id, capability_id)
        );
        CREATE INDEX IF NOT EXISTS audit_result_capabilities_cap
            ON audit_result_capabilities(capability_id);

        CREATE TABLE IF NOT EXISTS audit_result_artifacts (
            result_id   INTEGER NOT NULL REFERENCES audit_results(result_id),
            artifact_id TEXT NOT NULL,
            PRIMARY KEY (result_id, artifact_id)
        );
        CREATE INDEX IF NOT EXISTS audit_result_artifacts_artifact
            ON audit_result_artifacts(artifact_id);


        CREATE TABLE IF NOT EXISTS thread_registry (
            thread_ref    TEXT PRIMARY KEY,
            node_id       TEXT NOT NULL,
            role          TEXT NOT NULL,
            labels        TEXT NOT NULL,
            display_name  TEXT,
            project_id    TEXT,
            registered_by TEXT NOT NULL,
            created_at    TEXT NOT NULL,
            updated_at    TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS thread_registry_node ON thread_registry(node_id);

        CREATE TABLE IF NOT EXISTS inter_thread_messages (
            message_id       INTEGER PRIMARY KEY AUTOINCREMENT,
            to_thread_ref    TEXT NOT NULL REFERENCES thread_registry(thread_ref),
            from_thread_ref  TEXT REFERENCES thread_registry(thread_ref),
            sender           TEXT NOT NULL,
            kind             TEXT NOT NULL,
            audit_request_id TEXT,
            body             TEXT NOT NULL,
            created_at       TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS inter_thread_messages_inbox
            ON inter_thread_messages(to_thread_ref, message_id);",
    )?;
    conn.append_only("audit_results", "audit_results are never rewritten")?;
    conn.append_only("audit_findings", "audit_findings are never rewritten")
}

// ---------------------------------------------------------------------------
// Time and conversions

/// The registry's steady time, milliseconds since the Unix epoch: the
/// wall clock as read at the first call, plus the monotonic time since.
/// Claim visibility deadlines and reservations are set and compared on
/// it, so a step of the system clock while the registry runs (NTP, an
/// operator setting the date) neither expires a claim early nor keeps
/// one alive for the size of the step. A new run starts again from the
/// wall clock, so the stored deadlines count the time the registry was
/// down, as lease deadlines do.
pub(crate) fn now_ms() -> i64 {
    static ORIGIN: std::sync::OnceLock<(std::time::Instant, i64)> = std::sync::OnceLock::new();
    let (t0, wall0) =
        *ORIGIN.get_or_init(|| (std::time::Instant::now(), Utc::now().timestamp_millis()));
    wall0.saturating_add(i64::try_from(t0.elapsed().as_millis()).unwrap_or(i64::MAX))
}

/// [`now_ms`] as a [`Timestamp`]: the time visibility deadlines count
/// from.
pub(crate) fn steady_now() -> Timestamp {
    ts(now_ms())
}

/// A millisecond timestamp as a [`Timestamp`].
pub(crate) fn ts(ms: i64) -> Timestamp {
    DateTime::from_timestamp_millis(ms).unwrap_or_default()
}

/// RFC 3339 with milliseconds, UTC (`2026-11-30T03:29:22.123Z`).
pub(crate) fn ts_text(t: Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

fn conversion<E: std::error::Error + Send + Sync + 'static>(col: usize, e: E) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, rusqlite::types::Type::Text, Box::new(e))
}

/// Read column `col` as an RFC 3339 timestamp.
pub(crate) fn get_ts(r: &Row<'_>, col: usize) -> rusqlite::Result<Timestamp> {
    let s: String = r.get(col)?;
    DateTime::parse_from_rfc3339(&s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| conversion(col, e))
}

fn get_opt_ts(r: &Row<'_>, col: usize) -> rusqlite::Result<Option<Timestamp>> {
    let s: Option<String> = r.get(col)?;
    s.map(|s| {
        DateTime::parse_from_rfc3339(&s)
            .map(|t| t.with_timezone(&Utc))
            .map_err(|e| conversion(col, e))
    })
    .transpose()
}

/// Read column `col` as a wire enum.
pub(crate) fn get_enum<T>(r: &Row<'_>, col: usize) -> rusqlite::Result<T>
where
    T: std::str::FromStr,
    T::Err: std::error::Error + Send + Sync + 'static,
{
    let s: String = r.get(col)?;
    s.parse().map_err(|e| conversion(col, e))
}

/// Read column `col` as JSON of type `T`.
pub(crate) fn get_json<T: serde::de::DeserializeOwned>(
    r: &Row<'_>,
    col: usize,
) -> rusqlite::Result<T> {
    let s: String = r.get(col)?;
    serde_json::from_str(&s).map_err(|e| conversion(col, e))
}

/// `T` as JSON text for a column.
pub(crate) fn to_json<T: serde::Serialize>(v: &T) -> rusqlite::Result<String> {
    serde_json::to_string(v).map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))
}

// ---------------------------------------------------------------------------
// Requests

/// One `audit_requests` row.
#[derive(Debug, Clone)]
pub(crate) struct RequestRow {
    pub audit_request_id: String,
    pub audit_type: AuditType,
    pub priority: u8,
    pub status: AuditRequestStatus,
    pub requirements_sig: Option<String>,
    pub request: AuditTaskRequest,
    pub created_by: String,
    pub created_at: Timestamp,
    pub updated_at: Timestamp,
    pub attempts: u32,
    pub claim_id: Option<String>,
    pub reserved_token: Option<String>,
    pub failure_reason: Option<String>,
}

pub(crate) const REQUEST_COLUMNS: &str = "audit_request_id, audit_type, priority, status, \
     requirements_sig, request_json, created_by, created_at, updated_at, attempts, claim_id, \
     reserved_token, failure_reason";

pub(crate) fn request_row(r: &Row<'_>) -> rusqlite::Result<RequestRow> {
    Ok(RequestRow {
        audit_request_id: r.get(0)?,
        audit_type: get_enum(r, 1)?,
        priority: r.get(2)?,
        status: get_enum(r, 3)?,
        requirements_sig: r.get(4)?,
        request: get_json(r, 5)?,
        created_by: r.get(6)?,
        created_at: get_ts(r, 7)?,
        updated_at: get_ts(r, 8)?,
        attempts: r.get(9)?,
        claim_id: r.get(10)?,
        reserved_token: r.get(11)?,
        failure_reason: r.get(12)?,
    })
}

/// The row of `audit_request_id`, if it exists.
pub(crate) fn load_request(conn: &Connection, id: &str) -> rusqlite::Result<Option<RequestRow>> {
    conn.query_row(
        &format!("SELECT {REQUEST_COLUMNS} FROM audit_requests WHERE audit_request_id = ?1"),
        params![id],
        request_row,
    )
    .optional()
}

/// Insert a new `queued` request and its dependencies. The caller has
/// checked that the id is new.
pub(crate) fn insert_request(
    conn: &Connection,
    req: &AuditTaskRequest,
    requirements_sig: Option<&str>,
    created_by: &str,
    now: Timestamp,
) -> rusqlite::Result<()> {
    let seq: i64 = conn.query_row(
        "SELECT COALESCE(MAX(queue_seq), 0) + 1 FROM audit_requests",
        [],
        |r| r.get(0),
    )?;
    conn.execute(
        "INSERT INTO audit_requests (audit_request_id, queue_seq, audit_type, project_id,
             task_id, priority, status, requirements_sig, request_json, created_by,
             created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?11)",
        params![
            req.audit_request_id,
            seq,
            req.audit_type.as_str(),
            req.project_id,
            req.task_id,
            req.priority,
            AuditRequestStatus::Queued.as_str(),
            requirements_sig,
            to_json(req)?,
            created_by,
            ts_text(now),
        ],
    )?;
    for (i, dep) in req.chief.depends_on.iter().enumerate() {
        conn.execute(
            "INSERT INTO audit_dependencies (audit_request_id, position, depends_on)
             VALUES (?1, ?2, ?3)",
            params![req.audit_request_id, i as i64, dep],
        )?;
    }
    Ok(())
}

/// Dependencies of `id` that are not final (`queued` or `claimed`), in
/// `depends_on` order.
pub(crate) fn waiting_on(conn: &Connection, id: &str) -> rusqlite::Result<Vec<String>> {
    let mut stmt = conn.prepare_cached(
        "SELECT d.depends_on FROM audit_dependencies d
             JOIN audit_requests s ON s.audit_request_id = d.depends_on
         WHERE d.audit_request_id = ?1 AND s.status IN ('queued', 'claimed')
         ORDER BY d.position",
    )?;
    let rows = stmt.query_map(params![id], |r| r.get(0))?;
    rows.collect()
}

/// The full record of a row (its live claim, what it waits on, its latest
/// result's status).
pub(crate) fn record_of(
    conn: &Connection,
    row: RequestRow,
    max_attempts: u32,
) -> rusqlite::Result<AuditRequestRecord> {
    let claim = match (&row.claim_id, row.status) {
        (Some(c), AuditRequestStatus::Claimed) => load_claim(conn, c)?,
        _ => None,
    };
    let waiting_on = if row.audit_type == AuditType::Chief {
        waiting_on(conn, &row.audit_request_id)?
    } else {
        Vec::new()
    };
    let latest: Option<(AuditResultStatus, AuditDecision)> = conn
        .query_row(
            "SELECT status, decision FROM audit_results WHERE audit_request_id = ?1
             ORDER BY result_id DESC LIMIT 1",
            params![row.audit_request_id],
            |r| Ok((get_enum(r, 0)?, get_enum(r, 1)?)),
        )
        .optional()?;
    Ok(AuditRequestRecord {
        status: row.status,
        attempts: row.attempts,
        max_attempts: max_attempts.max(row.attempts),
        created_by: row.created_by,
        created_at: row.created_at,
        updated_at: row.updated_at,
        claim,
        waiting_on,
        result_status: latest.map(|l| l.0),
        decision: latest.map(|l| l.1),
        failure_reason: row.failure_reason,
        request: row.request,
    })
}

/// The record of `id`, if it exists.
pub(crate) fn load_record(
    conn: &Connection,
    id: &str,
    max_attempts: u32,
) -> rusqlite::Result<Option<AuditRequestRecord>> {
    match load_request(conn, id)? {
        Some(row) => record_of(conn, row, max_attempts).map(Some),
        None => Ok(None),
    }
}

/// One page of records matching `filter`, and the number matching in all.
pub(crate) fn list_records(
    conn: &Connection,
    filter: &AuditRequestFilter,
    max_attempts: u32,
) -> rusqlite::Result<(Vec<AuditRequestRecord>, u64)> {
    let mut clauses: Vec<&str> = Vec::new();
    let mut args: Vec<SqlValue> = Vec::new();
    if let Some(s) = filter.status {
        clauses.push("status = ?");
        args.push(SqlValue::Text(s.as_str().to_string()));
    }
    if let Some(t) = filter.audit_type {
        clauses.push("audit_type = ?");
        args.push(SqlValue::Text(t.as_str().to_string()));
    }
    if let Some(p) = &filter.project_id {
        clauses.push("project_id = ?");
        args.push(SqlValue::Text(p.clone()));
    }
    if let Some(p) = filter.priority_min {
        clauses.push("priority >= ?");
        args.push(SqlValue::Integer(i64::from(p)));
    }
    if let Some(p) = filter.priority_max {
        clauses.push("priority <= ?");
        args.push(SqlValue::Integer(i64::from(p)));
    }
    let where_sql = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let total: i64 = conn.query_row(
        &format!("SELECT COUNT(*) FROM audit_requests {where_sql}"),
        params_from_iter(args.iter()),
        |r| r.get(0),
    )?;
    let order = match filter.order {
        ListOrder::Queue => "priority DESC, queue_seq ASC",
        ListOrder::Newest => "queue_seq DESC",
    };
    let mut page_args = args;
    page_args.push(SqlValue::Integer(i64::from(filter.limit)));
    page_args.push(SqlValue::Integer(i64::from(filter.offset)));
    let mut stmt = conn.prepare(&format!(
        "SELECT {REQUEST_COLUMNS} FROM audit_requests {where_sql} ORDER BY {order} LIMIT ? OFFSET ?"
    ))?;
    let rows: Vec<RequestRow> = stmt
        .query_map(params_from_iter(page_args.iter()), request_row)?
        .collect::<rusqlite::Result<_>>()?;
    let mut records = Vec::with_capacity(rows.len());
    for row in rows {
        records.push(record_of(conn, row, max_attempts)?);
    }
    Ok((records, total.max(0) as u64))
}

// ---------------------------------------------------------------------------
// Claims

const CLAIM_COLUMNS: &str = "claim_id, audit_request_id, attempt, principal, agent_ref, \
     claimed_at, expires_ms, visibility_timeout_seconds, lease_group_id, lease_ids, ended_at, \
     end_reason";

fn claim_row(r: &Row<'_>) -> rusqlite::Result<ClaimInfo> {
    let end_reason: Option<String> = r.get(11)?;
    Ok(ClaimInfo {
        claim_id: r.get(0)?,
        audit_request_id: r.get(1)?,
        attempt: r.get(2)?,
        principal: r.get(3)?,
        agent_ref: r.get(4)?,
        claimed_at: get_ts(r, 5)?,
        expires_at: ts(r.get(6)?),
        visibility_timeout_seconds: r.get(7)?,
        lease_group_id: r.get(8)?,
        lease_ids: get_json(r, 9)?,
        ended_at: get_opt_ts(r, 10)?,
        end_reason: end_reason
            .map(|s| s.parse::<ClaimEndReason>().map_err(|e| conversion(11, e)))
            .transpose()?,
    })
}

/// The claim `claim_id`.
pub(crate) fn load_claim(conn: &Connection, claim_id: &str) -> rusqlite::Result<Option<ClaimInfo>> {
    conn.query_row(
        &format!("SELECT {CLAIM_COLUMNS} FROM audit_claims WHERE claim_id = ?1"),
        params![claim_id],
        claim_row,
    )
    .optional()
}

/// The newest claim `principal` made on request `id`.
pub(crate) fn latest_claim_of(
    conn: &Connection,
    id: &str,
    principal: &str,
) -> rusqlite::Result<Option<ClaimInfo>> {
    conn.query_row(
        &format!(
            "SELECT {CLAIM_COLUMNS} FROM audit_claims
             WHERE audit_request_id = ?1 AND principal = ?2
             ORDER BY attempt DESC LIMIT 1"
        ),
        params![id, principal],
        claim_row,
    )
    .optional()
}

/// Store a new claim and move its request to `claimed` (the caller has
/// checked the request is `queued` and may be claimed by this claim).
pub(crate) fn start_claim(conn: &Connection, claim: &ClaimInfo) -> rusqlite::Result<()> {
    conn.execute(
        &format!(
            "INSERT INTO audit_claims ({CLAIM_COLUMNS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, NULL, NULL)"
        ),
        params![
            claim.claim_id,
            claim.audit_request_id,
            claim.attempt,
            claim.principal,
            claim.agent_ref,
            ts_text(claim.claimed_at),
            claim.expires_at.timestamp_millis(),
            claim.visibility_timeout_seconds,
            claim.lease_group_id,
            to_json(&claim.lease_ids)?,
        ],
    )?;
    conn.execute(
        "UPDATE audit_requests SET status = 'claimed', attempts = ?2, claim_id = ?3,
             claim_expires_ms = ?4, reserved_token = NULL, reserved_until_ms = NULL,
             updated_at = ?5
         WHERE audit_request_id = ?1",
        params![
            claim.audit_request_id,
            claim.attempt,
            claim.claim_id,
            claim.expires_at.timestamp_millis(),
            ts_text(claim.claimed_at),
        ],
    )?;
    Ok(())
}

/// Set a live claim's deadline (and its request's copy).
pub(crate) fn set_claim_deadline(
    conn: &Connection,
    claim: &ClaimInfo,
    expires_ms: i64,
    now: Timestamp,
) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE audit_claims SET expires_ms = ?2 WHERE claim_id = ?1",
        params![claim.claim_id, expires_ms],
    )?;
    conn.execute(
        "UPDATE audit_requests SET claim_expires_ms = ?2, updated_at = ?3
         WHERE audit_request_id = ?1",
        params![claim.audit_request_id, expires_ms, ts_text(now)],
    )?;
    Ok(())
}

/// Mark claim `claim_id` ended.
pub(crate) fn end_claim(
    conn: &Connection,
    claim_id: &str,
    reason: ClaimEndReason,
    now: Timestamp,
) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE audit_claims SET ended_at = ?2, end_reason = ?3
         WHERE claim_id = ?1 AND ended_at IS NULL",
        params![claim_id, ts_text(now), reason.as_str()],
    )?;
    Ok(())
}

/// Move request `id` out of `claimed` to `status` (`queued`, `completed`
/// or `failed`), clearing its claim.
pub(crate) fn set_request_status(
    conn: &Connection,
    id: &str,
    status: AuditRequestStatus,
    failure_reason: Option<&str>,
    now: Timestamp,
) -> rusqlite::Result<()> {
    conn.execute(
        "UPDATE audit_requests SET status = ?2, claim_id = NULL, claim_expires_ms = NULL,
             reserved_token = NULL, reserved_until_ms = NULL, failure_reason = ?3,
             updated_at = ?4
         WHERE audit_request_id = ?1",
        params![id, status.as_str(), failure_reason, ts_text(now)],
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------
// Results

/// Store an accepted result with its findings, used capabilities and
/// artifact refs; returns its `result_id`.
pub(crate) fn insert_result(
    conn: &Connection,
    result: &AuditTaskResult,
    claim_id: &str,
    submitted_by: &str,
    now: Timestamp,
) -> rusqlite::Result<i64> {
    conn.execute(
        "INSERT INTO audit_results (audit_request_id, claim_id, audit_type, status, decision,
             confidence, summary, duration_ms, completed_at, submitted_by, received_at,
             result_json)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
        params![
            result.audit_request_id,
            claim_id,
            result.audit_type.as_str(),
            result.status.as_str(),
            result.decision.as_str(),
            result.confidence,
            result.summary,
            i64::try_from(result.duration_ms).unwrap_or(i64::MAX),
            ts_text(result.completed_at),
            submitted_by,
            ts_text(now),
            to_json(result)?,
        ],
    )?;
    let result_id = conn.last_insert_rowid();
    for f in &result.findings {
        conn.execute(
            "INSERT INTO audit_findings (result_id, finding_id, audit_request_id, severity,
                 title, description, evidence_ref_ids, suggested_fix)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
            params![
                result_id,
                f.finding_id,
                result.audit_request_id,
                f.severity.as_str(),
                f.title,
                f.description,
                to_json(&f.evidence_ref_ids)?,
                f.suggested_fix,
            ],
        )?;
    }
    for c in &result.used_capabilities {
        conn.execute(
            "INSERT INTO audit_result_capabilities (result_id, capability_id)
             VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![result_id, c],
        )?;
    }
    for a in &result.artifact_refs {
        conn.execute(
            "INSERT INTO audit_result_artifacts (result_id, artifact_id)
             VALUES (?1, ?2) ON CONFLICT DO NOTHING",
            params![result_id, a],
        )?;
    }
    Ok(result_id)
}

/// The newest stored result of request `id`.
pub(crate) fn latest_result(
    conn: &Connection,
    id: &str,
) -> rusqlite::Result<Option<AuditTaskResult>> {
    conn.query_row(
        "SELECT result_json FROM audit_results WHERE audit_request_id = ?1
         ORDER BY result_id DESC LIMIT 1",
        params![id],
        |r| get_json(r, 0),
    )
    .optional()
}
