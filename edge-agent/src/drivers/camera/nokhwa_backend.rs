//! `backend = "nokhwa"`: a V4L2 camera through nokhwa.
//!
//! Settings (all optional):
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `device` | `0` | V4L2 index, a `/dev/video*` or `/dev/v4l/by-id/*` path, or the card name |
//! | `format` | `auto` | `mjpeg`, `yuyv` or `auto` |
//! | `resolution` | `1280x720` | requested size; the nearest offered one is used |
//! | `fps` | `30` | requested frame rate |
//! | `capture_timeout_ms` | `3000` | longest wait to open or for one frame |
//! | `ring_seconds` | `10` | how much of a stream the edge keeps |
//! | `ring_max_mb` | `256` | byte budget of that ring |
//! | `jpeg_quality` | `85` | for frames the driver encodes |
//! | `warmup_frames` | `2` | frames skipped after the stream starts |
//! | `max_clip_ms` | `60000` | longest `record_clip` |
//! | `field_of_view_deg` | none | registration metadata only |
//! | `ptz` | `false` | the camera has pan/tilt/zoom controls: `set_ptz` is advertised (each call still checks the controls the device offers) |

use std::path::PathBuf;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use nokhwa::utils::{
    ApiBackend, CameraFormat, CameraIndex, ControlValueSetter, FrameFormat, KnownCameraControl,
    RequestedFormat, RequestedFormatType,
};
use nokhwa::{Camera, NokhwaError};
use serde::Deserialize;

use super::frames::{CaptureMode, PixelFormat, RawFrame};
use super::{CameraBackend, CameraDriver, CommonToml, FrameSource, PtzAxis};
use crate::drivers::{Defaults, Driver, DriverConfigError, DriverError, DriverSpec};

/// Opens the nokhwa `Camera` for a V4L2 index. The default opens the real
/// device; tests pass one that returns `Camera::with_custom(..)` around a
/// scripted capture backend. Called on the capture thread.
pub type CameraOpener = Arc<dyn Fn(u32) -> Result<Camera, NokhwaError> + Send + Sync>;

/// Which camera the `device` setting names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DeviceSelector {
    Index(u32),
    /// `/dev/video2` or a stable `/dev/v4l/by-id/...` link.
    Path(PathBuf),
    /// The card name as `edge-agent devices` shows it.
    Name(String),
}

impl DeviceSelector {
    /// Parse the `device` setting: a number, a path, or a name.
    pub fn parse(v: &DeviceSetting) -> Self {
        match v {
            DeviceSetting::Index(i) => DeviceSelector::Index(*i),
            DeviceSetting::Text(s) => {
                let s = s.trim();
                if let Ok(i) = s.parse::<u32>() {
                    DeviceSelector::Index(i)
                } else if s.starts_with('/') {
                    DeviceSelector::Path(PathBuf::from(s))
                } else {
                    DeviceSelector::Name(s.to_string())
                }
            }
        }
    }

    /// How errors and metadata name the device.
    pub fn label(&self) -> String {
        match self {
            DeviceSelector::Index(i) => format!("index {i}"),
            DeviceSelector::Path(p) => p.display().to_string(),
            DeviceSelector::Name(n) => format!("named \"{n}\""),
        }
    }

    /// The V4L2 index this selector means right now.
    pub fn resolve(&self) -> Result<u32, String> {
        match self {
            DeviceSelector::Index(i) => {
                let node = format!("/dev/video{i}");
                std::fs::metadata(&node)
                    .map(|_| *i)
                    .map_err(|e| format!("no camera at index {i}: {node}: {e}"))
            }
            DeviceSelector::Path(p) => {
                let real = std::fs::canonicalize(p)
                    .map_err(|e| format!("no camera at {}: {e}", p.display()))?;
                real.file_name()
                    .and_then(|n| n.to_str())
                    .and_then(|n| n.strip_prefix("video"))
                    .and_then(|n| n.parse().ok())
                    .ok_or_else(|| {
                        format!(
                            "{} resolves to {}, which is not a /dev/video* node",
                            p.display(),
                            real.display()
                        )
                    })
            }
            DeviceSelector::Name(n) => {
                let cams = nokhwa::query(ApiBackend::Video4Linux)
                    .map_err(|e| format!("cannot list cameras to find \"{n}\": {e}"))?;
                let found = cams
                    .iter()
                    .find(|c| c.human_name() == *n)
                    .or_else(|| {
                        let lower = n.to_lowercase();
                        cams.iter()
                            .find(|c| c.human_name().to_lowercase().contains(&lower))
                    })
                    .ok_or_else(|| {
                        let names: Vec<String> = cams.iter().map(|c| c.human_name()).collect();
                        format!(
                            "no camera named \"{n}\" (cameras present: {})",
                            if names.is_empty() {
                                "none".to_string()
                            } else {
                                names.join(", ")
                            }
                        )
                    })?;
                found
                    .index()
                    .as_index()
                    .map_err(|e| format!("camera \"{n}\" has no V4L2 index: {e}"))
            }
        }
    }
}

/// The `device` setting: an integer or a string.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum DeviceSetting {
    Index(u32),
    Text(String),
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct NokhwaToml {
    device: Option<DeviceSetting>,
    format: String,
    resolution: String,
    fps: u32,
    capture_timeout_ms: u64,
    ring_seconds: u32,
    ring_max_mb: u32,
    jpeg_quality: u8,
    warmup_frames: u32,
    max_clip_ms: u64,
    field_of_view_deg: Option<f64>,
    ptz: bool,
}

impl Default for NokhwaToml {
    /// The first camera, no pan/tilt/zoom, the rest shared
    /// ([`CommonToml`]).
    fn default() -> Self {
        let c = CommonToml::default();
        Self {
            device: None,
            format: c.format,
            resolution: c.resolution,
            fps: c.fps,
            capture_timeout_ms: c.capture_timeout_ms,
            ring_seconds: c.ring_seconds,
            ring_max_mb: c.ring_max_mb,
            jpeg_quality: c.jpeg_quality,
            warmup_frames: c.warmup_frames,
            max_clip_ms: c.max_clip_ms,
            field_of_view_deg: c.field_of_view_deg,
            ptz: false,
        }
    }
}

impl Defaults for NokhwaToml {}

/// Build a nokhwa camera driver. Does not open the device.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    build_inner(spec, None)
}

/// Build a nokhwa camera driver whose cameras come from `opener` (e.g. a
/// `Camera::with_custom` wrapper around a scripted capture backend) instead
/// of the V4L2 device. The `device` setting must be an index.
pub fn build_with_opener(
    spec: &DriverSpec,
    opener: CameraOpener,
) -> Result<Box<dyn Driver>, DriverConfigError> {
    build_inner(spec, Some(opener))
}

fn build_inner(
    spec: &DriverSpec,
    opener: Option<CameraOpener>,
) -> Result<Box<dyn Driver>, DriverConfigError> {
    let t: NokhwaToml = spec.parse()?;
    let common = CommonToml {
        format: t.format,
        resolution: t.resolution,
        fps: t.fps,
        capture_timeout_ms: t.capture_timeout_ms,
        ring_seconds: t.ring_seconds,
        ring_max_mb: t.ring_max_mb,
        jpeg_quality: t.jpeg_quality,
        warmup_frames: t.warmup_frames,
        max_clip_ms: t.max_clip_ms,
        field_of_view_deg: t.field_of_view_deg,
    };
    let settings = common.check(spec)?;
    let selector = DeviceSelector::parse(&t.device.unwrap_or(DeviceSetting::Index(0)));
    if opener.is_some() && !matches!(selector, DeviceSelector::Index(_)) {
        return Err(DriverConfigError::Setting {
            capability_id: spec.capability_id.clone(),
            key: "device".into(),
            message: "a camera opener needs a numeric device index".into(),
        });
    }
    let backend = NokhwaBackend {
        selector,
        opener,
        ptz: t.ptz,
    };
    Ok(Box::new(CameraDriver::new(
        &spec.capability_id,
        "nokhwa",
        Arc::new(backend),
        settings,
    )))
}

/// The nokhwa [`CameraBackend`].
pub struct NokhwaBackend {
    selector: DeviceSelector,
    opener: Option<CameraOpener>,
    /// The `ptz` setting.
    ptz: bool,
}

/// What the driver asks nokhwa for when opening; the real mode is chosen
/// afterwards from the device's list (see `frames::negotiate`).
const USABLE: [FrameFormat; 2] = [FrameFormat::MJPEG, FrameFormat::YUYV];

impl CameraBackend for NokhwaBackend {
    fn label(&self) -> String {
        self.selector.label()
    }

    fn has_ptz(&self) -> bool {
        self.ptz
    }

    fn probe(&self) -> Result<(), String> {
        match (&self.opener, &self.selector) {
            (Some(_), _) => Ok(()),
            (None, sel) => sel.resolve().map(|_| ()),
        }
    }

    fn open(&self) -> Result<Box<dyn FrameSource>, DriverError> {
        let label = self.label();
        let camera = match &self.opener {
            Some(open) => {
                let DeviceSelector::Index(i) = self.selector else {
                    return Err(DriverError::Unavailable(format!(
                        "camera {label}: an opener needs an index"
                    )));
                };
                open(i)
            }
            None => {
                // An index goes straight to V4L2 (its open error is the
                // clearest); paths and names are resolved to an index first.
                let index = match self.selector {
                    DeviceSelector::Index(i) => i,
                    _ => self.selector.resolve().map_err(DriverError::Unavailable)?,
                };
                Camera::new(
                    CameraIndex::Index(index),
                    RequestedFormat::with_formats(RequestedFormatType::None, &USABLE),
                )
            }
        }
        .map_err(|e| DriverError::Unavailable(format!("cannot open camera {label}: {e}")))?;
        Ok(Box::new(NokhwaSource { camera, label }))
    }

    fn device_path(&self) -> Option<String> {
        match &self.selector {
            DeviceSelector::Index(i) => Some(format!("/dev/video{i}")),
            DeviceSelector::Path(p) => Some(p.display().to_string()),
            DeviceSelector::Name(_) => None,
        }
    }
}

/// An opened nokhwa camera.
struct NokhwaSource {
    camera: Camera,
    label: String,
}

fn to_pixel(f: FrameFormat) -> Option<PixelFormat> {
    match f {
        FrameFormat::MJPEG => Some(PixelFormat::Mjpeg),
        FrameFormat::YUYV => Some(PixelFormat::Yuyv),
        _ => None,
    }
}

fn to_mode(f: &CameraFormat) -> Option<CaptureMode> {
    Some(CaptureMode {
        format: to_pixel(f.format())?,
        width: f.width(),
        height: f.height(),
        fps: f.frame_rate(),
    })
}

fn to_known(axis: PtzAxis) -> KnownCameraControl {
    match axis {
        PtzAxis::Pan => KnownCameraControl::Pan,
        PtzAxis::Tilt => KnownCameraControl::Tilt,
        PtzAxis::Zoom => KnownCameraControl::Zoom,
    }
}

impl NokhwaSource {
    fn err(&self, doing: &str, e: NokhwaError) -> DriverError {
        DriverError::Device(format!("camera {}: {doing}: {e}", self.label))
    }
}

impl FrameSource for NokhwaSource {
    fn modes(&mut self) -> Result<Vec<CaptureMode>, DriverError> {
        let formats = self
            .camera
            .compatible_camera_formats()
            .map_err(|e| self.err("listing formats", e))?;
        let mut modes: Vec<CaptureMode> = formats.iter().filter_map(to_mode).collect();
        modes.sort();
        modes.dedup();
        Ok(modes)
    }

    fn set_mode(&mut self, mode: CaptureMode) -> Result<CaptureMode, DriverError> {
        let ff = match mode.format {
            PixelFormat::Mjpeg => FrameFormat::MJPEG,
            PixelFormat::Yuyv => FrameFormat::YUYV,
        };
        let wanted = CameraFormat::new_from(mode.width, mode.height, ff, mode.fps);
        let only = [ff];
        self.camera
            .set_camera_requset(RequestedFormat::with_formats(
                RequestedFormatType::Exact(wanted),
                &only,
            ))
            .map_err(|e| self.err(&format!("setting {mode}"), e))?;
        // Read back what the device agreed to: frames are verified against
        // that, not against what was asked.
        let actual = self.camera.camera_format();
        to_mode(&actual).ok_or_else(|| {
            DriverError::Device(format!(
                "camera {} switched to {actual}, a format the driver cannot use",
                self.label
            ))
        })
    }

    fn start(&mut self) -> Result<(), DriverError> {
        if !self.camera.is_stream_open() {
            self.camera
                .open_stream()
                .map_err(|e| DriverError::Unavailable(format!("camera {}: {e}", self.label)))?;
        }
        Ok(())
    }

    fn next_frame(&mut self) -> Result<RawFrame, DriverError> {
        let buf = self
            .camera
            .frame()
            .map_err(|e| DriverError::Unavailable(format!("camera {}: {e}", self.label)))?;
        let format = to_pixel(buf.source_frame_format()).ok_or_else(|| {
            DriverError::Device(format!(
                "camera {} delivered a {} frame; only MJPEG and YUYV are handled",
                self.label,
                buf.source_frame_format()
            ))
        })?;
        let res = buf.resolution();
        let now = Utc::now();
        // Trust the device clock only when it is plausible wall-clock time.
        let captured_at = buf
            .capture_timestamp()
            .and_then(|d| DateTime::from_timestamp(d.as_secs() as i64, d.subsec_nanos()))
            .filter(|t| (now - *t).num_seconds().abs() < 3600)
            .unwrap_or(now);
        Ok(RawFrame {
            format,
            width: res.width(),
            height: res.height(),
            data: buf.buffer().to_vec(),
            captured_at,
        })
    }

    fn stop(&mut self) -> Result<(), DriverError> {
        self.camera
            .stop_stream()
            .map_err(|e| self.err("stopping the stream", e))
    }

    fn ptz_axes(&mut self) -> Vec<PtzAxis> {
        let Ok(controls) = self.camera.camera_controls() else {
            return Vec::new();
        };
        [PtzAxis::Pan, PtzAxis::Tilt, PtzAxis::Zoom]
            .into_iter()
            .filter(|a| controls.iter().any(|c| c.control() == to_known(*a)))
            .collect()
    }

    fn set_ptz(&mut self, axis: PtzAxis, value: i64) -> Result<(), DriverError> {
        self.camera
            .set_camera_control(to_known(axis), ControlValueSetter::Integer(value))
            .map_err(|e| self.err(&format!("setting {} to {value}", axis.as_str()), e))
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<NokhwaToml>(
            serde_json::json!({}),
            "NokhwaToml { device: None, format: \"auto\", resolution: \"1280x720\", fps: 30, capture_timeout_ms: 3000, ring_seconds: 10, ring_max_mb: 256, jpeg_quality: 85, warmup_frames: 2, max_clip_ms: 60000, field_of_view_deg: None, ptz: false }",
        );
    }
}
