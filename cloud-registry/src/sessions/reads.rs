//! Reads: sessions and artifacts by id or filter, and an uploaded
//! artifact's bytes (whole or one byte range).

use std::ops::Range;

use shared_protocol::artifact::CapabilityArtifact;
use shared_protocol::session::CapabilitySession;

use super::blobs::BlobContent;
use super::byte_range::{self, RangeAnswer};
use super::error::SessionError;
use super::sql::{self, ArtifactFilter, SessionFilter};

use super::{Sessions, MAX_LIST};

/// The bytes a download gets.
pub enum Download {
    /// All of them (`200`).
    Whole(BlobContent),
    /// Bytes `range` (end exclusive) of `total` (`206`).
    Part {
        range: Range<u64>,
        total: u64,
        content: BlobContent,
    },
    /// The range asked for holds none of the `total` bytes (`416`).
    Unsatisfiable { total: u64 },
}

impl Sessions {
    /// One session.
    ///
    /// Errors: `SessionNotFound`, `Store`.
    pub async fn get_session(&self, session_id: &str) -> Result<CapabilitySession, SessionError> {
        let id = session_id.to_string();
        self.db
            .read(move |c| sql::load_session(c, &id))
            .await??
            .map(|r| r.session)
            .ok_or_else(|| SessionError::SessionNotFound {
                session_id: session_id.to_string(),
            })
    }

    /// Sessions matching `filter`, newest first.
    pub async fn list_sessions(
        &self,
        mut filter: SessionFilter,
    ) -> Result<Vec<CapabilitySession>, SessionError> {
        filter.limit = filter.limit.clamp(1, MAX_LIST);
        let rows = self
            .db
            .read(move |c| sql::list_sessions(c, &filter))
            .await??;
        Ok(rows.into_iter().map(|r| r.session).collect())
    }

    /// One artifact's metadata and the provider that produced it.
    ///
    /// Errors: `ArtifactNotFound`, `Store`.
    pub async fn get_artifact(
        &self,
        artifact_id: &str,
    ) -> Result<(CapabilityArtifact, String), SessionError> {
        let id = artifact_id.to_string();
        self.db
            .read(move |c| sql::load_artifact(c, &id))
            .await??
            .map(|r| (r.artifact, r.provider_id))
            .ok_or_else(|| SessionError::ArtifactNotFound {
                artifact_id: artifact_id.to_string(),
            })
    }

    /// Artifacts matching `filter`, oldest capture first.
    pub async fn list_artifacts(
        &self,
        mut filter: ArtifactFilter,
    ) -> Result<Vec<CapabilityArtifact>, SessionError> {
        filter.limit = filter.limit.clamp(1, MAX_LIST);
        let rows = self
            .db
            .read(move |c| sql::list_artifacts(c, &filter))
            .await??;
        Ok(rows.into_iter().map(|r| r.artifact).collect())
    }

    /// An uploaded artifact's metadata, its provider and the bytes that
    /// the `Range` header value `range` asks for (see
    /// [`byte_range::resolve`]; `None`: all of them).
    ///
    /// Errors: `ArtifactNotFound`, `ArtifactNotUploaded` (only metadata), `ArtifactBytesMissing` (the store lost the blob),
    /// `Blob`, `Store`.
    pub async fn open_artifact(
        &self,
        artifact_id: &str,
        range: Option<&str>,
    ) -> Result<(CapabilityArtifact, String, Download), SessionError> {
        let (artifact, provider) = self.get_artifact(artifact_id).await?;
        if !artifact.uploaded {
            return Err(SessionError::ArtifactNotUploaded {
                artifact_id: artifact_id.to_string(),
            });
        }
        let total = artifact.size_bytes;
        let answer = byte_range::resolve(range, total);
        let content = match &answer {
            RangeAnswer::Unsatisfiable => {
                return Ok((artifact, provider, Download::Unsatisfiable { total }))
            }
            RangeAnswer::Whole => self.blobs.open(&artifact.checksum).await?,
            RangeAnswer::Part(r) => self.blobs.open_range(&artifact.checksum, r.clone()).await?,
        };
        let content = content.ok_or_else(|| {
            tracing::error!(artifact_id, checksum = %artifact.checksum, "artifact marked uploaded but its blob is missing");
            SessionError::ArtifactBytesMissing {
                artifact_id: artifact_id.to_string(),
                checksum: artifact.checksum.clone(),
            }
        })?;
        let download = match answer {
            RangeAnswer::Part(range) => Download::Part {
                range,
                total,
                content,
            },
            _ => Download::Whole(content),
        };
        Ok((artifact, provider, download))
    }
}
