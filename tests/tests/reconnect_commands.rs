//! Commands the registry queues while its broker connection is down,
//! across real processes on a private Mosquitto that the test kills and
//! starts again: they are held by the registry and sent when the link
//! returns, revocations first, so the bench hears that a lease ended
//! before anything else about it. Under `CI=true` a missing `mosquitto`
//! fails the test.

use std::path::Path;
use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, CHIEF_AGENT, HW_AGENT, PROVIDER_ID};
use benchlink_e2e::client::Agent;
use benchlink_e2e::{eventually, Paused};
use benchlink_testkit::status_is;
use reqwest::StatusCode;
use serde_json::json;

/// Lines of the edge daemon's log.
fn edge_log(root: &Path) -> Vec<String> {
    std::fs::read_to_string(root.join("logs/edge.log"))
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

/// Index of the first line with every one of `words`.
fn line_with(lines: &[String], words: &[&str]) -> Option<usize> {
    lines
        .iter()
        .position(|l| words.iter().all(|w| l.contains(w)))
}

/// A clip runs under a lease that is preempted while the broker is down:
/// the `preempt_requested`, `action_cancel` and `lease_revoked` the
/// registry queues meanwhile reach the bench once the link is back, the
/// revocation before the preemption notice that was queued first, and the
/// clip is stopped for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revocations_queued_while_the_broker_was_down_reach_the_bench_first() {
    let Some((_dir, mut broker, lab)) = Lab::start_on_private_mosquitto(LabOptions {
        heartbeat_interval_seconds: 1,
        offline_after_missed: 15,
        ..Default::default()
    })
    .await
    else {
        return;
    };
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);

    let (_, lease) = status_is(
        hw.lease(caps::CAMERA, 70, "clip across an outage", None, 10)
            .await
            .unwrap(),
        StatusCode::CREATED,
    );
    let lease_id = lease["lease_id"].as_str().unwrap().to_string();
    let session_id = hw
        .start_action(
            &lease_id,
            &json!({
                "action": "record_clip",
                "params": {"duration_ms": 20_000},
                "timeout_ms": 60_000,
                "wait_ms": 0
            }),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The broker goes away; the lease is preempted meanwhile (3 s grace).
    broker.stop();
    admin.wait_mqtt_down(Duration::from_secs(10)).await.unwrap();
    let (_, taken) = status_is(
        chief
            .lease(caps::CAMERA, 80, "safety check", Some("safety_stop"), 15)
            .await
            .unwrap(),
        StatusCode::CREATED,
    );
    assert_eq!(taken["status"], "granted", "{taken}");
    let revoked = lease_id.as_str();
    assert_eq!(line_with(&edge_log(&lab.root), &["lease revoked"]), None);

    // The bench reconnects first (the registry is held stopped meanwhile),
    // so it is subscribed when the registry sends what it held.
    let connects = |root: &Path| {
        edge_log(root)
            .iter()
            .filter(|l| l.contains("mqtt: connected to broker"))
            .count()
    };
    let before = connects(&lab.root);
    {
        let _paused = Paused::pause(lab.registry.as_ref().expect("registry").pid());
        broker.resume().expect("broker back");
        eventually(Duration::from_secs(30), "the edge reconnects", || async {
            (connects(&lab.root) > before).then_some(())
        })
        .await;
    }

    let log = eventually(
        Duration::from_secs(30),
        "the edge hears of the revocation",
        || async {
            let log = edge_log(&lab.root);
            line_with(&log, &["lease revoked", revoked]).map(|_| log)
        },
    )
    .await;
    let revoked_at = line_with(&log, &["lease revoked", revoked]).unwrap();
    let notice_at = eventually(
        Duration::from_secs(10),
        "the preemption notice after it",
        || async { line_with(&edge_log(&lab.root), &["preemption requested", revoked]) },
    )
    .await;
    assert!(
        revoked_at < notice_at,
        "lease_revoked (line {revoked_at}) must reach the bench before the preempt_requested queued before it (line {notice_at})"
    );

    // The clip was stopped for the revocation, and the new holder's
    // action runs.
    let ended = eventually(Duration::from_secs(30), "the clip ends", || async {
        let s = hw
            .get_ok(&format!("/api/v1/sessions/{session_id}"))
            .await
            .ok()?;
        (s["status"] != "running").then_some(s)
    })
    .await;
    assert_eq!(ended["status"], "failed", "{ended}");
    assert!(
        ended["error_message"]
            .as_str()
            .unwrap_or_default()
            .starts_with("lease revoked by preemption"),
        "{ended}"
    );
    let snap = chief
        .act_ok(taken["lease_id"].as_str().unwrap(), "snapshot", json!({}))
        .await
        .unwrap();
    assert_eq!(snap["status"], "completed", "{snap}");
    let provider = admin
        .get_ok(&format!("/api/v1/capability-providers/{PROVIDER_ID}"))
        .await
        .unwrap();
    assert_eq!(provider["online_status"], "online", "{provider}");
}
