//! Crash recovery at [`Outbox::open`]: half-written files go, a lost rename
//! is redone, files without a row are quarantined in `orphaned/`, rows
//! without a file are marked `lost`, and files whose bytes and metadata
//! were both acknowledged are deleted.

use std::fs;

use super::files::hash_file;
use super::handle::{Outbox, OutboxError};
use super::uploads::UploadState;

/// What [`Outbox::open`] found and repaired.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// Half-written `.part` files deleted (their rows were never committed).
    pub temp_files_removed: usize,
    /// `.part` files whose row was committed but whose rename was lost
    /// (power cut): checked against the row's sha256 and moved into place.
    pub temp_files_promoted: usize,
    /// Complete files without a row, moved to `orphaned/`.
    pub orphans_quarantined: usize,
    /// Pending rows whose file is missing, marked `lost`.
    pub rows_lost: usize,
}

impl Outbox {
    /// Bring files and rows back into agreement after a crash.
    pub(super) fn recover(&self) -> Result<RecoveryReport, OutboxError> {
        let dir = &self.inner.dir;
        let mut report = RecoveryReport::default();
        let entries = fs::read_dir(dir).map_err(|source| OutboxError::Io {
            path: dir.clone(),
            source,
        })?;
        let mut names = Vec::new();
        for entry in entries.flatten() {
            if entry.file_type().map(|t| t.is_file()).unwrap_or(false) {
                if let Some(name) = entry.file_name().to_str() {
                    names.push(name.to_string());
                }
            }
        }
        for name in names {
            let path = dir.join(&name);
            if let Some(id) = name.strip_prefix('.').and_then(|n| n.strip_suffix(".part")) {
                let row = self.row_state(id)?;
                let fin = dir.join(id);
                let promote = match row {
                    Some((UploadState::Pending, sha)) if !fin.exists() => {
                        hash_file(&path).ok().as_deref() == Some(sha.as_str())
                    }
                    _ => false,
                };
                if promote && fs::rename(&path, &fin).is_ok() {
                    tracing::warn!(
                        artifact_id = id,
                        "outbox: recovered an artifact whose rename was lost"
                    );
                    report.temp_files_promoted += 1;
                } else {
                    let _ = fs::remove_file(&path);
                    report.temp_files_removed += 1;
                }
                continue;
            }
            if !name.starts_with("art-") {
                continue;
            }
            match self.row_state(&name)? {
                Some((UploadState::Uploaded, _)) if self.fully_acknowledged(&name)? => {
                    // Bytes and metadata acknowledged, but the delete did
                    // not happen before a crash.
                    let _ = fs::remove_file(&path);
                }
                Some(_) => {}
                None => {
                    let quarantine = dir.join("orphaned");
                    fs::create_dir_all(&quarantine).map_err(|source| OutboxError::Io {
                        path: quarantine.clone(),
                        source,
                    })?;
                    let _ = fs::rename(&path, quarantine.join(&name));
                    tracing::warn!(
                        file = %path.display(),
                        "outbox: file without a row (crash before commit) moved to orphaned/"
                    );
                    report.orphans_quarantined += 1;
                }
            }
        }
        // Rows whose file is gone.
        let pending: Vec<String> = self.with_conn(|c| {
            let mut stmt = c.prepare(
                "SELECT artifact_id FROM artifacts WHERE upload_state IN ('pending', 'corrupt')",
            )?;
            let ids = stmt
                .query_map([], |r| r.get(0))?
                .collect::<Result<Vec<String>, _>>()?;
            Ok(ids)
        })?;
        for id in pending {
            if !dir.join(&id).exists() {
                tracing::error!(artifact_id = %id, "outbox: the file of a pending artifact is missing; marked lost");
                self.with_conn(|c| {
                    c.execute(
                        "UPDATE artifacts SET upload_state = 'lost', last_error = 'file missing at start'
                         WHERE artifact_id = ?1",
                        [&id],
                    )
                })?;
                report.rows_lost += 1;
            }
        }
        Ok(report)
    }
}
