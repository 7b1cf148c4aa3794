//! The thread registry and inter-thread messages (seed 001 §14
//! `thread_registry`, `inter_thread_messages`): worker and agent threads
//! such as `mac-01:thread-ui-22` that audit requests come from
//! (`source_thread_ref`) and results are handed to (`handoff_target`).

use crate::sql::types::Value as SqlValue;
use crate::sql::{params, params_from_iter, Connection, OptionalExtension, Row};
use chrono::Utc;
use serde_json::Value;

use super::error::AuditError;
use super::model::{MessagePost, ThreadFilter, ThreadMessage, ThreadRecord, ThreadRegistration};
use super::sql::{get_json, get_ts, to_json, ts_text};

const THREAD_COLUMNS: &str =
    "thread_ref, node_id, role, labels, display_name, project_id, registered_by, created_at, updated_at";

fn thread_row(r: &Row<'_>) -> rusqlite::Result<ThreadRecord> {
    Ok(ThreadRecord {
        thread_ref: r.get(0)?,
        node_id: r.get(1)?,
        role: r.get(2)?,
        labels: get_json(r, 3)?,
        display_name: r.get(4)?,
        project_id: r.get(5)?,
        registered_by: r.get(6)?,
        created_at: get_ts(r, 7)?,
        updated_at: get_ts(r, 8)?,
    })
}

/// True when `thread_ref` is registered.
pub(crate) fn exists(conn: &Connection, thread_ref: &str) -> rusqlite::Result<bool> {
    conn.query_row(
        "SELECT EXISTS (SELECT 1 FROM thread_registry WHERE thread_ref = ?1)",
        params![thread_ref],
        |r| r.get(0),
    )
}

/// 422 naming `field` unless `thread_ref` is registered.
pub(crate) fn require_registered(
    conn: &Connection,
    field: &str,
    thread_ref: &str,
) -> Result<(), AuditError> {
    if exists(conn, thread_ref)? {
        Ok(())
    } else {
        Err(AuditError::invalid(
            field,
            format!("thread `{thread_ref}` is not registered (POST /api/v1/threads first)"),
        ))
    }
}

/// The thread `thread_ref`.
pub(crate) fn get(conn: &Connection, thread_ref: &str) -> rusqlite::Result<Option<ThreadRecord>> {
    conn.query_row(
        &format!("SELECT {THREAD_COLUMNS} FROM thread_registry WHERE thread_ref = ?1"),
        params![thread_ref],
        thread_row,
    )
    .optional()
}

/// Register or update a thread; returns it and whether it is new.
pub(crate) fn register(
    conn: &Connection,
    reg: &ThreadRegistration,
    by: &str,
) -> rusqlite::Result<(ThreadRecord, bool)> {
    let now = ts_text(Utc::now());
    let created = !exists(conn, &reg.thread_ref)?;
    conn.execute(
        "INSERT INTO thread_registry (thread_ref, node_id, role, labels, display_name,
             project_id, registered_by, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?8)
         ON CONFLICT(thread_ref) DO UPDATE SET node_id = excluded.node_id,
             role = excluded.role, labels = excluded.labels,
             display_name = excluded.display_name, project_id = excluded.project_id,
             registered_by = excluded.registered_by, updated_at = excluded.updated_at",
        params![
            reg.thread_ref,
            reg.node_id,
            reg.role,
            to_json(&reg.labels)?,
            reg.display_name,
            reg.project_id,
            by,
            now,
        ],
    )?;
    let record = get(conn, &reg.thread_ref)?.ok_or(rusqlite::Error::QueryReturnedNoRows)?;
    Ok((record, created))
}

/// Threads matching `filter`, by `thread_ref`.
pub(crate) fn list(
    conn: &Connection,
    filter: &ThreadFilter,
) -> rusqlite::Result<Vec<ThreadRecord>> {
    let label_clause = format!(
        "EXISTS (SELECT 1 FROM {} WHERE value = ?)",
        conn.json_texts("thread_registry.labels")
    );
    let mut clauses: Vec<&str> = Vec::new();
    let mut args: Vec<SqlValue> = Vec::new();
    if let Some(n) = &filter.node_id {
        clauses.push("node_id = ?");
        args.push(SqlValue::Text(n.clone()));
    }
    if let Some(r) = &filter.role {
        clauses.push("role = ?");
        args.push(SqlValue::Text(r.clone()));
    }
    if let Some(l) = &filter.label {
        clauses.push(&label_clause);
        args.push(SqlValue::Text(l.clone()));
    }
    let where_sql = if clauses.is_empty() {
        String::new()
    } else {
        format!("WHERE {}", clauses.join(" AND "))
    };
    let mut stmt = conn.prepare(&format!(
        "SELECT {THREAD_COLUMNS} FROM thread_registry {where_sql} ORDER BY thread_ref"
    ))?;
    let rows = stmt.query_map(params_from_iter(args.iter()), thread_row)?;
    rows.collect()
}

/// Append a message to `to`'s inbox. The caller has checked that `to`,
/// `from` and the audit request exist.
pub(crate) fn insert_message(
    conn: &Connection,
    to: &str,
    from: Option<&str>,
    sender: &str,
    kind: &str,
    audit_request_id: Option<&str>,
    body: &Value,
) -> rusqlite::Result<ThreadMessage> {
    let now = Utc::now();
    conn.execute(
        "INSERT INTO inter_thread_messages (to_thread_ref, from_thread_ref, sender, kind,
             audit_request_id, body, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![
            to,
            from,
            sender,
            kind,
            audit_request_id,
            body.to_string(),
            ts_text(now)
        ],
    )?;
    Ok(ThreadMessage {
        message_id: conn.last_insert_rowid() as u64,
        to_thread_ref: to.to_string(),
        from_thread_ref: from.map(str::to_string),
        sender: sender.to_string(),
        kind: kind.to_string(),
        audit_request_id: audit_request_id.map(str::to_string),
        body: body.clone(),
        created_at: now,
    })
}

/// Post `msg` to `to` on behalf of `sender`, checking every reference.
pub(crate) fn post(
    conn: &Connection,
    to: &str,
    msg: &MessagePost,
    sender: &str,
) -> Result<ThreadMessage, AuditError> {
    if !exists(conn, to)? {
        return Err(AuditError::not_found("thread", to));
    }
    if let Some(from) = &msg.from_thread_ref {
        require_registered(conn, "from_thread_ref", from)?;
    }
    if let Some(id) = &msg.audit_request_id {
        let known: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM audit_requests WHERE audit_request_id = ?1)",
            params![id],
            |r| r.get(0),
        )?;
        if !known {
            return Err(AuditError::invalid(
                "audit_request_id",
                format!("audit request `{id}` does not exist"),
            ));
        }
    }
    Ok(insert_message(
        conn,
        to,
        msg.from_thread_ref.as_deref(),
        sender,
        &msg.kind,
        msg.audit_request_id.as_deref(),
        &msg.body,
    )?)
}

/// Messages to `to` with `message_id > after`, oldest first, at most
/// `limit`.
pub(crate) fn messages(
    conn: &Connection,
    to: &str,
    after: u64,
    limit: u32,
) -> rusqlite::Result<Vec<ThreadMessage>> {
    let mut stmt = conn.prepare_cached(
        "SELECT message_id, to_thread_ref, from_thread_ref, sender, kind, audit_request_id,
                body, created_at
         FROM inter_thread_messages WHERE to_thread_ref = ?1 AND message_id > ?2
         ORDER BY message_id LIMIT ?3",
    )?;
    let rows = stmt.query_map(
        params![to, i64::try_from(after).unwrap_or(i64::MAX), limit],
        |r| {
            Ok(ThreadMessage {
                message_id: r.get::<_, i64>(0)? as u64,
                to_thread_ref: r.get(1)?,
                from_thread_ref: r.get(2)?,
                sender: r.get(3)?,
                kind: r.get(4)?,
                audit_request_id: r.get(5)?,
                body: get_json(r, 6)?,
                created_at: get_ts(r, 7)?,
            })
        },
    )?;
    rows.collect()
}
