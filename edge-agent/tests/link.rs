//! The MQTT link against a real Mosquitto (127.0.0.1:1883), each test
//! under its own topic prefix, with the real `edge-agent` binary (or the
//! daemon in-process where a test must inject a command without a broker).
//!
//! Without a reachable Mosquitto these tests are skipped with a printed
//! reason, except under `CI=true`, where they fail.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use benchlink_testkit::{free_port, mosquitto};
use edge_agent::config::EdgeConfig;
use edge_agent::daemon::Daemon;
use edge_agent::link::envelope;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use shared_protocol::mqtt::{Envelope, MessageType};
use tokio::sync::mpsc;

/// A bench under its own topic prefix and provider id.
struct Bench {
    dir: tempfile::TempDir,
    prefix: String,
    provider_id: String,
}

impl Bench {
    fn new() -> Self {
        let id = uuid::Uuid::new_v4().simple().to_string();
        Bench {
            dir: tempfile::tempdir().unwrap(),
            prefix: format!("benchlink-test/{id}"),
            provider_id: format!("prov-{}", &id[..12]),
        }
    }

    /// A new bench when Mosquitto is there; `None` (the test returns)
    /// by the kit's rule otherwise ([`mosquitto`]).
    fn on_mosquitto() -> Option<Self> {
        mosquitto().then(Bench::new)
    }

    /// An observer named `name-<provider>` of every topic of this bench.
    async fn observe_all(&self, name: &str) -> Observer {
        Observer::connect(
            &format!("{name}-{}", self.provider_id),
            &format!("{}/providers/{}/#", self.prefix, self.provider_id),
        )
        .await
    }

    fn topic(&self, kind: &str) -> String {
        format!("{}/providers/{}/{kind}", self.prefix, self.provider_id)
    }

    /// Write the bench TOML: broker at `mqtt_port`, heartbeats every second,
    /// an HTTP registry that is not there (uploads just wait), and a
    /// simulated camera when `camera` is set.
    fn write_config(&self, mqtt_port: u16, camera: bool) -> PathBuf {
        let caps = if camera { CAMERA } else { "" };
        self.write_config_with(mqtt_port, Some(1), caps)
    }

    /// The same with a chosen heartbeat period (None: the default) and
    /// capability tables.
    fn write_config_with(
        &self,
        mqtt_port: u16,
        heartbeat_s: Option<u32>,
        capabilities: &str,
    ) -> PathBuf {
        let mut text = format!(
            r#"state_dir = "{state}"

[provider]
provider_id = "{provider}"
node_id = "test-node"

[registry]
mqtt_host = "127.0.0.1"
mqtt_port = {mqtt_port}
topic_prefix = "{prefix}"
base_url = "http://127.0.0.1:{http_port}"
token = "test-token"
mqtt_keep_alive_seconds = 5
{heartbeat}
"#,
            state = self.dir.path().join("state").display(),
            provider = self.provider_id,
            prefix = self.prefix,
            http_port = free_port(),
            heartbeat = heartbeat_s
                .map(|s| format!("heartbeat_interval_seconds = {s}"))
                .unwrap_or_default(),
        );
        text.push_str(capabilities);
        let path = self.dir.path().join("edge-agent.toml");
        std::fs::write(&path, text).unwrap();
        path
    }
}

const CAMERA: &str = r#"
[[capabilities]]
id = "cam-test-01"
type = "camera"
[capabilities.driver]
backend = "sim"
resolution = "320x240"
"#;

const ROBOT: &str = r#"
[[capabilities]]
id = "robot-test-01"
type = "thumb_robot"
preemptible = false
[capabilities.driver]
backend = "sim"
bounds_mm = { x_min = 0.0, x_max = 70.0, y_min = 0.0, y_max = 140.0 }
safe_z_mm = 10.0
press_z_mm = 2.0
"#;

/// The real binary, killed on drop; stderr goes to a log file shown on
/// failure.
struct Agent {
    child: Option<Child>,
    log: PathBuf,
}

impl Agent {
    fn start(config: &Path) -> Agent {
        let log = config.with_extension("log");
        let mut child = Command::new(env!("CARGO_BIN_EXE_edge-agent"))
            .args(["run", "--config"])
            .arg(config)
            .env("RUST_LOG", "info")
            .env_remove("NOTIFY_SOCKET")
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start edge-agent");
        // Wait for the ready line.
        let rx = benchlink_testkit::stdout_lines(&mut child);
        let line = rx
            .recv_timeout(Duration::from_secs(30))
            .unwrap_or_else(|_| panic!("no ready line; log:\n{}", read(&log)));
        let ready: Value = serde_json::from_str(&line).expect("ready line is JSON");
        assert_eq!(ready["event"], "ready");
        Agent {
            child: Some(child),
            log,
        }
    }

    fn pid(&self) -> i32 {
        self.child.as_ref().unwrap().id() as i32
    }

    fn signal(&self, sig: i32) {
        // SAFETY: plain syscall on our own child's pid.
        unsafe { libc::kill(self.pid(), sig) };
    }

    fn still_running(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }

    /// Wait for the exit code (None if it did not exit within `timeout`).
    fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let until = Instant::now() + timeout;
        while Instant::now() < until {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                self.child = None;
                return Some(status.code().unwrap_or(-1));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        None
    }

    fn log(&self) -> String {
        read(&self.log)
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// One received message.
#[derive(Debug, Clone)]
struct Seen {
    topic: String,
    retain: bool,
    env: Envelope,
}

/// An MQTT client watching a provider's topics.
struct Observer {
    client: AsyncClient,
    rx: mpsc::UnboundedReceiver<Seen>,
    task: tokio::task::JoinHandle<()>,
}

impl Observer {
    async fn connect(client_id: &str, filter: &str) -> Observer {
        let mut opts = MqttOptions::new(client_id, "127.0.0.1", 1883);
        opts.set_keep_alive(Duration::from_secs(5));
        opts.set_max_packet_size(1 << 20, 1 << 20);
        let (client, mut eventloop) = AsyncClient::new(opts, 64);
        client.subscribe(filter, QoS::AtLeastOnce).await.unwrap();
        let (tx, rx) = mpsc::unbounded_channel();
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
        let mut ready_tx = Some(ready_tx);
        let task = tokio::spawn(async move {
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::SubAck(_))) => {
                        if let Some(t) = ready_tx.take() {
                            let _ = t.send(());
                        }
                    }
                    Ok(Event::Incoming(Packet::Publish(p))) => {
                        if p.payload.is_empty() {
                            continue;
                        }
                        if let Ok(env) = Envelope::parse(&p.payload) {
                            let _ = tx.send(Seen {
                                topic: p.topic.clone(),
                                retain: p.retain,
                                env,
                            });
                        }
                    }
                    Ok(_) => {}
                    Err(_) => tokio::time::sleep(Duration::from_millis(200)).await,
                }
            }
        });
        tokio::time::timeout(Duration::from_secs(5), ready_rx)
            .await
            .expect("observer subscribed")
            .unwrap();
        Observer { client, rx, task }
    }

    /// The next message matching `pred` within `timeout`.
    async fn expect(
        &mut self,
        timeout: Duration,
        what: &str,
        pred: impl Fn(&Seen) -> bool,
    ) -> Seen {
        let until = tokio::time::Instant::now() + timeout;
        loop {
            match tokio::time::timeout_at(until, self.rx.recv()).await {
                Ok(Some(seen)) if pred(&seen) => return seen,
                Ok(Some(_)) => continue,
                _ => panic!("no {what} within {timeout:?}"),
            }
        }
    }

    /// Every message matching `pred` during `period`.
    async fn collect(&mut self, period: Duration, pred: impl Fn(&Seen) -> bool) -> Vec<Seen> {
        let until = tokio::time::Instant::now() + period;
        let mut out = Vec::new();
        while let Ok(Some(seen)) = tokio::time::timeout_at(until, self.rx.recv()).await {
            if pred(&seen) {
                out.push(seen);
            }
        }
        out
    }

    async fn publish(&self, topic: &str, env: &Envelope) {
        self.client
            .publish(topic, QoS::AtLeastOnce, false, env.to_bytes())
            .await
            .unwrap();
    }

    async fn clear_retained(&self, topic: &str) {
        let _ = self
            .client
            .publish(topic, QoS::AtLeastOnce, true, Vec::<u8>::new())
            .await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl Drop for Observer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn is(seen: &Seen, topic: &str, ty: MessageType) -> bool {
    seen.topic == topic && seen.env.message_type == ty
}

fn status_of(seen: &Seen) -> &str {
    seen.env.body["online_status"].as_str().unwrap_or("")
}

fn invoke(session_id: &str, capability_id: &str, action: &str) -> Envelope {
    envelope(
        MessageType::ActionInvoke,
        &json!({
            "session_id": session_id,
            "lease_id": "lease-test",
            "capability_id": capability_id,
            "action": action,
            "params": {},
            "timeout_ms": 10000,
            "lease_generation": 1,
            "lease_mode": "exclusive",
            "not_after": (chrono::Utc::now() + chrono::Duration::minutes(10)).to_rfc3339(),
        }),
    )
}

const WAIT: Duration = Duration::from_secs(15);

/// SIGTERM: the daemon must exit 0 within 15 s (its log otherwise); then
/// the bench's retained status is cleared from the broker.
async fn stop_cleanly(bench: &Bench, mut agent: Agent) {
    agent.signal(libc::SIGTERM);
    assert_eq!(
        agent.wait_exit(Duration::from_secs(15)),
        Some(0),
        "log:\n{}",
        agent.log()
    );
    let cleaner = Observer::connect(&format!("clean-{}", bench.provider_id), "unused/topic").await;
    cleaner.clear_retained(&bench.topic("status")).await;
}

/// Wait up to 10 s until the bench's outbox holds no queued session
/// update; the failure names how many are `still` left.
async fn wait_queue_empty(bench: &Bench, cfg: &EdgeConfig, still: &str) {
    let until = Instant::now() + Duration::from_secs(10);
    loop {
        let (outbox, _) =
            edge_agent::outbox::Outbox::open(&cfg.outbox, &bench.provider_id).unwrap();
        let left = outbox.stats().unwrap().queued_updates;
        if left == 0 {
            break;
        }
        assert!(Instant::now() < until, "{left} {still}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_observer_sees_retained_online_status_the_registration_and_heartbeats() {
    let Some(bench) = Bench::on_mosquitto() else {
        return;
    };
    let mut obs = bench.observe_all("obs").await;
    let agent = Agent::start(&bench.write_config(1883, true));

    let online = obs
        .expect(WAIT, "online status", |s| {
            is(s, &bench.topic("status"), MessageType::Status)
        })
        .await;
    assert_eq!(status_of(&online), "online");
    let boot_id = online.env.body["boot_id"]
        .as_str()
        .expect("boot_id")
        .to_string();

    let register = obs
        .expect(WAIT, "register", |s| {
            is(s, &bench.topic("register"), MessageType::Register)
        })
        .await;
    let body = &register.env.body;
    assert_eq!(body["provider"]["provider_id"], bench.provider_id.as_str());
    assert_eq!(body["provider"]["node_id"], "test-node");
    assert_eq!(body["provider"]["boot_id"], boot_id.as_str());
    assert_eq!(body["provider"]["platform"], "linux");
    let caps = body["capabilities"].as_array().unwrap();
    assert_eq!(caps.len(), 1);
    assert_eq!(caps[0]["capability_id"], "cam-test-01");
    assert_eq!(caps[0]["capability_type"], "camera");
    assert!(caps[0]["supported_actions"]
        .as_array()
        .unwrap()
        .contains(&json!("snapshot")));

    let beats = obs
        .collect(Duration::from_millis(3500), |s| {
            is(s, &bench.topic("heartbeat"), MessageType::Heartbeat)
        })
        .await;
    assert!(
        beats.len() >= 2,
        "heartbeats every second, got {}",
        beats.len()
    );
    let hb = &beats[0].env.body;
    assert_eq!(hb["boot_id"], boot_id.as_str());
    assert_eq!(hb["capabilities"][0]["capability_id"], "cam-test-01");
    assert!(hb["capabilities"][0]["health_status"].is_string());
    assert!(hb["running_sessions"].as_array().unwrap().is_empty());

    // A client that subscribes later gets the retained online status.
    let mut late = Observer::connect(
        &format!("late-{}", bench.provider_id),
        &bench.topic("status"),
    )
    .await;
    let retained = late
        .expect(Duration::from_secs(5), "retained status", |s| {
            s.topic == bench.topic("status")
        })
        .await;
    assert!(retained.retain, "status is retained");
    assert_eq!(status_of(&retained), "online");
    drop(agent);
    obs.clear_retained(&bench.topic("status")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn register_ack_sets_the_heartbeat_period_and_heartbeats_show_non_interruptible_actions() {
    let Some(bench) = Bench::on_mosquitto() else {
        return;
    };
    let mut obs = bench.observe_all("obs").await;
    // Default period (10 s) until the registry answers.
    let agent = Agent::start(&bench.write_config_with(1883, None, ROBOT));
    obs.expect(WAIT, "register", |s| {
        is(s, &bench.topic("register"), MessageType::Register)
    })
    .await;
    let quiet = obs
        .collect(Duration::from_secs(2), |s| {
            is(s, &bench.topic("heartbeat"), MessageType::Heartbeat)
        })
        .await;
    // One heartbeat right after the registration (capability health at
    // once), then none for 2 s at the default 10 s period.
    assert_eq!(
        quiet.len(),
        1,
        "one heartbeat after register, then none within 2 s at the default 10 s period"
    );

    // The registry's answer sets 1 s.
    let ack = envelope(
        MessageType::RegisterAck,
        &json!({"provider_id": bench.provider_id, "accepted": true,
                "heartbeat_interval_seconds": 1, "registered": ["robot-test-01"]}),
    );
    obs.publish(&bench.topic("commands"), &ack).await;
    let beats = obs
        .collect(Duration::from_millis(3500), |s| {
            is(s, &bench.topic("heartbeat"), MessageType::Heartbeat)
        })
        .await;
    assert!(
        beats.len() >= 2,
        "heartbeats every second after register_ack, got {}",
        beats.len()
    );

    // A long press (non-interruptible, seed 001 §6.4) shows in the next heartbeat.
    let press = envelope(
        MessageType::ActionInvoke,
        &json!({"session_id": "sess-press-1", "lease_id": "lease-p", "capability_id": "robot-test-01",
                "action": "long_press", "params": {"x_mm": 20.0, "y_mm": 30.0, "hold_ms": 4000},
                "timeout_ms": 20000, "lease_generation": 1, "lease_mode": "exclusive",
                "not_after": (chrono::Utc::now() + chrono::Duration::minutes(10)).to_rfc3339()}),
    );
    obs.publish(&bench.topic("commands"), &press).await;
    let hb = obs
        .expect(
            Duration::from_secs(5),
            "a heartbeat with the running press",
            |s| {
                is(s, &bench.topic("heartbeat"), MessageType::Heartbeat)
                    && s.env.body["running_sessions"]
                        .as_array()
                        .is_some_and(|r| !r.is_empty())
            },
        )
        .await;
    let running = &hb.env.body["running_sessions"][0];
    assert_eq!(running["session_id"], "sess-press-1");
    assert_eq!(running["lease_id"], "lease-p");
    assert_eq!(running["action"], "long_press");
    assert_eq!(running["non_interruptible"], true);
    obs.expect(Duration::from_secs(15), "the press completing", |s| {
        is(s, &bench.topic("results"), MessageType::SessionUpdate)
            && s.env.body["session_id"] == "sess-press-1"
            && s.env.body["status"] == "completed"
    })
    .await;
    drop(agent);
    obs.clear_retained(&bench.topic("status")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_broker_publishes_the_offline_lwt_when_the_daemon_is_killed() {
    let Some(bench) = Bench::on_mosquitto() else {
        return;
    };
    let mut obs = Observer::connect(
        &format!("obs-{}", bench.provider_id),
        &bench.topic("status"),
    )
    .await;
    let agent = Agent::start(&bench.write_config(1883, false));
    let online = obs
        .expect(WAIT, "online", |s| status_of(s) == "online")
        .await;
    agent.signal(libc::SIGKILL);
    let offline = obs
        .expect(WAIT, "offline LWT", |s| status_of(s) == "offline")
        .await;
    assert_eq!(offline.env.body["boot_id"], online.env.body["boot_id"]);

    let mut late = Observer::connect(
        &format!("late-{}", bench.provider_id),
        &bench.topic("status"),
    )
    .await;
    let retained = late
        .expect(Duration::from_secs(5), "retained offline", |s| {
            s.topic == bench.topic("status")
        })
        .await;
    assert!(retained.retain);
    assert_eq!(status_of(&retained), "offline");
    obs.clear_retained(&bench.topic("status")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_publishes_offline_and_exits_cleanly() {
    let Some(bench) = Bench::on_mosquitto() else {
        return;
    };
    let mut obs = Observer::connect(
        &format!("obs-{}", bench.provider_id),
        &bench.topic("status"),
    )
    .await;
    let mut agent = Agent::start(&bench.write_config(1883, true));
    obs.expect(WAIT, "online", |s| status_of(s) == "online")
        .await;
    agent.signal(libc::SIGTERM);
    let code = agent.wait_exit(Duration::from_secs(15));
    assert_eq!(code, Some(0), "log:\n{}", agent.log());
    obs.expect(Duration::from_secs(5), "offline", |s| {
        status_of(s) == "offline"
    })
    .await;
    assert!(
        agent.log().contains("offline status published"),
        "{}",
        agent.log()
    );
    obs.clear_retained(&bench.topic("status")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn commands_are_resubscribed_after_a_session_takeover_and_deduplicated() {
    let Some(bench) = Bench::on_mosquitto() else {
        return;
    };
    let mut obs = bench.observe_all("obs").await;
    let agent = Agent::start(&bench.write_config(1883, false));
    obs.expect(WAIT, "first register", |s| {
        is(s, &bench.topic("register"), MessageType::Register)
    })
    .await;

    // Mosquitto hands the session to a second client with the same client
    // id and drops the daemon's connection.
    let mut opts = MqttOptions::new(bench.provider_id.clone(), "127.0.0.1", 1883);
    opts.set_keep_alive(Duration::from_secs(5));
    let (kicker, mut kick_loop) = AsyncClient::new(opts, 10);
    let connected = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            if let Ok(Event::Incoming(Packet::ConnAck(_))) = kick_loop.poll().await {
                break;
            }
        }
    })
    .await;
    assert!(connected.is_ok(), "the kicker connected");
    let _ = kicker.disconnect().await;
    let _ = tokio::time::timeout(Duration::from_millis(500), kick_loop.poll()).await;
    drop(kick_loop);

    // The daemon reconnects and announces itself again.
    obs.expect(WAIT, "register after reconnect", |s| {
        is(s, &bench.topic("register"), MessageType::Register)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;

    // The same command twice (QoS 1 redelivery), then another.
    let first = invoke("sess-dup-1", "no-such-capability", "snapshot");
    obs.publish(&bench.topic("commands"), &first).await;
    obs.publish(&bench.topic("commands"), &first).await;
    obs.publish(
        &bench.topic("commands"),
        &invoke("sess-dup-2", "no-such-capability", "snapshot"),
    )
    .await;

    let updates = obs
        .collect(Duration::from_secs(4), |s| {
            is(s, &bench.topic("results"), MessageType::SessionUpdate)
        })
        .await;
    let for_session = |id: &str| {
        updates
            .iter()
            .filter(|s| s.env.body["session_id"] == id)
            .collect::<Vec<_>>()
    };
    let one = for_session("sess-dup-1");
    assert_eq!(
        one.len(),
        1,
        "one update per command, not per delivery: {updates:#?}"
    );
    assert_eq!(one[0].env.body["status"], "failed");
    let msg = one[0].env.body["error_message"].as_str().unwrap();
    assert!(
        msg.contains("unknown capability `no-such-capability`"),
        "{msg}"
    );
    assert_eq!(
        for_session("sess-dup-2").len(),
        1,
        "the command after the repeat still runs"
    );
    drop(agent);
    obs.clear_retained(&bench.topic("status")).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_broker_leaves_the_daemon_running_and_stoppable() {
    // No broker needed: the point is that there is none.
    let bench = Bench::new();
    let port = free_port();
    let mut agent = Agent::start(&bench.write_config(port, true));
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(agent.still_running(), "log:\n{}", agent.log());
    let log = agent.log();
    assert!(log.contains("broker unreachable"), "{log}");
    // Backoff: a handful of attempts in 4 s, not a busy loop.
    agent.signal(libc::SIGTERM);
    assert_eq!(
        agent.wait_exit(Duration::from_secs(10)),
        Some(0),
        "log:\n{}",
        agent.log()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_broker_drivers_and_the_outbox_keep_working_and_updates_are_sent_after_a_restart()
{
    let bench = Bench::new();
    let offline_config = bench.write_config(free_port(), true);
    let cfg = EdgeConfig::load(&offline_config).expect("config");
    let daemon = Daemon::start(cfg)
        .await
        .expect("daemon starts without a broker");

    // A command handed over locally: the camera captures, the outbox keeps
    // the evidence and the session updates, though nothing can be published.
    assert!(daemon.submit(invoke("sess-offline-1", "cam-test-01", "snapshot")));
    // (A `running` update is queued first only when the capture takes
    // more than 100 ms; the final one always.)
    let outbox = daemon.outbox().clone();
    let until = Instant::now() + Duration::from_secs(20);
    let (stats, queued) = loop {
        let o = outbox.clone();
        let (stats, queued) = tokio::task::spawn_blocking(move || {
            (o.stats().unwrap(), o.queued_updates(10).unwrap())
        })
        .await
        .unwrap();
        let completed = queued
            .iter()
            .any(|u| Envelope::parse(&u.payload).is_ok_and(|e| e.body["status"] == "completed"));
        if stats.pending_artifacts >= 1 && completed {
            break (stats, queued);
        }
        assert!(Instant::now() < until, "no artifact/updates yet: {stats:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(stats.pending_artifacts, 1);
    assert!(!daemon.link_state().is_connected());
    let last: Envelope = Envelope::parse(&queued.last().unwrap().payload).unwrap();
    assert_eq!(last.body["status"], "completed", "{:#}", last.body);
    let artifact = last.body["artifacts"][0].clone();
    let artifact_id = artifact["artifact_id"].as_str().unwrap().to_string();
    let o = outbox.clone();
    let id = artifact_id.clone();
    let local_sum = tokio::task::spawn_blocking(move || o.rehash(&id))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(artifact["checksum"], local_sum.as_str());
    daemon.shutdown().await;
    drop(outbox);

    // Restart against the real broker with the same state: the queued
    // updates go out.
    if !mosquitto() {
        return;
    }
    let mut obs = Observer::connect(
        &format!("obs-{}", bench.provider_id),
        &bench.topic("results"),
    )
    .await;
    let mut agent = Agent::start(&bench.write_config(1883, true));
    let update = obs
        .expect(WAIT, "the completed update queued while offline", |s| {
            s.env.body["session_id"] == "sess-offline-1" && s.env.body["status"] == "completed"
        })
        .await;
    assert_eq!(
        update.env.body["artifacts"][0]["artifact_id"],
        artifact_id.as_str()
    );
    assert_eq!(
        update.env.body["artifacts"][0]["checksum"],
        local_sum.as_str()
    );
    agent.signal(libc::SIGTERM);
    assert_eq!(
        agent.wait_exit(Duration::from_secs(15)),
        Some(0),
        "log:\n{}",
        agent.log()
    );

    // Nothing is left queued.
    let cfg = EdgeConfig::load(&offline_config).unwrap();
    let (outbox, _) = edge_agent::outbox::Outbox::open(&cfg.outbox, &bench.provider_id).unwrap();
    assert_eq!(outbox.stats().unwrap().queued_updates, 0);
    let cleaner = Observer::connect(&format!("clean-{}", bench.provider_id), "unused/topic").await;
    cleaner.clear_retained(&bench.topic("status")).await;
}

/// More session updates than the publisher keeps in flight at once, queued
/// while the registry was unreachable: after a start against the broker
/// every one arrives, in the order it was queued, and the outbox forgets
/// each once the broker acknowledged it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_of_queued_updates_arrives_complete_in_order_and_is_forgotten() {
    let Some(bench) = Bench::on_mosquitto() else {
        return;
    };
    let config = bench.write_config(1883, true);
    let cfg = EdgeConfig::load(&config).expect("config");
    const BACKLOG: usize = 300;
    {
        let (outbox, _) =
            edge_agent::outbox::Outbox::open(&cfg.outbox, &bench.provider_id).unwrap();
        for i in 0..BACKLOG {
            let update = edge_agent::runner::session_update(
                &format!("sess-backlog-{i:04}"),
                "cam-test-01",
                shared_protocol::session::SessionStatus::Completed,
                None,
            );
            let env = envelope(MessageType::SessionUpdate, &update);
            outbox
                .queue_update(&env.message_id, &update.session_id, &env.to_bytes())
                .unwrap();
        }
        assert_eq!(outbox.stats().unwrap().queued_updates, BACKLOG as u64);
    }
    let mut obs = Observer::connect(
        &format!("obs-backlog-{}", bench.provider_id),
        &bench.topic("results"),
    )
    .await;
    let agent = Agent::start(&config);
    let mut seen = Vec::new();
    while seen.len() < BACKLOG {
        let s = obs
            .expect(WAIT, "the next queued update", |s| {
                s.env.body["session_id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("sess-backlog-"))
            })
            .await;
        seen.push(s.env.body["session_id"].as_str().unwrap().to_string());
    }
    let expected: Vec<String> = (0..BACKLOG)
        .map(|i| format!("sess-backlog-{i:04}"))
        .collect();
    assert_eq!(seen, expected, "every queued update, once, in queue order");

    // Acknowledged rows are deleted (off the publisher's path: allow a moment).
    wait_queue_empty(&bench, &cfg, "acknowledged updates still queued").await;
    stop_cleanly(&bench, agent).await;
}

/// A session update queued too large to publish (by an older version:
/// an unknown 1,000,000-character parameter named twice in the error) is
/// sent shortened, with its message id, status and a cut error message;
/// the updates queued after it arrive too and nothing stays queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_update_too_large_to_publish_is_shortened_and_does_not_block_later_ones() {
    let Some(bench) = Bench::on_mosquitto() else {
        return;
    };
    let config = bench.write_config(1883, true);
    let cfg = EdgeConfig::load(&config).expect("config");
    let key = "K".repeat(1_000_000);
    let error = format!("unknown parameter `{key}` (`{key}` is not a parameter of write)");
    let big_id;
    {
        let (outbox, _) =
            edge_agent::outbox::Outbox::open(&cfg.outbox, &bench.provider_id).unwrap();
        let queue = |session: &str, error: Option<String>| {
            let update = edge_agent::runner::session_update(
                session,
                "cam-test-01",
                shared_protocol::session::SessionStatus::Failed,
                error,
            );
            let env = envelope(MessageType::SessionUpdate, &update);
            // Straight into the queue, as an older version did.
            outbox
                .queue_update(&env.message_id, &update.session_id, &env.to_bytes())
                .unwrap();
            env.message_id
        };
        queue("sess-before", Some("small".into()));
        big_id = queue("sess-huge", Some(error.clone()));
        queue("sess-after", Some("small".into()));
    }
    let mut obs = Observer::connect(
        &format!("obs-huge-{}", bench.provider_id),
        &bench.topic("results"),
    )
    .await;
    let agent = Agent::start(&config);
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let s = obs
            .expect(WAIT, "the queued updates", |s| {
                s.env.body["session_id"]
                    .as_str()
                    .is_some_and(|id| id.starts_with("sess-"))
            })
            .await;
        seen.push(s);
    }
    let order: Vec<&str> = seen
        .iter()
        .map(|s| s.env.body["session_id"].as_str().unwrap())
        .collect();
    assert_eq!(order, ["sess-before", "sess-huge", "sess-after"]);
    let huge = &seen[1].env;
    assert_eq!(huge.message_id, big_id, "the same message id");
    assert_eq!(huge.body["status"], "failed");
    let message = huge.body["error_message"].as_str().unwrap();
    let more = error.chars().count() - 2000;
    assert_eq!(
        message,
        format!(
            "{}… ({more} more characters)",
            error.chars().take(2000).collect::<String>()
        )
    );
    assert!(huge.to_bytes().len() <= edge_agent::update_size::MAX_SESSION_UPDATE_BYTES);

    wait_queue_empty(&bench, &cfg, "updates still queued").await;
    stop_cleanly(&bench, agent).await;
}
