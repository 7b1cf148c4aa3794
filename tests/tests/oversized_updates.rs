//! An action whose failure would make a session update larger than the
//! broker accepts, across real processes (`bench-sim`, `cloud-registry`
//! with its embedded broker, `edge-agent`): the session ends `failed` with
//! a bounded `error_message`, the bench stays online (no reconnect storm)
//! and the next action on it works.

use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT, PROVIDER_ID};
use benchlink_e2e::client::{follow_events, Agent};
use benchlink_testkit::status_is;
use reqwest::StatusCode;
use serde_json::{json, Map, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_with_a_megabyte_parameter_name_fails_bounded_and_the_bench_stays_online() {
    let lab = Lab::start(LabOptions::default()).await.expect("lab starts");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let (events, follower) = follow_events(&admin, |_| {});
    let (_, lease) = status_is(
        hw.lease(caps::CONSOLE, 50, "oversized parameter name", None, 10)
            .await
            .expect("lease request"),
        StatusCode::CREATED,
    );
    let lease_id = lease["lease_id"].as_str().unwrap().to_string();
    hw.act_ok(&lease_id, "open", json!({}))
        .await
        .expect("console open");

    // Under the 1 MiB body limit; the driver's error names the key twice.
    let mut params = Map::new();
    params.insert("K".repeat(1_000_000), json!(1));
    let (s, session) = hw
        .act(&lease_id, "write", Value::Object(params), 30_000)
        .await
        .expect("write sent");
    assert_eq!(s, StatusCode::OK, "{:.500}", session.to_string());
    assert_eq!(session["status"], "failed", "{:.500}", session.to_string());
    let message = session["error_message"].as_str().unwrap();
    assert!(
        message.chars().count() <= 2100,
        "error_message of {} characters",
        message.chars().count()
    );
    assert!(message.ends_with("more characters)"), "{:.300}", message);

    // The bench stays registered: no reconnects while later actions run.
    let registered = events.of("provider_registered").len();
    for i in 0..3 {
        let s = hw
            .act_ok(&lease_id, "write", json!({"text": format!("ping {i}\n")}))
            .await
            .expect("a later write completes");
        assert_eq!(s["status"], "completed");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(
        events.of("provider_registered").len(),
        registered,
        "the provider registered again"
    );
    let provider = admin
        .get_ok(&format!("/api/v1/capability-providers/{PROVIDER_ID}"))
        .await
        .expect("provider");
    assert_eq!(provider["online_status"], "online", "{provider}");
    follower.abort();
}
