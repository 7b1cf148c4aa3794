//! The README's "A first look by hand" and docs/http-api.md's "The main
//! flow with curl", taken from the documents as written and run in one
//! bash (`set -e`): registry, simulated bench, status, Earth command,
//! lease → snapshot → download checked against its sha256 → release.
//! Only the block's first line (the `cargo build`, which `./scripts/test.sh`
//! has done) is replaced by putting the built binaries on `PATH`.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The first ```sh block after the heading `heading` in `doc`.
fn sh_block(doc: &str, heading: &str) -> String {
    let text = std::fs::read_to_string(repo_root().join(doc)).unwrap();
    let at = text
        .find(heading)
        .unwrap_or_else(|| panic!("{doc} has no `{heading}`"));
    let rest = &text[at..];
    let start = rest.find("```sh\n").expect("a sh block") + "```sh\n".len();
    let len = rest[start..].find("```\n").expect("the block ends");
    rest[start..start + len].to_string()
}

/// Files and directories at the top of the checkout and in config/.
fn checkout_entries() -> Vec<String> {
    let mut out = Vec::new();
    for dir in [repo_root(), repo_root().join("config")] {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            out.push(e.path().display().to_string());
        }
    }
    out.sort();
    out
}

#[test]
fn the_first_look_and_the_curl_walk_through_run_as_written() {
    for port in [8080, 18830] {
        assert!(
            std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(),
            "127.0.0.1:{port} is taken: the documented first look needs it free"
        );
    }
    let first_look = sh_block("README.md", "## A first look by hand");
    let build = "cargo build --workspace --bins && export PATH=\"$PWD/target/debug:$PATH\"\n";
    assert!(
        first_look.starts_with(build),
        "the block starts with the build:\n{first_look}"
    );
    let walk = sh_block("docs/http-api.md", "## The main flow with curl");
    let script = format!(
        "{}\n{walk}\necho first-look-and-walk-through-done\n",
        first_look.replacen(build, "", 1)
    );

    let bins = benchlink_e2e::workspace_bin("cloud-registry")
        .parent()
        .unwrap()
        .to_path_buf();
    let path = format!(
        "{}:{}",
        bins.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let before = checkout_entries();
    let started = Instant::now();
    let child = Command::new("bash")
        .args(["-e", "-c", &script])
        .current_dir(repo_root())
        .env("PATH", path)
        .env_remove("BENCHLINK_TOKEN")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        // Its own process group: the registry and daemon it starts in the
        // background are stopped with it.
        .process_group(0)
        .spawn()
        .expect("bash runs");
    let pgid = child.id() as i32;
    let waiter = std::thread::spawn(move || {
        let out = child.wait_with_output();
        out.expect("bash output")
    });
    while !waiter.is_finished() && started.elapsed() < Duration::from_secs(180) {
        std::thread::sleep(Duration::from_millis(200));
    }
    // SAFETY: signals the process group made above.
    unsafe { libc::kill(-pgid, libc::SIGTERM) };
    let out = waiter.join().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    println!("{stdout}\n--- stderr ---\n{stderr}");
    assert!(
        out.status.success(),
        "the documented commands failed: {}",
        out.status
    );
    assert!(
        stdout.contains("first-look-and-walk-through-done"),
        "{stdout}"
    );
    assert!(
        stdout.contains("running, pid"),
        "edge-agent status: {stdout}"
    );
    assert!(stdout.contains("cam-front-01  camera  healthy"), "{stdout}");
    assert!(
        stdout.contains("北斗"),
        "the Earth command answered: {stdout}"
    );
    assert!(
        stdout.contains("snapshot.jpg: OK"),
        "sha256 checked: {stdout}"
    );
    assert!(stdout.contains("\"released\""), "{stdout}");
    assert_eq!(
        before,
        checkout_entries(),
        "the first look wrote into the checkout"
    );
}
