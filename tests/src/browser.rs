//! The console's browser specs (tests/browser/*.spec.mjs, node with
//! playwright-core driving Debian's chromium) run from Rust tests:
//! [`ready`] checks the tools, [`run_spec`] runs one spec against a lab.
//! docs/console.md "Tests".

use std::path::{Path, PathBuf};
use std::process::Command;

use benchlink_testkit::services::{skip_unless_ci, tool_installed};

/// The workspace root.
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

/// `tests/browser/`.
pub fn browser_dir() -> PathBuf {
    repo_root().join("tests/browser")
}

/// True when node, chromium (`$CHROMIUM`, default `/usr/bin/chromium`) and
/// the specs' npm packages are there; otherwise the kit's missing-service
/// rule (a panic under `CI=true`, a printed reason elsewhere) and false.
pub fn ready() -> bool {
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

/// Run `node tests/browser/{spec}` from the workspace root with `env` and
/// `SCREENSHOT_DIR` (default `target/console-screenshots`); its output is
/// printed.
///
/// Panics: node cannot be started, or the spec exits non-zero (the panic
/// carries its output).
pub fn run_spec(spec: &str, env: &[(&str, String)]) {
    let root = repo_root();
    let shots = std::env::var("SCREENSHOT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| root.join("target/console-screenshots"));
    let out = Command::new("node")
        .arg(browser_dir().join(spec))
        .current_dir(&root)
        .env("SCREENSHOT_DIR", &shots)
        .envs(env.iter().map(|(k, v)| (*k, v.as_str())))
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
