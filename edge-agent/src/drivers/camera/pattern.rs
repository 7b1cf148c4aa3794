//! Synthetic pictures for the simulated camera and screen: a test pattern
//! (colour bars, a moving box, the time in big blocky digits), the
//! simulated DUT seen from above ([`device_scene`]) and a 5x7 block font
//! that draws upper-case text legible to people and to OCR.

use chrono::{DateTime, Timelike, Utc};
use image::{Rgb, RgbImage};

use crate::drivers::sim_device::{Look, WakeButton, FACE_MM};

/// The 75 % colour bars (white, yellow, cyan, green, magenta, red, blue).
pub const BARS: [[u8; 3]; 7] = [
    [191, 191, 191],
    [191, 191, 0],
    [0, 191, 191],
    [0, 191, 0],
    [191, 0, 191],
    [191, 0, 0],
    [0, 0, 191],
];

/// Render the test pattern for frame number `frame` at `at`: colour bars
/// in the top two thirds, a white box that moves one step per frame, and
/// the time `HH:MM:SS.mmm` plus `label` drawn in the bottom third.
pub fn test_pattern(
    width: u32,
    height: u32,
    frame: u64,
    at: DateTime<Utc>,
    label: &str,
) -> RgbImage {
    let mut img = RgbImage::new(width, height);
    let bars_h = height * 2 / 3;
    for y in 0..height {
        for x in 0..width {
            let px = if y < bars_h {
                BARS[((x as u64 * 7) / u64::from(width.max(1))).min(6) as usize]
            } else {
                [16, 16, 16]
            };
            img.put_pixel(x, y, Rgb(px));
        }
    }
    // The moving box: crosses the bars once every 4 s at 30 fps.
    let side = (height / 8).max(2);
    let span = u64::from(width.saturating_sub(side).max(1));
    let bx = ((frame * 8) % span) as u32;
    let by = (bars_h.saturating_sub(side)) / 2;
    fill_rect(&mut img, bx, by, side, side, [255, 255, 255]);

    let time = format!(
        "{:02}:{:02}:{:02}.{:03}",
        at.hour(),
        at.minute(),
        at.second(),
        at.timestamp_subsec_millis()
    );
    let lower = height - bars_h;
    let max_scale = (width / (6 * 14)).max(1);
    let scale = (lower / 20).max(1).min(max_scale);
    draw_text(
        &mut img,
        scale * 2,
        bars_h + scale * 2,
        scale,
        &time,
        [255, 255, 255],
    );
    if !label.is_empty() {
        let y = bars_h + scale * 11;
        if y + 7 * scale <= height {
            draw_text(&mut img, scale * 2, y, scale, label, [255, 255, 0]);
        }
    }
    img
}

/// Where the device scene puts things, as `[x, y, w, h]` fractions of the
/// image (the `box` of a `[capabilities.regions.<name>]`).
pub mod device_layout {
    /// The DUT's face; the robot's frame `(0, 0)`..[`super::FACE_MM`] maps onto it.
    pub const FACE: [f64; 4] = [0.30, 0.04, 0.40, 0.92];
    /// Centre and radii of the LED disk.
    pub const LED: [f64; 4] = [0.62, 0.12, 0.025, 0.044];
    /// The display (dark text on a light background).
    pub const DISPLAY: [f64; 4] = [0.33, 0.42, 0.34, 0.22];
    /// Radii of the stylus tip seen from above.
    pub const FINGER_RADII: [f64; 2] = [0.04, 0.065];
}

/// Colour of the stylus tip in the device scene.
pub const FINGER_RGB: [u8; 3] = [20, 20, 20];
/// Colour of the wake button in the device scene.
pub const BUTTON_RGB: [u8; 3] = [235, 235, 235];

/// Robot frame (mm) to image fractions of the device scene.
pub fn mm_to_fraction(x_mm: f64, y_mm: f64) -> (f64, f64) {
    let [fx, fy, fw, fh] = device_layout::FACE;
    (fx + fw * x_mm / FACE_MM.0, fy + fh * y_mm / FACE_MM.1)
}

/// The simulated DUT seen from above as `look` says: its face, the LED
/// disk, the display with its lines in the block font (centred, as large
/// as fits), the wake button `button` and, where the robot's stylus is,
/// its tip (drawn last: it hides what is under it).
pub fn device_scene(width: u32, height: u32, look: &Look, button: &WakeButton) -> RgbImage {
    let (w, h) = (f64::from(width), f64::from(height));
    let px = |f: f64, n: f64| (f * n).round().max(0.0) as u32;
    let mut img = RgbImage::from_pixel(width, height, Rgb([40, 40, 44]));
    let [fx, fy, fw, fh] = device_layout::FACE;
    fill_rect(
        &mut img,
        px(fx, w),
        px(fy, h),
        px(fw, w),
        px(fh, h),
        [70, 70, 78],
    );
    let [lx, ly, lrx, lry] = device_layout::LED;
    fill_ellipse(&mut img, lx * w, ly * h, lrx * w, lry * h, look.led_rgb);

    let [dx, dy, dw, dh] = device_layout::DISPLAY;
    let (dx, dy, dw, dh) = (px(dx, w), px(dy, h), px(dw, w), px(dh, h));
    fill_rect(&mut img, dx, dy, dw, dh, [235, 235, 225]);
    let lines = look.display.len().max(1) as u32;
    let longest = look
        .display
        .iter()
        .map(|l| l.chars().count() as u32)
        .max()
        .unwrap_or(1)
        .max(1);
    let scale = (dw * 8 / 10 / (longest * 6))
        .min(dh * 8 / 10 / (lines * 10))
        .max(1);
    let block_h = lines * 10 * scale - 3 * scale;
    let mut y = dy + dh.saturating_sub(block_h) / 2;
    for line in &look.display {
        let x = dx + dw.saturating_sub(text_width(line, scale).saturating_sub(scale)) / 2;
        draw_text(&mut img, x, y, scale, line, [10, 10, 10]);
        y += 10 * scale;
    }

    let (bx, by) = mm_to_fraction(button.x_mm, button.y_mm);
    let (brx, bry) = (
        fw * button.radius_mm / FACE_MM.0,
        fh * button.radius_mm / FACE_MM.1,
    );
    fill_ellipse(&mut img, bx * w, by * h, brx * w, bry * h, BUTTON_RGB);

    if let Some([x, y, _]) = look.stylus_mm {
        let (sx, sy) = mm_to_fraction(x, y);
        let [rx, ry] = device_layout::FINGER_RADII;
        fill_ellipse(&mut img, sx * w, sy * h, rx * w, ry * h, FINGER_RGB);
    }
    img
}

/// Fill an ellipse centred at (cx, cy) with radii (rx, ry), pixels,
/// clipped to the image.
pub fn fill_ellipse(img: &mut RgbImage, cx: f64, cy: f64, rx: f64, ry: f64, colour: [u8; 3]) {
    let (iw, ih) = img.dimensions();
    if rx <= 0.0 || ry <= 0.0 {
        return;
    }
    let y0 = (cy - ry).floor().max(0.0) as u32;
    let y1 = ((cy + ry).ceil().max(0.0) as u32).min(ih);
    let x0 = (cx - rx).floor().max(0.0) as u32;
    let x1 = ((cx + rx).ceil().max(0.0) as u32).min(iw);
    for yy in y0..y1 {
        for xx in x0..x1 {
            let dx = (f64::from(xx) + 0.5 - cx) / rx;
            let dy = (f64::from(yy) + 0.5 - cy) / ry;
            if dx * dx + dy * dy <= 1.0 {
                img.put_pixel(xx, yy, Rgb(colour));
            }
        }
    }
}

/// Fill a rectangle, clipped to the image.
pub fn fill_rect(img: &mut RgbImage, x: u32, y: u32, w: u32, h: u32, colour: [u8; 3]) {
    let (iw, ih) = img.dimensions();
    for yy in y..(y.saturating_add(h)).min(ih) {
        for xx in x..(x.saturating_add(w)).min(iw) {
            img.put_pixel(xx, yy, Rgb(colour));
        }
    }
}

/// Draw `text` with the 5x7 font, each font pixel `scale`x`scale` image
/// pixels, glyphs 6 font pixels apart. Lower case is drawn as upper case;
/// characters without a glyph are drawn as blanks. Returns the x after the
/// last glyph.
pub fn draw_text(
    img: &mut RgbImage,
    x: u32,
    y: u32,
    scale: u32,
    text: &str,
    colour: [u8; 3],
) -> u32 {
    let mut cx = x;
    for ch in text.chars() {
        let rows = glyph(ch.to_ascii_uppercase());
        for (ry, bits) in rows.iter().enumerate() {
            for col in 0..5u32 {
                if bits & (0x10 >> col) != 0 {
                    fill_rect(
                        img,
                        cx + col * scale,
                        y + ry as u32 * scale,
                        scale,
                        scale,
                        colour,
                    );
                }
            }
        }
        cx += 6 * scale;
    }
    cx
}

/// Width in pixels of `text` drawn at `scale`.
pub fn text_width(text: &str, scale: u32) -> u32 {
    text.chars().count() as u32 * 6 * scale
}

/// True when every character of `text` has a glyph (or is a space).
pub fn is_drawable(text: &str) -> bool {
    text.chars()
        .all(|c| c == ' ' || glyph(c.to_ascii_uppercase()) != [0; 7])
}

/// The 5x7 glyph of `c`: seven rows, bit 4 is the leftmost column.
fn glyph(c: char) -> [u8; 7] {
    match c {
        '0' => [0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E],
        '1' => [0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E],
        '2' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F],
        '3' => [0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E],
        '4' => [0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02],
        '5' => [0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E],
        '6' => [0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E],
        '7' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08],
        '8' => [0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E],
        '9' => [0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C],
        'A' => [0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'B' => [0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E],
        'C' => [0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E],
        'D' => [0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C],
        'E' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F],
        'F' => [0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10],
        'G' => [0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F],
        'H' => [0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11],
        'I' => [0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E],
        'J' => [0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C],
        'K' => [0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11],
        'L' => [0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F],
        'M' => [0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11],
        'N' => [0x11, 0x19, 0x19, 0x15, 0x13, 0x13, 0x11],
        'O' => [0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'P' => [0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10],
        'Q' => [0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D],
        'R' => [0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11],
        'S' => [0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E],
        'T' => [0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04],
        'U' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E],
        'V' => [0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04],
        'W' => [0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A],
        'X' => [0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11],
        'Y' => [0x11, 0x11, 0x11, 0x0A, 0x04, 0x04, 0x04],
        'Z' => [0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F],
        ':' => [0x00, 0x0C, 0x0C, 0x00, 0x0C, 0x0C, 0x00],
        '.' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x0C, 0x0C],
        ',' => [0x00, 0x00, 0x00, 0x00, 0x0C, 0x04, 0x08],
        '-' => [0x00, 0x00, 0x00, 0x1F, 0x00, 0x00, 0x00],
        '_' => [0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x1F],
        '/' => [0x00, 0x01, 0x02, 0x04, 0x08, 0x10, 0x00],
        '%' => [0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03],
        '=' => [0x00, 0x00, 0x1F, 0x00, 0x1F, 0x00, 0x00],
        '+' => [0x00, 0x04, 0x04, 0x1F, 0x04, 0x04, 0x00],
        '(' => [0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02],
        ')' => [0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08],
        '#' => [0x0A, 0x0A, 0x1F, 0x0A, 0x1F, 0x0A, 0x0A],
        '!' => [0x04, 0x04, 0x04, 0x04, 0x04, 0x00, 0x04],
        '?' => [0x0E, 0x11, 0x01, 0x02, 0x04, 0x00, 0x04],
        _ => [0; 7],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pattern_has_bars_and_a_box_that_moves() {
        let at = Utc::now();
        let a = test_pattern(320, 240, 0, at, "CAM");
        let b = test_pattern(320, 240, 5, at, "CAM");
        assert_eq!(a.dimensions(), (320, 240));
        assert_eq!(a.get_pixel(300, 10).0, BARS[6], "blue bar at the right");
        assert_ne!(a, b, "the box moved");
    }

    #[test]
    fn text_is_drawn_and_blank_characters_are_known() {
        let mut img = RgbImage::new(100, 20);
        let end = draw_text(&mut img, 1, 1, 2, "A1", [255, 0, 0]);
        assert_eq!(end, 1 + 2 * 12);
        assert!(img.pixels().any(|p| p.0 == [255, 0, 0]));
        assert!(is_drawable("STATUS: READY 42%"));
        assert!(!is_drawable("naïve"));
    }
}
