//! The bench TOML: errors name the key and its line; defaults; the token;
//! `edge-agent check-config` exit codes through the real binary.

use std::path::{Path, PathBuf};
use std::process::Command;

use edge_agent::config::{ConfigError, ConfigIssue, Durability, EdgeConfig, TokenSource};
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityType, LeaseMode};

const GOOD: &str = r#"
[provider]
provider_id = "provider-bench-07"
node_id = "bench-07"
labels = ["lab", "hardware-test"]

[registry]
mqtt_host = "registry.lab.example"
base_url = "https://registry.lab.example/"
token = "secret-token"

[[capabilities]]
id = "cam-front-01"
type = "camera"
display_name = "Front camera"
tags = ["front"]

[capabilities.driver]
backend = "sim"
"#;

fn parse(text: &str) -> Result<EdgeConfig, ConfigError> {
    EdgeConfig::parse(
        text,
        Path::new("/etc/benchlink-edge/config.toml"),
        None,
        None,
    )
}

fn only_issue(text: &str) -> ConfigIssue {
    let err = parse(text).expect_err("the config should be refused");
    let issues = err.issues();
    assert_eq!(issues.len(), 1, "expected exactly one issue, got: {err}");
    issues[0].clone()
}

/// 1-based line of the first line of `text` containing `needle`.
fn line_of(text: &str, needle: &str) -> usize {
    text.lines()
        .position(|l| l.contains(needle))
        .unwrap_or_else(|| panic!("`{needle}` not in the text"))
        + 1
}

#[test]
fn a_valid_file_fills_in_the_defaults() {
    let cfg = parse(GOOD).expect("valid");
    assert_eq!(cfg.provider.provider_id, "provider-bench-07");
    assert_eq!(cfg.provider.platform, "linux");
    assert_eq!(cfg.provider.network_zone, "lan");
    assert_eq!(
        cfg.provider.hostname,
        edge_agent::config::system_hostname(),
        "hostname defaults to the system's"
    );
    assert_eq!(cfg.registry.mqtt_port, 1883);
    assert_eq!(cfg.registry.topic_prefix, "benchlink/v1");
    assert_eq!(cfg.registry.base_url, "https://registry.lab.example");
    assert_eq!(cfg.registry.heartbeat_interval_seconds, 10);
    assert_eq!(cfg.registry.token_source, TokenSource::Inline);
    assert_eq!(cfg.state_dir, PathBuf::from("/var/lib/benchlink-edge"));
    assert_eq!(
        cfg.outbox.dir,
        PathBuf::from("/var/lib/benchlink-edge/outbox")
    );
    assert_eq!(
        cfg.outbox.db,
        PathBuf::from("/var/lib/benchlink-edge/outbox.sqlite3")
    );
    assert_eq!(cfg.outbox.disk_budget_bytes, 2048 * 1024 * 1024);
    assert_eq!(cfg.outbox.durability, Durability::Fsync);
    let cam = &cfg.capabilities[0];
    assert_eq!(cam.capability_type, CapabilityType::Camera);
    assert_eq!(cam.lease_mode, LeaseMode::Exclusive);
    assert!(cam.preemptible);
    assert!(!cam.safety_locked);
    assert_eq!(
        cam.evidence_modes,
        vec![ArtifactType::Image, ArtifactType::VideoClip]
    );
    assert_eq!(cam.driver.backend, "sim");
    assert!(
        !cam.driver.settings.contains_key("backend"),
        "backend is not a driver setting"
    );
    assert!(
        !format!("{cfg:?}").contains("secret-token"),
        "Debug output must not show the token"
    );
}

#[test]
fn systemd_state_directory_and_relative_paths_are_honoured() {
    let text = GOOD.replace(
        "[registry]",
        "[outbox]\ndir = \"spool\"\ndisk_budget_mb = 10\ndurability = \"os\"\n\n[registry]",
    );
    let cfg = EdgeConfig::parse(
        &text,
        Path::new("/srv/bench/edge.toml"),
        None,
        Some(Path::new("/var/lib/benchlink-edge:/var/lib/other")),
    )
    .expect("valid");
    assert_eq!(cfg.state_dir, PathBuf::from("/var/lib/benchlink-edge"));
    assert_eq!(cfg.outbox.dir, PathBuf::from("/srv/bench/spool"));
    assert_eq!(cfg.outbox.disk_budget_bytes, 10 * 1024 * 1024);
    assert_eq!(cfg.outbox.durability, Durability::Os);
}

#[test]
fn an_unknown_key_is_named_with_its_line() {
    let text = GOOD.replace("labels =", "network_zon = \"lan\"\nlabels =");
    let issue = only_issue(&text);
    assert_eq!(issue.key, "provider.network_zon");
    assert_eq!(issue.line, Some(line_of(&text, "network_zon")));
    assert!(issue.message.contains("unknown field"), "{}", issue.message);
}

#[test]
fn a_value_of_the_wrong_type_is_named_with_its_line() {
    let text = GOOD.replace(
        "mqtt_host = \"registry.lab.example\"",
        "mqtt_host = \"registry.lab.example\"\nmqtt_port = \"1883\"",
    );
    let issue = only_issue(&text);
    assert_eq!(issue.key, "registry.mqtt_port");
    assert_eq!(issue.line, Some(line_of(&text, "mqtt_port")));
    assert!(issue.message.contains("invalid type"), "{}", issue.message);
}

#[test]
fn a_missing_key_is_named_with_the_line_of_its_table() {
    let text = GOOD.replace("base_url = \"https://registry.lab.example/\"\n", "");
    let issue = only_issue(&text);
    assert_eq!(issue.key, "registry.base_url");
    assert_eq!(issue.line, Some(line_of(&text, "[registry]")));
}

#[test]
fn an_unknown_capability_type_lists_the_known_ones() {
    let text = GOOD.replace("type = \"camera\"", "type = \"camra\"");
    let issue = only_issue(&text);
    assert_eq!(issue.key, "capabilities[0].type");
    assert_eq!(issue.line, Some(line_of(&text, "camra")));
    assert!(
        issue.message.contains("programmable_power_supply"),
        "{}",
        issue.message
    );
}

#[test]
fn a_second_capability_with_the_same_id_is_refused_at_its_line() {
    let second = "\n[[capabilities]]\nid = \"cam-front-01\"\ntype = \"microphone\"\n[capabilities.driver]\nbackend = \"sim\"\n";
    let text = format!("{GOOD}{second}");
    let issue = only_issue(&text);
    assert_eq!(issue.key, "capabilities[1].id");
    let second_id_line = text
        .lines()
        .enumerate()
        .filter(|(_, l)| l.contains("id = \"cam-front-01\""))
        .nth(1)
        .map(|(i, _)| i + 1);
    assert_eq!(issue.line, second_id_line);
    assert!(issue.message.contains("used twice"));
}

#[test]
fn several_problems_are_all_reported() {
    let text = GOOD
        .replace("node_id = \"bench-07\"", "node_id = \"bench 07\"")
        .replace(
            "tags = [\"front\"]",
            "tags = [\"front\"]\ndefault_priority = 150",
        );
    let err = parse(&text).expect_err("refused");
    let keys: Vec<&str> = err.issues().iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        vec!["provider.node_id", "capabilities[0].default_priority"]
    );
    let rendered = err.to_string();
    assert!(
        rendered.contains(&format!(
            "/etc/benchlink-edge/config.toml:{}: capabilities[0].default_priority: 150 is out of range 0..=100",
            line_of(&text, "default_priority")
        )),
        "{rendered}"
    );
}

#[test]
fn a_missing_driver_backend_is_named() {
    let text = GOOD.replace("backend = \"sim\"", "device = 0");
    let issue = only_issue(&text);
    assert_eq!(issue.key, "capabilities[0].driver.backend");
    assert_eq!(issue.line, Some(line_of(&text, "[capabilities.driver]")));
}

#[test]
fn a_driver_setting_error_names_the_key_inside_the_driver_table_and_its_line() {
    let text = GOOD.replace("backend = \"sim\"", "backend = \"sim\"\nfps = \"fast\"");
    let cfg = parse(&text).expect("the shape is valid; the driver refuses the value");
    let err = cfg
        .build_drivers()
        .err()
        .expect("the camera driver refuses fps");
    let issues = err.issues();
    assert_eq!(issues.len(), 1, "{err}");
    assert_eq!(issues[0].key, "capabilities[0].driver.fps");
    assert_eq!(issues[0].line, Some(line_of(&text, "fps = \"fast\"")));
    assert!(
        issues[0].message.contains("cam-front-01"),
        "{}",
        issues[0].message
    );
}

#[test]
fn an_unknown_driver_backend_is_named_with_its_line_and_the_known_backends() {
    let text = GOOD.replace("backend = \"sim\"", "backend = \"v4l9\"");
    let cfg = parse(&text).expect("shape valid");
    let err = cfg.build_drivers().err().expect("unknown backend");
    let issue = &err.issues()[0];
    assert_eq!(issue.key, "capabilities[0].driver.backend");
    assert_eq!(issue.line, Some(line_of(&text, "v4l9")));
    assert!(issue.message.contains("sim"), "{}", issue.message);
}

#[test]
fn the_token_comes_from_a_file_or_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("token"), "  from-file\n").unwrap();
    let text = GOOD.replace("token = \"secret-token\"", "token_file = \"token\"");
    let cfg = EdgeConfig::parse(&text, &dir.path().join("edge.toml"), Some("from-env"), None)
        .expect("valid");
    assert_eq!(cfg.registry.token, "from-file");
    assert_eq!(
        cfg.registry.token_source,
        TokenSource::File(dir.path().join("token"))
    );

    let text = GOOD.replace("token = \"secret-token\"\n", "");
    let cfg = parse_with_env(&text, Some("from-env")).expect("valid");
    assert_eq!(cfg.registry.token, "from-env");
    assert_eq!(cfg.registry.token_source, TokenSource::Env);

    let err = parse_with_env(&text, None).expect_err("no token anywhere");
    assert_eq!(err.issues()[0].key, "registry.token");
    assert!(err.to_string().contains("BENCHLINK_TOKEN"));
}

fn parse_with_env(text: &str, token: Option<&str>) -> Result<EdgeConfig, ConfigError> {
    EdgeConfig::parse(
        text,
        Path::new("/etc/benchlink-edge/config.toml"),
        token,
        None,
    )
}

#[test]
fn an_unreadable_token_file_is_named_with_its_line() {
    let text = GOOD.replace(
        "token = \"secret-token\"",
        "token_file = \"/nonexistent/benchlink/token\"",
    );
    let issue = only_issue(&text);
    assert_eq!(issue.key, "registry.token_file");
    assert_eq!(issue.line, Some(line_of(&text, "token_file")));
    assert!(issue.message.contains("/nonexistent/benchlink/token"));
}

// ---------------------------------------------------------------------------
// The real binary.

fn check_config(path: &Path) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_edge-agent"))
        .args(["check-config", "--config"])
        .arg(path)
        .env_remove("BENCHLINK_TOKEN")
        .output()
        .expect("run edge-agent")
}

#[test]
fn check_config_exits_0_for_a_usable_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.toml");
    std::fs::write(&path, GOOD).unwrap();
    let out = check_config(&path);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("cam-front-01"), "{stdout}");
}

#[test]
fn check_config_exits_2_and_prints_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.toml");
    let text = GOOD.replace("backend = \"sim\"", "backend = \"sim\"\nfps = \"fast\"");
    std::fs::write(&path, &text).unwrap();
    let out = check_config(&path);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "{}:{}: capabilities[0].driver.fps:",
        path.display(),
        line_of(&text, "fps = ")
    );
    assert!(
        stderr.contains(&expected),
        "expected `{expected}` in:\n{stderr}"
    );
}

#[test]
fn check_config_exits_2_for_a_missing_file() {
    let out = check_config(Path::new("/nonexistent/benchlink/edge.toml"));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("cannot read"));
}

fn repo_file(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").join(rel)
}

#[test]
fn the_shipped_sim_config_passes_check_config() {
    let out = Command::new(env!("CARGO_BIN_EXE_edge-agent"))
        .args(["check-config", "--config"])
        .arg(repo_file("config/edge-agent.sim.toml"))
        // The sim config takes its provider token from the environment.
        .env("BENCHLINK_TOKEN", "example")
        .output()
        .expect("run edge-agent");
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("8 capabilities"), "{stdout}");
}

#[test]
fn the_shipped_example_config_passes_check_config() {
    // The example reads its token from a file that only exists on a bench.
    let text = std::fs::read_to_string(repo_file("config/edge-agent.example.toml")).unwrap();
    let text = text.replace(
        "token_file = \"/etc/benchlink-edge/token\"",
        "token = \"example\"",
    );
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge-agent.toml");
    std::fs::write(&path, text).unwrap();
    let out = check_config(&path);
    assert_eq!(
        out.status.code(),
        Some(0),
        "stderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn labels_and_tags_over_the_registrys_limits_are_refused_here() {
    let labels: Vec<String> = (0..65).map(|i| format!("\"l{i}\"")).collect();
    let text = GOOD.replace(
        r#"labels = ["lab", "hardware-test"]"#,
        &format!("labels = [{}]", labels.join(", ")),
    );
    let issue = only_issue(&text);
    assert_eq!(issue.key, "provider.labels", "{issue:?}");
    assert!(issue.message.contains("at most 64"), "{issue:?}");

    let tags: Vec<String> = (0..65).map(|i| format!("\"t{i}\"")).collect();
    let text = GOOD.replace(
        r#"tags = ["front"]"#,
        &format!("tags = [{}]", tags.join(", ")),
    );
    let issue = only_issue(&text);
    assert_eq!(issue.key, "capabilities[0].tags", "{issue:?}");
    assert!(issue.message.contains("at most 64"), "{issue:?}");
}

/// `GOOD` with a relay capability whose table has `on_release = <value>`.
fn with_relay_on_release(value: &str) -> String {
    format!(
        "{GOOD}\n[[capabilities]]\nid = \"relay-01\"\ntype = \"relay\"\non_release = {value}\n[capabilities.driver]\nbackend = \"sim\"\n"
    )
}

#[test]
fn on_release_actions_are_kept_in_order_with_their_params() {
    let cfg = parse(&with_relay_on_release(
        r#"[{ action = "switch_off", params = { channel = 1 } }, { action = "switch_off", params = { channel = 2 } }]"#,
    ))
    .expect("valid");
    let relay = cfg
        .capabilities
        .iter()
        .find(|c| c.id == "relay-01")
        .expect("relay");
    let json: Vec<_> = relay.on_release.iter().map(|a| a.to_json()).collect();
    assert_eq!(
        serde_json::Value::Array(json),
        serde_json::json!([
            {"action": "switch_off", "params": {"channel": 1}},
            {"action": "switch_off", "params": {"channel": 2}},
        ])
    );
    assert!(cfg.capabilities[0].on_release.is_empty(), "default: none");
}

#[test]
fn an_on_release_action_the_type_does_not_support_is_named_with_its_line() {
    let text = with_relay_on_release(r#"[{ action = "power_off" }]"#);
    let issue = only_issue(&text);
    assert_eq!(issue.key, "capabilities[1].on_release[0].action");
    assert_eq!(issue.line, Some(line_of(&text, "on_release")));
    assert!(
        issue.message.contains("relay does not support `power_off`")
            && issue.message.contains("switch_off"),
        "{}",
        issue.message
    );
    let issue = only_issue(&with_relay_on_release(r#"[{ action = "explode" }]"#));
    assert!(
        issue.message.contains("unknown action `explode`"),
        "{}",
        issue.message
    );
}

#[test]
fn on_release_params_must_be_a_table() {
    let err = parse(&with_relay_on_release(
        r#"[{ action = "switch_off", params = 1 }]"#,
    ))
    .expect_err("refused");
    let text = err.to_string();
    assert!(text.contains("on_release"), "{text}");
}

/// A PSU and a robot with `[capabilities.constraints]` (besides GOOD's
/// camera).
fn with_constraints(psu: &str, robot: &str) -> String {
    format!(
        "{GOOD}
[[capabilities]]
id = \"psu-01\"
type = \"programmable_power_supply\"
[capabilities.driver]
backend = \"sim\"
[capabilities.constraints]
{psu}

[[capabilities]]
id = \"robot-01\"
type = \"thumb_robot\"
[capabilities.driver]
backend = \"sim\"
[capabilities.constraints]
{robot}
"
    )
}

#[test]
fn constraints_are_kept_for_the_registration() {
    let text = with_constraints(
        "max_voltage_v = 5.5\nmax_current_a = 1",
        "work_area_mm = { x_min = 0.0, x_max = 60.0, y_min = 10.0, y_max = 130.0 }",
    );
    let cfg = parse(&text).expect("valid");
    let psu = &cfg.capabilities[1].constraints;
    assert_eq!(psu["max_voltage_v"], 5.5);
    assert_eq!(psu["max_current_a"], 1);
    let robot = &cfg.capabilities[2].constraints;
    assert_eq!(robot["work_area_mm"]["y_min"], 10.0);
    assert!(cfg.capabilities[0].constraints.is_empty(), "none declared");
}

#[test]
fn an_unknown_or_misplaced_constraint_is_named_with_its_line() {
    let text = with_constraints(
        "max_volts = 5.5",
        "work_area_mm = { x_min = 0.0, x_max = 60.0, y_min = 0.0, y_max = 1.0 }",
    );
    let issue = only_issue(&text);
    assert_eq!(issue.key, "capabilities[1].constraints.max_volts");
    assert_eq!(issue.line, Some(line_of(&text, "max_volts")));
    assert!(
        issue
            .message
            .contains("unknown constraint; known: max_voltage_v"),
        "{}",
        issue.message
    );

    let text = with_constraints("max_voltage_v = 5.5", "max_current_a = 1.0");
    let issue = only_issue(&text);
    assert_eq!(issue.key, "capabilities[2].constraints.max_current_a");
    assert!(
        issue
            .message
            .contains("applies to programmable_power_supply"),
        "{}",
        issue.message
    );

    let text = with_constraints(
        "max_voltage_v = -1.0",
        "work_area_mm = { x_min = 9.0, x_max = 1.0, y_min = 0.0, y_max = 1.0 }",
    );
    let err = parse(&text).expect_err("refused");
    let keys: Vec<&str> = err.issues().iter().map(|i| i.key.as_str()).collect();
    assert_eq!(
        keys,
        [
            "capabilities[1].constraints.max_voltage_v",
            "capabilities[2].constraints.work_area_mm"
        ],
        "{err}"
    );
}

#[test]
fn regions_are_checked_and_kept_for_registration() {
    let with = |regions: &str| {
        GOOD.replace(
            "tags = [\"front\"]\n",
            &format!("tags = [\"front\"]\n{regions}\n"),
        )
    };
    let cfg = parse(&with(
        r#"regions = { led = { box = [0.8, 0.1, 0.1, 0.1], kind = "colour" } }"#,
    ))
    .expect("valid regions");
    let regions = &cfg.capabilities[0].regions;
    assert_eq!(regions["led"]["kind"], "colour");
    assert_eq!(regions["led"]["box"][0], 0.8);
    let issue = only_issue(&with(
        r#"regions = { led = { box = [0.95, 0.1, 0.1, 0.1], kind = "colour" } }"#,
    ));
    assert_eq!(issue.key, "capabilities[0].regions.led.box");
    let issue = only_issue(&with(
        r#"regions = { led = { box = [0.1, 0.1, 0.1, 0.1], kind = "hue" } }"#,
    ));
    assert_eq!(issue.key, "capabilities[0].regions.led");
    assert!(parse(GOOD).unwrap().capabilities[0].regions.is_empty());
}

#[test]
fn camera_regions_are_kept_for_the_registration_and_bad_ones_named() {
    let text = format!(
        "{GOOD}[capabilities.regions.led]\nbox = [0.6, 0.1, 0.03, 0.05]\nkind = \"colour\"\n"
    );
    let cfg = parse(&text).expect("valid");
    let regions = &cfg.capabilities[0].regions;
    assert_eq!(regions["led"]["kind"], "colour");
    assert_eq!(regions["led"]["box"][0], 0.6);

    let text = format!(
        "{GOOD}[capabilities.regions.led]\nbox = [0.9, 0.1, 0.3, 0.05]\nkind = \"colour\"\n"
    );
    let issue = only_issue(&text);
    assert_eq!(issue.key, "capabilities[0].regions.led.box");
    assert!(
        issue.message.contains("fractions 0..1"),
        "{}",
        issue.message
    );

    let text =
        format!("{GOOD}[capabilities.regions.led]\nbox = [0.1, 0.1, 0.3, 0.05]\nkind = \"hue\"\n");
    let issue = only_issue(&text);
    assert_eq!(issue.key, "capabilities[0].regions.led");
}

#[test]
fn a_bad_simulated_device_setting_is_named_with_its_line() {
    let text = format!("{GOOD}\n[simulated_device]\nled_awake = \"purple\"\n");
    let issue = only_issue(&text);
    assert_eq!(issue.key, "simulated_device.led_awake");
    assert_eq!(issue.line, Some(line_of(&text, "purple")));
    assert!(
        issue.message.contains("not one of red"),
        "{}",
        issue.message
    );

    let text = format!("{GOOD}\n[simulated_device]\nled_delay = 5\n");
    assert_eq!(only_issue(&text).key, "simulated_device.led_delay");

    let ok = parse(&format!(
        "{GOOD}\n[simulated_device]\nled_awake = \"red\"\n"
    ))
    .unwrap();
    assert_eq!(ok.simulated_device.unwrap().led_awake, "red");
    assert!(parse(GOOD).unwrap().simulated_device.is_none());
}

#[test]
fn a_device_scene_without_a_simulated_device_is_refused() {
    let text = format!("{GOOD}scene = \"device\"\n");
    let err = parse(&text)
        .unwrap()
        .build_drivers()
        .err()
        .expect("refused");
    let issue = &err.issues()[0];
    assert_eq!(issue.key, "capabilities[0].driver.scene");
    assert!(
        issue.message.contains("[simulated_device]"),
        "{}",
        issue.message
    );
}

#[test]
fn the_metrics_listener_is_off_unless_an_address_is_given() {
    assert_eq!(parse(GOOD).unwrap().metrics.listen, None);
    let on = format!("{GOOD}\n[metrics]\nlisten = \"127.0.0.1:9187\"\n");
    assert_eq!(
        parse(&on).unwrap().metrics.listen,
        Some("127.0.0.1:9187".parse().unwrap())
    );
    let empty = format!("{GOOD}\n[metrics]\nlisten = \"\"\n");
    assert_eq!(parse(&empty).unwrap().metrics.listen, None);
    let disabled = format!("{GOOD}\n[metrics]\nenabled = false\nlisten = \"127.0.0.1:9187\"\n");
    assert_eq!(parse(&disabled).unwrap().metrics.listen, None);
}

#[test]
fn check_config_refuses_a_metrics_address_that_is_not_ip_and_port() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.toml");
    let text = format!("{GOOD}\n[metrics]\nlisten = \"localhost:99999\"\n");
    std::fs::write(&path, &text).unwrap();
    let out = check_config(&path);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let expected = format!(
        "{}:{}: metrics.listen:",
        path.display(),
        line_of(&text, "listen = ")
    );
    assert!(
        stderr.contains(&expected) && stderr.contains("localhost:99999"),
        "expected `{expected}` in:\n{stderr}"
    );
}

#[test]
fn a_taken_metrics_port_stops_the_start_with_the_key_named() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("edge.toml");
    let text = format!(
        "state_dir = \"{}\"\n{GOOD}\n[metrics]\nlisten = \"{addr}\"\n",
        dir.path().join("state").display()
    );
    std::fs::write(&path, &text).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_edge-agent"))
        .args(["run", "--config"])
        .arg(&path)
        .env_remove("BENCHLINK_TOKEN")
        .env_remove("NOTIFY_SOCKET")
        .output()
        .expect("run edge-agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "stderr: {stderr}");
    assert!(
        stderr.contains(&format!(
            "cannot listen for metrics on {addr} (`[metrics] listen`)"
        )),
        "{stderr}"
    );
}
