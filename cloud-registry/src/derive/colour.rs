//! `detection_json`: the mean colour, brightness and a colour name of each
//! `colour` region of an image (docs/audit-trail.md "Derived evidence").

use image::RgbImage;
use serde_json::{json, Value};
use shared_protocol::regions::{Region, RegionKind};

/// What one region looks like: the mean of its pixels and names for it.
#[derive(Debug, Clone, PartialEq)]
pub struct RegionColour {
    /// Mean red, green, blue of the region's pixels, 0..=255 each.
    pub mean_rgb: [u8; 3],
    /// Relative luminance of the mean colour (Rec. 709 weights), 0..1.
    pub brightness: f64,
    /// HSV saturation of the mean colour: (max - min) / max, 0..1 (0 for
    /// black).
    pub saturation: f64,
    /// The colour's name (see [`colour_name`]).
    pub colour: &'static str,
}

/// A name for the colour `rgb` (0..=255 each): `black` when its brightest
/// channel is below 15 % (38), `white` (brightest channel at least 70 %)
/// or `grey` when its saturation is below 0.25, otherwise by hue: `red`
/// (under 15° or from 345°), `orange` (15°..45°), `yellow` (45°..70°),
/// `green` (70°..165°), `cyan` (165°..195°), `blue` (195°..255°),
/// `magenta` (255°..345°).
pub fn colour_name(rgb: [u8; 3]) -> &'static str {
    let [r, g, b] = rgb.map(|c| f64::from(c) / 255.0);
    let max = r.max(g).max(b);
    let min = r.min(g).min(b);
    if max < 0.15 {
        return "black";
    }
    let saturation = (max - min) / max;
    if saturation < 0.25 {
        return if max >= 0.7 { "white" } else { "grey" };
    }
    let delta = max - min;
    let hue = if max == r {
        60.0 * ((g - b) / delta).rem_euclid(6.0)
    } else if max == g {
        60.0 * ((b - r) / delta + 2.0)
    } else {
        60.0 * ((r - g) / delta + 4.0)
    };
    match hue {
        h if !(15.0..345.0).contains(&h) => "red",
        h if h < 45.0 => "orange",
        h if h < 70.0 => "yellow",
        h if h < 165.0 => "green",
        h if h < 195.0 => "cyan",
        h if h < 255.0 => "blue",
        _ => "magenta",
    }
}

/// The mean colour of the `(x, y, w, h)` pixel box of `img` (inside it, as
/// [`Region::pixels`] gives) and its names.
pub fn measure(img: &RgbImage, (x, y, w, h): (u32, u32, u32, u32)) -> RegionColour {
    let mut sum = [0u64; 3];
    let mut n = 0u64;
    for py in y..(y + h).min(img.height()) {
        for px in x..(x + w).min(img.width()) {
            let p = img.get_pixel(px, py).0;
            for c in 0..3 {
                sum[c] += u64::from(p[c]);
            }
            n += 1;
        }
    }
    let n = n.max(1);
    let mean_rgb = sum.map(|s| ((s + n / 2) / n).min(255) as u8);
    let [r, g, b] = mean_rgb.map(|c| f64::from(c) / 255.0);
    let max = r.max(g).max(b);
    let min = r.min(g).min(b);
    let round3 = |v: f64| (v * 1000.0).round() / 1000.0;
    RegionColour {
        mean_rgb,
        brightness: round3(0.2126 * r + 0.7152 * g + 0.0722 * b),
        saturation: round3(if max > 0.0 { (max - min) / max } else { 0.0 }),
        colour: colour_name(mean_rgb),
    }
}

/// The `regions` array of a `detection_json` for the `colour` regions of
/// `regions` on `img`: `[{name, box_px: [x, y, w, h], mean_rgb, brightness,
/// colour, saturation}]`, in the order given.
pub fn detect(img: &RgbImage, regions: &[Region]) -> Vec<Value> {
    regions
        .iter()
        .filter(|r| r.kind == RegionKind::Colour)
        .map(|r| {
            let px = r.pixels(img.width(), img.height());
            let c = measure(img, px);
            json!({
                "name": r.name,
                "box_px": [px.0, px.1, px.2, px.3],
                "mean_rgb": c.mean_rgb,
                "brightness": c.brightness,
                "colour": c.colour,
                "saturation": c.saturation,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use image::Rgb;

    #[test]
    fn names_the_test_pattern_bars_and_led_colours() {
        // The sim camera's 75 % bars.
        for (rgb, name) in [
            ([191, 191, 191], "white"),
            ([191, 191, 0], "yellow"),
            ([0, 191, 191], "cyan"),
            ([0, 191, 0], "green"),
            ([191, 0, 191], "magenta"),
            ([191, 0, 0], "red"),
            ([0, 0, 191], "blue"),
            ([16, 16, 16], "black"),
            ([110, 110, 110], "grey"),
            ([255, 140, 0], "orange"),
            ([250, 40, 30], "red"),
            ([230, 60, 240], "magenta"),
        ] {
            assert_eq!(colour_name(rgb), name, "{rgb:?}");
        }
    }

    #[test]
    fn measures_the_mean_of_a_box_and_only_colour_regions() {
        let mut img = RgbImage::from_pixel(100, 50, Rgb([0, 0, 0]));
        for y in 10..20 {
            for x in 50..60 {
                img.put_pixel(x, y, Rgb([0, 200, 0]));
            }
        }
        let c = measure(&img, (50, 10, 10, 10));
        assert_eq!(c.mean_rgb, [0, 200, 0]);
        assert_eq!(c.colour, "green");
        assert!((c.saturation - 1.0).abs() < 1e-9);
        assert!((c.brightness - 0.561).abs() < 1e-3, "{}", c.brightness);
        // Half green, half black: the mean is a darker green.
        let half = measure(&img, (45, 10, 10, 10));
        assert_eq!(half.mean_rgb, [0, 100, 0]);
        let regions = vec![
            Region {
                name: "led".into(),
                bbox: [0.5, 0.2, 0.1, 0.2],
                kind: RegionKind::Colour,
            },
            Region {
                name: "display".into(),
                bbox: [0.0, 0.0, 0.5, 0.5],
                kind: RegionKind::Text,
            },
        ];
        let out = detect(&img, &regions);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0]["name"], "led");
        assert_eq!(out[0]["box_px"], json!([50, 10, 10, 10]));
        assert_eq!(out[0]["colour"], "green");
    }
}
