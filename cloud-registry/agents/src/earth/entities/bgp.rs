//! BGP hijack events CSV (`no, title, category, detail, start_time,
//! end_time, victim_as, hijack_as, innocent_as, prefix, hijack_prefix, link,
//! comments`; CRLF). Seed 000 "BGP": severity, status, region, collector,
//! prefix, ASN.
//!
//! Ids are `bgp:event:{slug(title)}`: the `no` column restarts for each
//! group of rows and repeats (two rows are no 10 of `origin_change`), so it
//! cannot identify an event. A repeated title falls back to
//! `bgp:event:row:{n}` (n = 1-based data row).
//!
//! Rows with more fields than the header are tolerated: the first eleven
//! columns are read by position and `link` is the first later field that
//! starts with `http`, `comments` the field after it.
//!
//! `severity` is derived from `detail`, the kind of announcement:
//! `subprefix` → `high` (a more-specific prefix wins everywhere, so all of
//! the victim's traffic for it is diverted); `moas` → `medium` (an
//! exact-prefix origin conflict splits traffic by topology); `moas_unused` →
//! `low` (the prefix was not in use); anything else → `medium`. A `typo`
//! category (a misconfiguration) lowers it one step.
//!
//! `status` is `ongoing` when `end_time` is empty, else `ended`. The file
//! has no region or collector columns.

use std::collections::HashSet;
use std::path::Path;

use chrono::{NaiveDateTime, SecondsFormat};
use serde_json::Value;

use super::prefix::IpPrefix;
use super::query::Severity;
use super::record::{read_file, slug, Columns, Common};
use super::EntityError;

/// One hijack event.
#[derive(Debug, Clone)]
pub(crate) struct BgpEvent {
    pub common: Common,
    pub category_lc: String,
    pub severity: Severity,
    /// `ongoing` or `ended`.
    pub status: &'static str,
    /// `prefix` and `hijack_prefix`, parsed.
    pub prefixes: Vec<IpPrefix>,
    /// Victim and hijacker AS numbers.
    pub asns: Vec<u64>,
}

fn derive_severity(category: &str, detail: &str) -> Severity {
    let base = match detail {
        "subprefix" => Severity::High,
        "moas_unused" => Severity::Low,
        _ => Severity::Medium,
    };
    if category == "typo" {
        match base {
            Severity::High => Severity::Medium,
            _ => Severity::Low,
        }
    } else {
        base
    }
}

/// "12880, 65050" → [12880, 65050]; non-numbers are dropped.
fn parse_asns(text: &str) -> Vec<u64> {
    text.split([',', ' ', ';'])
        .filter_map(|t| {
            let t = t.trim();
            t.strip_prefix("AS").unwrap_or(t).parse::<u64>().ok()
        })
        .collect()
}

fn rfc3339(text: &str) -> Value {
    let t = text.trim();
    if t.is_empty() {
        return Value::Null;
    }
    match NaiveDateTime::parse_from_str(t, "%Y-%m-%dT%H:%M:%S") {
        // The file gives no zone; the sources it was curated from use UTC.
        Ok(dt) => Value::String(dt.and_utc().to_rfc3339_opts(SecondsFormat::Secs, true)),
        Err(_) => Value::String(t.to_owned()),
    }
}

/// Loads the events CSV. Errors: unreadable file, malformed CSV, or a missing
/// `title`/`prefix` column.
pub(crate) fn load(path: &Path) -> Result<(Vec<BgpEvent>, Vec<String>), EntityError> {
    let bytes = read_file(path)?;
    let mut reader = csv::ReaderBuilder::new()
        .flexible(true)
        .from_reader(bytes.as_slice());
    let csv_err = |source: csv::Error| EntityError::Csv {
        path: path.to_path_buf(),
        source,
    };
    let cols = Columns::new(reader.headers().map_err(csv_err)?);
    let title_i = cols.require(path, "title")?;
    let prefix_i = cols.require(path, "prefix")?;
    let header_len = cols.len();
    let get = |rec: &csv::StringRecord, name: &str| -> String {
        cols.index(name)
            .and_then(|i| rec.get(i))
            .map(|s| s.trim().to_owned())
            .unwrap_or_default()
    };
    let link_i = cols.index("link");
    let mut out = Vec::new();
    let mut warnings = Vec::new();
    let mut ids = HashSet::new();
    for (row, rec) in reader.records().enumerate() {
        let rec = rec.map_err(csv_err)?;
        let title = rec.get(title_i).unwrap_or("").trim().to_owned();
        if title.is_empty() {
            warnings.push(format!(
                "{} row {}: empty title, skipped",
                path.display(),
                row + 2
            ));
            continue;
        }
        let (link, comments) = if rec.len() > header_len {
            warnings.push(format!(
                "{} row {}: {} fields for {} columns; link taken from the first URL field",
                path.display(),
                row + 2,
                rec.len(),
                header_len
            ));
            let from = link_i.unwrap_or(0);
            let pos = (from..rec.len())
                .find(|&i| rec.get(i).is_some_and(|f| f.trim().starts_with("http")));
            match pos {
                Some(p) => (
                    rec.get(p).unwrap_or("").trim().to_owned(),
                    rec.get(p + 1).unwrap_or("").trim().to_owned(),
                ),
                None => (get(&rec, "link"), get(&rec, "comments")),
            }
        } else {
            (get(&rec, "link"), get(&rec, "comments"))
        };
        let s = slug(&title);
        let mut id = format!("bgp:event:{s}");
        if s.is_empty() || !ids.insert(id.clone()) {
            id = format!("bgp:event:row:{}", row + 1);
            ids.insert(id.clone());
        }
        let category = get(&rec, "category");
        let detail = get(&rec, "detail");
        let end_time = get(&rec, "end_time");
        let prefix = rec.get(prefix_i).unwrap_or("").trim().to_owned();
        let hijack_prefix = get(&rec, "hijack_prefix");
        let victim = parse_asns(&get(&rec, "victim_as"));
        let hijack = parse_asns(&get(&rec, "hijack_as"));
        let innocent = parse_asns(&get(&rec, "innocent_as"));
        let severity = derive_severity(&category.to_lowercase(), &detail.to_lowercase());
        let status = if end_time.is_empty() {
            "ongoing"
        } else {
            "ended"
        };

        let mut c = Common::new(id, title.clone());
        c.add_search_text(&category);
        c.add_search_text(&comments);
        c.prop("no", get(&rec, "no").parse::<u64>().ok());
        c.prop("title", title);
        c.prop("category", category.clone());
        c.prop("detail", detail);
        c.prop("start_time", rfc3339(&get(&rec, "start_time")));
        c.prop("end_time", rfc3339(&end_time));
        c.prop("victim_as", Value::from(victim.clone()));
        c.prop("hijack_as", Value::from(hijack.clone()));
        c.prop("innocent_as", Value::from(innocent));
        c.prop("prefix", prefix.clone());
        c.prop("hijack_prefix", hijack_prefix.clone());
        c.prop("link", link);
        c.prop("comments", comments);
        c.prop("severity", severity.as_str());
        c.prop("status", status);
        let prefixes = [prefix.as_str(), hijack_prefix.as_str()]
            .into_iter()
            .filter_map(IpPrefix::parse)
            .collect();
        let mut asns = victim;
        asns.extend(hijack);
        out.push(BgpEvent {
            common: c,
            category_lc: category.to_lowercase(),
            severity,
            status,
            prefixes,
            asns,
        });
    }
    Ok((out, warnings))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subprefix_hijacks_are_high_and_typos_one_step_lower() {
        assert_eq!(
            derive_severity("origin_change", "subprefix"),
            Severity::High
        );
        assert_eq!(derive_severity("forged_as_path", "moas"), Severity::Medium);
        assert_eq!(
            derive_severity("forged_as_path", "moas_unused"),
            Severity::Low
        );
        assert_eq!(derive_severity("typo", "subprefix"), Severity::Medium);
    }

    #[test]
    fn asn_lists_split_on_commas() {
        assert_eq!(parse_asns("12880, 65050"), vec![12880, 65050]);
        assert_eq!(parse_asns(" "), Vec::<u64>::new());
    }
}
