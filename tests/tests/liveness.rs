//! Provider liveness across real processes, with the registry on an
//! external broker (a private Mosquitto on a free port that the test stops
//! and starts again). Silence counts against a provider only while the
//! registry itself can hear: while its MQTT link is down nobody is judged,
//! and after the link returns every provider has a full offline timeout to
//! be heard again. A provider that really goes silent is still marked
//! offline. The last wills a broker publishes as it shuts down gracefully
//! take nobody offline, and a session that ends while the registry is
//! stopped completes once it is back (the broker queued the result in the
//! registry's persistent session). A registry whose process was stopped
//! longer than the offline timeout blames nobody for its own absence. Under `CI=true` a missing `mosquitto`
//! fails the test.
//!
//! One test runs on the embedded broker instead, which starts with the
//! registry: there a bench whose edge is dead when the registry restarts is
//! offline as soon as the API answers.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, Lab, LabOptions, Mosquitto, HW_AGENT, PROVIDER_ID};
use benchlink_e2e::client::{follow_events, group_leases, Agent, EventLog};
use benchlink_e2e::{eventually, Paused};
use benchlink_testkit::status_is;
use chrono::{DateTime, Utc};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tempfile::TempDir;

/// Heartbeat interval the registry asks for, seconds.
const INTERVAL_S: u32 = 1;
/// Missed intervals before a provider is offline: the offline timeout
/// (15 s) is longer than the edge's longest reconnection wait (10 s), so
/// the edge can always be heard within the window that follows a broker
/// outage.
const MISSED: u32 = 15;
const OFFLINE_AFTER: Duration = Duration::from_secs(INTERVAL_S as u64 * MISSED as u64);
/// Twice the offline timeout.
const OUTAGE: Duration = Duration::from_secs(30);
/// A second provider that reports over HTTP only.
const HTTP_PROVIDER: &str = "provider-http-01";
const HTTP_CAMERA: &str = "cam-http-01";

/// A lab on a private Mosquitto (which the test may stop and start) with
/// this file's heartbeat timing, and its admin and hardware agents.
struct MosquittoLab {
    _dir: TempDir,
    broker: Mosquitto,
    lab: Lab,
    admin: Agent,
    hw: Agent,
    /// Every event since the start (the follower ends with the test's
    /// runtime).
    events: EventLog,
}

/// Start a [`MosquittoLab`]; `None` when `mosquitto` is not installed and
/// `CI` is not `true` (under CI it fails).
async fn mosquitto_lab() -> Option<MosquittoLab> {
    let (dir, broker, lab) = Lab::start_on_private_mosquitto(LabOptions {
        heartbeat_interval_seconds: INTERVAL_S,
        offline_after_missed: MISSED,
        ..Default::default()
    })
    .await?;
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (events, _follower) = follow_events(&admin, |_| {});
    Some(MosquittoLab {
        _dir: dir,
        broker,
        lab,
        admin,
        hw,
        events,
    })
}

/// `capability_health_changed` events that took a capability of
/// `provider_id` offline.
fn offline_events(events: &EventLog, provider_id: &str) -> Vec<Value> {
    events
        .of("capability_health_changed")
        .into_iter()
        .filter(|e| e["provider_id"] == provider_id && e["data"]["status"] == "offline")
        .collect()
}

async fn provider(admin: &Agent, provider_id: &str) -> Value {
    admin
        .get_ok(&format!("/api/v1/capability-providers/{provider_id}"))
        .await
        .expect("provider")
}

/// Register [`HTTP_PROVIDER`] with one camera over HTTP, as a provider.
async fn register_http_provider(p: &Agent) {
    let _ = status_is(
        p.post(
            "/api/v1/capability-providers/register",
            &json!({
                "provider_id": HTTP_PROVIDER,
                "node_id": "http-bench-01",
                "hostname": "http-bench-01.local",
                "platform": "linux",
                "gateway_version": "0.1.0",
                "network_zone": "lan",
                "labels": ["http-only"],
                "boot_id": "boot-http-1"
            }),
        )
        .await
        .unwrap(),
        StatusCode::OK,
    );
    let _ = status_is(
        p.post(
            "/api/v1/capabilities/register",
            &json!({
                "provider_id": HTTP_PROVIDER,
                "capabilities": [{
                    "capability_id": HTTP_CAMERA,
                    "capability_type": "camera",
                    "display_name": "HTTP bench camera",
                    "lease_mode": "exclusive",
                    "preemptible": true,
                    "supported_actions": ["snapshot"],
                    "evidence_modes": ["image"]
                }]
            }),
        )
        .await
        .unwrap(),
        StatusCode::OK,
    );
}

/// Heartbeats of [`HTTP_PROVIDER`] over HTTP every interval until `stop`
/// is set. Returns the time of the latest answered heartbeat.
fn http_heartbeats(p: Agent, stop: Arc<AtomicBool>) -> Arc<Mutex<DateTime<Utc>>> {
    let last = Arc::new(Mutex::new(Utc::now()));
    let last_ok = last.clone();
    tokio::spawn(async move {
        while !stop.load(Ordering::SeqCst) {
            let sent = p
                .post(
                    "/api/v1/capabilities/heartbeat",
                    &json!({"provider_id": HTTP_PROVIDER, "boot_id": "boot-http-1"}),
                )
                .await;
            if matches!(sent, Ok((StatusCode::OK, _))) {
                *last_ok.lock().unwrap() = Utc::now();
            }
            tokio::time::sleep(Duration::from_secs(u64::from(INTERVAL_S))).await;
        }
    });
    last
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_outage_longer_than_the_offline_timeout_takes_no_provider_offline() {
    let Some(MosquittoLab {
        _dir,
        mut broker,
        lab,
        admin,
        hw,
        events,
    }) = mosquitto_lab().await
    else {
        return;
    };

    // A second provider that heartbeats over HTTP only, through the outage.
    let (_, minted) = status_is(
        admin
            .post(
                "/api/v1/auth/tokens",
                &json!({"role": "provider", "name": HTTP_PROVIDER}),
            )
            .await
            .unwrap(),
        StatusCode::CREATED,
    );
    let http_provider = Agent::new(
        &lab.base_url,
        HTTP_PROVIDER,
        minted["token"].as_str().unwrap(),
    );
    register_http_provider(&http_provider).await;
    let stop_beats = Arc::new(AtomicBool::new(false));
    let last_beat = http_heartbeats(http_provider, stop_beats.clone());

    // A capture runs on the bench across the outage (its deadline is far
    // beyond it, so only liveness could end it early).
    let group = hw
        .lease_group(
            &[caps::CAMERA, caps::CONSOLE],
            70,
            "capture through an outage",
            10,
        )
        .await
        .unwrap();
    let leases = group_leases(&group);
    let (camera_lease, console_lease) = (&leases[caps::CAMERA], &leases[caps::CONSOLE]);
    let session_id = hw
        .start_action(
            console_lease,
            &json!({
                "action": "capture_log",
                "params": {"duration_ms": 8000},
                "wait_ms": 0,
                "timeout_ms": 180_000
            }),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    // The broker goes away for twice the offline timeout.
    broker.stop();
    admin.wait_mqtt_down(Duration::from_secs(10)).await.unwrap();
    tokio::time::sleep(OUTAGE).await;
    assert_eq!(
        offline_events(&events, PROVIDER_ID),
        Vec::<Value>::new(),
        "the bench was marked offline while the registry could not hear it"
    );
    let back = Utc::now();
    broker.resume().expect("broker back");

    // Both ends reconnect; the bench is heard again.
    admin
        .wait_reconnected(PROVIDER_ID, back, Duration::from_secs(40))
        .await
        .unwrap();
    let reconnected = Instant::now();
    let session = eventually(Duration::from_secs(60), "the capture completes", || async {
        let s = hw
            .get_ok(&format!("/api/v1/sessions/{session_id}"))
            .await
            .ok()?;
        (s["status"] != "running").then_some(s)
    })
    .await;
    assert_eq!(session["status"], "completed", "{session}");
    assert!(
        !session["artifact_refs"].as_array().unwrap().is_empty(),
        "{session}"
    );
    let snap = hw
        .act_ok(camera_lease, "snapshot", json!({}))
        .await
        .unwrap();
    assert_eq!(snap["status"], "completed");

    // Past a whole offline timeout after the link returned, both providers
    // are online and nothing was ever taken offline or failed.
    let settled = reconnected + OFFLINE_AFTER + Duration::from_secs(2);
    tokio::time::sleep(settled.saturating_duration_since(Instant::now())).await;
    for id in [PROVIDER_ID, HTTP_PROVIDER] {
        let p = provider(&admin, id).await;
        assert_eq!(p["online_status"], "online", "{p}");
        assert_eq!(offline_events(&events, id), Vec::<Value>::new(), "{id}");
    }
    assert_eq!(events.of("session_failed"), Vec::<Value>::new());

    // A provider that really goes silent while the registry can hear is
    // still marked offline, once the offline timeout has passed.
    stop_beats.store(true, Ordering::SeqCst);
    let went = events
        .wait_for(
            "the silent provider's camera offline",
            OFFLINE_AFTER + Duration::from_secs(10),
            |e| {
                e["event_type"] == "capability_health_changed"
                    && e["provider_id"] == HTTP_PROVIDER
                    && e["data"]["status"] == "offline"
            },
        )
        .await
        .unwrap();
    assert_eq!(went["data"]["reason"], "missed heartbeats", "{went}");
    // The registry's own clock: the event's time against the last answered
    // heartbeat (which the registry recorded a little before it answered).
    let silent_since = *last_beat.lock().unwrap();
    let marked_at: DateTime<Utc> = went["occurred_at"].as_str().unwrap().parse().unwrap();
    let silence = (marked_at - silent_since).to_std().unwrap_or_default();
    assert!(
        silence + Duration::from_millis(500) >= OFFLINE_AFTER,
        "marked offline after {silence:?} of silence, before the offline timeout"
    );
    assert_eq!(
        provider(&admin, HTTP_PROVIDER).await["online_status"],
        "offline"
    );
    assert_eq!(
        provider(&admin, PROVIDER_ID).await["online_status"],
        "online"
    );
}

/// Start a `capture_log` of `duration_ms` on the bench's console (with the
/// camera leased alongside); returns the camera lease and the session id.
async fn start_capture(hw: &Agent, duration_ms: u64, purpose: &str) -> (String, String) {
    start_capture_with_timeout(hw, duration_ms, 180_000, purpose).await
}

/// [`start_capture`] with the action's `timeout_ms`.
async fn start_capture_with_timeout(
    hw: &Agent,
    duration_ms: u64,
    timeout_ms: u64,
    purpose: &str,
) -> (String, String) {
    let group = hw
        .lease_group(&[caps::CAMERA, caps::CONSOLE], 70, purpose, 10)
        .await
        .unwrap();
    let leases = group_leases(&group);
    let (_, v) = status_is(
        hw.post(
            &format!(
                "/api/v1/capability-leases/{}/actions",
                leases[caps::CONSOLE]
            ),
            &json!({
                "action": "capture_log",
                "params": {"duration_ms": duration_ms},
                "wait_ms": 0,
                "timeout_ms": timeout_ms
            }),
        )
        .await
        .unwrap(),
        StatusCode::ACCEPTED,
    );
    (
        leases[caps::CAMERA].to_string(),
        v["session_id"].as_str().unwrap().to_string(),
    )
}

/// Wait for the session to leave `running`; returns it.
async fn session_end(hw: &Agent, session_id: &str, timeout: Duration) -> Value {
    eventually(timeout, "the capture ends", || async {
        let s = hw
            .get_ok(&format!("/api/v1/sessions/{session_id}"))
            .await
            .ok()?;
        (s["status"] != "running").then_some(s)
    })
    .await
}

/// After a disturbance (`cause`): the capture `session_id` completed with
/// its artifacts, the camera still takes a snapshot, no capability of the
/// bench went offline, no session failed, and the bench is online.
async fn assert_unharmed(
    admin: &Agent,
    hw: &Agent,
    events: &EventLog,
    camera_lease: &str,
    session_id: &str,
    cause: &str,
) {
    let session = session_end(hw, session_id, Duration::from_secs(60)).await;
    assert_eq!(session["status"], "completed", "{session}");
    assert!(
        !session["artifact_refs"].as_array().unwrap().is_empty(),
        "{session}"
    );
    let snap = hw
        .act_ok(camera_lease, "snapshot", json!({}))
        .await
        .unwrap();
    assert_eq!(snap["status"], "completed");
    assert_eq!(
        offline_events(events, PROVIDER_ID),
        Vec::<Value>::new(),
        "the bench was taken offline by {cause}"
    );
    assert_eq!(events.of("session_failed"), Vec::<Value>::new());
    assert_eq!(
        provider(admin, PROVIDER_ID).await["online_status"],
        "online"
    );
}

/// `systemctl restart mosquitto`: on SIGTERM the broker publishes the last
/// wills of the clients it closes (the bench's "offline") before it closes
/// the registry's own connection. The registry drops those wills: its link
/// went down within the confirmation delay, so the outage is the broker's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_graceful_broker_restart_takes_no_provider_offline() {
    let Some(MosquittoLab {
        _dir,
        mut broker,
        lab: _lab,
        admin,
        hw,
        events,
    }) = mosquitto_lab().await
    else {
        return;
    };

    // The capture outlasts the restart and both reconnections, so it ends
    // while both ends are connected again.
    let (camera_lease, session_id) = start_capture(&hw, 25_000, "capture through a restart").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    broker.terminate();
    admin.wait_mqtt_down(Duration::from_secs(10)).await.unwrap();
    // Longer than the confirmation delay: a will acted on would show.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let back = Utc::now();
    broker.resume().expect("broker back");
    admin
        .wait_reconnected(PROVIDER_ID, back, Duration::from_secs(40))
        .await
        .unwrap();

    assert_unharmed(
        &admin,
        &hw,
        &events,
        &camera_lease,
        &session_id,
        "the wills of a broker shutdown",
    )
    .await;
}

/// The registry is away while the bench reports the end of a session: the
/// broker holds the registry's persistent session and queues the final
/// `session_update` (which it acknowledges to the bench at once), and hands
/// it over when the registry is back, so the session completes with its
/// result instead of failing for want of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_that_ends_while_the_registry_is_down_completes_when_it_returns() {
    let Some(MosquittoLab {
        _dir,
        broker: _broker,
        mut lab,
        admin,
        hw,
        events: _,
    }) = mosquitto_lab().await
    else {
        return;
    };

    let (_camera, session_id) =
        start_capture(&hw, 4000, "capture while the registry is away").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    lab.stop_registry();
    // The capture ends and the bench sends its final update meanwhile.
    tokio::time::sleep(Duration::from_secs(8)).await;
    lab.start_registry().expect("registry back");

    let session = session_end(&hw, &session_id, Duration::from_secs(60)).await;
    assert_eq!(session["status"], "completed", "{session}");
    assert!(
        !session["artifact_refs"].as_array().unwrap().is_empty(),
        "{session}"
    );
    assert_eq!(
        provider(&admin, PROVIDER_ID).await["online_status"],
        "online"
    );
}

/// The final `session_update` of `session_id` as it passes through the
/// broker on `results`, seen by a client of the test's own.
async fn watch_final_update(
    port: u16,
    prefix: &str,
    session_id: &str,
) -> tokio::task::JoinHandle<Value> {
    let mut opts = rumqttc::MqttOptions::new("liveness-observer", "127.0.0.1", port);
    opts.set_max_packet_size(8 << 20, 8 << 20);
    let (client, mut el) = rumqttc::AsyncClient::new(opts, 16);
    let results = format!("{prefix}/providers/{PROVIDER_ID}/results");
    client
        .subscribe(&results, rumqttc::QoS::AtLeastOnce)
        .await
        .unwrap();
    let session_id = session_id.to_string();
    let (subscribed_tx, subscribed) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let _client = client;
        let mut subscribed_tx = Some(subscribed_tx);
        loop {
            match el.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::SubAck(_))) => {
                    if let Some(tx) = subscribed_tx.take() {
                        let _ = tx.send(());
                    }
                }
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::Publish(p))) => {
                    let env: Value = serde_json::from_slice(&p.payload).unwrap_or_default();
                    let body = &env["body"];
                    if body["session_id"] == session_id.as_str() && body["status"] != "running" {
                        return body.clone();
                    }
                }
                Ok(_) => {}
                Err(e) => panic!("observer lost the broker: {e}"),
            }
        }
    });
    tokio::time::timeout(Duration::from_secs(10), subscribed)
        .await
        .expect("observer subscribed")
        .unwrap();
    task
}

/// A broker that loses its state (Mosquitto with `persistence false`,
/// killed and started again) forgets the registry's persistent session. If
/// the bench reconnects first, its final `session_update` is acknowledged
/// by the broker with nobody of the registry's subscribed, and the bench's
/// outbox lets it go. The registry, once back, sees the bench's `online`
/// status and asks for its open sessions (`session_sync`): the bench sends
/// the result again and the session completes, long before its deadline.
/// Here the registry is held stopped (SIGSTOP) until the result has passed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_result_the_broker_took_while_the_registry_was_not_subscribed_is_reported_again() {
    let Some(MosquittoLab {
        _dir,
        mut broker,
        lab,
        admin: _,
        hw,
        events,
    }) = mosquitto_lab().await
    else {
        return;
    };

    // Its deadline (180 s) is far beyond the test: only its result ends it.
    let (camera_lease, session_id) =
        start_capture(&hw, 5000, "capture across a broker that forgets").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;

    let paused = Paused::pause(lab.registry.as_ref().expect("registry").pid());
    broker.stop();
    broker.resume().expect("broker back");
    let seen = watch_final_update(lab.mqtt_port, &lab.opts.topic_prefix, &session_id).await;
    let passed = tokio::time::timeout(Duration::from_secs(40), seen)
        .await
        .expect("the bench sent its result while the registry was stopped")
        .unwrap();
    assert_eq!(passed["status"], "completed", "{passed}");
    drop(paused);

    let session = session_end(&hw, &session_id, Duration::from_secs(30)).await;
    assert_eq!(session["status"], "completed", "{session}");
    let refs = session["artifact_refs"].as_array().unwrap();
    assert_eq!(refs.len(), passed["artifacts"].as_array().unwrap().len());
    assert!(!refs.is_empty(), "{session}");
    assert_eq!(events.of("session_failed"), Vec::<Value>::new());
    let snap = hw
        .act_ok(&camera_lease, "snapshot", json!({}))
        .await
        .unwrap();
    assert_eq!(snap["status"], "completed");
}

/// The registry's process is stopped (SIGSTOP, as a debugger or a frozen
/// VM would) for longer than the offline timeout while the bench keeps
/// running and heartbeating into the broker, and shorter than the broker's
/// keep-alive limit, so the registry's connection survives and its link
/// is still up when it runs again. Then every overdue timer fires at once;
/// the registry must not count its own absence as the bench's silence: no
/// capability goes offline, and the capture running across the stop
/// completes with its artifacts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registry_stopped_longer_than_the_offline_timeout_blames_no_provider() {
    // Offline after 4 s of silence; the broker drops the registry's
    // connection after 1.5 x its 5 s keep-alive.
    let Some((_dir, _broker, lab)) = Lab::start_on_private_mosquitto(LabOptions {
        heartbeat_interval_seconds: 1,
        offline_after_missed: 4,
        ..Default::default()
    })
    .await
    else {
        return;
    };
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (events, _follower) = follow_events(&admin, |_| {});

    // Ends a few seconds after the registry runs again.
    let (camera_lease, session_id) =
        start_capture(&hw, 12_000, "capture across a stopped registry").await;
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let paused = Paused::pause(lab.registry.as_ref().expect("registry").pid());
    tokio::time::sleep(Duration::from_secs(6)).await;
    drop(paused);

    assert_unharmed(
        &admin,
        &hw,
        &events,
        &camera_lease,
        &session_id,
        "the time the registry was stopped",
    )
    .await;
}

/// A planned restart of a registry with the embedded broker while the
/// bench keeps running: the capture that ends while the registry is down,
/// and whose deadline passes meanwhile too, is `running` when the registry
/// is back (neither failed because the bench was not yet heard nor for its
/// deadline while its report could not arrive), then `completed` with the
/// bench's queued result, and no `session_failed` was ever published for
/// it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_across_an_embedded_registry_restart_completes_without_a_false_failure() {
    let mut lab = Lab::start(LabOptions {
        heartbeat_interval_seconds: INTERVAL_S,
        offline_after_missed: MISSED,
        result_grace_ms: Some(500),
        ..Default::default()
    })
    .await
    .expect("lab on the embedded broker");
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (events, _follower) = follow_events(&admin, |_| {});
    // Deadline: 3.5 s + 0.5 s grace, inside the 4 s the registry is away.
    let (_, session_id) =
        start_capture_with_timeout(&hw, 3_000, 3_500, "capture across a registry restart").await;
    tokio::time::sleep(Duration::from_millis(500)).await;

    lab.stop_registry();
    // The capture ends meanwhile; the edge keeps its result queued.
    tokio::time::sleep(Duration::from_secs(4)).await;
    lab.start_registry().expect("registry back");
    let session = hw
        .get_ok(&format!("/api/v1/sessions/{session_id}"))
        .await
        .unwrap();
    assert_eq!(
        session["status"], "running",
        "not a false failure: {session}"
    );

    let session = session_end(&hw, &session_id, Duration::from_secs(30)).await;
    assert_eq!(session["status"], "completed", "{session}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let failed: Vec<Value> = events
        .of("session_failed")
        .into_iter()
        .filter(|e| e["session_id"] == session_id.as_str())
        .collect();
    assert!(failed.is_empty(), "{failed:#?}");
}

/// With the embedded broker, which starts with the registry, no provider
/// can be connected when the registry starts: a bench whose edge daemon
/// died while the registry was away is offline as soon as the API answers
/// (not only once the offline timeout has passed) and actions on its
/// capabilities are refused. Its running session is not failed for that
/// (a planned restart leaves the edge running, and it reports the result):
/// it fails once the registry has heard for a full offline timeout without
/// the bench coming back. When the edge starts again the bench is online
/// and actions work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_an_embedded_registry_restart_a_dead_edge_is_offline_at_once() {
    let mut lab = Lab::start(LabOptions {
        heartbeat_interval_seconds: INTERVAL_S,
        offline_after_missed: MISSED,
        ..Default::default()
    })
    .await
    .expect("lab on the embedded broker");
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (events, _follower) = follow_events(&admin, |_| {});
    let (camera_lease, session_id) =
        start_capture(&hw, 60_000, "capture when the registry restarts").await;
    tokio::time::sleep(Duration::from_millis(1000)).await;

    // The registry stops while the bench is online (the store keeps it
    // `online`), the edge daemon dies meanwhile, and only the registry
    // comes back.
    lab.stop_registry();
    lab.kill_edge();
    let restart = Instant::now();
    lab.start_registry().expect("registry back");
    let ready_after = restart.elapsed();

    // The first answer already says offline, far inside the offline
    // timeout.
    let p = provider(&admin, PROVIDER_ID).await;
    let answered_after = restart.elapsed();
    assert_eq!(p["online_status"], "offline", "{p}");
    assert!(answered_after < OFFLINE_AFTER / 3, "{answered_after:?}");
    let listed = admin
        .get_ok(&format!("/api/v1/capabilities?provider_id={PROVIDER_ID}"))
        .await
        .unwrap();
    for c in listed["capabilities"].as_array().unwrap() {
        assert_eq!(c["status"], "offline", "{c}");
    }
    let session = hw
        .get_ok(&format!("/api/v1/sessions/{session_id}"))
        .await
        .unwrap();
    assert_eq!(
        session["status"], "running",
        "not a false failure: {session}"
    );
    let (_, refused) = status_is(
        hw.act(&camera_lease, "snapshot", json!({}), 0)
            .await
            .unwrap(),
        StatusCode::SERVICE_UNAVAILABLE,
    );
    assert_eq!(refused["error"]["code"], "provider_offline", "{refused}");
    let went = events
        .wait_for(
            "the bench's camera offline after the restart",
            Duration::from_secs(10),
            |e| {
                e["event_type"] == "capability_health_changed"
                    && e["capability_id"] == caps::CAMERA
                    && e["data"]["status"] == "offline"
            },
        )
        .await
        .unwrap();
    assert!(
        went["data"]["reason"]
            .as_str()
            .unwrap_or_default()
            .contains("registry restarted"),
        "{went}"
    );

    // The bench stays away for a full offline timeout: its capture fails.
    let session = session_end(&hw, &session_id, OFFLINE_AFTER + Duration::from_secs(10)).await;
    let failed_after = restart.elapsed();
    assert_eq!(session["status"], "failed", "{session}");
    assert!(
        session["error_message"]
            .as_str()
            .unwrap_or_default()
            .contains("did not reconnect after the registry restarted"),
        "{session}"
    );
    assert!(failed_after >= OFFLINE_AFTER, "{failed_after:?}");

    // The edge comes back: online again, and actions work.
    let back = Instant::now();
    lab.start_edge().expect("edge back");
    lab.wait_registered(Duration::from_secs(30)).await.unwrap();
    let online_after = back.elapsed();
    assert_eq!(
        provider(&admin, PROVIDER_ID).await["online_status"],
        "online"
    );
    let snap = hw
        .act_ok(&camera_lease, "snapshot", json!({}))
        .await
        .unwrap();
    assert_eq!(snap["status"], "completed", "{snap}");
    eprintln!(
        "registry ready {ready_after:?} after the restart began, provider answered offline at \
         {answered_after:?} (offline timeout {OFFLINE_AFTER:?}); edge online again {online_after:?} \
         after it was started"
    );
}
