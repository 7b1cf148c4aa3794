//! Safety rules every Earth action plan passes before it is returned
//! (docs/earth-command.md, "Safety rules"):
//! - only the six action types and six domains (enforced by the wire types:
//!   anything else does not parse and is dropped);
//! - entity ids only from the entity service, of the action's domain;
//!   invented ids are dropped and noted;
//! - at most `max_highlight` ids per highlight, with a truncation note;
//! - `focus_view` needs valid coordinates (-90..90, -180..180), a known
//!   region, or a matched entity;
//! - no script, CSS or URL anywhere: text fields with `<script`,
//!   `javascript:`, `http://`, `https://`, `url(`, HTML tags or `{…}` are
//!   removed or replaced, and colours must be `#hex`.
//!
//! The validator repairs what it can (drops one bad id, replaces one unsafe
//! label) and drops what it cannot; every change is one `notes` line.

use std::collections::HashSet;

use serde_json::{Map, Value};
use shared_protocol::earth::{EarthAction, EarthDomain, HighlightStyle, ResultPanelItem};

use super::entities::{EntityCatalog, EntityQuery};
use super::regions::find_region;
use super::resolver::domain_color;

/// Most actions in one plan.
pub const MAX_ACTIONS: usize = 20;
/// Largest accepted camera altitude, km.
pub const MAX_ALTITUDE_KM: f64 = 100_000.0;

/// Limits the validator enforces.
#[derive(Debug, Clone, Copy)]
pub struct ValidationLimits {
    pub max_highlight: usize,
    pub max_panel_items: usize,
}

/// The validated plan and what was changed to get it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ValidatedPlan {
    pub actions: Vec<EarthAction>,
    /// One line per repair or drop, for `missing_data` and the policy step.
    pub notes: Vec<String>,
    /// Entity ids dropped because the entity service does not know them
    /// (or knows them in another domain).
    pub rejected_ids: Vec<String>,
    /// Actions dropped entirely.
    pub dropped_actions: usize,
}

impl ValidatedPlan {
    /// True when nothing had to be changed.
    pub fn is_clean(&self) -> bool {
        self.notes.is_empty()
    }
}

/// Lowercase patterns that make a text unsafe to show.
const FORBIDDEN: [&str; 16] = [
    "<script",
    "javascript:",
    "vbscript:",
    "data:text",
    "http://",
    "https://",
    "url(",
    "expression(",
    "@import",
    "<iframe",
    "<img",
    "<svg",
    "<style",
    "<link",
    "onerror=",
    "onload=",
];

/// True when `text` carries no script, URL, HTML tag or CSS block.
pub fn is_safe_text(text: &str) -> bool {
    let lc = text.to_lowercase();
    if FORBIDDEN.iter().any(|p| lc.contains(p)) {
        return false;
    }
    // An HTML tag: `<` followed by a letter, `/` or `!`.
    let bytes = lc.as_bytes();
    for (i, b) in bytes.iter().enumerate() {
        if *b == b'<' {
            if let Some(n) = bytes.get(i + 1) {
                if n.is_ascii_alphabetic() || *n == b'/' || *n == b'!' {
                    return false;
                }
            }
        }
    }
    // CSS-like `{ … }`.
    if let (Some(open), Some(close)) = (lc.find('{'), lc.rfind('}')) {
        if open < close {
            return false;
        }
    }
    true
}

/// The domain an entity id belongs to, from its prefix.
pub fn domain_of_id(id: &str) -> Option<EarthDomain> {
    let prefix = id.split(':').next()?;
    Some(match prefix {
        "satellite" => EarthDomain::Satellites,
        "compute_center" => EarthDomain::ComputeCenters,
        "bgp" => EarthDomain::Bgp,
        "news" => EarthDomain::News,
        "vessel" => EarthDomain::Vessels,
        "cable" | "landing_point" => EarthDomain::Cables,
        _ => return None,
    })
}

fn known_in(catalog: &EntityCatalog, id: &str, domain: EarthDomain) -> bool {
    catalog.contains(id)
        && match domain_of_id(id) {
            Some(d) => d == domain,
            None => catalog.get(id).is_some_and(|e| e.domain == domain),
        }
}

fn value_is_safe(v: &Value) -> bool {
    match v {
        Value::String(s) => is_safe_text(s),
        Value::Array(a) => a.iter().all(value_is_safe),
        Value::Object(m) => m.iter().all(|(k, v)| is_safe_text(k) && value_is_safe(v)),
        _ => true,
    }
}

/// Parse raw model actions: each must be one of the six allowed types with a
/// known domain; the rest are dropped with a note.
pub fn parse_actions(raw: &[Value], notes: &mut Vec<String>) -> Vec<EarthAction> {
    let mut out = Vec::new();
    for (i, v) in raw.iter().enumerate() {
        match serde_json::from_value::<EarthAction>(v.clone()) {
            Ok(a) => out.push(a),
            Err(e) => {
                let kind = v.get("type").and_then(Value::as_str).unwrap_or("?");
                let kind: String = kind.chars().take(40).collect();
                notes.push(format!(
                    "action {i} (`{}`) dropped: not an allowed action ({e})",
                    if is_safe_text(&kind) {
                        kind
                    } else {
                        "?".into()
                    }
                ));
            }
        }
    }
    out
}

/// Apply the safety rules to `actions`. `fallback_title` replaces an unsafe
/// result-panel title.
pub fn validate_actions(
    actions: Vec<EarthAction>,
    catalog: &EntityCatalog,
    limits: ValidationLimits,
    fallback_title: &str,
) -> ValidatedPlan {
    let mut plan = ValidatedPlan::default();
    let total = actions.len();
    for (i, action) in actions.into_iter().enumerate() {
        if plan.actions.len() >= MAX_ACTIONS {
            plan.notes.push(format!(
                "{} actions dropped: a plan has at most {MAX_ACTIONS} actions",
                total - i
            ));
            plan.dropped_actions += total - i;
            break;
        }
        if let Some(a) = check_action(i, action, catalog, limits, fallback_title, &mut plan) {
            plan.actions.push(a);
        } else {
            plan.dropped_actions += 1;
        }
    }
    plan
}

fn safe_reason(i: usize, reason: Option<String>, notes: &mut Vec<String>) -> Option<String> {
    match reason {
        Some(r) if !is_safe_text(&r) => {
            notes.push(format!("action {i}: unsafe reason removed"));
            None
        }
        Some(r) => Some(r.chars().take(500).collect()),
        None => None,
    }
}

fn check_action(
    i: usize,
    action: EarthAction,
    catalog: &EntityCatalog,
    limits: ValidationLimits,
    fallback_title: &str,
    plan: &mut ValidatedPlan,
) -> Option<EarthAction> {
    match action {
        EarthAction::ShowLayer { .. } | EarthAction::ClearHighlight { .. } => Some(action),
        EarthAction::HighlightEntities {
            domain,
            entity_ids,
            style,
            reason,
        } => check_highlight(i, domain, entity_ids, style, reason, catalog, limits, plan),
        EarthAction::FilterEntities {
            domain,
            filters,
            reason,
        } => check_filter(i, domain, filters, reason, plan),
        EarthAction::FocusView {
            lat,
            lon,
            altitude_km,
            region,
            entity_id,
            reason,
        } => {
            let focus = Focus {
                lat,
                lon,
                altitude_km,
                region,
                entity_id,
                reason,
            };
            check_focus(i, focus, catalog, plan)
        }
        EarthAction::OpenResultPanel { title, items } => {
            check_panel(i, title, items, catalog, limits, fallback_title, plan)
        }
    }
}

/// `highlight_entities`: known ids of the domain only, once each, at most
/// `limits.max_highlight`; a bad colour becomes the domain colour.
#[allow(clippy::too_many_arguments)]
fn check_highlight(
    i: usize,
    domain: EarthDomain,
    entity_ids: Vec<String>,
    style: Option<HighlightStyle>,
    reason: Option<String>,
    catalog: &EntityCatalog,
    limits: ValidationLimits,
    plan: &mut ValidatedPlan,
) -> Option<EarthAction> {
    let mut seen = HashSet::new();
    let mut kept = Vec::with_capacity(entity_ids.len().min(limits.max_highlight));
    let mut unknown = Vec::new();
    for id in entity_ids {
        if !seen.insert(id.clone()) {
            continue;
        }
        if known_in(catalog, &id, domain) {
            kept.push(id);
        } else {
            unknown.push(id);
        }
    }
    if !unknown.is_empty() {
        let shown: Vec<String> = unknown
            .iter()
            .take(5)
            .map(|s| {
                if is_safe_text(s) {
                    s.chars().take(80).collect()
                } else {
                    "?".into()
                }
            })
            .collect();
        plan.notes.push(format!(
            "action {i}: dropped {} entity id(s) the entity service does not know in {}: {}{}",
            unknown.len(),
            domain.as_str(),
            shown.join(", "),
            if unknown.len() > 5 { ", …" } else { "" }
        ));
        plan.rejected_ids.extend(unknown);
    }
    if kept.len() > limits.max_highlight {
        plan.notes.push(format!(
            "action {i}: highlight truncated to {} of {} entities (limit per highlight)",
            limits.max_highlight,
            kept.len()
        ));
        kept.truncate(limits.max_highlight);
    }
    if kept.is_empty() {
        plan.notes.push(format!(
            "action {i}: highlight_entities dropped: no known entity ids left"
        ));
        return None;
    }
    let style = match style {
        Some(s) if !s.color_is_valid() => {
            plan.notes.push(format!(
                "action {i}: colour replaced: only #rgb or #rrggbb hex colours are allowed"
            ));
            Some(HighlightStyle {
                color: domain_color(domain).to_string(),
                mode: s.mode,
            })
        }
        other => other,
    };
    Some(EarthAction::HighlightEntities {
        domain,
        entity_ids: kept,
        style,
        reason: safe_reason(i, reason, &mut plan.notes),
    })
}

/// `filter_entities`: safe text, and filters that form a valid entity query.
fn check_filter(
    i: usize,
    domain: EarthDomain,
    filters: Map<String, Value>,
    reason: Option<String>,
    plan: &mut ValidatedPlan,
) -> Option<EarthAction> {
    if !value_is_safe(&Value::Object(filters.clone())) {
        plan.notes.push(format!(
            "action {i}: filter_entities dropped: unsafe filter text"
        ));
        return None;
    }
    let q = serde_json::json!({"domain": domain, "filters": filters, "limit": 0});
    if let Err(e) = EntityQuery::from_tool_arguments(q) {
        plan.notes
            .push(format!("action {i}: filter_entities dropped: {e}"));
        return None;
    }
    Some(EarthAction::FilterEntities {
        domain,
        filters,
        reason: safe_reason(i, reason, &mut plan.notes),
    })
}

/// The fields of a `focus_view` action.
struct Focus {
    lat: Option<f64>,
    lon: Option<f64>,
    altitude_km: Option<f64>,
    region: Option<String>,
    entity_id: Option<String>,
    reason: Option<String>,
}

/// `focus_view`: coordinates in range, a known region or a known entity
/// (which fill in the coordinates); dropped when none is left.
fn check_focus(
    i: usize,
    focus: Focus,
    catalog: &EntityCatalog,
    plan: &mut ValidatedPlan,
) -> Option<EarthAction> {
    let Focus {
        lat,
        lon,
        altitude_km,
        region,
        entity_id,
        reason,
    } = focus;
    let mut coords = match (lat, lon) {
        (Some(a), Some(o))
            if a.is_finite() && o.is_finite() && a.abs() <= 90.0 && o.abs() <= 180.0 =>
        {
            Some((a, o))
        }
        (None, None) => None,
        _ => {
            plan.notes.push(format!(
                "action {i}: focus_view coordinates removed: need both lat in -90..90 and lon in -180..180"
            ));
            None
        }
    };
    let region = match region {
        Some(r) => match find_region(&r) {
            Some(known) => {
                if coords.is_none() {
                    coords = Some((known.lat, known.lon));
                }
                Some(known.code.to_string())
            }
            None => {
                plan.notes.push(format!(
                    "action {i}: focus_view region removed: not a known region"
                ));
                None
            }
        },
        None => None,
    };
    let entity_id = match entity_id {
        Some(id) => match catalog.get(&id) {
            Some(e) => {
                if coords.is_none() {
                    coords = e.lat.zip(e.lon);
                }
                Some(id)
            }
            None => {
                plan.notes.push(format!(
                    "action {i}: focus_view entity removed: the entity service does not know it"
                ));
                plan.rejected_ids.push(id);
                None
            }
        },
        None => None,
    };
    if coords.is_none() && region.is_none() && entity_id.is_none() {
        plan.notes.push(format!(
            "action {i}: focus_view dropped: needs valid coordinates, a known region or a matched entity"
        ));
        return None;
    }
    let altitude_km = altitude_km.filter(|a| a.is_finite() && *a > 0.0 && *a <= MAX_ALTITUDE_KM);
    Some(EarthAction::FocusView {
        lat: coords.map(|c| c.0),
        lon: coords.map(|c| c.1),
        altitude_km,
        region,
        entity_id,
        reason: safe_reason(i, reason, &mut plan.notes),
    })
}

/// `open_result_panel`: a safe title, known entities only (at most
/// `limits.max_panel_items`), unsafe labels replaced by the entity name.
fn check_panel(
    i: usize,
    title: String,
    items: Vec<ResultPanelItem>,
    catalog: &EntityCatalog,
    limits: ValidationLimits,
    fallback_title: &str,
    plan: &mut ValidatedPlan,
) -> Option<EarthAction> {
    let title = if is_safe_text(&title) && !title.trim().is_empty() {
        title.chars().take(200).collect()
    } else {
        plan.notes.push(format!(
            "action {i}: unsafe or empty result panel title replaced"
        ));
        fallback_title.to_string()
    };
    let mut kept = Vec::new();
    let mut unknown = 0usize;
    for item in items.into_iter() {
        if kept.len() >= limits.max_panel_items {
            break;
        }
        let Some(e) = catalog
            .contains(&item.entity_id)
            .then(|| catalog.get(&item.entity_id))
            .flatten()
        else {
            unknown += 1;
            plan.rejected_ids.push(item.entity_id);
            continue;
        };
        let label = if is_safe_text(&item.label) && !item.label.trim().is_empty() {
            item.label.chars().take(200).collect()
        } else {
            e.name.clone()
        };
        let subtitle = item
            .subtitle
            .filter(|s| is_safe_text(s))
            .map(|s| s.chars().take(200).collect());
        kept.push(ResultPanelItem {
            entity_id: item.entity_id,
            label,
            subtitle,
        });
    }
    if unknown > 0 {
        plan.notes.push(format!(
            "action {i}: dropped {unknown} result panel item(s) with unknown entity ids"
        ));
    }
    Some(EarthAction::OpenResultPanel { title, items: kept })
}

/// A text for `summary` or a `missing_data` line: kept when safe, else `None`.
pub fn safe_text(text: &str, max_chars: usize) -> Option<String> {
    (is_safe_text(text) && !text.trim().is_empty()).then(|| text.chars().take(max_chars).collect())
}

/// Filters as a JSON object (for notes and steps).
pub fn filters_json(filters: &Map<String, Value>) -> String {
    Value::Object(filters.clone()).to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scripts_urls_tags_and_css_are_unsafe() {
        for bad in [
            "<script>alert(1)</script>",
            "JavaScript:alert(1)",
            "see https://evil.example",
            "background: url(x)",
            "<b>bold</b>",
            "a { color: red }",
        ] {
            assert!(!is_safe_text(bad), "{bad}");
        }
        for good in [
            "北斗卫星（50）",
            "BeiDou satellites (50)",
            "a < b",
            "NORAD 37948",
        ] {
            assert!(is_safe_text(good), "{good}");
        }
    }

    #[test]
    fn unknown_action_types_are_dropped_with_a_note() {
        let mut notes = Vec::new();
        let raw = vec![
            serde_json::json!({"type": "run_script", "code": "x"}),
            serde_json::json!({"type": "show_layer", "layer": "satellites", "enabled": true}),
            serde_json::json!({"type": "show_layer", "layer": "weather", "enabled": true}),
        ];
        let actions = parse_actions(&raw, &mut notes);
        assert_eq!(actions.len(), 1);
        assert_eq!(notes.len(), 2);
    }

    #[test]
    fn ids_map_to_domains_by_prefix() {
        assert_eq!(
            domain_of_id("satellite:norad:1"),
            Some(EarthDomain::Satellites)
        );
        assert_eq!(domain_of_id("landing_point:x"), Some(EarthDomain::Cables));
        assert_eq!(domain_of_id("weird"), None);
    }
}
