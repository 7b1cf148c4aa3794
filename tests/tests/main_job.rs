//! The main job across real processes: `bench-sim`, `cloud-registry` and
//! `edge-agent` started by the lab harness, driven through the public HTTP
//! API only. The tests run one at a time (each starts a whole lab).
//!
//! Broker variants: the registry's embedded broker; the shared Mosquitto
//! at 127.0.0.1:1883 (unique topic prefix; `require_mosquitto()` fails
//! under `CI=true` when it is missing); and a private Mosquitto on a free
//! port for the tests that stop and restart the broker.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{
    caps, unique_topic_prefix, Broker, Lab, LabOptions, CHIEF_AGENT, DUT_BANNER, HW_AGENT,
    PROVIDER_ID,
};
use benchlink_e2e::client::{follow_events, group_leases, sha256_hex, Agent, EventLog};
use benchlink_e2e::scenario::{run_main_job, MainJobReport};
use benchlink_e2e::{eventually, require_mosquitto};
use benchlink_testkit::status_is;
use reqwest::StatusCode;
use serde_json::{json, Value};

static ONE_LAB_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

async fn one_lab_at_a_time() -> tokio::sync::MutexGuard<'static, ()> {
    ONE_LAB_AT_A_TIME.lock().await
}

fn say(line: String) {
    println!("{line}");
}

struct Agents {
    hw: Agent,
    chief: Agent,
    admin: Agent,
    events: EventLog,
    follower: tokio::task::JoinHandle<()>,
}

impl Agents {
    fn of(lab: &Lab) -> Self {
        let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
        let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);
        let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
        let (events, follower) = follow_events(&admin, |_| {});
        Agents {
            hw,
            chief,
            admin,
            events,
            follower,
        }
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

async fn running_sessions(admin: &Agent) -> Vec<Value> {
    admin
        .get_ok("/api/v1/sessions?status=running")
        .await
        .expect("list running sessions")["sessions"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// What every run of the main job must show.
async fn assert_main_job(report: &MainJobReport, a: &Agents) {
    assert!(!report.artifacts.is_empty());
    for v in &report.artifacts {
        assert!(
            v.intact(),
            "downloaded bytes of {} hash to {}, the edge computed {}",
            v.artifact["artifact_id"],
            v.downloaded_sha256,
            v.artifact["checksum"]
        );
        assert_eq!(v.artifact["uploaded"], true);
    }
    let types: Vec<&str> = report
        .artifacts
        .iter()
        .filter_map(|v| v.artifact["artifact_type"].as_str())
        .collect();
    for t in ["image", "serial_log", "sensor_dump"] {
        assert!(types.contains(&t), "no {t} artifact among {types:?}");
    }
    // The banner was matched on the real console driver, and the supply
    // measured what it was set to.
    assert!(
        report.banner_session["result_summary"]
            .to_string()
            .contains(DUT_BANNER),
        "{}",
        report.banner_session
    );
    let v = report.measurement["result_summary"]["voltage_v"]
        .as_f64()
        .unwrap_or(0.0);
    assert!((v - 5.0).abs() < 0.05, "measured {v} V");
    // Preemption: refused with the lease status, the new holder works.
    let (status, body) = &report.refused_after_preemption;
    assert_eq!(*status, 409, "{body}");
    assert_eq!(body["error"]["code"], "lease_not_usable");
    assert_eq!(body["error"]["details"]["lease_status"], "revoked");
    assert_eq!(report.new_holder_tap["status"], "completed");
    let robot = &report.hw_leases[caps::ROBOT];
    let kinds: Vec<(&str, &str)> = report
        .timeline
        .iter()
        .filter_map(|e| Some((e["event_type"].as_str()?, e["lease_id"].as_str()?)))
        .collect();
    for (t, l) in [
        ("lease_preempt_requested", robot.as_str()),
        ("lease_preempted", robot.as_str()),
        ("lease_granted", report.chief_robot_lease.as_str()),
    ] {
        assert!(kinds.contains(&(t, l)), "{t} for {l} missing: {kinds:?}");
    }
    for s in &report.sessions {
        assert_eq!(s["status"], "completed", "{s}");
    }
    assert!(running_sessions(&a.admin).await.is_empty());
}

async fn main_job_on(broker: Broker, topic_prefix: String) {
    let lab = Lab::start(LabOptions {
        broker,
        topic_prefix,
        ..Default::default()
    })
    .await
    .expect("lab starts");
    let a = Agents::of(&lab);
    let report = run_main_job(&a.hw, &a.chief, &a.admin, &a.events, &say)
        .await
        .expect("the main job runs");
    assert_main_job(&report, &a).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_job_runs_end_to_end_on_the_embedded_broker() {
    let _one = one_lab_at_a_time().await;
    main_job_on(Broker::Embedded, unique_topic_prefix()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_main_job_runs_end_to_end_on_mosquitto() {
    if !require_mosquitto() {
        return;
    }
    let _one = one_lab_at_a_time().await;
    main_job_on(
        Broker::External {
            host: "127.0.0.1".into(),
            port: 1883,
        },
        unique_topic_prefix(),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_actions_say_why_and_leave_no_session_running() {
    let _one = one_lab_at_a_time().await;
    let mut lab = Lab::start(LabOptions::default()).await.expect("lab");
    let a = Agents::of(&lab);
    let (s, lease) =
        a.hw.lease(caps::PSU, 75, "supply checks", None, 5)
            .await
            .unwrap();
    assert_eq!(s, StatusCode::CREATED, "{lease}");
    let psu = lease["lease_id"].as_str().unwrap().to_string();

    // Not the holder.
    let (_, body) = status_is(
        a.chief
            .act(&psu, "measure_output", json!({}), 5000)
            .await
            .unwrap(),
        StatusCode::FORBIDDEN,
    );
    assert_eq!(body["error"]["code"], "not_lease_holder");

    // Parameters the driver rejects: above the bench's 12 V limit.
    let (s, session) =
        a.hw.act(&psu, "set_voltage", json!({"voltage_v": 50.0}), 10_000)
            .await
            .unwrap();
    assert_eq!(s, StatusCode::OK, "{session}");
    assert_eq!(session["status"], "failed");
    let message = session["error_message"].as_str().unwrap_or_default();
    assert!(message.contains("voltage_v"), "{message}");
    // Unknown parameter names are refused by the driver too.
    let (_, session) =
        a.hw.act(&psu, "set_voltage", json!({"volts": 5.0}), 10_000)
            .await
            .unwrap();
    assert_eq!(session["status"], "failed", "{session}");

    // Offline provider: the bench dies without a goodbye; its last will
    // marks it offline.
    lab.kill_edge();
    eventually(Duration::from_secs(20), "provider offline", || async {
        let p = a
            .admin
            .get_ok(&format!("/api/v1/capability-providers/{PROVIDER_ID}"))
            .await
            .ok()?;
        (p["online_status"] == "offline").then_some(())
    })
    .await;
    let (s, body) =
        a.hw.act(&psu, "measure_output", json!({}), 5000)
            .await
            .unwrap();
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(body["error"]["code"], "provider_offline");
    let sessions = a
        .admin
        .get_ok(&format!("/api/v1/capability-leases/{psu}/sessions"))
        .await
        .unwrap();
    assert_eq!(
        sessions["sessions"].as_array().unwrap().len(),
        2,
        "only the two sessions the driver refused: {sessions}"
    );
    assert!(running_sessions(&a.admin).await.is_empty());

    // Back online, the same lease works again.
    lab.start_edge().expect("edge restarts");
    lab.wait_registered(Duration::from_secs(30)).await.unwrap();
    let s =
        a.hw.act_ok(&psu, "measure_output", json!({}))
            .await
            .unwrap();
    assert_eq!(s["status"], "completed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_a_broker_restart_mid_lease_the_lease_renews_and_actions_work() {
    let _one = one_lab_at_a_time().await;
    let Some((_dir, mut broker, lab)) =
        Lab::start_on_private_mosquitto(LabOptions::default()).await
    else {
        return;
    };
    let a = Agents::of(&lab);
    let (s, lease) =
        a.hw.lease(caps::CAMERA, 70, "watch the DUT", None, 5)
            .await
            .unwrap();
    assert_eq!(s, StatusCode::CREATED, "{lease}");
    let cam = lease["lease_id"].as_str().unwrap().to_string();
    a.hw.act_ok(&cam, "snapshot", json!({})).await.unwrap();

    broker.stop();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let restarted_at = chrono::Utc::now();
    broker.resume().expect("broker back");
    a.admin
        .wait_reconnected(PROVIDER_ID, restarted_at, Duration::from_secs(40))
        .await
        .unwrap();

    let (_, renewed) = status_is(a.hw.renew(&cam).await.unwrap(), StatusCode::OK);
    assert_eq!(renewed["status"], "active");
    let snap = a.hw.act_ok(&cam, "snapshot", json!({})).await.unwrap();
    let uploaded =
        a.hw.wait_artifacts_uploaded(std::slice::from_ref(&cam), Duration::from_secs(20))
            .await
            .unwrap();
    assert_eq!(uploaded.len(), 2, "one image per snapshot");
    let id = snap["artifact_refs"][0].as_str().unwrap();
    let d = a.hw.download(id).await.unwrap();
    let meta = uploaded.iter().find(|x| x["artifact_id"] == id).unwrap();
    assert_eq!(sha256_hex(&d.bytes), meta["checksum"].as_str().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edge_killed_mid_upload_delivers_every_artifact_exactly_once_after_restart() {
    let _one = one_lab_at_a_time().await;
    let mut lab = Lab::start(LabOptions::default()).await.expect("lab");
    let a = Agents::of(&lab);
    let group =
        a.hw.lease_group(
            &[caps::CAMERA, caps::MICROPHONE, caps::SCREEN],
            70,
            "evidence under a crash",
            10,
        )
        .await
        .unwrap();
    let leases = group_leases(&group);
    let lease_ids: Vec<String> = leases.values().cloned().collect();
    // Evidence on three capabilities at once: clips, audio, screenshots.
    let mut calls = Vec::new();
    for (cap, action, params) in [
        (caps::CAMERA, "record_clip", json!({"duration_ms": 1500})),
        (
            caps::MICROPHONE,
            "record_audio",
            json!({"duration_ms": 2500}),
        ),
        (caps::SCREEN, "screenshot", json!({})),
        (caps::CAMERA, "snapshot", json!({})),
        (caps::SCREEN, "screenshot", json!({})),
        (caps::CAMERA, "record_clip", json!({"duration_ms": 1500})),
    ] {
        let hw = a.hw.clone();
        let lease = leases[cap].clone();
        calls.push(tokio::spawn(async move {
            hw.act(&lease, action, params, 30_000).await
        }));
    }
    // Kill the edge as soon as the registry knows of an artifact whose
    // bytes have not arrived yet (metadata over MQTT, bytes in flight).
    let caught_in_flight = {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut caught = false;
        while Instant::now() < deadline {
            let mut waiting = 0;
            let mut known = 0;
            for l in &lease_ids {
                let v = a
                    .admin
                    .get_ok(&format!("/api/v1/artifacts?lease_id={l}"))
                    .await
                    .unwrap();
                for art in v["artifacts"].as_array().unwrap() {
                    known += 1;
                    if art["uploaded"] == false {
                        waiting += 1;
                    }
                }
            }
            if waiting > 0 && known >= 2 {
                caught = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        caught
    };
    lab.kill_edge();
    println!("edge killed with SIGKILL; an upload was in flight: {caught_in_flight}");
    for c in calls {
        let _ = c.await;
    }
    lab.start_edge().expect("edge restarts");
    lab.wait_registered(Duration::from_secs(30)).await.unwrap();

    let artifacts =
        a.hw.wait_artifacts_uploaded(&lease_ids, Duration::from_secs(60))
            .await
            .unwrap();
    assert!(artifacts.len() >= 2, "{artifacts:?}");
    for art in &artifacts {
        let id = art["artifact_id"].as_str().unwrap();
        let d = a.hw.download(id).await.unwrap();
        assert_eq!(
            sha256_hex(&d.bytes),
            art["checksum"].as_str().unwrap(),
            "artifact {id}"
        );
        assert_eq!(d.bytes.len() as u64, art["size_bytes"].as_u64().unwrap());
    }
    // Exactly once: one artifact_uploaded event per artifact.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut uploads: HashMap<String, usize> = HashMap::new();
    for e in a.events.of("artifact_uploaded") {
        *uploads
            .entry(e["artifact_id"].as_str().unwrap().to_string())
            .or_default() += 1;
    }
    for art in &artifacts {
        let id = art["artifact_id"].as_str().unwrap();
        assert_eq!(
            uploads.get(id),
            Some(&1),
            "artifact_uploaded events for {id}"
        );
    }
    eventually(
        Duration::from_secs(30),
        "no session left running",
        || async { running_sessions(&a.admin).await.is_empty().then_some(()) },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn captures_continue_through_a_30_second_broker_outage_and_nothing_is_lost() {
    let _one = one_lab_at_a_time().await;
    let Some((_dir, mut broker, lab)) =
        Lab::start_on_private_mosquitto(LabOptions::default()).await
    else {
        return;
    };
    let a = Agents::of(&lab);
    let group =
        a.hw.lease_group(
            &[caps::CAMERA, caps::MICROPHONE, caps::CONSOLE],
            70,
            "capture through an outage",
            10,
        )
        .await
        .unwrap();
    let leases = group_leases(&group);
    let lease_ids = vec![
        leases[caps::CAMERA].clone(),
        leases[caps::MICROPHONE].clone(),
        leases[caps::CONSOLE].clone(),
    ];
    let mut sessions = Vec::new();
    for (l, action, params) in [
        (&lease_ids[0], "record_clip", json!({"duration_ms": 8000})),
        (&lease_ids[1], "record_audio", json!({"duration_ms": 8000})),
        (&lease_ids[2], "capture_log", json!({"duration_ms": 8000})),
    ] {
        let (_, v) = status_is(
            a.hw.act(l, action, params, 0).await.unwrap(),
            StatusCode::ACCEPTED,
        );
        sessions.push(v["session_id"].as_str().unwrap().to_string());
    }
    // The broker goes away for 30 s while the captures run (once the
    // commands have had a moment to reach the bench).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    broker.stop();
    a.admin
        .wait_mqtt_down(Duration::from_secs(10))
        .await
        .unwrap();
    let (s, body) =
        a.hw.act(&lease_ids[0], "snapshot", json!({}), 1000)
            .await
            .unwrap();
    assert_eq!(
        s,
        StatusCode::SERVICE_UNAVAILABLE,
        "no command can be sent while the broker is down: {body}"
    );
    tokio::time::sleep(Duration::from_secs(30)).await;
    let back = chrono::Utc::now();
    broker.resume().expect("broker back");
    a.admin
        .wait_reconnected(PROVIDER_ID, back, Duration::from_secs(40))
        .await
        .unwrap();

    for id in &sessions {
        // After the reconnect back-off and the outbox drain; generous
        // because the suite may share the machine with other work.
        let s = eventually(Duration::from_secs(60), "session completed", || async {
            let s = a.hw.get_ok(&format!("/api/v1/sessions/{id}")).await.ok()?;
            (s["status"] == "completed").then_some(s)
        })
        .await;
        assert!(!s["artifact_refs"].as_array().unwrap().is_empty(), "{s}");
    }
    let artifacts =
        a.hw.wait_artifacts_uploaded(&lease_ids, Duration::from_secs(30))
            .await
            .unwrap();
    assert!(artifacts.len() >= 3, "{artifacts:?}");
    for art in &artifacts {
        let id = art["artifact_id"].as_str().unwrap();
        let d = a.hw.download(id).await.unwrap();
        assert_eq!(
            sha256_hex(&d.bytes),
            art["checksum"].as_str().unwrap(),
            "{id}"
        );
    }
    // Commands work again.
    let snap =
        a.hw.act_ok(&lease_ids[0], "snapshot", json!({}))
            .await
            .unwrap();
    assert_eq!(snap["status"], "completed");
    assert!(running_sessions(&a.admin).await.is_empty());
}
