//! Synthetic pictures for the simulated camera and screen: a test pattern
//! (colour bars, a moving box, the time in big blocky digits) and a 5x7
//! block font that draws upper-case text legible to people and to OCR.

use chrono::{DateTime, Timelike, Utc};
use image::{Rgb, RgbImage};

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
        'N' => [0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11],
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
