//! The durable side of sessions and artifacts: tables
//! `capability_sessions` (seed 001 §2.2.4), `capability_artifacts`
//! (§2.2.5, plus size and upload state) and `artifact_pending_uploads`
//! (bytes that arrived before their metadata). Every function runs on a
//! database thread with a connection; every state change appends its event
//! in the same transaction and returns it for publishing after commit.

use crate::sql::types::Type;
use crate::sql::{params, Connection, OptionalExtension, Row as SqlRow};
use chrono::{SecondsFormat, Utc};
use serde_json::{json, Map, Value};
use shared_protocol::artifact::CapabilityArtifact;
use shared_protocol::event::{CapabilityEvent, EventType};
use shared_protocol::mqtt::{OpenSession, SessionUpdate};
use shared_protocol::session::{CapabilitySession, SessionStatus};
use shared_protocol::Timestamp;

use crate::events::{append, NewEvent};

/// Create the three tables and their indexes (idempotent).
///
/// Indexes are chosen so that ending a session touches as few pages as
/// possible: `provider_id` alone (it never changes), and the deadline of
/// open sessions only (a partial index that a session leaves when it
/// ends), instead of two indexes keyed by the status, whose entries moved
/// on every status change.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS capability_sessions (
            session_id      TEXT PRIMARY KEY,
            lease_id        TEXT NOT NULL,
            capability_id   TEXT NOT NULL,
            provider_id     TEXT NOT NULL,
            principal       TEXT NOT NULL,
            action          TEXT NOT NULL,
            started_at      TEXT NOT NULL,
            ended_at        TEXT,
            status          TEXT NOT NULL,
            input_summary   TEXT NOT NULL,
            result_summary  TEXT,
            artifact_refs   TEXT NOT NULL,
            error_message   TEXT,
            timeout_ms      INTEGER NOT NULL,
            deadline_at     TEXT NOT NULL,
            ended_by        TEXT,
            provider_status TEXT,
            revoke_reason   TEXT
        );
        CREATE INDEX IF NOT EXISTS capability_sessions_lease ON capability_sessions(lease_id);
        DROP INDEX IF EXISTS capability_sessions_provider_status;
        DROP INDEX IF EXISTS capability_sessions_status_deadline;
        CREATE INDEX IF NOT EXISTS capability_sessions_provider
            ON capability_sessions(provider_id);
        CREATE INDEX IF NOT EXISTS capability_sessions_open_deadline
            ON capability_sessions(deadline_at) WHERE status IN ('pending', 'running');
        CREATE INDEX IF NOT EXISTS capability_sessions_presumed
            ON capability_sessions(provider_id, ended_at) WHERE ended_by = 'registry';
        CREATE TABLE IF NOT EXISTS capability_artifacts (
            artifact_id   TEXT PRIMARY KEY,
            session_id    TEXT NOT NULL,
            provider_id   TEXT NOT NULL,
            artifact_type TEXT NOT NULL,
            storage_uri   TEXT NOT NULL,
            content_type  TEXT NOT NULL,
            captured_at   TEXT NOT NULL,
            duration_ms   INTEGER,
            checksum      TEXT NOT NULL,
            size_bytes    INTEGER NOT NULL,
            metadata_json TEXT NOT NULL,
            uploaded      INTEGER NOT NULL DEFAULT 0,
            uploaded_at   TEXT,
            received_at   TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS capability_artifacts_session ON capability_artifacts(session_id);
        CREATE TABLE IF NOT EXISTS artifact_pending_uploads (
            artifact_id TEXT NOT NULL,
            provider_id TEXT NOT NULL,
            sha256      TEXT NOT NULL,
            size_bytes  INTEGER NOT NULL,
            received_at TEXT NOT NULL,
            PRIMARY KEY (artifact_id, provider_id)
        );",
    )?;
    // `late_report` (a report of an action run outside its lease) came
    // later: add it to a table made before.
    let has_late_report = conn.has_column("capability_sessions", "late_report")?;
    if !has_late_report {
        conn.execute_batch("ALTER TABLE capability_sessions ADD COLUMN late_report TEXT")?;
    }
    // `derived_from` (the source of evidence the registry derived, see
    // `crate::derive`) came later too.
    let has_derived_from = conn.has_column("capability_artifacts", "derived_from")?;
    if !has_derived_from {
        conn.execute_batch("ALTER TABLE capability_artifacts ADD COLUMN derived_from TEXT")?;
    }
    conn.execute_batch(
        "CREATE INDEX IF NOT EXISTS capability_artifacts_derived_from
            ON capability_artifacts(derived_from) WHERE derived_from IS NOT NULL",
    )?;
    Ok(())
}

/// `t` at the precision it is stored with (microseconds), so a session
/// answered from memory (a waiting invoke) reads the same as when it is
/// read back later.
pub(crate) fn stored_time(t: Timestamp) -> Timestamp {
    chrono::SubsecRound::trunc_subsecs(t, 6)
}

/// Stored form of a time: RFC 3339, UTC, microseconds (sorts as text).
pub(crate) fn ts(t: &Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn bad(col: usize, e: impl std::error::Error + Send + Sync + 'static) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, Type::Text, Box::new(e))
}

fn get_ts(r: &SqlRow<'_>, col: usize) -> rusqlite::Result<Timestamp> {
    let s: String = r.get(col)?;
    chrono::DateTime::parse_from_rfc3339(&s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| bad(col, e))
}

fn get_ts_opt(r: &SqlRow<'_>, col: usize) -> rusqlite::Result<Option<Timestamp>> {
    match r.get::<_, Option<String>>(col)? {
        None => Ok(None),
        Some(_) => get_ts(r, col).map(Some),
    }
}

fn get_enum<T: std::str::FromStr<Err = shared_protocol::ValidationError>>(
    r: &SqlRow<'_>,
    col: usize,
) -> rusqlite::Result<T> {
    r.get::<_, String>(col)?.parse().map_err(|e| bad(col, e))
}

fn get_json<T: serde::de::DeserializeOwned>(r: &SqlRow<'_>, col: usize) -> rusqlite::Result<T> {
    let s: String = r.get(col)?;
    serde_json::from_str(&s).map_err(|e| bad(col, e))
}

/// Who ended a session: the provider's own report, or the registry
/// (provider offline, restarted, silent past the deadline). A provider's
/// later report overrides the registry's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndedBy {
    Provider,
    Registry,
}

impl EndedBy {
    fn as_str(self) -> &'static str {
        match self {
            EndedBy::Provider => "provider",
            EndedBy::Registry => "registry",
        }
    }
}

/// A session row: the wire session and the registry's bookkeeping.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub session: CapabilitySession,
    /// The provider the action was sent to (owner of the capability).
    pub provider_id: String,
    /// The principal that invoked the action (the lease holder).
    pub principal: String,
    /// The driver deadline sent with the command, milliseconds.
    pub timeout_ms: u32,
    /// After this instant a still-running session is failed by the registry.
    pub deadline_at: Timestamp,
    pub ended_by: Option<EndedBy>,
    /// The last final status the provider reported (what the evidence
    /// check restores once every artifact has arrived).
    pub provider_status: Option<SessionStatus>,
    /// Why the lease ended under a running session (preemption, expiry,
    /// release); prefixes the session's error message.
    pub revoke_reason: Option<String>,
}

const SESSION_COLUMNS: &str = "session_id, lease_id, capability_id, provider_id, principal,
    action, started_at, ended_at, status, input_summary, result_summary, artifact_refs,
    error_message, timeout_ms, deadline_at, ended_by, provider_status, revoke_reason, late_report";

fn read_session(r: &SqlRow<'_>) -> rusqlite::Result<SessionRow> {
    let result_summary: Option<String> = r.get(10)?;
    let ended_by: Option<String> = r.get(15)?;
    let provider_status: Option<String> = r.get(16)?;
    Ok(SessionRow {
        session: CapabilitySession {
            session_id: r.get(0)?,
            lease_id: r.get(1)?,
            capability_id: r.get(2)?,
            action: get_enum(r, 5)?,
            started_at: get_ts(r, 6)?,
            ended_at: get_ts_opt(r, 7)?,
            status: get_enum(r, 8)?,
            input_summary: get_json(r, 9)?,
            result_summary: result_summary
                .map(|s| serde_json::from_str(&s).map_err(|e| bad(10, e)))
                .transpose()?,
            artifact_refs: get_json(r, 11)?,
            error_message: r.get(12)?,
            late_report: r
                .get::<_, Option<String>>(18)?
                .map(|s| serde_json::from_str(&s).map_err(|e| bad(18, e)))
                .transpose()?,
        },
        provider_id: r.get(3)?,
        principal: r.get(4)?,
        timeout_ms: u32::try_from(r.get::<_, i64>(13)?).map_err(|e| bad(13, e))?,
        deadline_at: get_ts(r, 14)?,
        ended_by: match ended_by.as_deref() {
            Some("provider") => Some(EndedBy::Provider),
            Some("registry") => Some(EndedBy::Registry),
            _ => None,
        },
        provider_status: provider_status
            .map(|s| s.parse().map_err(|e| bad(16, e)))
            .transpose()?,
        revoke_reason: r.get(17)?,
    })
}

/// Insert a new session row (`insert_session`).
fn insert_session_row(conn: &Connection, row: &SessionRow) -> rusqlite::Result<()> {
    let s = &row.session;
    let mut stmt = conn.prepare_cached(&format!(
        "INSERT INTO capability_sessions ({SESSION_COLUMNS})
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18,
             ?19)"
    ))?;
    stmt.execute(params![
        s.session_id,
        s.lease_id,
        s.capability_id,
        row.provider_id,
        row.principal,
        s.action.as_str(),
        ts(&s.started_at),
        s.ended_at.as_ref().map(ts),
        s.status.as_str(),
        s.input_summary.to_string(),
        s.result_summary.as_ref().map(Value::to_string),
        serde_json::to_string(&s.artifact_refs).unwrap_or_else(|_| "[]".into()),
        s.error_message,
        i64::from(row.timeout_ms),
        ts(&row.deadline_at),
        row.ended_by.map(EndedBy::as_str),
        row.provider_status.map(SessionStatus::as_str),
        row.revoke_reason,
        s.late_report.as_ref().map(Value::to_string),
    ])?;
    Ok(())
}

/// Store the columns of an existing session row that change over its life
/// (status, end, results, artifacts, error, deadline, who ended it). An
/// `UPDATE` of these columns leaves the primary-key, lease and provider
/// index entries where they are (an `INSERT OR REPLACE` deleted and
/// re-inserted all of them).
///
/// Errors: `QueryReturnedNoRows` when no session has the row's id.
fn update_session_row(conn: &Connection, row: &SessionRow) -> rusqlite::Result<()> {
    let s = &row.session;
    let mut stmt = conn.prepare_cached(
        "UPDATE capability_sessions SET ended_at = ?2, status = ?3, result_summary = ?4,
             artifact_refs = ?5, error_message = ?6, deadline_at = ?7, ended_by = ?8,
             provider_status = ?9, revoke_reason = ?10, late_report = ?11
         WHERE session_id = ?1",
    )?;
    let n = stmt.execute(params![
        s.session_id,
        s.ended_at.as_ref().map(ts),
        s.status.as_str(),
        s.result_summary.as_ref().map(Value::to_string),
        serde_json::to_string(&s.artifact_refs).unwrap_or_else(|_| "[]".into()),
        s.error_message,
        ts(&row.deadline_at),
        row.ended_by.map(EndedBy::as_str),
        row.provider_status.map(SessionStatus::as_str),
        row.revoke_reason,
        s.late_report.as_ref().map(Value::to_string),
    ])?;
    if n == 0 {
        return Err(rusqlite::Error::QueryReturnedNoRows);
    }
    Ok(())
}

/// One session by id.
pub fn load_session(conn: &Connection, session_id: &str) -> rusqlite::Result<Option<SessionRow>> {
    conn.prepare_cached(&format!(
        "SELECT {SESSION_COLUMNS} FROM capability_sessions WHERE session_id = ?1"
    ))?
    .query_row(params![session_id], read_session)
    .optional()
}

/// Which sessions [`list_sessions`] returns; every given field must match.
#[derive(Debug, Clone, Default)]
pub struct SessionFilter {
    pub lease_id: Option<String>,
    pub capability_id: Option<String>,
    pub provider_id: Option<String>,
    pub status: Option<SessionStatus>,
    /// At most this many, newest first.
    pub limit: usize,
}

/// Sessions matching `f`, newest first.
pub fn list_sessions(conn: &Connection, f: &SessionFilter) -> rusqlite::Result<Vec<SessionRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {SESSION_COLUMNS} FROM capability_sessions
         WHERE (?1 IS NULL OR lease_id = ?1) AND (?2 IS NULL OR capability_id = ?2)
           AND (?3 IS NULL OR provider_id = ?3) AND (?4 IS NULL OR status = ?4)
         ORDER BY started_at DESC, rowid DESC LIMIT ?5"
    ))?;
    let rows = stmt.query_map(
        params![
            f.lease_id,
            f.capability_id,
            f.provider_id,
            f.status.map(SessionStatus::as_str),
            f.limit as i64
        ],
        read_session,
    )?;
    rows.collect()
}

fn session_event(event_type: EventType, actor: &str, row: &SessionRow) -> NewEvent {
    NewEvent::new(
        event_type,
        actor,
        serde_json::to_value(&row.session).unwrap_or(Value::Null),
    )
    .provider(row.provider_id.clone())
    .capability(row.session.capability_id.clone())
    .lease(row.session.lease_id.clone())
    .session(row.session.session_id.clone())
}

/// The event a session's final status is announced with.
fn final_event_type(status: SessionStatus) -> EventType {
    if status == SessionStatus::Completed {
        EventType::SessionCompleted
    } else {
        EventType::SessionFailed
    }
}

/// Store a new running session and append `session_started`, in a
/// savepoint (its own transaction, or part of a group commit's: see
/// [`crate::db::Db::write_grouped`]).
pub fn insert_session(
    conn: &mut Connection,
    row: &SessionRow,
) -> rusqlite::Result<CapabilityEvent> {
    let tx = conn.savepoint()?;
    insert_session_row(&tx, row)?;
    let ev = append(
        &tx,
        session_event(EventType::SessionStarted, &row.principal, row),
    )?;
    tx.commit()?;
    Ok(ev)
}

/// End a session from the registry's side (the command could not be sent,
/// the provider vanished, the deadline passed) unless it already ended.
/// Appends `session_failed`.
pub fn end_by_registry(
    conn: &mut Connection,
    session_id: &str,
    status: SessionStatus,
    message: &str,
    now: Timestamp,
) -> rusqlite::Result<Option<(SessionRow, CapabilityEvent)>> {
    let tx = conn.transaction()?;
    let Some(mut row) = load_session(&tx, session_id)? else {
        return Ok(None);
    };
    if row.session.status.is_final() {
        return Ok(None);
    }
    row.session.status = status;
    row.session.ended_at = Some(stored_time(now));
    row.session.error_message = Some(message.to_string());
    row.ended_by = Some(EndedBy::Registry);
    update_session_row(&tx, &row)?;
    let ev = append(&tx, session_event(final_event_type(status), "system", &row))?;
    tx.commit()?;
    Ok(Some((row, ev)))
}

/// Why a `session_update` was refused (logged by the caller).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateRefused {
    #[error("session `{session_id}` is unknown to the registry")]
    UnknownSession { session_id: String },
    #[error("session `{session_id}` was sent to provider `{owner}`, not to `{sender}`")]
    WrongProvider {
        session_id: String,
        owner: String,
        sender: String,
    },
    #[error("session `{session_id}` runs on capability `{expected}`, the update names `{got}`")]
    WrongCapability {
        session_id: String,
        expected: String,
        got: String,
    },
    #[error("sqlite: {0}")]
    Sqlite(String),
}

impl From<rusqlite::Error> for UpdateRefused {
    fn from(e: rusqlite::Error) -> Self {
        UpdateRefused::Sqlite(e.to_string())
    }
}

/// What applying one update did.
#[derive(Debug, Clone, Default)]
pub struct UpdateApplied {
    /// Events appended (artifact uploads bound, the session's end).
    pub events: Vec<CapabilityEvent>,
    /// Artifacts of the update that were ignored, with the reason.
    pub ignored_artifacts: Vec<String>,
    /// The session after the update.
    pub session: Option<CapabilitySession>,
}

/// Longest `error_message` a session keeps from a provider, characters;
/// longer ones are cut by [`bound_error_message`].
pub const MAX_ERROR_MESSAGE_CHARS: usize = 2000;

/// `message` cut to [`MAX_ERROR_MESSAGE_CHARS`] characters (on a character
/// boundary) followed by "… (N more characters)" when it was longer;
/// unchanged otherwise.
pub fn bound_error_message(message: String) -> String {
    match message.char_indices().nth(MAX_ERROR_MESSAGE_CHARS) {
        None => message,
        Some((cut, _)) => {
            let more = message[cut..].chars().count();
            format!("{}… ({more} more characters)", &message[..cut])
        }
    }
}

/// `storage_uri` of an uploaded artifact.
pub fn content_uri(artifact_id: &str) -> String {
    format!("/api/v1/artifacts/{artifact_id}/content")
}

/// The `error_message` of a session its lease's end cut short: `reason`,
/// then the provider's own words in parentheses. A provider repeats the
/// reason it got in `action_cancel` (the edge daemon reports "cancelled:
/// {reason}"); that repetition is left out, so the reason appears once:
/// "lease released by its holder before the action ended (provider:
/// cancelled)".
pub fn lease_end_message(reason: &str, provider_message: Option<&str>) -> String {
    let own = provider_message.unwrap_or("").replace(reason, "");
    let own = own.trim_matches(|c: char| c.is_whitespace() || matches!(c, ':' | ';' | ','));
    if own.is_empty() {
        reason.to_string()
    } else {
        format!("{reason} (provider: {own})")
    }
}

/// Apply a provider's `session_update` (status, result, artifact metadata).
///
/// - A final status ends a running session (or replaces the registry's
///   verdict on one it ended for lack of news); a repeated or late final
///   status for a session the provider already ended changes nothing but
///   may add artifacts.
/// - `failed` / `cancelled` on a lease that ended under the session (see
///   `lease_end_reason`, or the reason recorded at revocation) becomes
///   `failed` with the reason first in `error_message`.
/// - Artifact metadata is stored (`uploaded = 0`), or bound at once to
///   bytes the same provider sent earlier with the same sha256.
///
/// - A final report of an action the bench started after `fence_end`
///   (the earlier of the command's deadline and the lease's end, see
///   [`fence_end`]) never replaces the registry's verdict: it is kept in
///   `late_report` with a `session_late_report` event, and a session still
///   open ends `failed`, saying so.
///
/// Runs in a savepoint, like [`insert_session`]; a refusal rolls it back.
pub fn apply_update(
    conn: &mut Connection,
    provider_id: &str,
    update: &SessionUpdate,
    lease_end_reason: Option<String>,
    fence_end: Option<Timestamp>,
    now: Timestamp,
) -> Result<UpdateApplied, UpdateRefused> {
    let tx = conn.savepoint()?;
    let mut row =
        load_session(&tx, &update.session_id)?.ok_or_else(|| UpdateRefused::UnknownSession {
            session_id: update.session_id.clone(),
        })?;
    if row.provider_id != provider_id {
        return Err(UpdateRefused::WrongProvider {
            session_id: update.session_id.clone(),
            owner: row.provider_id.clone(),
            sender: provider_id.to_string(),
        });
    }
    if row.session.capability_id != update.capability_id {
        return Err(UpdateRefused::WrongCapability {
            session_id: update.session_id.clone(),
            expected: row.session.capability_id.clone(),
            got: update.capability_id.clone(),
        });
    }
    let mut out = UpdateApplied::default();
    let mut changed = false;
    for a in &update.artifacts {
        if a.session_id != update.session_id {
            out.ignored_artifacts.push(format!(
                "artifact `{}` names session `{}`, not `{}`",
                a.artifact_id, a.session_id, update.session_id
            ));
            continue;
        }
        match insert_artifact(&tx, provider_id, &row, a, now, &mut out)? {
            Some(why) => out.ignored_artifacts.push(why),
            None => {
                if !row.session.artifact_refs.contains(&a.artifact_id) {
                    row.session.artifact_refs.push(a.artifact_id.clone());
                    changed = true;
                }
            }
        }
    }
    let mut end_event = None;
    let outside_fence = match (update.status.is_final(), update.started_at, fence_end) {
        (true, Some(started), Some(end)) => started > end + chrono::Duration::milliseconds(1),
        _ => false,
    };
    if outside_fence {
        // A repeat of a late report (QoS 1) finds it kept already.
        if row.session.late_report.is_some() {
            tx.commit()?;
            out.session = Some(row.session);
            return Ok(out);
        }
        let end = fence_end.unwrap_or(now);
        let started = update.started_at.unwrap_or(now);
        row.session.late_report = Some(serde_json::json!({
            "status": update.status,
            "started_at": stored_time(started),
            "fence_end": stored_time(end),
            "result_summary": update.result_summary,
            "error_message": update.error_message.clone().map(bound_error_message),
            "artifact_ids": update.artifacts.iter().map(|a| a.artifact_id.as_str()).collect::<Vec<_>>(),
            "received_at": stored_time(now),
        }));
        if !row.session.status.is_final() {
            let late_ms = (started - end).num_milliseconds();
            row.session.status = SessionStatus::Failed;
            row.session.ended_at = Some(stored_time(now));
            row.session.error_message = Some(bound_error_message(format!(
                "the bench started the action {late_ms} ms after its lease or deadline ended                  ({}); its report ({}) is kept as late_report",
                ts(&end),
                update.status
            )));
            row.ended_by = Some(EndedBy::Registry);
            end_event = Some(final_event_type(SessionStatus::Failed));
        }
        changed = true;
        tracing::warn!(
            provider_id,
            session_id = %update.session_id,
            started_at = %ts(&started),
            fence_end = %ts(&end),
            reported = %update.status,
            "a provider reported an action its bench started outside the lease; kept as late_report, not applied"
        );
    } else if update.status.is_final() {
        let may_end = match (row.session.status.is_final(), row.ended_by) {
            (false, _) => true,
            (true, Some(EndedBy::Registry)) => true,
            (true, _) => false,
        };
        if may_end {
            let reason = row.revoke_reason.clone().or(lease_end_reason);
            let (status, error) = match (update.status, reason) {
                (SessionStatus::Failed | SessionStatus::Cancelled, Some(reason)) => (
                    SessionStatus::Failed,
                    Some(lease_end_message(&reason, update.error_message.as_deref())),
                ),
                (s, _) => (s, update.error_message.clone()),
            };
            row.session.status = status;
            row.session.ended_at = Some(stored_time(update.occurred_at));
            row.session.error_message = error.map(bound_error_message);
            row.ended_by = Some(EndedBy::Provider);
            row.provider_status = Some(update.status);
            end_event = Some(final_event_type(status));
            changed = true;
        }
    }
    if !outside_fence
        && update.result_summary.is_some()
        && row.session.result_summary != update.result_summary
    {
        row.session.result_summary = update.result_summary.clone();
        changed = true;
    }
    if changed {
        update_session_row(&tx, &row)?;
    }
    if let Some(t) = end_event {
        out.events
            .push(append(&tx, session_event(t, provider_id, &row))?);
    }
    if outside_fence && changed {
        out.events.push(append(
            &tx,
            session_event(EventType::SessionLateReport, provider_id, &row),
        )?);
    }
    tx.commit()?;
    out.session = Some(row.session);
    Ok(out)
}

/// When a fenced command's authority ended, on the registry's clock: the
/// earlier of the session's own deadline (`started_at` + `timeout_ms`, the
/// command's `not_after` at most) and `lease_ended_at`, the lease's end if
/// it has ended. An action the bench started after it ran outside its
/// lease.
pub fn fence_end(row: &SessionRow, lease_ended_at: Option<Timestamp>) -> Timestamp {
    let deadline =
        row.session.started_at + chrono::Duration::milliseconds(i64::from(row.timeout_ms));
    match lease_ended_at {
        Some(t) if t < deadline => t,
        _ => deadline,
    }
}

/// Insert one artifact's metadata; `Some(reason)` when it is ignored.
fn insert_artifact(
    tx: &Connection,
    provider_id: &str,
    session: &SessionRow,
    a: &CapabilityArtifact,
    now: Timestamp,
    out: &mut UpdateApplied,
) -> rusqlite::Result<Option<String>> {
    if let Some(existing) = load_artifact(tx, &a.artifact_id)? {
        if existing.artifact.session_id != a.session_id || existing.provider_id != provider_id {
            return Ok(Some(format!(
                "artifact `{}` already belongs to session `{}`",
                a.artifact_id, existing.artifact.session_id
            )));
        }
        // Repeated metadata (the update was sent again): keep the row.
        return Ok(None);
    }
    let pending: Option<(String, i64)> = tx
        .query_row(
            "SELECT sha256, size_bytes FROM artifact_pending_uploads
             WHERE artifact_id = ?1 AND provider_id = ?2",
            params![a.artifact_id, provider_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let bound = match &pending {
        Some((sha, _)) if *sha == a.checksum => true,
        Some((sha, _)) => {
            tracing::warn!(artifact_id = %a.artifact_id, held = %sha, metadata = %a.checksum,
                "bytes received before the metadata have another sha256; they are not bound");
            false
        }
        None => false,
    };
    if pending.is_some() {
        tx.execute(
            "DELETE FROM artifact_pending_uploads WHERE artifact_id = ?1 AND provider_id = ?2",
            params![a.artifact_id, provider_id],
        )?;
    }
    let mut artifact = a.clone();
    artifact.uploaded = bound;
    artifact.storage_uri = if bound {
        content_uri(&a.artifact_id)
    } else if a.storage_uri.is_empty() {
        format!("edge-outbox://{provider_id}/{}", a.artifact_id)
    } else {
        a.storage_uri.clone()
    };
    if let Some((_, size)) = pending.filter(|_| bound) {
        artifact.size_bytes = size as u64;
    }
    tx.execute(
        "INSERT INTO capability_artifacts (artifact_id, session_id, provider_id, artifact_type,
             storage_uri, content_type, captured_at, duration_ms, checksum, size_bytes,
             metadata_json, uploaded, uploaded_at, received_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        params![
            artifact.artifact_id,
            artifact.session_id,
            provider_id,
            artifact.artifact_type.as_str(),
            artifact.storage_uri,
            artifact.content_type,
            ts(&artifact.captured_at),
            artifact.duration_ms.map(|d| d as i64),
            artifact.checksum,
            artifact.size_bytes as i64,
            Value::Object(artifact.metadata_json.clone()).to_string(),
            bound,
            bound.then(|| ts(&now)),
            ts(&now),
        ],
    )?;
    if bound {
        out.events
            .push(append(tx, artifact_event(provider_id, session, &artifact))?);
    }
    Ok(None)
}

/// Store `artifact`, evidence the registry derived from the artifact
/// `derived_from` of the same session (bytes already in the blob store,
/// `uploaded`), and append its `artifact_uploaded` event with actor
/// `registry`, chained like any other. Runs on the caller's transaction.
///
/// Errors: SQLite (a row with the id exists: a constraint error).
pub fn insert_derived_artifact(
    tx: &Connection,
    provider_id: &str,
    session: &SessionRow,
    artifact: &CapabilityArtifact,
    derived_from: &str,
    now: Timestamp,
) -> rusqlite::Result<CapabilityEvent> {
    tx.execute(
        "INSERT INTO capability_artifacts (artifact_id, session_id, provider_id, artifact_type,
             storage_uri, content_type, captured_at, duration_ms, checksum, size_bytes,
             metadata_json, uploaded, uploaded_at, received_at, derived_from)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, 1, ?12, ?12, ?13)",
        params![
            artifact.artifact_id,
            artifact.session_id,
            provider_id,
            artifact.artifact_type.as_str(),
            artifact.storage_uri,
            artifact.content_type,
            ts(&artifact.captured_at),
            artifact.duration_ms.map(|d| d as i64),
            artifact.checksum,
            artifact.size_bytes as i64,
            Value::Object(artifact.metadata_json.clone()).to_string(),
            ts(&now),
            derived_from,
        ],
    )?;
    let mut ev = artifact_event(provider_id, session, artifact);
    ev.actor = "registry".into();
    append(tx, ev)
}

fn artifact_event(
    provider_id: &str,
    session: &SessionRow,
    artifact: &CapabilityArtifact,
) -> NewEvent {
    NewEvent::new(
        EventType::ArtifactUploaded,
        provider_id,
        serde_json::to_value(artifact).unwrap_or(Value::Null),
    )
    .provider(provider_id)
    .capability(session.session.capability_id.clone())
    .lease(session.session.lease_id.clone())
    .session(session.session.session_id.clone())
    .artifact(artifact.artifact_id.clone())
}

/// An artifact row: the wire artifact and the provider that made it.
#[derive(Debug, Clone, PartialEq)]
pub struct ArtifactRow {
    pub artifact: CapabilityArtifact,
    pub provider_id: String,
}

const ARTIFACT_COLUMNS: &str = "artifact_id, session_id, provider_id, artifact_type,
    storage_uri, content_type, captured_at, duration_ms, checksum, size_bytes, metadata_json,
    uploaded";

fn read_artifact(r: &SqlRow<'_>) -> rusqlite::Result<ArtifactRow> {
    let metadata: Map<String, Value> = get_json(r, 10)?;
    Ok(ArtifactRow {
        artifact: CapabilityArtifact {
            artifact_id: r.get(0)?,
            session_id: r.get(1)?,
            artifact_type: get_enum(r, 3)?,
            storage_uri: r.get(4)?,
            content_type: r.get(5)?,
            captured_at: get_ts(r, 6)?,
            duration_ms: r.get::<_, Option<i64>>(7)?.map(|d| d.max(0) as u64),
            checksum: r.get(8)?,
            size_bytes: r.get::<_, i64>(9)?.max(0) as u64,
            metadata_json: metadata,
            uploaded: r.get(11)?,
        },
        provider_id: r.get(2)?,
    })
}

/// One artifact by id.
pub fn load_artifact(
    conn: &Connection,
    artifact_id: &str,
) -> rusqlite::Result<Option<ArtifactRow>> {
    conn.query_row(
        &format!("SELECT {ARTIFACT_COLUMNS} FROM capability_artifacts WHERE artifact_id = ?1"),
        params![artifact_id],
        read_artifact,
    )
    .optional()
}

/// The bytes held for `artifact_id` from `provider_id` before its metadata
/// arrived: `(sha256, size_bytes)`, if any.
pub fn held_upload(
    conn: &Connection,
    artifact_id: &str,
    provider_id: &str,
) -> rusqlite::Result<Option<(String, u64)>> {
    conn.query_row(
        "SELECT sha256, size_bytes FROM artifact_pending_uploads
         WHERE artifact_id = ?1 AND provider_id = ?2",
        params![artifact_id, provider_id],
        |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?.max(0) as u64)),
    )
    .optional()
}

/// Which artifacts [`list_artifacts`] returns.
#[derive(Debug, Clone, Default)]
pub struct ArtifactFilter {
    pub session_id: Option<String>,
    /// Artifacts of every session of this lease.
    pub lease_id: Option<String>,
    pub uploaded: Option<bool>,
    /// Only the evidence the registry derived from this artifact id
    /// (`detection_json`, `ocr_text`, `transcript`; docs/audit-trail.md
    /// "Derived evidence").
    pub derived_from: Option<String>,
    pub limit: usize,
}

/// Artifacts matching `f`, oldest capture first.
pub fn list_artifacts(conn: &Connection, f: &ArtifactFilter) -> rusqlite::Result<Vec<ArtifactRow>> {
    let mut stmt = conn.prepare_cached(&format!(
        "SELECT {} FROM capability_artifacts a
         WHERE (?1 IS NULL OR a.session_id = ?1)
           AND (?2 IS NULL OR a.session_id IN
                (SELECT session_id FROM capability_sessions WHERE lease_id = ?2))
           AND (?3 IS NULL OR a.uploaded = ?3)
           AND (?5 IS NULL OR a.derived_from = ?5)
         ORDER BY a.captured_at, a.rowid LIMIT ?4",
        ARTIFACT_COLUMNS
            .split(',')
            .map(|c| format!("a.{}", c.trim()))
            .collect::<Vec<_>>()
            .join(", ")
    ))?;
    let rows = stmt.query_map(
        params![
            f.session_id,
            f.lease_id,
            f.uploaded,
            f.limit as i64,
            f.derived_from
        ],
        read_artifact,
    )?;
    rows.collect()
}

/// What [`record_upload`] did with verified bytes.
#[derive(Debug, Clone)]
pub enum UploadRecorded {
    /// The artifact's metadata is known and now marked uploaded. `first`:
    /// this PUT made it so (`artifact_uploaded` was appended).
    Bound {
        artifact: CapabilityArtifact,
        first: bool,
        events: Vec<CapabilityEvent>,
    },
    /// No metadata yet: the bytes are held for `artifact_id` and bound when
    /// the session update with its metadata arrives. `first`: not held
    /// before with this sha256.
    Held {
        artifact_id: String,
        checksum: String,
        size_bytes: u64,
        first: bool,
    },
}

/// Why [`record_upload`] refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UploadRefused {
    #[error("artifact `{artifact_id}` belongs to provider `{owner}`")]
    NotOwner { artifact_id: String, owner: String },
    #[error("artifact `{artifact_id}` has sha256 {expected}; the bytes have {actual}")]
    ChecksumMismatch {
        artifact_id: String,
        expected: String,
        actual: String,
    },
    #[error("sqlite: {0}")]
    Sqlite(String),
}

impl From<rusqlite::Error> for UploadRefused {
    fn from(e: rusqlite::Error) -> Self {
        UploadRefused::Sqlite(e.to_string())
    }
}

/// Record that the bytes of `artifact_id` (hash `sha256`, `size_bytes`
/// long, already in the blob store) arrived from `provider_id`.
///
/// A session in `incomplete_evidence` whose provider had reported it
/// `completed` becomes `completed` again once its last artifact arrives
/// (appending `session_completed`).
pub fn record_upload(
    conn: &mut Connection,
    artifact_id: &str,
    provider_id: &str,
    sha256: &str,
    size_bytes: u64,
    now: Timestamp,
) -> Result<UploadRecorded, UploadRefused> {
    let tx = conn.transaction()?;
    let Some(meta) = load_artifact(&tx, artifact_id)? else {
        let held: Option<String> = tx
            .query_row(
                "SELECT sha256 FROM artifact_pending_uploads WHERE artifact_id = ?1 AND provider_id = ?2",
                params![artifact_id, provider_id],
                |r| r.get(0),
            )
            .optional()?;
        let first = held.as_deref() != Some(sha256);
        if first {
            tx.execute(
                "INSERT INTO artifact_pending_uploads
                     (artifact_id, provider_id, sha256, size_bytes, received_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)
                 ON CONFLICT (artifact_id, provider_id) DO UPDATE SET
                     sha256 = excluded.sha256, size_bytes = excluded.size_bytes,
                     received_at = excluded.received_at",
                params![
                    artifact_id,
                    provider_id,
                    sha256,
                    size_bytes as i64,
                    ts(&now)
                ],
            )?;
        }
        tx.commit()?;
        return Ok(UploadRecorded::Held {
            artifact_id: artifact_id.to_string(),
            checksum: sha256.to_string(),
            size_bytes,
            first,
        });
    };
    if meta.provider_id != provider_id {
        return Err(UploadRefused::NotOwner {
            artifact_id: artifact_id.to_string(),
            owner: meta.provider_id,
        });
    }
    if meta.artifact.checksum != sha256 {
        return Err(UploadRefused::ChecksumMismatch {
            artifact_id: artifact_id.to_string(),
            expected: meta.artifact.checksum,
            actual: sha256.to_string(),
        });
    }
    if meta.artifact.uploaded {
        return Ok(UploadRecorded::Bound {
            artifact: meta.artifact,
            first: false,
            events: vec![],
        });
    }
    let mut artifact = meta.artifact;
    artifact.uploaded = true;
    artifact.storage_uri = content_uri(artifact_id);
    artifact.size_bytes = size_bytes;
    tx.execute(
        "UPDATE capability_artifacts SET uploaded = 1, uploaded_at = ?2, storage_uri = ?3,
             size_bytes = ?4
         WHERE artifact_id = ?1",
        params![
            artifact_id,
            ts(&now),
            artifact.storage_uri,
            size_bytes as i64
        ],
    )?;
    let mut events = Vec::new();
    if let Some(mut session) = load_session(&tx, &artifact.session_id)? {
        events.push(append(
            &tx,
            artifact_event(provider_id, &session, &artifact),
        )?);
        let missing = missing_uploads(&tx, &session.session.session_id)?;
        if session.session.status == SessionStatus::IncompleteEvidence
            && session.provider_status == Some(SessionStatus::Completed)
            && missing == 0
        {
            session.session.status = SessionStatus::Completed;
            session.session.error_message = None;
            update_session_row(&tx, &session)?;
            events.push(append(
                &tx,
                session_event(EventType::SessionCompleted, "system", &session),
            )?);
        }
    }
    tx.commit()?;
    Ok(UploadRecorded::Bound {
        artifact,
        first: true,
        events,
    })
}

/// Number of artifacts of a session whose bytes have not arrived.
fn missing_uploads(conn: &Connection, session_id: &str) -> rusqlite::Result<u64> {
    conn.query_row(
        "SELECT COUNT(*) FROM capability_artifacts WHERE session_id = ?1 AND uploaded = 0",
        params![session_id],
        |r| r.get::<_, i64>(0),
    )
    .map(|n| n.max(0) as u64)
}

/// A provider went offline or restarted (seed 001 §5.4): its running
/// sessions end — `incomplete_evidence` when some of their artifacts'
/// bytes have not arrived, `failed` otherwise — and its completed sessions
/// still waiting for artifact bytes become `incomplete_evidence` (they
/// return to `completed` if the bytes arrive later). Appends one
/// `session_failed` per session changed.
pub fn provider_lost(
    conn: &mut Connection,
    provider_id: &str,
    why: &str,
    now: Timestamp,
) -> rusqlite::Result<Vec<CapabilityEvent>> {
    let tx = conn.transaction()?;
    let rows: Vec<SessionRow> = {
        let mut stmt = tx.prepare_cached(&format!(
            "SELECT {SESSION_COLUMNS} FROM capability_sessions
             WHERE provider_id = ?1 AND (status IN ('pending', 'running')
                OR (status = 'completed' AND session_id IN
                    (SELECT session_id FROM capability_artifacts WHERE uploaded = 0)))"
        ))?;
        let rows = stmt.query_map(params![provider_id], read_session)?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut events = Vec::new();
    for mut row in rows {
        let missing = missing_uploads(&tx, &row.session.session_id)?;
        let was_running = !row.session.status.is_final();
        let (status, message) = match (was_running, missing) {
            (true, 0) => (
                SessionStatus::Failed,
                format!("{why} while the session was running"),
            ),
            (true, n) => (
                SessionStatus::IncompleteEvidence,
                format!("{why} while the session was running; {n} artifact(s) never uploaded"),
            ),
            (false, n) => (
                SessionStatus::IncompleteEvidence,
                format!("{why} before the session's evidence finished uploading; {n} artifact(s) missing"),
            ),
        };
        row.session.status = status;
        row.session.error_message = Some(message);
        if was_running {
            row.session.ended_at = Some(stored_time(now));
            row.ended_by = Some(EndedBy::Registry);
        }
        update_session_row(&tx, &row)?;
        events.push(append(
            &tx,
            session_event(EventType::SessionFailed, "system", &row),
        )?);
    }
    tx.commit()?;
    Ok(events)
}

/// The lease `lease_id` (with `evidence_required`) ended at least
/// `evidence_grace_ms` ago (seed 001 §5.4): its completed sessions whose
/// artifacts' bytes have not all arrived become `incomplete_evidence`
/// (each returns to `completed` when its last bytes arrive, see
/// [`record_upload`]). Sessions still open are left to their deadlines.
/// Appends one `session_failed` per session changed.
pub fn lease_evidence_due(
    conn: &mut Connection,
    lease_id: &str,
    grace_ms: u64,
) -> rusqlite::Result<Vec<CapabilityEvent>> {
    let tx = conn.transaction()?;
    let rows: Vec<SessionRow> = {
        let mut stmt = tx.prepare_cached(&format!(
            "SELECT {SESSION_COLUMNS} FROM capability_sessions
             WHERE lease_id = ?1 AND status = 'completed' AND session_id IN
                (SELECT session_id FROM capability_artifacts WHERE uploaded = 0)"
        ))?;
        let rows = stmt.query_map(params![lease_id], read_session)?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut events = Vec::new();
    for mut row in rows {
        let missing = missing_uploads(&tx, &row.session.session_id)?;
        row.session.status = SessionStatus::IncompleteEvidence;
        row.session.error_message = Some(format!(
            "lease `{lease_id}` requires evidence and ended {grace_ms} ms ago with {missing} \
             artifact(s) of this session not uploaded"
        ));
        update_session_row(&tx, &row)?;
        events.push(append(
            &tx,
            session_event(EventType::SessionFailed, "system", &row),
        )?);
    }
    tx.commit()?;
    Ok(events)
}

/// Leases with `evidence_required` that have ended and still have a
/// completed session missing artifact bytes, with their `ended_at` (wall
/// clock): what [`lease_evidence_due`] has yet to judge after a restart.
pub fn leases_awaiting_evidence(conn: &Connection) -> rusqlite::Result<Vec<(String, Timestamp)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT l.lease_id, l.ended_at FROM capability_leases l
         WHERE l.evidence_required = 1 AND l.ended_at IS NOT NULL AND EXISTS
            (SELECT 1 FROM capability_sessions s JOIN capability_artifacts a
                 ON a.session_id = s.session_id
             WHERE s.lease_id = l.lease_id AND s.status = 'completed' AND a.uploaded = 0)",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, get_ts(r, 1)?)))?;
    rows.collect()
}

/// What a `session_sync` to `provider_id` lists, at most `limit`: its
/// sessions still open (`pending` or `running`), oldest first, then those
/// the registry ended by presumption (provider offline, deadline) at or
/// after `presumed_since`, whose own report may have been lost at the
/// broker and would replace the presumption.
pub fn open_sessions_of(
    conn: &Connection,
    provider_id: &str,
    presumed_since: Timestamp,
    limit: usize,
) -> rusqlite::Result<Vec<OpenSession>> {
    // Each part through a partial index of few rows (open sessions;
    // sessions the registry ended), where the provider index would walk
    // the provider's whole history.
    let mut stmt = conn.prepare_cached(
        "SELECT session_id, capability_id, part FROM (
             SELECT session_id, capability_id, 0 AS part, started_at, rowid AS r
               FROM capability_sessions INDEXED BY capability_sessions_open_deadline
              WHERE status IN ('pending', 'running') AND provider_id = ?1
             UNION ALL
             SELECT session_id, capability_id, 1, started_at, rowid
               FROM capability_sessions INDEXED BY capability_sessions_presumed
              WHERE ended_by = 'registry' AND provider_id = ?1 AND ended_at >= ?2
         ) AS listed ORDER BY part, started_at, r LIMIT ?3",
    )?;
    let rows = stmt.query_map(
        params![provider_id, ts(&presumed_since), limit as i64],
        |r| {
            Ok(OpenSession {
                session_id: r.get(0)?,
                capability_id: r.get(1)?,
                ended_by_registry: r.get::<_, i64>(2)? == 1,
            })
        },
    )?;
    rows.collect()
}

/// Whether lease `lease_id` has a session still pending or running.
pub fn has_open_sessions(conn: &Connection, lease_id: &str) -> rusqlite::Result<bool> {
    conn.prepare_cached(
        "SELECT EXISTS (SELECT 1 FROM capability_sessions
                        WHERE lease_id = ?1 AND status IN ('pending', 'running'))",
    )?
    .query_row(params![lease_id], |r| r.get(0))
}

/// The lease `lease_id` ended (`reason` says how): remember the reason on
/// its running sessions and move their deadline to at most `deadline`.
/// Returns those sessions (to send `action_cancel` for).
pub fn lease_ended(
    conn: &mut Connection,
    lease_id: &str,
    reason: &str,
    deadline: Timestamp,
) -> rusqlite::Result<Vec<SessionRow>> {
    let tx = conn.transaction()?;
    let rows: Vec<SessionRow> = {
        let mut stmt = tx.prepare_cached(&format!(
            "SELECT {SESSION_COLUMNS} FROM capability_sessions
             WHERE lease_id = ?1 AND status IN ('pending', 'running')"
        ))?;
        let rows = stmt.query_map(params![lease_id], read_session)?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut out = Vec::with_capacity(rows.len());
    for mut row in rows {
        row.revoke_reason = Some(reason.to_string());
        if deadline < row.deadline_at {
            row.deadline_at = deadline;
        }
        update_session_row(&tx, &row)?;
        out.push(row);
    }
    tx.commit()?;
    Ok(out)
}

/// Deadlines of the sessions still open (`pending` or `running`): their
/// ids and wall-clock `deadline_at`, from which the registry rebuilds its
/// monotonic deadlines when it starts.
pub fn open_deadlines(conn: &Connection) -> rusqlite::Result<Vec<(String, Timestamp)>> {
    let mut stmt = conn.prepare_cached(
        "SELECT session_id, deadline_at FROM capability_sessions
         WHERE status IN ('pending', 'running')",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get(0)?, get_ts(r, 1)?)))?;
    rows.collect()
}

/// Fail the sessions `session_ids` whose deadline passed (on the
/// registry's monotonic clock, see `deadlines`) without their provider
/// reporting their end, at `now` (wall clock, for `ended_at`). Sessions
/// already ended are left alone. Appends `session_failed` each.
pub fn fail_overdue(
    conn: &mut Connection,
    session_ids: &[String],
    now: Timestamp,
) -> rusqlite::Result<Vec<CapabilityEvent>> {
    let tx = conn.transaction()?;
    let mut rows = Vec::with_capacity(session_ids.len());
    for id in session_ids {
        match load_session(&tx, id)? {
            Some(row) if !row.session.status.is_final() => rows.push(row),
            _ => {}
        }
    }
    let mut events = Vec::new();
    for mut row in rows {
        let silence = format!(
            "provider `{}` did not report the end of `{}` (driver deadline {} ms)",
            row.provider_id, row.session.action, row.timeout_ms
        );
        let message = match &row.revoke_reason {
            Some(r) => format!("{r}; {silence}"),
            None => silence,
        };
        row.session.status = SessionStatus::Failed;
        row.session.ended_at = Some(stored_time(now));
        row.session.error_message = Some(message);
        row.ended_by = Some(EndedBy::Registry);
        update_session_row(&tx, &row)?;
        events.push(append(
            &tx,
            session_event(EventType::SessionFailed, "system", &row),
        )?);
    }
    tx.commit()?;
    Ok(events)
}

/// Counts of sessions per status and artifacts uploaded / waiting (for
/// `/metrics`-style reporting and tests).
pub fn counts(conn: &Connection) -> rusqlite::Result<Value> {
    let mut by_status = Map::new();
    let mut stmt = conn.prepare_cached(
        "SELECT status, COUNT(*) FROM capability_sessions GROUP BY status ORDER BY status",
    )?;
    let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
    for row in rows {
        let (s, n) = row?;
        by_status.insert(s, json!(n));
    }
    let (uploaded, waiting): (i64, i64) = conn.query_row(
        "SELECT COALESCE(SUM(uploaded), 0), COALESCE(SUM(1 - uploaded), 0) FROM capability_artifacts",
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(json!({
        "sessions_by_status": by_status,
        "artifacts_uploaded": uploaded,
        "artifacts_waiting": waiting,
    }))
}
