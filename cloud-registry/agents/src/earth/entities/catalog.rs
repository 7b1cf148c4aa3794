//! [`EntityCatalog`]: every loaded domain, its id index and the query scan.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::time::{Duration, Instant};

use chrono::{DateTime, NaiveDateTime, Utc};
use serde::Serialize;
use shared_protocol::earth::{EarthDomain, MatchedEntity};

use super::bgp::BgpEvent;
use super::cables::CableRecord;
use super::compute_centers::ComputeCenterRecord;
use super::config::{EarthDataConfig, GeoJsonSource};
use super::filter::{contains_opt, MatchNotes, Prepared};
use super::geojson::GeoFeatureRecord;
use super::prefix::IpPrefix;
use super::query::{EntityKind, EntityQuery, EntityQueryResult, LocationPrecision, MAX_LIMIT};
use super::record::Common;
use super::region::CountryQuery;
use super::satellites::{PositionOutcome, SatelliteRecord};
use super::{bgp, cables, epoch_data_centers, epoch_gpu, geojson, satellites, top500, EntityError};

/// A TLE epoch further than this from the query time (days) makes the
/// result carry a stale-position note.
pub const STALE_TLE_DAYS: i64 = 30;

/// Most load warnings kept in [`CatalogStats::warnings`].
const MAX_WARNINGS: usize = 200;

/// Load figures (for logs, health endpoints and the bench).
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CatalogStats {
    /// Entities per domain (a domain without a source has 0).
    pub counts: BTreeMap<EarthDomain, usize>,
    /// Domains with no configured (or no successfully fetched) source.
    pub unconfigured: Vec<EarthDomain>,
    /// Wall time of the whole load, ms.
    pub load_ms: u64,
    /// Skipped rows and other non-fatal load problems (at most 200).
    pub warnings: Vec<String>,
    /// Oldest and newest TLE epoch, when satellites are loaded.
    pub tle_epoch_range: Option<(DateTime<Utc>, DateTime<Utc>)>,
}

/// All loaded Earth entities, indexed by id. Cheap to query from many tasks
/// at once (`&self` only); reload by building a new catalog and swapping it.
#[derive(Debug, Default, Clone)]
pub struct EntityCatalog {
    pub(super) satellites: Vec<SatelliteRecord>,
    pub(super) compute_centers: Vec<ComputeCenterRecord>,
    pub(super) bgp: Vec<BgpEvent>,
    pub(super) news: Vec<GeoFeatureRecord>,
    pub(super) vessels: Vec<GeoFeatureRecord>,
    pub(super) cables: Vec<CableRecord>,
    /// Notes every query of a domain carries (no source, failed fetch).
    pub(super) domain_notes: HashMap<EarthDomain, Vec<String>>,
    /// entity id → (domain, position in that domain's vector).
    index: HashMap<String, (EarthDomain, usize)>,
    stats: CatalogStats,
    /// Names this load: load time (Unix ms) and a process-wide counter.
    version: String,
    /// Per domain, the loaded sources as "kind file" (`TLE celestrak_….txt`),
    /// named in the note of a query that matched nothing.
    sources: HashMap<EarthDomain, Vec<String>>,
}

/// "KIND file-name" for a source label.
fn source_label(kind: &str, path: &Path) -> String {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    format!("{kind} {name}")
}

/// Counts catalog loads in this process, for [`EntityCatalog::version`].
static LOADS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn by_name(a: &Common, b: &Common) -> std::cmp::Ordering {
    a.name_lc.cmp(&b.name_lc).then_with(|| a.id.cmp(&b.id))
}

/// The `missing_data` note of a query on a domain no source is configured
/// for: "no data source configured for vessels".
pub fn no_source_note(domain: EarthDomain) -> String {
    format!("no data source configured for {}", domain.as_str())
}

/// A GeoJSON FeatureCollection fetched and parsed for the news or vessels
/// domain, ready to be laid over a catalog with
/// [`EntityCatalog::with_geo_sources`] (an applied `datasource_config`
/// setting, docs/earth-command.md "Data sources by proposal").
#[derive(Debug, Clone)]
pub struct GeoLayerData {
    domain: EarthDomain,
    label: String,
    records: Vec<GeoFeatureRecord>,
    warnings: Vec<String>,
}

impl GeoLayerData {
    /// GETs `url` (http/https only, within `timeout`, at most
    /// [`geojson::MAX_GEOJSON_BYTES`]) and parses it as a FeatureCollection of
    /// `domain` (news or vessels), ids as for file sources. `label` names
    /// the source in query notes. Errors: [`EntityError::Format`] for
    /// another domain or a body without `features`,
    /// [`EntityError::UnsupportedUrl`], [`EntityError::Http`] (status,
    /// connection, timeout, size), [`EntityError::Json`].
    pub async fn fetch(
        url: &str,
        domain: EarthDomain,
        timeout: Duration,
        label: &str,
    ) -> Result<GeoLayerData, EntityError> {
        if !matches!(domain, EarthDomain::News | EarthDomain::Vessels) {
            return Err(EntityError::Format {
                source_name: label.to_owned(),
                message: format!(
                    "GeoJSON sources feed the news and vessels layers, not {}",
                    domain.as_str()
                ),
            });
        }
        let body = geojson::fetch(url, timeout).await?;
        Self::parse(&body, domain, url, label)
    }

    /// Parses `body` (a FeatureCollection read from `source_name`) for
    /// `domain`. Errors as [`geojson::parse`].
    fn parse(
        body: &[u8],
        domain: EarthDomain,
        source_name: &str,
        label: &str,
    ) -> Result<GeoLayerData, EntityError> {
        let (records, warnings) = geojson::parse(body, domain, source_name)?;
        Ok(GeoLayerData {
            domain,
            label: label.to_owned(),
            records,
            warnings,
        })
    }

    /// The domain the features belong to.
    pub fn domain(&self) -> EarthDomain {
        self.domain
    }

    /// Number of features kept.
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// True when the collection had no usable feature.
    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }
}

impl EntityCatalog {
    /// This catalog with the features of `sources` added to their domains,
    /// re-sorted and re-indexed under a new [`EntityCatalog::version`]. A
    /// domain that gets a source loses its "no data source configured"
    /// note; a feature whose id is already taken (by this catalog or an
    /// earlier source) is skipped with a warning.
    pub fn with_geo_sources(&self, sources: &[&GeoLayerData]) -> EntityCatalog {
        let started = Instant::now();
        let mut cat = self.clone();
        let mut taken: std::collections::HashSet<String> = cat.index.keys().cloned().collect();
        for src in sources {
            let domain = src.domain;
            let mut kept = Vec::with_capacity(src.records.len());
            let mut warnings = src.warnings.clone();
            for r in &src.records {
                if taken.insert(r.common.id.clone()) {
                    kept.push(r.clone());
                } else {
                    warnings.push(format!(
                        "{}: id `{}` is already loaded, feature skipped",
                        src.label, r.common.id
                    ));
                }
            }
            cat.warn(warnings);
            match domain {
                EarthDomain::News => cat.news.extend(kept),
                EarthDomain::Vessels => cat.vessels.extend(kept),
                _ => continue,
            }
            cat.sources
                .entry(domain)
                .or_default()
                .push(format!("GeoJSON {}", src.label));
            if let Some(notes) = cat.domain_notes.get_mut(&domain) {
                notes.retain(|n| *n != no_source_note(domain));
                if notes.is_empty() {
                    cat.domain_notes.remove(&domain);
                }
            }
        }
        cat.finish(started);
        cat
    }

    /// Loads every file source in `cfg`. URL sources (news, vessels) are not
    /// fetched: their domains answer empty with a note until
    /// [`EntityCatalog::load_with_remote`] is used. Errors: the first file
    /// that cannot be read or parsed ([`EntityError::Io`], `Csv`, `Json`,
    /// `MissingColumn`, `Format`). Blocking file I/O: call from
    /// `spawn_blocking` inside async code.
    pub fn load(cfg: &EarthDataConfig) -> Result<Self, EntityError> {
        let started = Instant::now();
        let mut cat = Self::load_files(cfg, Utc::now())?;
        for (domain, src) in [
            (EarthDomain::News, &cfg.news),
            (EarthDomain::Vessels, &cfg.vessels),
        ] {
            if let Some(GeoJsonSource::Url(url)) = src {
                cat.note(
                    domain,
                    format!(
                        "{} source {url} is remote and was not fetched",
                        domain.as_str()
                    ),
                );
            }
        }
        cat.finish(started);
        Ok(cat)
    }

    /// [`EntityCatalog::load`] on a blocking thread, then fetches URL sources
    /// with `cfg.http_timeout_ms` each. A failed fetch does not fail the load:
    /// the domain answers empty and its queries carry the error as a
    /// missing-data note (also in [`CatalogStats::warnings`]). Errors: as
    /// `load`, plus [`EntityError::Task`] if the loading thread dies.
    pub async fn load_with_remote(cfg: &EarthDataConfig) -> Result<Self, EntityError> {
        let started = Instant::now();
        let owned = cfg.clone();
        let mut cat = tokio::task::spawn_blocking(move || Self::load_files(&owned, Utc::now()))
            .await
            .map_err(|e| EntityError::Task(e.to_string()))??;
        let timeout = Duration::from_millis(cfg.http_timeout_ms);
        let fetch = |src: &Option<GeoJsonSource>| {
            let url = match src {
                Some(GeoJsonSource::Url(u)) => Some(u.clone()),
                _ => None,
            };
            async move {
                match url {
                    Some(u) => {
                        let r = geojson::fetch(&u, timeout).await;
                        Some((u, r))
                    }
                    None => None,
                }
            }
        };
        let (news, vessels) = tokio::join!(fetch(&cfg.news), fetch(&cfg.vessels));
        for (domain, fetched) in [(EarthDomain::News, news), (EarthDomain::Vessels, vessels)] {
            let Some((url, result)) = fetched else {
                continue;
            };
            let parsed = result.and_then(|body| geojson::parse(&body, domain, &url));
            match parsed {
                Ok((records, warnings)) => {
                    cat.domain_notes.remove(&domain);
                    cat.sources.insert(domain, vec![format!("GeoJSON {url}")]);
                    cat.warn(warnings);
                    cat.set_geo_domain(domain, records);
                }
                Err(e) => {
                    cat.warn(vec![e.to_string()]);
                    cat.note(
                        domain,
                        format!("{} source unavailable: {e}", domain.as_str()),
                    );
                }
            }
        }
        cat.finish(started);
        Ok(cat)
    }

    fn load_files(cfg: &EarthDataConfig, now: DateTime<Utc>) -> Result<Self, EntityError> {
        let mut cat = EntityCatalog::default();
        for d in EarthDomain::ALL {
            cat.domain_notes.insert(d, vec![no_source_note(d)]);
        }

        if !cfg.satellites_tle.is_empty() {
            let mut text = String::new();
            for p in &cfg.satellites_tle {
                let bytes = super::record::read_file(p)?;
                text.push_str(&String::from_utf8_lossy(&bytes));
                text.push('\n');
            }
            let label = cfg
                .satellites_tle
                .iter()
                .map(|p| p.display().to_string())
                .collect::<Vec<_>>()
                .join(" + ");
            let (records, warnings) = satellites::parse_tle_text(&text, &label, now);
            cat.sources.insert(
                EarthDomain::Satellites,
                cfg.satellites_tle
                    .iter()
                    .map(|p| source_label("CelesTrak TLE", p))
                    .collect(),
            );
            cat.warn(warnings);
            cat.satellites = records;
            cat.domain_notes.remove(&EarthDomain::Satellites);
        }

        let mut centers = Vec::new();
        let mut any_center = false;
        type CenterLoader =
            fn(&Path) -> Result<(Vec<ComputeCenterRecord>, Vec<String>), EntityError>;
        let center_sources: [(&Option<std::path::PathBuf>, CenterLoader, &str); 3] = [
            (&cfg.top500_csv, top500::load, "TOP500"),
            (
                &cfg.epoch_gpu_clusters_csv,
                epoch_gpu::load,
                "Epoch AI GPU clusters",
            ),
            (
                &cfg.epoch_data_centers_csv,
                epoch_data_centers::load,
                "Epoch AI data centers",
            ),
        ];
        for (path, loader, kind) in center_sources {
            if let Some(p) = path {
                cat.sources
                    .entry(EarthDomain::ComputeCenters)
                    .or_default()
                    .push(source_label(kind, p));
                let (records, warnings) = loader(p)?;
                cat.warn(warnings);
                centers.extend(records);
                any_center = true;
            }
        }
        if any_center {
            cat.compute_centers = centers;
            cat.domain_notes.remove(&EarthDomain::ComputeCenters);
        }

        if let Some(geo) = &cfg.cable_geo_json {
            cat.sources.insert(
                EarthDomain::Cables,
                vec![source_label("TeleGeography", geo)],
            );
            let (records, warnings) = cables::load(
                geo,
                cfg.landing_point_geo_json.as_deref(),
                cfg.cable_all_json.as_deref(),
            )?;
            cat.warn(warnings);
            cat.cables = records;
            cat.domain_notes.remove(&EarthDomain::Cables);
        }

        if let Some(p) = &cfg.bgp_events_csv {
            cat.sources
                .insert(EarthDomain::Bgp, vec![source_label("BGP events", p)]);
            let (records, warnings) = bgp::load(p)?;
            cat.warn(warnings);
            cat.bgp = records;
            cat.domain_notes.remove(&EarthDomain::Bgp);
        }

        for (domain, src) in [
            (EarthDomain::News, &cfg.news),
            (EarthDomain::Vessels, &cfg.vessels),
        ] {
            if let Some(GeoJsonSource::Path(p)) = src {
                cat.sources.insert(domain, vec![source_label("GeoJSON", p)]);
                let bytes = super::record::read_file(p)?;
                let (records, warnings) = geojson::parse(&bytes, domain, &p.display().to_string())?;
                cat.warn(warnings);
                cat.set_geo_domain(domain, records);
                cat.domain_notes.remove(&domain);
            }
        }
        Ok(cat)
    }

    fn set_geo_domain(&mut self, domain: EarthDomain, records: Vec<GeoFeatureRecord>) {
        match domain {
            EarthDomain::News => self.news = records,
            EarthDomain::Vessels => self.vessels = records,
            _ => {}
        }
    }

    fn note(&mut self, domain: EarthDomain, note: String) {
        let notes = self.domain_notes.entry(domain).or_default();
        notes.retain(|n| *n != no_source_note(domain));
        notes.push(note);
    }

    fn warn(&mut self, warnings: Vec<String>) {
        for w in warnings {
            if self.stats.warnings.len() < MAX_WARNINGS {
                self.stats.warnings.push(w);
            }
        }
    }

    /// Sorts every domain by name then id, builds the id index and the stats.
    fn finish(&mut self, started: Instant) {
        self.satellites
            .sort_by(|a, b| by_name(&a.common, &b.common));
        self.compute_centers
            .sort_by(|a, b| by_name(&a.common, &b.common));
        self.bgp.sort_by(|a, b| by_name(&a.common, &b.common));
        self.news.sort_by(|a, b| by_name(&a.common, &b.common));
        self.vessels.sort_by(|a, b| by_name(&a.common, &b.common));
        self.cables.sort_by(|a, b| by_name(&a.common, &b.common));

        let mut index = HashMap::new();
        let mut counts = BTreeMap::new();
        {
            let mut add = |domain: EarthDomain, ids: Vec<&str>| {
                counts.insert(domain, ids.len());
                for (i, id) in ids.into_iter().enumerate() {
                    index.insert(id.to_owned(), (domain, i));
                }
            };
            add(
                EarthDomain::Satellites,
                self.satellites
                    .iter()
                    .map(|r| r.common.id.as_str())
                    .collect(),
            );
            add(
                EarthDomain::ComputeCenters,
                self.compute_centers
                    .iter()
                    .map(|r| r.common.id.as_str())
                    .collect(),
            );
            add(
                EarthDomain::Bgp,
                self.bgp.iter().map(|r| r.common.id.as_str()).collect(),
            );
            add(
                EarthDomain::News,
                self.news.iter().map(|r| r.common.id.as_str()).collect(),
            );
            add(
                EarthDomain::Vessels,
                self.vessels.iter().map(|r| r.common.id.as_str()).collect(),
            );
            add(
                EarthDomain::Cables,
                self.cables.iter().map(|r| r.common.id.as_str()).collect(),
            );
        }
        self.index = index;

        let epochs = self.satellites.iter().filter_map(|s| s.epoch());
        let range = epochs.fold(
            None,
            |acc: Option<(NaiveDateTime, NaiveDateTime)>, e| match acc {
                None => Some((e, e)),
                Some((lo, hi)) => Some((lo.min(e), hi.max(e))),
            },
        );
        let mut unconfigured: Vec<EarthDomain> = EarthDomain::ALL
            .into_iter()
            .filter(|d| self.domain_notes.get(d).is_some_and(|n| !n.is_empty()))
            .collect();
        unconfigured.sort();
        self.stats.counts = counts;
        self.stats.unconfigured = unconfigured;
        self.stats.tle_epoch_range = range.map(|(lo, hi)| (lo.and_utc(), hi.and_utc()));
        self.stats.load_ms = started.elapsed().as_millis() as u64;
        let n = LOADS.fetch_add(1, std::sync::atomic::Ordering::Relaxed) + 1;
        self.version = format!("{}-{n}", Utc::now().timestamp_millis());
    }

    /// A short text that differs between any two loads (also across
    /// restarts): `{unix_ms}-{n}`. Layer ETags are built from it. Empty for
    /// an [`EntityCatalog::default`] that was never loaded.
    pub fn version(&self) -> &str {
        &self.version
    }

    /// Load figures.
    pub fn stats(&self) -> CatalogStats {
        self.stats.clone()
    }

    /// True when `entity_id` names a loaded entity of any domain (the
    /// action-plan validator's check that ids were not invented).
    pub fn contains(&self, entity_id: &str) -> bool {
        self.index.contains_key(entity_id)
    }

    /// The entity with this id; satellites are positioned at the current time.
    pub fn get(&self, entity_id: &str) -> Option<MatchedEntity> {
        let &(domain, i) = self.index.get(entity_id)?;
        let now = Utc::now().naive_utc();
        Some(match domain {
            EarthDomain::Satellites => self.satellites.get(i)?.to_matched(&now).0,
            EarthDomain::ComputeCenters => self.compute_centers.get(i)?.common.to_matched(domain),
            EarthDomain::Bgp => self.bgp.get(i)?.common.to_matched(domain),
            EarthDomain::News => self.news.get(i)?.common.to_matched(domain),
            EarthDomain::Vessels => self.vessels.get(i)?.common.to_matched(domain),
            EarthDomain::Cables => self.cables.get(i)?.common.to_matched(domain),
        })
    }

    /// Runs a query: every record of `q.domain` that passes all filters,
    /// sorted by lowercase name then id, at most `q.limit` (capped at
    /// [`MAX_LIMIT`]) returned. Never fails: filters that do not apply to the
    /// domain, an unusable prefix, or data the sources lack make the result
    /// empty or partial and are explained in `missing_data`. Use
    /// [`EntityQuery::from_tool_arguments`] to refuse such queries up front.
    pub fn find(&self, q: &EntityQuery) -> EntityQueryResult {
        let mut missing: Vec<String> = self
            .domain_notes
            .get(&q.domain)
            .cloned()
            .unwrap_or_default();
        let inapplicable = q.filters.inapplicable(q.domain);
        if !inapplicable.is_empty() {
            missing.push(format!(
                "filter {} does not apply to domain {}; nothing matched",
                inapplicable.join(", "),
                q.domain.as_str()
            ));
            return EntityQueryResult {
                missing_data: missing,
                ..Default::default()
            };
        }
        if let Some(p) = &q.filters.prefix {
            if IpPrefix::parse(p).is_none() {
                missing.push(format!(
                    "prefix `{p}` is not an IP prefix or address; nothing matched"
                ));
                return EntityQueryResult {
                    missing_data: missing,
                    ..Default::default()
                };
            }
        }
        let limit = q.limit.min(MAX_LIMIT);
        let f = Prepared::new(&q.filters);
        let mut notes = MatchNotes::default();
        let (entities, total) = match q.domain {
            EarthDomain::Satellites => self.find_satellites(q, &f, limit, &mut notes, &mut missing),
            EarthDomain::ComputeCenters => {
                let mut country_only = 0usize;
                let r = scan(
                    &self.compute_centers,
                    limit,
                    |r| {
                        let ok = center_matches(r, &f, &mut notes);
                        if ok && r.location_precision == LocationPrecision::Country {
                            country_only += 1;
                        }
                        ok
                    },
                    |r| r.common.to_matched(EarthDomain::ComputeCenters),
                );
                if country_only > 0 {
                    missing.push(format!(
                        "{country_only} matched compute centers have no coordinates in their source \
                         (TOP500, Epoch GPU clusters) and are placed at their country's centroid \
                         (location_precision country)"
                    ));
                }
                r
            }
            EarthDomain::Bgp => self.find_bgp(&f, limit, &mut notes, &mut missing),
            EarthDomain::News | EarthDomain::Vessels => {
                let records = if q.domain == EarthDomain::News {
                    &self.news
                } else {
                    &self.vessels
                };
                scan(
                    records,
                    limit,
                    |r| geo_feature_matches(r, &f, &mut notes),
                    |r| r.common.to_matched(q.domain),
                )
            }
            EarthDomain::Cables => self.find_cables(&f, limit, &mut notes, &mut missing),
        };
        if notes.ambiguous_china > 0 {
            missing.push(format!(
                "{} matched {} records say only \"China\" and cannot be told apart from Hong Kong, \
                 Macau or Taiwan; they are included as mainland China",
                notes.ambiguous_china,
                q.domain.as_str()
            ));
        }
        if total == 0 && !q.filters.set_fields().is_empty() {
            if let Some(sources) = self.sources.get(&q.domain).filter(|s| !s.is_empty()) {
                let filters = serde_json::to_value(&q.filters)
                    .ok()
                    .and_then(|v| v.as_object().cloned())
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(k, v)| match v {
                        serde_json::Value::String(s) => format!("{k} = {s}"),
                        other => format!("{k} = {other}"),
                    })
                    .collect::<Vec<_>>()
                    .join(", ");
                missing.push(format!(
                    "the {} source{} ({}) {} no rows with {filters}",
                    q.domain.as_str(),
                    if sources.len() > 1 { "s" } else { "" },
                    sources.join(", "),
                    if sources.len() > 1 { "have" } else { "has" },
                ));
            }
            for (field, query) in [("country", &f.country), ("region", &f.region)] {
                if let Some(CountryQuery::Text(t)) = query {
                    missing.push(format!(
                        "{field} `{t}` is not a known country or continent name; matched by exact text only"
                    ));
                }
            }
        }
        let truncated = total > entities.len();
        if truncated {
            missing.push(format!(
                "{total} {} entities matched; only the first {} are returned",
                q.domain.as_str(),
                entities.len()
            ));
        }
        EntityQueryResult {
            entities,
            total_matched: total,
            truncated,
            missing_data: missing,
        }
    }

    fn find_satellites(
        &self,
        q: &EntityQuery,
        f: &Prepared,
        limit: usize,
        notes: &mut MatchNotes,
        missing: &mut Vec<String>,
    ) -> (Vec<MatchedEntity>, usize) {
        let at = q.at.unwrap_or_else(Utc::now);
        let at_naive = at.naive_utc();
        let mut at_epoch = 0usize;
        let mut no_position = 0usize;
        let mut max_age_days: i64 = 0;
        let r = scan(
            &self.satellites,
            limit,
            |r| satellite_matches(r, f, notes),
            |r| {
                let (m, outcome) = r.to_matched(&at_naive);
                match outcome {
                    PositionOutcome::AtQueryTime => {}
                    PositionOutcome::AtEpoch => at_epoch += 1,
                    PositionOutcome::None => no_position += 1,
                }
                if let Some(e) = r.epoch() {
                    max_age_days = max_age_days.max((at_naive - e).num_days().abs());
                }
                m
            },
        );
        if f.country.is_some() || f.region.is_some() || f.operator_lc.is_some() {
            missing.push(
                "TLE data has no owner country or operator; they are known only for BeiDou, GPS, \
                 Galileo, GLONASS, Starlink, Iridium and OneWeb satellites, so other satellites \
                 cannot match a country or operator filter"
                    .into(),
            );
        }
        if max_age_days > STALE_TLE_DAYS {
            missing.push(format!(
                "TLE epochs are up to {max_age_days} days from the requested time {}; satellite \
                 positions are SGP4 extrapolations and may be far from the real ones",
                at.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ));
        }
        if at_epoch > 0 {
            missing.push(format!(
                "{at_epoch} satellites could not be propagated to the requested time; their \
                 positions are at their TLE epoch (see position_time)"
            ));
        }
        if no_position > 0 {
            missing.push(format!(
                "{no_position} satellites have no computable position"
            ));
        }
        r
    }

    fn find_bgp(
        &self,
        f: &Prepared,
        limit: usize,
        notes: &mut MatchNotes,
        missing: &mut Vec<String>,
    ) -> (Vec<MatchedEntity>, usize) {
        let unsupported: Vec<&str> = [
            ("country", f.country.is_some()),
            ("region", f.region.is_some()),
            ("collector", f.collector_lc.is_some()),
        ]
        .into_iter()
        .filter_map(|(n, set)| set.then_some(n))
        .collect();
        if !unsupported.is_empty() && !self.bgp.is_empty() {
            missing.push(format!(
                "the BGP events source has no {} field; nothing matched",
                unsupported.join(" or ")
            ));
            return (Vec::new(), 0);
        }
        let mut open_ended = 0usize;
        let r = scan(
            &self.bgp,
            limit,
            |r| {
                let ok = bgp_matches(r, f, notes);
                if ok && r.status == "ongoing" {
                    open_ended += 1;
                }
                ok
            },
            |r| r.common.to_matched(EarthDomain::Bgp),
        );
        if open_ended > 0 {
            missing.push(format!(
                "{open_ended} matched BGP events have no end_time in the source; their status \
                 ongoing means no end was recorded"
            ));
        }
        r
    }

    fn find_cables(
        &self,
        f: &Prepared,
        limit: usize,
        notes: &mut MatchNotes,
        missing: &mut Vec<String>,
    ) -> (Vec<MatchedEntity>, usize) {
        let r = scan(
            &self.cables,
            limit,
            |r| cable_matches(r, f, notes),
            |r| r.common.to_matched(EarthDomain::Cables),
        );
        let cable_filter = (f.has_place_filter() || f.landing_point_lc.is_some())
            && f.kind != Some(EntityKind::LandingPoint);
        if cable_filter {
            let unplaced = self
                .cables
                .iter()
                .filter(|c| c.kind == EntityKind::Cable && c.landing_names_lc.is_empty())
                .count();
            missing.push(format!(
                "cable landing points are inferred from cable geometry (line ends within \
                 {} km of a landing point); {unplaced} cables have none and cannot match a \
                 country or landing point",
                super::cables::LANDING_MATCH_KM
            ));
        }
        r
    }
}

/// Scans pre-sorted records: counts every match, builds at most `limit`.
fn scan<R>(
    records: &[R],
    limit: usize,
    mut matches: impl FnMut(&R) -> bool,
    mut emit: impl FnMut(&R) -> MatchedEntity,
) -> (Vec<MatchedEntity>, usize) {
    let mut out = Vec::with_capacity(limit.min(records.len()));
    let mut total = 0usize;
    for r in records {
        if matches(r) {
            total += 1;
            if out.len() < limit {
                out.push(emit(r));
            }
        }
    }
    (out, total)
}

fn satellite_matches(r: &SatelliteRecord, f: &Prepared, notes: &mut MatchNotes) -> bool {
    if let Some(c) = f.constellation {
        let ok = match c.as_orbital_class() {
            Some(class) => r.orbital_class == class,
            None => r.constellation == Some(c),
        };
        if !ok {
            return false;
        }
    }
    f.orbital_class.is_none_or(|c| r.orbital_class == c)
        && f.norad_id.is_none_or(|n| r.norad_id == n)
        && f.name_ok(&r.common.search_lc)
        && contains_opt(&f.operator_lc, &r.operator_lc)
        && (!f.has_place_filter()
            || (r.common.place.code.is_some() && f.place_ok(&r.common.place, notes)))
}

fn center_matches(r: &ComputeCenterRecord, f: &Prepared, notes: &mut MatchNotes) -> bool {
    f.site_type.is_none_or(|t| r.site_type == t)
        && f.source_lc.as_deref().is_none_or(|s| r.source == s)
        && f.needs_confirmation
            .is_none_or(|n| r.needs_confirmation == n)
        && f.location_precision
            .is_none_or(|p| r.location_precision == p)
        && f.status.as_deref().is_none_or(|s| r.status == s)
        && contains_opt(&f.operator_lc, &r.operator_lc)
        && f.name_ok(&r.common.search_lc)
        && f.place_ok(&r.common.place, notes)
}

fn bgp_matches(r: &BgpEvent, f: &Prepared, _notes: &mut MatchNotes) -> bool {
    f.severity.is_none_or(|s| r.severity == s)
        && f.status.as_deref().is_none_or(|s| r.status == s)
        && f.category_lc.as_deref().is_none_or(|c| r.category_lc == c)
        && f.asn.is_none_or(|a| r.asns.contains(&a))
        && f.prefix
            .is_none_or(|p| r.prefixes.iter().any(|x| x.overlaps(&p)))
        && f.name_ok(&r.common.search_lc)
}

fn geo_feature_matches(r: &GeoFeatureRecord, f: &Prepared, notes: &mut MatchNotes) -> bool {
    f.status.as_deref().is_none_or(|s| r.status == s)
        && contains_opt(&f.source_lc, &r.source_lc)
        && contains_opt(&f.vessel_type_lc, &r.vessel_type_lc)
        && contains_opt(&f.operator_lc, &r.operator_lc)
        && f.name_ok(&r.common.search_lc)
        && f.place_ok(&r.common.place, notes)
}

fn cable_matches(r: &CableRecord, f: &Prepared, notes: &mut MatchNotes) -> bool {
    if f.kind.is_some_and(|k| r.kind != k) || !f.name_ok(&r.common.search_lc) {
        return false;
    }
    if let Some(lp) = &f.landing_point_lc {
        if !r.landing_names_lc.iter().any(|n| n.contains(lp.as_str())) {
            return false;
        }
    }
    match r.kind {
        EntityKind::LandingPoint => f.place_ok(&r.common.place, notes),
        EntityKind::Cable => f.any_place_ok(&r.landing_places, notes),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn vessels(features: serde_json::Value, label: &str) -> GeoLayerData {
        let fc = serde_json::json!({"type": "FeatureCollection", "features": features});
        GeoLayerData::parse(
            fc.to_string().as_bytes(),
            EarthDomain::Vessels,
            label,
            label,
        )
        .unwrap()
    }

    #[test]
    fn geo_sources_add_entities_and_a_taken_id_is_skipped() {
        let base = EntityCatalog::load(&EarthDataConfig::default()).unwrap();
        assert!(base
            .find(&EntityQuery::new(EarthDomain::Vessels))
            .missing_data[0]
            .contains("no data source configured"));
        let a = vessels(
            serde_json::json!([{"properties": {"mmsi": 1, "name": "A"}, "geometry": null}]),
            "a",
        );
        let b = vessels(
            serde_json::json!([
                {"properties": {"mmsi": 1, "name": "A again"}, "geometry": null},
                {"properties": {"mmsi": 2, "name": "B"}, "geometry": null}
            ]),
            "b",
        );
        let cat = base.with_geo_sources(&[&a, &b]);
        assert_ne!(cat.version(), base.version());
        let r = cat.find(&EntityQuery::new(EarthDomain::Vessels));
        let ids: Vec<&str> = r.entities.iter().map(|e| e.entity_id.as_str()).collect();
        assert_eq!(ids, ["vessel:mmsi:1", "vessel:mmsi:2"]);
        assert!(r.missing_data.is_empty(), "{:?}", r.missing_data);
        assert!(cat
            .stats()
            .warnings
            .iter()
            .any(|w| w.contains("already loaded")));
        assert!(!base.contains("vessel:mmsi:1"), "the base is unchanged");
    }
}
