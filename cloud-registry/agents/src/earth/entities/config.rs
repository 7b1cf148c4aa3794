//! Where the Earth entity data comes from (the registry config's `[earth]`
//! table).

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The data shipped with the registry (`cloud-registry/data/earth`, beside
/// this crate's directory), for tests and development runs from the source
/// tree.
pub const SHIPPED_DATA_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../data/earth");

/// Default HTTP timeout for remote GeoJSON sources, ms.
pub const DEFAULT_HTTP_TIMEOUT_MS: u64 = 10_000;

/// A GeoJSON FeatureCollection source: a file, or an `http`/`https` URL (the
/// Earth backend's GeoJSON endpoint). In TOML: `news = { path = "news.geojson" }`
/// or `vessels = { url = "http://earth.local/api/v1/visualization/geo/vessels" }`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum GeoJsonSource {
    /// A local file, read at load.
    Path(PathBuf),
    /// An `http`/`https` URL, fetched by `EntityCatalog::load_with_remote`.
    Url(String),
}

/// Paths of every source, each optional: a domain without a source answers
/// with no entities and a "no data source configured" note.
///
/// ```toml
/// [earth]
/// satellites_tle = ["data/earth/satellites/celestrak_active_2020-10-26.txt"]
/// top500_csv = "data/earth/compute_centers/top500_2025-06.csv"
/// news = { url = "http://127.0.0.1:8080/api/v1/visualization/geo/news" }
/// http_timeout_ms = 10000
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EarthDataConfig {
    /// CelesTrak TLE files (3-line or 2-line), read in order; a NORAD id seen
    /// again in a later file gets an index id.
    #[serde(default)]
    pub satellites_tle: Vec<PathBuf>,
    /// TOP500 list CSV.
    #[serde(default)]
    pub top500_csv: Option<PathBuf>,
    /// Epoch AI GPU clusters CSV.
    #[serde(default)]
    pub epoch_gpu_clusters_csv: Option<PathBuf>,
    /// Epoch AI frontier data centers CSV.
    #[serde(default)]
    pub epoch_data_centers_csv: Option<PathBuf>,
    /// TeleGeography `cable-geo.json` (required for the cables domain).
    #[serde(default)]
    pub cable_geo_json: Option<PathBuf>,
    /// TeleGeography `landing-point-geo.json`.
    #[serde(default)]
    pub landing_point_geo_json: Option<PathBuf>,
    /// TeleGeography `cable-all.json`.
    #[serde(default)]
    pub cable_all_json: Option<PathBuf>,
    /// BGP hijack events CSV.
    #[serde(default)]
    pub bgp_events_csv: Option<PathBuf>,
    /// News FeatureCollection.
    #[serde(default)]
    pub news: Option<GeoJsonSource>,
    /// Vessels FeatureCollection.
    #[serde(default)]
    pub vessels: Option<GeoJsonSource>,
    /// Timeout for each remote GeoJSON fetch, ms.
    #[serde(default = "default_http_timeout_ms")]
    pub http_timeout_ms: u64,
}

fn default_http_timeout_ms() -> u64 {
    DEFAULT_HTTP_TIMEOUT_MS
}

impl Default for EarthDataConfig {
    /// No sources at all.
    fn default() -> Self {
        EarthDataConfig {
            satellites_tle: Vec::new(),
            top500_csv: None,
            epoch_gpu_clusters_csv: None,
            epoch_data_centers_csv: None,
            cable_geo_json: None,
            landing_point_geo_json: None,
            cable_all_json: None,
            bgp_events_csv: None,
            news: None,
            vessels: None,
            http_timeout_ms: DEFAULT_HTTP_TIMEOUT_MS,
        }
    }
}

impl EarthDataConfig {
    /// Every shipped file under `base_dir` (the directory laid out like
    /// `cloud-registry/data/earth`: `satellites/`, `compute_centers/`,
    /// `cables/`, `bgp/`). News and vessels have no shipped data.
    pub fn shipped(base_dir: impl AsRef<Path>) -> Self {
        let b = base_dir.as_ref();
        EarthDataConfig {
            satellites_tle: vec![b.join("satellites/celestrak_active_2020-10-26.txt")],
            top500_csv: Some(b.join("compute_centers/top500_2025-06.csv")),
            epoch_gpu_clusters_csv: Some(b.join("compute_centers/epoch_gpu_clusters.csv")),
            epoch_data_centers_csv: Some(b.join("compute_centers/epoch_frontier_data_centers.csv")),
            cable_geo_json: Some(b.join("cables/cable-geo.json")),
            landing_point_geo_json: Some(b.join("cables/landing-point-geo.json")),
            cable_all_json: Some(b.join("cables/cable-all.json")),
            bgp_events_csv: Some(b.join("bgp/bgp_hijack_events_news_updated.csv")),
            news: None,
            vessels: None,
            http_timeout_ms: DEFAULT_HTTP_TIMEOUT_MS,
        }
    }

    /// The same config with relative file paths joined onto `base` (the
    /// directory of the config file they were written in). URLs are kept.
    pub fn relative_to(&self, base: impl AsRef<Path>) -> Self {
        let base = base.as_ref();
        let fix = |p: &PathBuf| {
            if p.is_relative() {
                base.join(p)
            } else {
                p.clone()
            }
        };
        let fix_opt = |p: &Option<PathBuf>| p.as_ref().map(fix);
        let fix_src = |s: &Option<GeoJsonSource>| {
            s.as_ref().map(|s| match s {
                GeoJsonSource::Path(p) => GeoJsonSource::Path(fix(p)),
                GeoJsonSource::Url(u) => GeoJsonSource::Url(u.clone()),
            })
        };
        EarthDataConfig {
            satellites_tle: self.satellites_tle.iter().map(fix).collect(),
            top500_csv: fix_opt(&self.top500_csv),
            epoch_gpu_clusters_csv: fix_opt(&self.epoch_gpu_clusters_csv),
            epoch_data_centers_csv: fix_opt(&self.epoch_data_centers_csv),
            cable_geo_json: fix_opt(&self.cable_geo_json),
            landing_point_geo_json: fix_opt(&self.landing_point_geo_json),
            cable_all_json: fix_opt(&self.cable_all_json),
            bgp_events_csv: fix_opt(&self.bgp_events_csv),
            news: fix_src(&self.news),
            vessels: fix_src(&self.vessels),
            http_timeout_ms: self.http_timeout_ms,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earth_table_parses_from_toml_with_a_url_source() {
        let cfg: EarthDataConfig = toml::from_str(
            r#"
            satellites_tle = ["sat/a.txt"]
            news = { url = "http://127.0.0.1:9/news" }
            vessels = { path = "vessels.geojson" }
            "#,
        )
        .unwrap();
        assert_eq!(
            cfg.news,
            Some(GeoJsonSource::Url("http://127.0.0.1:9/news".into()))
        );
        assert_eq!(cfg.http_timeout_ms, DEFAULT_HTTP_TIMEOUT_MS);
        let abs = cfg.relative_to("/etc/benchlink");
        assert_eq!(
            abs.satellites_tle[0],
            PathBuf::from("/etc/benchlink/sat/a.txt")
        );
        assert_eq!(
            abs.vessels,
            Some(GeoJsonSource::Path("/etc/benchlink/vessels.geojson".into()))
        );
    }

    #[test]
    fn unknown_keys_in_the_earth_table_are_refused() {
        let err = toml::from_str::<EarthDataConfig>("tle_path = \"x\"").unwrap_err();
        assert!(err.to_string().contains("tle_path"));
    }
}
