//! What every loaded record carries, and small helpers the loaders share.

use std::path::Path;

use serde_json::{Map, Value};
use shared_protocol::earth::{EarthDomain, MatchedEntity};

use super::region::{normalize, Place};
use super::EntityError;

/// Fields every domain's records have. Built once at load; a query only
/// compares these and clones them into a [`MatchedEntity`].
#[derive(Debug, Clone)]
pub(crate) struct Common {
    /// Stable entity id (`satellite:norad:25544`, ...).
    pub id: String,
    pub name: String,
    /// Lowercase name: the sort key.
    pub name_lc: String,
    /// Lowercase text `name_contains` searches (name plus site, owner,
    /// title, summary as the source has them), fields joined by `\n`.
    pub search_lc: String,
    /// Country text as the source spells it.
    pub country: Option<String>,
    pub place: Place,
    /// Degrees.
    pub lat: Option<f64>,
    /// Degrees.
    pub lon: Option<f64>,
    /// Source-specific fields returned to the caller.
    pub properties: Map<String, Value>,
}

impl Common {
    /// A record with `search_lc` = the normalized name.
    pub fn new(id: String, name: String) -> Common {
        let name_lc = normalize(&name);
        Common {
            id,
            search_lc: name_lc.clone(),
            name_lc,
            name,
            country: None,
            place: Place::default(),
            lat: None,
            lon: None,
            properties: Map::new(),
        }
    }

    /// Appends more searchable text (skipped when empty).
    pub fn add_search_text(&mut self, text: &str) {
        let t = normalize(text);
        if !t.is_empty() {
            self.search_lc.push('\n');
            self.search_lc.push_str(&t);
        }
    }

    /// Sets a property unless the value is an empty string or null.
    pub fn prop(&mut self, key: &str, value: impl Into<Value>) {
        let v = value.into();
        let empty = match &v {
            Value::Null => true,
            Value::String(s) => s.trim().is_empty(),
            _ => false,
        };
        if !empty {
            self.properties.insert(key.to_owned(), v);
        }
    }

    /// Sets coordinates when both are finite and in range.
    pub fn set_position(&mut self, lat: f64, lon: f64) {
        if lat.is_finite() && lon.is_finite() && lat.abs() <= 90.0 && lon.abs() <= 180.0 {
            self.lat = Some(lat);
            self.lon = Some(lon);
        }
    }

    /// The wire form.
    pub fn to_matched(&self, domain: EarthDomain) -> MatchedEntity {
        MatchedEntity {
            entity_id: self.id.clone(),
            domain,
            name: self.name.clone(),
            country: self.country.clone(),
            lat: self.lat,
            lon: self.lon,
            properties: self.properties.clone(),
        }
    }
}

/// Lowercase ASCII slug: letters and digits kept, every other run becomes
/// one `-`. Empty when nothing is left.
pub(crate) fn slug(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for ch in text.chars() {
        if ch.is_ascii_alphanumeric() {
            out.push(ch.to_ascii_lowercase());
        } else if !out.is_empty() && !out.ends_with('-') {
            out.push('-');
        }
    }
    while out.ends_with('-') {
        out.pop();
    }
    out
}

/// 64-bit FNV-1a over the fields, each followed by a 0x1f separator. Used
/// for ids that must be the same on every load of the same file.
pub(crate) fn fnv1a64<'a>(fields: impl IntoIterator<Item = &'a str>) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for f in fields {
        for b in f.as_bytes().iter().chain(std::iter::once(&0x1f)) {
            h ^= u64::from(*b);
            h = h.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    h
}

/// Reads a whole file, naming it on error.
pub(crate) fn read_file(path: &Path) -> Result<Vec<u8>, EntityError> {
    std::fs::read(path).map_err(|source| EntityError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Header-name lookup for CSV files, so loaders do not depend on column order.
pub(crate) struct Columns {
    names: Vec<String>,
}

impl Columns {
    pub fn new(headers: &csv::StringRecord) -> Columns {
        Columns {
            names: headers
                .iter()
                .map(|h| h.trim_start_matches('\u{feff}').trim().to_owned())
                .collect(),
        }
    }

    /// Index of a column, or [`EntityError::MissingColumn`].
    pub fn require(&self, path: &Path, column: &str) -> Result<usize, EntityError> {
        self.index(column)
            .ok_or_else(|| EntityError::MissingColumn {
                path: path.to_path_buf(),
                column: column.to_owned(),
            })
    }

    /// Number of header columns.
    pub fn len(&self) -> usize {
        self.names.len()
    }

    /// Index of an optional column.
    pub fn index(&self, column: &str) -> Option<usize> {
        self.names.iter().position(|n| n == column)
    }
}

/// Trimmed field `i` of a record, empty when absent.
pub(crate) fn field(rec: &csv::StringRecord, i: Option<usize>) -> &str {
    i.and_then(|i| rec.get(i)).map(str::trim).unwrap_or("")
}

/// Parses a number that may be empty; `None` when empty or not a number.
pub(crate) fn number(text: &str) -> Option<f64> {
    let t = text.trim().replace(',', "");
    t.parse::<f64>().ok().filter(|v| v.is_finite())
}

/// A JSON number for a finite float (NaN/inf are skipped by [`Common::prop`]).
pub(crate) fn json_f64(v: Option<f64>) -> Value {
    v.and_then(serde_json::Number::from_f64)
        .map(Value::Number)
        .unwrap_or(Value::Null)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slug_keeps_ascii_alphanumerics_only() {
        assert_eq!(slug("xAI Colossus 2, Memphis"), "xai-colossus-2-memphis");
        assert_eq!(slug("北斗"), "");
    }

    #[test]
    fn fnv_hash_depends_on_field_boundaries() {
        assert_ne!(fnv1a64(["ab", "c"]), fnv1a64(["a", "bc"]));
        assert_eq!(fnv1a64(["ab", "c"]), fnv1a64(["ab", "c"]));
    }
}
