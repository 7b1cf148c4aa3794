//! The shipped units (systemd/) as systemd reads them: `systemd-analyze
//! verify` finds nothing wrong, and `systemd-analyze security` rates both
//! services "OK" or better. The units name the packaged binaries
//! (`/usr/bin/…`); the check points them at the ones just built.

use std::path::{Path, PathBuf};
use std::process::Command;

use benchlink_e2e::workspace_bin;
use benchlink_testkit::tool_installed;

fn unit(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../systemd")
        .join(name)
}

/// The unit with `/usr/bin/<binary>` replaced by the built binary, in
/// `dir` under its own name (verify reads the unit name from the file).
fn with_built_binary(dir: &Path, name: &str, binary: &str) -> PathBuf {
    let text = std::fs::read_to_string(unit(name)).unwrap();
    let packaged = format!("/usr/bin/{binary}");
    assert!(
        text.contains(&format!("ExecStart={packaged} ")),
        "{name} runs {packaged}"
    );
    let built = workspace_bin(binary);
    let path = dir.join(name);
    std::fs::write(&path, text.replace(&packaged, built.to_str().unwrap())).unwrap();
    path
}

#[test]
fn both_units_pass_systemd_analyze_verify() {
    if !tool_installed("systemd-analyze") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    for (name, binary) in [
        ("edge-agent.service", "edge-agent"),
        ("cloud-registry.service", "cloud-registry"),
    ] {
        let path = with_built_binary(dir.path(), name, binary);
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&path)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stderr.trim().is_empty(),
            "systemd-analyze verify {name}: {}\n{stderr}",
            out.status
        );
    }
}

/// systemd's own rating of the sandboxing: "Overall exposure level for
/// X: 3.4 OK". Both units must be rated OK or SAFE; the figures are
/// printed for the record.
#[test]
fn both_units_are_rated_ok_or_better_by_systemd_analyze_security() {
    if !tool_installed("systemd-analyze") {
        return;
    }
    for name in ["edge-agent.service", "cloud-registry.service"] {
        let out = Command::new("systemd-analyze")
            .args(["security", "--offline=true", "--no-pager"])
            .arg(unit(name))
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let overall = stdout
            .lines()
            .find(|l| l.contains("Overall exposure level"))
            .unwrap_or_else(|| panic!("no overall rating for {name}:\n{stdout}"));
        eprintln!("{overall}");
        let rating = overall.split_whitespace().nth_back(1).unwrap_or_default();
        assert!(
            matches!(rating, "OK" | "SAFE"),
            "{name} is rated {rating:?}, want OK or SAFE: {overall}"
        );
    }
}

/// The registry runs as `Type=notify` with a watchdog, as the edge does
/// (the pings themselves are tested in cloud-registry/tests/watchdog.rs and
/// edge-agent/tests/daemon.rs).
#[test]
fn both_units_are_notify_services_with_a_watchdog() {
    for name in ["edge-agent.service", "cloud-registry.service"] {
        let text = std::fs::read_to_string(unit(name)).unwrap();
        let has = |line: &str| text.lines().any(|l| l.trim() == line);
        assert!(has("Type=notify"), "{name}: Type=notify");
        assert!(has("NotifyAccess=main"), "{name}: NotifyAccess=main");
        assert!(
            text.lines().any(|l| l.starts_with("WatchdogSec=")),
            "{name}: WatchdogSec="
        );
    }
}
