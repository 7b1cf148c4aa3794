//! Regions of interest in a camera's or screen's view (docs/audit-trail.md
//! "Derived evidence"): where on the picture an LED, a display or a button
//! is, so the registry can derive `detection_json` (colour and brightness
//! of a region) and `ocr_text` (text of a region) from the images of that
//! capability.
//!
//! An edge declares them per capability as `[capabilities.regions.<name>]`
//! with `box = [x, y, w, h]` (fractions 0..1 of the image's width and
//! height, origin top left) and `kind = "colour" | "text"`; they travel in
//! the capability's `metadata_json.regions`:
//!
//! ```json
//! {"regions": {"led": {"box": [0.80, 0.08, 0.08, 0.12], "kind": "colour"},
//!              "display": {"box": [0.20, 0.30, 0.60, 0.30], "kind": "text"}}}
//! ```

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::validate::ValidationError;

/// The `metadata_json` key that holds a capability's regions.
pub const METADATA_KEY: &str = "regions";

/// Most regions one capability may declare.
pub const MAX_REGIONS: usize = 16;

/// What the registry derives from a region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RegionKind {
    /// Mean colour, brightness and a colour name (`detection_json`).
    Colour,
    /// Text recognised in the region (`ocr_text`).
    Text,
}

/// One named region of an image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Region {
    /// The region's name, e.g. `led`: 1..=64 of `[a-z0-9_-]`.
    pub name: String,
    /// `[x, y, w, h]`: left, top, width and height as fractions 0..1 of the
    /// image's width and height; `x + w` and `y + h` at most 1.
    #[serde(rename = "box")]
    pub bbox: [f64; 4],
    pub kind: RegionKind,
}

impl Region {
    /// The region in pixels of a `width` x `height` image: `(x, y, w, h)`,
    /// at least 1 x 1 and inside the image.
    pub fn pixels(&self, width: u32, height: u32) -> (u32, u32, u32, u32) {
        let [x, y, w, h] = self.bbox;
        let px = |f: f64, n: u32| ((f * n as f64).round() as u32).min(n.saturating_sub(1));
        let x0 = px(x, width);
        let y0 = px(y, height);
        let w0 = ((w * width as f64).round() as u32).clamp(1, width - x0);
        let h0 = ((h * height as f64).round() as u32).clamp(1, height - y0);
        (x0, y0, w0, h0)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RegionBody {
    #[serde(rename = "box")]
    bbox: [f64; 4],
    kind: RegionKind,
}

/// The regions in a capability's `metadata_json`, by name (empty when the
/// key is absent).
///
/// # Errors
/// `metadata_json.regions` is not an object of `{box, kind}`, a name is not
/// `[a-z0-9_-]{1,64}`, a box lies outside 0..1 or is empty, or there are
/// more than [`MAX_REGIONS`].
pub fn parse(metadata: &Map<String, Value>) -> Result<Vec<Region>, ValidationError> {
    let Some(value) = metadata.get(METADATA_KEY) else {
        return Ok(Vec::new());
    };
    let field = |name: &str| format!("metadata_json.{METADATA_KEY}.{name}");
    let Some(obj) = value.as_object() else {
        return Err(ValidationError::new(
            format!("metadata_json.{METADATA_KEY}"),
            "must be an object of name -> {box, kind}",
        ));
    };
    if obj.len() > MAX_REGIONS {
        return Err(ValidationError::new(
            format!("metadata_json.{METADATA_KEY}"),
            format!("at most {MAX_REGIONS} regions"),
        ));
    }
    let mut out = Vec::with_capacity(obj.len());
    for (name, body) in obj {
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| matches!(b, b'a'..=b'z' | b'0'..=b'9' | b'_' | b'-'))
        {
            return Err(ValidationError::new(
                field(name),
                "a region name is 1 to 64 of a-z, 0-9, '_' and '-'",
            ));
        }
        let body: RegionBody = serde_json::from_value(body.clone()).map_err(|e| {
            ValidationError::new(
                field(name),
                format!(
                    "{e} (expected {{\"box\": [x, y, w, h], \"kind\": \"colour\" | \"text\"}})"
                ),
            )
        })?;
        let [x, y, w, h] = body.bbox;
        let unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
        if !(unit(x) && unit(y) && unit(w) && unit(h))
            || w <= 0.0
            || h <= 0.0
            || x + w > 1.0 + 1e-9
            || y + h > 1.0 + 1e-9
        {
            return Err(ValidationError::new(
                format!("{}.box", field(name)),
                "x, y, w, h are fractions 0..1 of the image, w and h above 0, x+w and y+h at most 1",
            ));
        }
        out.push(Region {
            name: name.clone(),
            bbox: body.bbox,
            kind: body.kind,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn meta(v: Value) -> Map<String, Value> {
        json!({ "regions": v }).as_object().unwrap().clone()
    }

    #[test]
    fn parses_named_regions_and_maps_them_to_pixels() {
        let r = parse(&meta(json!({
            "led": {"box": [0.5, 0.25, 0.25, 0.5], "kind": "colour"},
            "display": {"box": [0.0, 0.0, 1.0, 1.0], "kind": "text"}
        })))
        .unwrap();
        let led = r.iter().find(|r| r.name == "led").unwrap();
        assert_eq!(led.kind, RegionKind::Colour);
        assert_eq!(led.pixels(640, 480), (320, 120, 160, 240));
        let display = r.iter().find(|r| r.name == "display").unwrap();
        assert_eq!(display.pixels(640, 480), (0, 0, 640, 480));
        assert!(parse(&Map::new()).unwrap().is_empty());
    }

    #[test]
    fn refuses_boxes_outside_the_image_and_bad_names() {
        let e = parse(&meta(
            json!({"led": {"box": [0.9, 0.0, 0.2, 0.1], "kind": "colour"}}),
        ))
        .unwrap_err();
        assert_eq!(e.field, "metadata_json.regions.led.box");
        let e = parse(&meta(
            json!({"LED!": {"box": [0.1, 0.1, 0.1, 0.1], "kind": "colour"}}),
        ))
        .unwrap_err();
        assert_eq!(e.field, "metadata_json.regions.LED!");
        let e = parse(&meta(
            json!({"led": {"box": [0.1, 0.1, 0.1, 0.1], "kind": "hue"}}),
        ))
        .unwrap_err();
        assert!(e.message.contains("kind"), "{}", e.message);
        assert!(parse(&meta(json!([1, 2]))).is_err());
    }
}
