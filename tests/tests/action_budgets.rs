//! Action budgets across real processes (docs/policy.md "Action
//! budgets"): a relay lease over its `[policy.budgets.relay]` budget gets
//! 429 `action_budget_exceeded` with `Retry-After`, and the simulated LCUS
//! board (bench-sim's journal on a real pty) saw no frame for it.

use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_e2e::eventually;
use reqwest::StatusCode;
use serde_json::{json, Value};

#[tokio::test]
async fn a_relay_over_its_budget_gets_429_and_the_board_sees_no_extra_frame() {
    let lab = Lab::start(LabOptions {
        registry_extra_toml: "[policy.budgets.relay]\nper_lease = 2\n".to_string(),
        ..Default::default()
    })
    .await
    .expect("lab");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (s, l) = hw
        .post(
            "/api/v1/capability-leases/request?wait_seconds=10",
            &json!({
                "capability_id": caps::RELAY,
                "holder_type": "audit_agent",
                "holder_ref": HW_AGENT,
                "project_id": "proj_budgets",
                "purpose": "relay budget",
                "priority": 50,
                "requested_duration_seconds": 60,
                "evidence_required": false,
            }),
        )
        .await
        .expect("lease request");
    assert!(s.is_success() && l["status"] == "granted", "{s}: {l}");
    let lease = l["lease_id"].as_str().unwrap().to_string();

    for action in ["switch_on", "switch_off"] {
        hw.act_ok(&lease, action, json!({"channel": 1}))
            .await
            .expect("within budget");
    }
    let frames = eventually(Duration::from_secs(3), "both frames journaled", || async {
        let n = lab.relay_switches().len();
        (n >= 2).then_some(n)
    })
    .await;

    // The third switch, with the raw client to see the header.
    let resp = reqwest::Client::new()
        .post(format!(
            "{}/api/v1/capability-leases/{lease}/actions",
            lab.base_url
        ))
        .bearer_auth(&lab.hw_token)
        .json(&json!({"action": "switch_on", "params": {"channel": 1}}))
        .send()
        .await
        .expect("invoke");
    assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
    let retry: u64 = resp.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!((1..=60).contains(&retry), "Retry-After {retry}");
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["code"], "action_budget_exceeded", "{body}");
    assert_eq!(body["error"]["details"]["budget"], "relay.per_lease");
    assert_eq!(body["error"]["details"]["retry_after_seconds"], retry);

    // No session was stored for it, and the board got nothing more.
    let sessions = hw
        .get_ok(&format!("/api/v1/capability-leases/{lease}/sessions"))
        .await
        .unwrap();
    assert_eq!(
        sessions["sessions"].as_array().map(Vec::len),
        Some(2),
        "{sessions}"
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    assert_eq!(lab.relay_switches().len(), frames, "no extra frame");

    let (s, _) = hw.release(&lease).await.unwrap();
    assert_eq!(s, StatusCode::OK);
}
