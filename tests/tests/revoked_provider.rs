//! A provider token revoked while its bench is connected, across real
//! processes (`bench-sim`, `cloud-registry` with its embedded broker,
//! `edge-agent`): the next action on the bench is refused at once with 403
//! `provider_credentials_revoked` (nothing is sent), the broker closes the
//! bench's connection, and the edge logs that the registry refused its
//! credentials.

use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT, PROVIDER_ID};
use benchlink_e2e::client::Agent;
use benchlink_e2e::poll_until;
use benchlink_testkit::status_is;
use reqwest::StatusCode;
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bench_whose_token_is_revoked_gets_no_more_actions_and_is_told_why() {
    let lab = Lab::start(LabOptions::default()).await.expect("lab starts");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let lease_id = hw.lease_ok(caps::RELAY, "revoked bench").await.unwrap();
    hw.act_ok(&lease_id, "switch_on", json!({"channel": 1}))
        .await
        .expect("an action before the revocation works");
    let switches_before = lab.relay_switches().len();

    let resp = reqwest::Client::new()
        .delete(format!("{}/api/v1/tokens/{PROVIDER_ID}", lab.base_url))
        .bearer_auth(&lab.admin_token)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);

    // At once: refused with a clear code, nothing reaches the bench.
    let (_, v) = status_is(
        hw.act(&lease_id, "switch_off", json!({"channel": 1}), 5_000)
            .await
            .unwrap(),
        StatusCode::FORBIDDEN,
    );
    assert_eq!(v["error"]["code"], "provider_credentials_revoked", "{v}");
    assert_eq!(v["error"]["details"]["provider_id"], PROVIDER_ID, "{v}");
    let sessions = hw
        .get_ok(&format!("/api/v1/sessions?lease_id={lease_id}"))
        .await
        .unwrap();
    assert_eq!(
        sessions["sessions"].as_array().map(Vec::len),
        Some(1),
        "only the first action made a session: {sessions}"
    );

    // The bench is cut off and says why.
    let edge_log = lab.root.join("logs/edge.log");
    poll_until(
        Duration::from_secs(20),
        "edge logs refused credentials",
        || {
            let edge_log = edge_log.clone();
            async move {
                std::fs::read_to_string(&edge_log)
                    .ok()?
                    .contains(
                        "the registry refused this bench's credentials (token revoked or unknown)",
                    )
                    .then_some(())
            }
        },
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        lab.relay_switches().len(),
        switches_before,
        "the relay switched after the revocation"
    );
}
