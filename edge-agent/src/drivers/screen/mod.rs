//! Screen capture driver (docs/actions.md, "screen_capture"): `screenshot`,
//! `record_screen_clip`, `ocr`.
//!
//! Backends: `command` ([`command`]: configured external tools such as
//! `import`/`grim`, `ffmpeg` and `tesseract`, run without a shell through
//! [`exec`]) and `sim` ([`sim`]: a rendered synthetic screen whose OCR
//! returns the text it drew).
//!
//! Evidence: `image` (PNG/JPEG as the tool wrote it), `video_clip`, and
//! `ocr_text` (UTF-8 text; the screenshot it was read from is kept as an
//! `image` artifact too unless `keep_image` is false).

pub mod command;
pub mod exec;
pub mod sim;

use std::io::Cursor;
use std::time::Instant;

use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityAction, CapabilityType};

use super::camera::rfc3339;
use super::{
    parse_params, unsupported, ActionOutcome, ActionRequest, Driver, DriverConfigError,
    DriverError, DriverHealth, DriverSpec, NewArtifact,
};
use crate::devices::{ProbeCache, HEALTH_PROBE_TTL};

/// An image a backend captured.
#[derive(Debug, Clone)]
pub struct Capture {
    pub bytes: Vec<u8>,
    /// e.g. `image/png`.
    pub content_type: String,
    pub captured_at: DateTime<Utc>,
}

/// A screen recording a backend made.
#[derive(Debug, Clone)]
pub struct ScreenClip {
    pub bytes: Vec<u8>,
    pub content_type: String,
    pub captured_at: DateTime<Utc>,
    /// Extra facts for the artifact metadata (frame count, tool, ...).
    pub metadata: Map<String, Value>,
}

/// A screen capture backend.
pub trait ScreenBackend: Send {
    /// e.g. `command "import -window root {out}"`, `sim screen "dut"`.
    fn label(&self) -> String;
    /// Cheap presence check (tool installed, display there).
    fn probe(&self) -> Result<(), String>;
    /// Grab the screen now.
    fn screenshot(&mut self, req: &ActionRequest) -> Result<Capture, DriverError>;
    /// Whether `record_screen_clip` is configured.
    fn supports_clip(&self) -> bool;
    /// Record `duration_ms` of the screen.
    fn record_clip(
        &mut self,
        duration_ms: u64,
        req: &ActionRequest,
    ) -> Result<ScreenClip, DriverError>;
    /// Read the text in `image`.
    fn ocr(&mut self, image: &Capture, req: &ActionRequest) -> Result<String, DriverError>;
    /// OCR engine name for metadata (e.g. the program name).
    fn ocr_engine(&self) -> String;
}

/// Build a Screen capture driver from its bench TOML section (`backend =
/// "command"` or `"sim"`).
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let (backend, max_clip_ms): (Box<dyn ScreenBackend>, u64) = match spec.backend.as_str() {
        "command" => command::build(spec)?,
        "sim" => sim::build(spec)?,
        _ => return Err(spec.unknown_backend(&["command", "sim"])),
    };
    Ok(Box::new(ScreenDriver::new(
        &spec.capability_id,
        backend,
        max_clip_ms,
    )))
}

/// Check the `max_clip_ms` setting (longest `record_screen_clip`).
pub(crate) fn check_max_clip_ms(spec: &DriverSpec, ms: u64) -> Result<u64, DriverConfigError> {
    if (100..=3_600_000).contains(&ms) {
        Ok(ms)
    } else {
        Err(DriverConfigError::Setting {
            capability_id: spec.capability_id.clone(),
            key: "max_clip_ms".into(),
            message: format!("{ms} is outside 100..=3600000"),
        })
    }
}

/// The screen capture driver.
pub struct ScreenDriver {
    capability_id: String,
    backend: Box<dyn ScreenBackend>,
    max_clip_ms: u64,
    probe: ProbeCache,
    last_failure: Option<(Instant, String)>,
}

impl ScreenDriver {
    /// A driver around `backend`.
    pub fn new(capability_id: &str, backend: Box<dyn ScreenBackend>, max_clip_ms: u64) -> Self {
        Self {
            capability_id: capability_id.to_string(),
            backend,
            max_clip_ms,
            probe: ProbeCache::new(HEALTH_PROBE_TTL),
            last_failure: None,
        }
    }

    fn note<T>(&mut self, r: Result<T, DriverError>) -> Result<T, DriverError> {
        match &r {
            Err(DriverError::Unavailable(m)) => {
                self.last_failure = Some((Instant::now(), m.clone()))
            }
            Ok(_) => self.last_failure = None,
            Err(_) => {}
        }
        r
    }

    fn image_artifact(&self, cap: &Capture, purpose: &str) -> NewArtifact {
        let mut metadata = Map::new();
        if let Some((w, h)) = image_dimensions(&cap.bytes) {
            metadata.insert("width".into(), json!(w));
            metadata.insert("height".into(), json!(h));
        }
        metadata.insert("captured_at".into(), json!(rfc3339(cap.captured_at)));
        metadata.insert("source".into(), json!(self.backend.label()));
        metadata.insert("purpose".into(), json!(purpose));
        NewArtifact {
            artifact_type: ArtifactType::Image,
            content_type: cap.content_type.clone(),
            bytes: cap.bytes.clone(),
            duration_ms: None,
            metadata,
        }
    }

    fn screenshot(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {}
        let _: P = parse_params(&req.params)?;
        let r = self.backend.screenshot(req);
        let cap = self.note(r)?;
        let artifact = self.image_artifact(&cap, "screenshot");
        let mut summary = artifact.metadata.clone();
        summary.insert("content_type".into(), json!(cap.content_type));
        summary.insert("size_bytes".into(), json!(cap.bytes.len()));
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: vec![artifact],
        })
    }

    fn record_screen_clip(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            duration_ms: u64,
        }
        let p: P = parse_params(&req.params)?;
        if p.duration_ms == 0 || p.duration_ms > self.max_clip_ms {
            return Err(DriverError::InvalidParams {
                field: "duration_ms".into(),
                message: format!(
                    "{} is outside 1..={} (max_clip_ms)",
                    p.duration_ms, self.max_clip_ms
                ),
            });
        }
        if !self.backend.supports_clip() {
            return Err(unsupported(
                CapabilityType::ScreenCapture,
                CapabilityAction::RecordScreenClip,
                "no clip_command is configured for this screen",
            ));
        }
        let r = self.backend.record_clip(p.duration_ms, req);
        let clip = self.note(r)?;
        let mut metadata = clip.metadata.clone();
        metadata.insert("duration_ms".into(), json!(p.duration_ms));
        metadata.insert("captured_at".into(), json!(rfc3339(clip.captured_at)));
        metadata.insert("source".into(), json!(self.backend.label()));
        let mut summary = metadata.clone();
        summary.insert("content_type".into(), json!(clip.content_type));
        summary.insert("size_bytes".into(), json!(clip.bytes.len()));
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: vec![NewArtifact {
                artifact_type: ArtifactType::VideoClip,
                content_type: clip.content_type,
                bytes: clip.bytes,
                duration_ms: Some(p.duration_ms),
                metadata,
            }],
        })
    }

    fn ocr(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default)]
            keep_image: Option<bool>,
            #[serde(default)]
            expect_text: Option<String>,
        }
        let p: P = parse_params(&req.params)?;
        let r = self.backend.screenshot(req);
        let cap = self.note(r)?;
        let r = self.backend.ocr(&cap, req);
        let text = self.note(r)?;
        let lines = text.lines().filter(|l| !l.trim().is_empty()).count();
        let mut metadata = Map::new();
        metadata.insert("engine".into(), json!(self.backend.ocr_engine()));
        metadata.insert("source".into(), json!(self.backend.label()));
        metadata.insert("captured_at".into(), json!(rfc3339(cap.captured_at)));
        metadata.insert("char_count".into(), json!(text.chars().count()));
        metadata.insert("line_count".into(), json!(lines));
        let mut summary = metadata.clone();
        // The whole text is in the artifact; the summary carries a preview.
        let preview: String = text.chars().take(2000).collect();
        summary.insert("text".into(), json!(preview));
        if let Some(expect) = &p.expect_text {
            summary.insert("expect_text".into(), json!(expect));
            summary.insert("matched".into(), json!(contains_loosely(&text, expect)));
        }
        let mut artifacts = Vec::new();
        if p.keep_image.unwrap_or(true) {
            artifacts.push(self.image_artifact(&cap, "ocr_source"));
        }
        artifacts.push(NewArtifact {
            artifact_type: ArtifactType::OcrText,
            content_type: "text/plain; charset=utf-8".into(),
            bytes: text.into_bytes(),
            duration_ms: None,
            metadata,
        });
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts,
        })
    }
}

/// Case-insensitive containment with runs of whitespace treated as one
/// space (OCR output wraps and spaces text unpredictably).
pub fn contains_loosely(text: &str, needle: &str) -> bool {
    let norm = |s: &str| {
        s.split_whitespace()
            .collect::<Vec<_>>()
            .join(" ")
            .to_lowercase()
    };
    norm(text).contains(&norm(needle))
}

/// Width and height of an encoded image (PNG, JPEG), when readable.
pub fn image_dimensions(bytes: &[u8]) -> Option<(u32, u32)> {
    image::ImageReader::new(Cursor::new(bytes))
        .with_guessed_format()
        .ok()?
        .into_dimensions()
        .ok()
}

/// MIME type of an image file from its first bytes.
pub fn sniff_image_type(bytes: &[u8]) -> Option<&'static str> {
    const TYPES: [(&[u8], &str); 6] = [
        (b"\x89PNG\r\n\x1a\n", "image/png"),
        (b"\xFF\xD8\xFF", "image/jpeg"),
        (b"GIF8", "image/gif"),
        (b"BM", "image/bmp"),
        (b"P6", "image/x-portable-pixmap"),
        (b"RIFF", "image/webp"),
    ];
    TYPES
        .iter()
        .find(|(magic, _)| bytes.starts_with(magic))
        .map(|(_, t)| *t)
}

impl Driver for ScreenDriver {
    fn capability_type(&self) -> CapabilityType {
        CapabilityType::ScreenCapture
    }

    fn supported_actions(&self) -> Vec<CapabilityAction> {
        let mut a = vec![CapabilityAction::Screenshot, CapabilityAction::Ocr];
        if self.backend.supports_clip() {
            a.insert(1, CapabilityAction::RecordScreenClip);
        }
        a
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("source".into(), json!(self.backend.label()));
        m.insert("supports_clip".into(), json!(self.backend.supports_clip()));
        m.insert("ocr_engine".into(), json!(self.backend.ocr_engine()));
        m
    }

    fn health(&mut self) -> DriverHealth {
        if let Some((at, why)) = &self.last_failure {
            if at.elapsed() < HEALTH_PROBE_TTL {
                return DriverHealth::unhealthy(why.clone());
            }
        }
        let backend = &self.backend;
        match self.probe.get(|| backend.probe()) {
            Ok(()) => DriverHealth::healthy(),
            Err(why) => DriverHealth::unhealthy(why),
        }
    }

    fn execute(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        tracing::debug!(capability_id = %self.capability_id, action = %req.action, "screen action");
        match req.action {
            CapabilityAction::Screenshot => self.screenshot(req),
            CapabilityAction::RecordScreenClip => self.record_screen_clip(req),
            CapabilityAction::Ocr => self.ocr(req),
            other => Err(unsupported(
                CapabilityType::ScreenCapture,
                other,
                "not a screen capture action",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loose_matching_ignores_case_and_wrapping() {
        assert!(contains_loosely("STATUS:\n  READY\n", "status: ready"));
        assert!(!contains_loosely("STATUS: BUSY", "ready"));
    }

    #[test]
    fn image_types_are_recognised_by_their_magic() {
        assert_eq!(
            sniff_image_type(b"\x89PNG\r\n\x1a\nrest"),
            Some("image/png")
        );
        assert_eq!(sniff_image_type(b"\xFF\xD8\xFF\xE0"), Some("image/jpeg"));
        assert_eq!(sniff_image_type(b"hello"), None);
    }
}
