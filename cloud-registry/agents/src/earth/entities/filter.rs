//! Filters prepared once per query: text lowercased, countries parsed,
//! prefixes parsed, so the per-record test is compares only.

use super::prefix::IpPrefix;
use super::query::{
    Constellation, EntityFilters, EntityKind, LocationPrecision, OrbitalClass, Severity, SiteType,
};
use super::region::{normalize, CountryQuery, Place, PlaceMatch};

/// Maps status spellings onto the canonical values used at load:
/// `existing`, `planned`, `decommissioned` (compute centers), `ongoing`,
/// `ended` (BGP). Anything else is returned normalized.
pub(crate) fn normalize_status(text: &str) -> String {
    let lc = normalize(text);
    match lc.as_str() {
        "existing" | "operational" | "active" | "running" | "online" | "在运行" | "运行中"
        | "现役" => "existing".into(),
        "planned" | "under construction" | "计划" | "规划" | "在建" => "planned".into(),
        "decommissioned" | "retired" | "退役" | "已退役" => "decommissioned".into(),
        "ongoing" | "open" | "unresolved" | "进行中" | "持续" | "未结束" => {
            "ongoing".into()
        }
        "ended" | "resolved" | "closed" | "finished" | "已结束" | "结束" => "ended".into(),
        _ => lc,
    }
}

/// Query-time counters that become `missing_data` notes.
#[derive(Debug, Default)]
pub(crate) struct MatchNotes {
    /// Matches kept only under the conservative mainland-China rule.
    pub ambiguous_china: usize,
}

/// [`EntityFilters`] ready for matching.
#[derive(Debug, Default)]
pub(crate) struct Prepared {
    pub constellation: Option<Constellation>,
    pub name_lc: Option<String>,
    pub norad_id: Option<u64>,
    pub country: Option<CountryQuery>,
    pub region: Option<CountryQuery>,
    pub operator_lc: Option<String>,
    pub orbital_class: Option<OrbitalClass>,
    pub site_type: Option<SiteType>,
    pub source_lc: Option<String>,
    pub needs_confirmation: Option<bool>,
    pub location_precision: Option<LocationPrecision>,
    pub severity: Option<Severity>,
    pub status: Option<String>,
    pub category_lc: Option<String>,
    pub collector_lc: Option<String>,
    pub prefix: Option<IpPrefix>,
    pub asn: Option<u64>,
    pub vessel_type_lc: Option<String>,
    pub landing_point_lc: Option<String>,
    pub kind: Option<EntityKind>,
}

impl Prepared {
    pub fn new(f: &EntityFilters) -> Prepared {
        let lc = |s: &Option<String>| s.as_deref().map(normalize).filter(|s| !s.is_empty());
        Prepared {
            constellation: f.constellation,
            name_lc: lc(&f.name_contains),
            norad_id: f.norad_id,
            country: f.country.as_deref().map(CountryQuery::parse),
            region: f.region.as_deref().map(CountryQuery::parse),
            operator_lc: lc(&f.operator),
            orbital_class: f.orbital_class,
            site_type: f.site_type,
            source_lc: lc(&f.source),
            needs_confirmation: f.needs_confirmation,
            location_precision: f.location_precision,
            severity: f.severity,
            status: f.status.as_deref().map(normalize_status),
            category_lc: lc(&f.category),
            collector_lc: lc(&f.collector),
            prefix: f.prefix.as_deref().and_then(IpPrefix::parse),
            asn: f.asn,
            vessel_type_lc: lc(&f.vessel_type),
            landing_point_lc: lc(&f.landing_point),
            kind: f.kind,
        }
    }

    /// `name_contains` against a record's precomputed lowercase search text.
    pub fn name_ok(&self, search_lc: &str) -> bool {
        self.name_lc
            .as_deref()
            .is_none_or(|n| search_lc.contains(n))
    }

    /// `country` and `region` against one place.
    pub fn place_ok(&self, place: &Place, notes: &mut MatchNotes) -> bool {
        let mut ambiguous = false;
        for (query, is_region) in [(&self.country, false), (&self.region, true)] {
            let Some(q) = query else { continue };
            let m = if is_region {
                q.match_region(place)
            } else {
                q.match_country(place)
            };
            match m {
                PlaceMatch::No => return false,
                PlaceMatch::Ambiguous => ambiguous = true,
                PlaceMatch::Yes => {}
            }
        }
        if ambiguous {
            notes.ambiguous_china += 1;
        }
        true
    }

    /// `country`/`region` against several places (a cable's landing
    /// countries): true when any place matches.
    pub fn any_place_ok(&self, places: &[Place], notes: &mut MatchNotes) -> bool {
        if self.country.is_none() && self.region.is_none() {
            return true;
        }
        let mut scratch = MatchNotes::default();
        let hit = places.iter().any(|p| self.place_ok(p, &mut scratch));
        if hit && scratch.ambiguous_china > 0 {
            notes.ambiguous_china += 1;
        }
        hit
    }

    /// True when a place filter is present.
    pub fn has_place_filter(&self) -> bool {
        self.country.is_some() || self.region.is_some()
    }
}

/// Substring test for an optional lowercase needle.
pub(crate) fn contains_opt(needle: &Option<String>, haystack_lc: &str) -> bool {
    needle.as_deref().is_none_or(|n| haystack_lc.contains(n))
}
