//! `edge-agent status` and `edge-agent probe` as a technician runs them on
//! a bench of simulators (real processes: `bench-sim`, `cloud-registry`,
//! `edge-agent`): no lease, no token, no curl.

use std::process::Command;
use std::time::Duration;

use benchlink_e2e::bench::{caps, Lab, LabOptions};
use benchlink_e2e::{wait_for, workspace_bin};

/// Runs `edge-agent ARGS --config <the lab's bench TOML>`; exit code and stdout
/// (stderr appended).
fn edge_tool(lab: &Lab, args: &[&str]) -> (i32, String) {
    let out = Command::new(workspace_bin("edge-agent"))
        .args(args)
        .arg("--config")
        .arg(lab.edge_config())
        .env_remove("BENCHLINK_TOKEN")
        .output()
        .expect("run edge-agent");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code().unwrap_or(-1), text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_probe_answer_a_technician_without_a_lease() {
    let mut lab = Lab::start(LabOptions::default()).await.expect("lab starts");

    // The running daemon: link, registry, outbox, every capability.
    let (code, table) = wait_for(Duration::from_secs(15), "a healthy status", || {
        let (code, table) = edge_tool(&lab, &["status"]);
        (code == 0).then_some((code, table))
    })
    .unwrap();
    println!("{table}");
    assert_eq!(code, 0);
    assert!(table.contains("running, pid"), "{table}");
    assert!(table.contains("connected"), "{table}");
    assert!(table.contains("registered"), "{table}");
    assert!(table.contains("awaiting upload"), "{table}");
    for id in caps::ALL {
        assert!(table.contains(id), "{id} missing:\n{table}");
    }
    let (_, json) = edge_tool(&lab, &["status", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("status JSON");
    assert_eq!(v["running"], true, "{v}");
    assert_eq!(
        v["capabilities"].as_array().map(Vec::len),
        Some(caps::ALL.len())
    );
    assert_eq!(v["broker"]["connected"], true, "{v}");

    // A simulated camera can be probed while the daemon runs.
    let (code, out) = edge_tool(&lab, &["probe", caps::CAMERA]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("snapshot in") && out.contains("artifact image image/jpeg"),
        "{out}"
    );
    // The supply's serial port is the daemon's: the probe says so.
    let (code, out) = edge_tool(&lab, &["probe", caps::PSU]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("in use by another program"), "{out}");
    let (code, out) = edge_tool(&lab, &["probe", "no-such-capability"]);
    assert_eq!(code, 2, "{out}");
    assert!(out.contains(caps::PSU), "the known ids are listed: {out}");

    // Daemon gone: status says so at once; the supply can be probed.
    lab.kill_edge();
    let (code, table) = edge_tool(&lab, &["status"]);
    assert_eq!(code, 3, "{table}");
    assert!(table.contains("NOT RUNNING"), "{table}");
    assert!(table.contains("the daemon is not running"), "{table}");
    let (code, out) = edge_tool(&lab, &["probe", caps::PSU]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("health healthy") && out.contains("\"voltage_v\""),
        "{out}"
    );
}
