//! Artifacts: evidence produced by sessions (seed 001 §2.2.5).

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::validate::limits::MAX_OBJECT_ENTRIES;
use crate::validate::{check_count, check_id, Validate, ValidationError};
use crate::Timestamp;

wire_enum! {
    /// The eight kinds of evidence (seed 001 §2.2.5 `artifact_type`); also a
    /// capability's `evidence_modes`.
    pub enum ArtifactType {
        Image = "image",
        VideoClip = "video_clip",
        AudioClip = "audio_clip",
        SerialLog = "serial_log",
        SensorDump = "sensor_dump",
        OcrText = "ocr_text",
        DetectionJson = "detection_json",
        Transcript = "transcript",
    }
}

/// An artifact as the registry stores and returns it (seed 001 §2.2.5).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
pub struct CapabilityArtifact {
    pub artifact_id: String,
    pub session_id: String,
    pub artifact_type: ArtifactType,
    /// Where the bytes are: `edge-outbox://{provider}/{artifact_id}` until
    /// uploaded, then `/api/v1/artifacts/{artifact_id}/content`.
    pub storage_uri: String,
    /// MIME type, e.g. `image/jpeg`.
    pub content_type: String,
    #[schema(value_type = String, format = DateTime)]
    pub captured_at: Timestamp,
    /// Length of audio/video, milliseconds.
    pub duration_ms: Option<u64>,
    /// Lowercase hex SHA-256 of the bytes, as computed at the edge.
    pub checksum: String,
    /// Byte length.
    pub size_bytes: u64,
    pub metadata_json: Map<String, Value>,
    /// True once the bytes reached the registry and their sha256 matched.
    #[serde(default)]
    pub uploaded: bool,
}

impl Validate for CapabilityArtifact {
    fn validate(&self) -> Result<(), ValidationError> {
        check_id("artifact_id", &self.artifact_id)?;
        check_id("session_id", &self.session_id)?;
        if !is_sha256_hex(&self.checksum) {
            return Err(ValidationError::new(
                "checksum",
                "must be 64 lowercase hex digits (sha256)",
            ));
        }
        check_count(
            "metadata_json",
            self.metadata_json.len(),
            MAX_OBJECT_ENTRIES,
        )
    }
}

/// True for 64 lowercase hex digits.
pub fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64 && s.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}
