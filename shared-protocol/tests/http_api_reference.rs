//! docs/http-api.md lists every event type and every lease status the
//! wire knows, each as a table row; a value added to `EventType` or
//! `LeaseStatus` without its row fails here.

use shared_protocol::event::EventType;
use shared_protocol::lease::LeaseStatus;

fn http_api_md() -> String {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/http-api.md");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// The first cells (`| \`value\` |`) of the table whose header's first
/// cell is `header`.
fn table_keys(doc: &str, header: &str) -> Vec<String> {
    let head = format!("| {header} |");
    let mut lines = doc.lines().skip_while(|l| !l.starts_with(&head));
    assert!(
        lines.next().is_some(),
        "no table headed `{head}` in docs/http-api.md"
    );
    lines
        .skip(1)
        .take_while(|l| l.starts_with('|'))
        .filter_map(|l| {
            let cell = l.trim_start_matches('|').split('|').next()?.trim();
            Some(cell.trim_matches('`').to_string())
        })
        .collect()
}

#[test]
fn every_event_type_has_a_row_in_http_api_md() {
    let rows = table_keys(&http_api_md(), "`event_type`");
    let missing: Vec<&str> = EventType::ALL
        .iter()
        .map(|t| t.as_str())
        .filter(|t| !rows.iter().any(|r| r == t))
        .collect();
    assert!(
        missing.is_empty(),
        "event types not in docs/http-api.md: {missing:?}"
    );
    for row in &rows {
        assert!(
            row.parse::<EventType>().is_ok(),
            "docs/http-api.md lists `{row}`, which is no event type"
        );
    }
}

#[test]
fn every_lease_status_has_a_row_in_http_api_md() {
    let rows = table_keys(&http_api_md(), "`status`");
    let missing: Vec<&str> = LeaseStatus::ALL
        .iter()
        .map(|s| s.as_str())
        .filter(|s| !rows.iter().any(|r| r == s))
        .collect();
    assert!(
        missing.is_empty(),
        "lease statuses not in docs/http-api.md: {missing:?}"
    );
    for row in &rows {
        assert!(
            row.parse::<LeaseStatus>().is_ok(),
            "docs/http-api.md lists `{row}`, which is no lease status"
        );
    }
}
