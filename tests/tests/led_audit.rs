//! The LED audit of docs/audit-protocol.md end to end on the shipped
//! simulated bench (`config/edge-agent.sim.toml` and its simulated DUT):
//! the real registry derives `detection_json`, `ocr_text` and a
//! `transcript` (pocketsphinx) from the edge's uploads, and the example
//! agent `led-audit-agent` judges from them. On the good DUT it passes,
//! each criterion citing its derived artifact; a DUT whose LED stays red
//! fails on the LED criterion only; one with another welcome line fails
//! on the welcome-line criterion only.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use benchlink_e2e::bench::{local_speech_toml, Lab, LabOptions};
use benchlink_e2e::client::Agent;
use benchlink_e2e::workspace_bin;
use reqwest::StatusCode;
use serde_json::{json, Value};

const AGENT: &str = "audit:multimodal-auditor-01";

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// The programs this test runs for real; under CI=true a missing one fails
/// the test, elsewhere it is skipped with a message.
fn have_programs() -> bool {
    for p in ["espeak-ng", "tesseract", "pocketsphinx_continuous"] {
        let found = Command::new("sh")
            .args(["-c", &format!("command -v {p}")])
            .output()
            .is_ok_and(|o| o.status.success());
        if !found {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{p} is not installed; the LED audit needs it"
            );
            eprintln!("skipping: {p} is not installed");
            return false;
        }
    }
    true
}

/// Run the LED audit on the shipped sim bench with `edit` applied to its
/// TOML; the stored result and the admin client.
async fn audit(edit: &dyn Fn(String) -> String) -> (Value, Agent, Lab) {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(repo_file("config/edge-agent.sim.toml")).unwrap();
    let edited = edit(text.clone());
    let template = dir.path().join("edge-agent.sim.toml");
    std::fs::write(&template, &edited).unwrap();
    let lab = Lab::start(LabOptions {
        edge_config_template: Some(template),
        registry_extra_toml: local_speech_toml(),
        ..LabOptions::default()
    })
    .await
    .expect("lab on the sim bench starts");
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let (s, minted) = admin
        .post(
            "/api/v1/auth/tokens",
            &json!({ "role": "audit_agent", "name": AGENT }),
        )
        .await
        .unwrap();
    assert_eq!(s, StatusCode::CREATED, "{minted}");
    let token = minted["token"].as_str().unwrap().to_string();
    let child = tokio::process::Command::new(workspace_bin("led-audit-agent"))
        .args(["--agent-ref", AGENT, "--create", "--wait-ms", "30000"])
        .env("BENCHLINK_URL", &lab.base_url)
        .env("BENCHLINK_TOKEN", &token)
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start led-audit-agent");
    let output = tokio::time::timeout(Duration::from_secs(150), child.wait_with_output())
        .await
        .expect("led-audit-agent exits within 150 s")
        .expect("wait for led-audit-agent");
    let err = String::from_utf8_lossy(&output.stderr);
    assert_eq!(
        output.status.code(),
        Some(0),
        "led-audit-agent failed:\n{err}"
    );
    let result = admin
        .get_ok("/api/v1/audit-requests/auditreq_001/result")
        .await
        .unwrap();
    (result, admin, lab)
}

fn finding(result: &Value, n: usize) -> &Value {
    result["findings"]
        .as_array()
        .and_then(|f| {
            f.iter()
                .find(|x| x["finding_id"] == format!("f-criterion-{n}"))
        })
        .unwrap_or_else(|| panic!("no finding f-criterion-{n}: {result}"))
}

/// The finding's title says `verdict` (`met`, `not met`).
fn says(result: &Value, n: usize, verdict: &str) -> bool {
    finding(result, n)["title"]
        .as_str()
        .is_some_and(|t| t.starts_with(&format!("{verdict}:")))
}

/// The finding cites a derived artifact of `kind` and then its source.
async fn cites_derived(admin: &Agent, result: &Value, n: usize, kind: &str) {
    let f = finding(result, n);
    let ids: Vec<&str> = f["evidence_ref_ids"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert_eq!(ids.len(), 2, "finding {n}: {f}");
    let derived = admin
        .get_ok(&format!("/api/v1/artifacts/{}", ids[0]))
        .await
        .unwrap();
    assert_eq!(derived["artifact_type"], kind, "finding {n}: {derived}");
    assert_eq!(
        derived["metadata_json"]["derived_from"], ids[1],
        "finding {n}: {derived}"
    );
    let listed = admin
        .get_ok(&format!("/api/v1/artifacts?derived_from={}", ids[1]))
        .await
        .unwrap();
    assert!(
        listed["artifacts"]
            .as_array()
            .is_some_and(|a| a.iter().any(|x| x["artifact_id"] == ids[0])),
        "finding {n}: {listed}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_good_device_passes_with_each_criterion_citing_derived_evidence() {
    if !have_programs() {
        return;
    }
    let (result, admin, _lab) = audit(&|t| t).await;
    assert_eq!(result["decision"], "pass", "{result:#}");
    assert_eq!(result["status"], "completed", "{result:#}");
    for n in 1..=4 {
        assert!(says(&result, n, "met"), "criterion {n}: {result:#}");
    }
    cites_derived(&admin, &result, 1, "detection_json").await;
    cites_derived(&admin, &result, 2, "ocr_text").await;
    cites_derived(&admin, &result, 3, "transcript").await;
    cites_derived(&admin, &result, 4, "detection_json").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_led_that_stays_red_fails_the_led_criterion_only() {
    if !have_programs() {
        return;
    }
    let (result, admin, _lab) =
        audit(&|t| t.replace("led_awake = \"blue\"", "led_awake = \"red\"")).await;
    assert_eq!(result["decision"], "fail", "{result:#}");
    assert!(says(&result, 1, "not met"), "{result:#}");
    for n in 2..=4 {
        assert!(says(&result, n, "met"), "criterion {n}: {result:#}");
    }
    cites_derived(&admin, &result, 1, "detection_json").await;
    assert!(
        finding(&result, 1)["description"]
            .as_str()
            .is_some_and(|d| d.contains("red")),
        "{result:#}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_welcome_line_fails_the_welcome_criterion_only() {
    if !have_programs() {
        return;
    }
    let (result, admin, _lab) = audit(&|t| {
        t.replace(
            "welcome_line = \"welcome how can i help you today\"",
            "welcome_line = \"goodbye see you later\"",
        )
    })
    .await;
    assert_eq!(result["decision"], "fail", "{result:#}");
    assert!(says(&result, 3, "not met"), "{result:#}");
    for n in [1, 2, 4] {
        assert!(says(&result, n, "met"), "criterion {n}: {result:#}");
    }
    cites_derived(&admin, &result, 3, "transcript").await;
}
