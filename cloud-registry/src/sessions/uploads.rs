//! Upload intake: artifact bytes over HTTP, checked, staged, resumed and
//! bound to their metadata.
//!
//! # Artifact bytes
//! `PUT /api/v1/artifacts/{artifact_id}/content` with the provider token and
//! `X-Checksum-Sha256`: the body is streamed to a staging file while it is
//! hashed (never held in memory), compared with the header (and with the
//! metadata's checksum when known), then stored content-addressed in the
//! [`BlobStore`]. A mismatch is `422 checksum_mismatch` and nothing is
//! kept. A repeated PUT of the same bytes answers `200` with the same
//! record.
//!
//! Bytes and metadata travel separately (HTTP and MQTT), so either may come
//! first. Bytes that arrive before their metadata are verified against
//! their header, stored, and *held* for the artifact id and the uploading
//! provider (`artifact_pending_uploads`), answering `201`; when the
//! metadata arrives from the same provider with the same sha256 they are
//! bound and the artifact is `uploaded` at once. Held bytes whose metadata
//! names another sha256 are not bound (logged); the artifact then waits for
//! a correct upload.
//!
//! # Bytes nothing binds
//! Bytes no artifact row binds (held bytes whose metadata never comes, bytes
//! a later PUT under the same id replaced, bytes whose metadata named
//! another sha256) are kept for `sessions.unbound_upload_ttl_seconds` from
//! their first upload ([`unbound`]). The watchdog then drops the held
//! record and deletes the blob, unless an uploaded artifact has the same
//! sha256 (blobs are shared by content) or a younger held upload names it.
//! Each removal is logged at `info`. While a provider holds more than
//! `sessions.max_unbound_bytes_per_provider` such bytes, its uploads of new
//! bytes for artifacts whose metadata is unknown get 409
//! `unbound_upload_limit` (checked before the body is read, from
//! `Content-Length`); uploads for known artifacts are never limited.
//!

use chrono::Utc;
use serde_json::{json, Value};
use shared_protocol::artifact::is_sha256_hex;

use super::blobs::StagedBlob;
use super::error::SessionError;
use super::sql;

use super::sql::{UploadRecorded, UploadRefused};
use super::{partial, unbound, Sessions};
use crate::auth::Principal;

/// An upload that passed [`Sessions::precheck_upload`]: the declared
/// sha256 (lowercase hex) and, for an artifact whose metadata is unknown,
/// the bytes it counts toward the provider's unbound limit while its body
/// arrives (released on drop).
#[derive(Debug)]
pub struct UploadPermit {
    /// The declared `X-Checksum-Sha256`, lowercase hex.
    pub sha256: String,
    _reservation: Option<unbound::Reservation>,
}

/// What an upload did, for the HTTP answer.
#[derive(Debug, Clone)]
pub struct UploadReceipt {
    /// True when this PUT stored or bound the bytes (201); false for a
    /// repeat of bytes already received (200).
    pub first: bool,
    /// The artifact record, or for bytes held before their metadata:
    /// `{artifact_id, checksum, size_bytes, uploaded: true,
    /// metadata_received: false}`.
    pub record: Value,
}

/// The declared sha256 of `who`'s upload of the artifact `meta` records
/// (lowercase hex): the caller must be its provider, and the checksum the
/// recorded one.
///
/// Errors: `NotArtifactOwner`, `ChecksumMismatch`.
fn check_recorded(
    who: &Principal,
    meta: &sql::ArtifactRow,
    declared: &str,
) -> Result<(), SessionError> {
    if meta.provider_id != who.name {
        return Err(SessionError::NotArtifactOwner {
            artifact_id: meta.artifact.artifact_id.clone(),
            owner: meta.provider_id.clone(),
            caller: who.name.clone(),
        });
    }
    if meta.artifact.checksum != declared {
        return Err(SessionError::ChecksumMismatch {
            artifact_id: meta.artifact.artifact_id.clone(),
            what: "recorded",
            expected: meta.artifact.checksum.clone(),
            actual: declared.to_string(),
        });
    }
    Ok(())
}

impl Sessions {
    /// Check an upload before its body is read: the caller may upload this
    /// artifact, and the declared sha256 agrees with the metadata (when
    /// known). Returns the declared sha256 in lowercase and, for an
    /// artifact whose metadata is unknown, the reservation that counts its
    /// declared length toward the provider's unbound bytes: keep the
    /// permit until [`Sessions::finish_upload`] has returned.
    ///
    /// Errors: `BadChecksumHeader`, `NotArtifactOwner`, `ChecksumMismatch`
    /// (against the recorded checksum), `TooLarge` (declared length),
    /// `UnboundLimit` (no metadata yet and the provider holds too many
    /// unbound bytes), `Store`.
    pub async fn precheck_upload(
        &self,
        who: &Principal,
        artifact_id: &str,
        declared_sha256: Option<&str>,
        content_length: Option<u64>,
    ) -> Result<UploadPermit, SessionError> {
        let declared = declared_sha256
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| is_sha256_hex(s))
            .ok_or(SessionError::BadChecksumHeader)?;
        if content_length.is_some_and(|n| n > self.cfg.max_artifact_bytes) {
            return Err(SessionError::TooLarge {
                artifact_id: artifact_id.to_string(),
                limit: self.cfg.max_artifact_bytes,
            });
        }
        let id = artifact_id.to_string();
        if let Some(meta) = self.db.read(move |c| sql::load_artifact(c, &id)).await?? {
            check_recorded(who, &meta, &declared)?;
            return Ok(UploadPermit {
                sha256: declared,
                _reservation: None,
            });
        }
        let reservation = self
            .check_unbound_limit(who, artifact_id, &declared, content_length)
            .await?;
        Ok(UploadPermit {
            sha256: declared,
            _reservation: reservation,
        })
    }

    /// Bytes for an artifact whose metadata is unknown are about to come:
    /// refuse them when, with what `who` already stores unbound and what
    /// its other such uploads are sending now, they would take it over
    /// `max_unbound_bytes_per_provider`; otherwise count them as in flight
    /// until the returned reservation drops. An upload without
    /// `Content-Length` counts as `max_artifact_bytes`. Bytes the provider
    /// already stored (a repeated upload) add nothing and always pass; so
    /// does everything when the limit is 0.
    ///
    /// Errors: `UnboundLimit`, `Store`.
    async fn check_unbound_limit(
        &self,
        who: &Principal,
        artifact_id: &str,
        sha256: &str,
        content_length: Option<u64>,
    ) -> Result<Option<unbound::Reservation>, SessionError> {
        let limit = self.cfg.max_unbound_bytes_per_provider;
        if limit == 0 {
            return Ok(None);
        }
        let incoming = content_length.unwrap_or(self.cfg.max_artifact_bytes);
        // Before the stored usage is read (see `InFlight::reserve`).
        let (in_flight, reservation) = self.unbound_in_flight.reserve(&who.name, incoming);
        let (p, a, s) = (
            who.name.clone(),
            artifact_id.to_string(),
            sha256.to_string(),
        );
        let usage = self
            .db
            .read(move |c| unbound::unbound_usage(c, &p, &a, &s))
            .await??;
        if usage.already_stored {
            return Ok(None);
        }
        if usage
            .bytes
            .saturating_add(in_flight)
            .saturating_add(incoming)
            <= limit
        {
            return Ok(Some(reservation));
        }
        tracing::warn!(artifact_id, provider_id = %who.name, unbound_bytes = usage.bytes, in_flight, incoming, limit, "artifact upload refused: the provider holds too many bytes no metadata has named");
        Err(SessionError::UnboundLimit {
            provider_id: who.name.clone(),
            artifact_id: artifact_id.to_string(),
            held: usage.bytes,
            in_flight,
            incoming,
            limit,
            hint: if content_length.is_none() {
                " (the upload declared no Content-Length, so it counts as the largest artifact allowed, sessions.max_artifact_bytes: send Content-Length)"
            } else {
                ""
            },
        })
    }

    /// What the registry holds of `who`'s upload of `artifact_id` with
    /// bytes hashing to `declared_sha256` (64 hex):
    /// `{artifact_id, checksum, complete, received_bytes,
    /// metadata_received}`. `complete: true` when the whole bytes are
    /// stored (bound to the artifact, or held for it until its metadata
    /// arrives: `metadata_received: false`); otherwise `received_bytes` is
    /// the length of the unfinished resumable upload (0 when none), where a
    /// ranged PUT continues.
    ///
    /// Errors: `BadChecksumHeader`, `NotArtifactOwner`, `ChecksumMismatch`
    /// (the metadata recorded another sha256), `Blob`, `Store`.
    pub async fn upload_status(
        &self,
        who: &Principal,
        artifact_id: &str,
        declared_sha256: Option<&str>,
    ) -> Result<Value, SessionError> {
        let declared = declared_sha256
            .map(|s| s.trim().to_ascii_lowercase())
            .filter(|s| is_sha256_hex(s))
            .ok_or(SessionError::BadChecksumHeader)?;
        let (id, provider) = (artifact_id.to_string(), who.name.clone());
        let (meta, held) = self
            .db
            .read(move |c| {
                let meta = sql::load_artifact(c, &id)?;
                let held = sql::held_upload(c, &id, &provider)?;
                Ok::<_, rusqlite::Error>((meta, held))
            })
            .await??;
        let mut metadata_received = false;
        let mut complete = None;
        if let Some(meta) = meta {
            check_recorded(who, &meta, &declared)?;
            metadata_received = true;
            if meta.artifact.uploaded && self.blobs.exists(&declared).await? {
                complete = Some(meta.artifact.size_bytes);
            }
        } else if let Some((sha, size)) = held {
            if sha == declared && self.blobs.exists(&declared).await? {
                complete = Some(size);
            }
        }
        let received = match complete {
            Some(n) => n,
            None => {
                self.partials
                    .held(&self.partials.path(&who.name, artifact_id, &declared))
                    .await
            }
        };
        Ok(json!({
            "artifact_id": artifact_id,
            "checksum": declared,
            "complete": complete.is_some(),
            "received_bytes": received,
            "metadata_received": metadata_received,
        }))
    }

    /// Open the unfinished resumable upload of (`who`, `artifact_id`,
    /// `sha256`) to append `range` to it: claimed for this request until
    /// the returned [`partial::Claim`] drops. `range.start` 0 begins
    /// afresh; any other start must equal the bytes held.
    ///
    /// Errors: `UploadBusy` (another ranged PUT writes it),
    /// `OffsetMismatch` (409 with the bytes held), `PartialLimit`, `Blob`.
    pub async fn resume_partial(
        &self,
        who: &Principal,
        artifact_id: &str,
        sha256: &str,
        range: partial::ContentRange,
    ) -> Result<(StagedBlob, partial::Claim), SessionError> {
        let path = self.partials.path(&who.name, artifact_id, sha256);
        let claim = self
            .partials
            .claim(&path)
            .ok_or_else(|| SessionError::UploadBusy {
                artifact_id: artifact_id.to_string(),
            })?;
        let held = self.partials.held(&path).await;
        if range.start != 0 && range.start != held {
            return Err(SessionError::OffsetMismatch {
                artifact_id: artifact_id.to_string(),
                held,
                start: range.start,
            });
        }
        let limit = self.cfg.max_partial_bytes_per_provider;
        if limit > 0 {
            let others = self.partials.provider_bytes(&who.name, &path).await;
            if others.saturating_add(range.total) > limit {
                tracing::warn!(artifact_id, provider_id = %who.name, others, total = range.total, limit, "resumable upload refused: the provider's unfinished uploads are over the limit");
                return Err(SessionError::PartialLimit {
                    artifact_id: artifact_id.to_string(),
                    held: others,
                    incoming: range.total,
                    limit,
                });
            }
        }
        let staged = StagedBlob::resume(&path, range.start == 0).await?;
        Ok((staged, claim))
    }

    /// A new staging file for an upload's body.
    pub async fn stage(&self) -> Result<StagedBlob, SessionError> {
        Ok(StagedBlob::create(&self.blobs.staging_dir()).await?)
    }

    /// Take a fully received upload: compare its hash with the declared
    /// one, store it, and mark the artifact uploaded (or hold the bytes
    /// until its metadata arrives). Emits `artifact_uploaded` the first
    /// time.
    ///
    /// Errors: `ChecksumMismatch` (nothing stored), `NotArtifactOwner`,
    /// `Blob`, `Store`.
    pub async fn finish_upload(
        &self,
        who: &Principal,
        artifact_id: &str,
        declared_sha256: &str,
        mut staged: StagedBlob,
    ) -> Result<UploadReceipt, SessionError> {
        let actual = staged.finish().await?;
        let size = staged.size_bytes();
        if actual != declared_sha256 {
            staged.discard();
            tracing::warn!(artifact_id, provider_id = %who.name, declared = %declared_sha256, %actual, size_bytes = size, "artifact upload refused: checksum mismatch");
            return Err(SessionError::ChecksumMismatch {
                artifact_id: artifact_id.to_string(),
                what: "X-Checksum-Sha256",
                expected: declared_sha256.to_string(),
                actual,
            });
        }
        // Until the row is committed, the sweep of unbound bytes must not
        // delete the blob (`put` may have found it already stored).
        let gc = self.blob_gc.read().await;
        self.blobs.put(&actual, staged).await?;
        let (id, provider, sum) = (artifact_id.to_string(), who.name.clone(), actual.clone());
        let recorded = self
            .db
            .write(move |c| {
                let now = Utc::now();
                let recorded = sql::record_upload(c, &id, &provider, &sum, size, now);
                // Bytes no artifact row binds are kept only for the grace
                // time: track them (also those a refusal left behind).
                if !matches!(recorded, Ok(UploadRecorded::Bound { .. })) {
                    let noted = unbound::note_unbound(c, &provider, &sum, &id, size, now);
                    match (&recorded, noted) {
                        (_, Ok(())) => {}
                        (Ok(_), Err(e)) => return Err(UploadRefused::from(e)),
                        (Err(_), Err(e)) if crate::storage::is_sqlite_full(&e) => {
                            crate::storage::note_full("artifact upload", &e)
                        }
                        (Err(_), Err(e)) => {
                            tracing::error!(artifact_id = %id, error = %e, "cannot track the bytes of a refused upload")
                        }
                    }
                }
                recorded
            })
            .await?;
        drop(gc);
        match recorded {
            Ok(UploadRecorded::Bound {
                artifact,
                first,
                events,
            }) => {
                self.publish(events).await;
                if first {
                    tracing::info!(artifact_id, session_id = %artifact.session_id, size_bytes = size, "artifact uploaded");
                }
                Ok(UploadReceipt {
                    first,
                    record: serde_json::to_value(&artifact).unwrap_or(Value::Null),
                })
            }
            Ok(UploadRecorded::Held {
                artifact_id,
                checksum,
                size_bytes,
                first,
            }) => {
                if first {
                    tracing::info!(%artifact_id, provider_id = %who.name, size_bytes, "artifact bytes held until their metadata arrives");
                }
                Ok(UploadReceipt {
                    first,
                    record: json!({
                        "artifact_id": artifact_id,
                        "checksum": checksum,
                        "size_bytes": size_bytes,
                        "uploaded": true,
                        "metadata_received": false,
                    }),
                })
            }
            Err(UploadRefused::NotOwner { artifact_id, owner }) => {
                Err(SessionError::NotArtifactOwner {
                    artifact_id,
                    owner,
                    caller: who.name.clone(),
                })
            }
            Err(UploadRefused::ChecksumMismatch {
                artifact_id,
                expected,
                actual,
            }) => Err(SessionError::ChecksumMismatch {
                artifact_id,
                what: "recorded",
                expected,
                actual,
            }),
            Err(UploadRefused::Sqlite(e)) => Err(SessionError::Store(e)),
        }
    }
}
