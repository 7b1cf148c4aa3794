//! The Earth map layers as GeoJSON FeatureCollections (docs/earth-command.md,
//! "Layers"), built from the same records the command queries, so every
//! feature's `entity_id` is the id a command's `matched_entities` and
//! `highlight_entities.entity_ids` name.
//!
//! Coordinates are `[lon, lat]` degrees rounded to 5 decimals (about 1 m);
//! satellites carry their height in `properties.alt_km`. Records without a
//! position are left out and counted in the collection's `missing_data`.

use chrono::{DateTime, SecondsFormat, Utc};
use serde_json::{json, Map, Value};
use shared_protocol::earth::EarthDomain;

use super::catalog::{EntityCatalog, STALE_TLE_DAYS};
use super::query::EntityKind;
use super::record::Common;
use super::satellites::PositionOutcome;

/// One map layer, `GET /api/v1/visualization/geo/{layer}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Layer {
    /// Points at the SGP4 position for the requested time.
    Satellites,
    /// Points: TOP500 systems, Epoch AI GPU clusters and data centers.
    ComputeCenters,
    /// One MultiLineString per cable (`cable:{id}`).
    Cables,
    /// Points: cable landing points (`landing_point:{id}`), in the `cables`
    /// domain of the command.
    LandingPoints,
    /// Points: BGP events that have a location.
    BgpEvents,
    /// Points from the configured vessels FeatureCollection.
    Vessels,
    /// Points from the configured news FeatureCollection.
    News,
}

impl Layer {
    /// Every layer, in path order.
    pub const ALL: [Layer; 7] = [
        Layer::Satellites,
        Layer::ComputeCenters,
        Layer::Cables,
        Layer::LandingPoints,
        Layer::BgpEvents,
        Layer::Vessels,
        Layer::News,
    ];

    /// The path segment: `satellites`, `compute-centers`, `cables`,
    /// `landing-points`, `bgp-events`, `vessels`, `news`.
    pub fn as_str(self) -> &'static str {
        match self {
            Layer::Satellites => "satellites",
            Layer::ComputeCenters => "compute-centers",
            Layer::Cables => "cables",
            Layer::LandingPoints => "landing-points",
            Layer::BgpEvents => "bgp-events",
            Layer::Vessels => "vessels",
            Layer::News => "news",
        }
    }

    /// The layer a path segment names.
    pub fn from_path(segment: &str) -> Option<Layer> {
        Layer::ALL.into_iter().find(|l| l.as_str() == segment)
    }

    /// The command domain whose entities this layer draws.
    pub fn domain(self) -> EarthDomain {
        match self {
            Layer::Satellites => EarthDomain::Satellites,
            Layer::ComputeCenters => EarthDomain::ComputeCenters,
            Layer::Cables | Layer::LandingPoints => EarthDomain::Cables,
            Layer::BgpEvents => EarthDomain::Bgp,
            Layer::Vessels => EarthDomain::Vessels,
            Layer::News => EarthDomain::News,
        }
    }

    /// True when the features depend on the requested time (`at`).
    pub fn is_timed(self) -> bool {
        self == Layer::Satellites
    }
}

fn round5(v: f64) -> Value {
    serde_json::Number::from_f64((v * 1e5).round() / 1e5)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

fn point(lon: f64, lat: f64) -> Value {
    json!({"type": "Point", "coordinates": [round5(lon), round5(lat)]})
}

/// `properties` of a feature: `entity_id`, `domain`, `name`, `country`
/// (when known), then the record's own properties.
fn properties(c: &Common, domain: EarthDomain) -> Map<String, Value> {
    let mut p = Map::with_capacity(c.properties.len() + 4);
    p.insert("entity_id".into(), Value::String(c.id.clone()));
    p.insert("domain".into(), Value::String(domain.as_str().into()));
    p.insert("name".into(), Value::String(c.name.clone()));
    if let Some(country) = &c.country {
        p.insert("country".into(), Value::String(country.clone()));
    }
    for (k, v) in &c.properties {
        p.entry(k.clone()).or_insert_with(|| v.clone());
    }
    p
}

fn feature(id: &str, geometry: Value, properties: Map<String, Value>) -> Value {
    json!({"type": "Feature", "id": id, "geometry": geometry, "properties": properties})
}

fn located_point(c: &Common, domain: EarthDomain) -> Option<Value> {
    let (lat, lon) = (c.lat?, c.lon?);
    Some(feature(&c.id, point(lon, lat), properties(c, domain)))
}

impl EntityCatalog {
    /// `layer` as a GeoJSON FeatureCollection with foreign members:
    ///
    /// ```json
    /// {"type": "FeatureCollection", "layer": "satellites", "domain": "satellites",
    ///  "at": "2026-12-02T05:00:00Z", "count": 3159, "missing_data": ["…"],
    ///  "features": [{"type": "Feature", "id": "satellite:norad:25544",
    ///                "geometry": {"type": "Point", "coordinates": [lon, lat]},
    ///                "properties": {"entity_id": "satellite:norad:25544", …}}]}
    /// ```
    ///
    /// `at` positions satellites (whole seconds; other layers ignore it and
    /// carry no `at`). `count` is the number of features. `missing_data`
    /// holds the domain's notes (no configured source, failed fetch) and
    /// how many records had no position. CPU only (SGP4 for satellites,
    /// a few ms for the shipped file); never fails.
    pub fn layer_collection(&self, layer: Layer, at: DateTime<Utc>) -> Value {
        let domain = layer.domain();
        let mut missing: Vec<String> = self.domain_notes.get(&domain).cloned().unwrap_or_default();
        let mut features: Vec<Value> = Vec::new();
        let mut unplaced = 0usize;
        let mut push = |f: Option<Value>| match f {
            Some(f) => features.push(f),
            None => unplaced += 1,
        };
        match layer {
            Layer::Satellites => {
                let at_naive = at.naive_utc();
                let mut at_epoch = 0usize;
                let mut max_age_days: i64 = 0;
                for r in &self.satellites {
                    let (m, outcome) = r.to_matched(&at_naive);
                    if outcome == PositionOutcome::AtEpoch {
                        at_epoch += 1;
                    }
                    if let Some(e) = r.epoch() {
                        max_age_days = max_age_days.max((at_naive - e).num_days().abs());
                    }
                    let (Some(lat), Some(lon)) = (m.lat, m.lon) else {
                        push(None);
                        continue;
                    };
                    let mut p = Map::with_capacity(m.properties.len() + 4);
                    p.insert("entity_id".into(), Value::String(m.entity_id.clone()));
                    p.insert("domain".into(), Value::String(domain.as_str().into()));
                    p.insert("name".into(), Value::String(m.name));
                    if let Some(country) = m.country {
                        p.insert("country".into(), Value::String(country));
                    }
                    p.extend(m.properties);
                    push(Some(feature(&m.entity_id, point(lon, lat), p)));
                }
                if max_age_days > STALE_TLE_DAYS {
                    missing.push(format!(
                        "TLE epochs are up to {max_age_days} days from the requested time {}; \
                         satellite positions are SGP4 extrapolations and may be far from the \
                         real ones",
                        at.to_rfc3339_opts(SecondsFormat::Secs, true)
                    ));
                }
                if at_epoch > 0 {
                    missing.push(format!(
                        "{at_epoch} satellites could not be propagated to the requested time; \
                         their positions are at their TLE epoch (see position_time)"
                    ));
                }
            }
            Layer::ComputeCenters => {
                for r in &self.compute_centers {
                    push(located_point(&r.common, domain));
                }
            }
            Layer::Cables => {
                for r in self.cables.iter().filter(|r| r.kind == EntityKind::Cable) {
                    if r.lines.is_empty() {
                        push(None);
                        continue;
                    }
                    let lines: Vec<Value> = r
                        .lines
                        .iter()
                        .map(|l| {
                            Value::Array(
                                l.iter()
                                    .map(|[lon, lat]| json!([round5(*lon), round5(*lat)]))
                                    .collect(),
                            )
                        })
                        .collect();
                    let geometry = json!({"type": "MultiLineString", "coordinates": lines});
                    push(Some(feature(
                        &r.common.id,
                        geometry,
                        properties(&r.common, domain),
                    )));
                }
            }
            Layer::LandingPoints => {
                for r in self
                    .cables
                    .iter()
                    .filter(|r| r.kind == EntityKind::LandingPoint)
                {
                    push(located_point(&r.common, domain));
                }
            }
            Layer::BgpEvents => {
                for r in &self.bgp {
                    push(located_point(&r.common, domain));
                }
            }
            Layer::Vessels | Layer::News => {
                let records = if layer == Layer::News {
                    &self.news
                } else {
                    &self.vessels
                };
                for r in records {
                    push(located_point(&r.common, domain));
                }
            }
        }
        if unplaced > 0 {
            let what = match layer {
                Layer::Cables => {
                    "cables have no route geometry in the source (listed only in cable-all.json)"
                        .to_string()
                }
                Layer::BgpEvents => "BGP events have no location in the source".to_string(),
                _ => format!("{} entities have no position", domain.as_str()),
            };
            missing.push(format!("{unplaced} {what}; they are not drawn"));
        }
        let mut out = Map::new();
        out.insert("type".into(), json!("FeatureCollection"));
        out.insert("layer".into(), json!(layer.as_str()));
        out.insert("domain".into(), json!(domain.as_str()));
        if layer.is_timed() {
            out.insert(
                "at".into(),
                json!(at.to_rfc3339_opts(SecondsFormat::Secs, true)),
            );
        }
        out.insert("count".into(), json!(features.len()));
        out.insert("missing_data".into(), json!(missing));
        out.insert("features".into(), Value::Array(features));
        Value::Object(out)
    }
}
