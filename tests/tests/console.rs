//! The web console in a real Chromium (tests/browser/*.spec.mjs driven by
//! playwright-core): a lab is started here, the spec signs in, prepares its
//! own state through the HTTP API and checks the pages; this test asserts
//! that the spec exits 0. Needs node, /usr/bin/chromium and
//! tests/browser/node_modules (`scripts/setup.sh`); under `CI=true` a
//! missing one fails the test. Screenshots go to `$SCREENSHOT_DIR`
//! (default `target/console-screenshots`).

use std::path::{Path, PathBuf};
use std::process::Command;

use benchlink_e2e::bench::{Lab, LabOptions, PROVIDER_ID};
use benchlink_testkit::services::{skip_unless_ci, tool_installed};

fn browser_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("browser")
}

/// True when node, chromium and the spec's npm packages are there;
/// otherwise the missing-service rule and false.
fn browser_ready() -> bool {
    if !tool_installed("node") {
        return false;
    }
    let chromium = std::env::var("CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let missing = if !Path::new(&chromium).exists() {
        Some(format!("chromium is not installed at {chromium}"))
    } else if !browser_dir().join("node_modules/playwright-core").is_dir() {
        Some("tests/browser/node_modules is missing (scripts/setup.sh runs npm ci)".into())
    } else {
        None
    };
    match missing {
        Some(why) => {
            skip_unless_ci(&why);
            false
        }
        None => true,
    }
}

/// Run `node tests/browser/{spec}` with `env`; its output is printed, and
/// a non-zero exit fails the test with it.
fn run_spec(spec: &str, env: &[(&str, String)]) {
    let shots = std::env::var("SCREENSHOT_DIR").unwrap_or_else(|_| {
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../target/console-screenshots")
            .display()
            .to_string()
    });
    let out = Command::new("node")
        .arg(browser_dir().join(spec))
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
        .env("SCREENSHOT_DIR", &shots)
        .output()
        .expect("run node");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        out.status.success(),
        "{spec} failed ({}):\n{stdout}\n{stderr}",
        out.status
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lab_lease_and_events_pages_follow_the_lab_live() {
    if !browser_ready() {
        return;
    }
    let lab = Lab::start(LabOptions::default()).await.expect("lab starts");
    run_spec(
        "lab.spec.mjs",
        &[
            ("BENCHLINK_URL", lab.base_url.clone()),
            ("BENCHLINK_TOKEN", lab.admin_token.clone()),
            ("BENCHLINK_HW_TOKEN", lab.hw_token.clone()),
            ("BENCHLINK_CHIEF_TOKEN", lab.chief_token.clone()),
            ("BENCHLINK_EDGE_PID", lab.edge_pid().to_string()),
            ("BENCHLINK_PROVIDER", PROVIDER_ID.to_string()),
        ],
    );
}
