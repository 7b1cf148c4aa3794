//! SQLite tables of the agent runtime (docs/earth-command.md, "Runs, steps, evidence, proposals"): runs, steps,
//! evidence, proposals, plus the settings proposals change and the speech
//! transcriptions Earth commands refer to.
//!
//! Every method runs on the [`Db`] threads, never on a tokio worker. Steps
//! get their `step_index` inside the insert transaction (max + 1), so the
//! indexes of a run are 0-based and gap-free. A run in a final status
//! (`completed`, `failed`, `stopped`) takes no new steps and its status no
//! longer changes: the loop that lost a race with `stop` cannot undo it.

use chrono::{SecondsFormat, Utc};
use registry_core::sql::{params, Connection, OptionalExtension, Row};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use sha2::{Digest, Sha256};
use shared_protocol::agent::{
    AgentEvidence, AgentProposal, AgentRun, AgentRunDetail, AgentStep, EvidenceType,
    ProposalRiskLevel, ProposalStatus, ProposalType, RunStatus, RunType, StepStatus, StepType,
};
use shared_protocol::Timestamp;

use registry_core::db::{Db, DbError};

use crate::events::{AgentEvent, AgentEventSink, NoEvents};

/// Why a store operation failed.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error(transparent)]
    Db(#[from] DbError),
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    /// A stored row that does not decode (unknown enum value, bad JSON).
    #[error("{table} row {id}: {message}")]
    Corrupt {
        table: &'static str,
        id: i64,
        message: String,
    },
    /// The run is `completed`, `failed` or `stopped`.
    #[error("run {run_id} is already {status}")]
    RunFinal { run_id: String, status: RunStatus },
    #[error("{kind} `{id}` not found")]
    NotFound { kind: &'static str, id: String },
}

/// Create the agent runtime's tables (`agent_runs`, `agent_steps`,
/// `agent_evidence`, `agent_proposals`, `agent_settings`,
/// `agent_transcriptions`) and indexes. Idempotent.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS agent_runs (
            id              INTEGER PRIMARY KEY AUTOINCREMENT,
            public_id       TEXT NOT NULL UNIQUE,
            run_type        TEXT NOT NULL,
            status          TEXT NOT NULL,
            title           TEXT NOT NULL,
            objective       TEXT NOT NULL,
            input           TEXT NOT NULL,
            context         TEXT NOT NULL,
            result_markdown TEXT,
            result_json     TEXT,
            provider        TEXT,
            model           TEXT,
            request_id      TEXT,
            created_by      TEXT NOT NULL,
            created_at      TEXT NOT NULL,
            updated_at      TEXT NOT NULL,
            completed_at    TEXT,
            error           TEXT
        );
        CREATE INDEX IF NOT EXISTS agent_runs_created_at ON agent_runs(created_at);
        CREATE INDEX IF NOT EXISTS agent_runs_status ON agent_runs(status);
        CREATE INDEX IF NOT EXISTS agent_runs_type_created ON agent_runs(run_type, created_at);
        CREATE INDEX IF NOT EXISTS agent_runs_created_by ON agent_runs(created_by);

        CREATE TABLE IF NOT EXISTS agent_steps (
            id           INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id       INTEGER NOT NULL REFERENCES agent_runs(id) ON DELETE CASCADE,
            step_index   INTEGER NOT NULL,
            step_type    TEXT NOT NULL,
            status       TEXT NOT NULL,
            name         TEXT NOT NULL,
            input        TEXT NOT NULL,
            output       TEXT,
            error        TEXT,
            started_at   TEXT,
            completed_at TEXT,
            duration_ms  INTEGER,
            UNIQUE (run_id, step_index)
        );
        CREATE INDEX IF NOT EXISTS agent_steps_status ON agent_steps(run_id, status);

        CREATE TABLE IF NOT EXISTS agent_evidence (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id        INTEGER NOT NULL REFERENCES agent_runs(id) ON DELETE CASCADE,
            step_id       INTEGER REFERENCES agent_steps(id) ON DELETE SET NULL,
            evidence_type TEXT NOT NULL,
            source        TEXT NOT NULL,
            title         TEXT NOT NULL,
            url           TEXT,
            content       TEXT NOT NULL,
            content_hash  TEXT,
            metadata      TEXT NOT NULL,
            retrieved_at  TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS agent_evidence_run ON agent_evidence(run_id);
        CREATE INDEX IF NOT EXISTS agent_evidence_type ON agent_evidence(evidence_type);
        CREATE INDEX IF NOT EXISTS agent_evidence_hash ON agent_evidence(content_hash);

        CREATE TABLE IF NOT EXISTS agent_proposals (
            id             INTEGER PRIMARY KEY AUTOINCREMENT,
            run_id         INTEGER NOT NULL REFERENCES agent_runs(id) ON DELETE CASCADE,
            proposal_type  TEXT NOT NULL,
            status         TEXT NOT NULL,
            risk_level     TEXT NOT NULL,
            target         TEXT NOT NULL,
            before_payload TEXT NOT NULL,
            after_payload  TEXT NOT NULL,
            rationale      TEXT NOT NULL,
            policy_result  TEXT NOT NULL,
            applied_by     TEXT,
            applied_at     TEXT,
            error          TEXT
        );
        CREATE INDEX IF NOT EXISTS agent_proposals_run ON agent_proposals(run_id);
        CREATE INDEX IF NOT EXISTS agent_proposals_status ON agent_proposals(status);

        CREATE TABLE IF NOT EXISTS agent_settings (
            kind       TEXT NOT NULL,
            key        TEXT NOT NULL,
            value      TEXT NOT NULL,
            updated_at TEXT NOT NULL,
            updated_by TEXT NOT NULL,
            PRIMARY KEY (kind, key)
        );

        CREATE TABLE IF NOT EXISTS agent_transcriptions (
            id            INTEGER PRIMARY KEY AUTOINCREMENT,
            public_id     TEXT NOT NULL UNIQUE,
            text          TEXT NOT NULL,
            language      TEXT NOT NULL,
            provider      TEXT NOT NULL,
            model         TEXT NOT NULL,
            source        TEXT NOT NULL,
            duration_ms   INTEGER NOT NULL,
            confidence    REAL,
            metadata      TEXT NOT NULL,
            audio         TEXT NOT NULL,
            created_by    TEXT NOT NULL,
            created_at    TEXT NOT NULL
        );
        CREATE INDEX IF NOT EXISTS agent_transcriptions_created_at ON agent_transcriptions(created_at);",
    )
}

/// RFC 3339 UTC with milliseconds: sorts as text in time order.
pub(crate) fn ts(t: Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

/// Lowercase hex sha256 of `content` (evidence `content_hash`).
pub fn content_hash(content: &str) -> String {
    hex::encode(Sha256::digest(content.as_bytes()))
}

/// A new public run id: `agent_` and 32 hex digits.
pub fn new_run_id() -> String {
    format!("agent_{}", uuid::Uuid::new_v4().simple())
}

/// A run about to be created.
#[derive(Debug, Clone)]
pub struct NewRun {
    pub run_type: RunType,
    pub status: RunStatus,
    pub title: String,
    pub objective: String,
    pub input: Value,
    pub context: Value,
    pub provider: Option<String>,
    pub model: Option<String>,
    pub request_id: Option<String>,
    pub created_by: String,
}

/// A step to append; `step_index` is assigned by the store.
#[derive(Debug, Clone)]
pub struct NewStep {
    pub step_type: StepType,
    pub status: StepStatus,
    pub name: String,
    pub input: Value,
    pub output: Option<Value>,
    pub error: Option<String>,
    pub started_at: Option<Timestamp>,
    pub completed_at: Option<Timestamp>,
    pub duration_ms: Option<u64>,
}

impl NewStep {
    /// A step that starts now in `running` status.
    pub fn running(step_type: StepType, name: impl Into<String>, input: Value) -> NewStep {
        NewStep {
            step_type,
            status: StepStatus::Running,
            name: name.into(),
            input,
            output: None,
            error: None,
            started_at: Some(Utc::now()),
            completed_at: None,
            duration_ms: None,
        }
    }

    /// A step that already ran from `started_at` until now.
    pub fn finished(
        step_type: StepType,
        name: impl Into<String>,
        input: Value,
        started_at: Timestamp,
        outcome: Result<Value, String>,
    ) -> NewStep {
        let now = Utc::now();
        let duration_ms = (now - started_at).num_milliseconds().max(0) as u64;
        let (status, output, error) = match outcome {
            Ok(v) => (StepStatus::Completed, Some(v), None),
            Err(e) => (StepStatus::Failed, None, Some(e)),
        };
        NewStep {
            step_type,
            status,
            name: name.into(),
            input,
            output,
            error,
            started_at: Some(started_at),
            completed_at: Some(now),
            duration_ms: Some(duration_ms),
        }
    }
}

/// Evidence to attach to a run; the hash is computed on insert.
#[derive(Debug, Clone)]
pub struct NewEvidence {
    /// The step it came from; set by [`Store::append_step_with_evidence`].
    pub step_id: Option<i64>,
    pub evidence_type: EvidenceType,
    pub source: String,
    pub title: String,
    pub url: Option<String>,
    pub content: String,
    pub metadata: Value,
}

/// A proposal to insert.
#[derive(Debug, Clone)]
pub struct NewProposal {
    pub run_id: i64,
    pub proposal_type: ProposalType,
    pub status: ProposalStatus,
    pub risk_level: ProposalRiskLevel,
    pub target: Value,
    pub before_payload: Value,
    pub after_payload: Value,
    pub rationale: String,
    pub policy_result: Value,
    pub error: Option<String>,
}

/// The final state of a run.
#[derive(Debug, Clone)]
pub struct RunFinish {
    pub status: RunStatus,
    pub result_markdown: Option<String>,
    pub result_json: Option<Value>,
    pub error: Option<String>,
}

/// Filters of `GET /runs`.
#[derive(Debug, Clone, Default)]
pub struct RunFilter {
    pub run_type: Option<RunType>,
    pub status: Option<RunStatus>,
    pub created_by: Option<String>,
    /// Only runs with a store id below this (paging, newest first).
    pub before_id: Option<i64>,
    pub limit: usize,
}

/// The audio a transcription was made from (kept as metadata only; the
/// audio itself is not stored).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AudioInfo {
    pub file_name: Option<String>,
    pub content_type: Option<String>,
    pub size_bytes: u64,
    /// Lowercase hex sha256 of the uploaded bytes.
    pub sha256: String,
}

/// A stored speech transcription; an Earth command's `transcription_id`
/// names one (`tr_` and 32 hex digits).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TranscriptionRecord {
    pub transcription_id: String,
    pub text: String,
    pub language: String,
    pub provider: String,
    pub model: String,
    /// What the audio was recorded for, e.g. `earth_command`.
    pub source: String,
    /// Audio length, ms (0 when the provider did not say).
    pub duration_ms: u64,
    pub confidence: Option<f64>,
    pub metadata: Value,
    pub audio: AudioInfo,
    pub created_by: String,
    pub created_at: Timestamp,
}

/// A stored setting a proposal may change (`datasource_config`, `ai_prompt`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SettingRecord {
    pub kind: String,
    pub key: String,
    pub value: Value,
    pub updated_at: Timestamp,
    pub updated_by: String,
}

fn corrupt(table: &'static str, id: i64, message: impl Into<String>) -> StoreError {
    StoreError::Corrupt {
        table,
        id,
        message: message.into(),
    }
}

fn parse_enum<T: std::str::FromStr>(table: &'static str, id: i64, v: &str) -> Result<T, StoreError>
where
    T::Err: std::fmt::Display,
{
    v.parse::<T>()
        .map_err(|e| corrupt(table, id, e.to_string()))
}

fn parse_json(table: &'static str, id: i64, v: &str) -> Result<Value, StoreError> {
    serde_json::from_str(v).map_err(|e| corrupt(table, id, format!("bad JSON: {e}")))
}

fn parse_ts(table: &'static str, id: i64, v: &str) -> Result<Timestamp, StoreError> {
    chrono::DateTime::parse_from_rfc3339(v)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| corrupt(table, id, format!("bad time `{v}`: {e}")))
}

fn parse_ts_opt(
    table: &'static str,
    id: i64,
    v: Option<String>,
) -> Result<Option<Timestamp>, StoreError> {
    v.map(|s| parse_ts(table, id, &s)).transpose()
}

fn json_text(v: &Value) -> String {
    v.to_string()
}

const RUN_COLUMNS: &str = "id, public_id, run_type, status, title, objective, input, context, \
    result_markdown, result_json, provider, model, request_id, created_by, created_at, \
    updated_at, completed_at, error";

type RawRun = (
    i64,
    String,
    String,
    String,
    String,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<String>,
    String,
    String,
    String,
    Option<String>,
    Option<String>,
);

fn raw_run(r: &Row<'_>) -> rusqlite::Result<RawRun> {
    Ok((
        r.get(0)?,
        r.get(1)?,
        r.get(2)?,
        r.get(3)?,
        r.get(4)?,
        r.get(5)?,
        r.get(6)?,
        r.get(7)?,
        r.get(8)?,
        r.get(9)?,
        r.get(10)?,
        r.get(11)?,
        r.get(12)?,
        r.get(13)?,
        r.get(14)?,
        r.get(15)?,
        r.get(16)?,
        r.get(17)?,
    ))
}

fn decode_run(raw: RawRun) -> Result<AgentRun, StoreError> {
    const T: &str = "agent_runs";
    let id = raw.0;
    Ok(AgentRun {
        id,
        public_id: raw.1,
        run_type: parse_enum(T, id, &raw.2)?,
        status: parse_enum(T, id, &raw.3)?,
        title: raw.4,
        objective: raw.5,
        input: parse_json(T, id, &raw.6)?,
        context: parse_json(T, id, &raw.7)?,
        result_markdown: raw.8,
        result_json: raw.9.map(|s| parse_json(T, id, &s)).transpose()?,
        provider: raw.10,
        model: raw.11,
        request_id: raw.12,
        created_by: raw.13,
        created_at: parse_ts(T, id, &raw.14)?,
        updated_at: parse_ts(T, id, &raw.15)?,
        completed_at: parse_ts_opt(T, id, raw.16)?,
        error: raw.17,
    })
}

/// The run with this public id.
pub fn get_run_sync(conn: &Connection, public_id: &str) -> Result<Option<AgentRun>, StoreError> {
    let raw = conn
        .query_row(
            &format!("SELECT {RUN_COLUMNS} FROM agent_runs WHERE public_id = ?1"),
            [public_id],
            raw_run,
        )
        .optional()?;
    raw.map(decode_run).transpose()
}

fn get_run_by_id(conn: &Connection, id: i64) -> Result<AgentRun, StoreError> {
    let raw = conn.query_row(
        &format!("SELECT {RUN_COLUMNS} FROM agent_runs WHERE id = ?1"),
        [id],
        raw_run,
    )?;
    decode_run(raw)
}

fn insert_run(conn: &Connection, new: &NewRun) -> Result<AgentRun, StoreError> {
    let now = ts(Utc::now());
    let public_id = new_run_id();
    conn.execute(
        "INSERT INTO agent_runs (public_id, run_type, status, title, objective, input, context,
             provider, model, request_id, created_by, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?12)",
        params![
            public_id,
            new.run_type.as_str(),
            new.status.as_str(),
            new.title,
            new.objective,
            json_text(&new.input),
            json_text(&new.context),
            new.provider,
            new.model,
            new.request_id,
            new.created_by,
            now,
        ],
    )?;
    get_run_by_id(conn, conn.last_insert_rowid())
}

fn run_status(conn: &Connection, run_id: i64) -> Result<(String, RunStatus), StoreError> {
    let (public_id, status): (String, String) = conn
        .query_row(
            "SELECT public_id, status FROM agent_runs WHERE id = ?1",
            [run_id],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?
        .ok_or_else(|| StoreError::NotFound {
            kind: "run",
            id: run_id.to_string(),
        })?;
    Ok((
        public_id.clone(),
        parse_enum("agent_runs", run_id, &status)?,
    ))
}

// Steps, evidence and proposals answer with the run's public id as
// `run_id` (the tables keep the integer key in their `run_id` column).
const STEP_COLUMNS: &str =
    "id, (SELECT public_id FROM agent_runs WHERE agent_runs.id = agent_steps.run_id), step_index, step_type, status, name, input, output, error, \
    started_at, completed_at, duration_ms";

fn decode_step(r: &Row<'_>) -> rusqlite::Result<Result<AgentStep, StoreError>> {
    const T: &str = "agent_steps";
    let id: i64 = r.get(0)?;
    let step_type: String = r.get(3)?;
    let status: String = r.get(4)?;
    let input: String = r.get(6)?;
    let output: Option<String> = r.get(7)?;
    let started: Option<String> = r.get(9)?;
    let completed: Option<String> = r.get(10)?;
    let duration: Option<i64> = r.get(11)?;
    let run_id: String = r.get(1)?;
    let step_index: i64 = r.get(2)?;
    let name: String = r.get(5)?;
    let error: Option<String> = r.get(8)?;
    Ok((|| {
        Ok(AgentStep {
            id,
            run_id,
            step_index: u32::try_from(step_index)
                .map_err(|_| corrupt(T, id, "negative step_index"))?,
            step_type: parse_enum(T, id, &step_type)?,
            status: parse_enum(T, id, &status)?,
            name,
            input: parse_json(T, id, &input)?,
            output: output.map(|s| parse_json(T, id, &s)).transpose()?,
            error,
            started_at: parse_ts_opt(T, id, started)?,
            completed_at: parse_ts_opt(T, id, completed)?,
            duration_ms: duration.map(|d| d.max(0) as u64),
        })
    })())
}

fn get_step(conn: &Connection, step_id: i64) -> Result<AgentStep, StoreError> {
    conn.query_row(
        &format!("SELECT {STEP_COLUMNS} FROM agent_steps WHERE id = ?1"),
        [step_id],
        decode_step,
    )?
}

fn insert_step(conn: &Connection, run_id: i64, step: &NewStep) -> Result<AgentStep, StoreError> {
    let (public_id, status) = run_status(conn, run_id)?;
    if status.is_final() {
        return Err(StoreError::RunFinal {
            run_id: public_id,
            status,
        });
    }
    let next: i64 = conn.query_row(
        "SELECT COALESCE(MAX(step_index) + 1, 0) FROM agent_steps WHERE run_id = ?1",
        [run_id],
        |r| r.get(0),
    )?;
    conn.execute(
        "INSERT INTO agent_steps (run_id, step_index, step_type, status, name, input, output,
             error, started_at, completed_at, duration_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            run_id,
            next,
            step.step_type.as_str(),
            step.status.as_str(),
            step.name,
            json_text(&step.input),
            step.output.as_ref().map(json_text),
            step.error,
            step.started_at.map(ts),
            step.completed_at.map(ts),
            step.duration_ms.map(|d| d as i64),
        ],
    )?;
    conn.execute(
        "UPDATE agent_runs SET updated_at = ?2 WHERE id = ?1",
        params![run_id, ts(Utc::now())],
    )?;
    get_step(conn, conn.last_insert_rowid())
}

fn insert_evidence(conn: &Connection, run_id: i64, ev: &NewEvidence) -> Result<i64, StoreError> {
    conn.execute(
        "INSERT INTO agent_evidence (run_id, step_id, evidence_type, source, title, url, content,
             content_hash, metadata, retrieved_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            run_id,
            ev.step_id,
            ev.evidence_type.as_str(),
            ev.source,
            ev.title,
            ev.url,
            ev.content,
            content_hash(&ev.content),
            json_text(&ev.metadata),
            ts(Utc::now()),
        ],
    )?;
    Ok(conn.last_insert_rowid())
}

fn decode_evidence(r: &Row<'_>) -> rusqlite::Result<Result<AgentEvidence, StoreError>> {
    const T: &str = "agent_evidence";
    let id: i64 = r.get(0)?;
    let run_id: String = r.get(1)?;
    let step_id: Option<i64> = r.get(2)?;
    let et: String = r.get(3)?;
    let source: String = r.get(4)?;
    let title: String = r.get(5)?;
    let url: Option<String> = r.get(6)?;
    let content: String = r.get(7)?;
    let hash: Option<String> = r.get(8)?;
    let metadata: String = r.get(9)?;
    let retrieved: String = r.get(10)?;
    Ok((|| {
        Ok(AgentEvidence {
            id,
            run_id,
            step_id,
            evidence_type: parse_enum(T, id, &et)?,
            source,
            title,
            url,
            content,
            content_hash: hash,
            metadata: parse_json(T, id, &metadata)?,
            retrieved_at: parse_ts(T, id, &retrieved)?,
        })
    })())
}

const PROPOSAL_COLUMNS: &str = "id, \
    (SELECT public_id FROM agent_runs WHERE agent_runs.id = agent_proposals.run_id), proposal_type, status, risk_level, target, \
    before_payload, after_payload, rationale, policy_result, applied_by, applied_at, error";

fn decode_proposal(r: &Row<'_>) -> rusqlite::Result<Result<AgentProposal, StoreError>> {
    const T: &str = "agent_proposals";
    let id: i64 = r.get(0)?;
    let run_id: String = r.get(1)?;
    let pt: String = r.get(2)?;
    let st: String = r.get(3)?;
    let risk: String = r.get(4)?;
    let target: String = r.get(5)?;
    let before: String = r.get(6)?;
    let after: String = r.get(7)?;
    let rationale: String = r.get(8)?;
    let policy: String = r.get(9)?;
    let applied_by: Option<String> = r.get(10)?;
    let applied_at: Option<String> = r.get(11)?;
    let error: Option<String> = r.get(12)?;
    Ok((|| {
        Ok(AgentProposal {
            id,
            run_id,
            proposal_type: parse_enum(T, id, &pt)?,
            status: parse_enum(T, id, &st)?,
            risk_level: parse_enum(T, id, &risk)?,
            target: parse_json(T, id, &target)?,
            before_payload: parse_json(T, id, &before)?,
            after_payload: parse_json(T, id, &after)?,
            rationale,
            policy_result: parse_json(T, id, &policy)?,
            applied_by,
            applied_at: parse_ts_opt(T, id, applied_at)?,
            error,
        })
    })())
}

/// The proposal with this id.
pub fn get_proposal_sync(conn: &Connection, id: i64) -> Result<Option<AgentProposal>, StoreError> {
    conn.query_row(
        &format!("SELECT {PROPOSAL_COLUMNS} FROM agent_proposals WHERE id = ?1"),
        [id],
        decode_proposal,
    )
    .optional()?
    .transpose()
}

/// Insert a proposal (inside the caller's transaction, if any).
pub fn insert_proposal_sync(
    conn: &Connection,
    p: &NewProposal,
) -> Result<AgentProposal, StoreError> {
    conn.execute(
        "INSERT INTO agent_proposals (run_id, proposal_type, status, risk_level, target,
             before_payload, after_payload, rationale, policy_result, error)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            p.run_id,
            p.proposal_type.as_str(),
            p.status.as_str(),
            p.risk_level.as_str(),
            json_text(&p.target),
            json_text(&p.before_payload),
            json_text(&p.after_payload),
            p.rationale,
            json_text(&p.policy_result),
            p.error,
        ],
    )?;
    let id = conn.last_insert_rowid();
    get_proposal_sync(conn, id)?.ok_or(StoreError::NotFound {
        kind: "proposal",
        id: id.to_string(),
    })
}

/// Record the outcome of applying (or refusing) a proposal.
#[derive(Debug, Clone)]
pub struct ProposalOutcome {
    pub status: ProposalStatus,
    pub policy_result: Value,
    pub before_payload: Option<Value>,
    pub applied_by: Option<String>,
    pub applied: bool,
    pub error: Option<String>,
}

/// Update a proposal with an outcome (inside the caller's transaction).
pub fn update_proposal_sync(
    conn: &Connection,
    id: i64,
    o: &ProposalOutcome,
) -> Result<AgentProposal, StoreError> {
    conn.execute(
        "UPDATE agent_proposals SET status = ?2, policy_result = ?3,
             before_payload = COALESCE(?4, before_payload),
             applied_by = COALESCE(?5, applied_by),
             applied_at = CASE WHEN ?6 THEN ?7 ELSE applied_at END,
             error = ?8
         WHERE id = ?1",
        params![
            id,
            o.status.as_str(),
            json_text(&o.policy_result),
            o.before_payload.as_ref().map(json_text),
            o.applied_by,
            o.applied,
            ts(Utc::now()),
            o.error,
        ],
    )?;
    get_proposal_sync(conn, id)?.ok_or(StoreError::NotFound {
        kind: "proposal",
        id: id.to_string(),
    })
}

/// A setting's current value.
pub fn get_setting_sync(
    conn: &Connection,
    kind: &str,
    key: &str,
) -> Result<Option<SettingRecord>, StoreError> {
    let row: Option<(String, String, String)> = conn
        .query_row(
            "SELECT value, updated_at, updated_by FROM agent_settings WHERE kind = ?1 AND key = ?2",
            params![kind, key],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?;
    row.map(|(value, at, by)| {
        Ok(SettingRecord {
            kind: kind.to_string(),
            key: key.to_string(),
            value: parse_json("agent_settings", 0, &value)?,
            updated_at: parse_ts("agent_settings", 0, &at)?,
            updated_by: by,
        })
    })
    .transpose()
}

/// Replace a setting's value.
pub fn put_setting_sync(
    conn: &Connection,
    kind: &str,
    key: &str,
    value: &Value,
    by: &str,
) -> Result<(), StoreError> {
    conn.execute(
        "INSERT INTO agent_settings (kind, key, value, updated_at, updated_by)
         VALUES (?1, ?2, ?3, ?4, ?5)
         ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value,
             updated_at = excluded.updated_at, updated_by = excluded.updated_by",
        params![kind, key, json_text(value), ts(Utc::now()), by],
    )?;
    Ok(())
}

/// Handle to the agent tables. Cheap to clone. Each run or proposal
/// change it commits is handed to its [`AgentEventSink`] afterwards.
#[derive(Clone)]
pub struct Store {
    db: Db,
    events: std::sync::Arc<dyn AgentEventSink>,
}

impl Store {
    /// Wraps the registry database (its migrations must include [`migrate`]),
    /// with no event sink.
    pub fn new(db: Db) -> Store {
        Store {
            db,
            events: std::sync::Arc::new(NoEvents),
        }
    }

    /// The same store handing its events to `sink`.
    pub fn with_events(mut self, sink: std::sync::Arc<dyn AgentEventSink>) -> Store {
        self.events = sink;
        self
    }

    /// Hand `event` to the sink.
    pub(crate) fn publish(&self, event: AgentEvent) {
        self.events.publish(event);
    }

    /// Publish `agent_proposal_created` (`created`) or
    /// `agent_proposal_updated` for proposal `id` as it now stands, caused
    /// by `actor`. For changes made with [`Store::db`] directly (the
    /// proposal functions of [`crate::proposals`]). A proposal that cannot
    /// be read is logged and skipped.
    pub async fn publish_proposal(&self, id: i64, created: bool, actor: &str) {
        match self.get_proposal(id).await {
            Ok(Some(p)) => self.publish(AgentEvent::proposal(&p, created, actor)),
            Ok(None) => {}
            Err(e) => tracing::warn!(proposal_id = id, error = %e, "proposal event skipped"),
        }
    }

    /// The underlying database.
    pub fn db(&self) -> &Db {
        &self.db
    }

    /// Create a run.
    pub async fn create_run(&self, new: NewRun) -> Result<AgentRun, StoreError> {
        let run = self.db.write(move |conn| insert_run(conn, &new)).await??;
        self.publish(AgentEvent::run_created(&run));
        Ok(run)
    }

    /// The run with this public id, if any.
    pub async fn get_run(&self, public_id: &str) -> Result<Option<AgentRun>, StoreError> {
        let id = public_id.to_string();
        self.db.read(move |conn| get_run_sync(conn, &id)).await?
    }

    /// A run with its steps (in `step_index` order), evidence and proposals.
    pub async fn get_run_detail(
        &self,
        public_id: &str,
    ) -> Result<Option<AgentRunDetail>, StoreError> {
        let id = public_id.to_string();
        self.db
            .read(move |conn| -> Result<Option<AgentRunDetail>, StoreError> {
                let Some(run) = get_run_sync(conn, &id)? else {
                    return Ok(None);
                };
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {STEP_COLUMNS} FROM agent_steps WHERE run_id = ?1 ORDER BY step_index"
                ))?;
                let steps = stmt
                    .query_map([run.id], decode_step)?
                    .collect::<rusqlite::Result<Vec<_>>>()?
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()?;
                let mut stmt = conn.prepare_cached(
                    "SELECT id,
                            (SELECT public_id FROM agent_runs
                              WHERE agent_runs.id = agent_evidence.run_id),
                            step_id, evidence_type, source, title, url, content,
                            content_hash, metadata, retrieved_at
                     FROM agent_evidence WHERE run_id = ?1 ORDER BY id",
                )?;
                let evidence = stmt
                    .query_map([run.id], decode_evidence)?
                    .collect::<rusqlite::Result<Vec<_>>>()?
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()?;
                let mut stmt = conn.prepare_cached(&format!(
                    "SELECT {PROPOSAL_COLUMNS} FROM agent_proposals WHERE run_id = ?1 ORDER BY id"
                ))?;
                let proposals = stmt
                    .query_map([run.id], decode_proposal)?
                    .collect::<rusqlite::Result<Vec<_>>>()?
                    .into_iter()
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Some(AgentRunDetail {
                    run,
                    steps,
                    evidence,
                    proposals,
                }))
            })
            .await?
    }

    /// Runs matching `filter`, newest first, at most `filter.limit`.
    pub async fn list_runs(&self, filter: RunFilter) -> Result<Vec<AgentRun>, StoreError> {
        self.db
            .read(move |conn| -> Result<Vec<AgentRun>, StoreError> {
                let mut sql = format!("SELECT {RUN_COLUMNS} FROM agent_runs WHERE 1 = 1");
                let mut args: Vec<rusqlite::types::Value> = Vec::new();
                if let Some(t) = filter.run_type {
                    args.push(t.as_str().to_string().into());
                    sql.push_str(&format!(" AND run_type = ?{}", args.len()));
                }
                if let Some(s) = filter.status {
                    args.push(s.as_str().to_string().into());
                    sql.push_str(&format!(" AND status = ?{}", args.len()));
                }
                if let Some(c) = filter.created_by {
                    args.push(c.into());
                    sql.push_str(&format!(" AND created_by = ?{}", args.len()));
                }
                if let Some(b) = filter.before_id {
                    args.push(b.into());
                    sql.push_str(&format!(" AND id < ?{}", args.len()));
                }
                args.push((filter.limit as i64).into());
                sql.push_str(&format!(" ORDER BY id DESC LIMIT ?{}", args.len()));
                let mut stmt = conn.prepare(&sql)?;
                let raws = stmt
                    .query_map(registry_core::sql::params_from_iter(args), raw_run)?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                raws.into_iter().map(decode_run).collect()
            })
            .await?
    }

    /// Set a non-final run's status (e.g. `running`). Refused for final runs.
    pub async fn set_run_status(
        &self,
        run_id: i64,
        status: RunStatus,
    ) -> Result<AgentRun, StoreError> {
        let run = self
            .db
            .write(move |conn| -> Result<AgentRun, StoreError> {
                let (public_id, current) = run_status(conn, run_id)?;
                if current.is_final() {
                    return Err(StoreError::RunFinal {
                        run_id: public_id,
                        status: current,
                    });
                }
                conn.execute(
                    "UPDATE agent_runs SET status = ?2, updated_at = ?3 WHERE id = ?1",
                    params![run_id, status.as_str(), ts(Utc::now())],
                )?;
                get_run_by_id(conn, run_id)
            })
            .await??;
        self.publish(AgentEvent::run_updated(&run, None));
        Ok(run)
    }

    /// Append one step (with its evidence, linked to it) in one transaction.
    /// Refused with [`StoreError::RunFinal`] when the run has ended.
    pub async fn append_step_with_evidence(
        &self,
        run_id: i64,
        step: NewStep,
        evidence: Vec<NewEvidence>,
    ) -> Result<AgentStep, StoreError> {
        let (saved, run) = self
            .db
            .write(move |conn| -> Result<(AgentStep, AgentRun), StoreError> {
                let tx = conn.transaction()?;
                let saved = insert_step(&tx, run_id, &step)?;
                for mut ev in evidence {
                    ev.step_id = Some(saved.id);
                    insert_evidence(&tx, run_id, &ev)?;
                }
                let run = get_run_by_id(&tx, run_id)?;
                tx.commit()?;
                Ok((saved, run))
            })
            .await??;
        self.publish(AgentEvent::run_updated(&run, Some(&saved)));
        Ok(saved)
    }

    /// Append one step.
    pub async fn append_step(&self, run_id: i64, step: NewStep) -> Result<AgentStep, StoreError> {
        self.append_step_with_evidence(run_id, step, Vec::new())
            .await
    }

    /// Finish a `running`/`pending` step: `completed` with the output or
    /// `failed` with the error, `completed_at`/`duration_ms` from its
    /// `started_at`. A step that already ended (e.g. failed by `stop`) is
    /// left as it is; returns false then.
    pub async fn finish_step(
        &self,
        step_id: i64,
        outcome: Result<Value, String>,
        evidence: Vec<NewEvidence>,
    ) -> Result<bool, StoreError> {
        let (status, output, error) = match outcome {
            Ok(v) => (StepStatus::Completed, Some(v), None),
            Err(e) => (StepStatus::Failed, None, Some(e)),
        };
        self.finish_step_with(step_id, status, output, error, evidence)
            .await
    }

    /// [`Store::finish_step`] with every field given (e.g. `failed` with the
    /// model's output kept for review).
    pub async fn finish_step_with(
        &self,
        step_id: i64,
        status: StepStatus,
        output: Option<Value>,
        error: Option<String>,
        evidence: Vec<NewEvidence>,
    ) -> Result<bool, StoreError> {
        let changed = self
            .db
            .write(
                move |conn| -> Result<Option<(AgentStep, AgentRun)>, StoreError> {
                    let tx = conn.transaction()?;
                    let now = Utc::now();
                    let (run_id, started): (i64, Option<String>) = tx.query_row(
                        "SELECT run_id, started_at FROM agent_steps WHERE id = ?1",
                        [step_id],
                        |r| Ok((r.get(0)?, r.get(1)?)),
                    )?;
                    let duration = started
                        .and_then(|s| chrono::DateTime::parse_from_rfc3339(&s).ok())
                        .map(|s| (now - s.with_timezone(&Utc)).num_milliseconds().max(0));
                    let changed = tx.execute(
                    "UPDATE agent_steps SET status = ?2, output = ?3, error = ?4, completed_at = ?5,
                         duration_ms = ?6
                     WHERE id = ?1 AND status IN ('running', 'pending')",
                    params![
                        step_id,
                        status.as_str(),
                        output.as_ref().map(json_text),
                        error,
                        ts(now),
                        duration,
                    ],
                )?;
                    if changed == 0 {
                        return Ok(None);
                    }
                    for mut ev in evidence {
                        ev.step_id = Some(step_id);
                        insert_evidence(&tx, run_id, &ev)?;
                    }
                    let step = get_step(&tx, step_id)?;
                    let run = get_run_by_id(&tx, run_id)?;
                    tx.commit()?;
                    Ok(Some((step, run)))
                },
            )
            .await??;
        match changed {
            Some((step, run)) => {
                self.publish(AgentEvent::run_updated(&run, Some(&step)));
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Append final steps and end the run in one transaction. A run that is
    /// already final (stopped meanwhile) is left as it is and
    /// [`StoreError::RunFinal`] is returned.
    pub async fn finish_run(
        &self,
        run_id: i64,
        steps: Vec<(NewStep, Vec<NewEvidence>)>,
        finish: RunFinish,
    ) -> Result<AgentRun, StoreError> {
        let run = self
            .db
            .write(move |conn| -> Result<AgentRun, StoreError> {
                let tx = conn.transaction()?;
                for (step, evidence) in &steps {
                    let saved = insert_step(&tx, run_id, step)?;
                    for ev in evidence {
                        let mut ev = ev.clone();
                        ev.step_id = Some(saved.id);
                        insert_evidence(&tx, run_id, &ev)?;
                    }
                }
                let (public_id, current) = run_status(&tx, run_id)?;
                if current.is_final() {
                    return Err(StoreError::RunFinal {
                        run_id: public_id,
                        status: current,
                    });
                }
                let now = ts(Utc::now());
                let completed_at = finish.status.is_final().then(|| now.clone());
                tx.execute(
                    "UPDATE agent_runs SET status = ?2, result_markdown = ?3, result_json = ?4,
                         error = ?5, updated_at = ?6, completed_at = ?7
                     WHERE id = ?1",
                    params![
                        run_id,
                        finish.status.as_str(),
                        finish.result_markdown,
                        finish.result_json.as_ref().map(json_text),
                        finish.error,
                        now,
                        completed_at,
                    ],
                )?;
                let run = get_run_by_id(&tx, run_id)?;
                tx.commit()?;
                Ok(run)
            })
            .await??;
        self.publish(AgentEvent::run_updated(&run, None));
        Ok(run)
    }

    /// Stop a run that has not ended: status `stopped`, its `running` steps
    /// `failed` and `pending` steps `skipped`, all with an error naming
    /// `by`. Errors: [`StoreError::NotFound`], [`StoreError::RunFinal`].
    pub async fn stop_run(&self, public_id: &str, by: &str) -> Result<AgentRun, StoreError> {
        let public_id = public_id.to_string();
        let by = by.to_string();
        let run = self
            .db
            .write(move |conn| -> Result<AgentRun, StoreError> {
                let tx = conn.transaction()?;
                let run = get_run_sync(&tx, &public_id)?.ok_or_else(|| StoreError::NotFound {
                    kind: "run",
                    id: public_id.clone(),
                })?;
                if run.status.is_final() {
                    return Err(StoreError::RunFinal {
                        run_id: public_id,
                        status: run.status,
                    });
                }
                let now = Utc::now();
                let msg = format!("run stopped by {by}");
                let elapsed = tx.millis_between("?3", "started_at");
                tx.execute(
                    &format!(
                        "UPDATE agent_steps SET status = 'failed', error = ?2, completed_at = ?3,
                             duration_ms = {elapsed}
                         WHERE run_id = ?1 AND status = 'running'"
                    ),
                    params![run.id, msg, ts(now)],
                )?;
                tx.execute(
                    "UPDATE agent_steps SET status = 'skipped', error = ?2, completed_at = ?3
                     WHERE run_id = ?1 AND status = 'pending'",
                    params![run.id, msg, ts(now)],
                )?;
                tx.execute(
                    "UPDATE agent_runs SET status = 'stopped', error = ?2, updated_at = ?3,
                         completed_at = ?3
                     WHERE id = ?1",
                    params![run.id, msg, ts(now)],
                )?;
                let run = get_run_by_id(&tx, run.id)?;
                tx.commit()?;
                Ok(run)
            })
            .await??;
        self.publish(AgentEvent::run_updated(&run, None));
        Ok(run)
    }

    /// Mark runs left `queued`/`running` by a previous process as failed
    /// (their loops died with it). Returns how many.
    pub async fn fail_interrupted_runs(&self) -> Result<usize, StoreError> {
        self.db
            .write(|conn| -> Result<usize, StoreError> {
                let tx = conn.transaction()?;
                let now = ts(Utc::now());
                tx.execute(
                    "UPDATE agent_steps SET status = 'failed',
                         error = 'the registry restarted while this step ran', completed_at = ?1
                     WHERE status IN ('running', 'pending')",
                    [&now],
                )?;
                let n = tx.execute(
                    "UPDATE agent_runs SET status = 'failed',
                         error = 'the registry restarted while this run was active',
                         updated_at = ?1, completed_at = ?1
                     WHERE status IN ('queued', 'running')",
                    [&now],
                )?;
                tx.commit()?;
                Ok(n)
            })
            .await?
    }

    /// Insert a proposal.
    pub async fn insert_proposal(&self, p: NewProposal) -> Result<AgentProposal, StoreError> {
        let saved = self
            .db
            .write(move |conn| insert_proposal_sync(conn, &p))
            .await??;
        let actor = match self.get_run(&saved.run_id).await {
            Ok(Some(r)) => r.created_by,
            _ => "system".to_string(),
        };
        self.publish(AgentEvent::proposal(&saved, true, actor));
        Ok(saved)
    }

    /// The proposal with this id.
    pub async fn get_proposal(&self, id: i64) -> Result<Option<AgentProposal>, StoreError> {
        self.db
            .read(move |conn| get_proposal_sync(conn, id))
            .await?
    }

    /// Proposals, newest first, optionally only those with `status`.
    pub async fn list_proposals(
        &self,
        status: Option<ProposalStatus>,
        limit: usize,
    ) -> Result<Vec<AgentProposal>, StoreError> {
        self.db
            .read(move |conn| -> Result<Vec<AgentProposal>, StoreError> {
                let mut stmt = conn.prepare(&format!(
                    "SELECT {PROPOSAL_COLUMNS} FROM agent_proposals
                     WHERE ?1 IS NULL OR status = ?1 ORDER BY id DESC LIMIT ?2"
                ))?;
                let rows = stmt
                    .query_map(
                        params![status.map(|s| s.as_str()), limit as i64],
                        decode_proposal,
                    )?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                rows.into_iter().collect()
            })
            .await?
    }

    /// Every setting of `kind`.
    pub async fn list_settings(&self, kind: &str) -> Result<Vec<SettingRecord>, StoreError> {
        let kind = kind.to_string();
        self.db
            .read(move |conn| -> Result<Vec<SettingRecord>, StoreError> {
                let mut stmt =
                    conn.prepare("SELECT key FROM agent_settings WHERE kind = ?1 ORDER BY key")?;
                let keys = stmt
                    .query_map([&kind], |r| r.get::<_, String>(0))?
                    .collect::<rusqlite::Result<Vec<_>>>()?;
                let mut out = Vec::new();
                for k in keys {
                    if let Some(s) = get_setting_sync(conn, &kind, &k)? {
                        out.push(s);
                    }
                }
                Ok(out)
            })
            .await?
    }

    /// A setting's current value.
    pub async fn get_setting(
        &self,
        kind: &str,
        key: &str,
    ) -> Result<Option<SettingRecord>, StoreError> {
        let (kind, key) = (kind.to_string(), key.to_string());
        self.db
            .read(move |conn| get_setting_sync(conn, &kind, &key))
            .await?
    }

    /// Store a transcription.
    pub async fn insert_transcription(&self, t: TranscriptionRecord) -> Result<(), StoreError> {
        self.db
            .write(move |conn| -> Result<(), StoreError> {
                conn.execute(
                    "INSERT INTO agent_transcriptions (public_id, text, language, provider, model,
                         source, duration_ms, confidence, metadata, audio, created_by, created_at)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                    params![
                        t.transcription_id,
                        t.text,
                        t.language,
                        t.provider,
                        t.model,
                        t.source,
                        t.duration_ms as i64,
                        t.confidence,
                        json_text(&t.metadata),
                        serde_json::to_string(&t.audio).unwrap_or_else(|_| "{}".into()),
                        t.created_by,
                        ts(t.created_at),
                    ],
                )?;
                Ok(())
            })
            .await?
    }

    /// The transcription with this id (`tr_…`).
    pub async fn get_transcription(
        &self,
        transcription_id: &str,
    ) -> Result<Option<TranscriptionRecord>, StoreError> {
        let tid = transcription_id.to_string();
        self.db
            .read(move |conn| -> Result<Option<TranscriptionRecord>, StoreError> {
                const T: &str = "agent_transcriptions";
                type Raw = (i64, String, String, String, String, String, i64, Option<f64>, String, String, String, String);
                let raw: Option<Raw> = conn
                    .query_row(
                        "SELECT id, text, language, provider, model, source, duration_ms, confidence,
                                metadata, audio, created_by, created_at
                         FROM agent_transcriptions WHERE public_id = ?1",
                        [&tid],
                        |r| {
                            Ok((
                                r.get(0)?,
                                r.get(1)?,
                                r.get(2)?,
                                r.get(3)?,
                                r.get(4)?,
                                r.get(5)?,
                                r.get(6)?,
                                r.get(7)?,
                                r.get(8)?,
                                r.get(9)?,
                                r.get(10)?,
                                r.get(11)?,
                            ))
                        },
                    )
                    .optional()?;
                let Some(raw) = raw else { return Ok(None) };
                let id = raw.0;
                let audio: AudioInfo = serde_json::from_str(&raw.9)
                    .map_err(|e| corrupt(T, id, format!("bad audio JSON: {e}")))?;
                Ok(Some(TranscriptionRecord {
                    transcription_id: tid,
                    text: raw.1,
                    language: raw.2,
                    provider: raw.3,
                    model: raw.4,
                    source: raw.5,
                    duration_ms: raw.6.max(0) as u64,
                    confidence: raw.7,
                    metadata: parse_json(T, id, &raw.8)?,
                    audio,
                    created_by: raw.10,
                    created_at: parse_ts(T, id, &raw.11)?,
                }))
            })
            .await?
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn store() -> (Store, tempfile::TempDir) {
        let dir = tempfile::tempdir().unwrap();
        let db = Db::open(&dir.path().join("t.db"), |c| migrate(c)).unwrap();
        (Store::new(db), dir)
    }

    fn new_run() -> NewRun {
        NewRun {
            run_type: RunType::Diagnostic,
            status: RunStatus::Running,
            title: "t".into(),
            objective: "o".into(),
            input: json!({}),
            context: json!({}),
            provider: None,
            model: None,
            request_id: None,
            created_by: "alice".into(),
        }
    }

    #[tokio::test]
    async fn steps_are_numbered_in_order_and_a_stopped_run_takes_no_more() {
        let (s, _d) = store();
        let run = s.create_run(new_run()).await.unwrap();
        let a = s
            .append_step(run.id, NewStep::running(StepType::Llm, "chat", json!({})))
            .await
            .unwrap();
        let b = s
            .append_step(
                run.id,
                NewStep::running(StepType::Tool, "earth.list_domains", json!({})),
            )
            .await
            .unwrap();
        assert_eq!((a.step_index, b.step_index), (0, 1));
        let stopped = s.stop_run(&run.public_id, "bob").await.unwrap();
        assert_eq!(stopped.status, RunStatus::Stopped);
        let detail = s.get_run_detail(&run.public_id).await.unwrap().unwrap();
        assert!(detail
            .steps
            .iter()
            .all(|st| st.status == StepStatus::Failed));
        assert!(!s.finish_step(b.id, Ok(json!({})), vec![]).await.unwrap());
        let err = s
            .append_step(run.id, NewStep::running(StepType::Tool, "x", json!({})))
            .await
            .unwrap_err();
        assert!(matches!(err, StoreError::RunFinal { .. }));
        assert!(matches!(
            s.stop_run(&run.public_id, "bob").await.unwrap_err(),
            StoreError::RunFinal { .. }
        ));
    }

    #[tokio::test]
    async fn evidence_carries_the_sha256_of_its_content() {
        let (s, _d) = store();
        let run = s.create_run(new_run()).await.unwrap();
        let ev = NewEvidence {
            step_id: None,
            evidence_type: EvidenceType::EntityMatch,
            source: "tle".into(),
            title: "t".into(),
            url: None,
            content: "abc".into(),
            metadata: json!({}),
        };
        s.append_step_with_evidence(
            run.id,
            NewStep::running(StepType::Tool, "x", json!({})),
            vec![ev],
        )
        .await
        .unwrap();
        let d = s.get_run_detail(&run.public_id).await.unwrap().unwrap();
        assert_eq!(
            d.evidence[0].content_hash.as_deref(),
            Some("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        );
        assert_eq!(d.evidence[0].step_id, Some(d.steps[0].id));
    }
}
