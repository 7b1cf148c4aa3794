//! `ocr_text`: text read by an OCR program (`derived_evidence.ocr_command`,
//! tesseract by default) from the `text` regions of an image, or from the
//! whole screenshot of a screen capture without regions
//! (docs/audit-trail.md "Derived evidence").

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use image::{imageops, RgbImage};
use tokio::io::AsyncReadExt;

/// Crops lower than this are scaled up (nearest neighbour, a whole factor)
/// before OCR, pixels: recognisers read small block text badly.
pub const MIN_OCR_HEIGHT_PX: u32 = 96;

/// Largest factor a crop is scaled up by.
pub const MAX_UPSCALE: u32 = 8;

/// Most bytes of an OCR program's output kept.
const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// The `(x, y, w, h)` box of `img`, scaled up by a whole factor until it is
/// at least [`MIN_OCR_HEIGHT_PX`] high (at most [`MAX_UPSCALE`] times), with
/// a border of the crop's corner colour around it (recognisers miss text
/// touching the edge).
pub fn prepare_crop(img: &RgbImage, (x, y, w, h): (u32, u32, u32, u32)) -> RgbImage {
    let crop = imageops::crop_imm(img, x, y, w, h).to_image();
    let factor = MIN_OCR_HEIGHT_PX.div_ceil(h.max(1)).clamp(1, MAX_UPSCALE);
    let scaled = if factor > 1 {
        imageops::resize(&crop, w * factor, h * factor, imageops::FilterType::Nearest)
    } else {
        crop
    };
    let pad = 16;
    let corner = *scaled.get_pixel(0, 0);
    let mut out = RgbImage::from_pixel(scaled.width() + 2 * pad, scaled.height() + 2 * pad, corner);
    imageops::replace(&mut out, &scaled, i64::from(pad), i64::from(pad));
    out
}

/// Why an OCR run gave no text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OcrError {
    #[error("cannot start `{program}`: {message}")]
    Spawn { program: String, message: String },
    #[error("`{program}` did not finish within {seconds} s (killed)")]
    Timeout { program: String, seconds: u64 },
    #[error("`{program}` exited with {status}: {stderr}")]
    Failed {
        program: String,
        status: String,
        stderr: String,
    },
    #[error("cannot write the image for OCR: {0}")]
    Io(String),
}

/// `command` with each `{input}` replaced by `input`.
pub fn fill(command: &[String], input: &Path) -> Vec<String> {
    let path = input.to_string_lossy();
    command
        .iter()
        .map(|a| a.replace("{input}", &path))
        .collect()
}

/// Run `command` (`{input}` = the PNG at `input`), killed after `timeout`;
/// its trimmed stdout is the text.
///
/// Errors: [`OcrError::Spawn`] (program missing), [`OcrError::Timeout`],
/// [`OcrError::Failed`] (non-zero exit, with the end of its stderr).
pub async fn run(command: &[String], input: &Path, timeout: Duration) -> Result<String, OcrError> {
    let args = fill(command, input);
    let program = args.first().cloned().unwrap_or_default();
    let mut child = tokio::process::Command::new(&program)
        .args(&args[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| OcrError::Spawn {
            program: program.clone(),
            message: e.to_string(),
        })?;
    let mut stdout = child.stdout.take();
    let mut stderr = child.stderr.take();
    let work = async {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let read_out = async {
            if let Some(s) = stdout.as_mut() {
                let _ = s.take(MAX_OUTPUT_BYTES as u64).read_to_end(&mut out).await;
            }
        };
        let read_err = async {
            if let Some(s) = stderr.as_mut() {
                let _ = s.take(MAX_OUTPUT_BYTES as u64).read_to_end(&mut err).await;
            }
        };
        tokio::join!(read_out, read_err);
        let status = child.wait().await;
        (status, out, err)
    };
    match tokio::time::timeout(timeout, work).await {
        Err(_) => Err(OcrError::Timeout {
            program,
            seconds: timeout.as_secs(),
        }),
        Ok((Err(e), _, _)) => Err(OcrError::Spawn {
            program,
            message: e.to_string(),
        }),
        Ok((Ok(status), out, err)) => {
            if !status.success() {
                let err = String::from_utf8_lossy(&err);
                let tail: String = err
                    .trim()
                    .chars()
                    .rev()
                    .take(500)
                    .collect::<Vec<_>>()
                    .into_iter()
                    .rev()
                    .collect();
                return Err(OcrError::Failed {
                    program,
                    status: status.to_string(),
                    stderr: tail,
                });
            }
            Ok(String::from_utf8_lossy(&out).trim().to_string())
        }
    }
}

/// Write `img` as a PNG in `dir` (blocking: call from `spawn_blocking`).
pub fn write_png(dir: &Path, img: &RgbImage) -> Result<tempfile::TempPath, OcrError> {
    let file = tempfile::Builder::new()
        .prefix("ocr-")
        .suffix(".png")
        .tempfile_in(dir)
        .map_err(|e| OcrError::Io(e.to_string()))?;
    let path = file.into_temp_path();
    img.save_with_format(&path, image::ImageFormat::Png)
        .map_err(|e| OcrError::Io(e.to_string()))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Rgb;

    #[test]
    fn small_crops_are_scaled_up_and_padded() {
        let img = RgbImage::from_pixel(200, 100, Rgb([10, 10, 10]));
        let c = prepare_crop(&img, (10, 10, 50, 20));
        // 20 px high: factor 5 -> 250 x 100, plus 16 px each side.
        assert_eq!((c.width(), c.height()), (282, 132));
        let big = prepare_crop(&img, (0, 0, 200, 100));
        assert_eq!((big.width(), big.height()), (232, 132));
    }

    #[test]
    fn the_input_placeholder_is_filled() {
        let cmd: Vec<String> = ["tesseract", "{input}", "stdout"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            fill(&cmd, Path::new("/tmp/a.png")),
            vec!["tesseract", "/tmp/a.png", "stdout"]
        );
    }
}
