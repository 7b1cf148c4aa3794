//! Epoch AI "Data on GPU Clusters" CSV (quoted multi-line fields; `Name,
//! Status, Certainty, ..., Country, Owner, First Operational Date, ...,
//! Location, ...`). No coordinates: rows sit at their country's centroid
//! (`location_precision: country`) or have none (`unknown`).
//!
//! Ids: names repeat (every Chinese row is "Anonymized Chinese System") and
//! 52 rows are exact copies of another, so the id is built to be the same on
//! every load of the same file:
//! `compute_center:epoch_gpu:{slug(Name)}` when that slug is unique in the
//! file; otherwise `…:{slug(Name)}-{h}` with `h` the first 8 hex digits of a
//! 64-bit FNV-1a hash over every field of the row; an exact duplicate row
//! then gets `-2`, `-3`, … in file order.
//!
//! `needs_confirmation` is true when the row is anonymised ("Anonymized …")
//! or its `Certainty` is not `Confirmed`.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use super::compute_centers::{ComputeCenterRecord, SOURCE_EPOCH};
use super::filter::normalize_status;
use super::query::SiteType;
use super::record::{field, fnv1a64, json_f64, number, slug, Columns, Common};
use super::region::{normalize, Place};
use super::EntityError;

/// Loads the GPU clusters CSV. Errors: unreadable file, malformed CSV, or a
/// missing `Name`/`Country` column.
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
    let name_i = cols.require(path, "Name")?;
    let country_i = cols.require(path, "Country")?;
    let col = |n: &str| cols.index(n);
    let rows: Vec<csv::StringRecord> = reader
        .records()
        .collect::<Result<_, _>>()
        .map_err(csv_err)?;

    let mut slug_counts: HashMap<String, usize> = HashMap::new();
    for r in &rows {
        *slug_counts.entry(slug(field(r, Some(name_i)))).or_default() += 1;
    }
    let mut used = HashSet::new();
    let mut out = Vec::with_capacity(rows.len());
    let mut warnings = Vec::new();
    for (row, rec) in rows.iter().enumerate() {
        let name = field(rec, Some(name_i));
        if name.is_empty() {
            warnings.push(format!(
                "{} row {}: empty Name, skipped",
                path.display(),
                row + 2
            ));
            continue;
        }
        let s = slug(name);
        let base = if !s.is_empty() && slug_counts.get(&s) == Some(&1) {
            s
        } else {
            let stem = if s.is_empty() { "row".to_owned() } else { s };
            let h = fnv1a64(rec.iter());
            format!("{stem}-{:08x}", h >> 32)
        };
        let mut id = format!("compute_center:epoch_gpu:{base}");
        let mut n = 2;
        while !used.insert(id.clone()) {
            id = format!("compute_center:epoch_gpu:{base}-{n}");
            n += 1;
        }

        let country = field(rec, Some(country_i));
        let owner = field(rec, col("Owner"));
        let location = field(rec, col("Location"));
        let certainty = field(rec, col("Certainty"));
        let status_raw = field(rec, col("Status"));
        let anonymised = normalize(name).starts_with("anonymized");

        let mut c = Common::new(id, name.to_owned());
        c.add_search_text(owner);
        c.add_search_text(location);
        c.add_search_text(field(rec, col("Users")));
        // Epoch spells Hong Kong and Taiwan as countries of their own.
        c.place = Place::from_country(country, true);
        c.country = (!country.is_empty()).then(|| country.to_owned());
        c.prop("owner", owner);
        c.prop("location", location);
        c.prop("certainty", certainty);
        c.prop("sector", field(rec, col("Sector")));
        c.prop("users", field(rec, col("Users")));
        c.prop(
            "first_operational_date",
            field(rec, col("First Operational Date")),
        );
        c.prop(
            "h100_equivalents",
            json_f64(number(field(rec, col("H100 equivalents")))),
        );
        c.prop("chip_type", field(rec, col("Chip type (primary)")));
        c.prop(
            "chip_quantity",
            json_f64(number(field(rec, col("Chip quantity (primary)")))),
        );
        c.prop(
            "power_mw",
            json_f64(number(field(rec, col("Power Capacity (MW)")))),
        );
        c.prop("source_url", field(rec, col("Source 1")));
        out.push(ComputeCenterRecord::new(
            c,
            SiteType::GpuCluster,
            SOURCE_EPOCH,
            "epoch_gpu_clusters",
            anonymised || !certainty.eq_ignore_ascii_case("confirmed"),
            normalize_status(status_raw),
            normalize(owner),
        ));
    }
    Ok((out, warnings))
}
