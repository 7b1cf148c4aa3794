//! Epoch AI "Data on Frontier AI Data Centers" CSV (`Handle, Title,
//! Project, ..., Address, Latitude, Longitude, Owner, Users, ...`), with
//! coordinates in degrees-minutes-seconds (`41°11'6.6732"N`). Rows use
//! `source: epoch_ai_gpu`, `site_type: gpu_cluster` and
//! `dataset: epoch_frontier_data_centers`; `location_precision` is `exact`.
//!
//! Ids are `compute_center:epoch_dc:{slug(Handle)}` (handles are unique).
//! The country comes from the address (last comma-separated part that names
//! a country) or, failing that, from the coordinates falling in the
//! contiguous United States. Entries carry confidence tags
//! (`Amazon #confident`); `needs_confirmation` is true unless the owner is
//! tagged `#confident`.

use std::collections::HashSet;
use std::path::Path;

use super::compute_centers::{ComputeCenterRecord, SOURCE_EPOCH};
use super::query::SiteType;
use super::record::{field, json_f64, number, slug, Columns, Common};
use super::region::{normalize, Place};
use super::EntityError;

/// Parses `32°35'25"N`, `41°11'6.6732"N`, `101°18'43"W` or a signed decimal.
/// South and west are negative.
pub(crate) fn parse_dms(text: &str) -> Option<f64> {
    let t = text.trim();
    if let Ok(v) = t.parse::<f64>() {
        return Some(v);
    }
    let (body, sign) = match t.chars().last()? {
        'N' | 'n' | 'E' | 'e' => (&t[..t.len() - 1], 1.0),
        'S' | 's' | 'W' | 'w' => (&t[..t.len() - 1], -1.0),
        _ => (t, 1.0),
    };
    let mut parts = body
        .split(['°', '\'', '"', '′', '″', ' '])
        .filter(|p| !p.is_empty())
        .map(|p| p.parse::<f64>());
    let deg = parts.next()?.ok()?;
    let min = parts.next().transpose().ok()?.unwrap_or(0.0);
    let sec = parts.next().transpose().ok()?.unwrap_or(0.0);
    if !(0.0..60.0).contains(&min) || !(0.0..60.0).contains(&sec) {
        return None;
    }
    Some(sign * (deg + min / 60.0 + sec / 3600.0))
}

/// Strips `#confident`-style tags: (`"Amazon"`, `Some("confident")`).
fn split_tag(text: &str) -> (String, Option<String>) {
    match text.split_once('#') {
        Some((value, tag)) => (value.trim().to_owned(), Some(tag.trim().to_lowercase())),
        None => (text.trim().to_owned(), None),
    }
}

fn country_from_address(address: &str, lat: Option<f64>, lon: Option<f64>) -> Place {
    for part in address.rsplit(',') {
        let p = Place::from_country(part, true);
        if p.code.is_some() {
            return p;
        }
    }
    match (lat, lon) {
        (Some(la), Some(lo)) if (24.5..=49.5).contains(&la) && (-125.0..=-66.9).contains(&lo) => {
            Place::from_code("US")
        }
        _ => Place::default(),
    }
}

/// Loads the frontier data centers CSV. Errors: unreadable file, malformed
/// CSV, or a missing `Handle`/`Title` column. Rows whose coordinates do not
/// parse keep no position and get `location_precision: unknown` or
/// `country`.
pub(crate) fn load(path: &Path) -> Result<(Vec<ComputeCenterRecord>, Vec<String>), EntityError> {
    let bytes = super::record::read_file(path)?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(bytes.as_slice());
    let csv_err = |source: csv::Error| EntityError::Csv {
        path: path.to_path_buf(),
        source,
    };
    let cols = Columns::new(reader.headers().map_err(csv_err)?);
    let handle_i = cols.require(path, "Handle")?;
    let title_i = cols.require(path, "Title")?;
    let col = |n: &str| cols.index(n);
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let mut ids = HashSet::new();
    for (row, rec) in reader.records().enumerate() {
        let rec = rec.map_err(csv_err)?;
        let handle = field(&rec, Some(handle_i));
        let title = field(&rec, Some(title_i));
        let s = slug(handle);
        let id = format!("compute_center:epoch_dc:{s}");
        if s.is_empty() || !ids.insert(id.clone()) {
            warnings.push(format!(
                "{} row {}: empty or repeated Handle `{handle}`, skipped",
                path.display(),
                row + 2
            ));
            continue;
        }
        let name = if title.is_empty() { handle } else { title };
        let address = field(&rec, col("Address"));
        let lat = parse_dms(field(&rec, col("Latitude"))).filter(|v| v.abs() <= 90.0);
        let lon = parse_dms(field(&rec, col("Longitude"))).filter(|v| v.abs() <= 180.0);
        if lat.is_none() || lon.is_none() {
            warnings.push(format!(
                "{} row {}: coordinates of `{handle}` do not parse",
                path.display(),
                row + 2
            ));
        }
        let (owner, owner_tag) = split_tag(field(&rec, col("Owner")));
        let (project, _) = split_tag(field(&rec, col("Project")));
        let (users, _) = split_tag(field(&rec, col("Users")));

        let mut c = Common::new(id, name.to_owned());
        c.add_search_text(handle);
        c.add_search_text(&owner);
        c.add_search_text(&project);
        c.add_search_text(address);
        if let (Some(la), Some(lo)) = (lat, lon) {
            c.set_position(la, lo);
        }
        c.place = country_from_address(address, c.lat, c.lon);
        c.place.split_china_by_site("", c.lat, c.lon);
        c.country = c.place.display_name().map(str::to_owned);
        c.prop("handle", handle);
        c.prop("owner", owner.clone());
        c.prop("project", project);
        c.prop("users", users);
        c.prop("address", address);
        let h100 = number(field(&rec, col("Current H100 equivalents")));
        c.prop("h100_equivalents", json_f64(h100));
        c.prop(
            "power_mw",
            json_f64(number(field(&rec, col("Current power (MW)")))),
        );
        c.prop(
            "capital_cost_usd_billions",
            json_f64(number(field(
                &rec,
                col("Current total capital cost (2025 USD billions)"),
            ))),
        );
        let confident = owner_tag.as_deref() == Some("confident");
        out.push(ComputeCenterRecord::new(
            c,
            SiteType::GpuCluster,
            SOURCE_EPOCH,
            "epoch_frontier_data_centers",
            !confident,
            if h100.unwrap_or(0.0) > 0.0 {
                "existing"
            } else {
                "planned"
            }
            .to_owned(),
            normalize(&owner),
        ));
    }
    Ok((out, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dms_coordinates_parse_with_hemisphere_sign() {
        let lat = parse_dms("41°11'6.6732\"N").unwrap();
        assert!((lat - 41.185_187).abs() < 1e-5, "{lat}");
        let lon = parse_dms(" 101°18'43\"W").unwrap();
        assert!((lon + 101.311_944).abs() < 1e-5, "{lon}");
        assert_eq!(parse_dms("-33.5"), Some(-33.5));
        assert_eq!(parse_dms("north"), None);
    }
}
