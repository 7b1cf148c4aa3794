//! The durable copy of the lease model: the `capability_leases` table
//! (seed 001 §14), written together with the events of the same
//! transitions in one transaction.
//!
//! A row holds every field of [`CapabilityLease`] plus the bookkeeping
//! needed to rebuild the queue after a restart: the requested duration,
//! the arrival sequence (`queue_seq`, monotonic), what was asked for
//! (`want`, JSON), the preemption intent and the queue timeout.

use crate::sql::types::Type;
use crate::sql::{params, Connection, OptionalExtension, Row as SqlRow};
use chrono::{SecondsFormat, Utc};
use shared_protocol::event::CapabilityEvent;
use shared_protocol::lease::{CapabilityLease, LeaseStatus};
use shared_protocol::Timestamp;

use super::model::{Book, Row, Want};
use super::LeaseFilter;
use crate::events::{append, NewEvent};

/// Create the `capability_leases` table and its indexes (idempotent).
/// [`super::LeaseEngine::start`] runs it too.
///
/// Indexes, kept few because every commit writes the pages it touches:
/// `queue_seq` (listings are newest first, and filtered listings walk it
/// backwards), and a partial index of the live leases only (what a start
/// loads; it holds only the leases not yet final, so it stays a few
/// pages). Per-capability and per-principal listings scan `queue_seq`
/// backwards and stop at their `limit`; indexes on `capability_id`,
/// `principal` and `status` over the whole history (which put every
/// commit's entries on scattered pages) are dropped by this migration.
pub fn migrate(conn: &Connection) -> rusqlite::Result<()> {
    conn.execute_batch(
        "CREATE TABLE IF NOT EXISTS capability_leases (
            lease_id                   TEXT PRIMARY KEY,
            capability_id              TEXT NOT NULL,
            holder_type                TEXT NOT NULL,
            holder_ref                 TEXT NOT NULL,
            project_id                 TEXT NOT NULL,
            purpose                    TEXT NOT NULL,
            priority                   INTEGER NOT NULL,
            status                     TEXT NOT NULL,
            requested_at               TEXT NOT NULL,
            granted_at                 TEXT,
            expires_at                 TEXT,
            grace_until                TEXT,
            preempt_reason             TEXT,
            evidence_required          INTEGER NOT NULL,
            mode                       TEXT NOT NULL,
            lease_group_id             TEXT,
            preempted_by               TEXT,
            ended_at                   TEXT,
            principal                  TEXT NOT NULL,
            requested_duration_seconds INTEGER NOT NULL,
            queue_seq                  INTEGER NOT NULL,
            want                       TEXT NOT NULL,
            preempt_if_needed          INTEGER NOT NULL,
            request_preempt_reason     TEXT,
            queue_deadline             TEXT,
            pinned_capability_id       TEXT
        );
        CREATE INDEX IF NOT EXISTS capability_leases_seq ON capability_leases(queue_seq);
        DROP INDEX IF EXISTS capability_leases_status;
        DROP INDEX IF EXISTS capability_leases_capability;
        DROP INDEX IF EXISTS capability_leases_principal;",
    )?;
    conn.execute_batch(&format!(
        "CREATE INDEX IF NOT EXISTS capability_leases_live ON capability_leases(queue_seq)
             WHERE {}",
        live_condition()
    ))?;
    // `generation` (the grant order that fences commands to the bench)
    // came later: add it to a table made before.
    let has_generation = conn.has_column("capability_leases", "generation")?;
    if !has_generation {
        conn.execute_batch("ALTER TABLE capability_leases ADD COLUMN generation INTEGER")?;
    }
    Ok(())
}

const COLUMNS: &str = "lease_id, capability_id, holder_type, holder_ref, project_id, purpose,
    priority, status, requested_at, granted_at, expires_at, grace_until, preempt_reason,
    evidence_required, mode, lease_group_id, preempted_by, ended_at, principal,
    requested_duration_seconds, queue_seq, want, preempt_if_needed, request_preempt_reason,
    queue_deadline, pinned_capability_id, generation";

/// Stored form of a time: RFC 3339, UTC, microseconds.
fn ts(t: &Timestamp) -> String {
    t.to_rfc3339_opts(SecondsFormat::Micros, true)
}

fn ts_opt(t: &Option<Timestamp>) -> Option<String> {
    t.as_ref().map(ts)
}

fn bad(col: usize, e: impl std::error::Error + Send + Sync + 'static) -> rusqlite::Error {
    rusqlite::Error::FromSqlConversionFailure(col, Type::Text, Box::new(e))
}

fn parse_ts(col: usize, s: &str) -> rusqlite::Result<Timestamp> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| bad(col, e))
}

fn get_ts(r: &SqlRow<'_>, col: usize) -> rusqlite::Result<Timestamp> {
    parse_ts(col, &r.get::<_, String>(col)?)
}

fn get_ts_opt(r: &SqlRow<'_>, col: usize) -> rusqlite::Result<Option<Timestamp>> {
    r.get::<_, Option<String>>(col)?
        .map(|s| parse_ts(col, &s))
        .transpose()
}

fn get_enum<T: std::str::FromStr<Err = shared_protocol::ValidationError>>(
    r: &SqlRow<'_>,
    col: usize,
) -> rusqlite::Result<T> {
    r.get::<_, String>(col)?.parse().map_err(|e| bad(col, e))
}

fn read_row(r: &SqlRow<'_>) -> rusqlite::Result<Row> {
    let priority: i64 = r.get(6)?;
    let mut lease = CapabilityLease {
        lease_id: r.get(0)?,
        capability_id: r.get(1)?,
        holder_type: get_enum(r, 2)?,
        holder_ref: r.get(3)?,
        project_id: r.get(4)?,
        purpose: r.get(5)?,
        priority: u8::try_from(priority).map_err(|e| bad(6, e))?,
        status: get_enum(r, 7)?,
        requested_at: get_ts(r, 8)?,
        granted_at: get_ts_opt(r, 9)?,
        expires_at: get_ts_opt(r, 10)?,
        grace_until: get_ts_opt(r, 11)?,
        preempt_reason: r.get(12)?,
        evidence_required: r.get(13)?,
        mode: get_enum(r, 14)?,
        lease_group_id: r.get(15)?,
        preempted_by: r.get(16)?,
        ended_at: get_ts_opt(r, 17)?,
        principal: r.get(18)?,
        generation: r
            .get::<_, Option<i64>>(26)?
            .map(|g| u64::try_from(g).map_err(|e| bad(26, e)))
            .transpose()?,
        capability_selector: None,
    };
    let duration: i64 = r.get(19)?;
    let seq: i64 = r.get(20)?;
    let want: String = r.get(21)?;
    let want: Want = serde_json::from_str(&want).map_err(|e| bad(21, e))?;
    lease.capability_selector = want.selector().cloned();
    let book = Book {
        requested_duration_seconds: u32::try_from(duration).map_err(|e| bad(19, e))?,
        queue_seq: u64::try_from(seq).map_err(|e| bad(20, e))?,
        want,
        preempt_if_needed: r.get(22)?,
        request_preempt_reason: r.get(23)?,
        queue_deadline: get_ts_opt(r, 24)?,
        pinned_capability_id: r.get(25)?,
    };
    Ok(Row { lease, book })
}

fn upsert(conn: &Connection, row: &Row) -> rusqlite::Result<()> {
    let l = &row.lease;
    let b = &row.book;
    let want = serde_json::to_string(&b.want)
        .map_err(|e| rusqlite::Error::ToSqlConversionFailure(Box::new(e)))?;
    let mut stmt = conn.prepare_cached(
        "INSERT INTO capability_leases (lease_id, capability_id, holder_type, holder_ref,
             project_id, purpose, priority, status, requested_at, granted_at, expires_at,
             grace_until, preempt_reason, evidence_required, mode, lease_group_id, preempted_by,
             ended_at, principal, requested_duration_seconds, queue_seq, want, preempt_if_needed,
             request_preempt_reason, queue_deadline, pinned_capability_id, generation)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17,
             ?18, ?19, ?20, ?21, ?22, ?23, ?24, ?25, ?26, ?27)
         ON CONFLICT(lease_id) DO UPDATE SET
             capability_id = excluded.capability_id, status = excluded.status,
             granted_at = excluded.granted_at, expires_at = excluded.expires_at,
             grace_until = excluded.grace_until, preempt_reason = excluded.preempt_reason,
             mode = excluded.mode, preempted_by = excluded.preempted_by,
             ended_at = excluded.ended_at, queue_deadline = excluded.queue_deadline,
             pinned_capability_id = excluded.pinned_capability_id,
             generation = excluded.generation",
    )?;
    stmt.execute(params![
        l.lease_id,
        l.capability_id,
        l.holder_type.as_str(),
        l.holder_ref,
        l.project_id,
        l.purpose,
        i64::from(l.priority),
        l.status.as_str(),
        ts(&l.requested_at),
        ts_opt(&l.granted_at),
        ts_opt(&l.expires_at),
        ts_opt(&l.grace_until),
        l.preempt_reason,
        l.evidence_required,
        l.mode.as_str(),
        l.lease_group_id,
        l.preempted_by,
        ts_opt(&l.ended_at),
        l.principal,
        i64::from(b.requested_duration_seconds),
        i64::try_from(b.queue_seq).unwrap_or(i64::MAX),
        want,
        b.preempt_if_needed,
        b.request_preempt_reason,
        ts_opt(&b.queue_deadline),
        b.pinned_capability_id,
        l.generation.map(|g| i64::try_from(g).unwrap_or(i64::MAX)),
    ])?;
    Ok(())
}

/// Write `rows` (each the latest state of its lease) and append `events`,
/// in one transaction. Returns the stored events with their ids.
pub(crate) fn commit(
    conn: &mut Connection,
    rows: &[Row],
    events: Vec<NewEvent>,
    keys: &[super::idempotency::KeyChange],
) -> rusqlite::Result<Vec<CapabilityEvent>> {
    // BEGIN and COMMIT as cached statements: `Connection::transaction`
    // parses both again for every commit.
    conn.prepare_cached("BEGIN")?.execute([])?;
    let written = (|| {
        for row in rows {
            upsert(conn, row)?;
        }
        super::idempotency::write(conn, keys)?;
        let mut stored = Vec::with_capacity(events.len());
        for ev in events {
            stored.push(append(conn, ev)?);
        }
        conn.prepare_cached("COMMIT")?.execute([])?;
        Ok(stored)
    })();
    if written.is_err() && !conn.is_autocommit() {
        if let Err(e) = conn.execute_batch("ROLLBACK") {
            tracing::error!(error = %e, "cannot roll back a failed lease commit");
        }
    }
    written
}

/// The `WHERE` condition of a live (not final) lease, as written in the
/// partial index `capability_leases_live`; a query must spell it the same
/// way for SQLite to use that index.
fn live_condition() -> String {
    let live = LeaseStatus::ALL
        .iter()
        .filter(|s| !s.is_final())
        .map(|s| format!("'{}'", s.as_str()))
        .collect::<Vec<_>>()
        .join(", ");
    format!("status IN ({live})")
}

/// What a start (or a recovery) reads: every lease not in a final status
/// in arrival order, the next `queue_seq` and the next `generation` to
/// use, and the number of stored leases in each status.
pub(crate) type Loaded = (Vec<Row>, u64, u64, Vec<(LeaseStatus, u64)>);

/// Every lease not in a final status, in arrival order, the next
/// `queue_seq` and `generation` to use, and the leases per status.
pub(crate) fn load_live(conn: &Connection) -> rusqlite::Result<Loaded> {
    let sql = format!(
        "SELECT {COLUMNS} FROM capability_leases WHERE {} ORDER BY queue_seq, lease_id",
        live_condition()
    );
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt
        .query_map([], read_row)?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    let max: Option<i64> =
        conn.query_row("SELECT MAX(queue_seq) FROM capability_leases", [], |r| {
            r.get(0)
        })?;
    let next = u64::try_from(max.unwrap_or(0)).unwrap_or(0) + 1;
    let max_generation: Option<i64> =
        conn.query_row("SELECT MAX(generation) FROM capability_leases", [], |r| {
            r.get(0)
        })?;
    let next_generation = u64::try_from(max_generation.unwrap_or(0)).unwrap_or(0) + 1;
    Ok((rows, next, next_generation, counts_by_status(conn)?))
}

/// One lease by id.
pub(crate) fn load_one(
    conn: &Connection,
    lease_id: &str,
) -> rusqlite::Result<Option<CapabilityLease>> {
    let sql = format!("SELECT {COLUMNS} FROM capability_leases WHERE lease_id = ?1");
    let mut stmt = conn.prepare_cached(&sql)?;
    stmt.query_row([lease_id], read_row)
        .optional()
        .map(|r| r.map(|row| row.lease))
}

/// Leases matching `filter`, newest first.
pub(crate) fn list(
    conn: &Connection,
    filter: &LeaseFilter,
) -> rusqlite::Result<Vec<CapabilityLease>> {
    let mut sql = format!("SELECT {COLUMNS} FROM capability_leases WHERE 1 = 1");
    let mut args: Vec<String> = Vec::new();
    if let Some(c) = &filter.capability_id {
        args.push(c.clone());
        sql.push_str(&format!(" AND capability_id = ?{}", args.len()));
    }
    if let Some(p) = &filter.principal {
        args.push(p.clone());
        sql.push_str(&format!(" AND principal = ?{}", args.len()));
    }
    if let Some(s) = filter.status {
        args.push(s.as_str().to_string());
        sql.push_str(&format!(" AND status = ?{}", args.len()));
    }
    if let Some(g) = &filter.lease_group_id {
        args.push(g.clone());
        sql.push_str(&format!(" AND lease_group_id = ?{}", args.len()));
    }
    if filter.active_only {
        let holding = LeaseStatus::ALL
            .iter()
            .filter(|s| s.holds_capability())
            .map(|s| format!("'{}'", s.as_str()))
            .collect::<Vec<_>>()
            .join(", ");
        sql.push_str(&format!(" AND status IN ({holding})"));
    }
    sql.push_str(" ORDER BY queue_seq DESC, lease_id");
    if let Some(limit) = filter.limit {
        sql.push_str(&format!(" LIMIT {limit}"));
    }
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(crate::sql::params_from_iter(args.iter()), read_row)?;
    rows.map(|r| r.map(|row| row.lease)).collect()
}

/// Number of leases in each status, every status listed.
pub(crate) fn counts_by_status(conn: &Connection) -> rusqlite::Result<Vec<(LeaseStatus, u64)>> {
    let mut stmt =
        conn.prepare_cached("SELECT status, COUNT(*) FROM capability_leases GROUP BY status")?;
    let found = stmt
        .query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?
        .collect::<rusqlite::Result<Vec<_>>>()?;
    Ok(LeaseStatus::ALL
        .iter()
        .map(|s| {
            let n = found
                .iter()
                .find(|(name, _)| name == s.as_str())
                .map(|(_, n)| u64::try_from(*n).unwrap_or(0))
                .unwrap_or(0);
            (*s, n)
        })
        .collect())
}
