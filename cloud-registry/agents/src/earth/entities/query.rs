//! The `earth.find_entities` query shape and its JSON Schema
//! (docs/earth-command.md, "Earth data").

use std::fmt;
use std::str::FromStr;

use chrono::{DateTime, Utc};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Value};
use shared_protocol::earth::{EarthDomain, MatchedEntity};
use shared_protocol::{Validate, ValidationError};

use super::EntityError;

/// Default result cap.
pub const DEFAULT_LIMIT: usize = 500;
/// Largest accepted `limit`.
pub const MAX_LIMIT: usize = 5000;

/// Declares a closed filter vocabulary: canonical snake_case wire values
/// (what the JSON Schema lists and what is serialized) plus extra spellings
/// accepted when parsing (case-insensitive; Chinese names for the
/// deterministic resolver).
macro_rules! vocabulary {
    (
        $(#[$meta:meta])*
        $name:ident, $what:literal {
            $( $(#[$vmeta:meta])* $variant:ident => $wire:literal $([$($alias:literal),* $(,)?])? ),+ $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(rename_all = "snake_case", try_from = "String")]
        pub enum $name {
            $( $(#[$vmeta])* $variant, )+
        }

        impl $name {
            /// Canonical wire values, in declaration order.
            pub const VALUES: &'static [&'static str] = &[$($wire),+];

            /// The canonical wire value.
            pub fn as_str(self) -> &'static str {
                match self { $( $name::$variant => $wire, )+ }
            }
        }

        impl FromStr for $name {
            type Err = String;

            fn from_str(s: &str) -> Result<Self, Self::Err> {
                let lc = s.trim().to_lowercase();
                $(
                    if lc == $wire $($(|| lc == $alias)*)? {
                        return Ok($name::$variant);
                    }
                )+
                Err(format!(
                    "unknown {} `{}`; expected one of: {}",
                    $what,
                    s,
                    Self::VALUES.join(", ")
                ))
            }
        }

        impl TryFrom<String> for $name {
            type Error = String;

            fn try_from(s: String) -> Result<Self, Self::Error> {
                s.parse()
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }
    };
}

vocabulary! {
    /// `constellation` filter values (docs/earth-command.md, "Earth data"). `geo`, `leo`,
    /// `meo` and `heo` select by orbital class rather than by name.
    Constellation, "constellation" {
        Beidou => "beidou" ["bds", "北斗", "北斗卫星", "compass"],
        Gps => "gps" ["navstar", "gps卫星"],
        Galileo => "galileo" ["伽利略"],
        Glonass => "glonass" ["格洛纳斯"],
        Starlink => "starlink" ["星链"],
        Iridium => "iridium" ["铱星"],
        Oneweb => "oneweb" ["one web"],
        Geo => "geo" ["geostationary", "geosynchronous", "地球同步", "同步轨道"],
        Leo => "leo" ["low earth orbit", "低轨"],
        Meo => "meo" ["medium earth orbit", "中轨"],
        Heo => "heo" ["highly elliptical", "高椭圆"],
    }
}

impl Constellation {
    /// The orbital class this value stands for, when it is one (`geo`, ...).
    pub fn as_orbital_class(self) -> Option<OrbitalClass> {
        match self {
            Constellation::Geo => Some(OrbitalClass::Geo),
            Constellation::Leo => Some(OrbitalClass::Leo),
            Constellation::Meo => Some(OrbitalClass::Meo),
            Constellation::Heo => Some(OrbitalClass::Heo),
            _ => None,
        }
    }
}

vocabulary! {
    /// Orbital class inferred from a TLE's mean motion and eccentricity:
    /// `leo` ≥ 11.25 rev/day (period ≤ 128 min), `geo` 0.9–1.1 rev/day
    /// (geosynchronous, any inclination), `heo` eccentricity ≥ 0.25,
    /// `meo` everything else.
    OrbitalClass, "orbital_class" {
        Leo => "leo",
        Meo => "meo",
        Geo => "geo",
        Heo => "heo",
    }
}

vocabulary! {
    /// Compute-center kind (docs/earth-command.md, "Earth data").
    SiteType, "site_type" {
        Supercomputer => "supercomputer" ["hpc", "超算", "超级计算机"],
        GpuCluster => "gpu_cluster" ["gpu", "ai_cluster", "智算", "智算中心", "gpu集群"],
    }
}

vocabulary! {
    /// How precisely a record's `lat`/`lon` locate it: `exact` (coordinates
    /// from the source), `city`, `country` (country centroid only), `unknown`
    /// (no coordinates).
    LocationPrecision, "location_precision" {
        Exact => "exact" ["precise", "site"],
        City => "city",
        Country => "country",
        Unknown => "unknown" ["none"],
    }
}

vocabulary! {
    /// BGP event severity, derived at load (see the `bgp` module for the rule).
    Severity, "severity" {
        Low => "low" ["低"],
        Medium => "medium" ["中"],
        High => "high" ["高", "critical"],
    }
}

vocabulary! {
    /// Which records of the `cables` domain to return.
    EntityKind, "kind" {
        Cable => "cable" ["cables", "海缆", "海底光缆"],
        LandingPoint => "landing_point" ["landing_points", "登陆点", "登陆站"],
    }
}

/// A filter value that may arrive as a JSON number or a numeric string
/// (`25544`, `"25544"`, `"AS4134"` for ASNs).
fn number_or_string<'de, D>(deserializer: D) -> Result<Option<u64>, D::Error>
where
    D: Deserializer<'de>,
{
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Raw {
        Number(u64),
        Text(String),
    }
    match Option::<Raw>::deserialize(deserializer)? {
        None => Ok(None),
        Some(Raw::Number(n)) => Ok(Some(n)),
        Some(Raw::Text(s)) => {
            let t = s.trim();
            let digits = t
                .strip_prefix("AS")
                .or_else(|| t.strip_prefix("as"))
                .unwrap_or(t);
            digits
                .parse::<u64>()
                .map(Some)
                .map_err(|_| serde::de::Error::custom(format!("`{s}` is not a number")))
        }
    }
}

/// Filters of `earth.find_entities` (docs/earth-command.md, "Earth data"). All
/// given filters must hold (AND). Text filters are case-insensitive. Unknown
/// keys are refused so that tool arguments from a model validate strictly.
///
/// Which filters apply to which domain: see [`EntityFilters::applicable`].
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntityFilters {
    /// Satellites: `beidou`, `gps`, `galileo`, `glonass`, `starlink`,
    /// `iridium`, `oneweb`, or an orbital class (`geo`, `leo`, `meo`, `heo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constellation: Option<Constellation>,
    /// Substring of the name (satellite name, site/owner for compute
    /// centers, title and summary for news).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name_contains: Option<String>,
    /// Satellite NORAD id (number or numeric string).
    #[serde(
        default,
        deserialize_with = "number_or_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub norad_id: Option<u64>,
    /// Free text country: "中国大陆", "mainland china", "China", "美国", "US",
    /// "Hong Kong", "greater china", ... China means mainland China.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub country: Option<String>,
    /// A country, a continent ("Asia", "欧洲") or the source's own region text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Substring of the operator/owner.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<String>,
    /// Satellites: `leo`, `meo`, `geo`, `heo`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orbital_class: Option<OrbitalClass>,
    /// Compute centers: `supercomputer` or `gpu_cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub site_type: Option<SiteType>,
    /// Compute centers: `top500` or `epoch_ai_gpu`; news: the outlet (substring).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// Compute centers: rows whose identity or location is unconfirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub needs_confirmation: Option<bool>,
    /// Compute centers: `exact`, `city`, `country`, `unknown`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location_precision: Option<LocationPrecision>,
    /// BGP: `low`, `medium`, `high`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub severity: Option<Severity>,
    /// Status text: compute centers `existing`/`planned`/`decommissioned`,
    /// BGP `ongoing`/`ended`, vessels and news as their source spells it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub status: Option<String>,
    /// BGP: event category (`origin_change`, `forged_as_path`, `typo`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub category: Option<String>,
    /// BGP: route collector name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub collector: Option<String>,
    /// BGP: an IPv4/IPv6 prefix or address; events whose prefix or hijacked
    /// prefix overlaps it match.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// BGP: victim or hijacker AS number (`4134` or `"AS4134"`).
    #[serde(
        default,
        deserialize_with = "number_or_string",
        skip_serializing_if = "Option::is_none"
    )]
    pub asn: Option<u64>,
    /// Vessels: substring of the vessel type ("tanker", "cargo").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vessel_type: Option<String>,
    /// Cables: substring of a landing point name ("Tseung Kwan O").
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub landing_point: Option<String>,
    /// Cables: only `cable` or only `landing_point` records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<EntityKind>,
}

impl EntityFilters {
    /// Names of the filters that are set, in declaration order.
    pub fn set_fields(&self) -> Vec<&'static str> {
        let mut out = Vec::new();
        let mut push = |set: bool, name: &'static str| {
            if set {
                out.push(name);
            }
        };
        push(self.constellation.is_some(), "constellation");
        push(self.name_contains.is_some(), "name_contains");
        push(self.norad_id.is_some(), "norad_id");
        push(self.country.is_some(), "country");
        push(self.region.is_some(), "region");
        push(self.operator.is_some(), "operator");
        push(self.orbital_class.is_some(), "orbital_class");
        push(self.site_type.is_some(), "site_type");
        push(self.source.is_some(), "source");
        push(self.needs_confirmation.is_some(), "needs_confirmation");
        push(self.location_precision.is_some(), "location_precision");
        push(self.severity.is_some(), "severity");
        push(self.status.is_some(), "status");
        push(self.category.is_some(), "category");
        push(self.collector.is_some(), "collector");
        push(self.prefix.is_some(), "prefix");
        push(self.asn.is_some(), "asn");
        push(self.vessel_type.is_some(), "vessel_type");
        push(self.landing_point.is_some(), "landing_point");
        push(self.kind.is_some(), "kind");
        out
    }

    /// The filters that mean something for `domain` (the lists of
    /// docs/earth-command.md, "Earth data").
    pub fn applicable(domain: EarthDomain) -> &'static [&'static str] {
        match domain {
            EarthDomain::Satellites => &[
                "constellation",
                "name_contains",
                "norad_id",
                "country",
                "region",
                "operator",
                "orbital_class",
            ],
            EarthDomain::ComputeCenters => &[
                "name_contains",
                "country",
                "region",
                "operator",
                "site_type",
                "source",
                "needs_confirmation",
                "location_precision",
                "status",
            ],
            EarthDomain::Bgp => &[
                "name_contains",
                "country",
                "region",
                "severity",
                "status",
                "category",
                "collector",
                "prefix",
                "asn",
            ],
            EarthDomain::News => &["name_contains", "country", "region", "source", "status"],
            EarthDomain::Vessels => &[
                "name_contains",
                "country",
                "region",
                "status",
                "vessel_type",
                "operator",
            ],
            EarthDomain::Cables => &[
                "name_contains",
                "country",
                "region",
                "landing_point",
                "kind",
            ],
        }
    }

    /// Set filters that do not apply to `domain`.
    pub fn inapplicable(&self, domain: EarthDomain) -> Vec<&'static str> {
        let ok = Self::applicable(domain);
        self.set_fields()
            .into_iter()
            .filter(|f| !ok.contains(f))
            .collect()
    }

    /// JSON Schema (draft 2020-12) of the filters object, for the tool
    /// registry. `additionalProperties` is false, like the Rust type.
    pub fn json_schema() -> Value {
        let text = |description: &str| json!({"type": "string", "minLength": 1, "description": description});
        let vocab = |values: &[&str], description: &str| json!({"type": "string", "enum": values, "description": description});
        json!({
            "type": "object",
            "additionalProperties": false,
            "properties": {
                "constellation": vocab(Constellation::VALUES, "Satellite constellation, or orbital class geo/leo/meo/heo."),
                "name_contains": text("Case-insensitive substring of the entity name."),
                "norad_id": {"type": "integer", "minimum": 1, "description": "Satellite NORAD catalog id."},
                "country": text("Country in English or Chinese, e.g. 中国大陆, China (= mainland China), 美国, Hong Kong."),
                "region": text("Country, continent (Asia, 欧洲) or the source's region text."),
                "operator": text("Case-insensitive substring of the operator or owner."),
                "orbital_class": vocab(OrbitalClass::VALUES, "Satellite orbital class."),
                "site_type": vocab(SiteType::VALUES, "Compute center kind."),
                "source": text("Compute centers: top500 or epoch_ai_gpu. News: outlet name substring."),
                "needs_confirmation": {"type": "boolean", "description": "Compute centers whose identity or location is unconfirmed."},
                "location_precision": vocab(LocationPrecision::VALUES, "How precisely the coordinates locate the entity."),
                "severity": vocab(Severity::VALUES, "BGP event severity."),
                "status": text("Compute centers: existing, planned, decommissioned. BGP: ongoing, ended. Vessels/news: source status."),
                "category": text("BGP event category: origin_change, forged_as_path, typo."),
                "collector": text("BGP route collector name."),
                "prefix": text("BGP: IPv4/IPv6 prefix or address; overlapping events match."),
                "asn": {"type": "integer", "minimum": 0, "maximum": 4294967295u64, "description": "BGP victim or hijacker AS number."},
                "vessel_type": text("Vessel type substring, e.g. tanker, cargo."),
                "landing_point": text("Cables: landing point name substring."),
                "kind": vocab(EntityKind::VALUES, "Cables domain: only cables or only landing points.")
            }
        })
    }
}

/// One `earth.find_entities` call (for example
/// `{"domain": "satellites", "filters": {...}, "limit": 500}`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EntityQuery {
    pub domain: EarthDomain,
    #[serde(default)]
    pub filters: EntityFilters,
    /// Most entities returned, 0..=[`MAX_LIMIT`] (default [`DEFAULT_LIMIT`]);
    /// 0 counts without returning entities. `total_matched` is always the
    /// full count.
    #[serde(default = "default_limit")]
    pub limit: usize,
    /// Time for time-dependent fields (satellite positions); now when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub at: Option<DateTime<Utc>>,
}

fn default_limit() -> usize {
    DEFAULT_LIMIT
}

impl EntityQuery {
    /// A query over `domain` with no filters and the default limit.
    pub fn new(domain: EarthDomain) -> Self {
        EntityQuery {
            domain,
            filters: EntityFilters::default(),
            limit: DEFAULT_LIMIT,
            at: None,
        }
    }

    /// Replaces the filters.
    pub fn with_filters(mut self, filters: EntityFilters) -> Self {
        self.filters = filters;
        self
    }

    /// Replaces the limit.
    pub fn with_limit(mut self, limit: usize) -> Self {
        self.limit = limit;
        self
    }

    /// Sets the time satellite positions are computed for.
    pub fn at(mut self, at: DateTime<Utc>) -> Self {
        self.at = Some(at);
        self
    }

    /// Parses and validates tool-call arguments. Errors:
    /// [`EntityError::InvalidQuery`] naming the field (an unknown filter key,
    /// a value outside a vocabulary, a filter that does not apply to the
    /// domain, a limit over [`MAX_LIMIT`]).
    pub fn from_tool_arguments(arguments: Value) -> Result<Self, EntityError> {
        use shared_protocol::ParseError;
        shared_protocol::parse_value::<EntityQuery>(arguments).map_err(|e| match e {
            ParseError::Syntax(message) => EntityError::InvalidQuery {
                field: String::new(),
                message,
            },
            ParseError::Field { field, message } => EntityError::InvalidQuery { field, message },
            ParseError::Invalid(v) => EntityError::InvalidQuery {
                field: v.field,
                message: v.message,
            },
        })
    }

    /// JSON Schema of the tool arguments (`domain`, `filters`, `limit`, `at`).
    pub fn json_schema() -> Value {
        let domains: Vec<&str> = EarthDomain::ALL.iter().map(|d| d.as_str()).collect();
        json!({
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "title": "earth.find_entities arguments",
            "type": "object",
            "additionalProperties": false,
            "required": ["domain"],
            "properties": {
                "domain": {"type": "string", "enum": domains},
                "filters": EntityFilters::json_schema(),
                "limit": {"type": "integer", "minimum": 0, "maximum": MAX_LIMIT, "default": DEFAULT_LIMIT},
                "at": {"type": "string", "format": "date-time", "description": "RFC 3339 time for satellite positions; default now."}
            }
        })
    }
}

impl Validate for EntityQuery {
    fn validate(&self) -> Result<(), ValidationError> {
        if self.limit > MAX_LIMIT {
            return Err(ValidationError::new(
                "limit",
                format!("{} is over the maximum {MAX_LIMIT}", self.limit),
            ));
        }
        if let Some(field) = self.filters.inapplicable(self.domain).first() {
            return Err(ValidationError::new(
                format!("filters.{field}"),
                format!(
                    "does not apply to domain {}; applicable filters: {}",
                    self.domain.as_str(),
                    EntityFilters::applicable(self.domain).join(", ")
                ),
            ));
        }
        for (field, value) in [
            ("filters.name_contains", &self.filters.name_contains),
            ("filters.country", &self.filters.country),
            ("filters.region", &self.filters.region),
            ("filters.operator", &self.filters.operator),
            ("filters.source", &self.filters.source),
            ("filters.status", &self.filters.status),
            ("filters.category", &self.filters.category),
            ("filters.collector", &self.filters.collector),
            ("filters.prefix", &self.filters.prefix),
            ("filters.vessel_type", &self.filters.vessel_type),
            ("filters.landing_point", &self.filters.landing_point),
        ] {
            if value.as_deref().is_some_and(|v| v.trim().is_empty()) {
                return Err(ValidationError::new(field, "must not be empty"));
            }
        }
        if let Some(p) = &self.filters.prefix {
            if super::prefix::IpPrefix::parse(p).is_none() {
                return Err(ValidationError::new(
                    "filters.prefix",
                    format!("`{p}` is not an IPv4/IPv6 prefix or address"),
                ));
            }
        }
        if self.filters.asn.is_some_and(|a| a > u64::from(u32::MAX)) {
            return Err(ValidationError::new("filters.asn", "over 4294967295"));
        }
        Ok(())
    }
}

/// What `find` returns (the response's `matched_entities`, `missing_data`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EntityQueryResult {
    /// At most `limit` entities, sorted by lowercase name then id.
    pub entities: Vec<MatchedEntity>,
    /// All entities that matched, before the limit.
    pub total_matched: usize,
    /// True when `total_matched` > `entities.len()`.
    pub truncated: bool,
    /// Human-readable notes on data the answer lacks or could not use
    /// (unconfigured sources, ambiguous regions, stale TLEs, truncation).
    pub missing_data: Vec<String>,
}
