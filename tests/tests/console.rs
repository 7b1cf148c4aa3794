//! The web console in a real Chromium (tests/browser/*.spec.mjs driven by
//! playwright-core): a lab is started here, the spec signs in, prepares its
//! own state through the HTTP API and checks the pages; this test asserts
//! that the spec exits 0. Needs node, /usr/bin/chromium and
//! tests/browser/node_modules (`scripts/setup.sh`); under `CI=true` a
//! missing one fails the test. Screenshots go to `$SCREENSHOT_DIR`
//! (default `target/console-screenshots`).

use benchlink_e2e::bench::{Lab, LabOptions, PROVIDER_ID};
use benchlink_e2e::browser::{self, run_spec};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lab_lease_and_events_pages_follow_the_lab_live() {
    if !browser::ready() {
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
