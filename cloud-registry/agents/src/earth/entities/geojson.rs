//! News and vessels from a GeoJSON FeatureCollection, read from a file or
//! fetched over HTTP from the Earth backend (docs/earth-command.md, "Earth data":
//! news region, source, localized title and summary; vessels
//! type, country/area, name, status).
//!
//! Property names are looked up in order of preference:
//! - name: `name`, `title`, `vessel_name`, `shipname`, `ship_name`
//! - country: `country`, `flag`, `flag_country`, `flag_state`, `country_name`
//! - region: `region`, `area`, `sea_area`, `region_name`
//! - status: `status`, `navigation_status`, `nav_status`
//! - source: `source`, `publisher`, `outlet`
//! - vessel type: `vessel_type`, `ship_type`, `type`, `vessel_class`
//! - operator: `operator`, `owner`, `company`
//!
//! `name_contains` also searches every string property whose key starts with
//! `title`, `summary` or `name` (`title_zh`, `summary_en`, ...) and the
//! string values of such object properties (`title_i18n: {"zh": ...}`).
//!
//! Ids: vessels with an `mmsi` are `vessel:mmsi:{mmsi}`; otherwise the
//! feature `id` or `properties.id` (`vessel:{id}`, `news:{id}`); otherwise
//! `…:index:{i}` (0-based feature position).
//!
//! A bare country "China" cannot be told from Hong Kong, Macau or Taiwan
//! unless the region field names one of them (or mainland China); for news,
//! coordinates inside the Hong Kong or Macau boxes also decide. Otherwise the
//! record is kept as ambiguous (docs/earth-command.md, "Earth data").

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Map, Value};
use shared_protocol::earth::EarthDomain;

use super::filter::normalize_status;
use super::record::Common;
use super::region::{normalize, Place};
use super::EntityError;

/// Largest GeoJSON body fetched over HTTP, bytes.
pub const MAX_GEOJSON_BYTES: usize = 32 * 1024 * 1024;

/// A news item or a vessel.
#[derive(Debug, Clone)]
pub(crate) struct GeoFeatureRecord {
    pub common: Common,
    /// Canonical status (see `filter::normalize_status`), empty when none.
    pub status: String,
    pub source_lc: String,
    pub vessel_type_lc: String,
    pub operator_lc: String,
}

fn first_str<'a>(props: &'a Map<String, Value>, keys: &[&str]) -> &'a str {
    keys.iter()
        .filter_map(|k| props.get(*k))
        .find_map(|v| v.as_str().map(str::trim).filter(|s| !s.is_empty()))
        .unwrap_or("")
}

/// An id value usable inside an entity id: a string or integer without
/// whitespace or control characters, at most 128 bytes.
fn id_text(v: Option<&Value>) -> Option<String> {
    let s = match v? {
        Value::String(s) => s.trim().to_owned(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    let ok =
        !s.is_empty() && s.len() <= 128 && !s.chars().any(|c| c.is_whitespace() || c.is_control());
    ok.then_some(s)
}

/// First `[lon, lat]` position anywhere in a geometry's coordinates.
fn first_position(coords: &Value) -> Option<(f64, f64)> {
    let arr = coords.as_array()?;
    match (arr.first(), arr.get(1)) {
        (Some(Value::Number(lon)), Some(Value::Number(lat))) => {
            Some((lat.as_f64()?, lon.as_f64()?))
        }
        _ => arr.iter().find_map(first_position),
    }
}

/// Parses a FeatureCollection (`{"type": "FeatureCollection", "features":
/// [...]}`, the `type` may be absent) into records of `domain` (news or
/// vessels). Errors: [`EntityError::Json`] for bad JSON,
/// [`EntityError::Format`] when there is no `features` array. Features
/// without properties are skipped with a warning.
pub(crate) fn parse(
    bytes: &[u8],
    domain: EarthDomain,
    source_name: &str,
) -> Result<(Vec<GeoFeatureRecord>, Vec<String>), EntityError> {
    let root: Value = serde_json::from_slice(bytes).map_err(|source| EntityError::Json {
        source_name: source_name.to_owned(),
        source,
    })?;
    let features = root
        .get("features")
        .and_then(Value::as_array)
        .ok_or_else(|| EntityError::Format {
            source_name: source_name.to_owned(),
            message: "not a GeoJSON FeatureCollection (no `features` array)".into(),
        })?;
    let prefix = match domain {
        EarthDomain::Vessels => "vessel",
        EarthDomain::News => "news",
        other => other.as_str(),
    };
    let mut out = Vec::with_capacity(features.len());
    let mut warnings = Vec::new();
    let mut ids = HashSet::new();
    for (i, f) in features.iter().enumerate() {
        let Some(props) = f.get("properties").and_then(Value::as_object) else {
            warnings.push(format!("{source_name} feature {i}: no properties, skipped"));
            continue;
        };
        let mut id = match (domain, id_text(props.get("mmsi"))) {
            (EarthDomain::Vessels, Some(mmsi)) => format!("vessel:mmsi:{mmsi}"),
            _ => match id_text(f.get("id")).or_else(|| id_text(props.get("id"))) {
                Some(raw) => format!("{prefix}:{raw}"),
                None => format!("{prefix}:index:{i}"),
            },
        };
        if !ids.insert(id.clone()) {
            warnings.push(format!("{source_name} feature {i}: repeated id `{id}`"));
            id = format!("{prefix}:index:{i}");
            ids.insert(id.clone());
        }
        let mut name = first_str(
            props,
            &["name", "title", "vessel_name", "shipname", "ship_name"],
        )
        .to_owned();
        if name.is_empty() {
            name = id.clone();
        }
        let mut c = Common::new(id, name);
        for (k, v) in props {
            let searchable =
                k.starts_with("title") || k.starts_with("summary") || k.starts_with("name");
            if !searchable || k == "name" {
                continue;
            }
            match v {
                Value::String(s) => c.add_search_text(s),
                Value::Object(m) => {
                    for s in m.values().filter_map(Value::as_str) {
                        c.add_search_text(s);
                    }
                }
                _ => {}
            }
        }
        if let Some((lat, lon)) = f
            .get("geometry")
            .and_then(|g| g.get("coordinates"))
            .and_then(first_position)
        {
            c.set_position(lat, lon);
        }

        let country = first_str(
            props,
            &[
                "country",
                "flag",
                "flag_country",
                "flag_state",
                "country_name",
            ],
        );
        let region = first_str(props, &["region", "area", "sea_area", "region_name"]);
        c.place = Place::from_country(country, false);
        c.place.region_lc = normalize(region);
        if c.place.code == Some("CN") {
            let by_region = Place::from_country(region, true);
            match by_region.code {
                Some(code @ ("HK" | "MO" | "TW")) => {
                    c.place.code = Some(code);
                    c.place.china_ambiguous = false;
                }
                Some("CN") => c.place.china_ambiguous = false,
                _ if domain == EarthDomain::News => {
                    c.place.split_china_by_site("", c.lat, c.lon);
                }
                _ => {}
            }
        }
        c.country = (!country.is_empty()).then(|| country.to_owned());
        c.properties = props.clone();
        if let Some(code) = c.place.code {
            c.prop("country_code", code);
        }
        let status = first_str(props, &["status", "navigation_status", "nav_status"]);
        out.push(GeoFeatureRecord {
            status: if status.is_empty() {
                String::new()
            } else {
                normalize_status(status)
            },
            source_lc: normalize(first_str(props, &["source", "publisher", "outlet"])),
            vessel_type_lc: normalize(first_str(
                props,
                &["vessel_type", "ship_type", "type", "vessel_class"],
            )),
            operator_lc: normalize(first_str(props, &["operator", "owner", "company"])),
            common: c,
        });
    }
    Ok((out, warnings))
}

/// GETs a GeoJSON body from an `http`/`https` URL within `timeout`, at most
/// [`MAX_GEOJSON_BYTES`]. Errors: [`EntityError::UnsupportedUrl`] for other
/// schemes or unparsable URLs, [`EntityError::Http`] for connection errors,
/// timeouts, non-2xx statuses and oversized bodies.
pub(crate) async fn fetch(url: &str, timeout: Duration) -> Result<Vec<u8>, EntityError> {
    let parsed = reqwest::Url::parse(url).map_err(|_| EntityError::UnsupportedUrl {
        url: url.to_owned(),
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(EntityError::UnsupportedUrl {
            url: url.to_owned(),
        });
    }
    let http = |message: String| EntityError::Http {
        url: url.to_owned(),
        message,
    };
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .build()
        .map_err(|e| http(e.to_string()))?;
    let mut resp = client
        .get(parsed)
        .header(
            reqwest::header::ACCEPT,
            "application/geo+json, application/json",
        )
        .send()
        .await
        .map_err(|e| http(e.to_string()))?;
    if !resp.status().is_success() {
        return Err(http(format!("HTTP status {}", resp.status())));
    }
    if resp
        .content_length()
        .is_some_and(|n| n > MAX_GEOJSON_BYTES as u64)
    {
        return Err(http(format!("body over {MAX_GEOJSON_BYTES} bytes")));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| http(e.to_string()))? {
        if body.len() + chunk.len() > MAX_GEOJSON_BYTES {
            return Err(http(format!("body over {MAX_GEOJSON_BYTES} bytes")));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vessel_ids_prefer_mmsi_then_feature_id_then_index() {
        let fc = serde_json::json!({"type": "FeatureCollection", "features": [
            {"type": "Feature", "id": "a1", "properties": {"name": "A", "mmsi": 413000001},
             "geometry": {"type": "Point", "coordinates": [121.5, 31.2]}},
            {"type": "Feature", "id": "b2", "properties": {"name": "B"}, "geometry": null},
            {"type": "Feature", "properties": {"name": "C"}, "geometry": null}
        ]});
        let (recs, _) = parse(fc.to_string().as_bytes(), EarthDomain::Vessels, "t").unwrap();
        let ids: Vec<&str> = recs.iter().map(|r| r.common.id.as_str()).collect();
        assert_eq!(
            ids,
            ["vessel:mmsi:413000001", "vessel:b2", "vessel:index:2"]
        );
        assert_eq!(recs[0].common.lat, Some(31.2));
    }

    #[test]
    fn region_field_separates_hong_kong_from_china() {
        let fc = serde_json::json!({"features": [
            {"properties": {"title": "x", "country": "China", "region": "Hong Kong"}, "geometry": null},
            {"properties": {"title": "y", "country": "China"}, "geometry": null}
        ]});
        let (recs, _) = parse(fc.to_string().as_bytes(), EarthDomain::News, "t").unwrap();
        assert_eq!(recs[0].common.place.code, Some("HK"));
        assert!(recs[1].common.place.china_ambiguous);
    }

    #[test]
    fn a_plain_array_is_not_a_feature_collection() {
        let err = parse(b"[1,2]", EarthDomain::News, "feed").unwrap_err();
        assert!(err.to_string().contains("feed"));
    }
}
