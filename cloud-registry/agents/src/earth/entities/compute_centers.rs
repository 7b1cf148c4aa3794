//! The compute-center record shared by the TOP500 and Epoch AI loaders
//! (docs/earth-command.md, "Earth data").

use super::query::{LocationPrecision, SiteType};
use super::record::Common;

/// `source` value of TOP500 rows.
pub(crate) const SOURCE_TOP500: &str = "top500";
/// `source` value of both Epoch AI files (the `dataset` property tells
/// GPU clusters from frontier data centers).
pub(crate) const SOURCE_EPOCH: &str = "epoch_ai_gpu";

/// One supercomputer or GPU cluster.
#[derive(Debug, Clone)]
pub(crate) struct ComputeCenterRecord {
    pub common: Common,
    pub site_type: SiteType,
    /// [`SOURCE_TOP500`] or [`SOURCE_EPOCH`].
    pub source: &'static str,
    pub needs_confirmation: bool,
    pub location_precision: LocationPrecision,
    /// Canonical status (`existing`, `planned`, `decommissioned`).
    pub status: String,
    /// Lowercase owner/operator/site text for the `operator` filter.
    pub operator_lc: String,
}

impl ComputeCenterRecord {
    /// Fills the shared properties and, when the source has no coordinates
    /// but the country is known, places the record at the country centroid
    /// (`location_precision` then says `country`).
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        mut common: Common,
        site_type: SiteType,
        source: &'static str,
        dataset: &str,
        needs_confirmation: bool,
        status: String,
        operator_lc: String,
    ) -> ComputeCenterRecord {
        let location_precision = if common.lat.is_some() {
            LocationPrecision::Exact
        } else if let Some((lat, lon)) = common.place.centroid() {
            common.set_position(lat, lon);
            LocationPrecision::Country
        } else {
            LocationPrecision::Unknown
        };
        common.prop("site_type", site_type.as_str());
        common.prop("source", source);
        common.prop("dataset", dataset);
        common.prop("needs_confirmation", needs_confirmation);
        common.prop("location_precision", location_precision.as_str());
        common.prop("status", status.clone());
        if let Some(code) = common.place.code {
            common.prop("country_code", code);
        }
        ComputeCenterRecord {
            common,
            site_type,
            source,
            needs_confirmation,
            location_precision,
            status,
            operator_lc,
        }
    }
}
