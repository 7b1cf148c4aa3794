//! TOP500 list CSV (an xlsx export: `Rank, Name, Computer, Site, Country,
//! Segment, Continent, Rmax [TFlop/s], ..., Site ID, System ID`). No
//! coordinates, so rows sit at their country's centroid with
//! `location_precision: country`.
//!
//! Ids are `compute_center:top500:{System ID}` (stable from one list to the
//! next, unlike the rank); rows without a usable System ID get
//! `compute_center:top500:rank:{Rank}`.
//!
//! `needs_confirmation` is true for anonymised rows: an empty `Name`, or a
//! `Site` that names a kind of organisation instead of one ("Service
//! Provider T", "Financial Services P", "Manufacturing Industry (O)",
//! "Government", ...).

use std::collections::HashSet;
use std::path::Path;

use serde_json::Value;

use super::compute_centers::{ComputeCenterRecord, SOURCE_TOP500};
use super::query::SiteType;
use super::record::{field, json_f64, number, Columns, Common};
use super::region::{normalize, parse_continent, Place};
use super::EntityError;

const ANONYMOUS_SITE_PREFIXES: &[&str] = &[
    "service provider",
    "financial services",
    "financial institution",
    "manufacturing industry",
    "energy company",
    "internet company",
    "software company",
    "it service provider",
    "telecommunication company",
];

const ANONYMOUS_SITES: &[&str] = &[
    "government",
    "research institute",
    "cloud company",
    "university",
];

fn site_is_anonymised(site_lc: &str) -> bool {
    ANONYMOUS_SITES.contains(&site_lc)
        || ANONYMOUS_SITE_PREFIXES.iter().any(|p| {
            site_lc
                .strip_prefix(p)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with(' '))
        })
}

/// Loads a TOP500 CSV. Errors: unreadable file, malformed CSV, or a missing
/// `Rank`/`Name`/`Site`/`Country` column. Rows without a rank are skipped
/// with a warning.
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
    let rank_i = cols.require(path, "Rank")?;
    let name_i = cols.require(path, "Name")?;
    let site_i = cols.require(path, "Site")?;
    let country_i = cols.require(path, "Country")?;
    let col = |n: &str| cols.index(n);
    let (computer_i, manufacturer_i, segment_i, continent_i, year_i) = (
        col("Computer"),
        col("Manufacturer"),
        col("Segment"),
        col("Continent"),
        col("Year"),
    );
    let (rmax_i, rpeak_i, power_i, cores_i, accel_i, site_id_i, system_id_i) = (
        col("Rmax [TFlop/s]"),
        col("Rpeak [TFlop/s]"),
        col("Power (kW)"),
        col("Total Cores"),
        col("Accelerator/Co-Processor"),
        col("Site ID"),
        col("System ID"),
    );

    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let mut ids = HashSet::new();
    for (row, rec) in reader.records().enumerate() {
        let rec = rec.map_err(csv_err)?;
        let rank = field(&rec, Some(rank_i));
        let Ok(rank_n) = rank.parse::<u32>() else {
            warnings.push(format!(
                "{} row {}: no numeric Rank, skipped",
                path.display(),
                row + 2
            ));
            continue;
        };
        let name = field(&rec, Some(name_i));
        let site = field(&rec, Some(site_i));
        let country = field(&rec, Some(country_i));
        let computer = field(&rec, computer_i);
        let system_id = field(&rec, system_id_i);
        let mut id = match system_id.parse::<u64>() {
            Ok(sid) => format!("compute_center:top500:{sid}"),
            Err(_) => format!("compute_center:top500:rank:{rank_n}"),
        };
        if !ids.insert(id.clone()) {
            id = format!("compute_center:top500:rank:{rank_n}");
            ids.insert(id.clone());
        }
        let display = if name.is_empty() {
            format!("{site} (TOP500 #{rank_n})")
        } else {
            name.to_owned()
        };
        let site_lc = normalize(site);
        let anonymised = name.is_empty() || site_is_anonymised(&site_lc);

        let mut c = Common::new(id, display);
        c.add_search_text(site);
        c.add_search_text(computer);
        // TOP500 spells Taiwan and Hong Kong as countries of their own, so a
        // bare "China" is mainland China.
        c.place = Place::from_country(country, true);
        let continent = field(&rec, continent_i);
        if let Some(k) = parse_continent(continent) {
            c.place.continent = Some(k);
        }
        c.place.region_lc = normalize(continent);
        c.country = (!country.is_empty()).then(|| country.to_owned());
        c.prop("rank", rank_n);
        c.prop("site", site);
        c.prop("computer", computer);
        c.prop("manufacturer", field(&rec, manufacturer_i));
        c.prop("segment", field(&rec, segment_i));
        c.prop("continent", continent);
        if let Ok(y) = field(&rec, year_i).parse::<u32>() {
            c.prop("year", y);
        }
        c.prop("rmax_tflops", json_f64(number(field(&rec, rmax_i))));
        c.prop("rpeak_tflops", json_f64(number(field(&rec, rpeak_i))));
        c.prop("power_kw", json_f64(number(field(&rec, power_i))));
        if let Some(cores) = number(field(&rec, cores_i)) {
            c.prop("total_cores", Value::from(cores as u64));
        }
        c.prop("accelerator", field(&rec, accel_i));
        c.prop("site_id", field(&rec, site_id_i));
        c.prop("system_id", system_id);
        out.push(ComputeCenterRecord::new(
            c,
            SiteType::Supercomputer,
            SOURCE_TOP500,
            "top500",
            anonymised,
            "existing".to_owned(),
            site_lc,
        ));
    }
    Ok((out, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn organisation_kinds_count_as_anonymised_sites() {
        assert!(site_is_anonymised("service provider t"));
        assert!(site_is_anonymised("manufacturing industry (o)"));
        assert!(site_is_anonymised("government"));
        assert!(!site_is_anonymised(
            "national supercomputing center in wuxi"
        ));
        assert!(!site_is_anonymised("service providers union"));
    }
}
