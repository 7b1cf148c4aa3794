//! Provider isolation on the embedded broker, across real processes
//! (`bench-sim`, `cloud-registry` with its embedded broker, `edge-agent`
//! as provider A, a raw MQTT client as provider B with its own valid
//! provider token): B can neither read A's commands nor act in A's name
//! (docs/architecture.md "Control plane (MQTT)").

use std::collections::BTreeMap;
use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT, PROVIDER_ID};
use benchlink_e2e::client::Agent;
use benchlink_testkit::status_is;
use chrono::Utc;
use reqwest::StatusCode;
use rumqttc::{
    AsyncClient, ConnectReturnCode, ConnectionError, Event, EventLoop, LastWill, MqttOptions,
    Packet, QoS, SubscribeFilter, SubscribeReasonCode,
};
use serde_json::{json, Value};
use shared_protocol::mqtt::{Envelope, MessageType, RegisterBody, SessionUpdate, StatusBody};
use shared_protocol::provider::HeartbeatRequest;

/// Provider B: a second, valid provider of the same registry.
const INTRUDER: &str = "provider-intruder-02";

fn options(lab: &Lab, token: &str) -> MqttOptions {
    let mut o = MqttOptions::new(INTRUDER, "127.0.0.1", lab.mqtt_port);
    o.set_credentials(INTRUDER, token);
    o.set_keep_alive(Duration::from_secs(10));
    o
}

/// B's connection, once the broker accepted its login.
async fn connect(opts: MqttOptions) -> (AsyncClient, EventLoop) {
    let (client, mut events) = AsyncClient::new(opts, 16);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), events.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => return (client, events),
            Ok(Ok(_)) => {}
            other => panic!("provider B cannot connect with its own token: {other:?}"),
        }
    }
}

/// Everything B's connection receives for `within`, and whether the
/// broker closed it meanwhile.
async fn drain(events: &mut EventLoop, within: Duration) -> (Vec<Packet>, bool) {
    let mut seen = Vec::new();
    let end = tokio::time::Instant::now() + within;
    loop {
        match tokio::time::timeout_at(end, events.poll()).await {
            Err(_) => return (seen, false),
            Ok(Err(_)) => return (seen, true),
            Ok(Ok(Event::Incoming(p))) => seen.push(p),
            Ok(Ok(Event::Outgoing(_))) => {}
        }
    }
}

fn envelope<T: serde::Serialize>(kind: MessageType, body: &T) -> Vec<u8> {
    Envelope::new(kind, format!("forged-{}", uuid_ish()), Utc::now(), body)
        .unwrap()
        .to_bytes()
}

fn uuid_ish() -> String {
    benchlink_e2e::bench::uuid_like()
}

/// What B's forgeries would change: A's provider record and its
/// capabilities' health and status, as the API shows them.
async fn state_of_a(admin: &Agent) -> (Value, BTreeMap<String, (Value, Value, Value)>) {
    let p = admin
        .get_ok(&format!("/api/v1/capability-providers/{PROVIDER_ID}"))
        .await
        .unwrap();
    let provider = json!({
        "online_status": p["online_status"],
        "hostname": p["hostname"],
        "node_id": p["node_id"],
        "gateway_version": p["gateway_version"],
        "network_zone": p["network_zone"],
    });
    let all = admin.get_ok("/api/v1/capabilities").await.unwrap();
    let caps = all["capabilities"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["provider_id"] == PROVIDER_ID || c["capability_id"] == "forged-relay-99")
        .map(|c| {
            (
                c["capability_id"].as_str().unwrap().to_string(),
                (
                    c["health_status"].clone(),
                    c["status"].clone(),
                    c["display_name"].clone(),
                ),
            )
        })
        .collect();
    (provider, caps)
}

fn gate_refusals(metrics: &str, what: &str) -> u64 {
    let key = format!("benchlink_mqtt_gate_refused_total{{what=\"{what}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&key))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no {key} in /metrics:\n{metrics}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_provider_can_neither_read_nor_forge_a_benchs_messages() {
    let lab = Lab::start(LabOptions::default()).await.expect("lab starts");
    let prefix = lab.opts.topic_prefix.clone();
    let a_topic = |kind: &str| format!("{prefix}/providers/{PROVIDER_ID}/{kind}");
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (_, minted) = status_is(
        admin
            .post(
                "/api/v1/auth/tokens",
                &json!({"role": "provider", "name": INTRUDER}),
            )
            .await
            .unwrap(),
        StatusCode::CREATED,
    );
    let token = minted["token"].as_str().unwrap().to_string();

    // --- B listens for A's commands while A is commanded.
    let (b, mut b_events) = connect(options(&lab, &token)).await;
    b.subscribe_many([
        SubscribeFilter::new(a_topic("commands"), QoS::AtLeastOnce),
        SubscribeFilter::new("#".into(), QoS::AtLeastOnce),
        SubscribeFilter::new(
            format!("{prefix}/providers/{INTRUDER}/commands"),
            QoS::AtLeastOnce,
        ),
    ])
    .await
    .unwrap();
    b.subscribe(format!("{prefix}/providers/+/commands"), QoS::AtLeastOnce)
        .await
        .unwrap();
    let (acks, closed) = drain(&mut b_events, Duration::from_secs(2)).await;
    assert!(!closed, "a refused subscription keeps the connection");
    let codes: Vec<Vec<SubscribeReasonCode>> = acks
        .iter()
        .filter_map(|p| match p {
            Packet::SubAck(a) => Some(a.return_codes.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(
        codes,
        vec![
            vec![
                SubscribeReasonCode::Failure,
                SubscribeReasonCode::Failure,
                SubscribeReasonCode::Success(QoS::AtLeastOnce),
            ],
            vec![SubscribeReasonCode::Failure],
        ],
        "A's command topic, `#` and every provider's commands are refused; B's own is granted"
    );

    let switches_before = lab.relay_switches().len();
    let relay_lease = hw.lease_ok(caps::RELAY, "isolation").await.unwrap();
    let done = hw
        .act_ok(&relay_lease, "switch_on", json!({"channel": 1}))
        .await
        .expect("A is commanded and answers");
    assert_eq!(done["status"], "completed", "{done}");
    assert_eq!(lab.relay_switches().len(), switches_before + 1);
    let _ = hw.release(&relay_lease).await.unwrap();
    let (heard, closed) = drain(&mut b_events, Duration::from_secs(1)).await;
    assert!(!closed);
    let publishes: Vec<&Packet> = heard
        .iter()
        .filter(|p| matches!(p, Packet::Publish(_)))
        .collect();
    assert!(
        publishes.is_empty(),
        "B received messages while A was commanded: {publishes:?}"
    );
    let _ = b.disconnect().await;
    let _ = drain(&mut b_events, Duration::from_millis(500)).await;

    // --- B forges A's messages, one connection each (a refused publish
    // closes the connection).
    let console_lease = hw.lease_ok(caps::CONSOLE, "isolation").await.unwrap();
    let session_id = hw
        .start_action(
            &console_lease,
            &json!({
                "action": "capture_log",
                "params": {"duration_ms": 6000},
                "wait_ms": 0,
                "timeout_ms": 60_000
            }),
        )
        .await
        .unwrap();
    let before = state_of_a(&admin).await;
    assert_eq!(before.0["online_status"], "online", "{:?}", before.0);

    let register: RegisterBody = serde_json::from_value(json!({
        "provider": {
            "provider_id": PROVIDER_ID, "node_id": "forged-node", "hostname": "forged-host",
            "platform": "linux", "gateway_version": "6.6.6", "network_zone": "forged"
        },
        "capabilities": [{
            "capability_id": "forged-relay-99", "capability_type": "relay",
            "display_name": "forged relay", "lease_mode": "exclusive",
            "preemptible": false, "supported_actions": ["switch_on"]
        }]
    }))
    .expect("a well-formed register");
    let heartbeat: HeartbeatRequest = serde_json::from_value(json!({
        "provider_id": PROVIDER_ID,
        "capabilities": before.1.keys()
            .map(|c| json!({"capability_id": c, "health_status": "unhealthy", "message": "forged"}))
            .collect::<Vec<_>>()
    }))
    .expect("a well-formed heartbeat");
    let status: StatusBody = serde_json::from_value(json!({
        "provider_id": PROVIDER_ID, "online_status": "offline"
    }))
    .expect("a well-formed status");
    let result: SessionUpdate = serde_json::from_value(json!({
        "session_id": session_id, "capability_id": caps::CONSOLE, "status": "failed",
        "error_message": "forged by another provider", "occurred_at": Utc::now()
    }))
    .expect("a well-formed session update");
    let forgeries = [
        (
            "register",
            envelope(MessageType::Register, &register),
            false,
        ),
        (
            "heartbeat",
            envelope(MessageType::Heartbeat, &heartbeat),
            false,
        ),
        ("status", envelope(MessageType::Status, &status), true),
        (
            "results",
            envelope(MessageType::SessionUpdate, &result),
            false,
        ),
    ];
    for (kind, payload, retain) in &forgeries {
        let (b, mut events) = connect(options(&lab, &token)).await;
        b.publish(a_topic(kind), QoS::AtLeastOnce, *retain, payload.clone())
            .await
            .unwrap();
        let (seen, closed) = drain(&mut events, Duration::from_secs(5)).await;
        assert!(
            closed,
            "B's forged `{kind}` did not close its connection: {seen:?}"
        );
        assert!(
            !seen.iter().any(|p| matches!(p, Packet::PubAck(_))),
            "B's forged `{kind}` was acknowledged: {seen:?}"
        );
    }
    // Past the registry's delay before it acts on an `offline` status.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = state_of_a(&admin).await;
    assert_eq!(after, before, "B's forgeries changed A's state");
    status_is(
        admin
            .get("/api/v1/capabilities/forged-relay-99")
            .await
            .unwrap(),
        StatusCode::NOT_FOUND,
    );
    let running = hw
        .get_ok(&format!("/api/v1/sessions/{session_id}"))
        .await
        .unwrap();
    assert_eq!(running["status"], "running", "{running}");

    // --- A's own results still arrive, and A's will is A's alone.
    let finished =
        benchlink_e2e::poll_until(Duration::from_secs(60), "A's capture to finish", || {
            let hw = &hw;
            let session_id = &session_id;
            async move {
                let s = hw
                    .get_ok(&format!("/api/v1/sessions/{session_id}"))
                    .await
                    .ok()?;
                (s["status"] != "running").then_some(s)
            }
        })
        .await
        .unwrap();
    assert_eq!(finished["status"], "completed", "{finished}");
    assert!(
        !finished["artifact_refs"].as_array().unwrap().is_empty(),
        "{finished}"
    );

    let mut with_will = options(&lab, &token);
    with_will.set_last_will(LastWill::new(
        a_topic("status"),
        envelope(MessageType::Status, &status),
        QoS::AtLeastOnce,
        true,
    ));
    let (_c, mut events) = AsyncClient::new(with_will, 4);
    let refused = tokio::time::timeout(Duration::from_secs(10), events.poll())
        .await
        .expect("an answer to the CONNECT");
    assert!(
        matches!(
            refused,
            Err(ConnectionError::ConnectionRefused(
                ConnectReturnCode::NotAuthorized
            ))
        ),
        "a will on A's status topic: {refused:?}"
    );

    let metrics = reqwest::get(format!("{}/metrics", lab.base_url))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert_eq!(gate_refusals(&metrics, "publish"), 4);
    assert_eq!(gate_refusals(&metrics, "subscribe"), 3);
    assert_eq!(gate_refusals(&metrics, "will"), 1);
    let log = std::fs::read_to_string(lab.root.join("logs/registry.log")).unwrap_or_default();
    assert!(
        log.contains("MQTT publish refused") && log.contains("MQTT subscription refused"),
        "the registry logs the refusals"
    );
    assert_eq!(
        hw.get_ok(&format!("/api/v1/capability-providers/{PROVIDER_ID}"))
            .await
            .unwrap()["online_status"],
        "online"
    );
}
