//! Camera frames: format negotiation, verification and decoding.
//!
//! A frame is checked against the format the device actually negotiated
//! *before* anything decodes it: an "MJPEG" frame must start with the JPEG
//! SOI marker (`FF D8`) and end with EOI (`FF D9`, trailing zero padding
//! allowed); a YUYV frame must be exactly `width * height * 2` bytes. A bad
//! frame is a [`DriverError::Device`], never a panic.

use std::fmt;
use std::io::Cursor;

use chrono::{DateTime, Utc};
use image::{ImageEncoder, RgbImage};

use crate::drivers::DriverError;

/// Pixel formats the camera driver handles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum PixelFormat {
    /// Motion JPEG: every frame is a JPEG image.
    Mjpeg,
    /// Packed YUV 4:2:2 (`Y0 U Y1 V`), 2 bytes per pixel.
    Yuyv,
}

impl PixelFormat {
    /// `mjpeg` or `yuyv`.
    pub fn as_str(self) -> &'static str {
        match self {
            PixelFormat::Mjpeg => "mjpeg",
            PixelFormat::Yuyv => "yuyv",
        }
    }

    /// Parse `mjpeg` / `yuyv` (case-insensitive; `mjpg` accepted).
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "mjpeg" | "mjpg" => Some(PixelFormat::Mjpeg),
            "yuyv" | "yuy2" => Some(PixelFormat::Yuyv),
            _ => None,
        }
    }
}

impl fmt::Display for PixelFormat {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Which pixel format the bench TOML asks for (`format = "auto"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FormatPreference {
    /// Whatever best matches resolution and fps; MJPEG on a tie.
    Auto,
    /// Only this format.
    Only(PixelFormat),
}

impl FormatPreference {
    /// Parse `auto`, `mjpeg` or `yuyv`.
    pub fn parse(s: &str) -> Option<Self> {
        if s.eq_ignore_ascii_case("auto") {
            return Some(FormatPreference::Auto);
        }
        PixelFormat::parse(s).map(FormatPreference::Only)
    }
}

/// One capture mode: pixel format, size in pixels, frames per second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CaptureMode {
    pub format: PixelFormat,
    pub width: u32,
    pub height: u32,
    pub fps: u32,
}

impl fmt::Display for CaptureMode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {}x{}@{}",
            self.format.as_str().to_uppercase(),
            self.width,
            self.height,
            self.fps
        )
    }
}

/// Parse a resolution written as `1280x720`.
pub fn parse_resolution(s: &str) -> Option<(u32, u32)> {
    let (w, h) = s.trim().split_once(['x', 'X'])?;
    let w: u32 = w.trim().parse().ok()?;
    let h: u32 = h.trim().parse().ok()?;
    (w > 0 && h > 0 && w <= 16384 && h <= 16384).then_some((w, h))
}

/// Pick the mode to ask the device for, among the modes it `offered`:
/// the closest resolution to `want` (exact first, else nearest pixel
/// count), then the lowest frame rate at or above `fps` (else the highest
/// below), then MJPEG before YUYV. Errors when the preference excludes
/// every offered mode, listing what the device offers.
pub fn negotiate(
    pref: FormatPreference,
    want: (u32, u32),
    fps: u32,
    offered: &[CaptureMode],
) -> Result<CaptureMode, DriverError> {
    let want_area = u64::from(want.0) * u64::from(want.1);
    offered
        .iter()
        .filter(|m| match pref {
            FormatPreference::Auto => true,
            FormatPreference::Only(f) => m.format == f,
        })
        .min_by_key(|m| {
            let exact = (m.width, m.height) != want;
            let area = (u64::from(m.width) * u64::from(m.height)).abs_diff(want_area);
            let fps_penalty = if m.fps >= fps {
                u64::from(m.fps - fps)
            } else {
                1_000 + u64::from(fps - m.fps)
            };
            (exact, area, fps_penalty, m.format)
        })
        .copied()
        .ok_or_else(|| {
            let wanted = match pref {
                FormatPreference::Auto => "MJPEG or YUYV".to_string(),
                FormatPreference::Only(f) => f.as_str().to_uppercase(),
            };
            let list = if offered.is_empty() {
                "nothing the driver can use".to_string()
            } else {
                offered
                    .iter()
                    .map(|m| m.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            DriverError::Device(format!("camera offers no {wanted} mode; it offers: {list}"))
        })
}

/// A frame as the device delivered it.
#[derive(Debug, Clone)]
pub struct RawFrame {
    /// The negotiated pixel format the bytes claim to be in.
    pub format: PixelFormat,
    pub width: u32,
    pub height: u32,
    pub data: Vec<u8>,
    pub captured_at: DateTime<Utc>,
}

/// Check a frame's structure before decoding it.
pub fn verify(frame: &RawFrame) -> Result<(), DriverError> {
    match frame.format {
        PixelFormat::Mjpeg => verify_jpeg(&frame.data),
        PixelFormat::Yuyv => {
            let expected = u64::from(frame.width) * u64::from(frame.height) * 2;
            if frame.data.len() as u64 != expected {
                return Err(DriverError::Device(format!(
                    "YUYV frame is {} bytes, expected {expected} for {}x{}",
                    frame.data.len(),
                    frame.width,
                    frame.height
                )));
            }
            if frame.width & 1 == 1 {
                return Err(DriverError::Device(format!(
                    "YUYV frame width {} is odd",
                    frame.width
                )));
            }
            Ok(())
        }
    }
}

/// Check that `data` looks like one whole JPEG image: SOI at the start,
/// EOI at the end (zero padding after EOI is allowed: UVC drivers pad).
pub fn verify_jpeg(data: &[u8]) -> Result<(), DriverError> {
    if data.len() < 4 || data[0] != 0xFF || data[1] != 0xD8 {
        let head: Vec<String> = data.iter().take(4).map(|b| format!("{b:02X}")).collect();
        return Err(DriverError::Device(format!(
            "MJPEG frame does not start with the JPEG SOI marker FF D8 (starts with [{}], {} bytes)",
            head.join(" "),
            data.len()
        )));
    }
    let end = data.iter().rposition(|&b| b != 0).map_or(0, |i| i + 1);
    if end < 4 || data[end - 2] != 0xFF || data[end - 1] != 0xD9 {
        return Err(DriverError::Device(format!(
            "MJPEG frame is truncated: no JPEG EOI marker FF D9 at its end ({} bytes)",
            data.len()
        )));
    }
    Ok(())
}

/// Verify and decode a frame to RGB. The decoded size must match the
/// negotiated size.
pub fn decode_rgb(frame: &RawFrame) -> Result<RgbImage, DriverError> {
    verify(frame)?;
    let img = match frame.format {
        PixelFormat::Mjpeg => decode_jpeg(&frame.data)?,
        PixelFormat::Yuyv => yuyv_to_rgb(&frame.data, frame.width, frame.height)?,
    };
    if img.dimensions() != (frame.width, frame.height) {
        return Err(DriverError::Device(format!(
            "MJPEG frame is {}x{} but the negotiated mode is {}x{}",
            img.width(),
            img.height(),
            frame.width,
            frame.height
        )));
    }
    Ok(img)
}

/// Decode JPEG bytes to RGB. A decoder panic on hostile input is caught and
/// reported as a device error.
pub fn decode_jpeg(data: &[u8]) -> Result<RgbImage, DriverError> {
    let result = std::panic::catch_unwind(|| {
        image::load_from_memory_with_format(data, image::ImageFormat::Jpeg)
    });
    match result {
        Ok(Ok(img)) => Ok(img.to_rgb8()),
        Ok(Err(e)) => Err(DriverError::Device(format!(
            "MJPEG frame does not decode: {e}"
        ))),
        Err(_) => Err(DriverError::Device(
            "MJPEG frame made the JPEG decoder fail".into(),
        )),
    }
}

/// Convert packed YUYV (BT.601, limited range) to RGB.
pub fn yuyv_to_rgb(data: &[u8], width: u32, height: u32) -> Result<RgbImage, DriverError> {
    let expected = width as usize * height as usize * 2;
    if data.len() != expected || width & 1 == 1 {
        return Err(DriverError::Device(format!(
            "YUYV buffer is {} bytes, expected {expected} for {width}x{height}",
            data.len()
        )));
    }
    let mut out = Vec::with_capacity(width as usize * height as usize * 3);
    for quad in data.chunks_exact(4) {
        let (y0, u, y1, v) = (quad[0], quad[1], quad[2], quad[3]);
        out.extend_from_slice(&ycbcr_to_rgb(y0, u, v));
        out.extend_from_slice(&ycbcr_to_rgb(y1, u, v));
    }
    RgbImage::from_raw(width, height, out)
        .ok_or_else(|| DriverError::Device("YUYV conversion produced a short buffer".into()))
}

fn ycbcr_to_rgb(y: u8, u: u8, v: u8) -> [u8; 3] {
    let c = (i32::from(y) - 16) * 298;
    let d = i32::from(u) - 128;
    let e = i32::from(v) - 128;
    let clamp = |x: i32| ((x + 128) >> 8).clamp(0, 255) as u8;
    [
        clamp(c + 409 * e),
        clamp(c - 100 * d - 208 * e),
        clamp(c + 516 * d),
    ]
}

/// Convert RGB to packed YUYV (BT.601, limited range); the inverse of
/// [`yuyv_to_rgb`], used by the simulated camera. Width must be even.
pub fn rgb_to_yuyv(img: &RgbImage) -> Vec<u8> {
    let (w, h) = img.dimensions();
    let mut out = Vec::with_capacity(w as usize * h as usize * 2);
    let yuv = |p: &image::Rgb<u8>| {
        let (r, g, b) = (i32::from(p[0]), i32::from(p[1]), i32::from(p[2]));
        let y = ((66 * r + 129 * g + 25 * b + 128) >> 8) + 16;
        let u = ((-38 * r - 74 * g + 112 * b + 128) >> 8) + 128;
        let v = ((112 * r - 94 * g - 18 * b + 128) >> 8) + 128;
        (
            y.clamp(0, 255) as u8,
            u.clamp(0, 255) as u8,
            v.clamp(0, 255) as u8,
        )
    };
    for row in 0..h {
        let mut x = 0;
        while x + 1 < w {
            let (y0, u0, v0) = yuv(img.get_pixel(x, row));
            let (y1, u1, v1) = yuv(img.get_pixel(x + 1, row));
            let u = ((u16::from(u0) + u16::from(u1)) / 2) as u8;
            let v = ((u16::from(v0) + u16::from(v1)) / 2) as u8;
            out.extend_from_slice(&[y0, u, y1, v]);
            x += 2;
        }
    }
    out
}

/// Still-image formats a snapshot can be returned in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StillFormat {
    Jpeg,
    Png,
}

impl StillFormat {
    /// Parse `jpeg`/`jpg` or `png`.
    pub fn parse(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "jpeg" | "jpg" => Some(StillFormat::Jpeg),
            "png" => Some(StillFormat::Png),
            _ => None,
        }
    }
    /// MIME type.
    pub fn content_type(self) -> &'static str {
        match self {
            StillFormat::Jpeg => "image/jpeg",
            StillFormat::Png => "image/png",
        }
    }
    /// `jpeg` or `png`.
    pub fn as_str(self) -> &'static str {
        match self {
            StillFormat::Jpeg => "jpeg",
            StillFormat::Png => "png",
        }
    }
}

/// Encode an RGB image; `quality` (1..=100) applies to JPEG.
pub fn encode(img: &RgbImage, format: StillFormat, quality: u8) -> Result<Vec<u8>, DriverError> {
    let mut out = Cursor::new(Vec::new());
    let (w, h) = img.dimensions();
    let res = match format {
        StillFormat::Jpeg => {
            image::codecs::jpeg::JpegEncoder::new_with_quality(&mut out, quality.clamp(1, 100))
                .write_image(img.as_raw(), w, h, image::ExtendedColorType::Rgb8)
        }
        StillFormat::Png => image::codecs::png::PngEncoder::new(&mut out).write_image(
            img.as_raw(),
            w,
            h,
            image::ExtendedColorType::Rgb8,
        ),
    };
    res.map_err(|e| DriverError::Device(format!("encoding {} failed: {e}", format.as_str())))?;
    Ok(out.into_inner())
}

/// The frame as JPEG bytes for a clip or the ring buffer: a verified MJPEG
/// frame is kept as delivered (no generation loss); YUYV is encoded.
pub fn to_jpeg(frame: &RawFrame, quality: u8) -> Result<Vec<u8>, DriverError> {
    verify(frame)?;
    match frame.format {
        PixelFormat::Mjpeg => Ok(frame.data.clone()),
        PixelFormat::Yuyv => encode(
            &yuyv_to_rgb(&frame.data, frame.width, frame.height)?,
            StillFormat::Jpeg,
            quality,
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(format: PixelFormat, width: u32, height: u32, fps: u32) -> CaptureMode {
        CaptureMode {
            format,
            width,
            height,
            fps,
        }
    }

    #[test]
    fn auto_prefers_the_exact_resolution_then_mjpeg() {
        let offered = [
            mode(PixelFormat::Yuyv, 1280, 720, 10),
            mode(PixelFormat::Mjpeg, 1280, 720, 30),
            mode(PixelFormat::Yuyv, 640, 480, 30),
            mode(PixelFormat::Mjpeg, 640, 480, 30),
        ];
        let m = negotiate(FormatPreference::Auto, (1280, 720), 30, &offered).unwrap();
        assert_eq!(m, mode(PixelFormat::Mjpeg, 1280, 720, 30));
        let m = negotiate(FormatPreference::Auto, (640, 480), 30, &offered).unwrap();
        assert_eq!(m.format, PixelFormat::Mjpeg);
    }

    #[test]
    fn a_resolution_the_camera_lacks_gets_the_nearest() {
        let offered = [
            mode(PixelFormat::Yuyv, 640, 480, 30),
            mode(PixelFormat::Yuyv, 1920, 1080, 5),
        ];
        let m = negotiate(
            FormatPreference::Only(PixelFormat::Yuyv),
            (800, 600),
            30,
            &offered,
        )
        .unwrap();
        assert_eq!((m.width, m.height), (640, 480));
    }

    #[test]
    fn asking_for_a_format_the_camera_lacks_lists_what_it_offers() {
        let offered = [mode(PixelFormat::Yuyv, 640, 480, 30)];
        let e = negotiate(
            FormatPreference::Only(PixelFormat::Mjpeg),
            (640, 480),
            30,
            &offered,
        )
        .unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("no MJPEG mode"), "{msg}");
        assert!(msg.contains("YUYV 640x480@30"), "{msg}");
    }

    #[test]
    fn yuyv_round_trips_within_rounding() {
        let img = RgbImage::from_fn(8, 2, |x, _| {
            if x < 4 {
                image::Rgb([200, 40, 40])
            } else {
                image::Rgb([30, 30, 220])
            }
        });
        let yuyv = rgb_to_yuyv(&img);
        assert_eq!(yuyv.len(), 8 * 2 * 2);
        let back = yuyv_to_rgb(&yuyv, 8, 2).unwrap();
        for (a, b) in img.pixels().zip(back.pixels()) {
            for c in 0..3 {
                assert!(
                    (i32::from(a[c]) - i32::from(b[c])).abs() <= 6,
                    "{a:?} vs {b:?}"
                );
            }
        }
    }

    #[test]
    fn jpeg_with_padding_after_eoi_is_accepted_and_garbage_is_not() {
        let img = RgbImage::from_pixel(16, 16, image::Rgb([10, 200, 10]));
        let mut jpeg = encode(&img, StillFormat::Jpeg, 80).unwrap();
        jpeg.extend_from_slice(&[0, 0, 0, 0]);
        assert!(verify_jpeg(&jpeg).is_ok());
        assert!(verify_jpeg(&[0x00, 0x00, 0xFF, 0xD9]).is_err());
        assert!(verify_jpeg(&jpeg[..jpeg.len() / 2]).is_err());
        assert!(verify_jpeg(&[]).is_err());
    }

    #[test]
    fn resolutions_parse_and_reject_nonsense() {
        assert_eq!(parse_resolution("1280x720"), Some((1280, 720)));
        assert_eq!(parse_resolution(" 640X480 "), Some((640, 480)));
        assert_eq!(parse_resolution("0x720"), None);
        assert_eq!(parse_resolution("wide"), None);
    }
}
