//! The example `led-audit-agent` binary against a real lab: it claims the
//! seed's LED-validation request (seed 001 §8.1), drives the camera,
//! speaker, microphone and thumb robot through the public action endpoint
//! and posts an `AuditTaskResult`; the test checks what it left behind
//! through the public HTTP API only.

use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, Lab, LabOptions};
use benchlink_e2e::client::{sha256_hex, Agent};
use benchlink_e2e::workspace_bin;
use reqwest::StatusCode;
use serde_json::{json, Value};

const LED_AGENT: &str = "audit:multimodal-auditor-01";
const REQUEST_ID: &str = "auditreq_001";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_led_audit_agent_audits_the_demo_bench_and_leaves_downloadable_evidence() {
    let lab = Lab::start(LabOptions::default()).await.expect("lab starts");
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);

    let (s, minted) = admin
        .post(
            "/api/v1/auth/tokens",
            &json!({ "role": "audit_agent", "name": LED_AGENT }),
        )
        .await
        .expect("mint a token");
    assert_eq!(s, StatusCode::CREATED, "token answer: {minted}");
    let token = minted["token"].as_str().expect("token in the answer");

    let started = Instant::now();
    let child = tokio::process::Command::new(workspace_bin("led-audit-agent"))
        .args([
            "--base-url",
            &lab.base_url,
            "--token",
            token,
            "--agent-ref",
            LED_AGENT,
            "--create",
            "--audit-request-id",
            REQUEST_ID,
            "--wait-ms",
            "10000",
            "--record-ms",
            "1500",
            "--led-deadline-ms",
            "1000",
            // This bench declares no camera regions and the registry has no
            // recogniser: nothing will be derived, so the criteria stay
            // "not verified" after a short wait.
            "--derive-wait-ms",
            "3000",
        ])
        .env_remove("BENCHLINK_URL")
        .env_remove("BENCHLINK_TOKEN")
        .env_remove("BENCHLINK_AGENT_REF")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start led-audit-agent");
    let output = tokio::time::timeout(Duration::from_secs(45), child.wait_with_output())
        .await
        .expect("led-audit-agent exits within 45 s")
        .expect("wait for led-audit-agent");
    let (status, out, err) = (
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(
        status.code(),
        Some(0),
        "led-audit-agent failed\n--- stdout\n{out}\n--- stderr\n{err}"
    );
    println!("led-audit-agent ran {:?}\n{err}\n{out}", started.elapsed());

    let record = admin
        .get_ok(&format!("/api/v1/audit-requests/{REQUEST_ID}"))
        .await
        .expect("read the audit request");
    assert_eq!(record["status"], "completed", "request: {record}");

    let result = admin
        .get_ok(&format!("/api/v1/audit-requests/{REQUEST_ID}/result"))
        .await
        .expect("read the audit result");
    let findings = result["findings"].as_array().cloned().unwrap_or_default();
    assert!(!findings.is_empty(), "no findings: {result}");
    // Every step of the wake script ran through the action endpoint.
    let failed_actions: Vec<&Value> = findings
        .iter()
        .filter(|f| {
            f["finding_id"]
                .as_str()
                .is_some_and(|id| id.starts_with("f-action-"))
        })
        .collect();
    assert!(
        failed_actions.is_empty(),
        "actions failed: {failed_actions:?}"
    );
    let timeline = result["timeline"].as_array().cloned().unwrap_or_default();
    assert_eq!(timeline.len(), 6, "timeline: {result}");
    assert!(
        timeline.iter().all(|t| t["status"] == "completed"),
        "a step did not complete: {timeline:?}"
    );
    let artifact_refs: Vec<String> = result["artifact_refs"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter_map(|a| a.as_str().map(str::to_string))
        .collect();
    assert!(!artifact_refs.is_empty(), "no artifact refs: {result}");

    let mut used: Vec<&str> = result["used_capabilities"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    used.sort_unstable();
    let mut leased = vec![caps::CAMERA, caps::SPEAKER, caps::MICROPHONE, caps::ROBOT];
    leased.sort_unstable();
    assert_eq!(used, leased, "used_capabilities: {result}");

    for id in &artifact_refs {
        let meta = admin
            .get_ok(&format!("/api/v1/artifacts/{id}"))
            .await
            .expect("artifact metadata");
        let got = admin.download(id).await.expect("artifact downloads");
        assert!(!got.bytes.is_empty(), "artifact {id} is empty");
        let digest = sha256_hex(&got.bytes);
        assert_eq!(digest, got.checksum_header, "X-Checksum-Sha256 of {id}");
        let recorded = meta["checksum"]
            .as_str()
            .unwrap_or_default()
            .trim_start_matches("sha256:");
        assert_eq!(digest, recorded, "checksum of {id}: {meta}");
    }

    // The claim's four leases are released once the result is stored.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let leases = admin
            .get_ok("/api/v1/capability-leases?limit=1000")
            .await
            .expect("list leases");
        let ours: Vec<Value> = leases["leases"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|l| {
                l["holder_ref"]
                    .as_str()
                    .unwrap_or_default()
                    .starts_with(LED_AGENT)
            })
            .collect();
        let mut on: Vec<&str> = ours
            .iter()
            .filter_map(|l| l["capability_id"].as_str())
            .collect();
        on.sort_unstable();
        let released = ours.iter().all(|l| l["status"] == "released");
        if on == leased && released {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the claim's leases are not all released: {ours:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
