//! The daemon's command handling with simulated drivers and no broker
//! (updates stay queued in the outbox, where the tests read them): bad
//! commands, cancellation, non-interruptible actions, deadlines, lease
//! revocation; and the systemd notify protocol of the real binary.

use std::os::unix::net::UnixDatagram;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use benchlink_testkit::free_port;
use edge_agent::config::EdgeConfig;
use edge_agent::daemon::Daemon;
use edge_agent::link::envelope;
use serde_json::{json, Value};
use shared_protocol::mqtt::{Envelope, MessageType};

/// A camera and a thumb robot, simulated; a broker that is not there.
fn bench_config(dir: &Path) -> std::path::PathBuf {
    let text = format!(
        r#"state_dir = "{state}"
[provider]
provider_id = "prov-daemon-test"
node_id = "test-node"
[registry]
mqtt_host = "127.0.0.1"
mqtt_port = {port}
base_url = "http://127.0.0.1:{port}"
token = "t"

[[capabilities]]
id = "cam-01"
type = "camera"
[capabilities.driver]
backend = "sim"
resolution = "320x240"
fps = 10

[[capabilities]]
id = "robot-01"
type = "thumb_robot"
preemptible = false
[capabilities.driver]
backend = "sim"
bounds_mm = {{ x_min = 0.0, x_max = 70.0, y_min = 0.0, y_max = 140.0 }}
safe_z_mm = 10.0
press_z_mm = 2.0
speedup = 20.0
# Narrower than the robot's bounds: the DUT's screen only.
[capabilities.constraints]
work_area_mm = {{ x_min = 0.0, x_max = 60.0, y_min = 0.0, y_max = 140.0 }}
"#,
        state = dir.join("state").display(),
        port = free_port(),
    );
    let path = dir.join("edge.toml");
    std::fs::write(&path, text).unwrap();
    path
}

async fn start(dir: &Path) -> Daemon {
    let cfg = EdgeConfig::load(&bench_config(dir)).expect("config");
    Daemon::start(cfg).await.expect("daemon")
}

fn invoke(
    session_id: &str,
    lease_id: &str,
    capability_id: &str,
    action: &str,
    params: Value,
    timeout_ms: u32,
) -> Envelope {
    envelope(
        MessageType::ActionInvoke,
        &json!({
            "session_id": session_id,
            "lease_id": lease_id,
            "capability_id": capability_id,
            "action": action,
            "params": params,
            "timeout_ms": timeout_ms,
            "lease_generation": 1,
            "lease_mode": "exclusive",
            "not_after": (chrono::Utc::now() + chrono::Duration::minutes(10)).to_rfc3339(),
        }),
    )
}

/// Session updates queued so far for `session_id`, oldest first.
async fn updates(daemon: &Daemon, session_id: &str) -> Vec<Value> {
    let outbox = daemon.outbox().clone();
    let queued = tokio::task::spawn_blocking(move || outbox.queued_updates(10_000))
        .await
        .unwrap()
        .unwrap();
    queued
        .iter()
        .filter_map(|q| Envelope::parse(&q.payload).ok())
        .filter(|e| {
            e.message_type == MessageType::SessionUpdate && e.body["session_id"] == session_id
        })
        .map(|e| e.body)
        .collect()
}

/// Wait until `session_id` has a final update; returns all its updates.
async fn final_updates(daemon: &Daemon, session_id: &str, timeout: Duration) -> Vec<Value> {
    let until = Instant::now() + timeout;
    loop {
        let u = updates(daemon, session_id).await;
        if u.iter()
            .any(|b| !matches!(b["status"].as_str(), Some("running" | "pending")))
        {
            return u;
        }
        assert!(
            Instant::now() < until,
            "no final update for {session_id} within {timeout:?}: {u:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn wait_running(daemon: &Daemon, session_id: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    while !updates(daemon, session_id)
        .await
        .iter()
        .any(|b| b["status"] == "running")
    {
        assert!(Instant::now() < until, "{session_id} never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_the_capability_lacks_fails_without_running() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    daemon.submit(invoke(
        "s-unsupported",
        "l-1",
        "cam-01",
        "tap",
        json!({}),
        5000,
    ));
    let u = final_updates(&daemon, "s-unsupported", Duration::from_secs(5)).await;
    assert_eq!(u.len(), 1, "no running update: {u:?}");
    assert_eq!(u[0]["status"], "failed");
    let msg = u[0]["error_message"].as_str().unwrap();
    assert!(
        msg.contains("action `tap` is not supported by capability `cam-01` (camera)"),
        "{msg}"
    );
    assert!(msg.contains("snapshot"), "lists what is supported: {msg}");
    daemon.shutdown().await;
}

/// A camera without pan/tilt/zoom controls does not offer `set_ptz`, and a
/// command for it is refused like any action the capability lacks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_ptz_on_a_camera_without_ptz_is_refused_without_running() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    daemon.submit(invoke(
        "s-no-ptz",
        "l-1",
        "cam-01",
        "set_ptz",
        json!({"pan": 3600}),
        5000,
    ));
    let u = final_updates(&daemon, "s-no-ptz", Duration::from_secs(5)).await;
    assert_eq!(u.len(), 1, "no running update: {u:?}");
    assert_eq!(u[0]["status"], "failed");
    let msg = u[0]["error_message"].as_str().unwrap();
    assert!(
        msg.contains("action `set_ptz` is not supported by capability `cam-01` (camera)"),
        "{msg}"
    );
    let (_, supported) = msg
        .split_once("supported: ")
        .expect("lists what is supported");
    assert!(supported.contains("snapshot"), "{msg}");
    assert!(!supported.contains("set_ptz"), "{msg}");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unknown_capability_fails_and_names_the_known_ones() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    daemon.submit(invoke(
        "s-unknown",
        "l-1",
        "cam-99",
        "snapshot",
        json!({}),
        5000,
    ));
    let u = final_updates(&daemon, "s-unknown", Duration::from_secs(5)).await;
    assert_eq!(u.len(), 1);
    assert_eq!(u[0]["status"], "failed");
    let msg = u[0]["error_message"].as_str().unwrap();
    assert!(msg.contains("unknown capability `cam-99`"), "{msg}");
    assert!(msg.contains("cam-01, robot-01"), "{msg}");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameters_the_driver_rejects_fail_the_session_and_nothing_moves() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    // Outside the robot's bounds: refused before any motion.
    daemon.submit(invoke(
        "s-bounds",
        "l-1",
        "robot-01",
        "tap",
        json!({"x_mm": 500.0, "y_mm": 10.0}),
        5000,
    ));
    let u = final_updates(&daemon, "s-bounds", Duration::from_secs(5)).await;
    let last = u.last().unwrap();
    assert_eq!(last["status"], "failed");
    assert!(
        last["error_message"].as_str().unwrap().contains("x_mm"),
        "{last}"
    );
    assert!(last["artifacts"].as_array().unwrap().is_empty());
    daemon.shutdown().await;
}

/// A command from a registry that does not check `constraints_json`
/// (an older one) is refused by the bench itself: a failed session naming
/// the constraint, no running update, no evidence, the robot never moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_press_outside_the_declared_work_area_fails_without_running() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    // Inside the robot's bounds (x 0..=70), outside its work area (0..=60).
    daemon.submit(invoke(
        "s-area",
        "l-1",
        "robot-01",
        "tap",
        json!({"x_mm": 65.0, "y_mm": 40.0}),
        5000,
    ));
    let u = final_updates(&daemon, "s-area", Duration::from_secs(5)).await;
    assert_eq!(u.len(), 1, "no running update: {u:?}");
    assert_eq!(u[0]["status"], "failed");
    assert!(u[0]["artifacts"].as_array().unwrap().is_empty(), "{u:?}");
    let msg = u[0]["error_message"].as_str().unwrap();
    assert!(msg.contains("refused by the bench"), "{msg}");
    assert!(msg.contains("constraint `work_area_mm`"), "{msg}");
    assert!(msg.contains("`x_mm` = 65"), "{msg}");
    // Within it, the same tap runs.
    daemon.submit(invoke(
        "s-area-ok",
        "l-1",
        "robot-01",
        "tap",
        json!({"x_mm": 55.0, "y_mm": 40.0}),
        5000,
    ));
    let u = final_updates(&daemon, "s-area-ok", Duration::from_secs(10)).await;
    assert_eq!(u.last().unwrap()["status"], "completed", "{u:?}");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_action_reports_its_artifacts_from_the_outbox() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    daemon.submit(invoke(
        "s-snap",
        "l-1",
        "cam-01",
        "snapshot",
        json!({}),
        10_000,
    ));
    let u = final_updates(&daemon, "s-snap", Duration::from_secs(15)).await;
    let statuses: Vec<&str> = u.iter().map(|b| b["status"].as_str().unwrap()).collect();
    // A quick action reports only its end; one that took over 100 ms
    // (a loaded machine) reports `running` first.
    assert!(
        statuses == ["completed"] || statuses == ["running", "completed"],
        "{statuses:?}"
    );
    let art = &u.last().unwrap()["artifacts"][0];
    assert_eq!(art["artifact_type"], "image");
    let id = art["artifact_id"].as_str().unwrap().to_string();
    let outbox = daemon.outbox().clone();
    let row = tokio::task::spawn_blocking(move || outbox.artifact(&id))
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(art["checksum"], row.artifact.checksum.as_str());
    assert_eq!(art["size_bytes"], row.artifact.size_bytes);
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn action_cancel_stops_an_interruptible_action_and_a_queued_one_never_starts() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    daemon.submit(invoke(
        "s-clip",
        "l-1",
        "cam-01",
        "record_clip",
        json!({"duration_ms": 20000}),
        60_000,
    ));
    daemon.submit(invoke(
        "s-queued",
        "l-1",
        "cam-01",
        "snapshot",
        json!({}),
        60_000,
    ));
    wait_running(&daemon, "s-clip").await;

    daemon.submit(envelope(
        MessageType::ActionCancel,
        &json!({"session_id": "s-queued", "reason": "holder stopped"}),
    ));
    let q = final_updates(&daemon, "s-queued", Duration::from_secs(2)).await;
    assert_eq!(q.len(), 1, "never started: {q:?}");
    assert_eq!(q[0]["status"], "cancelled");
    assert!(q[0]["error_message"]
        .as_str()
        .unwrap()
        .contains("holder stopped"));

    // Some frames into the clip.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let asked = Instant::now();
    daemon.submit(envelope(
        MessageType::ActionCancel,
        &json!({"session_id": "s-clip", "reason": "preempted at grace end"}),
    ));
    let u = final_updates(&daemon, "s-clip", Duration::from_secs(5)).await;
    assert!(
        asked.elapsed() < Duration::from_secs(5),
        "stopped long before the 20 s clip ended"
    );
    let statuses: Vec<&str> = u.iter().map(|b| b["status"].as_str().unwrap()).collect();
    // A long action was reported running before it ended.
    assert_eq!(statuses, vec!["running", "cancelled"]);
    let last = u.last().unwrap();
    assert!(
        last["error_message"]
            .as_str()
            .unwrap()
            .contains("preempted at grace end"),
        "{last}"
    );
    // The frames recorded before the cancel are kept as evidence.
    assert_eq!(last["result_summary"]["partial"], true, "{last}");
    let clip = &last["artifacts"].as_array().unwrap()[0];
    assert_eq!(clip["artifact_type"], "video_clip", "{last}");
    assert!(clip["size_bytes"].as_u64().unwrap() > 0, "{last}");
    daemon.shutdown().await;
}

/// A `capture_log` cancelled part way (preemption at grace end) is
/// reported `cancelled` with the log captured until then as its artifact,
/// kept in the outbox like any other evidence.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_capture_log_reports_the_log_captured_until_then() {
    let dir = tempfile::tempdir().unwrap();
    let path = bench_config(dir.path());
    let mut text = std::fs::read_to_string(&path).unwrap();
    text.push_str(
        r#"
[[capabilities]]
id = "console-01"
type = "serial_port"
[capabilities.driver]
backend = "sim"
boot_ms = 600
"#,
    );
    std::fs::write(&path, text).unwrap();
    let daemon = Daemon::start(EdgeConfig::load(&path).expect("config"))
        .await
        .expect("daemon");
    daemon.submit(invoke(
        "s-open",
        "l-1",
        "console-01",
        "open",
        json!({}),
        10_000,
    ));
    final_updates(&daemon, "s-open", Duration::from_secs(5)).await;
    daemon.submit(invoke(
        "s-log",
        "l-1",
        "console-01",
        "capture_log",
        json!({"duration_ms": 30_000, "since": "all"}),
        60_000,
    ));
    wait_running(&daemon, "s-log").await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    daemon.submit(envelope(
        MessageType::ActionCancel,
        &json!({"session_id": "s-log", "reason": "preempted at grace end"}),
    ));
    let u = final_updates(&daemon, "s-log", Duration::from_secs(5)).await;
    let last = u.last().unwrap();
    assert_eq!(last["status"], "cancelled", "{last}");
    assert!(
        last["error_message"]
            .as_str()
            .unwrap()
            .contains("preempted at grace end"),
        "{last}"
    );
    assert_eq!(last["result_summary"]["partial"], true, "{last}");
    let arts = last["artifacts"].as_array().unwrap();
    assert_eq!(arts.len(), 1, "{last}");
    assert_eq!(arts[0]["artifact_type"], "serial_log");
    assert!(
        last["result_summary"]["bytes_captured"].as_u64().unwrap() > 0,
        "the boot log was captured: {last}"
    );
    assert_eq!(
        arts[0]["size_bytes"], last["result_summary"]["bytes_captured"],
        "{last}"
    );
    daemon.shutdown().await;
}

/// The registry asks about the sessions it holds open after the bench
/// reconnected: an ended one whose update the broker acknowledged is sent
/// again (the registry may not have been subscribed), a running one is left
/// alone, and one the bench never received is reported failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_sync_resends_ended_sessions_and_fails_unknown_ones() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    daemon.submit(invoke(
        "s-done",
        "l-1",
        "cam-01",
        "snapshot",
        json!({}),
        10_000,
    ));
    daemon.submit(invoke(
        "s-long",
        "l-1",
        "cam-01",
        "record_clip",
        json!({"duration_ms": 20000}),
        60_000,
    ));
    let done = final_updates(&daemon, "s-done", Duration::from_secs(15)).await;
    wait_running(&daemon, "s-long").await;
    // The broker acknowledged everything queued so far (what the link does
    // on PUBACK).
    let outbox = daemon.outbox().clone();
    tokio::task::spawn_blocking(move || {
        let seqs: Vec<i64> = outbox
            .queued_updates(100)
            .unwrap()
            .iter()
            .map(|q| q.seq)
            .collect();
        outbox.remove_updates(&seqs).unwrap();
    })
    .await
    .unwrap();
    assert_eq!(updates(&daemon, "s-done").await, Vec::<Value>::new());

    let asked = Instant::now();
    daemon.submit(envelope(
        MessageType::SessionSync,
        &json!({"sessions": [
            {"session_id": "s-done", "capability_id": "cam-01"},
            {"session_id": "s-long", "capability_id": "cam-01"},
            {"session_id": "s-lost", "capability_id": "cam-01"},
            {"session_id": "s-gone", "capability_id": "cam-01", "ended_by_registry": true},
        ]}),
    ));
    let again = final_updates(&daemon, "s-done", Duration::from_secs(5)).await;
    assert_eq!(again, vec![done.last().unwrap().clone()]);
    let lost = final_updates(&daemon, "s-lost", Duration::from_secs(10)).await;
    assert!(
        asked.elapsed() >= Duration::from_secs(2),
        "an unknown session is looked at again before it is failed"
    );
    assert_eq!(lost.len(), 1, "{lost:?}");
    assert_eq!(lost[0]["status"], "failed");
    assert_eq!(lost[0]["capability_id"], "cam-01");
    assert_eq!(
        lost[0]["error_message"],
        edge_agent::daemon::NEVER_RECEIVED,
        "{lost:?}"
    );
    // Asked again, it is not reported twice; and its action_invoke, should
    // it still arrive, is not run.
    daemon.submit(envelope(
        MessageType::SessionSync,
        &json!({"sessions": [{"session_id": "s-lost", "capability_id": "cam-01"}]}),
    ));
    daemon.submit(invoke(
        "s-lost",
        "l-1",
        "cam-01",
        "snapshot",
        json!({}),
        10_000,
    ));
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(updates(&daemon, "s-lost").await, lost);
    // One the registry already ended, unknown here (an earlier run's, say):
    // nothing is claimed about it.
    assert_eq!(updates(&daemon, "s-gone").await, Vec::<Value>::new());
    // The running clip gets no new update from the sync.
    assert_eq!(updates(&daemon, "s-long").await, Vec::<Value>::new());
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_non_interruptible_press_finishes_before_a_cancel_applies() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    // 6 s of hold at the simulator's 20x speed-up: 300 ms, well past the
    // 100 ms after which a still-running action reports `running` (with
    // 1.5 s the whole press could end near that mark on a loaded machine,
    // and never report it).
    daemon.submit(invoke(
        "s-press",
        "l-1",
        "robot-01",
        "long_press",
        json!({"x_mm": 20.0, "y_mm": 40.0, "hold_ms": 6000}),
        10_000,
    ));
    wait_running(&daemon, "s-press").await;
    daemon.submit(envelope(
        MessageType::ActionCancel,
        &json!({"session_id": "s-press", "reason": "preempted"}),
    ));
    let u = final_updates(&daemon, "s-press", Duration::from_secs(10)).await;
    assert_eq!(u.last().unwrap()["status"], "completed", "{u:?}");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_action_past_its_deadline_fails_as_timed_out() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    daemon.submit(invoke(
        "s-slow",
        "l-1",
        "cam-01",
        "record_clip",
        json!({"duration_ms": 20000}),
        1000,
    ));
    let started = Instant::now();
    let u = final_updates(&daemon, "s-slow", Duration::from_secs(10)).await;
    let last = u.last().unwrap();
    assert_eq!(last["status"], "failed", "{last}");
    assert!(
        last["error_message"]
            .as_str()
            .unwrap()
            .contains("timed out"),
        "{last}"
    );
    assert!(started.elapsed() < Duration::from_secs(8));
    daemon.shutdown().await;
}

/// A deadline shorter than the action names the deadline the command gave,
/// never what was left of it when the driver looked (which rounds down to
/// "0 ms").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_ms_deadline_is_reported_as_1_ms() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    for (i, (capability, action, params)) in [
        ("cam-01", "snapshot", json!({})),
        ("cam-01", "snapshot", json!({})),
        ("cam-01", "record_clip", json!({"duration_ms": 5000})),
    ]
    .into_iter()
    .enumerate()
    {
        let session = format!("s-1ms-{i}");
        daemon.submit(invoke(&session, "l-1", capability, action, params, 1));
        let u = final_updates(&daemon, &session, Duration::from_secs(10)).await;
        let last = u.last().unwrap();
        assert_eq!(last["status"], "failed", "{last}");
        let message = last["error_message"].as_str().unwrap();
        // Which of the three depends on who noticed first: the driver, the
        // deadline supervisor, or the queue.
        assert!(
            [
                "timed out after 1 ms".to_string(),
                "timed out after 1 ms (cancelled at its deadline)".to_string(),
                format!(
                    "timed out after 1 ms waiting in the queue of capability `{capability}` (it was busy)"
                ),
            ]
            .contains(&message.to_string()),
            "{message}"
        );
    }
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_revoked_cancels_the_sessions_of_that_lease_only() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    daemon.submit(invoke(
        "s-a",
        "lease-a",
        "cam-01",
        "record_clip",
        json!({"duration_ms": 20000}),
        60_000,
    ));
    daemon.submit(invoke(
        "s-b",
        "lease-b",
        "robot-01",
        "tap",
        json!({"x_mm": 10.0, "y_mm": 10.0}),
        60_000,
    ));
    wait_running(&daemon, "s-a").await;
    daemon.submit(envelope(
        MessageType::LeaseRevoked,
        &json!({"lease_id": "lease-a", "capability_id": "cam-01", "reason": "expired"}),
    ));
    let a = final_updates(&daemon, "s-a", Duration::from_secs(5)).await;
    assert_eq!(a.last().unwrap()["status"], "cancelled");
    assert!(a.last().unwrap()["error_message"]
        .as_str()
        .unwrap()
        .contains("lease-a revoked"));
    let b = final_updates(&daemon, "s-b", Duration::from_secs(10)).await;
    assert_eq!(b.last().unwrap()["status"], "completed");
    daemon.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_cancels_what_is_running_and_keeps_the_updates() {
    let dir = tempfile::tempdir().unwrap();
    let daemon = start(dir.path()).await;
    daemon.submit(invoke(
        "s-long",
        "l-1",
        "cam-01",
        "record_clip",
        json!({"duration_ms": 20000}),
        60_000,
    ));
    wait_running(&daemon, "s-long").await;
    let outbox = daemon.outbox().clone();
    let t = Instant::now();
    daemon.shutdown().await;
    assert!(t.elapsed() < Duration::from_secs(10));
    let queued = tokio::task::spawn_blocking(move || outbox.queued_updates(100))
        .await
        .unwrap()
        .unwrap();
    let last = queued
        .iter()
        .rev()
        .filter_map(|q| Envelope::parse(&q.payload).ok())
        .find(|e| e.body["session_id"] == "s-long")
        .unwrap();
    assert_eq!(last.body["status"], "cancelled");
    assert!(last.body["error_message"]
        .as_str()
        .unwrap()
        .contains("shutting down"));
}

#[test]
fn the_binary_tells_systemd_ready_watchdog_and_stopping() {
    let dir = tempfile::tempdir().unwrap();
    let config = bench_config(dir.path());
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    // As systemd does: WATCHDOG_PID is the service's main pid (the shell's
    // pid, which `exec` hands to edge-agent); a 1 s watchdog means pings
    // every 500 ms.
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("WATCHDOG_PID=$$ exec \"$0\" run --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_edge-agent"))
        .arg(&config)
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "1000000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut messages = Vec::new();
    let mut buf = [0u8; 4096];
    let until = Instant::now() + Duration::from_secs(15);
    let mut sent_term = false;
    while Instant::now() < until {
        if let Ok(n) = sock.recv(&mut buf) {
            messages.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        let pings = messages.iter().filter(|m| m.contains("WATCHDOG=1")).count();
        if !sent_term && pings >= 3 {
            // SAFETY: plain syscall on our own child's pid.
            unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
            sent_term = true;
        }
        if messages.iter().any(|m| m.contains("STOPPING=1")) && child.try_wait().unwrap().is_some()
        {
            break;
        }
    }
    let _ = child.kill();
    let status = child.wait().unwrap();
    assert!(
        messages.iter().any(|m| m.contains("READY=1")),
        "{messages:?}"
    );
    assert!(
        messages.iter().filter(|m| m.contains("WATCHDOG=1")).count() >= 3,
        "watchdog pings at half the interval: {messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("STATUS=2 capabilities")),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("STOPPING=1")),
        "{messages:?}"
    );
    assert_eq!(status.code(), Some(0));
}

/// systemd restarts a hung daemon only if the pings stop: while another
/// process keeps the outbox database locked (no evidence could be stored)
/// the daemon withholds them and says why; once let go they come back.
#[test]
fn a_locked_outbox_withholds_the_watchdog_ping_until_it_is_free() {
    let dir = tempfile::tempdir().unwrap();
    let config = bench_config(dir.path());
    let sock_path = dir.path().join("notify.sock");
    let sock = UnixDatagram::bind(&sock_path).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let mut child = Command::new("sh")
        .arg("-c")
        .arg("WATCHDOG_PID=$$ exec \"$0\" run --config \"$1\"")
        .arg(env!("CARGO_BIN_EXE_edge-agent"))
        .arg(&config)
        .env("NOTIFY_SOCKET", &sock_path)
        .env("WATCHDOG_USEC", "1000000")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut messages: Vec<(Instant, String)> = Vec::new();
    let mut buf = [0u8; 4096];
    let mut collect = |messages: &mut Vec<(Instant, String)>, for_: Duration| {
        let until = Instant::now() + for_;
        while Instant::now() < until {
            if let Ok(n) = sock.recv(&mut buf) {
                messages.push((
                    Instant::now(),
                    String::from_utf8_lossy(&buf[..n]).into_owned(),
                ));
            }
        }
    };
    let pings_since = |messages: &[(Instant, String)], t: Instant| {
        messages
            .iter()
            .filter(|(at, m)| *at >= t && m.contains("WATCHDOG=1"))
            .count()
    };
    let started = Instant::now();
    collect(&mut messages, Duration::from_secs(4));
    assert!(
        pings_since(&messages, started) >= 2,
        "pings while healthy: {messages:?}"
    );

    let other = rusqlite::Connection::open(dir.path().join("state/outbox.sqlite3")).unwrap();
    other.execute_batch("BEGIN IMMEDIATE").unwrap();
    // A probe that had already passed may still ping once.
    collect(&mut messages, Duration::from_millis(1500));
    let locked_at = Instant::now();
    collect(&mut messages, Duration::from_secs(6));
    assert_eq!(
        pings_since(&messages, locked_at),
        0,
        "no ping while the outbox is locked: {messages:?}"
    );
    assert!(
        messages
            .iter()
            .any(|(_, m)| m.contains("STATUS=unhealthy: the outbox database")),
        "{messages:?}"
    );

    other.execute_batch("ROLLBACK").unwrap();
    let released_at = Instant::now();
    collect(&mut messages, Duration::from_secs(12));
    let _ = child.kill();
    let _ = child.wait();
    assert!(
        pings_since(&messages, released_at) >= 1,
        "pings resume once the outbox is free: {messages:?}"
    );
}
