//! Satellites from CelesTrak TLE text (docs/earth-command.md, "Earth data"): 3-line
//! (name + two element lines) or 2-line sets, CRLF or LF, names padded with
//! spaces. Parsed with `sgp4::Elements::from_tle`, which also verifies the
//! line checksums.
//!
//! Ids are `satellite:norad:{norad_id}`; a NORAD id seen twice in one file
//! gives the later set `satellite:index:{i}` (i = 0-based position of the
//! element set in the file).

use chrono::{DateTime, NaiveDateTime, SecondsFormat, Utc};
use serde_json::Value;
use shared_protocol::earth::{EarthDomain, MatchedEntity};

use super::orbit::Propagator;
use super::query::{Constellation, OrbitalClass};
use super::record::{json_f64, Common};
use super::region::{normalize, Place};

/// One satellite with its precomputed filter keys.
#[derive(Debug, Clone)]
pub(crate) struct SatelliteRecord {
    pub common: Common,
    pub norad_id: u64,
    pub constellation: Option<Constellation>,
    pub orbital_class: OrbitalClass,
    /// Lowercase operator, empty when unknown.
    pub operator_lc: String,
    /// `None` when SGP4 cannot initialise from the elements.
    pub propagator: Option<Propagator>,
}

/// What happened when positioning a satellite for a query.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PositionOutcome {
    /// Propagated to the query time.
    AtQueryTime,
    /// SGP4 failed at the query time; the position is at the TLE epoch.
    AtEpoch,
    /// No position at all.
    None,
}

impl SatelliteRecord {
    /// The wire form with `lat`/`lon` and `alt_km`, `position_time`
    /// properties for `at`.
    pub fn to_matched(&self, at: &NaiveDateTime) -> (MatchedEntity, PositionOutcome) {
        let mut m = self.common.to_matched(EarthDomain::Satellites);
        let Some(p) = &self.propagator else {
            return (m, PositionOutcome::None);
        };
        let (geo, time, outcome) = match p.position_at(at) {
            Some(g) => (Some(g), *at, PositionOutcome::AtQueryTime),
            None => match p.position_at(&p.epoch) {
                Some(g) => (Some(g), p.epoch, PositionOutcome::AtEpoch),
                None => (None, *at, PositionOutcome::None),
            },
        };
        if let Some(g) = geo {
            m.lat = Some(g.lat_deg);
            m.lon = Some(g.lon_deg);
            m.properties.insert(
                "alt_km".into(),
                json_f64(Some((g.alt_km * 1000.0).round() / 1000.0)),
            );
            m.properties.insert(
                "position_time".into(),
                Value::String(time.and_utc().to_rfc3339_opts(SecondsFormat::Secs, true)),
            );
        }
        (m, outcome)
    }

    /// TLE epoch, when the elements parsed into a propagator.
    pub fn epoch(&self) -> Option<NaiveDateTime> {
        self.propagator.as_ref().map(|p| p.epoch)
    }
}

/// Constellation from a satellite name (docs/earth-command.md, "Earth data"):
/// BeiDou by `BEIDOU`, `BDS` or `北斗`; GPS by `NAVSTAR…` or a `GPS` word;
/// Galileo by `GALILEO` or a `GSAT0nnn` name (ISRO's `GSAT-n` are not
/// Galileo); GLONASS, Starlink, Iridium, OneWeb by name.
pub(crate) fn classify_constellation(name: &str) -> Option<Constellation> {
    let upper = name.trim().to_uppercase();
    let has_word = |w: &str| {
        upper
            .split(|c: char| !c.is_ascii_alphanumeric())
            .any(|t| t == w)
    };
    if upper.contains("BEIDOU") || upper.contains("北斗") || has_word("BDS") {
        return Some(Constellation::Beidou);
    }
    if upper.starts_with("NAVSTAR") || has_word("GPS") {
        return Some(Constellation::Gps);
    }
    let gsat_serial = upper
        .strip_prefix("GSAT0")
        .is_some_and(|rest| rest.len() >= 3 && rest.as_bytes()[..3].iter().all(u8::is_ascii_digit));
    if upper.contains("GALILEO") || gsat_serial {
        return Some(Constellation::Galileo);
    }
    if upper.contains("GLONASS") {
        return Some(Constellation::Glonass);
    }
    if upper.starts_with("STARLINK") {
        return Some(Constellation::Starlink);
    }
    if upper.starts_with("IRIDIUM") {
        return Some(Constellation::Iridium);
    }
    if upper.starts_with("ONEWEB") {
        return Some(Constellation::Oneweb);
    }
    None
}

/// Orbital class from mean motion (rev/day) and eccentricity: see
/// [`OrbitalClass`]. Geosynchronous orbits are `geo` whatever their
/// inclination (BeiDou IGSO included); the `inclination_deg` property tells
/// geostationary apart.
pub(crate) fn classify_orbit(mean_motion_rev_per_day: f64, eccentricity: f64) -> OrbitalClass {
    if eccentricity >= 0.25 {
        OrbitalClass::Heo
    } else if mean_motion_rev_per_day >= 11.25 {
        OrbitalClass::Leo
    } else if (0.9..=1.1).contains(&mean_motion_rev_per_day) {
        OrbitalClass::Geo
    } else {
        OrbitalClass::Meo
    }
}

/// Owner country and operator implied by a constellation (TLEs carry
/// neither). ISO code, or a non-country owner name.
fn constellation_owner(c: Constellation) -> Option<(&'static str, &'static str)> {
    Some(match c {
        Constellation::Beidou => ("CN", "China Satellite Navigation Office"),
        Constellation::Gps => ("US", "United States Space Force"),
        Constellation::Galileo => ("EU", "European Union Agency for the Space Programme"),
        Constellation::Glonass => ("RU", "Roscosmos"),
        Constellation::Starlink => ("US", "SpaceX"),
        Constellation::Iridium => ("US", "Iridium Communications"),
        Constellation::Oneweb => ("GB", "OneWeb"),
        _ => return None,
    })
}

fn chinese_name(c: Constellation) -> Option<&'static str> {
    Some(match c {
        Constellation::Beidou => "北斗",
        Constellation::Gps => "gps 全球定位系统",
        Constellation::Galileo => "伽利略",
        Constellation::Glonass => "格洛纳斯",
        Constellation::Starlink => "星链",
        Constellation::Iridium => "铱星",
        _ => return None,
    })
}

fn is_line(line: &str, first: u8) -> bool {
    let b = line.as_bytes();
    b.len() >= 2 && b[0] == first && b[1] == b' '
}

/// Parses TLE text. Returns the records (unsorted) and one warning per
/// skipped element set or stray line. `warm_at` is the time queries are
/// expected around (load time), used to pre-advance resonant orbits.
pub(crate) fn parse_tle_text(
    text: &str,
    source: &str,
    warm_at: DateTime<Utc>,
) -> (Vec<SatelliteRecord>, Vec<String>) {
    let lines: Vec<&str> = text
        .split('\n')
        .map(|l| l.trim_end_matches(['\r', ' ', '\t']))
        .collect();
    let mut records = Vec::new();
    let mut warnings = Vec::new();
    let mut seen = std::collections::HashSet::new();
    let mut set_index = 0usize;
    let mut i = 0usize;
    while i < lines.len() {
        let line = lines[i];
        if line.trim().is_empty() {
            i += 1;
            continue;
        }
        let (name, l1, l2, line_no) =
            if is_line(line, b'1') && lines.get(i + 1).is_some_and(|l| is_line(l, b'2')) {
                (None, line, lines[i + 1], i + 1)
            } else if lines.get(i + 1).is_some_and(|l| is_line(l, b'1'))
                && lines.get(i + 2).is_some_and(|l| is_line(l, b'2'))
            {
                let n = line.trim();
                let n = n.strip_prefix("0 ").unwrap_or(n).trim();
                (Some(n.to_owned()), lines[i + 1], lines[i + 2], i + 2)
            } else {
                warnings.push(format!(
                    "{source} line {}: not part of a TLE, skipped",
                    i + 1
                ));
                i += 1;
                continue;
            };
        i = line_no + 1;
        let index = set_index;
        set_index += 1;
        let elements = match sgp4::Elements::from_tle(name.clone(), l1.as_bytes(), l2.as_bytes()) {
            Ok(e) => e,
            Err(e) => {
                warnings.push(format!(
                    "{source} line {}: TLE {} skipped: {e}",
                    line_no,
                    name.as_deref().unwrap_or("(unnamed)")
                ));
                continue;
            }
        };
        records.push(build_record(&elements, index, &mut seen));
    }
    warm_up_resonant(&mut records, &warm_at.naive_utc());
    (records, warnings)
}

/// Warms the resonance integrators of geosynchronous and 12-hour orbits on
/// all cores (the dominant load cost for old TLEs: ~110 ns per 720-minute
/// step, thousands of steps each).
fn warm_up_resonant(records: &mut [SatelliteRecord], at: &NaiveDateTime) {
    let mut resonant: Vec<&mut Propagator> = records
        .iter_mut()
        .filter_map(|r| r.propagator.as_mut())
        .filter(|p| p.is_resonant())
        .collect();
    if resonant.is_empty() {
        return;
    }
    let threads = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(8);
    let chunk = resonant.len().div_ceil(threads);
    std::thread::scope(|scope| {
        for part in resonant.chunks_mut(chunk) {
            scope.spawn(move || {
                for p in part.iter_mut() {
                    p.warm_up(at);
                }
            });
        }
    });
}

fn build_record(
    e: &sgp4::Elements,
    index: usize,
    seen: &mut std::collections::HashSet<u64>,
) -> SatelliteRecord {
    let name = e
        .object_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| format!("NORAD {}", e.norad_id));
    let id = if e.norad_id > 0 && seen.insert(e.norad_id) {
        format!("satellite:norad:{}", e.norad_id)
    } else {
        format!("satellite:index:{index}")
    };
    let constellation = classify_constellation(&name);
    let orbital_class = classify_orbit(e.mean_motion, e.eccentricity);
    let mut c = Common::new(id, name);
    c.add_search_text(e.international_designator.as_deref().unwrap_or(""));
    c.prop("norad_id", e.norad_id);
    c.prop(
        "international_designator",
        e.international_designator.clone().unwrap_or_default(),
    );
    c.prop(
        "tle_epoch",
        e.datetime
            .and_utc()
            .to_rfc3339_opts(SecondsFormat::Secs, true),
    );
    if let Some(k) = constellation {
        c.prop("constellation", k.as_str());
    }
    c.prop("orbital_class", orbital_class.as_str());
    c.prop("inclination_deg", json_f64(Some(e.inclination)));
    c.prop("eccentricity", json_f64(Some(e.eccentricity)));
    c.prop("mean_motion_rev_per_day", json_f64(Some(e.mean_motion)));
    if e.mean_motion > 0.0 {
        c.prop(
            "period_min",
            json_f64(Some((1440.0 / e.mean_motion * 100.0).round() / 100.0)),
        );
    }
    c.prop("source", "tle");
    // Chinese names, so `name_contains: "北斗"` finds BeiDou as well.
    if let Some(zh) = constellation.and_then(chinese_name) {
        c.add_search_text(zh);
    }
    let mut operator_lc = String::new();
    if let Some((code, operator)) = constellation.and_then(constellation_owner) {
        c.place = Place::from_code(code);
        c.country = c.place.display_name().map(str::to_owned);
        c.prop("operator", operator);
        c.prop("country_code", code);
        c.prop("owner_inferred_from", "constellation");
        operator_lc = normalize(operator);
        c.add_search_text(operator);
    }
    SatelliteRecord {
        common: c,
        norad_id: e.norad_id,
        constellation,
        orbital_class,
        operator_lc,
        propagator: Propagator::new(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn navigation_names_from_several_celestrak_files_classify() {
        let cases = [
            ("BEIDOU-3 M1", Some(Constellation::Beidou)),
            ("BEIDOU-2 G7 (C03)", Some(Constellation::Beidou)),
            ("BDS-3 M2", Some(Constellation::Beidou)),
            ("北斗三号", Some(Constellation::Beidou)),
            ("NAVSTAR 43 (USA 132)", Some(Constellation::Gps)),
            ("GPS BIIR-2  (PRN 13)", Some(Constellation::Gps)),
            ("GSAT0101 (GALILEO-PFM)", Some(Constellation::Galileo)),
            ("GSAT-8", None),
            ("COSMOS 2425 [GLONASS-M]", Some(Constellation::Glonass)),
            ("STARLINK-1007", Some(Constellation::Starlink)),
            ("TBDSAT", None),
        ];
        for (name, want) in cases {
            assert_eq!(classify_constellation(name), want, "{name}");
        }
    }

    #[test]
    fn orbit_classes_follow_mean_motion_and_eccentricity() {
        assert_eq!(classify_orbit(15.5, 0.0002), OrbitalClass::Leo);
        assert_eq!(classify_orbit(2.0, 0.01), OrbitalClass::Meo);
        assert_eq!(classify_orbit(1.0027, 0.0003), OrbitalClass::Geo);
        assert_eq!(classify_orbit(2.006, 0.7), OrbitalClass::Heo);
    }
}
