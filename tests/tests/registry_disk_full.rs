//! The registry's disk fills up while a session runs, across real
//! processes (`bench-sim`, `cloud-registry` with its store on an 8 MiB
//! tmpfs this test mounts, `edge-agent`): writes answer 507
//! `storage_full` naming the store, `/healthz` is degraded, the full-disk
//! warning is rate-limited; once space is freed the registry asks the bench
//! again, and the session's result and its artifact arrive: nothing the
//! edge had sent is lost.
//!
//! Needs root (`mount -t tmpfs`); without it the test says so and fails
//! when `CI=true`.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT, PROVIDER_ID};
use benchlink_e2e::client::{sha256_hex, Agent};
use benchlink_e2e::poll_until;
use benchlink_testkit::status_is;
use benchlink_testkit::Tmpfs;
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Fill the file system of `dir` with one file until it has no space left.
fn fill(dir: &Path) -> PathBuf {
    use std::io::Write;
    let path = dir.join("filler");
    let mut f = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xA5u8; 64 * 1024];
    loop {
        if f.write_all(&chunk).is_err() {
            break;
        }
    }
    // The last pages: smaller writes until even one byte does not fit.
    for size in [4096usize, 512, 1] {
        while f.write_all(&chunk[..size]).is_ok() {}
    }
    let _ = f.sync_all();
    path
}

async fn healthz(lab: &Lab) -> (StatusCode, Value) {
    let resp = reqwest::get(format!("{}/healthz", lab.base_url))
        .await
        .unwrap();
    let s = resp.status();
    (s, resp.json().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_registry_disk_refuses_writes_clearly_and_loses_no_result() {
    let scratch = tempfile::tempdir().unwrap();
    let store_dir = scratch.path().join("store");
    let Some(_tmpfs) = Tmpfs::mount(&store_dir, "8m") else {
        return;
    };
    let lab = Lab::start(LabOptions {
        registry_store_dir: Some(store_dir.clone()),
        ..Default::default()
    })
    .await
    .expect("lab starts");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (_, lease) = status_is(
        hw.lease(caps::CONSOLE, 50, "disk full", None, 10)
            .await
            .unwrap(),
        StatusCode::CREATED,
    );
    let lease_id = lease["lease_id"].as_str().unwrap().to_string();
    // A capture that ends while the disk is full.
    let session_id = hw
        .start_action(
            &lease_id,
            &json!({
                "action": "capture_log",
                "params": {"duration_ms": 6000},
                "wait_ms": 0,
                "timeout_ms": 180_000
            }),
        )
        .await
        .unwrap();

    let filler = fill(&store_dir);
    // Writes until the store refuses one (SQLite may still fit a few in
    // WAL space it has already).
    let mut refused = None;
    for _ in 0..3000 {
        let (s, v) = hw
            .lease(caps::SPEAKER, 10, "fill the store", None, 0)
            .await
            .unwrap();
        match s {
            StatusCode::CREATED => {
                let _ = hw.release(v["lease_id"].as_str().unwrap()).await;
            }
            _ => {
                refused = Some((s, v));
                break;
            }
        }
    }
    let (_, v) = status_is(
        refused.expect("a lease request refused once the disk is full"),
        StatusCode::INSUFFICIENT_STORAGE,
    );
    assert_eq!(v["error"]["code"], "storage_full", "{v}");
    let store = store_dir.display().to_string();
    assert!(
        v["error"]["message"].as_str().unwrap().contains(&store),
        "{v}"
    );
    assert_eq!(v["error"]["details"]["path"], store.as_str());

    // An artifact upload gets the same answer.
    let bytes = b"bytes that do not fit".repeat(1000);
    let resp = reqwest::Client::new()
        .put(format!(
            "{}/api/v1/artifacts/art-disk-full-probe/content",
            lab.base_url
        ))
        .bearer_auth(&lab.provider_token)
        .header("X-Checksum-Sha256", sha256_hex(&bytes))
        .body(bytes)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::INSUFFICIENT_STORAGE);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["code"], "storage_full", "{v}");

    let (_, h) = status_is(healthz(&lab).await, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(h["status"], "degraded", "{h}");
    assert_eq!(h["store"]["writable"], false, "{h}");
    assert_eq!(h["store"]["path"], store.as_str(), "{h}");

    // The capture ends at the edge while the disk is still full: its
    // result cannot be stored, the session stays open.
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    tokio::time::sleep(Duration::from_secs(8)).await;
    let session = admin
        .get_ok(&format!("/api/v1/sessions/{session_id}"))
        .await
        .unwrap();
    assert_eq!(session["status"], "running", "{session}");
    let log = std::fs::read_to_string(lab.root.join("logs/registry.log")).unwrap();
    let warnings = log.matches("the registry's store is full").count();
    assert!(
        (1..=3).contains(&warnings),
        "{warnings} full-disk warnings in about 10 s (rate-limited to one per 10 s)"
    );
    assert!(
        log.contains("session update not stored: the store is full"),
        "the result was not refused for lack of space"
    );

    // Space is back: the store is writable again, the registry asks the
    // bench for what it could not store, and the result and artifact land.
    std::fs::remove_file(&filler).unwrap();
    let freed = Instant::now();
    poll_until(Duration::from_secs(10), "healthz ok again", || async {
        let (s, h) = healthz(&lab).await;
        (s == StatusCode::OK && h["store"]["writable"] == true).then_some(())
    })
    .await
    .unwrap();
    let done = poll_until(Duration::from_secs(60), "session completed", || async {
        let s = admin
            .get_ok(&format!("/api/v1/sessions/{session_id}"))
            .await
            .ok()?;
        (s["status"] != "running").then_some(s)
    })
    .await
    .unwrap();
    assert_eq!(done["status"], "completed", "{done}");
    let artifacts = hw
        .wait_artifacts_uploaded(std::slice::from_ref(&lease_id), Duration::from_secs(90))
        .await
        .unwrap();
    assert!(!artifacts.is_empty(), "the capture has its artifact");
    for a in &artifacts {
        let id = a["artifact_id"].as_str().unwrap();
        let got = hw.download(id).await.unwrap();
        assert_eq!(sha256_hex(&got.bytes), a["checksum"].as_str().unwrap());
    }
    eprintln!(
        "recovered {:.1} s after the space was freed",
        freed.elapsed().as_secs_f64()
    );
    // Heartbeats that could not be stored still showed the bench alive.
    let provider = admin
        .get_ok(&format!("/api/v1/capability-providers/{PROVIDER_ID}"))
        .await
        .unwrap();
    assert_eq!(provider["online_status"], "online", "{provider}");
    let log = std::fs::read_to_string(lab.root.join("logs/registry.log")).unwrap();
    assert!(
        !log.contains("marked offline"),
        "the bench was taken offline during the outage"
    );
}
