//! `backend = "sim"`: a simulated screen.
//!
//! It renders a synthetic device screen (a title bar, the configured text
//! lines, the current time and a screenshot counter) in the 5x7 block font,
//! and its OCR returns exactly the text it drew on that screenshot, so tests
//! and dry runs can assert on screen text end to end. Clips are multipart
//! MJPEG (see `camera::clip`) rendered at 5 frames per second in real time.
//!
//! Settings:
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `device` | `sim-screen` | a name |
//! | `resolution` | `800x480` | screen size |
//! | `title` | `DEVICE UNDER TEST` | title bar text |
//! | `lines` | `["STATUS: READY"]` | text shown (upper case, digits, `:.,-_/%=+()#!?`) |
//! | `connected` | `true` | `false` simulates a display that is gone |
//! | `max_clip_ms` | `300000` | longest `record_screen_clip` |

use std::time::{Duration, Instant};

use chrono::{Timelike, Utc};
use image::RgbImage;
use serde::Deserialize;
use serde_json::{json, Map};

use super::{check_max_clip_ms, Capture, ScreenBackend, ScreenClip};
use crate::drivers::camera::frames::{encode, parse_resolution, StillFormat};
use crate::drivers::camera::{clip, pattern};
use crate::drivers::{ActionRequest, Defaults, DriverConfigError, DriverError, DriverSpec};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct SimToml {
    device: String,
    resolution: String,
    title: String,
    lines: Vec<String>,
    connected: bool,
    max_clip_ms: u64,
}

impl Default for SimToml {
    /// The documented defaults.
    fn default() -> Self {
        Self {
            device: "sim-screen".into(),
            resolution: "800x480".into(),
            title: "DEVICE UNDER TEST".into(),
            lines: vec!["STATUS: READY".into()],
            connected: true,
            max_clip_ms: 300_000,
        }
    }
}

impl Defaults for SimToml {}

/// Frames per second of a simulated screen recording.
const CLIP_FPS: u64 = 5;

/// Build the simulated screen (and the clip limit).
pub fn build(spec: &DriverSpec) -> Result<(Box<dyn ScreenBackend>, u64), DriverConfigError> {
    let t: SimToml = spec.parse()?;
    let bad = |key: &str, message: String| DriverConfigError::Setting {
        capability_id: spec.capability_id.clone(),
        key: key.into(),
        message,
    };
    let (width, height) = parse_resolution(&t.resolution).ok_or_else(|| {
        bad(
            "resolution",
            format!("`{}` is not WIDTHxHEIGHT", t.resolution),
        )
    })?;
    if width < 160 || height < 120 {
        return Err(bad("resolution", "must be at least 160x120".into()));
    }
    for text in std::iter::once(&t.title).chain(&t.lines) {
        if !pattern::is_drawable(text) {
            return Err(bad(
                "lines",
                format!("`{text}` has characters the simulated screen cannot draw"),
            ));
        }
    }
    let max_clip_ms = check_max_clip_ms(spec, t.max_clip_ms)?;
    Ok((
        Box::new(SimScreen {
            name: t.device,
            width,
            height,
            title: t.title.to_uppercase(),
            lines: t.lines.iter().map(|l| l.to_uppercase()).collect(),
            connected: t.connected,
            shots: 0,
            last: None,
        }),
        max_clip_ms,
    ))
}

/// The simulated screen.
pub struct SimScreen {
    name: String,
    width: u32,
    height: u32,
    title: String,
    lines: Vec<String>,
    connected: bool,
    shots: u64,
    /// The last screenshot's bytes and the text drawn on it.
    last: Option<(Vec<u8>, String)>,
}

impl SimScreen {
    /// Render the screen; returns the image and the text drawn, one line
    /// per text row, top to bottom.
    fn render(&self, shot: u64) -> (RgbImage, String) {
        let mut img = RgbImage::from_pixel(self.width, self.height, image::Rgb([245, 245, 240]));
        let now = Utc::now();
        let mut text_lines = vec![self.title.clone()];
        text_lines.extend(self.lines.iter().cloned());
        text_lines.push(format!(
            "TIME {:02}:{:02}:{:02}",
            now.hour(),
            now.minute(),
            now.second()
        ));
        text_lines.push(format!("SCREEN {shot}"));
        // As large as fits: the longest line across, every line down.
        let longest = text_lines
            .iter()
            .map(|l| l.chars().count())
            .max()
            .unwrap_or(1) as u32;
        let by_width = self.width / (6 * longest + 4);
        let by_height = self.height / (12 * text_lines.len() as u32 + 2);
        let scale = by_width.min(by_height).clamp(1, 8);
        let row = 10 * scale;
        pattern::fill_rect(&mut img, 0, 0, self.width, row + 2 * scale, [30, 60, 120]);
        let mut drawn = Vec::new();
        for (i, line) in text_lines.iter().enumerate() {
            let y = scale + i as u32 * (row + 2 * scale);
            if y + 7 * scale > self.height {
                break;
            }
            // Clip long lines at the right edge, whole glyphs only.
            let fit = ((self.width - 2 * scale) / (6 * scale)) as usize;
            let shown: String = line.chars().take(fit).collect();
            let colour = if i == 0 {
                [255, 255, 255]
            } else {
                [20, 20, 20]
            };
            pattern::draw_text(&mut img, 2 * scale, y, scale, &shown, colour);
            drawn.push(shown.trim_end().to_string());
        }
        (img, drawn.join("\n"))
    }

    fn check_connected(&self) -> Result<(), DriverError> {
        if self.connected {
            Ok(())
        } else {
            Err(DriverError::Unavailable(format!(
                "sim screen \"{}\": no display (simulated as disconnected)",
                self.name
            )))
        }
    }
}

impl ScreenBackend for SimScreen {
    fn label(&self) -> String {
        format!("sim screen \"{}\"", self.name)
    }

    fn probe(&self) -> Result<(), String> {
        self.check_connected().map_err(|e| e.to_string())
    }

    fn screenshot(&mut self, _req: &ActionRequest) -> Result<Capture, DriverError> {
        self.check_connected()?;
        // A screenshot tool takes a few tens of milliseconds.
        std::thread::sleep(Duration::from_millis(30));
        self.shots += 1;
        let captured_at = Utc::now();
        let (img, text) = self.render(self.shots);
        let bytes = encode(&img, StillFormat::Png, 100)?;
        self.last = Some((bytes.clone(), text));
        Ok(Capture {
            bytes,
            content_type: "image/png".into(),
            captured_at,
        })
    }

    fn supports_clip(&self) -> bool {
        true
    }

    fn record_clip(
        &mut self,
        duration_ms: u64,
        req: &ActionRequest,
    ) -> Result<ScreenClip, DriverError> {
        self.check_connected()?;
        let started = Instant::now();
        let captured_at = Utc::now();
        let interval = Duration::from_millis(1000 / CLIP_FPS);
        let mut parts = Vec::new();
        let mut n = 0u64;
        while started.elapsed() < Duration::from_millis(duration_ms) {
            if req.cancel.is_cancelled() {
                return Err(DriverError::Cancelled("while recording the screen".into()));
            }
            // The frame's time is when it was grabbed, not when encoded.
            let timestamp_ms = started.elapsed().as_millis() as u64;
            let captured_at = Some(Utc::now());
            let (img, _) = self.render(self.shots);
            parts.push(clip::ClipPart {
                timestamp_ms,
                captured_at,
                jpeg: encode(&img, StillFormat::Jpeg, 80)?,
            });
            n += 1;
            if let Some(wait) =
                (started + interval * n as u32).checked_duration_since(Instant::now())
            {
                std::thread::sleep(
                    wait.min(Duration::from_millis(duration_ms).saturating_sub(started.elapsed())),
                );
            }
        }
        let mut metadata = Map::new();
        metadata.insert("frame_count".into(), json!(parts.len()));
        metadata.insert("fps".into(), json!(CLIP_FPS));
        metadata.insert("width".into(), json!(self.width));
        metadata.insert("height".into(), json!(self.height));
        metadata.insert("container".into(), json!("multipart/x-mixed-replace"));
        Ok(ScreenClip {
            bytes: clip::write(&parts),
            content_type: clip::content_type(),
            captured_at,
            metadata,
        })
    }

    fn ocr(&mut self, image: &Capture, _req: &ActionRequest) -> Result<String, DriverError> {
        // Reading text takes an OCR engine a moment.
        std::thread::sleep(Duration::from_millis(100));
        match &self.last {
            Some((bytes, text)) if *bytes == image.bytes => Ok(text.clone()),
            _ => Err(DriverError::Device(
                "the simulated OCR reads only screenshots of the simulated screen".into(),
            )),
        }
    }

    fn ocr_engine(&self) -> String {
        "sim".into()
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
            "SimToml { device: \"sim-screen\", resolution: \"800x480\", title: \"DEVICE UNDER TEST\", lines: [\"STATUS: READY\"], connected: true, max_clip_ms: 300000 }",
        );
    }
}
