//! Wall-clock steps on the registry, across real processes. The registry
//! runs with libfaketime preloaded, reading its offset from a file on
//! every clock read (`FAKETIME_TIMESTAMP_FILE`, `FAKETIME_NO_CACHE=1`)
//! and leaving the monotonic clock alone (`FAKETIME_DONT_FAKE_MONOTONIC=1`),
//! as NTP or an operator setting the date would. While a 9 s `record_clip`
//! runs with a caller waiting for it, the test steps the registry's clock
//! by an hour, forward or back: session deadlines, the report window and
//! provider liveness run on the monotonic clock, so the action completes
//! with its artifact, the caller gets `completed`, and no `session_failed`
//! is published. The events' `occurred_at` show the registry's clock did
//! move. An audit claim held across a +1 h step is not taken back: its
//! visibility timeout runs on the registry's steady clock.
//!
//! Under `CI=true` a missing libfaketime (Debian package `faketime`) fails
//! the test; elsewhere it is skipped with a printed reason.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT, PROVIDER_ID};
use benchlink_e2e::client::{follow_events, group_leases, Agent};
use benchlink_testkit::status_is;
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{json, Value};

/// Length of the clip, milliseconds.
const CLIP_MS: u64 = 9_000;
/// When the clock is stepped, after the invocation.
const STEP_AFTER: Duration = Duration::from_secs(3);

/// The libfaketime library of the Debian package, if installed.
fn libfaketime() -> Option<PathBuf> {
    let listed = Command::new("dpkg")
        .args(["-L", "libfaketime"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    listed
        .lines()
        .map(PathBuf::from)
        .chain(
            ["/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"]
                .iter()
                .map(PathBuf::from),
        )
        .find(|p| p.file_name().is_some_and(|n| n == "libfaketime.so.1") && p.exists())
}

/// The environment that preloads libfaketime into the registry with its
/// offset read from `offset_file`.
fn faketime_env(lib: &Path, offset_file: &Path) -> Vec<(String, String)> {
    [
        ("LD_PRELOAD", lib.display().to_string()),
        ("FAKETIME_TIMESTAMP_FILE", offset_file.display().to_string()),
        ("FAKETIME_NO_CACHE", "1".to_string()),
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1".to_string()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .to_vec()
}

/// A lab whose registry runs under libfaketime with the offset `+0`, and
/// the offset's file (rewrite it to step the registry's clock). `None`
/// when libfaketime is not installed and `CI` is not `true` (under CI it
/// fails).
async fn faketime_lab() -> Option<(tempfile::TempDir, PathBuf, Lab)> {
    let Some(lib) = libfaketime() else {
        benchlink_testkit::skip_unless_ci(
            "libfaketime is not installed (Debian package `faketime`)",
        );
        return None;
    };
    let dir = tempfile::tempdir().expect("temporary directory");
    let offset_file = dir.path().join("faketime-offset");
    std::fs::write(&offset_file, "+0\n").unwrap();
    let lab = Lab::start(LabOptions {
        registry_env: faketime_env(&lib, &offset_file),
        ..Default::default()
    })
    .await
    .expect("lab with libfaketime in the registry");
    Some((dir, offset_file, lab))
}

/// Start a lab whose registry's clock is offset by `+0`, run a 9 s clip
/// with a caller waiting for it, and rewrite the offset to `step` (a
/// libfaketime offset, e.g. `+1h`) 3 s in. `step_s` is the step in
/// seconds, to check the registry's clock moved by it.
async fn clip_across_a_clock_step(step: &str, step_s: i64) {
    let Some((_dir, offset_file, lab)) = faketime_lab().await else {
        return;
    };
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (events, _follower) = follow_events(&admin, |_| {});

    let group = hw
        .lease_group(&[caps::CAMERA], 70, "clip across a clock step", 10)
        .await
        .unwrap();
    let lease_id = group_leases(&group)[caps::CAMERA].clone();
    let caller = {
        let hw = hw.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let answer = hw
                .act(
                    &lease_id,
                    "record_clip",
                    json!({ "duration_ms": CLIP_MS }),
                    60_000,
                )
                .await;
            (answer, started.elapsed())
        })
    };
    tokio::time::sleep(STEP_AFTER).await;
    std::fs::write(&offset_file, format!("{step}\n")).unwrap();

    let (answer, waited) = caller.await.unwrap();
    let (_, session) = status_is(answer.unwrap(), StatusCode::OK);
    assert_eq!(
        session["status"], "completed",
        "the waiting caller's answer after {waited:?}: {session}"
    );
    assert!(
        waited >= Duration::from_millis(CLIP_MS),
        "answered after {waited:?}, before the clip could end: {session}"
    );
    let artifacts = session["artifact_refs"].as_array().cloned().unwrap();
    assert_eq!(artifacts.len(), 1, "{session}");
    let artifact = hw
        .get_ok(&format!(
            "/api/v1/artifacts/{}",
            artifacts[0].as_str().unwrap()
        ))
        .await
        .unwrap();
    assert_eq!(artifact["artifact_type"], "video_clip", "{artifact}");

    // The registry's clock did move: its `session_completed` is stamped
    // about `step_s` away from this process's clock.
    let session_id = session["session_id"].as_str().unwrap().to_string();
    let done = events
        .wait_for("session_completed", Duration::from_secs(10), |e| {
            e["event_type"] == "session_completed" && e["session_id"] == session_id.as_str()
        })
        .await
        .unwrap();
    let stamped: DateTime<Utc> = done["occurred_at"].as_str().unwrap().parse().unwrap();
    let skew = (stamped - Utc::now()).num_seconds();
    assert!(
        (skew - step_s).abs() < 60,
        "the registry's clock is {skew} s from ours, not stepped by {step_s} s: {done}"
    );

    // A moment later: nothing failed, nothing went offline.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(events.of("session_failed"), Vec::<Value>::new());
    let offline: Vec<Value> = events
        .of("capability_health_changed")
        .into_iter()
        .filter(|e| e["data"]["status"] == "offline")
        .collect();
    assert_eq!(offline, Vec::<Value>::new());
    let provider = admin
        .get_ok(&format!("/api/v1/capability-providers/{PROVIDER_ID}"))
        .await
        .unwrap();
    assert_eq!(provider["online_status"], "online", "{provider}");
}

/// A +1 h step (NTP correcting a slow clock, say) during a 9 s clip: the
/// session's deadline (45 s away) does not pass at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_step_forward_leaves_a_running_action_and_its_caller_alone() {
    clip_across_a_clock_step("+1h", 3600).await;
}

/// A −1 h step during a 9 s clip: the action and its caller are unaffected
/// as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_step_back_leaves_a_running_action_and_its_caller_alone() {
    clip_across_a_clock_step("-1h", -3600).await;
}

/// An audit claim (visibility timeout 180 s) across a +1 h step: the
/// claim is not taken back, and its holder can still extend it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wall_clock_step_forward_takes_back_no_audit_claim() {
    let Some((_dir, offset_file, lab)) = faketime_lab().await else {
        return;
    };
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let id = "auditreq_clock_step";
    let (s, v) = admin
        .post(
            "/api/v1/audit-requests",
            &json!({
                "protocol_version": "1.0",
                "audit_request_id": id,
                "project_id": "proj_device_assistant",
                "task_id": "task_release_0_9_2",
                "trigger": "merge_candidate",
                "audit_type": "hardware",
                "priority": 50,
                "objective": "hardware audit across a clock step",
                "time_budget_seconds": 120,
                "response_mode": "structured_json"
            }),
        )
        .await
        .unwrap();
    assert!(s.is_success(), "{s}: {v}");
    let (_, claimed) = status_is(
        hw.post(
            "/api/v1/audit-requests/claim",
            &json!({"audit_types": ["hardware"], "agent_ref": HW_AGENT, "wait_ms": 0}),
        )
        .await
        .unwrap(),
        StatusCode::OK,
    );
    assert_eq!(claimed["claim"]["audit_request_id"], id, "{claimed}");

    std::fs::write(&offset_file, "+1h\n").unwrap();
    // Several sweeps of the audit queue (every second).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let request = hw
        .get_ok(&format!("/api/v1/audit-requests/{id}"))
        .await
        .unwrap();
    assert_eq!(request["status"], "claimed", "{request}");
    let (s, extended) = hw
        .post(
            &format!("/api/v1/audit-requests/{id}/extend"),
            &json!({"extend_seconds": 60}),
        )
        .await
        .unwrap();
    assert_eq!(s, StatusCode::OK, "the claim was taken back: {extended}");
}
