//! Submarine cables and landing points from TeleGeography's map files
//! (name, landing point, country/region; docs/earth-command.md, "Earth data").
//!
//! - `cable-geo.json`: MultiLineString features with `id`, `name`, `color`
//!   and a label point `coordinates`; one cable id may span several features.
//! - `landing-point-geo.json`: Point features with `id`, `name` ("Tseung Kwan
//!   O, China": the country is the last part) and `is_tbd`.
//! - `cable-all.json`: `[{"id", "name"}]`, the full cable list; cables it has
//!   and the geometry lacks are kept without coordinates.
//!
//! Ids are `cable:{id}` and `landing_point:{id}`. The files do not say which
//! landing points a cable uses, so it is inferred: a landing point within
//! [`LANDING_MATCH_KM`] of an end of one of the cable's line strings lands
//! that cable. About three quarters of line ends meet a landing point; the
//! rest end at sea (branching units). A cable's countries are its inferred
//! landing points' countries.

use std::collections::{BTreeSet, HashMap};
use std::path::Path;

use serde::Deserialize;
use serde_json::Value;

use super::query::EntityKind;
use super::record::{read_file, Common};
use super::region::{normalize, Place};
use super::EntityError;

/// Largest distance, km, between a cable line end and a landing point for
/// the cable to count as landing there.
pub(crate) const LANDING_MATCH_KM: f64 = 2.0;

/// A cable or a landing point.
#[derive(Debug, Clone)]
pub(crate) struct CableRecord {
    pub common: Common,
    pub kind: EntityKind,
    /// Cables: the places of the inferred landing points. Landing points:
    /// empty (their own place is `common.place`).
    pub landing_places: Vec<Place>,
    /// Lowercase names the `landing_point` filter searches: the cable's
    /// inferred landing points, or the landing point's own name.
    pub landing_names_lc: Vec<String>,
    /// Cables: the route as line strings of `[lon, lat]` degrees, from every
    /// feature with the cable's id (empty for a cable only `cable-all.json`
    /// lists, and for landing points).
    pub lines: Vec<Vec<[f64; 2]>>,
}

#[derive(Deserialize)]
struct FeatureCollection<P> {
    features: Vec<Feature<P>>,
}

#[derive(Deserialize)]
struct Feature<P> {
    properties: P,
    #[serde(default)]
    geometry: Option<Geometry>,
}

#[derive(Deserialize)]
#[serde(tag = "type")]
enum Geometry {
    Point {
        coordinates: Vec<f64>,
    },
    LineString {
        coordinates: Vec<Vec<f64>>,
    },
    MultiLineString {
        coordinates: Vec<Vec<Vec<f64>>>,
    },
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct CableProps {
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    color: Option<String>,
    /// Label point `[lon, lat]`.
    #[serde(default)]
    coordinates: Option<Vec<f64>>,
}

#[derive(Deserialize)]
struct LandingProps {
    id: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    is_tbd: Option<bool>,
}

#[derive(Deserialize)]
struct CableListEntry {
    id: String,
    #[serde(default)]
    name: String,
}

fn parse_json<T: serde::de::DeserializeOwned>(path: &Path) -> Result<T, EntityError> {
    let bytes = read_file(path)?;
    serde_json::from_slice(&bytes).map_err(|source| EntityError::Json {
        source_name: path.display().to_string(),
        source,
    })
}

/// Splits "Muanda, Congo, Dem. Rep." into ("Muanda", "Congo, Dem. Rep.").
fn split_site_country(name: &str) -> (&str, &str) {
    let Some(i) = name.rfind(", ") else {
        return ("", name);
    };
    let (head, last) = (&name[..i], &name[i + 2..]);
    if matches!(last, "Dem. Rep." | "Rep.") {
        if let Some(j) = head.rfind(", ") {
            return (&head[..j], &name[j + 2..]);
        }
    }
    (head, last)
}

/// Landing points indexed on a 0.1° grid for the endpoint search.
struct Grid {
    cells: HashMap<(i32, i32), Vec<usize>>,
}

fn cell(lat: f64, lon: f64) -> (i32, i32) {
    ((lat * 10.0).floor() as i32, (lon * 10.0).floor() as i32)
}

fn distance_km(lat1: f64, lon1: f64, lat2: f64, lon2: f64) -> f64 {
    let x = (lon2 - lon1).to_radians() * ((lat1 + lat2) / 2.0).to_radians().cos();
    let y = (lat2 - lat1).to_radians();
    x.hypot(y) * 6371.0
}

impl Grid {
    fn new(points: &[(f64, f64)]) -> Grid {
        let mut cells: HashMap<(i32, i32), Vec<usize>> = HashMap::new();
        for (i, (lat, lon)) in points.iter().enumerate() {
            cells.entry(cell(*lat, *lon)).or_default().push(i);
        }
        Grid { cells }
    }

    /// Nearest point within [`LANDING_MATCH_KM`] (0.1° cells are wider than
    /// that everywhere but near the poles, where there are no landings).
    fn nearest(&self, points: &[(f64, f64)], lat: f64, lon: f64) -> Option<usize> {
        let (cy, cx) = cell(lat, lon);
        let mut best: Option<(usize, f64)> = None;
        for dy in -1..=1 {
            for dx in -1..=1 {
                let Some(list) = self.cells.get(&(cy + dy, cx + dx)) else {
                    continue;
                };
                for &i in list {
                    let d = distance_km(lat, lon, points[i].0, points[i].1);
                    if d <= LANDING_MATCH_KM && best.is_none_or(|(_, bd)| d < bd) {
                        best = Some((i, d));
                    }
                }
            }
        }
        best.map(|(i, _)| i)
    }
}

/// Loads cables and landing points. `geo` is required; `landing_points` and
/// `all` are optional. Errors: unreadable file or JSON not of the expected
/// shape.
pub(crate) fn load(
    geo: &Path,
    landing_points: Option<&Path>,
    all: Option<&Path>,
) -> Result<(Vec<CableRecord>, Vec<String>), EntityError> {
    let mut warnings = Vec::new();
    let geo_fc: FeatureCollection<CableProps> = parse_json(geo)?;
    let lp_fc: FeatureCollection<LandingProps> = match landing_points {
        Some(p) => parse_json(p)?,
        None => FeatureCollection { features: vec![] },
    };
    let cable_list: Vec<CableListEntry> = match all {
        Some(p) => parse_json(p)?,
        None => vec![],
    };

    // Landing points first: cables refer to them.
    let mut lps: Vec<CableRecord> = Vec::with_capacity(lp_fc.features.len());
    let mut lp_pos: Vec<(f64, f64)> = Vec::with_capacity(lp_fc.features.len());
    let mut lp_index_of_pos: Vec<usize> = Vec::new();
    for f in lp_fc.features {
        let p = f.properties;
        if p.id.trim().is_empty() {
            warnings.push("landing point without id skipped".into());
            continue;
        }
        let (site, country_text) = split_site_country(&p.name);
        let mut c = Common::new(format!("landing_point:{}", p.id), p.name.clone());
        if let Some(Geometry::Point { coordinates }) = &f.geometry {
            if coordinates.len() >= 2 {
                c.set_position(coordinates[1], coordinates[0]);
            }
        }
        // TeleGeography files Hong Kong sites under ", China": split them off
        // by name list and coordinates. Taiwan has its own suffix.
        c.place = Place::from_country(country_text, false);
        c.place.split_china_by_site(&normalize(site), c.lat, c.lon);
        c.country = c
            .place
            .display_name()
            .map(str::to_owned)
            .or_else(|| (!country_text.is_empty()).then(|| country_text.to_owned()));
        c.prop("kind", "landing_point");
        c.prop("site", site);
        c.prop("country_in_source", country_text);
        if let Some(code) = c.place.code {
            c.prop("country_code", code);
        }
        if let Some(tbd) = p.is_tbd {
            c.prop("is_tbd", tbd);
        }
        if let (Some(lat), Some(lon)) = (c.lat, c.lon) {
            lp_pos.push((lat, lon));
            lp_index_of_pos.push(lps.len());
        }
        let own_name = c.name_lc.clone();
        lps.push(CableRecord {
            common: c,
            kind: EntityKind::LandingPoint,
            landing_places: vec![],
            landing_names_lc: vec![own_name],
            lines: vec![],
        });
    }
    let grid = Grid::new(&lp_pos);

    // Cables: merge features by id, collecting inferred landing points.
    struct Acc {
        name: String,
        color: Option<String>,
        label: Option<(f64, f64)>,
        features: usize,
        landings: BTreeSet<usize>,
        lines: Vec<Vec<[f64; 2]>>,
    }
    let mut order: Vec<String> = Vec::new();
    let mut cables: HashMap<String, Acc> = HashMap::new();
    for f in geo_fc.features {
        let p = f.properties;
        if p.id.trim().is_empty() {
            warnings.push("cable feature without id skipped".into());
            continue;
        }
        let acc = cables.entry(p.id.clone()).or_insert_with(|| {
            order.push(p.id.clone());
            Acc {
                name: p.name.clone(),
                color: p.color.clone(),
                label: None,
                features: 0,
                landings: BTreeSet::new(),
                lines: Vec::new(),
            }
        });
        acc.features += 1;
        if acc.label.is_none() {
            acc.label = p
                .coordinates
                .as_ref()
                .filter(|c| c.len() >= 2)
                .map(|c| (c[1], c[0]));
        }
        let lines: Vec<&Vec<Vec<f64>>> = match &f.geometry {
            Some(Geometry::MultiLineString { coordinates }) => coordinates.iter().collect(),
            Some(Geometry::LineString { coordinates }) => vec![coordinates],
            _ => vec![],
        };
        for line in lines {
            if acc.label.is_none() {
                acc.label = line.first().filter(|c| c.len() >= 2).map(|c| (c[1], c[0]));
            }
            for end in [line.first(), line.last()].into_iter().flatten() {
                if end.len() < 2 {
                    continue;
                }
                if let Some(i) = grid.nearest(&lp_pos, end[1], end[0]) {
                    acc.landings.insert(lp_index_of_pos[i]);
                }
            }
            let points: Vec<[f64; 2]> = line
                .iter()
                .filter(|c| {
                    c.len() >= 2
                        && c[0].is_finite()
                        && c[1].is_finite()
                        && c[0].abs() <= 180.0
                        && c[1].abs() <= 90.0
                })
                .map(|c| [c[0], c[1]])
                .collect();
            if points.len() >= 2 {
                acc.lines.push(points);
            }
        }
    }
    for entry in cable_list {
        if !entry.id.trim().is_empty() && !cables.contains_key(&entry.id) {
            order.push(entry.id.clone());
            cables.insert(
                entry.id,
                Acc {
                    name: entry.name,
                    color: None,
                    label: None,
                    features: 0,
                    landings: BTreeSet::new(),
                    lines: Vec::new(),
                },
            );
        }
    }

    let mut lp_cables: Vec<Vec<String>> = vec![Vec::new(); lps.len()];
    let mut out: Vec<CableRecord> = Vec::with_capacity(order.len() + lps.len());
    for id in order {
        let Some(acc) = cables.remove(&id) else {
            continue;
        };
        let cable_id = format!("cable:{id}");
        let name = if acc.name.is_empty() {
            id.clone()
        } else {
            acc.name
        };
        let mut c = Common::new(cable_id.clone(), name);
        if let Some((lat, lon)) = acc.label {
            c.set_position(lat, lon);
        }
        let mut places: Vec<Place> = Vec::new();
        let mut landing_names = Vec::new();
        let mut landing_ids = Vec::new();
        let mut countries: BTreeSet<String> = BTreeSet::new();
        for &i in &acc.landings {
            let lp = &lps[i];
            lp_cables[i].push(cable_id.clone());
            landing_ids.push(Value::String(lp.common.id.clone()));
            landing_names.push(lp.common.name_lc.clone());
            if let Some(country) = &lp.common.country {
                countries.insert(country.clone());
            }
            if !places
                .iter()
                .any(|p| p.code == lp.common.place.code && p.text_lc == lp.common.place.text_lc)
            {
                places.push(lp.common.place.clone());
            }
        }
        c.prop("kind", "cable");
        if let Some(color) = acc.color {
            c.prop("color", color);
        }
        c.prop("feature_count", acc.features);
        c.prop("landing_point_ids", Value::Array(landing_ids));
        c.prop(
            "landing_countries",
            Value::Array(countries.into_iter().map(Value::String).collect()),
        );
        c.prop("landing_points_inferred", true);
        out.push(CableRecord {
            common: c,
            kind: EntityKind::Cable,
            landing_places: places,
            landing_names_lc: landing_names,
            lines: acc.lines,
        });
    }
    for (lp, ids) in lps.iter_mut().zip(lp_cables) {
        lp.common.prop(
            "cable_ids",
            Value::Array(ids.into_iter().map(Value::String).collect()),
        );
    }
    out.extend(lps);
    Ok((out, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn country_suffix_with_comma_stays_whole() {
        assert_eq!(
            split_site_country("Muanda, Congo, Dem. Rep."),
            ("Muanda", "Congo, Dem. Rep.")
        );
        assert_eq!(
            split_site_country("Tseung Kwan O, China"),
            ("Tseung Kwan O", "China")
        );
        assert_eq!(
            split_site_country("Barber’s Point, HI, United States"),
            ("Barber’s Point, HI", "United States")
        );
    }
}
