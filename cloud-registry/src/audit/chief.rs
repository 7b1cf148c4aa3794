//! The chief audit (seed 001 §12): its dependencies on other requests and
//! the sub-results it reads instead of raw data.

use crate::sql::{params, Connection};
use serde_json::Value;
use shared_protocol::audit::{AuditRequestStatus, AuditTaskRequest, AuditType};

use super::error::AuditError;
use super::model::SubResult;
use super::sql;

/// Check a new request's `depends_on`: only chief requests name
/// dependencies; each must be an existing request other than itself,
/// named once.
pub(crate) fn check_dependencies(
    conn: &Connection,
    req: &AuditTaskRequest,
) -> Result<(), AuditError> {
    let deps = &req.chief.depends_on;
    if req.audit_type != AuditType::Chief {
        if !deps.is_empty() {
            return Err(AuditError::invalid(
                "depends_on",
                format!(
                    "only chief audits name dependencies; this is a `{}` audit",
                    req.audit_type
                ),
            ));
        }
        return Ok(());
    }
    for (i, dep) in deps.iter().enumerate() {
        let field = format!("depends_on[{i}]");
        shared_protocol::validate::check_id(&field, dep)?;
        if dep == &req.audit_request_id {
            return Err(AuditError::invalid(
                field,
                "a request cannot depend on itself",
            ));
        }
        if deps[..i].contains(dep) {
            return Err(AuditError::invalid(
                field,
                format!("`{dep}` is named twice"),
            ));
        }
        let exists: bool = conn.query_row(
            "SELECT EXISTS (SELECT 1 FROM audit_requests WHERE audit_request_id = ?1)",
            params![dep],
            |r| r.get(0),
        )?;
        if !exists {
            return Err(AuditError::invalid(
                field,
                format!("audit request `{dep}` does not exist; create it first"),
            ));
        }
    }
    Ok(())
}

/// Every dependency of chief request `id`, in `depends_on` order, with its
/// status and newest stored result.
pub(crate) fn sub_results(conn: &Connection, id: &str) -> rusqlite::Result<Vec<SubResult>> {
    let deps: Vec<String> = {
        let mut stmt = conn.prepare_cached(
            "SELECT depends_on FROM audit_dependencies WHERE audit_request_id = ?1
             ORDER BY position",
        )?;
        let rows = stmt.query_map(params![id], |r| r.get(0))?;
        rows.collect::<rusqlite::Result<_>>()?
    };
    let mut out = Vec::with_capacity(deps.len());
    for dep in deps {
        let Some(row) = sql::load_request(conn, &dep)? else {
            continue;
        };
        out.push(SubResult {
            result: sql::latest_result(conn, &dep)?,
            audit_request_id: dep,
            audit_type: row.audit_type,
            request_status: row.status,
            attempts: row.attempts,
        });
    }
    Ok(out)
}

/// Fill the chief request's `software_audit_result`,
/// `hardware_audit_result` and `multimodal_audit_result` from the
/// completed dependencies' results: one result of a type gives the
/// object, several give an array; a type with none keeps what the creator
/// gave.
pub(crate) fn fill_inputs(req: &mut AuditTaskRequest, subs: &[SubResult]) {
    let of_type = |t: AuditType| -> Option<Value> {
        let values: Vec<Value> = subs
            .iter()
            .filter(|s| s.audit_type == t && s.request_status == AuditRequestStatus::Completed)
            .filter_map(|s| s.result.as_ref())
            .filter_map(|r| serde_json::to_value(r).ok())
            .collect();
        match values.len() {
            0 => None,
            1 => values.into_iter().next(),
            _ => Some(Value::Array(values)),
        }
    };
    if let Some(v) = of_type(AuditType::Software) {
        req.chief.software_audit_result = Some(v);
    }
    if let Some(v) = of_type(AuditType::Hardware) {
        req.chief.hardware_audit_result = Some(v);
    }
    if let Some(v) = of_type(AuditType::Multimodal) {
        req.chief.multimodal_audit_result = Some(v);
    }
}
