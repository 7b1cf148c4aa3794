//! The `bench-sim` binary as another process (the demo, e2e tests) uses it.

mod devsim_support;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Duration;

use devsim_support::{open, query, read_until, send};

const REPLY: Duration = Duration::from_millis(300);

fn spawn(args: &[&str]) -> (Child, BufReader<ChildStdout>) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_bench-sim"))
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("spawn bench-sim");
    let stdout = BufReader::new(child.stdout.take().unwrap());
    (child, stdout)
}

fn next_line(out: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    out.read_line(&mut line).expect("read bench-sim stdout");
    line.trim_end().to_string()
}

fn terminate(child: &mut Child) -> std::process::ExitStatus {
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: plain kill(2) on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGTERM) }, 0);
    child.wait().unwrap()
}

#[test]
fn prints_one_line_per_device_and_cleans_up_its_links_on_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (mut child, mut out) = spawn(&["--dir", d, "--korad", "--lcus", "4", "--grbl"]);
    let lines: Vec<String> = (0..3).map(|_| next_line(&mut out)).collect();
    for (line, name) in lines.iter().zip(["korad", "lcus", "grbl"]) {
        let expected_prefix = format!("{name} {d}/{name} -> /dev/pts/");
        assert!(line.starts_with(&expected_prefix), "{line:?}");
        let pty = line.rsplit(" -> ").next().unwrap();
        assert_eq!(
            std::fs::read_link(dir.path().join(name)).unwrap(),
            PathBuf::from(pty)
        );
    }
    let mut port = open(&dir.path().join("korad"));
    assert_eq!(query(port.as_mut(), "*IDN?", REPLY), "KORADKA3005PV2.0");

    assert!(terminate(&mut child).success());
    for name in ["korad", "lcus", "grbl"] {
        assert!(
            std::fs::symlink_metadata(dir.path().join(name)).is_err(),
            "{name} link left"
        );
    }
}

#[test]
fn json_mode_lists_devices_and_answers_vanish_and_reappear_on_stdin() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (mut child, mut out) = spawn(&[
        "--dir",
        d,
        "--by-id",
        "--korad",
        "--dut-console",
        "--link-dut-to-korad",
        "--dut-pace",
        "0.1",
        "--json",
    ]);
    let list: serde_json::Value = serde_json::from_str(&next_line(&mut out)).unwrap();
    let devices = list["devices"].as_array().unwrap();
    let names: Vec<&str> = devices
        .iter()
        .map(|d| d["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["korad", "dut_console"]);
    let korad = PathBuf::from(devices[0]["path"].as_str().unwrap());
    let console = PathBuf::from(devices[1]["path"].as_str().unwrap());
    assert_eq!(korad, dir.path().join("usb-Korad_KA3005P-if00"));

    // The DUT is wired to the PSU: it boots when the output turns on.
    let mut console_port = open(&console);
    let mut psu_port = open(&korad);
    send(psu_port.as_mut(), b"VSET1:05.00OUT1");
    read_until(
        console_port.as_mut(),
        "Benchlink DUT v0.9.2 ready",
        Duration::from_secs(1),
    );

    let stdin = child.stdin.as_mut().unwrap();
    writeln!(stdin, "vanish korad").unwrap();
    let event: serde_json::Value = serde_json::from_str(&next_line(&mut out)).unwrap();
    assert_eq!(
        (event["event"].as_str(), event["present"].as_bool()),
        (Some("vanished"), Some(false))
    );
    assert!(std::fs::symlink_metadata(&korad).is_err());
    writeln!(stdin, "reappear korad").unwrap();
    let event: serde_json::Value = serde_json::from_str(&next_line(&mut out)).unwrap();
    assert_eq!(event["event"], "reappeared");
    assert_eq!(
        std::fs::read_link(&korad).unwrap(),
        PathBuf::from(event["pty"].as_str().unwrap())
    );

    writeln!(stdin, "quit").unwrap();
    assert!(child.wait().unwrap().success());
    assert!(std::fs::symlink_metadata(&console).is_err());
}

#[test]
fn refuses_to_start_with_no_device_selected() {
    let dir = tempfile::tempdir().unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_bench-sim"))
        .args(["--dir", dir.path().to_str().unwrap()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .unwrap();
    assert!(!status.success());
}

/// Every flag `bench-sim --help` offers is explained in docs/devices.md,
/// the page a technician reads to try the edge without hardware.
#[test]
fn every_flag_is_documented_in_devices_md() {
    let out = Command::new(env!("CARGO_BIN_EXE_bench-sim"))
        .arg("--help")
        .output()
        .expect("run bench-sim --help");
    assert!(out.status.success(), "{out:?}");
    let help = String::from_utf8(out.stdout).unwrap();
    let doc_path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/devices.md");
    let doc = std::fs::read_to_string(&doc_path).expect("read docs/devices.md");
    let flags: Vec<&str> = help
        .split(|c: char| c.is_whitespace() || c == ',' || c == '=')
        .filter(|w| w.starts_with("--") && w.len() > 2)
        .filter(|w| !matches!(*w, "--help" | "--version"))
        .collect();
    assert!(flags.len() >= 15, "flags parsed from --help: {flags:?}");
    let missing: Vec<&&str> = flags
        .iter()
        .filter(|f| !doc.contains(&format!("`{f}")))
        .collect();
    assert!(
        missing.is_empty(),
        "bench-sim flags not in docs/devices.md: {missing:?}"
    );
}
