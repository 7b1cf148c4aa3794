//! `edge-agent devices` as a technician runs it on this machine: a table
//! on stdout, nothing from the audio libraries on stderr, no `null` PCM
//! listed as a microphone, and a JSON report of a readable size.

use std::process::Command;

fn devices(args: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_edge-agent"))
        .arg("devices")
        .args(args)
        // No audio server: the case that made ALSA and JACK print most.
        .env("PULSE_SERVER", "unix:/nonexistent")
        .output()
        .expect("run edge-agent devices");
    assert!(out.status.success(), "exit status {}", out.status);
    (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_device_table_comes_without_audio_library_noise() {
    let (table, stderr) = devices(&[]);
    for section in ["CAMERAS", "AUDIO (", "SERIAL PORTS"] {
        assert!(table.contains(section), "{section} missing:\n{table}");
    }
    assert!(
        !stderr.contains("ALSA lib") && !stderr.contains("jack"),
        "library noise on stderr:\n{stderr}"
    );
    for line in table
        .lines()
        .filter(|l| l.starts_with("  in ") || l.starts_with("  out"))
    {
        let id = line.split_whitespace().nth(1).unwrap_or_default();
        assert_ne!(
            id.trim_start_matches('*'),
            "null",
            "ALSA's null device listed: {line}"
        );
    }
}

#[test]
fn the_json_report_is_small_and_names_every_section() {
    let (json, _) = devices(&["--json"]);
    let v: serde_json::Value = serde_json::from_str(&json).expect("one JSON document");
    for key in [
        "cameras",
        "audio_host",
        "audio_inputs",
        "audio_outputs",
        "serial_ports",
        "errors",
    ] {
        assert!(v.get(key).is_some(), "{key} missing: {v}");
    }
    for d in v["audio_inputs"].as_array().unwrap() {
        assert_ne!(d["id"], "null", "{d}");
        for r in d["supported"].as_array().unwrap() {
            assert!(
                r["min_channels"].as_u64() <= r["max_channels"].as_u64(),
                "{r}"
            );
        }
    }
    assert!(json.len() < 8 * 1024, "{} bytes of JSON", json.len());
}
