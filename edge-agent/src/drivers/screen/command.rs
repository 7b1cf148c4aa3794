//! `backend = "command"`: screen capture through configured tools.
//!
//! Settings:
//!
//! | key | default | meaning |
//! |---|---|---|
//! | `screenshot_command` | required | e.g. `import -window root {out}` (X11) or `grim {out}` (Wayland) |
//! | `screenshot_format` | `png` | extension of `{out}`, so the tool picks the format |
//! | `clip_command` | none | e.g. `ffmpeg -y -f x11grab -t {duration_s} -i :0 {out}`; without it `record_screen_clip` is unsupported |
//! | `clip_format` | `mp4` | extension of the clip's `{out}`: `mp4`, `webm`, `mkv` or `gif` |
//! | `ocr_command` | `tesseract {in} stdout` | reads `{in}`, prints the text on stdout |
//! | `timeout_ms` | `15000` | per command (a clip gets its duration on top) |
//! | `max_clip_ms` | `300000` | longest `record_screen_clip` |
//!
//! Placeholders: `{out}` (file the tool writes), `{in}` (image to read),
//! `{duration_s}` (seconds, decimal) and `{duration_ms}`. Commands run
//! without a shell (see [`super::exec`]) in the daemon's environment
//! (`DISPLAY`, `WAYLAND_DISPLAY` as the systemd unit sets them).

use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::Utc;
use serde::Deserialize;
use serde_json::{json, Map};

use super::exec::{self, CommandTemplate};
use super::{check_max_clip_ms, sniff_image_type, Capture, ScreenBackend, ScreenClip};
use crate::drivers::{ActionRequest, Defaults, DriverConfigError, DriverError, DriverSpec};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CommandToml {
    screenshot_command: String,
    screenshot_format: String,
    clip_command: Option<String>,
    clip_format: String,
    ocr_command: String,
    timeout_ms: u64,
    max_clip_ms: u64,
}

impl Default for CommandToml {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            screenshot_command: String::new(),
            screenshot_format: "png".into(),
            clip_command: None,
            clip_format: "mp4".into(),
            ocr_command: "tesseract {in} stdout".into(),
            timeout_ms: 15_000,
            max_clip_ms: 300_000,
        }
    }
}

impl Defaults for CommandToml {
    const REQUIRED: &'static [&'static str] = &["screenshot_command"];
}

/// Build the command backend (and the clip limit).
pub fn build(spec: &DriverSpec) -> Result<(Box<dyn ScreenBackend>, u64), DriverConfigError> {
    let t: CommandToml = spec.parse()?;
    let bad = |key: &str, message: String| DriverConfigError::Setting {
        capability_id: spec.capability_id.clone(),
        key: key.into(),
        message,
    };
    let screenshot =
        CommandTemplate::parse(&t.screenshot_command).map_err(|e| bad("screenshot_command", e))?;
    if !screenshot.uses("out") {
        return Err(bad(
            "screenshot_command",
            "must write the image to {out}".into(),
        ));
    }
    let clip = match &t.clip_command {
        Some(c) => {
            let c = CommandTemplate::parse(c).map_err(|e| bad("clip_command", e))?;
            if !c.uses("out") {
                return Err(bad("clip_command", "must write the clip to {out}".into()));
            }
            Some(c)
        }
        None => None,
    };
    let ocr = CommandTemplate::parse(&t.ocr_command).map_err(|e| bad("ocr_command", e))?;
    if !ocr.uses("in") {
        return Err(bad("ocr_command", "must read the image from {in}".into()));
    }
    if !matches!(t.screenshot_format.as_str(), "png" | "jpg" | "jpeg") {
        return Err(bad(
            "screenshot_format",
            format!("`{}` is not png, jpg or jpeg", t.screenshot_format),
        ));
    }
    let clip_type = match t.clip_format.as_str() {
        "mp4" => "video/mp4",
        "webm" => "video/webm",
        "mkv" => "video/x-matroska",
        "gif" => "image/gif",
        other => {
            return Err(bad(
                "clip_format",
                format!("`{other}` is not mp4, webm, mkv or gif"),
            ))
        }
    };
    if !(100..=600_000).contains(&t.timeout_ms) {
        return Err(bad(
            "timeout_ms",
            format!("{} is outside 100..=600000", t.timeout_ms),
        ));
    }
    let max_clip_ms = check_max_clip_ms(spec, t.max_clip_ms)?;
    Ok((
        Box::new(CommandScreen {
            screenshot,
            screenshot_ext: t.screenshot_format,
            clip,
            clip_ext: t.clip_format,
            clip_type,
            ocr,
            timeout: Duration::from_millis(t.timeout_ms),
            scratch: spec.state_dir.clone(),
        }),
        max_clip_ms,
    ))
}

/// Screen capture by external tools.
pub struct CommandScreen {
    screenshot: CommandTemplate,
    screenshot_ext: String,
    clip: Option<CommandTemplate>,
    clip_ext: String,
    clip_type: &'static str,
    ocr: CommandTemplate,
    timeout: Duration,
    scratch: PathBuf,
}

/// A scratch file removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

impl CommandScreen {
    fn scratch_file(&self, ext: &str) -> Result<Scratch, DriverError> {
        std::fs::create_dir_all(&self.scratch).map_err(|e| {
            DriverError::Device(format!(
                "cannot create scratch directory {}: {e}",
                self.scratch.display()
            ))
        })?;
        Ok(Scratch(self.scratch.join(format!(
            "screen-{}.{ext}",
            uuid::Uuid::new_v4().simple()
        ))))
    }

    fn read_output(path: &Path, what: &str, shown: &str) -> Result<Vec<u8>, DriverError> {
        match std::fs::read(path) {
            Ok(b) if !b.is_empty() => Ok(b),
            Ok(_) => Err(DriverError::Device(format!(
                "`{shown}` succeeded but wrote an empty {what}"
            ))),
            Err(e) => Err(DriverError::Device(format!(
                "`{shown}` succeeded but wrote no {what} to {}: {e}",
                path.display()
            ))),
        }
    }
}

impl ScreenBackend for CommandScreen {
    fn label(&self) -> String {
        format!("command `{}`", self.screenshot.as_str())
    }

    fn probe(&self) -> Result<(), String> {
        let p = self.screenshot.program();
        if exec::program_exists(p) {
            Ok(())
        } else {
            Err(format!(
                "screenshot tool `{p}` is not installed (not found in PATH)"
            ))
        }
    }

    fn screenshot(&mut self, req: &ActionRequest) -> Result<Capture, DriverError> {
        let out = self.scratch_file(&self.screenshot_ext)?;
        let out_s = out.0.display().to_string();
        let (program, args) = self.screenshot.render(&[("out", &out_s)]);
        let captured_at = Utc::now();
        exec::run(&program, &args, self.timeout, Some(&req.cancel))?;
        let bytes = Self::read_output(&out.0, "image", self.screenshot.as_str())?;
        let content_type = sniff_image_type(&bytes).ok_or_else(|| {
            DriverError::Device(format!(
                "`{}` wrote {} bytes that are not a PNG/JPEG/GIF/BMP/PPM/WebP image",
                self.screenshot.as_str(),
                bytes.len()
            ))
        })?;
        Ok(Capture {
            bytes,
            content_type: content_type.into(),
            captured_at,
        })
    }

    fn supports_clip(&self) -> bool {
        self.clip.is_some()
    }

    fn record_clip(
        &mut self,
        duration_ms: u64,
        req: &ActionRequest,
    ) -> Result<ScreenClip, DriverError> {
        let Some(template) = &self.clip else {
            return Err(DriverError::Device("no clip_command configured".into()));
        };
        let out = self.scratch_file(&self.clip_ext)?;
        let out_s = out.0.display().to_string();
        let secs = format!("{:.3}", duration_ms as f64 / 1000.0);
        let ms = duration_ms.to_string();
        let (program, args) =
            template.render(&[("out", &out_s), ("duration_s", &secs), ("duration_ms", &ms)]);
        let captured_at = Utc::now();
        let done = exec::run(
            &program,
            &args,
            self.timeout + Duration::from_millis(duration_ms),
            Some(&req.cancel),
        )?;
        let bytes = Self::read_output(&out.0, "clip", template.as_str())?;
        let mut metadata = Map::new();
        metadata.insert("tool".into(), json!(template.program()));
        metadata.insert("elapsed_ms".into(), json!(done.elapsed.as_millis() as u64));
        Ok(ScreenClip {
            bytes,
            content_type: self.clip_type.into(),
            captured_at,
            metadata,
        })
    }

    fn ocr(&mut self, image: &Capture, req: &ActionRequest) -> Result<String, DriverError> {
        let ext = match image.content_type.as_str() {
            "image/jpeg" => "jpg",
            "image/gif" => "gif",
            "image/bmp" => "bmp",
            "image/x-portable-pixmap" => "ppm",
            "image/webp" => "webp",
            _ => "png",
        };
        let input = self.scratch_file(ext)?;
        std::fs::write(&input.0, &image.bytes)
            .map_err(|e| DriverError::Device(format!("cannot write {}: {e}", input.0.display())))?;
        let in_s = input.0.display().to_string();
        let (program, args) = self.ocr.render(&[("in", &in_s)]);
        let out = exec::run(&program, &args, self.timeout, Some(&req.cancel))?;
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    fn ocr_engine(&self) -> String {
        self.ocr.program().to_string()
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<CommandToml>(
            serde_json::json!({"screenshot_command": "grim {out}"}),
            "CommandToml { screenshot_command: \"grim {out}\", screenshot_format: \"png\", clip_command: None, clip_format: \"mp4\", ocr_command: \"tesseract {in} stdout\", timeout_ms: 15000, max_clip_ms: 300000 }",
        );
    }
}
