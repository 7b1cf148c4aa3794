//! A full edge disk, across real processes: the edge's `state_dir` (outbox
//! database and files) is a 4 MiB tmpfs this test mounts and then fills.
//! An action whose evidence cannot be kept fails at once with a clear
//! error (not 45 s later as unreported), the bench's capabilities report
//! it in their health, evidence acknowledged before stays at the registry,
//! and once there is room again the bench takes and uploads evidence as
//! before.
//!
//! Needs root (`mount -t tmpfs`): under `CI=true` a failed mount fails the
//! test; elsewhere it says loudly that it did not run.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::{sha256_hex, Agent};
use benchlink_e2e::eventually;
use benchlink_testkit::Tmpfs;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Write zeros to `path` until the file system is full; returns the bytes
/// written.
fn fill(path: &Path) -> u64 {
    let mut f = std::fs::File::create(path).expect("filler");
    let chunk = vec![0u8; 16 * 1024];
    let mut n = 0u64;
    while f.write_all(&chunk).is_ok() {
        n += chunk.len() as u64;
    }
    let _ = f.flush();
    n
}

async fn snapshot_artifact(agent: &Agent, lease_id: &str) -> Value {
    let s = agent
        .act_ok(lease_id, "snapshot", json!({}))
        .await
        .expect("snapshot");
    let id = s["artifact_refs"][0]
        .as_str()
        .expect("an artifact")
        .to_string();
    agent
        .get_ok(&format!("/api/v1/artifacts/{id}"))
        .await
        .expect("artifact metadata")
}

async fn wait_uploaded(agent: &Agent, artifact_id: &str) {
    eventually(Duration::from_secs(30), "artifact uploaded", || async {
        match agent.get(&format!("/api/v1/artifacts/{artifact_id}")).await {
            Ok((StatusCode::OK, v)) if v["uploaded"] == true => Some(()),
            _ => None,
        }
    })
    .await;
}

#[tokio::test]
async fn a_full_edge_disk_fails_the_action_at_once_reports_unhealthy_and_loses_nothing_acknowledged(
) {
    let Some(fs) = Tmpfs::mount_temp("benchlink-full-disk-", "4m") else {
        return;
    };
    let state: PathBuf = fs.path().join("state");
    let lab = Lab::start(LabOptions {
        edge_state_dir: Some(state.clone()),
        ..Default::default()
    })
    .await
    .expect("lab starts");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let lease_id = hw
        .lease_ok(caps::CAMERA, "evidence on a full disk")
        .await
        .unwrap();

    // Evidence taken and acknowledged before the disk fills.
    let before = snapshot_artifact(&hw, &lease_id).await;
    let before_id = before["artifact_id"].as_str().unwrap().to_string();
    wait_uploaded(&hw, &before_id).await;

    let filler = fs.path().join("filler");
    let filled = fill(&filler);
    println!("filled the edge's 4 MiB state file system with {filled} more bytes");

    let started = Instant::now();
    let (s, failed) = hw
        .act(&lease_id, "snapshot", json!({}), 30_000)
        .await
        .unwrap();
    let took = started.elapsed();
    println!("the snapshot on a full disk ended after {took:?}: {failed}");
    assert_eq!(s, StatusCode::OK, "{failed}");
    assert_eq!(failed["status"], "failed", "{failed}");
    let message = failed["error_message"].as_str().unwrap_or_default();
    assert!(
        message.contains("disk is full") && message.contains("evidence"),
        "a clear error: {message}"
    );
    assert!(
        took < Duration::from_secs(10),
        "the failure came {took:?} later"
    );
    let unhealthy = eventually(Duration::from_secs(10), "camera unhealthy", || async {
        let h = hw.capability(caps::CAMERA).await;
        (h["health_status"] == "unhealthy").then_some(h)
    })
    .await;
    println!("camera while the disk is full: {unhealthy}");

    // Nothing acknowledged was lost.
    let got = hw.download(&before_id).await.expect("earlier evidence");
    assert_eq!(sha256_hex(&got.bytes), before["checksum"].as_str().unwrap());

    // Room again: health recovers and evidence is kept and uploaded.
    std::fs::remove_file(&filler).unwrap();
    eventually(Duration::from_secs(15), "camera healthy again", || async {
        (hw.capability(caps::CAMERA).await["health_status"] == "healthy").then_some(())
    })
    .await;
    let after = snapshot_artifact(&hw, &lease_id).await;
    wait_uploaded(&hw, after["artifact_id"].as_str().unwrap()).await;
    drop(lab);
}
