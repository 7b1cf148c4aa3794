//! Entity query over the six Earth domains (docs/earth-command.md, "Earth data"),
//! shared by the deterministic command resolver and the `earth.find_entities`
//! tool.
//!
//! Data is loaded once into an [`EntityCatalog`] ([`EntityCatalog::load`] for
//! files, [`EntityCatalog::load_with_remote`] to also fetch GeoJSON over
//! HTTP). Queries ([`EntityCatalog::find`]) are synchronous scans over
//! records whose filter keys (lowercase names, country classification,
//! parsed prefixes, SGP4 constants) were computed at load, already sorted by
//! name then id.
//!
//! One small loader per source kind:
//! - `satellites`: CelesTrak TLE text → `satellite:norad:{id}`
//! - `top500`, `epoch_gpu`, `epoch_data_centers`: compute centers
//! - `cables`: TeleGeography cables and landing points
//! - `bgp`: BGP hijack events CSV
//! - `geojson`: news and vessels from a FeatureCollection file or URL
//!
//! `layers` draws each domain as a GeoJSON FeatureCollection for the map.
//!
//! Country matching (mainland China versus Hong Kong, Macau, Taiwan) lives in
//! `region`.

mod bgp;
mod cables;
mod catalog;
mod compute_centers;
mod config;
mod epoch_data_centers;
mod epoch_gpu;
mod filter;
mod geojson;
mod layers;
mod orbit;
mod prefix;
mod query;
mod record;
mod region;
mod satellites;
mod top500;

use std::path::PathBuf;

pub use catalog::{no_source_note, CatalogStats, EntityCatalog, GeoLayerData, STALE_TLE_DAYS};
pub use config::{EarthDataConfig, GeoJsonSource, DEFAULT_HTTP_TIMEOUT_MS, SHIPPED_DATA_DIR};
pub use geojson::MAX_GEOJSON_BYTES;
pub use layers::Layer;
pub use query::{
    Constellation, EntityFilters, EntityKind, EntityQuery, EntityQueryResult, LocationPrecision,
    OrbitalClass, Severity, SiteType, DEFAULT_LIMIT, MAX_LIMIT,
};

/// Why loading data or parsing a query failed. Each variant names the file,
/// URL or field it is about.
#[derive(Debug, thiserror::Error)]
pub enum EntityError {
    /// A configured file could not be read.
    #[error("cannot read {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// A CSV file is malformed (bad quoting, invalid UTF-8).
    #[error("malformed CSV in {path}: {source}")]
    Csv { path: PathBuf, source: csv::Error },
    /// A JSON/GeoJSON source (file path or URL) is not valid JSON or not of
    /// the expected shape.
    #[error("malformed JSON in {source_name}: {source}")]
    Json {
        source_name: String,
        source: serde_json::Error,
    },
    /// A CSV file lacks a column the loader needs.
    #[error("{path} has no `{column}` column")]
    MissingColumn { path: PathBuf, column: String },
    /// Valid JSON but not the expected structure.
    #[error("{source_name}: {message}")]
    Format {
        source_name: String,
        message: String,
    },
    /// A remote source URL that is not `http`/`https` (or does not parse).
    #[error("only http and https URLs are fetched, not `{url}`")]
    UnsupportedUrl { url: String },
    /// Fetching a remote source failed (connection, timeout, status, size).
    #[error("fetching {url} failed: {message}")]
    Http { url: String, message: String },
    /// Tool arguments that do not form a valid [`EntityQuery`]; `field` is
    /// the dotted path (`filters.site_type`, `limit`), empty for the top level.
    #[error("invalid entity query field `{field}`: {message}")]
    InvalidQuery { field: String, message: String },
    /// The blocking file-loading task died.
    #[error("loading Earth data failed: {0}")]
    Task(String),
}
