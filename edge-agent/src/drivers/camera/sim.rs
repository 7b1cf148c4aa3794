//! `backend = "sim"`: a simulated camera.
//!
//! It renders the test pattern of [`super::pattern`] (colour bars, a moving
//! box, the capture time in big digits, the device name and pan/tilt/zoom)
//! at the negotiated resolution, delivers it as real MJPEG or YUYV frames
//! paced at the negotiated frame rate, and goes through the same
//! negotiation, verification, ring buffer and clip code as a real camera.
//!
//! Settings: every nokhwa setting except `device` semantics (here `device`
//! is just a name, default `sim-camera`), plus
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `offered_formats` | `["mjpeg", "yuyv"]` | pixel formats the device offers |
//! | `offered_resolutions` | `["320x240", "640x480", "1280x720"]` | sizes it offers |
//! | `max_fps` | `30` | highest rate it offers (also offers 15 and 5) |
//! | `connected` | `true` | `false` simulates an unplugged camera |
//! | `ptz` | `false` | whether it has pan/tilt/zoom controls |
//! | `scene` | `pattern` | `pattern` (the test pattern) or `device`: the edge's simulated DUT seen from above ([`pattern::device_scene`]; needs a `[simulated_device]` table) |
//!
//! Defaults differ from nokhwa in `resolution` (`640x480`) and
//! `warmup_frames` (`0`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::Utc;
use serde::Deserialize;

use super::frames::{self, CaptureMode, PixelFormat, RawFrame, StillFormat};
use super::pattern;
use super::{CameraBackend, CameraDriver, CommonToml, FrameSource, PtzAxis};
use crate::drivers::sim_device::{self, SimDevice};
use crate::drivers::{Defaults, Driver, DriverConfigError, DriverError, DriverSpec};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct SimToml {
    device: String,
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
    offered_formats: Vec<String>,
    offered_resolutions: Vec<String>,
    max_fps: u32,
    connected: bool,
    ptz: bool,
    scene: String,
}

impl Default for SimToml {
    /// The module docs' table; `resolution` and `warmup_frames` differ
    /// from a real camera's, the rest shared ([`CommonToml`]).
    fn default() -> Self {
        let c = CommonToml::default();
        Self {
            device: "sim-camera".into(),
            format: c.format,
            resolution: "640x480".into(),
            fps: c.fps,
            capture_timeout_ms: c.capture_timeout_ms,
            ring_seconds: c.ring_seconds,
            ring_max_mb: c.ring_max_mb,
            jpeg_quality: c.jpeg_quality,
            warmup_frames: 0,
            max_clip_ms: c.max_clip_ms,
            field_of_view_deg: c.field_of_view_deg,
            offered_formats: vec!["mjpeg".into(), "yuyv".into()],
            offered_resolutions: vec!["320x240".into(), "640x480".into(), "1280x720".into()],
            max_fps: 30,
            connected: true,
            ptz: false,
            scene: "pattern".into(),
        }
    }
}

impl Defaults for SimToml {}

/// Build a simulated camera driver.
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let t: SimToml = spec.parse()?;
    let bad = |key: &str, message: String| DriverConfigError::Setting {
        capability_id: spec.capability_id.clone(),
        key: key.into(),
        message,
    };
    let mut formats = Vec::new();
    for f in &t.offered_formats {
        formats.push(
            PixelFormat::parse(f)
                .ok_or_else(|| bad("offered_formats", format!("`{f}` is not mjpeg or yuyv")))?,
        );
    }
    let mut sizes = Vec::new();
    for r in &t.offered_resolutions {
        let (w, h) = frames::parse_resolution(r)
            .ok_or_else(|| bad("offered_resolutions", format!("`{r}` is not WIDTHxHEIGHT")))?;
        if w & 1 == 1 {
            return Err(bad(
                "offered_resolutions",
                format!("`{r}`: width must be even"),
            ));
        }
        sizes.push((w, h));
    }
    let dut = match t.scene.as_str() {
        "pattern" => None,
        "device" => Some(sim_device::attached(&spec.state_dir).ok_or_else(|| {
            bad(
                "scene",
                "`device` needs the edge's [simulated_device] table".into(),
            )
        })?),
        other => {
            return Err(bad(
                "scene",
                format!("`{other}` is not one of pattern, device"),
            ))
        }
    };
    if !(1..=240).contains(&t.max_fps) {
        return Err(bad("max_fps", format!("{} is outside 1..=240", t.max_fps)));
    }
    let settings = CommonToml {
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
    }
    .check(spec)?;
    let mut offered = Vec::new();
    for f in &formats {
        for (w, h) in &sizes {
            for fps in [t.max_fps, 15, 5] {
                if fps <= t.max_fps {
                    offered.push(CaptureMode {
                        format: *f,
                        width: *w,
                        height: *h,
                        fps,
                    });
                }
            }
        }
    }
    offered.sort();
    offered.dedup();
    let backend = SimCamera {
        name: t.device,
        offered,
        connected: t.connected,
        ptz: t.ptz,
        dut,
    };
    Ok(Box::new(CameraDriver::new(
        &spec.capability_id,
        "sim",
        Arc::new(backend),
        settings,
    )))
}

/// The simulated camera's description.
pub struct SimCamera {
    name: String,
    offered: Vec<CaptureMode>,
    connected: bool,
    ptz: bool,
    /// `scene = "device"`: the DUT it films.
    dut: Option<Arc<SimDevice>>,
}

impl CameraBackend for SimCamera {
    fn label(&self) -> String {
        format!("sim camera \"{}\"", self.name)
    }

    fn probe(&self) -> Result<(), String> {
        if self.connected {
            Ok(())
        } else {
            Err(format!(
                "no camera named \"{}\": simulated as unplugged",
                self.name
            ))
        }
    }

    fn has_ptz(&self) -> bool {
        self.ptz
    }

    fn open(&self) -> Result<Box<dyn FrameSource>, DriverError> {
        self.probe().map_err(DriverError::Unavailable)?;
        // Opening a real camera takes a moment.
        std::thread::sleep(Duration::from_millis(20));
        Ok(Box::new(SimSource {
            name: self.name.clone(),
            offered: self.offered.clone(),
            mode: None,
            started_at: None,
            frame_no: 0,
            ptz: if self.ptz { Some([0, 0, 100]) } else { None },
            dut: self.dut.clone(),
        }))
    }
}

struct SimSource {
    name: String,
    offered: Vec<CaptureMode>,
    mode: Option<CaptureMode>,
    started_at: Option<Instant>,
    frame_no: u64,
    /// pan, tilt, zoom
    ptz: Option<[i64; 3]>,
    dut: Option<Arc<SimDevice>>,
}

impl FrameSource for SimSource {
    fn modes(&mut self) -> Result<Vec<CaptureMode>, DriverError> {
        Ok(self.offered.clone())
    }

    fn set_mode(&mut self, mode: CaptureMode) -> Result<CaptureMode, DriverError> {
        if !self.offered.contains(&mode) {
            return Err(DriverError::Device(format!(
                "sim camera \"{}\" rejects {mode}",
                self.name
            )));
        }
        self.mode = Some(mode);
        Ok(mode)
    }

    fn start(&mut self) -> Result<(), DriverError> {
        if self.mode.is_none() {
            return Err(DriverError::Device(
                "stream started before a mode was set".into(),
            ));
        }
        self.started_at = Some(Instant::now());
        self.frame_no = 0;
        Ok(())
    }

    fn next_frame(&mut self) -> Result<RawFrame, DriverError> {
        let (Some(mode), Some(t0)) = (self.mode, self.started_at) else {
            return Err(DriverError::Device("stream not started".into()));
        };
        let interval = Duration::from_secs_f64(1.0 / f64::from(mode.fps.max(1)));
        // Deliver at the frame rate; a slow renderer skips frame slots like
        // a real sensor does, it never bunches frames up.
        let now = Instant::now();
        let slot = (now.duration_since(t0).as_secs_f64() / interval.as_secs_f64()).ceil() as u64;
        self.frame_no = self.frame_no.max(slot);
        let due = t0 + interval.mul_f64(self.frame_no as f64);
        if let Some(wait) = due.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
        let at = Utc::now();
        let label = match self.ptz {
            Some([p, t, z]) => format!("{} P{p} T{t} Z{z}", self.name),
            None => self.name.clone(),
        };
        let img = match &self.dut {
            Some(d) => pattern::device_scene(
                mode.width,
                mode.height,
                &d.look(Instant::now()),
                &d.settings().wake_button,
            ),
            None => pattern::test_pattern(mode.width, mode.height, self.frame_no, at, &label),
        };
        self.frame_no += 1;
        let data = match mode.format {
            PixelFormat::Mjpeg => frames::encode(&img, StillFormat::Jpeg, 80)?,
            PixelFormat::Yuyv => frames::rgb_to_yuyv(&img),
        };
        Ok(RawFrame {
            format: mode.format,
            width: mode.width,
            height: mode.height,
            data,
            captured_at: at,
        })
    }

    fn stop(&mut self) -> Result<(), DriverError> {
        self.started_at = None;
        Ok(())
    }

    fn ptz_axes(&mut self) -> Vec<PtzAxis> {
        if self.ptz.is_some() {
            vec![PtzAxis::Pan, PtzAxis::Tilt, PtzAxis::Zoom]
        } else {
            Vec::new()
        }
    }

    fn set_ptz(&mut self, axis: PtzAxis, value: i64) -> Result<(), DriverError> {
        let Some(state) = &mut self.ptz else {
            return Err(DriverError::Device("no pan/tilt/zoom controls".into()));
        };
        // Ranges of a typical UVC PTZ camera (arc-seconds; zoom 100..=500).
        let (i, range) = match axis {
            PtzAxis::Pan => (0, -36_000..=36_000),
            PtzAxis::Tilt => (1, -36_000..=36_000),
            PtzAxis::Zoom => (2, 100..=500),
        };
        if !range.contains(&value) {
            return Err(DriverError::InvalidParams {
                field: axis.as_str().into(),
                message: format!("{value} is outside {}..={}", range.start(), range.end()),
            });
        }
        state[i] = value;
        Ok(())
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<SimToml>(
            serde_json::json!({}),
            "SimToml { device: \"sim-camera\", format: \"auto\", resolution: \"640x480\", fps: 30, capture_timeout_ms: 3000, ring_seconds: 10, ring_max_mb: 256, jpeg_quality: 85, warmup_frames: 0, max_clip_ms: 60000, field_of_view_deg: None, offered_formats: [\"mjpeg\", \"yuyv\"], offered_resolutions: [\"320x240\", \"640x480\", \"1280x720\"], max_fps: 30, connected: true, ptz: false, scene: \"pattern\" }",
        );
    }
}
