//! Derived evidence across real processes (docs/audit-trail.md "Derived
//! evidence"): the registry, the edge daemon with the simulated camera and
//! screen, and tesseract.
//!
//! - A snapshot uploaded while deriving is off is derived after a restart
//!   with it on: a `detection_json` of the same session whose regions name
//!   the colour bars the sim camera drew there, whose bytes hash to its
//!   checksum, listed by `GET /api/v1/artifacts?derived_from=` (404 for an
//!   unknown source, 400 for an empty one).
//! - A screenshot yields `ocr_text` holding the sim screen's status line.
//! - With an OCR program that cannot start, a screenshot yields an
//!   `artifact_derivation_failed` event and no `ocr_text`.
//! - `cloud-registry audit-log verify` passes over all of it.

use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::{follow_events, sha256_hex, Agent};
use benchlink_e2e::eventually;
use serde_json::Value;

/// Regions of the 640x480 sim camera: two boxes in the top rows of the
/// colour bars (the moving box crosses the bars' middle rows), bar 3 of 7
/// green and bar 5 red; and the clock line in the bottom third.
const CAMERA_REGIONS: &str = r#"regions = { led_green = { box = [0.45, 0.02, 0.10, 0.08], kind = "colour" }, led_red = { box = [0.73, 0.02, 0.10, 0.08], kind = "colour" }, clock = { box = [0.0, 0.70, 1.0, 0.28], kind = "text" } }"#;

fn require_tesseract() -> bool {
    let found = std::process::Command::new("tesseract")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if !found {
        if std::env::var("CI").as_deref() == Ok("true") {
            panic!("tesseract is not installed (apt-get install tesseract-ocr)");
        }
        eprintln!("skipping: tesseract is not installed");
    }
    found
}

async fn derived(agent: &Agent, source: &str, kind: &str) -> Option<Value> {
    let list = agent
        .get_ok(&format!("/api/v1/artifacts?derived_from={source}"))
        .await
        .ok()?;
    list["artifacts"]
        .as_array()?
        .iter()
        .find(|a| a["artifact_type"] == kind)
        .cloned()
}

async fn one_shot(agent: &Agent, capability: &str, action: &str) -> (String, String) {
    let lease = agent
        .lease_ok(capability, "derived evidence")
        .await
        .expect("lease");
    let s = agent
        .act_ok(&lease, action, serde_json::json!({}))
        .await
        .expect(action);
    let artifact = s["artifact_refs"][0]
        .as_str()
        .expect("an artifact")
        .to_string();
    agent
        .wait_artifacts_uploaded(std::slice::from_ref(&lease), Duration::from_secs(30))
        .await
        .expect("bytes uploaded");
    agent.release(&lease).await.expect("release");
    (s["session_id"].as_str().unwrap().to_string(), artifact)
}

fn set_derive(lab: &Lab, table: &str) {
    let path = lab.registry_config();
    let text = std::fs::read_to_string(path).unwrap();
    let at = text
        .find("[derived_evidence]")
        .expect("the lab's [derived_evidence]");
    std::fs::write(path, format!("{}{table}", &text[..at])).unwrap();
}

async fn restart_registry(lab: &mut Lab) {
    lab.stop_registry();
    lab.start_registry().expect("registry restarts");
    lab.wait_registered(Duration::from_secs(30))
        .await
        .expect("edge back");
}

#[tokio::test]
async fn the_registry_derives_colours_and_text_and_reports_failures() {
    if !require_tesseract() {
        return;
    }
    let mut lab = Lab::start(LabOptions {
        capability_keys: vec![(caps::CAMERA.into(), CAMERA_REGIONS.into())],
        registry_extra_toml: "\n[derived_evidence]\nenabled = false\n".into(),
        ..Default::default()
    })
    .await
    .expect("lab");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let cap = hw.capability(caps::CAMERA).await;
    assert_eq!(
        cap["metadata_json"]["regions"]["led_red"]["kind"], "colour",
        "the edge sends the camera's regions: {cap}"
    );

    // Uploaded while deriving is off: nothing is derived...
    let (snap_session, snapshot) = one_shot(&hw, caps::CAMERA, "snapshot").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(derived(&hw, &snapshot, "detection_json").await.is_none());

    // ...until a registry with it on starts and finds it.
    set_derive(&lab, "[derived_evidence]\nenabled = true\n");
    restart_registry(&mut lab).await;
    let (events, _follower) = follow_events(&hw, |_| {});
    let det = eventually(
        Duration::from_secs(30),
        "detection_json derived",
        || async { derived(&hw, &snapshot, "detection_json").await },
    )
    .await;
    assert_eq!(det["session_id"], snap_session, "{det}");
    assert_eq!(det["uploaded"], true);
    assert_eq!(det["content_type"], "application/json");
    assert_eq!(det["metadata_json"]["derived_from"], snapshot);
    assert_eq!(det["metadata_json"]["deriver"], "region_colour");
    let source = hw
        .get_ok(&format!("/api/v1/artifacts/{snapshot}"))
        .await
        .unwrap();
    assert_eq!(det["metadata_json"]["source_sha256"], source["checksum"]);
    assert_eq!(det["captured_at"], source["captured_at"]);
    let body = hw
        .download(det["artifact_id"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(sha256_hex(&body.bytes), det["checksum"].as_str().unwrap());
    let doc: Value = serde_json::from_slice(&body.bytes).expect("detection JSON");
    assert_eq!(doc["source_artifact_id"], snapshot);
    assert_eq!(
        (doc["width"].as_u64(), doc["height"].as_u64()),
        (Some(640), Some(480))
    );
    let colour_of = |name: &str| {
        doc["regions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("region {name} in {doc}"))
            .clone()
    };
    let green = colour_of("led_green");
    assert_eq!(green["colour"], "green", "{green}");
    assert_eq!(green["box_px"], serde_json::json!([288, 10, 64, 38]));
    let red = colour_of("led_red");
    assert_eq!(red["colour"], "red", "{red}");
    assert!(red["saturation"].as_f64().unwrap() > 0.8, "{red}");
    assert!(doc["regions"]
        .as_array()
        .unwrap()
        .iter()
        .all(|r| r["name"] != "clock"));
    assert_eq!(det["metadata_json"]["regions"], doc["regions"]);
    // A source that does not exist is a 404, an empty one a 400: neither
    // reads as "nothing was derived".
    let (status, body) = hw
        .get("/api/v1/artifacts?derived_from=art_no_such")
        .await
        .unwrap();
    assert_eq!(status.as_u16(), 404, "{body}");
    assert_eq!(body["error"]["code"], "not_found", "{body}");
    let (status, body) = hw.get("/api/v1/artifacts?derived_from=").await.unwrap();
    assert_eq!(status.as_u16(), 400, "{body}");
    assert_eq!(body["error"]["code"], "invalid_query", "{body}");
    // The camera's text region was read too.
    let cam_text = eventually(Duration::from_secs(30), "camera ocr_text", || async {
        derived(&hw, &snapshot, "ocr_text").await
    })
    .await;
    assert!(
        cam_text["metadata_json"]["regions_text"]["clock"].is_string(),
        "{cam_text}"
    );
    assert!(
        cam_text["metadata_json"]["text"]
            .as_str()
            .unwrap()
            .starts_with("clock:"),
        "{cam_text}"
    );
    // The session lists it, and it was announced on the chained stream.
    let in_session = hw
        .get_ok(&format!("/api/v1/artifacts?session_id={snap_session}"))
        .await
        .unwrap();
    assert!(in_session["artifacts"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["artifact_id"] == det["artifact_id"]));
    events
        .wait_for(
            "artifact_uploaded of the derived artifact",
            Duration::from_secs(10),
            |e| {
                e["event_type"] == "artifact_uploaded"
                    && e["artifact_id"] == det["artifact_id"]
                    && e["data"]["checksum"] == det["checksum"]
                    && e["data"]["metadata_json"]["derived_from"] == snapshot.as_str()
            },
        )
        .await
        .unwrap();

    // A screenshot of the sim screen: the whole picture is read.
    let (_, shot) = one_shot(&hw, caps::SCREEN, "screenshot").await;
    let text = eventually(Duration::from_secs(30), "screenshot ocr_text", || async {
        derived(&hw, &shot, "ocr_text").await
    })
    .await;
    let read = text["metadata_json"]["text"].as_str().unwrap().to_string();
    println!("tesseract read from the sim screen: {read:?}");
    assert!(
        read.contains("STATUS: READY") || read.contains("STATUS:READY"),
        "the status line in {read:?}"
    );
    let body = hw
        .download(text["artifact_id"].as_str().unwrap())
        .await
        .unwrap();
    assert_eq!(sha256_hex(&body.bytes), text["checksum"].as_str().unwrap());
    assert!(
        body.content_type.starts_with("text/plain"),
        "{}",
        body.content_type
    );
    assert!(
        derived(&hw, &shot, "detection_json").await.is_none(),
        "no colour regions on the screen"
    );

    // An OCR program that cannot start: a failure event, no artifact.
    set_derive(
        &lab,
        "[derived_evidence]\nocr_command = [\"/nonexistent/ocr-program\", \"{input}\"]\n",
    );
    restart_registry(&mut lab).await;
    let (events, _follower2) = follow_events(&hw, |_| {});
    let (_, bad_shot) = one_shot(&hw, caps::SCREEN, "screenshot").await;
    let failed = events
        .wait_for("artifact_derivation_failed", Duration::from_secs(30), |e| {
            e["event_type"] == "artifact_derivation_failed" && e["artifact_id"] == bad_shot.as_str()
        })
        .await
        .unwrap();
    assert_eq!(failed["data"]["source_artifact_id"], bad_shot);
    assert_eq!(failed["data"]["artifact_type"], "ocr_text");
    let reason = failed["data"]["reason"].as_str().unwrap();
    assert!(reason.contains("/nonexistent/ocr-program"), "{reason}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(derived(&hw, &bad_shot, "ocr_text").await.is_none());

    // The chain still verifies, derived evidence and all.
    lab.verify_audit_log()
        .await
        .expect("the event log's chain verifies");
}
