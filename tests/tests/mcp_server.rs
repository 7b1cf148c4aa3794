//! `benchlink mcp` driven by a real MCP client: the official Python SDK
//! (`mcp`, pinned in tests/mcp/requirements.txt, installed by
//! ./scripts/setup.sh into tests/mcp/.venv) runs tests/mcp/drive.py
//! against a real lab. Without that venv the test fails: it never skips.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_e2e::{poll_until, workspace_bin};
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};

static ONE_LAB_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn mcp_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("mcp")
}

/// The venv's python; panics with how to make it when it is missing.
fn python() -> PathBuf {
    let p = mcp_dir().join(".venv/bin/python");
    assert!(
        p.exists(),
        "{} is missing: run ./scripts/setup.sh (it creates the venv with the Python MCP SDK)",
        p.display()
    );
    p
}

fn driver(lab: &Lab, mode: &str) -> tokio::process::Command {
    let mut c = tokio::process::Command::new(python());
    c.arg(mcp_dir().join("drive.py"))
        .arg(workspace_bin("benchlink"))
        .arg(mode)
        .arg(caps::CAMERA)
        .env("BENCHLINK_URL", &lab.base_url)
        .env("BENCHLINK_TOKEN", &lab.hw_token)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .kill_on_drop(true);
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_mcp_client_leases_the_camera_sees_the_snapshot_and_releases() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let py = python();
    let lab = Lab::start(LabOptions::default()).await.expect("lab");
    let out = tokio::time::timeout(Duration::from_secs(90), driver(&lab, "full").output())
        .await
        .expect("the MCP client finished in time")
        .expect("run the MCP client");
    assert!(
        out.status.success(),
        "{} drive.py failed:\n{}",
        py.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let r: Value = serde_json::from_str(stdout.lines().last().unwrap_or(""))
        .unwrap_or_else(|e| panic!("drive.py printed no JSON ({e}): {stdout}"));
    let tools: Vec<&str> = r["tools"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for t in [
        "list_capabilities",
        "lease",
        "act",
        "read_session",
        "fetch_artifact",
        "release",
        "earth_command",
    ] {
        assert!(tools.contains(&t), "tool {t} listed: {tools:?}");
    }
    assert!(
        r["descriptions"]["act"]
            .as_str()
            .unwrap()
            .contains("REAL DEVICES"),
        "act says it drives real hardware: {}",
        r["descriptions"]["act"]
    );
    assert_eq!(r["session_status"], "completed", "{r}");
    assert_eq!(r["act_is_error"], false);
    let mime = r["image_mime"].as_str().expect("an image content block");
    assert!(mime == "image/jpeg" || mime == "image/png", "{mime}");
    let magic = r["image_magic"].as_str().unwrap();
    assert!(
        magic.starts_with("ffd8ff") || magic == "89504e47",
        "the image data is a JPEG or PNG: {magic}"
    );
    // The image the client received is the artifact's bytes.
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let art = hw
        .get_ok(&format!(
            "/api/v1/artifacts/{}",
            r["artifact_id"].as_str().unwrap()
        ))
        .await
        .unwrap();
    assert_eq!(r["image_sha256"], art["checksum"], "{r} vs {art}");
    assert_eq!(r["release_status"], "released");
    let lease = hw
        .get_ok(&format!(
            "/api/v1/capability-leases/{}",
            r["lease_id"].as_str().unwrap()
        ))
        .await
        .unwrap();
    assert_eq!(lease["status"], "released", "{lease}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_killed_mid_lease_gets_its_lease_released() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    python();
    let lab = Lab::start(LabOptions::default()).await.expect("lab");
    let mut child = driver(&lab, "hold").spawn().expect("spawn drive.py");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), lines.next_line())
        .await
        .expect("drive.py leased in time")
        .unwrap()
        .expect("drive.py printed the lease");
    let lease_id = serde_json::from_str::<Value>(&line).unwrap()["lease_id"]
        .as_str()
        .unwrap()
        .to_string();
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let l = hw
        .get_ok(&format!("/api/v1/capability-leases/{lease_id}"))
        .await
        .unwrap();
    assert_eq!(l["status"], "granted", "{l}");

    // SIGKILL the client: its pipe to the server closes, and the server
    // gives the camera back.
    child.kill().await.unwrap();
    let ended = poll_until(Duration::from_secs(15), "the lease released", || async {
        let l = hw
            .get_ok(&format!("/api/v1/capability-leases/{lease_id}"))
            .await
            .ok()?;
        (l["status"] == "released").then_some(l)
    })
    .await
    .expect("the server released the lease after the client died");
    assert_eq!(ended["capability_id"], caps::CAMERA);
    let held = hw
        .get_ok(&format!(
            "/api/v1/capability-leases?capability_id={}&active_only=true",
            caps::CAMERA
        ))
        .await
        .unwrap();
    assert_eq!(
        held["leases"].as_array().map(Vec::len),
        Some(0),
        "the camera is free: {held}"
    );
}
