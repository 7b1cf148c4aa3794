//! The MQTT control plane end to end: the registry with its embedded broker
//! (rumqttd), with the shared Mosquitto at 127.0.0.1:1883 (unique topic
//! prefix per run), and with a private Mosquitto running the shipped ACL.
//! Tests that need Mosquitto fail under `CI=true` when it is missing and
//! are skipped with a printed reason otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use benchlink_testkit::mosquitto as shared_mosquitto;
use benchlink_testkit::status_is;
use benchlink_testkit::{free_port, reachable, tool_installed, wait_for, KillOnDrop};
use common::*;
use reqwest::StatusCode;
use serde_json::{json, Value};
use shared_protocol::api::Role;
use shared_protocol::mqtt::{MessageType, TopicKind};
use tempfile::TempDir;

const PREFIX: &str = "benchlink/v1";

fn register_body(provider_id: &str, suffix: &str, boot_id: &str) -> Value {
    let mut provider = provider_body(provider_id);
    provider["boot_id"] = json!(boot_id);
    json!({
        "provider": provider,
        "capabilities": capabilities_body(provider_id, suffix)["capabilities"],
    })
}

/// What a client sees of one provider: its row and its capabilities,
/// without times.
async fn provider_view(api: &Api, token: &str, provider_id: &str) -> Value {
    let (_, p) = status_is(
        api.get(
            &format!("/api/v1/capability-providers/{provider_id}"),
            Some(token),
        )
        .await,
        StatusCode::OK,
    );
    let (_, caps) = api
        .get(
            &format!("/api/v1/capabilities?provider_id={provider_id}"),
            Some(token),
        )
        .await;
    without_times(json!({ "provider": p, "capabilities": caps["capabilities"] }))
}

async fn event_types(reg: &cloud_registry::app::RunningRegistry) -> Vec<String> {
    reg.bus
        .replay(0, 1000)
        .await
        .unwrap()
        .into_iter()
        .map(|e| e.event_type.as_str().to_string())
        .collect()
}

async fn register_over_http(api: &Api, token: &str, provider_id: &str) {
    let _ = status_is(
        api.register_provider(token, &provider_body(provider_id))
            .await,
        StatusCode::OK,
    );
    let _ = status_is(
        api.register_capabilities(token, &capabilities_body(provider_id, ""))
            .await,
        StatusCode::OK,
    );
}

/// Register `provider_id` over MQTT and return the `register_ack` body.
async fn register_over_mqtt(p: &mut TestProvider, boot_id: &str) -> Value {
    let id = p.provider_id.clone();
    p.publish(
        &id,
        TopicKind::Register,
        MessageType::Register,
        &register_body(&id, "", boot_id),
    )
    .await;
    p.next_of(MessageType::RegisterAck, Duration::from_secs(5))
        .await
        .expect("register_ack on the commands topic")
        .body
}

#[tokio::test]
async fn registration_over_http_and_over_the_embedded_broker_store_the_same_rows() {
    let (d1, d2) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let over_http = start(test_config(&d1)).await;
    let over_mqtt = start(test_config(&d2)).await;
    let (api1, api2) = (
        Api::new(&over_http.base_url()),
        Api::new(&over_mqtt.base_url()),
    );
    let t1 = over_http
        .auth
        .create_token(Role::Provider, "provider-winlab-01")
        .await
        .unwrap();
    let t2 = over_mqtt
        .auth
        .create_token(Role::Provider, "provider-winlab-01")
        .await
        .unwrap();

    register_over_http(&api1, &t1, "provider-winlab-01").await;

    let addr = over_mqtt.mqtt_addr;
    let mut p = TestProvider::connect(
        &addr.ip().to_string(),
        addr.port(),
        PREFIX,
        "provider-winlab-01",
        "provider-winlab-01",
        Some(("provider-winlab-01", &t2)),
    )
    .await;
    let ack = register_over_mqtt(&mut p, "boot-1").await;
    assert_eq!(ack["accepted"], true, "{ack}");
    assert_eq!(ack["registered"], json!(["cam-front-01", "thumb-robot-01"]));
    assert_eq!(ack["heartbeat_interval_seconds"], 10);

    assert_eq!(
        provider_view(&api1, &t1, "provider-winlab-01").await,
        provider_view(&api2, &t2, "provider-winlab-01").await
    );
    assert_eq!(event_types(&over_http).await, event_types(&over_mqtt).await);
    assert_eq!(
        api2.metric("benchlink_mqtt_messages_in_total{kind=\"register\"}")
            .await,
        1
    );
    over_http.shutdown().await;
    over_mqtt.shutdown().await;
}

#[tokio::test]
async fn registration_over_http_and_over_mosquitto_store_the_same_rows() {
    if !shared_mosquitto() {
        return;
    }
    let run = uuid::Uuid::new_v4().simple().to_string();
    let prefix = format!("benchlink-test-{run}/v1");
    let provider_id = format!("provider-{}", &run[..12]);
    let (d1, d2) = (TempDir::new().unwrap(), TempDir::new().unwrap());
    let over_http = start(test_config(&d1)).await;
    let mut cfg = test_config(&d2);
    cfg.mqtt.mode = cloud_registry::config::MqttMode::External;
    cfg.mqtt.host = "127.0.0.1".into();
    cfg.mqtt.port = 1883;
    cfg.mqtt.client_id = format!("benchlink-registry-{run}");
    cfg.mqtt.topic_prefix = prefix.clone();
    let over_mqtt = start(cfg).await;
    let (api1, api2) = (
        Api::new(&over_http.base_url()),
        Api::new(&over_mqtt.base_url()),
    );
    let admin1 = over_http.admin_token.clone().unwrap();
    let admin2 = over_mqtt.admin_token.clone().unwrap();
    let (_, h) = status_is(api2.get("/healthz", None).await, StatusCode::OK);
    assert_eq!(h["mqtt"]["mode"], "external");

    register_over_http(&api1, &admin1, &provider_id).await;
    let mut p =
        TestProvider::connect("127.0.0.1", 1883, &prefix, &provider_id, &provider_id, None).await;
    let ack = register_over_mqtt(&mut p, "boot-1").await;
    assert_eq!(ack["accepted"], true, "{ack}");

    assert_eq!(
        provider_view(&api1, &admin1, &provider_id).await,
        provider_view(&api2, &admin2, &provider_id).await
    );
    assert_eq!(event_types(&over_http).await, event_types(&over_mqtt).await);
    p.client.disconnect().await.ok();
    over_http.shutdown().await;
    over_mqtt.shutdown().await;
}

/// A provider `id` with its own token, connected to `reg`'s embedded
/// broker (last will: `offline`) and registered over MQTT with boot id
/// `boot-1`.
async fn registered_provider(reg: &cloud_registry::app::RunningRegistry, id: &str) -> TestProvider {
    let token = reg.auth.create_token(Role::Provider, id).await.unwrap();
    let addr = reg.mqtt_addr;
    let mut p = TestProvider::connect(
        &addr.ip().to_string(),
        addr.port(),
        PREFIX,
        id,
        id,
        Some((id, &token)),
    )
    .await;
    register_over_mqtt(&mut p, "boot-1").await;
    p
}

#[tokio::test]
async fn a_provider_that_vanishes_without_disconnect_goes_offline_through_its_last_will() {
    let (_dir, reg, api, admin) = registry().await;
    let p = registered_provider(&reg, "p-lwt").await;
    p.publish(
        "p-lwt",
        TopicKind::Status,
        MessageType::Status,
        &json!({"provider_id": "p-lwt", "online_status": "online", "boot_id": "boot-1"}),
    )
    .await;
    let (_, cam) = api
        .get("/api/v1/capabilities/cam-front-01", Some(&admin))
        .await;
    assert_eq!(cam["status"], "available");

    // Kill the connection: the event loop (and its socket) is dropped, no
    // DISCONNECT is sent, so the broker publishes the will.
    p.task.abort();
    drop(p);

    let caps = eventually(Duration::from_secs(10), "capabilities offline", || async {
        let (_, c) = api
            .get("/api/v1/capabilities?provider_id=p-lwt", Some(&admin))
            .await;
        let all_offline = c["capabilities"]
            .as_array()
            .is_some_and(|a| !a.is_empty() && a.iter().all(|c| c["status"] == "offline"));
        all_offline.then_some(c)
    })
    .await;
    assert_eq!(caps["capabilities"].as_array().unwrap().len(), 2);
    let (_, prov) = api
        .get("/api/v1/capability-providers/p-lwt", Some(&admin))
        .await;
    assert_eq!(prov["online_status"], "offline");
    let offline_events: Vec<Value> = reg
        .bus
        .replay(0, 100)
        .await
        .unwrap()
        .into_iter()
        .filter(|e| {
            e.event_type.as_str() == "capability_health_changed" && e.data["status"] == "offline"
        })
        .map(|e| e.data)
        .collect();
    assert_eq!(offline_events.len(), 2);
    assert_eq!(offline_events[0]["previous_status"], "available");
    // Nobody reports the capabilities' health any more.
    assert_eq!(offline_events[0]["health_status"], "unknown");
    for c in caps["capabilities"].as_array().unwrap() {
        assert_eq!(c["health_status"], "unknown", "{c}");
    }
    reg.shutdown().await;
}

/// A client's last will is fixed when it connects, so a provider that
/// comes back on the same connection settings and vanishes again has the
/// broker publish the same `offline` envelope (same `message_id`) a second
/// time. A status is a state report, not a command: the repeat must take
/// the provider offline again, not be dropped as a QoS 1 redelivery.
#[tokio::test]
async fn the_same_offline_will_published_again_after_a_return_takes_the_provider_offline_again() {
    let (_dir, reg, api, admin) = registry().await;
    let p = registered_provider(&reg, "p-will").await;
    let online = json!({"provider_id": "p-will", "online_status": "online", "boot_id": "boot-1"});
    let will = envelope(
        MessageType::Status,
        &json!({"provider_id": "p-will", "online_status": "offline", "boot_id": "boot-1"}),
    );
    let status_topic = shared_protocol::mqtt::topic(PREFIX, "p-will", TopicKind::Status);
    let provider_status = |want: &'static str| {
        let (api, admin) = (&api, &admin);
        async move {
            let (_, prov) = api
                .get("/api/v1/capability-providers/p-will", Some(admin))
                .await;
            (prov["online_status"] == want).then_some(())
        }
    };
    for round in 0..2 {
        p.publish("p-will", TopicKind::Status, MessageType::Status, &online)
            .await;
        eventually(Duration::from_secs(5), "online", || {
            provider_status("online")
        })
        .await;
        p.client
            .publish(
                status_topic.clone(),
                rumqttc::QoS::AtLeastOnce,
                false,
                will.clone(),
            )
            .await
            .unwrap();
        eventually(
            Duration::from_secs(10),
            &format!("offline after will {round}"),
            || provider_status("offline"),
        )
        .await;
    }
    reg.shutdown().await;
}

#[tokio::test]
async fn heartbeat_ingestion_writes_health_snapshots_at_a_bounded_rate() {
    let (_dir, reg, api, admin) =
        registry_with(|cfg| cfg.health.snapshot_min_interval_seconds = 2).await;
    let token = reg.auth.create_token(Role::Provider, "p-hb").await.unwrap();
    let addr = reg.mqtt_addr;
    let mut p = TestProvider::connect(
        &addr.ip().to_string(),
        addr.port(),
        PREFIX,
        "p-hb",
        "p-hb",
        Some(("p-hb", &token)),
    )
    .await;
    register_over_mqtt(&mut p, "boot-1").await;
    let heartbeat = |health: &str| {
        json!({"provider_id": "p-hb", "boot_id": "boot-1", "capabilities": [
            {"capability_id": "cam-front-01", "health_status": health, "metrics": {"fps": 30}}
        ]})
    };
    let sent = std::cell::Cell::new(0u64);
    let send = |health: &'static str| {
        sent.set(sent.get() + 1);
        let body = heartbeat(health);
        let p = &p;
        async move {
            p.publish("p-hb", TopicKind::Heartbeat, MessageType::Heartbeat, &body)
                .await
        }
    };
    let processed = |n: u64| {
        let api = api.clone();
        async move {
            eventually(Duration::from_secs(5), "heartbeats processed", || async {
                (api.metric("benchlink_mqtt_messages_in_total{kind=\"heartbeat\"}")
                    .await
                    >= n)
                    .then_some(())
            })
            .await;
            // The counter moves when processing starts; let the last finish.
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    };
    let history = || async {
        let (_, h) = api
            .get(
                "/api/v1/capabilities/cam-front-01/health-history",
                Some(&admin),
            )
            .await;
        h["snapshots"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s["health_status"].as_str().unwrap().to_string())
            .collect::<Vec<_>>()
    };

    // A burst of identical heartbeats: one row (the first is a change from
    // `unknown`).
    for _ in 0..20 {
        send("healthy").await;
    }
    processed(sent.get()).await;
    assert_eq!(history().await, ["healthy"]);

    // After the minimum interval the next identical heartbeat writes one
    // row; the rest of the burst none.
    tokio::time::sleep(Duration::from_millis(2100)).await;
    for _ in 0..10 {
        send("healthy").await;
    }
    processed(sent.get()).await;
    assert_eq!(history().await, ["healthy", "healthy"]);

    // A change is written at once, inside the interval.
    send("degraded").await;
    send("degraded").await;
    processed(sent.get()).await;
    assert_eq!(history().await, ["degraded", "healthy", "healthy"]);
    let (_, cam) = api
        .get("/api/v1/capabilities/cam-front-01", Some(&admin))
        .await;
    assert_eq!(cam["health_status"], "degraded");
    reg.shutdown().await;
}

#[tokio::test]
async fn the_embedded_broker_admits_only_providers_with_their_own_token() {
    let dir = TempDir::new().unwrap();
    let reg = start(test_config(&dir)).await;
    let token_a = reg
        .auth
        .create_token(Role::Provider, "prov-a")
        .await
        .unwrap();
    let viewer = reg.auth.create_token(Role::Viewer, "prov-v").await.unwrap();
    let (host, port) = (reg.mqtt_addr.ip().to_string(), reg.mqtt_addr.port());
    let attempt = |user: &'static str, client: &'static str, pass: Option<String>| {
        let host = host.clone();
        async move {
            let login = pass.as_deref().map(|p| (user, p));
            TestProvider::try_connect(&host, port, PREFIX, user, client, login)
                .await
                .map(|p| p.task.abort())
        }
    };
    assert!(
        attempt("prov-a", "prov-a", None).await.is_err(),
        "anonymous refused"
    );
    assert!(
        attempt("prov-a", "prov-a", Some("blk_wrong".into()))
            .await
            .is_err(),
        "bad token refused"
    );
    assert!(
        attempt("prov-b", "prov-b", Some(token_a.clone()))
            .await
            .is_err(),
        "A's token as B refused"
    );
    assert!(
        attempt("prov-a", "prov-b", Some(token_a.clone()))
            .await
            .is_err(),
        "client id must be the provider id"
    );
    assert!(
        attempt("prov-v", "prov-v", Some(viewer)).await.is_err(),
        "a viewer token is no provider login"
    );
    assert!(
        attempt("prov-a", "prov-a", Some(token_a)).await.is_ok(),
        "own id with own token admitted"
    );
    reg.shutdown().await;
}

#[tokio::test]
async fn a_message_naming_another_provider_or_repeated_is_not_applied() {
    let (_dir, reg, api, admin) = registry().await;
    let token = reg
        .auth
        .create_token(Role::Provider, "prov-a")
        .await
        .unwrap();
    let addr = reg.mqtt_addr;
    let p = TestProvider::connect(
        &addr.ip().to_string(),
        addr.port(),
        PREFIX,
        "prov-a",
        "prov-a",
        Some(("prov-a", &token)),
    )
    .await;
    // On its own topic, but the body claims provider B: refused.
    p.publish(
        "prov-a",
        TopicKind::Register,
        MessageType::Register,
        &register_body("prov-b", "-b", "boot-1"),
    )
    .await;
    // The wrong message type for the topic: refused.
    p.publish(
        "prov-a",
        TopicKind::Register,
        MessageType::Heartbeat,
        &json!({"provider_id": "prov-a"}),
    )
    .await;
    // Not JSON: refused.
    p.client
        .publish(
            shared_protocol::mqtt::topic(PREFIX, "prov-a", TopicKind::Heartbeat),
            rumqttc::QoS::AtLeastOnce,
            false,
            b"not json".to_vec(),
        )
        .await
        .unwrap();
    eventually(Duration::from_secs(5), "three refusals", || async {
        (api.metric("benchlink_mqtt_messages_rejected_total").await == 3).then_some(())
    })
    .await;
    let (s, _) = api
        .get("/api/v1/capability-providers/prov-b", Some(&admin))
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    assert_eq!(api.metric("benchlink_events_total").await, 0);

    // The same envelope twice (a QoS 1 redelivery): applied once.
    let env = envelope(
        MessageType::Register,
        &register_body("prov-a", "", "boot-1"),
    );
    for _ in 0..2 {
        p.client
            .publish(
                shared_protocol::mqtt::topic(PREFIX, "prov-a", TopicKind::Register),
                rumqttc::QoS::AtLeastOnce,
                false,
                env.clone(),
            )
            .await
            .unwrap();
    }
    eventually(Duration::from_secs(5), "duplicate dropped", || async {
        (api.metric("benchlink_mqtt_duplicates_total").await == 1).then_some(())
    })
    .await;
    let types = event_types(&reg).await;
    assert_eq!(types, P1_REGISTERED);
    reg.shutdown().await;
}

/// Records provider restarts and outages.
#[derive(Default)]
struct Recorder {
    restarted: Mutex<Vec<String>>,
    offline: Mutex<Vec<(String, cloud_registry::providers::OfflineReason)>>,
}

#[async_trait::async_trait]
impl cloud_registry::providers::ProviderHooks for Recorder {
    async fn on_provider_restarted(&self, provider_id: &str) {
        self.restarted.lock().unwrap().push(provider_id.to_string());
    }
    async fn on_provider_offline(
        &self,
        provider_id: &str,
        reason: cloud_registry::providers::OfflineReason,
    ) {
        self.offline
            .lock()
            .unwrap()
            .push((provider_id.to_string(), reason));
    }
}

#[tokio::test]
async fn a_new_boot_id_and_missed_heartbeats_reach_the_provider_hooks() {
    let dir = TempDir::new().unwrap();
    let mut cfg = test_config(&dir);
    cfg.heartbeat.interval_seconds = 1;
    cfg.heartbeat.offline_after_missed = 2;
    let reg = start(cfg).await;
    let rec = Arc::new(Recorder::default());
    reg.providers.add_hooks(rec.clone());
    let api = Api::new(&reg.base_url());
    let admin = reg.admin_token.clone().unwrap();
    let token = reg
        .auth
        .create_token(Role::Provider, "p-boot")
        .await
        .unwrap();
    let addr = reg.mqtt_addr;
    let mut p = TestProvider::connect(
        &addr.ip().to_string(),
        addr.port(),
        PREFIX,
        "p-boot",
        "p-boot",
        Some(("p-boot", &token)),
    )
    .await;
    register_over_mqtt(&mut p, "boot-1").await;
    register_over_mqtt(&mut p, "boot-1").await;
    assert!(
        rec.restarted.lock().unwrap().is_empty(),
        "a reconnect with the same boot id is no restart"
    );
    register_over_mqtt(&mut p, "boot-2").await;
    assert_eq!(*rec.restarted.lock().unwrap(), ["p-boot"]);
    let (_, prov) = api
        .get("/api/v1/capability-providers/p-boot", Some(&admin))
        .await;
    assert_eq!(prov["boot_id"], "boot-2");

    // No heartbeats: after 2 intervals the provider is offline.
    eventually(
        Duration::from_secs(6),
        "provider offline after missed heartbeats",
        || async {
            let (_, prov) = api
                .get("/api/v1/capability-providers/p-boot", Some(&admin))
                .await;
            (prov["online_status"] == "offline").then_some(())
        },
    )
    .await;
    assert_eq!(
        *rec.offline.lock().unwrap(),
        [(
            "p-boot".to_string(),
            cloud_registry::providers::OfflineReason::MissedHeartbeats
        )]
    );
    let (_, cam) = api
        .get("/api/v1/capabilities/cam-front-01", Some(&admin))
        .await;
    assert_eq!(cam["status"], "offline");
    // A heartbeat brings it back.
    p.publish(
        "p-boot",
        TopicKind::Heartbeat,
        MessageType::Heartbeat,
        &json!({"provider_id": "p-boot", "boot_id": "boot-2"}),
    )
    .await;
    eventually(Duration::from_secs(5), "provider back online", || async {
        let (_, cam) = api
            .get("/api/v1/capabilities/cam-front-01", Some(&admin))
            .await;
        (cam["status"] == "available").then_some(())
    })
    .await;
    reg.shutdown().await;
}

// ------------------------------------------------- private Mosquitto ----

/// A Mosquitto process on a free port, killed on drop.
struct PrivateMosquitto {
    _child: KillOnDrop,
    port: u16,
}

fn shipped_acl() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/mosquitto/benchlink.acl")
}

/// Start Mosquitto with the shipped ACL and a password file holding `users`.
fn private_mosquitto(dir: &Path, users: &[(&str, &str)]) -> Option<PrivateMosquitto> {
    if !tool_installed("mosquitto") || !tool_installed("mosquitto_passwd") {
        return None;
    }
    let passwd = dir.join("passwd");
    for (i, (user, pass)) in users.iter().enumerate() {
        let mut cmd = Command::new("mosquitto_passwd");
        if i == 0 {
            cmd.arg("-c");
        }
        let ok = cmd
            .arg("-b")
            .arg(&passwd)
            .arg(user)
            .arg(pass)
            .status()
            .unwrap()
            .success();
        assert!(ok, "mosquitto_passwd failed for {user}");
    }
    let port = free_port();
    let conf = dir.join("mosquitto.conf");
    std::fs::write(
        &conf,
        format!(
            "listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\nacl_file {}\npersistence false\nuser root\n",
            passwd.display(),
            shipped_acl().display()
        ),
    )
    .unwrap();
    let child = Command::new("mosquitto")
        .arg("-c")
        .arg(&conf)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start mosquitto");
    let m = PrivateMosquitto {
        _child: KillOnDrop(child),
        port,
    };
    let addr = format!("127.0.0.1:{port}");
    wait_for(
        Duration::from_secs(5),
        "private mosquitto listening",
        || reachable(&addr).then_some(()),
    )
    .unwrap_or_else(|e| panic!("{e}"));
    Some(m)
}

#[tokio::test]
async fn with_the_shipped_mosquitto_acl_a_provider_cannot_use_another_providers_topics() {
    let dir = TempDir::new().unwrap();
    let d = TempDir::new().unwrap();
    let mut cfg = test_config(&d);
    // Tokens first (the broker's password file holds them), then the broker.
    let reg_for_tokens = start(test_config(&d)).await;
    let token_a = reg_for_tokens
        .auth
        .create_token(Role::Provider, "prov-a")
        .await
        .unwrap();
    let token_b = reg_for_tokens
        .auth
        .create_token(Role::Provider, "prov-b")
        .await
        .unwrap();
    reg_for_tokens.shutdown().await;
    let Some(broker) = private_mosquitto(
        dir.path(),
        &[
            ("benchlink-registry", "registry-secret"),
            ("prov-a", &token_a),
            ("prov-b", &token_b),
        ],
    ) else {
        return;
    };
    cfg.mqtt.mode = cloud_registry::config::MqttMode::External;
    cfg.mqtt.host = "127.0.0.1".into();
    cfg.mqtt.port = broker.port;
    cfg.mqtt.username = Some("benchlink-registry".into());
    cfg.mqtt.password = Some("registry-secret".into());
    let reg = start(cfg).await;
    let api = Api::new(&reg.base_url());
    let admin = reg.admin_token.clone().unwrap();
    let (s, h) = api.get("/healthz", None).await;
    assert_eq!(s, StatusCode::OK, "the registry's login and ACL work: {h}");

    let mut a = TestProvider::connect(
        "127.0.0.1",
        broker.port,
        PREFIX,
        "prov-a",
        "prov-a",
        Some(("prov-a", &token_a)),
    )
    .await;
    // A listens on B's commands too.
    a.client
        .subscribe(
            shared_protocol::mqtt::topic(PREFIX, "prov-b", TopicKind::Commands),
            rumqttc::QoS::AtLeastOnce,
        )
        .await
        .unwrap();
    // A registers itself: accepted.
    let ack = register_over_mqtt(&mut a, "boot-a").await;
    assert_eq!(ack["accepted"], true);
    // A publishes a registration of B on B's topic: the broker drops it.
    a.publish(
        "prov-b",
        TopicKind::Register,
        MessageType::Register,
        &register_body("prov-b", "-b", "boot-x"),
    )
    .await;
    a.publish(
        "prov-b",
        TopicKind::Status,
        MessageType::Status,
        &json!({"provider_id": "prov-b", "online_status": "online"}),
    )
    .await;

    // B registers for real; its acknowledgement goes to B only.
    let mut b = TestProvider::connect(
        "127.0.0.1",
        broker.port,
        PREFIX,
        "prov-b",
        "prov-b",
        Some(("prov-b", &token_b)),
    )
    .await;
    let id = "prov-b";
    b.publish(
        id,
        TopicKind::Register,
        MessageType::Register,
        &register_body(id, "-b", "boot-b"),
    )
    .await;
    let ack_b = b
        .next_of(MessageType::RegisterAck, Duration::from_secs(5))
        .await
        .expect("B's ack");
    assert_eq!(ack_b.body["provider_id"], "prov-b");
    assert!(
        a.next_of(MessageType::RegisterAck, Duration::from_millis(700))
            .await
            .is_none(),
        "A must not receive B's commands"
    );

    // The registry saw exactly two registrations, B's with B's own boot id.
    assert_eq!(
        api.metric("benchlink_mqtt_messages_in_total{kind=\"register\"}")
            .await,
        2
    );
    assert_eq!(
        api.metric("benchlink_mqtt_messages_in_total{kind=\"status\"}")
            .await,
        0
    );
    let (_, pb) = api
        .get("/api/v1/capability-providers/prov-b", Some(&admin))
        .await;
    assert_eq!(pb["boot_id"], "boot-b");
    let types = event_types(&reg).await;
    assert_eq!(
        types.iter().filter(|t| *t == "provider_registered").count(),
        2
    );
    a.client.disconnect().await.ok();
    b.client.disconnect().await.ok();
    reg.shutdown().await;
}

#[tokio::test]
async fn a_preemption_reaches_the_provider_as_a_notice_then_a_revocation() {
    let dir = TempDir::new().unwrap();
    let mut cfg = test_config(&dir);
    cfg.leases.default_grace_period_seconds = 1;
    let reg = start(cfg).await;
    let api = Api::new(&reg.base_url());
    let token = reg
        .auth
        .create_token(Role::Provider, "p-pre")
        .await
        .unwrap();
    let audit = reg
        .auth
        .create_token(Role::AuditAgent, "audit:sw-01")
        .await
        .unwrap();
    let operator = reg.auth.create_token(Role::Operator, "op-1").await.unwrap();
    let addr = reg.mqtt_addr;
    let mut p = TestProvider::connect(
        &addr.ip().to_string(),
        addr.port(),
        PREFIX,
        "p-pre",
        "p-pre",
        Some(("p-pre", &token)),
    )
    .await;
    register_over_mqtt(&mut p, "boot-1").await;

    let lease = |holder: &str, priority: u8, preempt: bool| {
        json!({
            "capability_id": "cam-front-01",
            "holder_type": "audit_agent",
            "holder_ref": holder,
            "project_id": "proj_device_assistant",
            "purpose": "preemption test",
            "priority": priority,
            "requested_duration_seconds": 300,
            "preempt_if_needed": preempt,
            "preempt_reason": "human_operator_override"
        })
    };
    let r = status_is(
        api.request_lease(&audit, &lease("audit:sw-01", 65, false))
            .await,
        StatusCode::CREATED,
    );
    let held = r.1["lease_id"].as_str().unwrap().to_string();
    let r = status_is(
        api.request_lease(&operator, &lease("op-1", 90, true)).await,
        StatusCode::ACCEPTED,
    );
    let waiting = r.1["lease_id"].as_str().unwrap().to_string();

    let notice = p
        .next_of(MessageType::PreemptRequested, Duration::from_secs(5))
        .await
        .expect("preempt_requested on the provider's commands topic");
    assert_eq!(notice.body["lease_id"], held.as_str());
    assert_eq!(notice.body["capability_id"], "cam-front-01");
    assert_eq!(notice.body["preempting_lease_id"], waiting.as_str());
    assert_eq!(notice.body["preempt_reason"], "human_operator_override");
    assert!(notice.body["grace_until"].is_string());

    let revoked = p
        .next_of(MessageType::LeaseRevoked, Duration::from_secs(5))
        .await
        .expect("lease_revoked after the grace period");
    assert_eq!(revoked.body["lease_id"], held.as_str());
    assert_eq!(revoked.body["capability_id"], "cam-front-01");
    let (_, w) = api.lease(&operator, &waiting).await;
    assert_eq!(w["status"], "granted");
    assert!(api.metric("benchlink_mqtt_commands_out_total").await >= 2);
    reg.shutdown().await;
}

#[tokio::test]
async fn a_client_beyond_the_embedded_brokers_cap_gets_server_unavailable_and_http_still_answers() {
    let (_dir, reg, api, _admin) = registry_with(|c| c.mqtt.max_clients = Some(2)).await;
    let (host, port) = (reg.mqtt_addr.ip().to_string(), reg.mqtt_addr.port());
    let mut tokens = Vec::new();
    for id in ["prov-a", "prov-b", "prov-c"] {
        tokens.push(reg.auth.create_token(Role::Provider, id).await.unwrap());
    }
    let connect = |id: &'static str, token: String| {
        let host = host.clone();
        async move { TestProvider::try_connect(&host, port, PREFIX, id, id, Some((id, &token))).await }
    };
    let a = connect("prov-a", tokens[0].clone())
        .await
        .expect("first client admitted");
    let _b = connect("prov-b", tokens[1].clone())
        .await
        .expect("second client admitted");
    let refused = connect("prov-c", tokens[2].clone())
        .await
        .err()
        .expect("third client refused");
    assert!(
        refused.contains("ServiceUnavailable"),
        "CONNACK 3, got: {refused}"
    );
    let (status, health) = api.get("/healthz", None).await;
    assert_eq!(
        status,
        StatusCode::OK,
        "HTTP answers while the broker is full: {health}"
    );
    assert_eq!(
        api.metric("benchlink_mqtt_gate_refused_total{what=\"capacity\"}")
            .await,
        1
    );

    // A client that leaves frees its place.
    a.task.abort();
    let mut admitted = None;
    for _ in 0..50 {
        if let Ok(c) = connect("prov-c", tokens[2].clone()).await {
            admitted = Some(c);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(admitted.is_some(), "prov-c admitted once prov-a left");
    reg.shutdown().await;
}
