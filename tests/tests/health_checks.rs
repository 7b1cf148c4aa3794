//! Health checks across real processes (docs/policy.md "Health checks"):
//! the registry runs a check action under a system lease on the simulated
//! bench; a failing check takes the capability out (GET shows it
//! unhealthy with the check's reason, a request by id that will not wait
//! gets 503 `capability_unhealthy`, a selector request is not granted it)
//! and a passing one brings it back. The fault: the DUT console's check
//! looks for the boot banner, which the simulated board prints only once
//! the Korad PSU powers it.

use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, DUT_BANNER, HW_AGENT};
use benchlink_e2e::client::{follow_events, Agent};
use benchlink_e2e::eventually;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// The system principal of the checks' leases.
const CHECKER: &str = "system:health-check";

fn by_id(capability_id: &str, queue_timeout_seconds: Option<u32>) -> Value {
    let mut body = json!({
        "capability_id": capability_id,
        "holder_type": "audit_agent",
        "holder_ref": HW_AGENT,
        "project_id": "proj_health",
        "purpose": "health gating",
        "priority": 50,
        "requested_duration_seconds": 60,
        "evidence_required": false,
    });
    if let Some(q) = queue_timeout_seconds {
        body["queue_timeout_seconds"] = json!(q);
    }
    body
}

/// The leases on `capability_id`, newest first.
async fn leases_on(admin: &Agent, capability_id: &str) -> Vec<Value> {
    let v = admin
        .get_ok(&format!(
            "/api/v1/capability-leases?capability_id={capability_id}"
        ))
        .await
        .expect("lease list");
    v["leases"].as_array().cloned().unwrap_or_default()
}

fn is_check(lease: &Value) -> bool {
    lease["holder_type"] == "system" && lease["principal"] == CHECKER
}

#[tokio::test]
async fn a_failing_health_check_takes_a_capability_out_and_a_passing_one_brings_it_back() {
    let banner = DUT_BANNER.replace('.', "\\.");
    let lab = Lab::start(LabOptions {
        registry_extra_toml: format!(
            "[policy.health_checks.serial_port]\n\
             action = \"expect_pattern\"\n\
             params = {{ pattern = '{banner}', since = \"all\", timeout_ms = 800 }}\n\
             interval_seconds = 1\n\
             timeout_seconds = 5\n"
        ),
        ..Default::default()
    })
    .await
    .expect("lab");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let admin = Agent::new(&lab.base_url, "root", &lab.admin_token);
    let (events, _follower) = follow_events(&admin, |_| {});

    // The board is unpowered: no banner, the check fails.
    let cap = eventually(Duration::from_secs(30), "console held out", || async {
        let c = hw.capability(caps::CONSOLE).await;
        (c["health_status"] == "unhealthy").then_some(c)
    })
    .await;
    let reason = cap["health_check_reason"].as_str().unwrap_or_default();
    assert!(
        reason.contains("expect_pattern"),
        "the check's reason is shown: {cap}"
    );
    let ev = events
        .wait_for("health check failed", Duration::from_secs(5), |e| {
            e["event_type"] == "capability_health_changed"
                && e["capability_id"] == caps::CONSOLE
                && e["data"]["reason"] == "health_check_failed"
        })
        .await
        .unwrap();
    assert_eq!(ev["data"]["health_status"], "unhealthy", "{ev}");

    // The check ran as a system session on the console.
    let check_lease = ev["data"]["lease_id"].as_str().unwrap().to_string();
    let lease = admin
        .get_ok(&format!("/api/v1/capability-leases/{check_lease}"))
        .await
        .unwrap();
    assert!(is_check(&lease), "{lease}");
    let session_id = ev["data"]["session_id"].as_str().unwrap();
    let session = admin
        .get_ok(&format!("/api/v1/sessions/{session_id}"))
        .await
        .unwrap();
    assert_eq!(session["status"], "failed", "{session}");
    assert_eq!(session["action"], "expect_pattern");
    assert_eq!(session["lease_id"], check_lease.as_str());

    // A request by id that will not wait is refused, and queues nothing.
    let (s, body) = hw
        .post(
            "/api/v1/capability-leases/request",
            &by_id(caps::CONSOLE, Some(0)),
        )
        .await
        .unwrap();
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "capability_unhealthy", "{body}");
    assert_eq!(
        body["error"]["details"]["capability_ids"],
        json!([caps::CONSOLE])
    );

    // A selector request is not granted it (the only serial port): it waits.
    let (s, sel) = hw
        .post(
            "/api/v1/capability-leases/request?wait_seconds=2",
            &json!({
                "capability_selector": {"capability_type": "serial_port"},
                "holder_type": "audit_agent",
                "holder_ref": HW_AGENT,
                "project_id": "proj_health",
                "purpose": "health gating",
                "priority": 50,
                "requested_duration_seconds": 60,
                "evidence_required": false,
            }),
        )
        .await
        .unwrap();
    assert_eq!(s, StatusCode::ACCEPTED, "{sel}");
    assert_eq!(sel["status"], "requested", "{sel}");
    // The checks keep running meanwhile (still failing).
    let failed_checks = eventually(Duration::from_secs(10), "a later check", || async {
        let n = leases_on(&admin, caps::CONSOLE)
            .await
            .iter()
            .filter(|l| is_check(l))
            .count();
        (n >= 2).then_some(n)
    })
    .await;
    assert!(failed_checks >= 2);
    let sel_id = sel["lease_id"].as_str().unwrap();
    let still = admin
        .get_ok(&format!("/api/v1/capability-leases/{sel_id}"))
        .await
        .unwrap();
    assert_eq!(still["status"], "requested", "{still}");
    let (s, _) = hw.release(sel_id).await.unwrap();
    assert_eq!(s, StatusCode::OK);

    // Remove the fault: power the board; it boots and prints its banner.
    let psu = hw.lease_ok(caps::PSU, "power the DUT").await.unwrap();
    hw.act_ok(&psu, "set_voltage", json!({"voltage_v": 5.0}))
        .await
        .unwrap();
    hw.act_ok(&psu, "power_on", json!({})).await.unwrap();

    let back = events
        .wait_for("health check passed", Duration::from_secs(30), |e| {
            e["event_type"] == "capability_health_changed"
                && e["capability_id"] == caps::CONSOLE
                && e["data"]["reason"] == "health_check_passed"
        })
        .await
        .unwrap();
    assert_eq!(back["data"]["health_status"], "healthy", "{back}");
    let cap = hw.capability(caps::CONSOLE).await;
    assert_ne!(cap["health_status"], "unhealthy", "{cap}");
    assert!(cap.get("health_check_reason").is_none(), "{cap}");

    // Granted again (the next check may hold it for a moment: wait).
    let (s, lease) = hw
        .post(
            "/api/v1/capability-leases/request?wait_seconds=10",
            &by_id(caps::CONSOLE, None),
        )
        .await
        .unwrap();
    assert_eq!(s, StatusCode::CREATED, "{lease}");
    assert_eq!(lease["status"], "granted", "{lease}");
    hw.release(lease["lease_id"].as_str().unwrap())
        .await
        .unwrap();
    hw.release(&psu).await.unwrap();
}

#[tokio::test]
async fn failed_sessions_in_a_row_start_a_check_that_waits_for_the_holder() {
    let lab = Lab::start(LabOptions {
        registry_extra_toml: "[policy.health_checks.camera]\n\
                              action = \"snapshot\"\n\
                              after_failed_sessions = 2\n\
                              timeout_seconds = 10\n"
            .to_string(),
        ..Default::default()
    })
    .await
    .expect("lab");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let admin = Agent::new(&lab.base_url, "root", &lab.admin_token);

    let cam = hw
        .lease_ok(caps::CAMERA, "failing snapshots")
        .await
        .unwrap();
    // A completed session between failures starts the count again.
    for params in [
        json!({"format": "bogus"}),
        json!({}),
        json!({"format": "bogus"}),
    ] {
        let (s, v) = hw
            .act(&cam, "snapshot", params.clone(), 10_000)
            .await
            .unwrap();
        assert_eq!(s, StatusCode::OK, "{v}");
        let want = if params.get("format").is_some() {
            "failed"
        } else {
            "completed"
        };
        assert_eq!(v["status"], want, "{v}");
    }
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert!(
        !leases_on(&admin, caps::CAMERA).await.iter().any(is_check),
        "one failure after a completed session starts no check"
    );

    // The second failure in a row does.
    let (_, v) = hw
        .act(&cam, "snapshot", json!({"format": "bogus"}), 10_000)
        .await
        .unwrap();
    assert_eq!(v["status"], "failed", "{v}");
    let check = eventually(Duration::from_secs(10), "check requested", || async {
        leases_on(&admin, caps::CAMERA)
            .await
            .into_iter()
            .find(is_check)
    })
    .await;
    assert_eq!(check["status"], "requested", "it waits: {check}");
    assert_eq!(check["purpose"], "health check");
    assert_eq!(check["priority"], 100);

    // It does not preempt: the holder keeps its lease while it waits.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let mine = admin
        .get_ok(&format!("/api/v1/capability-leases/{cam}"))
        .await
        .unwrap();
    assert_eq!(mine["status"], "active", "{mine}");
    let check_id = check["lease_id"].as_str().unwrap().to_string();
    let waiting = admin
        .get_ok(&format!("/api/v1/capability-leases/{check_id}"))
        .await
        .unwrap();
    assert_eq!(waiting["status"], "requested", "{waiting}");

    // Once the holder lets go, the check runs (a system session) and ends.
    hw.release(&cam).await.unwrap();
    let done = eventually(Duration::from_secs(20), "check done", || async {
        let l = admin
            .get_ok(&format!("/api/v1/capability-leases/{check_id}"))
            .await
            .ok()?;
        (l["status"] == "released").then_some(l)
    })
    .await;
    assert!(is_check(&done), "{done}");
    let sessions = admin
        .get_ok(&format!("/api/v1/capability-leases/{check_id}/sessions"))
        .await
        .unwrap();
    let sessions = sessions["sessions"].as_array().cloned().unwrap_or_default();
    assert_eq!(sessions.len(), 1, "{sessions:?}");
    assert_eq!(sessions[0]["action"], "snapshot");
    assert_eq!(sessions[0]["status"], "completed", "{sessions:?}");
    // It passed: the camera is in service.
    let cap = hw.capability(caps::CAMERA).await;
    assert_ne!(cap["health_status"], "unhealthy", "{cap}");
    let again = hw.lease_ok(caps::CAMERA, "after the check").await.unwrap();
    hw.release(&again).await.unwrap();
}
