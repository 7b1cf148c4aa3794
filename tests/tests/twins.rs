//! Twin benches across real processes (docs/architecture.md "Twin
//! benches"): a second `edge-agent` started with a copy of the bench's
//! configuration (same provider id and token, another host name) is
//! detected within seconds; actions on the provider are refused with 409
//! `provider_conflict` naming both hosts, no relay frame reaches the
//! hardware meanwhile, both edges log the other, they stop taking over
//! each other's MQTT session several times a second, and once the copy is
//! stopped the bench serves actions again.

use std::process::Child;
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, child_command, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_e2e::eventually;
use benchlink_testkit::status_is;
use chrono::Utc;
use reqwest::StatusCode;
use serde_json::{json, Value};

const COPY_HOST: &str = "bench-b-copy";
/// How long one instance must be alone for the conflict to end (the
/// registry's `heartbeat.conflict_clear_seconds` in this test).
const CLEAR_S: u32 = 8;

/// The copied bench: the same TOML with its own state directory and
/// another host name, as on a second machine.
fn start_copy(lab: &Lab) -> Child {
    let toml = std::fs::read_to_string(lab.edge_config()).expect("bench TOML");
    let state = lab.root.join("edge-copy/state");
    std::fs::create_dir_all(&state).unwrap();
    let original_state = lab.root.join("edge/state");
    let copy = toml
        .replace(
            &original_state.display().to_string(),
            &state.display().to_string(),
        )
        .replace(
            "node_id = \"demo-bench-01\"",
            &format!("node_id = \"demo-bench-01\"\nhostname = \"{COPY_HOST}\""),
        );
    assert_ne!(copy, toml, "the copy changes the state dir and host name");
    let path = lab.root.join("edge-copy/edge-agent.toml");
    std::fs::write(&path, copy).unwrap();
    let mut cmd = child_command("edge-agent", &lab.root.join("logs/edge-copy.log")).unwrap();
    cmd.args(["run", "--config"]).arg(&path);
    cmd.spawn().expect("start the copied edge")
}

fn log(lab: &Lab, name: &str) -> String {
    std::fs::read_to_string(lab.root.join(format!("logs/{name}.log"))).unwrap_or_default()
}

fn connects(text: &str) -> usize {
    text.matches("mqtt: connected to broker").count()
}

async fn switch(hw: &Agent, lease: &str, action: &str) -> (StatusCode, Value) {
    hw.act(lease, action, json!({"channel": 1}), 10_000)
        .await
        .expect("invoke")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copied_bench_is_a_conflict_refused_until_the_copy_stops() {
    let lab = Lab::start(LabOptions {
        conflict_clear_seconds: Some(CLEAR_S),
        // Heartbeats of neither twin are applied during the conflict: the
        // provider must not go offline before the copy is stopped.
        offline_after_missed: 60,
        ..Default::default()
    })
    .await
    .expect("lab");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let lease = hw.lease_ok(caps::RELAY, "twin benches").await.unwrap();
    let (s, v) = switch(&hw, &lease, "switch_on").await;
    assert_eq!(
        (s, v["status"].as_str()),
        (StatusCode::OK, Some("completed")),
        "{v}"
    );

    let copy_started = Instant::now();
    let copy_started_ms = Utc::now().timestamp_millis();
    let mut copy = start_copy(&lab);

    // Detected within seconds (the registry says so in its log; nothing
    // is asked of the bench meanwhile), then the answer names both hosts.
    eventually(
        Duration::from_secs(15),
        "the registry detects the twin",
        || async {
            log(&lab, "registry")
                .contains("two instances of one provider are connected at once")
                .then_some(())
        },
    )
    .await;
    let detected_in = copy_started.elapsed();
    let (_, refusal) = status_is(
        switch(&hw, &lease, "switch_off").await,
        StatusCode::CONFLICT,
    );
    assert_eq!(refusal["error"]["code"], "provider_conflict", "{refusal}");
    let hosts: Vec<&str> = refusal["error"]["details"]["instances"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|i| i["hostname"].as_str())
        .collect();
    assert!(hosts.contains(&COPY_HOST), "{refusal}");
    assert_eq!(hosts.len(), 2, "{refusal}");
    eprintln!(
        "conflict detected {} ms after the copy started",
        detected_in.as_millis()
    );

    // Refused for as long as both run; nothing reaches the relay.
    for _ in 0..3 {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = status_is(
            switch(&hw, &lease, "switch_off").await,
            StatusCode::CONFLICT,
        );
    }
    let frames: Vec<Value> = lab
        .relay_switches()
        .into_iter()
        .filter(|f| f["at_unix_ms"].as_i64() >= Some(copy_started_ms))
        .collect();
    assert!(
        frames.is_empty(),
        "relay frames during the conflict: {frames:?}"
    );

    // Both edges name the other; they no longer take over each other's
    // session several times a second (about 2.5 per second each before).
    let (a, b) = (log(&lab, "edge"), log(&lab, "edge-copy"));
    assert!(
        a.contains("another bench is connected with this provider id") && a.contains(COPY_HOST),
        "the bench's log names the copy"
    );
    let own_host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .unwrap_or_default()
        .trim()
        .to_string();
    assert!(
        b.contains("another bench is connected with this provider id")
            && b.contains(&format!("host `{own_host}`")),
        "the copy's log names the bench"
    );
    let elapsed = copy_started.elapsed().as_secs_f64();
    let reconnects = connects(&a) + connects(&b);
    eprintln!("{reconnects} MQTT connections of both edges in {elapsed:.1} s");
    assert!(
        (reconnects as f64) < 2.0 * elapsed,
        "{reconnects} connections in {elapsed:.1} s"
    );

    // The copy stops: once the bench was alone for CLEAR_S, actions run.
    copy.kill().unwrap();
    let _ = copy.wait();
    let served = eventually(
        Duration::from_secs(u64::from(CLEAR_S) + 30),
        "actions accepted again",
        || async {
            let (s, v) = switch(&hw, &lease, "switch_off").await;
            (s == StatusCode::OK).then_some(v)
        },
    )
    .await;
    assert_eq!(served["status"], "completed", "{served}");
    let (s, _) = hw.release(&lease).await.unwrap();
    assert_eq!(s, StatusCode::OK);
}
