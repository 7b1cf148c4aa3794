//! Two serial adapters plugged into each other's ports and then put back,
//! across real processes (`bench-sim`, `cloud-registry`, `edge-agent`):
//! the supply and the relay board fail their identity probes while
//! swapped; once put back, the edge closes the wrong devices and opens its
//! paths again, both turn healthy without a restart, and actions reach the
//! right hardware.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_e2e::eventually;
use reqwest::StatusCode;
use serde_json::json;

/// Points the stable name `link` at `target` in one step, as udev does
/// when an adapter turns up on another port.
fn point(link: &Path, target: &Path) {
    let tmp = link.with_extension("next");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adapters_swapped_and_put_back_are_found_again_without_a_restart() {
    let mut lab = Lab::start(LabOptions::default()).await.expect("lab starts");
    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let korad = PathBuf::from(&lab.devices["korad"]);
    let lcus = PathBuf::from(&lab.devices["lcus"]);
    let korad_pty = std::fs::read_link(&korad).unwrap();
    let lcus_pty = std::fs::read_link(&lcus).unwrap();

    // The bench comes up with the two adapters in each other's ports.
    lab.kill_edge();
    point(&korad, &lcus_pty);
    point(&lcus, &korad_pty);
    lab.start_edge().expect("edge restarts");
    let wrong = eventually(
        Duration::from_secs(30),
        "supply and relay unhealthy on swapped ports",
        || async {
            let psu = hw.capability(caps::PSU).await;
            let relay = hw.capability(caps::RELAY).await;
            (psu["health_status"] == "unhealthy" && relay["health_status"] == "unhealthy")
                .then_some((psu, relay))
        },
    )
    .await;
    println!("while swapped: {} / {}", wrong.0, wrong.1);
    let edge_log = lab.root.join("logs/edge.log");
    let log = std::fs::read_to_string(&edge_log).unwrap();
    assert!(
        log.contains("does not answer *IDN?"),
        "the edge says why the supply is unhealthy: {}",
        log.lines()
            .filter(|l| l.contains("health"))
            .collect::<Vec<_>>()
            .join("\n")
    );

    // Put back; no restart.
    point(&korad, &korad_pty);
    point(&lcus, &lcus_pty);
    let put_back = Instant::now();
    eventually(
        Duration::from_secs(60),
        "supply and relay healthy again",
        || async {
            let psu = hw.capability(caps::PSU).await;
            let relay = hw.capability(caps::RELAY).await;
            (psu["health_status"] == "healthy" && relay["health_status"] == "healthy").then_some(())
        },
    )
    .await;
    println!(
        "healthy again {:?} after the adapters were put back",
        put_back.elapsed()
    );

    // Actions reach the right hardware.
    let (s, lease) = hw
        .lease(caps::RELAY, 50, "after the swap", None, 30)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::CREATED, "{lease}");
    let switches = lab.relay_switches().len();
    hw.act_ok(
        lease["lease_id"].as_str().unwrap(),
        "switch_on",
        json!({"channel": 1}),
    )
    .await
    .expect("the relay switches");
    assert_eq!(
        lab.relay_switches().len(),
        switches + 1,
        "the LCUS board switched"
    );
    let (s, lease) = hw
        .lease(caps::PSU, 50, "after the swap", None, 30)
        .await
        .unwrap();
    assert_eq!(s, StatusCode::CREATED, "{lease}");
    let measured = hw
        .act_ok(
            lease["lease_id"].as_str().unwrap(),
            "measure_output",
            json!({}),
        )
        .await
        .expect("the supply measures");
    assert!(measured.to_string().contains("voltage_v"), "{measured}");

    // The edge log names what it did.
    let log = std::fs::read_to_string(&edge_log).unwrap();
    assert!(
        log.contains("identity probe failed 3 times in a row"),
        "the edge logs the reopen"
    );
}
