//! `ocr_text`: text read by an OCR program (`derived_evidence.ocr_command`,
//! tesseract by default) from the `text` regions of an image, or from the
//! whole screenshot of a screen capture without regions
//! (docs/audit-trail.md "Derived evidence").

use std::path::Path;
use std::time::Duration;

use image::{imageops, GrayImage, Luma, RgbImage};

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
    /// The OCR program could not run, timed out or failed.
    #[error(transparent)]
    Program(#[from] registry_agents::program::ProgramError),
    #[error("cannot write the image for OCR: {0}")]
    Io(String),
}

/// Run `command` (`{input}` = the PNG at `input`,
/// [`registry_agents::program::run`]); its trimmed stdout is the text.
///
/// Errors: [`OcrError::Program`] (missing, timed out, non-zero exit).
pub async fn run(command: &[String], input: &Path, timeout: Duration) -> Result<String, OcrError> {
    let out = registry_agents::program::run(command, input, timeout).await?;
    Ok(out.trim().to_string())
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
            registry_agents::program::fill(&cmd, Path::new("/tmp/a.png")),
            vec!["tesseract", "/tmp/a.png", "stdout"]
        );
    }
}
