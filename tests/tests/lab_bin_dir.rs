//! The lab harness with `LabOptions::bin_dir` (how `action-bench
//! --baseline-bins` runs an older build): the registry and the edge run
//! from that directory, `bench-sim` from the workspace, and a directory
//! without one of them fails before anything is left running or on disk.

use std::path::{Path, PathBuf};

use benchlink_e2e::bench::{caps, Lab, LabOptions, HW_AGENT};
use benchlink_e2e::client::Agent;
use benchlink_e2e::workspace_bin;
use serde_json::json;

static ONE_LAB_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The executable process `pid` runs, from `/proc`.
fn exe_of(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/exe")).expect("read /proc/<pid>/exe")
}

/// Copies of the workspace's `names` in `dir` (copies, not links: the
/// kernel reports a link's target as the executable).
fn copy_bins(dir: &Path, names: &[&str]) {
    for name in names {
        std::fs::copy(workspace_bin(name), dir.join(name)).expect("copy binary");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_runs_registry_and_edge_from_bin_dir() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let bins = tempfile::tempdir().expect("temporary directory");
    copy_bins(bins.path(), &["cloud-registry", "edge-agent"]);
    let bins_path = std::fs::canonicalize(bins.path()).expect("canonical path");
    let lab = Lab::start(LabOptions {
        bin_dir: Some(bins_path.clone()),
        ..Default::default()
    })
    .await
    .expect("lab from bin_dir");

    let registry_pid = lab.registry.as_ref().map(|p| p.pid()).unwrap_or(0);
    assert_eq!(exe_of(registry_pid), bins_path.join("cloud-registry"));
    assert_eq!(exe_of(lab.edge_pid()), bins_path.join("edge-agent"));
    assert_eq!(
        exe_of(lab.sim.pid()),
        std::fs::canonicalize(workspace_bin("bench-sim")).expect("canonical path")
    );

    // The copies serve a whole action: lease, invoke, result.
    let agent = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let (s, lease) = agent
        .lease(caps::SPEAKER, 30, "bin_dir test", None, 5)
        .await
        .expect("lease request");
    assert!(s.is_success(), "lease: {s}: {lease}");
    let lease_id = lease["lease_id"].as_str().expect("lease_id");
    let (s, session) = agent
        .act(lease_id, "set_volume", json!({"volume": 0.25}), 10_000)
        .await
        .expect("action request");
    assert!(s.is_success(), "set_volume: {s}: {session}");
    assert_eq!(session["status"], "completed", "{session}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lab_bin_dir_without_edge_agent_fails_naming_it_and_leaves_nothing() {
    let _one = ONE_LAB_AT_A_TIME.lock().await;
    let bins = tempfile::tempdir().expect("temporary directory");
    copy_bins(bins.path(), &["cloud-registry"]);
    let parent = tempfile::tempdir().expect("temporary directory");
    let err = Lab::start(LabOptions {
        bin_dir: Some(bins.path().to_path_buf()),
        parent_dir: Some(parent.path().to_path_buf()),
        keep: false,
        ..Default::default()
    })
    .await
    .err()
    .expect("a lab without edge-agent fails");
    let missing = bins.path().join("edge-agent");
    assert!(
        format!("{err:#}").contains(&missing.display().to_string()),
        "error names {}: {err:#}",
        missing.display()
    );
    // The lab directory (registry store, logs) is gone with the processes.
    let left: Vec<_> = std::fs::read_dir(parent.path())
        .expect("read parent dir")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
