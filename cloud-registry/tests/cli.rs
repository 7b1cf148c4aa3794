//! The `cloud-registry` command line through the real binary: output into
//! a closed pipe, log colours, `check-config` reports, and token
//! management (`token create / list / revoke`).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use benchlink_testkit::find;
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
        .arg("--create-store")
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

/// A running `cloud-registry serve`, killed on drop.
struct Served {
    child: std::process::Child,
    base: String,
    /// The embedded broker, HOST:PORT.
    mqtt: String,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn serve(config: &Path, token_file: &Path) -> Served {
    use std::io::{BufRead, BufReader};
    let mut child = registry()
        .arg("serve")
        .arg("--config")
        .arg(config)
        .arg("--bootstrap-admin-token-file")
        .arg(token_file)
        .env("RUST_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("spawn cloud-registry serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("ready line");
    let ready: serde_json::Value = serde_json::from_str(&line).expect("ready line is JSON");
    Served {
        child,
        base: format!("http://{}", ready["http"].as_str().unwrap()),
        mqtt: ready["mqtt"].as_str().unwrap().to_string(),
    }
}

fn token_cmd(config: &Path, args: &[&str]) -> Output {
    registry()
        .arg("token")
        .args(args)
        .arg("--config")
        .arg(config)
        .output()
        .expect("the binary runs")
}

async fn status_with(base: &str, token: &str) -> u16 {
    reqwest::Client::new()
        .get(format!("{base}/api/v1/capabilities"))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET sent")
        .status()
        .as_u16()
}

/// A second registry on the same HTTP port fails at once and says why
/// once; one on another port but the same store file is refused too.
#[test]
fn a_second_registry_on_a_taken_port_or_store_says_why_once() {
    let dir = TempDir::new().unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let config = write_config(&dir, "");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "listen = \"127.0.0.1:0\"\n[mqtt]",
        &format!("listen = \"127.0.0.1:{port}\"\n[mqtt]"),
    );
    std::fs::write(&config, text).unwrap();
    let _first = serve(&config, &dir.path().join("admin.token"));

    let second = registry()
        .args(["serve", "--config"])
        .arg(&config)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(
        err.contains(&format!("cannot listen for HTTP on 127.0.0.1:{port}")),
        "{err}"
    );
    assert_eq!(err.matches("Address already in use").count(), 1, "{err}");

    let other = dir.path().join("other-port.toml");
    let text = std::fs::read_to_string(&config)
        .unwrap()
        .replace(&format!("127.0.0.1:{port}"), "127.0.0.1:0");
    std::fs::write(&other, text).unwrap();
    let third = registry()
        .args(["serve", "--config"])
        .arg(&other)
        .env("RUST_LOG", "off")
        .output()
        .unwrap();
    assert!(!third.status.success());
    let err = String::from_utf8_lossy(&third.stderr);
    assert_eq!(
        err.matches("is in use by another registry process").count(),
        1,
        "{err}"
    );
}

/// Whether the broker at `addr` (HOST:PORT) accepts an MQTT login as
/// `user` (also the client id) with `password`.
async fn mqtt_login(addr: &str, user: &str, password: &str) -> bool {
    let (host, port) = addr.rsplit_once(':').unwrap();
    let mut opts = rumqttc::MqttOptions::new(user, host, port.parse::<u16>().unwrap());
    opts.set_credentials(user, password);
    let (_client, mut events) = rumqttc::AsyncClient::new(opts, 10);
    let first = tokio::time::timeout(std::time::Duration::from_secs(10), async {
        loop {
            match events.poll().await {
                Ok(rumqttc::Event::Incoming(rumqttc::Packet::ConnAck(ack))) => {
                    return ack.code == rumqttc::ConnectReturnCode::Success
                }
                Ok(_) => {}
                Err(_) => return false,
            }
        }
    })
    .await;
    first.expect("the broker answers a login within 10 s")
}

/// A provider token created with the CLI logs in to the embedded broker at
/// once (before any HTTP use), and is refused at the next connect once
/// revoked with the CLI.
#[tokio::test]
async fn mqtt_logins_follow_tokens_created_and_revoked_with_the_cli() {
    let dir = TempDir::new().unwrap();
    let config = write_config(&dir, "");
    let served = serve(&config, &dir.path().join("admin.token"));
    let out = token_cmd(
        &config,
        &["create", "--role", "provider", "--name", "prov-cli-1"],
    );
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(mqtt_login(&served.mqtt, "prov-cli-1", &token).await);
    // The name must match the token's principal.
    assert!(!mqtt_login(&served.mqtt, "prov-cli-2", &token).await);

    let out = token_cmd(&config, &["revoke", "--name", "prov-cli-1"]);
    assert!(out.status.success(), "{out:?}");
    assert!(!mqtt_login(&served.mqtt, "prov-cli-1", &token).await);
    drop(served);
}

#[tokio::test]
async fn token_list_and_revoke_work_while_the_registry_runs() {
    let dir = TempDir::new().unwrap();
    let config = write_config(&dir, "");
    let served = serve(&config, &dir.path().join("admin.token"));

    let out = token_cmd(
        &config,
        &["create", "--role", "viewer", "--name", "viewer-1"],
    );
    assert!(out.status.success(), "{out:?}");
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(token.starts_with("blk_"), "{token}");
    assert_eq!(status_with(&served.base, &token).await, 200);

    // Names shorter and longer than the others.
    let long_name = "audit:hardware-auditor-with-a-name-longer-than-forty-characters-01";
    for name in ["v", long_name] {
        let out = token_cmd(
            &config,
            &["create", "--role", "audit_agent", "--name", name],
        );
        assert!(out.status.success(), "{out:?}");
    }

    // The table and the JSON list name the token, never its secret.
    let out = token_cmd(&config, &["list"]);
    assert!(out.status.success(), "{out:?}");
    let table = String::from_utf8(out.stdout).unwrap();
    assert!(table.starts_with("NAME"), "{table}");
    let row = table.lines().find(|l| l.starts_with("viewer-1")).unwrap();
    assert!(row.contains("viewer") && row.ends_with(" no"), "{row}");
    assert!(table.contains("bootstrap-admin"), "{table}");
    assert!(!table.contains(&token), "{table}");
    // Every column starts at the same place on every line, two spaces
    // after the widest cell of the column before.
    let header = table.lines().next().unwrap();
    let columns: Vec<usize> = ["ROLE", "CREATED_AT", "REVOKED"]
        .iter()
        .map(|c| header.find(c).unwrap())
        .collect();
    assert_eq!(columns[0], long_name.len() + 2, "{table}");
    assert_eq!(columns[1], columns[0] + "audit_agent".len() + 2, "{table}");
    assert_eq!(table.lines().count(), 5, "{table}");
    for line in table.lines() {
        let cells: Vec<&str> = line.split_whitespace().collect();
        assert_eq!(cells.len(), 4, "{line}");
        for (&at, cell) in columns.iter().zip(&cells[1..]) {
            assert_eq!(line.get(at - 2..at), Some("  "), "{table}");
            assert!(line[at..].starts_with(cell), "{table}");
        }
    }

    let out = token_cmd(&config, &["revoke", "--name", "viewer-1"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).trim(),
        "revoked 1 token(s) of `viewer-1`"
    );
    // The running registry notices within a second.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while status_with(&served.base, &token).await != 401 {
        assert!(
            std::time::Instant::now() < deadline,
            "revoked token still accepted"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    let out = token_cmd(&config, &["list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let entry = find(&list["tokens"], "name", "viewer-1").clone();
    assert_eq!(entry["role"], "viewer");
    assert_eq!(entry["revoked"], true);
    assert!(!list.to_string().contains(&token));

    let out = token_cmd(&config, &["revoke", "--name", "nobody"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no token named `nobody`"),
        "{out:?}"
    );
    drop(served);
}

/// A token command run against a config whose store does not exist (a
/// wrong `--config`, a registry never started) makes no empty store: it
/// exits 2 naming the path and what creates it. `token create
/// --create-store` creates it on purpose, and the token is then listed.
#[test]
fn token_commands_refuse_a_missing_store_unless_told_to_create_it() {
    let dir = TempDir::new().unwrap();
    let config = write_config(&dir, "");
    let store = dir.path().join("registry.sqlite3");
    for args in [
        &["create", "--role", "viewer", "--name", "viewer-1"][..],
        &["list"][..],
        &["list", "--json"][..],
        &["revoke", "--name", "viewer-1"][..],
    ] {
        let out = token_cmd(&config, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {out:?}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains(&format!("store {} does not exist", store.display()))
                && err.contains("`cloud-registry serve --config"),
            "{args:?}: {err}"
        );
        assert!(!store.exists(), "{args:?} created {}", store.display());
    }
    let out = token_cmd(
        &config,
        &["create", "--role", "viewer", "--name", "viewer-1"],
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("--create-store"),
        "create names its flag: {out:?}"
    );

    let out = token_cmd(
        &config,
        &[
            "create",
            "--role",
            "viewer",
            "--name",
            "viewer-1",
            "--create-store",
        ],
    );
    assert!(out.status.success(), "{out:?}");
    assert!(store.exists());
    let out = token_cmd(&config, &["list", "--json"]);
    assert!(out.status.success(), "{out:?}");
    let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(find(&list["tokens"], "name", "viewer-1")["role"], "viewer");
}

#[test]
fn check_config_refuses_a_policy_wider_than_the_leases_table() {
    let dir = TempDir::new().unwrap();
    let config = write_config(
        &dir,
        "[leases]\nmax_duration_seconds = 600\n\
         [policy.roles.audit_agent]\nmax_lease_seconds = 900\n\
         [policy.principals.\"audit:x\"]\nallowed_preempt_reasons = [\"safety_stop\", \"lunch\"]\n",
    );
    let out = registry()
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 2, "{stderr}");
    assert!(
        lines.iter().any(|l| l.contains(
            "policy.roles.audit_agent.max_lease_seconds: must not exceed leases.max_duration_seconds (600)"
        )),
        "{stderr}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("policy.principals.\"audit:x\".allowed_preempt_reasons: `lunch`")),
        "{stderr}"
    );
}

#[test]
fn check_config_reports_every_problem_and_exits_2() {
    let dir = TempDir::new().unwrap();
    let config = write_config(
        &dir,
        "[leases]\nmax_duration_seconds = 100000\npreempt_reason_whitelist = [\"safety_stop\", \"\"]\n\
         [heartbeat]\ninterval_seconds = 10\noffline_after_missed = 1\n\
         [audit.preempt_reasons]\nhardware = \"\"\nchief = \"\"\n",
    );
    let out = registry()
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let file = config.display().to_string();
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 3, "{stderr}");
    assert!(
        lines[0].starts_with(&format!("{file}:8: leases.max_duration_seconds: ")),
        "{stderr}"
    );
    assert!(
        lines[1].starts_with(&format!("{file}:9: leases.preempt_reason_whitelist[1]: ")),
        "{stderr}"
    );
    assert!(
        lines[2].starts_with(&format!("{file}:12: heartbeat.offline_after_missed: ")),
        "{stderr}"
    );

    // The same file is refused by `serve`, with the same report.
    let out = registry()
        .args(["serve", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("leases.preempt_reason_whitelist[1]"),
        "{out:?}"
    );

    // The shipped file is fine.
    let out = registry()
        .args(["check-config", "--config"])
        .arg(shipped_config())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stdout).ends_with("is valid\n"));
    let out = registry()
        .args(["check-config", "--config", "/nonexistent/registry.toml"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "{out:?}");
}

#[test]
fn check_config_refuses_bad_queue_aging_values_naming_the_key() {
    let dir = TempDir::new().unwrap();
    let cases = [
        (
            "priority_per_minute = 0.0\nmax_boost = 50",
            "priority_per_minute",
        ),
        (
            "priority_per_minute = -1.5\nmax_boost = 50",
            "priority_per_minute",
        ),
        (
            "priority_per_minute = nan\nmax_boost = 50",
            "priority_per_minute",
        ),
        (
            "priority_per_minute = inf\nmax_boost = 50",
            "priority_per_minute",
        ),
        ("priority_per_minute = 10.0\nmax_boost = 0", "max_boost"),
        ("priority_per_minute = 10.0\nmax_boost = 101", "max_boost"),
        ("priority_per_minute = 10.0\nmax_boost = -5", "max_boost"),
        ("priority_per_minute = 10.0", "max_boost"),
        (
            "priority_per_minute = 10.0\nmax_boost = 50\nrate = 1",
            "rate",
        ),
    ];
    for (body, key) in cases {
        let config = write_config(&dir, &format!("[policy.queue_aging]\n{body}\n"));
        let out = registry()
            .args(["check-config", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{body}: {out:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("policy.queue_aging"), "{body}: {stderr}");
        assert!(stderr.contains(key), "{body}: {stderr}");
    }
    let config = write_config(
        &dir,
        "[policy.queue_aging]\npriority_per_minute = 0.5\nmax_boost = 100\n",
    );
    let out = registry()
        .args(["check-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{out:?}");
}

/// `token create` keeps a principal to one role, like the HTTP API: a
/// second token of the same role is fine, another role is refused with a
/// message naming the principal and its role, and nothing is created.
#[test]
fn token_create_refuses_another_role_for_an_existing_principal() {
    let dir = TempDir::new().unwrap();
    let config = write_config(&dir, "");
    let out = token_cmd(
        &config,
        &[
            "create",
            "--role",
            "audit_agent",
            "--name",
            "audit:a-1",
            "--create-store",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = token_cmd(
        &config,
        &["create", "--role", "audit_agent", "--name", "audit:a-1"],
    );
    assert!(
        out.status.success(),
        "same role again: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = token_cmd(
        &config,
        &["create", "--role", "operator", "--name", "audit:a-1"],
    );
    assert!(!out.status.success(), "another role must be refused");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("audit:a-1") && err.contains("audit_agent"),
        "the refusal names the principal and its role: {err}"
    );
    assert!(out.stdout.is_empty(), "no token printed");
    let list = token_cmd(&config, &["list", "--json"]);
    assert!(list.status.success());
    let text = String::from_utf8_lossy(&list.stdout);
    assert_eq!(
        text.matches("\"operator\"").count(),
        0,
        "no operator token: {text}"
    );
}

/// POST `body` to `base` + `path` with `token`: status and JSON answer.
async fn post_json(
    base: &str,
    path: &str,
    token: &str,
    body: &serde_json::Value,
) -> Result<(u16, serde_json::Value), reqwest::Error> {
    let resp = reqwest::Client::new()
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await?;
    let status = resp.status().as_u16();
    let text = resp.text().await?;
    Ok((
        status,
        serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text)),
    ))
}

async fn get_json(base: &str, path: &str, token: &str) -> serde_json::Value {
    reqwest::Client::new()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .await
        .expect("GET sent")
        .json()
        .await
        .expect("JSON answer")
}

/// SIGTERM while callers wait (an action with `wait_ms` on a provider that
/// never answers, a lease request with `wait_seconds` behind a held
/// lease): each is answered at once with what it waits for as it is then
/// (202, the running session / the queued lease, with its id), and the
/// process exits 0 without sitting out the 10 s drain.
#[tokio::test]
async fn sigterm_answers_waiting_callers_at_once_and_exits_cleanly() {
    use serde_json::json;
    use std::time::{Duration, Instant};

    let dir = TempDir::new().unwrap();
    let config = write_config(&dir, "");
    let token_file = dir.path().join("admin.token");
    let mut served = serve(&config, &token_file);
    let base = served.base.clone();
    let admin = std::fs::read_to_string(&token_file)
        .unwrap()
        .trim()
        .to_string();
    let mut tokens = Vec::new();
    for (role, name) in [
        ("provider", "bench-silent"),
        ("audit_agent", "audit:waiter-1"),
        ("audit_agent", "audit:waiter-2"),
    ] {
        let (s, body) = post_json(
            &base,
            "/api/v1/auth/tokens",
            &admin,
            &json!({"role": role, "name": name}),
        )
        .await
        .unwrap();
        assert_eq!(s, 201, "{body}");
        tokens.push(body["token"].as_str().unwrap().to_string());
    }
    let (provider, first, second) = (tokens[0].clone(), tokens[1].clone(), tokens[2].clone());
    // A provider that registers over HTTP and never reads its commands.
    let (s, body) = post_json(
        &base,
        "/api/v1/capability-providers/register",
        &provider,
        &json!({
            "provider_id": "bench-silent", "node_id": "n1", "hostname": "n1.local",
            "platform": "linux", "gateway_version": "0.1.0", "network_zone": "lan",
            "labels": [], "boot_id": "boot-1"
        }),
    )
    .await
    .unwrap();
    assert_eq!(s, 200, "{body}");
    let (s, body) = post_json(
        &base,
        "/api/v1/capabilities/register",
        &provider,
        &json!({"provider_id": "bench-silent", "capabilities": [{
            "capability_id": "cam-silent", "capability_type": "camera",
            "display_name": "camera that never answers", "lease_mode": "exclusive",
            "preemptible": true, "supported_actions": ["snapshot"]
        }]}),
    )
    .await
    .unwrap();
    assert_eq!(s, 200, "{body}");
    let lease_body = |holder: &str| {
        json!({
            "capability_id": "cam-silent", "holder_type": "audit_agent",
            "holder_ref": holder, "project_id": "p", "purpose": "shutdown test",
            "priority": 50, "requested_duration_seconds": 300
        })
    };
    let (s, lease) = post_json(
        &base,
        "/api/v1/capability-leases/request",
        &first,
        &lease_body("audit:waiter-1"),
    )
    .await
    .unwrap();
    assert_eq!(s, 201, "{lease}");
    let lease_id = lease["lease_id"].as_str().unwrap().to_string();

    let action = tokio::spawn({
        let (base, token) = (base.clone(), first.clone());
        async move {
            post_json(
                &base,
                &format!("/api/v1/capability-leases/{lease_id}/actions"),
                &token,
                &json!({"action": "snapshot", "wait_ms": 60000}),
            )
            .await
        }
    });
    let queued = tokio::spawn({
        let (base, token, body) = (base.clone(), second.clone(), lease_body("audit:waiter-2"));
        async move {
            post_json(
                &base,
                "/api/v1/capability-leases/request?wait_seconds=60",
                &token,
                &body,
            )
            .await
        }
    });
    // Both wait: the session runs, the second lease is queued.
    let until = Instant::now() + Duration::from_secs(10);
    let (session_id, queued_id) = loop {
        let sessions = get_json(&base, "/api/v1/sessions?status=running", &admin).await;
        let leases = get_json(&base, "/api/v1/capability-leases?status=requested", &admin).await;
        if let (Some(s), Some(l)) = (
            sessions["sessions"][0]["session_id"].as_str(),
            leases["leases"][0]["lease_id"].as_str(),
        ) {
            break (s.to_string(), l.to_string());
        }
        assert!(Instant::now() < until, "{sessions} {leases}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!action.is_finished() && !queued.is_finished());

    let term = Instant::now();
    let killed = Command::new("kill")
        .args(["-TERM", &served.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let (s, session) = tokio::time::timeout(Duration::from_secs(5), action)
        .await
        .expect("the action's caller is answered within 5 s of SIGTERM")
        .unwrap()
        .expect("an answer, not a dropped connection");
    assert_eq!(s, 202, "{session}");
    assert_eq!(session["status"], "running");
    assert_eq!(session["session_id"], session_id.as_str());
    let (s, lease) = tokio::time::timeout(Duration::from_secs(5), queued)
        .await
        .expect("the lease requester is answered within 5 s of SIGTERM")
        .unwrap()
        .expect("an answer, not a dropped connection");
    assert_eq!(s, 202, "{lease}");
    assert_eq!(lease["status"], "requested");
    assert_eq!(lease["lease_id"], queued_id.as_str());

    let status = loop {
        if let Some(status) = served.child.try_wait().unwrap() {
            break status;
        }
        assert!(
            term.elapsed() < Duration::from_secs(9),
            "still running {:?} after SIGTERM",
            term.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert!(status.success(), "{status:?}");
}

/// `cmd` (`cloud-registry serve …`) with `--config config`, stdout and
/// stderr piped (no colour); the child and its ready line, once printed.
fn serve_piped(cmd: &mut Command, config: &Path) -> (std::process::Child, String) {
    use std::io::{BufRead, BufReader};
    let mut child = cmd
        .arg("--config")
        .arg(config)
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn cloud-registry serve");
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .expect("ready line");
    (child, line)
}

/// Every answered request has an id, the client's when it gave a plain
/// one, in the answer's `x-request-id` and in one access-log line with the
/// route's pattern, status and latency (cloud_registry::access_log).
#[tokio::test]
async fn each_request_gets_an_id_in_its_answer_and_one_access_log_line() {
    use std::io::{BufRead, BufReader};
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&dir, "");
    let token_file = dir.path().join("admin.token");
    let (mut child, line) = serve_piped(
        registry()
            .arg("serve")
            .arg("--bootstrap-admin-token-file")
            .arg(&token_file)
            .env("RUST_LOG", "warn,benchlink::access=info"),
        &config,
    );
    let ready: serde_json::Value = serde_json::from_str(&line).expect("ready line is JSON");
    let base = format!("http://{}", ready["http"].as_str().unwrap());
    let token = std::fs::read_to_string(&token_file).unwrap();
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let http = reqwest::Client::new();
    let given = http
        .get(format!("{base}/api/v1/capabilities/cam-nowhere"))
        .bearer_auth(token.trim())
        .header("x-request-id", "lab-check-42")
        .send()
        .await
        .unwrap();
    assert_eq!(given.status().as_u16(), 404);
    assert_eq!(given.headers()["x-request-id"], "lab-check-42");
    // A forged id (a space, as a log-line splitter would use) is replaced.
    let forged = http
        .get(format!("{base}/api/v1/capabilities"))
        .header("x-request-id", "a b")
        .send()
        .await
        .unwrap();
    assert_eq!(forged.status().as_u16(), 401);
    let made = forged.headers()["x-request-id"]
        .to_str()
        .unwrap()
        .to_string();
    assert_eq!(made.len(), 32, "a fresh UUID: {made}");

    let mut lines = Vec::new();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::time::Instant::now() < deadline && !lines.iter().any(|l: &String| l.contains(&made))
    {
        if let Ok(l) = rx.recv_timeout(std::time::Duration::from_millis(200)) {
            lines.push(l);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    let of = |id: &str| -> Vec<&String> {
        lines
            .iter()
            .filter(|l| l.contains("benchlink::access") && l.contains(id))
            .collect()
    };
    let first = of("lab-check-42");
    assert_eq!(first.len(), 1, "one line for the request: {lines:#?}");
    for part in [
        "method=GET",
        "route=\"/api/v1/capabilities/{capability_id}\"",
        "path=\"/api/v1/capabilities/cam-nowhere\"",
        "status=404",
        "latency_ms=",
    ] {
        assert!(first[0].contains(part), "{part} in {}", first[0]);
    }
    let second = of(&made);
    assert_eq!(second.len(), 1, "{lines:#?}");
    assert!(second[0].contains("status=401"), "{}", second[0]);
}

/// A machine without CA certificates (no `ca-certificates` package): the
/// registry still starts, saying why HTTPS calls of its gateways will
/// fail, instead of panicking while it builds their HTTP clients.
#[test]
fn without_ca_certificates_the_registry_starts_and_says_why() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(&dir, "");
    let nowhere = dir.path().join("no-certificates");
    let (mut child, line) = serve_piped(
        registry()
            .arg("serve")
            .env("SSL_CERT_FILE", &nowhere)
            .env("SSL_CERT_DIR", &nowhere)
            .env("RUST_LOG", "warn"),
        &config,
    );
    let _ = child.kill();
    let _ = child.wait();
    let mut stderr = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut stderr)
        .unwrap();
    assert!(line.contains("\"ready\""), "{line}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(
        stderr.contains("cannot load the system's CA certificates"),
        "{stderr}"
    );
}
