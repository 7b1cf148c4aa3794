//! `shared_stream` leases across real processes (docs/policy.md "Shared
//! stream"): two holders of a shared_stream camera both take snapshots;
//! `set_ptz`, which would turn the camera for both, is refused to a shared
//! holder with 409 `action_not_allowed_in_shared_lease` and no session;
//! the holder of an exclusive camera turns it.

use benchlink_e2e::bench::{Lab, LabOptions, CHIEF_AGENT, HW_AGENT};
use benchlink_e2e::client::Agent;
use reqwest::StatusCode;
use serde_json::json;

const SHARED_CAM: &str = "cam-shared-01";
const PTZ_CAM: &str = "cam-ptz-01";

fn camera(id: &str, lease_mode: &str) -> String {
    format!(
        "[[capabilities]]\nid = \"{id}\"\ntype = \"camera\"\nlease_mode = \"{lease_mode}\"\n\
         [capabilities.driver]\nbackend = \"sim\"\nresolution = \"320x240\"\nfps = 10\nptz = true\n"
    )
}

#[tokio::test]
async fn shared_stream_holders_capture_together_and_only_an_exclusive_one_turns_the_camera() {
    let lab = Lab::start(LabOptions {
        extra_capabilities: vec![
            camera(SHARED_CAM, "shared_stream"),
            camera(PTZ_CAM, "exclusive"),
        ],
        ..Default::default()
    })
    .await
    .expect("lab");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);

    // Two holders at once.
    let a = hw.lease_ok(SHARED_CAM, "watch the DUT").await.unwrap();
    let b = chief.lease_ok(SHARED_CAM, "watch the DUT").await.unwrap();
    for (agent, lease) in [(&hw, &a), (&chief, &b)] {
        let l = agent
            .get_ok(&format!("/api/v1/capability-leases/{lease}"))
            .await
            .unwrap();
        assert_eq!(l["mode"], "shared_stream", "{l}");
        let s = agent
            .act_ok(lease, "snapshot", json!({}))
            .await
            .expect("a shared holder captures");
        assert_eq!(s["artifact_refs"].as_array().map(Vec::len), Some(1), "{s}");
    }

    // Turning the camera would move it for the other holder too.
    let (s, body) = hw
        .act(&a, "set_ptz", json!({"pan": 3600}), 10_000)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::CONFLICT, "{body}");
    assert_eq!(body["error"]["code"], "action_not_allowed_in_shared_lease");
    let d = &body["error"]["details"];
    assert_eq!(d["action"], "set_ptz");
    assert_eq!(d["lease_mode"], "shared_stream");
    let allowed = d["allowed_actions"].as_array().unwrap();
    assert!(allowed.contains(&json!("snapshot")), "{body}");
    assert!(!allowed.contains(&json!("set_ptz")), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    assert!(message.contains("needs an exclusive lease"), "{message}");
    let sessions = hw
        .get_ok(&format!("/api/v1/capability-leases/{a}/sessions"))
        .await
        .unwrap();
    assert_eq!(
        sessions["sessions"].as_array().map(Vec::len),
        Some(1),
        "only the snapshot: {sessions}"
    );

    // The other holder still captures.
    chief
        .act_ok(&b, "snapshot", json!({}))
        .await
        .expect("unaffected");

    // An exclusive holder turns its camera.
    let x = hw.lease_ok(PTZ_CAM, "aim the camera").await.unwrap();
    let s = hw
        .act_ok(&x, "set_ptz", json!({"pan": 3600}))
        .await
        .expect("set_ptz under an exclusive lease");
    assert_eq!(s["result_summary"]["pan"], 3600, "{s}");
}
