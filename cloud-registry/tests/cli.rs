//! The `cloud-registry` command line through the real binary: output into
//! a closed pipe, log colours, `check-config` reports, and token
//! management (`token create / list / revoke`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use tempfile::TempDir;

fn registry() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cloud-registry"))
}

/// A config storing under `dir` with everything else at its defaults.
fn write_config(dir: &TempDir, extra: &str) -> PathBuf {
    let path = dir.path().join("registry.toml");
    let store = dir.path().join("registry.sqlite3");
    std::fs::write(
        &path,
        format!(
            "[store]\npath = {:?}\n[http]\nlisten = \"127.0.0.1:0\"\n[mqtt]\nlisten = \"127.0.0.1:0\"\n{extra}",
            store.display().to_string()
        ),
    )
    .unwrap();
    path
}

/// Run `cmd` with stdout a pipe whose reading end is already closed (what
/// `| head -1` leaves behind once `head` has its line).
fn run_into_closed_pipe(mut cmd: Command) -> Output {
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    cmd.stdout(writer)
        .stderr(Stdio::piped())
        .output()
        .expect("the binary runs")
}

fn assert_quiet(what: &str, out: &Output) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("panicked"), "{what}: {stderr}");
    assert!(!stderr.contains("Broken pipe"), "{what}: {stderr}");
    assert!(out.status.success(), "{what}: {:?} {stderr}", out.status);
}

fn shipped_config() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/cloud-registry.toml")
}

#[test]
fn output_into_a_closed_pipe_ends_quietly() {
    let dir = TempDir::new().unwrap();
    let config = write_config(&dir, "");

    let mut cmd = registry();
    cmd.args(["check-config", "--config"]).arg(shipped_config());
    assert_quiet("check-config", &run_into_closed_pipe(cmd));

    let mut cmd = registry();
    cmd.args(["token", "create", "--role", "viewer", "--name", "viewer-1"])
        .arg("--config")
        .arg(&config);
    assert_quiet("token create", &run_into_closed_pipe(cmd));
}

/// Start `serve` with `config`, wait for its ready line, stop it, and
/// return everything it logged on stderr.
fn serve_and_collect_stderr(config: &Path, env: &[(&str, &str)]) -> String {
    use std::io::{BufRead, BufReader, Read};
    let mut cmd = registry();
    cmd.arg("serve")
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "info")
        .env_remove("NO_COLOR")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn cloud-registry serve");
    let mut stdout = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    stdout.read_line(&mut line).expect("ready line");
    assert!(line.contains("\"ready\""), "{line}");
    // Everything up to "registry ready" is written before the ready line.
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    stderr
}

#[test]
fn logs_into_a_pipe_or_file_have_no_colour_codes() {
    let dir = TempDir::new().unwrap();
    let config = write_config(&dir, "");
    let stderr = serve_and_collect_stderr(&config, &[]);
    assert!(stderr.contains("registry ready"), "{stderr}");
    assert!(
        !stderr.contains('\u{1b}'),
        "ANSI escape codes in a non-terminal log: {stderr:?}"
    );
}
