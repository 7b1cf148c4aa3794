//! What an operator's Prometheus sees of a lab (real processes:
//! `bench-sim`, `cloud-registry`, `edge-agent` with its `[metrics]`
//! listener): after a lease, one relay action and a release, the registry's
//! histograms count them under the labels a user filters by, the edge
//! reports its link and every capability's health, and both texts pass
//! `promtool check metrics`. An edge whose uploads cannot reach the
//! registry shows its backlog.

use std::collections::BTreeMap;
use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_e2e::{free_port, poll_until};
use benchlink_testkit::{status_is, tool_installed};
use reqwest::StatusCode;
use serde_json::json;

/// One sample line: name, labels, value.
type Sample = (String, BTreeMap<String, String>, f64);

/// The samples of a text exposition (label values hold no `,` or `"`
/// here: ids, types, route patterns).
fn samples(text: &str) -> Vec<Sample> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').expect("`series value`");
            let (name, labels) = match series.split_once('{') {
                Some((n, rest)) => {
                    let labels = rest
                        .trim_end_matches('}')
                        .split(',')
                        .filter(|p| !p.is_empty())
                        .map(|p| {
                            let (k, v) = p.split_once('=').expect("label=value");
                            (k.to_string(), v.trim_matches('"').to_string())
                        })
                        .collect();
                    (n.to_string(), labels)
                }
                None => (series.to_string(), BTreeMap::new()),
            };
            let value = value.parse().unwrap_or_else(|_| panic!("value in {l}"));
            (name, labels, value)
        })
        .collect()
}

/// Sum of the samples named `name` whose labels include `with`.
fn sum(text: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    samples(text)
        .iter()
        .filter(|(n, labels, _)| {
            n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.get(*k).map(String::as_str) == Some(*v))
        })
        .map(|(_, _, v)| v)
        .sum()
}

async fn scrape(url: &str) -> String {
    let r = reqwest::get(url).await.expect("scrape");
    assert_eq!(r.status(), StatusCode::OK, "{url}");
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{url}: {ct}");
    r.text().await.unwrap()
}

/// `promtool check metrics` on `text`: exit code and everything it said.
fn promtool(text: &str) -> (Option<i32>, String) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run promtool");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    (
        out.status.code(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_and_an_action_show_in_both_expositions_and_promtool_accepts_them() {
    // Debian's `prometheus` package (scripts/setup.sh).
    if !tool_installed("promtool") {
        return;
    }
    let lab = Lab::start(LabOptions {
        edge_metrics: true,
        ..LabOptions::default()
    })
    .await
    .expect("lab starts");
    let registry_url = format!("{}/metrics", lab.base_url);
    let edge_url = lab.edge_metrics_url().expect("edge metrics on");
    let before = scrape(&registry_url).await;
    let waited = |t: &str| {
        sum(
            t,
            "benchlink_lease_wait_seconds_count",
            &[("type", "relay")],
        )
    };
    let held = |t: &str| {
        sum(
            t,
            "benchlink_lease_hold_seconds_count",
            &[("type", "relay")],
        )
    };

    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let lease = hw.lease_ok(caps::RELAY, "metrics check").await.unwrap();
    let (_, session) = status_is(
        hw.act(&lease, "switch_on", json!({"channel": 1}), 10_000)
            .await
            .unwrap(),
        StatusCode::OK,
    );
    assert_eq!(session["status"], "completed", "{session}");
    status_is(hw.release(&lease).await.unwrap(), StatusCode::OK);

    let registry = scrape(&registry_url).await;
    let action = [
        ("type", "relay"),
        ("action", "switch_on"),
        ("status", "completed"),
    ];
    assert_eq!(
        sum(
            &registry,
            "benchlink_action_round_trip_seconds_count",
            &action
        ),
        1.0,
        "{registry}"
    );
    assert!(
        sum(
            &registry,
            "benchlink_action_round_trip_seconds_sum",
            &action
        ) > 0.0
    );
    assert!(waited(&registry) > waited(&before), "{registry}");
    let hold_end = [
        ("type", "relay"),
        ("holder_type", "audit_agent"),
        ("end", "released"),
    ];
    assert_eq!(
        sum(&registry, "benchlink_lease_hold_seconds_count", &hold_end),
        1.0,
        "{registry}"
    );
    assert!(held(&registry) > held(&before));
    let lease_route = [
        ("method", "POST"),
        ("route", "/api/v1/capability-leases/request"),
        ("status", "201"),
    ];
    assert!(
        sum(
            &registry,
            "benchlink_http_request_duration_seconds_count",
            &lease_route
        ) >= 1.0,
        "{registry}"
    );
    // Route patterns, never raw paths: the lease id is not a label value.
    assert!(
        !registry.contains(&lease),
        "a lease id in a label:\n{registry}"
    );
    assert!(registry.contains("route=\"/api/v1/capability-leases/{lease_id}/actions\""));
    assert_eq!(sum(&registry, "benchlink_lease_queue_depth", &[]), 0.0);
    assert!(
        sum(
            &registry,
            "benchlink_mqtt_messages_out_total",
            &[("kind", "commands")]
        ) >= 1.0
    );
    assert!(sum(&registry, "benchlink_events_total", &[]) >= 1.0);

    let edge = scrape(&edge_url).await;
    assert_eq!(
        sum(&edge, "benchlink_edge_mqtt_connected", &[]),
        1.0,
        "{edge}"
    );
    for id in caps::ALL {
        let series = sum(
            &edge,
            "benchlink_edge_capability_health",
            &[("capability_id", id)],
        );
        assert_eq!(series, 1.0, "one current status for {id}:\n{edge}");
    }
    assert_eq!(
        sum(
            &edge,
            "benchlink_edge_capability_health",
            &[
                ("capability_id", caps::RELAY),
                ("type", "relay"),
                ("status", "healthy")
            ]
        ),
        1.0,
        "{edge}"
    );

    for (what, text) in [("registry", &registry), ("edge", &edge)] {
        let (code, said) = promtool(text);
        assert_eq!(
            (code, said.as_str()),
            (Some(0), ""),
            "promtool on the {what}'s text"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_whose_uploads_cannot_reach_the_registry_shows_its_backlog() {
    // The edge's HTTP goes to a port nobody listens on; MQTT still works,
    // so the snapshot is taken and waits in the outbox.
    let lab = Lab::start(LabOptions {
        edge_metrics: true,
        edge_http_port: Some(free_port()),
        ..LabOptions::default()
    })
    .await
    .expect("lab starts");
    let edge_url = lab.edge_metrics_url().expect("edge metrics on");
    let before = scrape(&edge_url).await;
    assert_eq!(
        sum(&before, "benchlink_edge_outbox_pending_artifacts", &[]),
        0.0,
        "{before}"
    );

    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let lease = hw.lease_ok(caps::CAMERA, "backlog").await.unwrap();
    hw.act_ok(&lease, "snapshot", json!({})).await.unwrap();

    // The outbox figures follow the daemon's status snapshot (every 2 s).
    let edge = poll_until(
        Duration::from_secs(15),
        "the backlog on /metrics",
        || async {
            let text = scrape(&edge_url).await;
            (sum(&text, "benchlink_edge_outbox_pending_artifacts", &[]) >= 1.0
                && sum(&text, "benchlink_edge_upload_lag_seconds", &[]) > 0.0)
                .then_some(text)
        },
    )
    .await
    .unwrap();
    assert!(
        sum(&edge, "benchlink_edge_outbox_pending_bytes", &[]) > 0.0,
        "{edge}"
    );
    assert_eq!(
        sum(&edge, "benchlink_edge_mqtt_connected", &[]),
        1.0,
        "{edge}"
    );
}
