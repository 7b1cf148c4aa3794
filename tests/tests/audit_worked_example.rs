//! docs/audit-protocol.md's worked example on the shipped simulated bench
//! (`config/edge-agent.sim.toml`): the test takes the request JSON and the
//! example agent's command line from the doc itself, so the doc cannot
//! drift from what works, posts the request, runs `led-audit-agent` as the
//! doc says and checks the stored result through the public API: on the
//! simulated DUT every criterion is met from derived evidence.

use std::path::{Path, PathBuf};
use std::time::Duration;

use benchlink_e2e::bench::{local_speech_toml, Lab, LabOptions};
use benchlink_e2e::client::Agent;
use benchlink_e2e::workspace_bin;
use reqwest::StatusCode;
use serde_json::{json, Value};

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

/// The body of the first ```http block after `marker`: the lines after its
/// `POST …` line up to the answer (`→ …`), parsed as JSON.
fn request_after(doc: &str, marker: &str) -> Value {
    let at = doc
        .find(marker)
        .unwrap_or_else(|| panic!("doc lacks {marker:?}"));
    let rest = &doc[at..];
    let block = rest.split("```http\n").nth(1).expect("an http block");
    let block = block.split("```").next().unwrap();
    let body: String = block
        .lines()
        .skip_while(|l| !l.starts_with("POST "))
        .skip(1)
        .take_while(|l| !l.trim_start().starts_with('→'))
        .collect::<Vec<_>>()
        .join("\n");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("{marker}: {e}\n{body}"))
}

/// The arguments the doc's "Example agent" section runs the binary with.
fn agent_args(doc: &str) -> Vec<String> {
    let section = doc
        .split("## Example agent")
        .nth(1)
        .expect("an Example agent section");
    let line = section
        .lines()
        .find(|l| l.contains("target/debug/led-audit-agent"))
        .expect("the led-audit-agent command line");
    line.split_whitespace()
        .skip_while(|w| !w.ends_with("led-audit-agent"))
        .skip(1)
        .map(str::to_string)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_led_example_completes_on_the_shipped_sim_bench() {
    let doc = std::fs::read_to_string(repo_file("docs/audit-protocol.md")).unwrap();
    let thread = request_after(&doc, "**1. The source thread is registered**");
    let request = request_after(&doc, "**2. The request is created**");
    let args = agent_args(&doc);
    assert!(
        args.contains(&"--create".to_string()),
        "doc's command: {args:?}"
    );
    let agent_ref = args
        .iter()
        .skip_while(|a| *a != "--agent-ref")
        .nth(1)
        .cloned()
        .expect("--agent-ref in the doc's command");
    let principal = agent_ref.clone();

    let lab = Lab::start(LabOptions {
        edge_config_template: Some(repo_file("config/edge-agent.sim.toml")),
        // The registry transcribes the recording with its local
        // recogniser, so every criterion has derived evidence.
        registry_extra_toml: local_speech_toml(),
        ..LabOptions::default()
    })
    .await
    .expect("lab on the shipped sim config starts");
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let mint = |role: &'static str, name: String| {
        let admin = &admin;
        async move {
            let (s, minted) = admin
                .post(
                    "/api/v1/auth/tokens",
                    &json!({ "role": role, "name": name }),
                )
                .await
                .expect("mint a token");
            assert_eq!(s, StatusCode::CREATED, "token answer: {minted}");
            minted["token"].as_str().unwrap().to_string()
        }
    };
    let operator = Agent::new(
        &lab.base_url,
        "release-manager",
        &mint("operator", "release-manager".into()).await,
    );
    let agent_token = mint("audit_agent", principal).await;

    let (s, body) = operator.post("/api/v1/threads", &thread).await.unwrap();
    assert_eq!(s, StatusCode::CREATED, "thread: {body}");
    let (s, body) = operator
        .post("/api/v1/audit-requests", &request)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::CREATED, "request: {body}");
    assert_eq!(body["status"], "queued", "{body}");
    let id = request["audit_request_id"].as_str().unwrap().to_string();

    let child = tokio::process::Command::new(workspace_bin("led-audit-agent"))
        .args(&args)
        .env("BENCHLINK_URL", &lab.base_url)
        .env("BENCHLINK_TOKEN", &agent_token)
        .env_remove("BENCHLINK_AGENT_REF")
        .kill_on_drop(true)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("start led-audit-agent");
    let output = tokio::time::timeout(Duration::from_secs(150), child.wait_with_output())
        .await
        .expect("led-audit-agent exits within 150 s")
        .expect("wait for led-audit-agent");
    let (out, err) = (
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr),
    );
    assert_eq!(
        output.status.code(),
        Some(0),
        "led-audit-agent {args:?} failed\n--- stdout\n{out}\n--- stderr\n{err}"
    );

    let record = admin
        .get_ok(&format!("/api/v1/audit-requests/{id}"))
        .await
        .unwrap();
    assert_eq!(record["status"], "completed", "record: {record}");
    assert_eq!(record["created_by"], "release-manager", "record: {record}");
    let result = admin
        .get_ok(&format!("/api/v1/audit-requests/{id}/result"))
        .await
        .unwrap();
    // The shipped sim bench's DUT behaves as scripted: the agent's
    // verdict, judged from the registry's derived evidence, is a pass.
    assert_eq!(result["decision"], "pass", "result: {result:#}");
    assert_eq!(result["status"], "completed", "result: {result:#}");
    let mut used: Vec<&str> = result["used_capabilities"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    used.sort_unstable();
    assert_eq!(
        used,
        ["cam-front-01", "mic-01", "spk-01", "thumb-robot-01"],
        "result: {result}"
    );
}
