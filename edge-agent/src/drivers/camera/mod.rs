//! Camera driver (docs/actions.md, "camera"): `snapshot`, `record_clip`,
//! `start_stream` / `stop_stream`, `set_ptz`.
//!
//! Backends: `nokhwa` (V4L2 through nokhwa, [`nokhwa_backend`]) and `sim`
//! (a rendered test pattern, [`sim`]). A backend only opens a
//! [`FrameSource`]; everything else is shared: format negotiation and
//! per-frame verification ([`frames`]), the capture thread with its
//! deadline ([`worker`]), the edge ring buffer ([`ring`]), keyframe
//! selection ([`keyframes`]) and the clip container ([`clip`]).
//!
//! Evidence: `image` artifacts (JPEG or PNG) and `video_clip` artifacts
//! (multipart MJPEG, see [`clip`]). A stream's frames stay at the edge;
//! `stop_stream` uploads only what its `keep` parameter asks for.

pub mod clip;
pub mod frames;
pub mod keyframes;
pub mod nokhwa_backend;
pub mod pattern;
pub mod ring;
pub mod sim;
pub mod worker;

use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityAction, CapabilityType};

use self::frames::{CaptureMode, FormatPreference, RawFrame, StillFormat};
use self::worker::{ClipResult, Command, Opened, WorkerConfig, WorkerHandle};
use super::{
    parse_params, unsupported, ActionOutcome, ActionRequest, Driver, DriverConfigError,
    DriverError, DriverHealth, DriverSpec, NewArtifact,
};
use crate::devices::{ProbeCache, HEALTH_PROBE_TTL};

/// A pan, tilt or zoom control.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PtzAxis {
    Pan,
    Tilt,
    Zoom,
}

impl PtzAxis {
    /// `pan`, `tilt` or `zoom` (the `set_ptz` parameter names).
    pub fn as_str(self) -> &'static str {
        match self {
            PtzAxis::Pan => "pan",
            PtzAxis::Tilt => "tilt",
            PtzAxis::Zoom => "zoom",
        }
    }
}

/// An opened camera, driven from the capture thread only (so it need not
/// be `Send`). Calls may block; the driver bounds them with deadlines.
pub trait FrameSource {
    /// Usable capture modes (MJPEG and YUYV) the device offers.
    fn modes(&mut self) -> Result<Vec<CaptureMode>, DriverError>;
    /// Ask for `mode`; return the mode the device actually delivers.
    fn set_mode(&mut self, mode: CaptureMode) -> Result<CaptureMode, DriverError>;
    /// Start streaming frames.
    fn start(&mut self) -> Result<(), DriverError>;
    /// The next frame (blocking until the device delivers one). Frames are
    /// not verified here.
    fn next_frame(&mut self) -> Result<RawFrame, DriverError>;
    /// Stop streaming (keep the device open).
    fn stop(&mut self) -> Result<(), DriverError>;
    /// Pan/tilt/zoom controls the device has.
    fn ptz_axes(&mut self) -> Vec<PtzAxis>;
    /// Set one control to `value` (device units).
    fn set_ptz(&mut self, axis: PtzAxis, value: i64) -> Result<(), DriverError>;
}

/// A camera backend: says whether its device is there and opens it.
pub trait CameraBackend: Send + Sync {
    /// e.g. `index 0`, `/dev/video2`, `sim camera "bench-cam"`.
    fn label(&self) -> String;
    /// Whether the device is present, cheaply (no streaming). `Err` says
    /// why not, e.g. `no camera at index 0: ...`.
    fn probe(&self) -> Result<(), String>;
    /// Open the device. Called on the capture thread.
    fn open(&self) -> Result<Box<dyn FrameSource>, DriverError>;
    /// For registration metadata: the device path when there is one.
    fn device_path(&self) -> Option<String> {
        None
    }
    /// Whether the device has pan/tilt/zoom controls, as known without
    /// opening it (from the bench configuration). Only then is `set_ptz`
    /// advertised and run; the controls the opened device really offers
    /// are still checked on every call.
    fn has_ptz(&self) -> bool {
        false
    }
}

/// Settings every camera backend shares (parsed from the bench TOML).
#[derive(Debug, Clone)]
pub struct CameraSettings {
    pub preference: FormatPreference,
    /// Width and height in pixels.
    pub resolution: (u32, u32),
    pub fps: u32,
    /// The longest wait for the device to open or deliver a frame.
    pub capture_timeout: Duration,
    pub ring_seconds: u32,
    pub ring_max_bytes: usize,
    /// 1..=100.
    pub jpeg_quality: u8,
    pub warmup_frames: u32,
    /// Longest `record_clip`, milliseconds.
    pub max_clip_ms: u64,
    /// Degrees, for registration metadata only.
    pub field_of_view_deg: Option<f64>,
}

/// Raw common settings as written in TOML, validated by [`Self::check`].
#[derive(Debug, Clone, Deserialize)]
pub(crate) struct CommonToml {
    pub format: String,
    pub resolution: String,
    pub fps: u32,
    pub capture_timeout_ms: u64,
    pub ring_seconds: u32,
    pub ring_max_mb: u32,
    pub jpeg_quality: u8,
    pub warmup_frames: u32,
    pub max_clip_ms: u64,
    pub field_of_view_deg: Option<f64>,
}

impl Default for CommonToml {
    /// The defaults of a real camera; the simulator changes two
    /// (`sim.rs`).
    fn default() -> Self {
        Self {
            format: "auto".into(),
            resolution: "1280x720".into(),
            fps: 30,
            capture_timeout_ms: 3000,
            ring_seconds: 10,
            ring_max_mb: 256,
            jpeg_quality: 85,
            warmup_frames: 2,
            max_clip_ms: 60_000,
            field_of_view_deg: None,
        }
    }
}

impl CommonToml {
    pub(crate) fn check(&self, spec: &DriverSpec) -> Result<CameraSettings, DriverConfigError> {
        let bad = |key: &str, message: String| DriverConfigError::Setting {
            capability_id: spec.capability_id.clone(),
            key: key.into(),
            message,
        };
        let preference = FormatPreference::parse(&self.format).ok_or_else(|| {
            bad(
                "format",
                format!("`{}` is not one of auto, mjpeg, yuyv", self.format),
            )
        })?;
        let resolution = frames::parse_resolution(&self.resolution).ok_or_else(|| {
            bad(
                "resolution",
                format!("`{}` is not WIDTHxHEIGHT, e.g. 1280x720", self.resolution),
            )
        })?;
        if !(1..=240).contains(&self.fps) {
            return Err(bad("fps", format!("{} is outside 1..=240", self.fps)));
        }
        if !(100..=60_000).contains(&self.capture_timeout_ms) {
            return Err(bad(
                "capture_timeout_ms",
                format!("{} is outside 100..=60000", self.capture_timeout_ms),
            ));
        }
        if !(1..=600).contains(&self.ring_seconds) {
            return Err(bad(
                "ring_seconds",
                format!("{} is outside 1..=600", self.ring_seconds),
            ));
        }
        if !(1..=4096).contains(&self.ring_max_mb) {
            return Err(bad(
                "ring_max_mb",
                format!("{} is outside 1..=4096", self.ring_max_mb),
            ));
        }
        if !(1..=100).contains(&self.jpeg_quality) {
            return Err(bad(
                "jpeg_quality",
                format!("{} is outside 1..=100", self.jpeg_quality),
            ));
        }
        if !(100..=600_000).contains(&self.max_clip_ms) {
            return Err(bad(
                "max_clip_ms",
                format!("{} is outside 100..=600000", self.max_clip_ms),
            ));
        }
        Ok(CameraSettings {
            preference,
            resolution,
            fps: self.fps,
            capture_timeout: Duration::from_millis(self.capture_timeout_ms),
            ring_seconds: self.ring_seconds,
            ring_max_bytes: self.ring_max_mb as usize * 1024 * 1024,
            jpeg_quality: self.jpeg_quality,
            warmup_frames: self.warmup_frames.min(100),
            max_clip_ms: self.max_clip_ms,
            field_of_view_deg: self.field_of_view_deg,
        })
    }
}

/// Build a Camera driver from its bench TOML section (`backend = "nokhwa"`
/// or `"sim"`).
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    match spec.backend.as_str() {
        "nokhwa" => nokhwa_backend::build(spec),
        "sim" => sim::build(spec),
        _ => Err(spec.unknown_backend(&["nokhwa", "sim"])),
    }
}

/// The camera driver: one capture thread per opened camera, health from
/// the thread's progress or a cached device probe.
pub struct CameraDriver {
    capability_id: String,
    backend_name: &'static str,
    backend: Arc<dyn CameraBackend>,
    settings: CameraSettings,
    worker: Option<WorkerHandle>,
    probe: ProbeCache,
    last_failure: Option<(Instant, String)>,
}

impl CameraDriver {
    /// A driver for `backend` (called by the backends' `build`).
    pub fn new(
        capability_id: &str,
        backend_name: &'static str,
        backend: Arc<dyn CameraBackend>,
        settings: CameraSettings,
    ) -> Self {
        Self {
            capability_id: capability_id.to_string(),
            backend_name,
            backend,
            settings,
            worker: None,
            probe: ProbeCache::new(HEALTH_PROBE_TTL),
            last_failure: None,
        }
    }

    fn timeout_ms(&self) -> u64 {
        self.settings.capture_timeout.as_millis() as u64
    }

    /// Open the camera if it is not open, waiting at most the capture
    /// timeout (and never past the action's deadline).
    fn ensure_open(&mut self, req: &ActionRequest) -> Result<Opened, DriverError> {
        if let Some(o) = self.worker.as_ref().and_then(|w| w.opened.clone()) {
            return Ok(o);
        }
        if self.worker.is_none() {
            let cfg = WorkerConfig {
                capability_id: self.capability_id.clone(),
                preference: self.settings.preference,
                resolution: self.settings.resolution,
                fps: self.settings.fps,
                jpeg_quality: self.settings.jpeg_quality,
                warmup_frames: self.settings.warmup_frames,
                ring_span: Duration::from_secs(u64::from(self.settings.ring_seconds)),
                ring_max_bytes: self.settings.ring_max_bytes,
            };
            self.worker = Some(worker::spawn(self.backend.clone(), cfg)?);
        }
        let limit = Instant::now() + self.settings.capture_timeout;
        let rx = self.take_rx(|w| &mut w.opened_rx);
        let result = self.wait(&rx, req, Some(limit), "opening the camera");
        self.put_rx(rx, |w| &mut w.opened_rx);
        match result {
            Ok(opened) => {
                if let Some(w) = &mut self.worker {
                    w.opened = Some(opened.clone());
                }
                self.last_failure = None;
                self.probe.invalidate();
                Ok(opened)
            }
            Err(e) => {
                // The thread has ended (or is stuck); the next action starts
                // a fresh one.
                self.worker = None;
                self.last_failure = Some((Instant::now(), e.to_string()));
                Err(e)
            }
        }
    }

    // The open receiver lives in the handle; lend it out while waiting so
    // that `wait` can take `&mut self`.
    fn take_rx<T>(&mut self, field: impl Fn(&mut WorkerHandle) -> &mut Receiver<T>) -> Receiver<T> {
        let (_, dummy) = mpsc::channel();
        match &mut self.worker {
            Some(w) => std::mem::replace(field(w), dummy),
            None => dummy,
        }
    }

    fn put_rx<T>(
        &mut self,
        rx: Receiver<T>,
        field: impl Fn(&mut WorkerHandle) -> &mut Receiver<T>,
    ) {
        if let Some(w) = &mut self.worker {
            *field(w) = rx;
        }
    }

    /// Wait for a reply from the capture thread, bounded by: the action's
    /// deadline, its cancel token, `limit`, and the stall rule (the thread
    /// stuck in one device call longer than the capture timeout).
    fn wait<T>(
        &mut self,
        rx: &Receiver<Result<T, DriverError>>,
        req: &ActionRequest,
        limit: Option<Instant>,
        what: &str,
    ) -> Result<T, DriverError> {
        let timeout = self.settings.capture_timeout;
        let entered = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_millis(10)) {
                Ok(r) => return r,
                Err(RecvTimeoutError::Disconnected) => {
                    self.worker = None;
                    return Err(DriverError::Device(format!(
                        "camera {}: the capture thread ended while {what}",
                        self.backend.label()
                    )));
                }
                Err(RecvTimeoutError::Timeout) => {}
            }
            let now = Instant::now();
            let stalled = self
                .worker
                .as_ref()
                .and_then(|w| w.progress.blocked())
                .filter(|(since, _)| now.duration_since(*since) > timeout);
            if let Some((_, doing)) = stalled {
                self.worker = None;
                return Err(DriverError::Unavailable(format!(
                    "camera {} did not respond within {} ms while {doing} (unplugged or hung?)",
                    self.backend.label(),
                    self.timeout_ms()
                )));
            }
            if limit.is_some_and(|l| now >= l) {
                self.worker = None;
                return Err(DriverError::Unavailable(format!(
                    "camera {} did not finish {what} within {} ms",
                    self.backend.label(),
                    self.timeout_ms()
                )));
            }
            if req.cancel.is_cancelled() {
                return Err(DriverError::Cancelled(format!("while {what}")));
            }
            if now >= req.deadline {
                return Err(DriverError::Timeout(
                    req.deadline.saturating_duration_since(entered).as_millis() as u64,
                ));
            }
        }
    }

    /// Send a command built around a fresh reply channel and wait for it.
    fn call<T>(
        &mut self,
        req: &ActionRequest,
        limit: Option<Instant>,
        what: &str,
        make: impl FnOnce(mpsc::Sender<Result<T, DriverError>>) -> Command,
    ) -> Result<T, DriverError> {
        self.ensure_open(req)?;
        let (tx, rx) = mpsc::channel();
        let sent = self
            .worker
            .as_ref()
            .map(|w| w.tx.send(make(tx)).is_ok())
            .unwrap_or(false);
        if !sent {
            self.worker = None;
            return Err(DriverError::Device(format!(
                "camera {}: the capture thread is gone",
                self.backend.label()
            )));
        }
        let r = self.wait(&rx, req, limit, what);
        if let Err(e) = &r {
            self.fail(e);
        }
        r
    }

    /// Remember a device failure for health; drop the capture thread when
    /// the device is gone so the next action re-opens it.
    fn fail(&mut self, e: &DriverError) {
        if matches!(e, DriverError::Unavailable(_)) {
            self.worker = None;
            self.last_failure = Some((Instant::now(), e.to_string()));
        }
    }

    fn snapshot(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default)]
            format: Option<String>,
            #[serde(default)]
            quality: Option<u8>,
        }
        let p: P = parse_params(&req.params)?;
        let format = match p.format.as_deref() {
            None => StillFormat::Jpeg,
            Some(f) => StillFormat::parse(f).ok_or_else(|| DriverError::InvalidParams {
                field: "format".into(),
                message: format!("`{f}` is not jpeg or png"),
            })?,
        };
        let quality = check_quality(p.quality, self.settings.jpeg_quality)?;
        let from_stream = self.worker.as_ref().is_some_and(|w| w.streaming);
        let limit = Instant::now()
            + self.settings.capture_timeout
            + frame_time(self.settings.fps) * (self.settings.warmup_frames + 1);
        let frame = self.call(req, Some(limit), "taking a snapshot", |reply| {
            Command::Snapshot { reply }
        })?;
        let rgb = frames::decode_rgb(&frame)?;
        let bytes = frames::encode(&rgb, format, quality)?;
        let mut metadata = Map::new();
        metadata.insert("width".into(), json!(rgb.width()));
        metadata.insert("height".into(), json!(rgb.height()));
        metadata.insert("captured_at".into(), json!(rfc3339(frame.captured_at)));
        metadata.insert("source_format".into(), json!(frame.format.as_str()));
        metadata.insert("format".into(), json!(format.as_str()));
        metadata.insert("device".into(), json!(self.backend.label()));
        metadata.insert("from_stream".into(), json!(from_stream));
        let mut summary = metadata.clone();
        summary.insert("size_bytes".into(), json!(bytes.len()));
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: vec![NewArtifact {
                artifact_type: ArtifactType::Image,
                content_type: format.content_type().into(),
                bytes,
                duration_ms: None,
                metadata,
            }],
        })
    }

    fn record_clip(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            duration_ms: u64,
            #[serde(default)]
            fps: Option<u32>,
        }
        let p: P = parse_params(&req.params)?;
        if p.duration_ms == 0 || p.duration_ms > self.settings.max_clip_ms {
            return Err(DriverError::InvalidParams {
                field: "duration_ms".into(),
                message: format!(
                    "{} is outside 1..={} (max_clip_ms)",
                    p.duration_ms, self.settings.max_clip_ms
                ),
            });
        }
        if p.fps.is_some_and(|f| !(1..=240).contains(&f)) {
            return Err(DriverError::InvalidParams {
                field: "fps".into(),
                message: "must be within 1..=240".into(),
            });
        }
        let opened = self.ensure_open(req)?;
        let fps = p.fps.unwrap_or(opened.mode.fps).min(opened.mode.fps).max(1);
        let duration = Duration::from_millis(p.duration_ms);
        let limit = Instant::now()
            + duration
            + self.settings.capture_timeout
            + frame_time(opened.mode.fps) * (self.settings.warmup_frames + 2);
        let (tx, rx) = mpsc::channel();
        let sent = self.worker.as_ref().is_some_and(|w| {
            w.tx.send(Command::Clip {
                duration,
                fps,
                reply: tx,
            })
            .is_ok()
        });
        if !sent {
            self.worker = None;
            return Err(DriverError::Device(format!(
                "camera {}: the capture thread is gone",
                self.backend.label()
            )));
        }
        let (clip, cancelled) = match self.wait(&rx, req, Some(limit), "recording a clip") {
            Ok(c) => (c, None),
            // Cancelled part way: keep the frames recorded until then.
            Err(DriverError::Cancelled(why)) => match self.cut_clip(&rx) {
                Some(c) => (c, Some(why)),
                None => return Err(DriverError::Cancelled(why)),
            },
            Err(e) => {
                if let Some(w) = &self.worker {
                    let _ = w.tx.send(Command::AbortClip);
                }
                self.fail(&e);
                return Err(e);
            }
        };
        // A cut clip lasts until its last frame.
        let duration_ms = match cancelled {
            None => p.duration_ms,
            Some(_) => clip.parts.last().map_or(0, |f| f.timestamp_ms),
        };
        let frame_count = clip.parts.len();
        let first_at = clip.parts.first().and_then(|p| p.captured_at);
        let bytes = clip::write(&clip.parts);
        let mut metadata = Map::new();
        metadata.insert("width".into(), json!(clip.mode.width));
        metadata.insert("height".into(), json!(clip.mode.height));
        metadata.insert("fps".into(), json!(fps));
        metadata.insert("frame_count".into(), json!(frame_count));
        metadata.insert("duration_ms".into(), json!(duration_ms));
        metadata.insert("source_format".into(), json!(clip.mode.format.as_str()));
        metadata.insert("container".into(), json!("multipart/x-mixed-replace"));
        metadata.insert("boundary".into(), json!(clip::BOUNDARY));
        metadata.insert("dropped_frames".into(), json!(clip.dropped_frames));
        metadata.insert("device".into(), json!(self.backend.label()));
        if let Some(at) = first_at {
            metadata.insert("captured_at".into(), json!(rfc3339(at)));
        }
        let mut summary = metadata.clone();
        summary.insert("size_bytes".into(), json!(bytes.len()));
        summary.insert("partial".into(), json!(cancelled.is_some()));
        let outcome = ActionOutcome {
            result_summary: summary,
            artifacts: vec![NewArtifact {
                artifact_type: ArtifactType::VideoClip,
                content_type: clip::content_type(),
                bytes,
                duration_ms: Some(duration_ms),
                metadata,
            }],
        };
        match cancelled {
            None => Ok(outcome),
            Some(why) => Err(DriverError::CancelledPartway {
                why: format!(
                    "record_clip cancelled after {duration_ms} of {} ms ({why}); the frames recorded until then are kept",
                    p.duration_ms
                ),
                partial: Box::new(outcome),
            }),
        }
    }

    /// Ask the capture thread to end the clip in progress now and wait
    /// (up to the capture timeout) for the frames it kept; `None` when
    /// there are none or the thread does not answer (the clip is then
    /// given up).
    fn cut_clip(&mut self, rx: &Receiver<Result<ClipResult, DriverError>>) -> Option<ClipResult> {
        let w = self.worker.as_ref()?;
        if w.tx.send(Command::CutClip).is_err() {
            return None;
        }
        match rx.recv_timeout(self.settings.capture_timeout) {
            Ok(Ok(clip)) => Some(clip),
            Ok(Err(_)) => None,
            Err(_) => {
                if let Some(w) = &self.worker {
                    let _ = w.tx.send(Command::AbortClip);
                }
                None
            }
        }
    }

    fn start_stream(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default)]
            fps: Option<u32>,
        }
        let p: P = parse_params(&req.params)?;
        if p.fps.is_some_and(|f| !(1..=240).contains(&f)) {
            return Err(DriverError::InvalidParams {
                field: "fps".into(),
                message: "must be within 1..=240".into(),
            });
        }
        let opened = self.ensure_open(req)?;
        let fps = p.fps.unwrap_or(opened.mode.fps);
        let limit = Instant::now() + self.settings.capture_timeout;
        let info = self.call(req, Some(limit), "starting the stream", |reply| {
            Command::StartStream { fps, reply }
        })?;
        if let Some(w) = &mut self.worker {
            w.streaming = true;
        }
        let mut summary = Map::new();
        summary.insert("streaming".into(), json!(true));
        summary.insert("already_streaming".into(), json!(info.already_streaming));
        summary.insert("width".into(), json!(info.mode.width));
        summary.insert("height".into(), json!(info.mode.height));
        summary.insert("fps".into(), json!(info.fps));
        summary.insert("source_format".into(), json!(info.mode.format.as_str()));
        summary.insert("ring_seconds".into(), json!(self.settings.ring_seconds));
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: Vec::new(),
        })
    }

    fn stop_stream(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default)]
            keep: Option<String>,
            #[serde(default)]
            last_ms: Option<u64>,
            #[serde(default)]
            max_keyframes: Option<usize>,
            #[serde(default)]
            change_threshold: Option<f32>,
            #[serde(default)]
            min_interval_ms: Option<u64>,
        }
        let p: P = parse_params(&req.params)?;
        let keep = p.keep.as_deref().unwrap_or("none");
        if !matches!(keep, "none" | "clip" | "keyframes") {
            return Err(DriverError::InvalidParams {
                field: "keep".into(),
                message: format!("`{keep}` is not one of none, clip, keyframes"),
            });
        }
        let max_keyframes = p.max_keyframes.unwrap_or(8);
        if !(1..=100).contains(&max_keyframes) {
            return Err(DriverError::InvalidParams {
                field: "max_keyframes".into(),
                message: "must be within 1..=100".into(),
            });
        }
        let change_threshold = p.change_threshold.unwrap_or(0.08);
        if !(0.0..=1.0).contains(&change_threshold) {
            return Err(DriverError::InvalidParams {
                field: "change_threshold".into(),
                message: "must be within 0.0..=1.0".into(),
            });
        }
        if !self.worker.as_ref().is_some_and(|w| w.streaming) {
            return Err(DriverError::InvalidParams {
                field: "action".into(),
                message: "no stream is running (call start_stream first)".into(),
            });
        }
        let limit = Instant::now() + self.settings.capture_timeout;
        let last_ms = p.last_ms;
        let take = self.call(req, Some(limit), "stopping the stream", |reply| {
            Command::StopStream { last_ms, reply }
        });
        if let Some(w) = &mut self.worker {
            w.streaming = false;
        }
        let take = take?;
        let mut summary = Map::new();
        summary.insert("keep".into(), json!(keep));
        summary.insert("frames_in_ring".into(), json!(take.frames_in_ring));
        summary.insert("ring_span_ms".into(), json!(take.ring_span_ms));
        summary.insert("stream_ms".into(), json!(take.stream_ms));
        summary.insert("dropped_frames".into(), json!(take.dropped_frames));
        summary.insert("evicted_frames".into(), json!(take.evicted_frames));
        if let Some(e) = &take.error {
            summary.insert("stream_error".into(), json!(e));
        }
        let mut artifacts = Vec::new();
        match keep {
            "clip" if !take.frames.is_empty() => {
                artifacts.push(self.stream_clip(&take.frames, &mut summary));
            }
            "keyframes" if !take.frames.is_empty() => {
                let options = keyframes::KeyframeOptions {
                    max_keyframes,
                    change_threshold,
                    min_interval_ms: p.min_interval_ms.unwrap_or(250),
                };
                artifacts = self.stream_keyframes(&take.frames, options, &mut summary)?;
            }
            _ => {
                summary.insert("kept_frames".into(), json!(0));
            }
        }
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts,
        })
    }

    /// `stop_stream` with `keep = "clip"`: the `stored` frames of the ring
    /// (not empty) as one MJPEG clip.
    fn stream_clip(
        &self,
        stored: &[ring::StoredFrame],
        summary: &mut Map<String, Value>,
    ) -> NewArtifact {
        let first = stored[0].received;
        let parts: Vec<clip::ClipPart> = stored
            .iter()
            .map(|f| clip::ClipPart {
                timestamp_ms: f.received.duration_since(first).as_millis() as u64,
                captured_at: Some(f.captured_at),
                jpeg: f.jpeg.clone(),
            })
            .collect();
        let last = &stored[stored.len() - 1];
        let frame_ms = if stored.len() > 1 {
            last.received.duration_since(first).as_millis() as u64 / (stored.len() as u64 - 1)
        } else {
            1000 / u64::from(self.settings.fps.max(1))
        };
        let duration_ms = last.received.duration_since(first).as_millis() as u64 + frame_ms;
        let mut metadata = Map::new();
        metadata.insert("width".into(), json!(last.width));
        metadata.insert("height".into(), json!(last.height));
        metadata.insert("frame_count".into(), json!(parts.len()));
        metadata.insert("duration_ms".into(), json!(duration_ms));
        metadata.insert("source_format".into(), json!(last.source_format.as_str()));
        metadata.insert("container".into(), json!("multipart/x-mixed-replace"));
        metadata.insert("boundary".into(), json!(clip::BOUNDARY));
        metadata.insert("captured_at".into(), json!(rfc3339(stored[0].captured_at)));
        metadata.insert("device".into(), json!(self.backend.label()));
        metadata.insert("from_stream".into(), json!(true));
        summary.insert("kept_frames".into(), json!(parts.len()));
        summary.insert("duration_ms".into(), json!(duration_ms));
        NewArtifact {
            artifact_type: ArtifactType::VideoClip,
            content_type: clip::content_type(),
            bytes: clip::write(&parts),
            duration_ms: Some(duration_ms),
            metadata,
        }
    }

    /// `stop_stream` with `keep = "keyframes"`: of the `stored` frames of
    /// the ring (not empty), those that changed most, as JPEG stills.
    fn stream_keyframes(
        &self,
        stored: &[ring::StoredFrame],
        options: keyframes::KeyframeOptions,
        summary: &mut Map<String, Value>,
    ) -> Result<Vec<NewArtifact>, DriverError> {
        let mut artifacts = Vec::new();
        let picked = keyframes::select(stored, options);
        let first = stored[0].received;
        for k in &picked {
            let f = &stored[k.index];
            let rgb = frames::decode_jpeg(&f.jpeg)?;
            let bytes = frames::encode(&rgb, StillFormat::Jpeg, self.settings.jpeg_quality)?;
            let mut metadata = Map::new();
            metadata.insert("width".into(), json!(rgb.width()));
            metadata.insert("height".into(), json!(rgb.height()));
            metadata.insert("captured_at".into(), json!(rfc3339(f.captured_at)));
            metadata.insert("source_format".into(), json!(f.source_format.as_str()));
            metadata.insert("format".into(), json!("jpeg"));
            metadata.insert("keyframe".into(), json!(true));
            metadata.insert(
                "stream_offset_ms".into(),
                json!(f.received.duration_since(first).as_millis() as u64),
            );
            metadata.insert("change".into(), json!(k.change));
            metadata.insert("device".into(), json!(self.backend.label()));
            artifacts.push(NewArtifact {
                artifact_type: ArtifactType::Image,
                content_type: "image/jpeg".into(),
                bytes,
                duration_ms: None,
                metadata,
            });
        }
        summary.insert("kept_frames".into(), json!(picked.len()));
        Ok(artifacts)
    }

    fn set_ptz(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct P {
            #[serde(default)]
            pan: Option<i64>,
            #[serde(default)]
            tilt: Option<i64>,
            #[serde(default)]
            zoom: Option<i64>,
        }
        let p: P = parse_params(&req.params)?;
        let values: Vec<(PtzAxis, i64)> = [
            (PtzAxis::Pan, p.pan),
            (PtzAxis::Tilt, p.tilt),
            (PtzAxis::Zoom, p.zoom),
        ]
        .into_iter()
        .filter_map(|(a, v)| v.map(|v| (a, v)))
        .collect();
        if values.is_empty() {
            return Err(DriverError::InvalidParams {
                field: "pan".into(),
                message: "give at least one of pan, tilt, zoom".into(),
            });
        }
        let limit = Instant::now() + self.settings.capture_timeout;
        let v = values.clone();
        self.call(req, Some(limit), "setting pan/tilt/zoom", |reply| {
            Command::SetPtz { values: v, reply }
        })?;
        let mut summary = Map::new();
        for (a, v) in values {
            summary.insert(a.as_str().into(), json!(v));
        }
        Ok(ActionOutcome {
            result_summary: summary,
            artifacts: Vec::new(),
        })
    }
}

fn check_quality(q: Option<u8>, default: u8) -> Result<u8, DriverError> {
    match q {
        None => Ok(default),
        Some(q) if (1..=100).contains(&q) => Ok(q),
        Some(q) => Err(DriverError::InvalidParams {
            field: "quality".into(),
            message: format!("{q} is outside 1..=100"),
        }),
    }
}

fn frame_time(fps: u32) -> Duration {
    Duration::from_millis(1000 / u64::from(fps.max(1)) + 1)
}

/// RFC 3339 with milliseconds, UTC (`2026-11-30T03:44:00.123Z`).
pub(crate) fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(SecondsFormat::Millis, true)
}

impl Driver for CameraDriver {
    fn capability_type(&self) -> CapabilityType {
        CapabilityType::Camera
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        let opened = self.worker.as_ref().and_then(|w| w.opened.as_ref());
        m.insert(
            "device_path".into(),
            json!(self
                .backend
                .device_path()
                .unwrap_or_else(|| self.backend.label())),
        );
        let (w, h) = self.settings.resolution;
        let resolutions: Vec<String> = match opened {
            Some(o) => {
                let mut r: Vec<String> = o
                    .offered
                    .iter()
                    .map(|m| format!("{}x{}", m.width, m.height))
                    .collect();
                r.sort();
                r.dedup();
                r
            }
            None => vec![format!("{w}x{h}")],
        };
        m.insert("resolution_options".into(), json!(resolutions));
        let max_fps = opened
            .map(|o| o.offered.iter().map(|m| m.fps).max().unwrap_or(o.mode.fps))
            .unwrap_or(self.settings.fps);
        m.insert("max_fps".into(), json!(max_fps));
        m.insert("supports_snapshot".into(), json!(true));
        m.insert("supports_clip_recording".into(), json!(true));
        m.insert("supports_audio".into(), json!(false));
        // Opened: whether the device has any pan/tilt/zoom control; before
        // that (at registration): what the configuration declares.
        let ptz = match opened {
            Some(o) => !o.ptz.is_empty(),
            None => self.backend.has_ptz(),
        };
        m.insert("supports_ptz".into(), json!(ptz));
        if let Some(fov) = self.settings.field_of_view_deg {
            m.insert("field_of_view".into(), json!(fov));
        }
        m.insert("backend".into(), json!(self.backend_name));
        m
    }

    fn health(&mut self) -> DriverHealth {
        let timeout = self.settings.capture_timeout;
        if let Some(w) = &self.worker {
            if let Some((since, doing)) = w.progress.blocked() {
                if since.elapsed() > timeout {
                    return DriverHealth::unhealthy(format!(
                        "camera {} stuck for {} ms while {doing}",
                        self.backend.label(),
                        since.elapsed().as_millis()
                    ));
                }
            }
            if let Some(e) = w.progress.stream_error() {
                return DriverHealth::unhealthy(format!("camera {}: {e}", self.backend.label()));
            }
            // A running stream that is not stuck proves the camera is
            // there; an idle one could have been unplugged since, so the
            // (cached) probe below decides.
            if w.opened.is_some() && w.streaming {
                return DriverHealth::healthy();
            }
        }
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

    fn supported_actions(&self) -> Vec<CapabilityAction> {
        CapabilityType::Camera
            .supported_actions()
            .iter()
            .copied()
            .filter(|a| *a != CapabilityAction::SetPtz || self.backend.has_ptz())
            .collect()
    }

    fn execute(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        tracing::debug!(capability_id = %self.capability_id, action = %req.action, "camera action");
        match req.action {
            CapabilityAction::Snapshot => self.snapshot(req),
            CapabilityAction::RecordClip => self.record_clip(req),
            CapabilityAction::StartStream => self.start_stream(req),
            CapabilityAction::StopStream => self.stop_stream(req),
            CapabilityAction::SetPtz if !self.backend.has_ptz() => Err(unsupported(
                CapabilityType::Camera,
                CapabilityAction::SetPtz,
                "this camera has no pan/tilt/zoom controls (driver setting `ptz` is false)",
            )),
            CapabilityAction::SetPtz => self.set_ptz(req),
            other => Err(unsupported(
                CapabilityType::Camera,
                other,
                "not a camera action",
            )),
        }
    }
}
