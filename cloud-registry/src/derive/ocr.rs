//! `ocr_text`: text read by an OCR program (`derived_evidence.ocr_command`,
//! tesseract by default) from the `text` regions of an image, or from the
//! whole screenshot of a screen capture without regions
//! (docs/audit-trail.md "Derived evidence").

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use image::{imageops, GrayImage, Luma, RgbImage};
use tokio::io::AsyncReadExt;

/// Crops lower than this are scaled up (smoothly, by a whole factor)
/// before OCR, pixels: recognisers read small text badly.
pub const MIN_OCR_HEIGHT_PX: u32 = 96;

/// Crops higher than this are scaled down by whole-factor area averaging
/// before OCR, pixels. Measured on the sim screen's 5x7 block font (800 x
/// 480, letters 49 px high): tesseract 5 read `STATUS: READY` as `STATUS:
/// FEAL!` at full size and right at half size and below, where the blocks'
/// edges turn grey.
pub const MAX_OCR_HEIGHT_PX: u32 = 300;

/// Largest factor a crop is scaled up by.
pub const MAX_UPSCALE: u32 = 8;

/// Most bytes of an OCR program's output kept.
const MAX_OUTPUT_BYTES: usize = 1 << 20;

/// The `(x, y, w, h)` box of `img` as the OCR program gets it: grey,
/// scaled by a whole factor into [`MIN_OCR_HEIGHT_PX`] ..
/// [`MAX_OCR_HEIGHT_PX`] high where it can be (up at most [`MAX_UPSCALE`]
/// times, smoothly; down by averaging), with a border of the crop's corner
/// colour around it (recognisers miss text touching the edge).
pub fn prepare_crop(img: &RgbImage, (x, y, w, h): (u32, u32, u32, u32)) -> GrayImage {
    let crop = imageops::grayscale(&imageops::crop_imm(img, x, y, w, h).to_image());
    let (w, h) = crop.dimensions();
    let scaled = if h < MIN_OCR_HEIGHT_PX {
        let factor = MIN_OCR_HEIGHT_PX.div_ceil(h.max(1)).clamp(1, MAX_UPSCALE);
        imageops::resize(
            &crop,
            w * factor,
            h * factor,
            imageops::FilterType::Triangle,
        )
    } else if h > MAX_OCR_HEIGHT_PX {
        shrink(&crop, h.div_ceil(MAX_OCR_HEIGHT_PX))
    } else {
        crop
    };
    let pad = 16;
    let corner = *scaled.get_pixel(0, 0);
    let mut out =
        GrayImage::from_pixel(scaled.width() + 2 * pad, scaled.height() + 2 * pad, corner);
    imageops::replace(&mut out, &scaled, i64::from(pad), i64::from(pad));
    out
}

/// `img` scaled down by `k`: each output pixel the mean of a k x k block.
fn shrink(img: &GrayImage, k: u32) -> GrayImage {
    let k = k.max(1);
    let (w, h) = ((img.width() / k).max(1), (img.height() / k).max(1));
    GrayImage::from_fn(w, h, |x, y| {
        let mut sum = 0u32;
        let mut n = 0u32;
        for j in 0..k {
            for i in 0..k {
                let (px, py) = (x * k + i, y * k + j);
                if px < img.width() && py < img.height() {
                    sum += u32::from(img.get_pixel(px, py).0[0]);
                    n += 1;
                }
            }
        }
        Luma([(sum / n.max(1)) as u8])
    })
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
pub fn write_png(dir: &Path, img: &GrayImage) -> Result<tempfile::TempPath, OcrError> {
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
        let img = RgbImage::from_pixel(800, 480, Rgb([10, 10, 10]));
        let c = prepare_crop(&img, (10, 10, 50, 20));
        // 20 px high: factor 5 -> 250 x 100, plus 16 px each side.
        assert_eq!((c.width(), c.height()), (282, 132));
        let mid = prepare_crop(&img, (0, 0, 200, 100));
        assert_eq!((mid.width(), mid.height()), (232, 132));
        // 480 px high: halved.
        let big = prepare_crop(&img, (0, 0, 800, 480));
        assert_eq!((big.width(), big.height()), (432, 272));
    }

    #[test]
    fn shrinking_averages_blocks() {
        let mut img = GrayImage::from_pixel(4, 2, Luma([0]));
        img.put_pixel(0, 0, Luma([200]));
        img.put_pixel(1, 1, Luma([100]));
        let s = shrink(&img, 2);
        assert_eq!(s.dimensions(), (2, 1));
        assert_eq!(s.get_pixel(0, 0).0[0], 75);
        assert_eq!(s.get_pixel(1, 0).0[0], 0);
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
