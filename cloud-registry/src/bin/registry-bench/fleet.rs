//! `registry-bench --fleet N[,N...]`: N simulated benches on one registry
//! (docs/benchmarks.md "Ten thousand benches").
//!
//! Per broker setup (`--fleet-broker`: the embedded broker, a private
//! Mosquitto started here, or both) and per N, on a fresh registry:
//! 1. mint a `provider` token per bench and an `audit_agent` token per
//!    lease client, then register each bench over HTTP (the provider, then
//!    its 1 or 2 capabilities in one batch), `--fleet-concurrency` at once;
//! 2. open one MQTT connection per bench (rumqttc, one event-loop task
//!    each, `--connect-rate` new connections per second) with the will an
//!    edge-agent sets (retained QoS 1 `offline` status envelope on its own
//!    status topic), publish the retained `online` status on CONNACK, and
//!    from one scheduler task a QoS 0 heartbeat per bench every
//!    `--fleet-heartbeat-seconds`, bench i at phase i / N of the interval;
//! 3. once every bench is online (`benchlink_providers_online`), run
//!    `--fleet-clients` closed-loop lease → release clients for
//!    `--fleet-seconds`, each on a capability of a different bench;
//! 4. report the lease figures, providers online (lowest seen while the
//!    leases ran, and at the end), heartbeats ingested per second
//!    (`benchlink_mqtt_messages_in_total{kind="heartbeat"}`), CPU, RSS and
//!    open descriptors of the registry, the broker (Mosquitto) and this
//!    process.
//!
//! The private Mosquitto gets the shipped ACL (config/mosquitto/), a
//! password file with every token (`mosquitto_passwd -U`, reloaded with
//! SIGHUP) and `max_connections -1`; it inherits this process's raised
//! descriptor limit.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use chrono::Utc;
use futures::{StreamExt, TryStreamExt};
use rumqttc::{AsyncClient, ConnectReturnCode, Event, LastWill, MqttOptions, Packet, QoS};
use serde_json::{json, Value};
use shared_protocol::capability::{CapabilityRegistration, CapabilityType, HealthStatus};
use shared_protocol::mqtt::{topic, Envelope, MessageType, StatusBody, TopicKind};
use shared_protocol::provider::{CapabilityHealthReport, HeartbeatRequest, OnlineStatus};
use tokio::time::Instant;

use super::{
    capability, counters, cpu_seconds, http_client, load_average, machine, mint_token,
    register_provider, rss_mb, run_leases, Args, LeaseSetup, RegistryProcess, RunResult, Scenario,
};

/// The broker the benches connect to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum BrokerSetup {
    /// The registry's own broker (its gate in front of rumqttd).
    Embedded,
    /// A private Mosquitto started by the bench.
    External,
    /// Embedded, then external.
    Both,
}

/// The shipped ACL, the one an operator installs.
const SHIPPED_ACL: &str = include_str!("../../../../config/mosquitto/benchlink.acl");
/// The registry's user name on the private Mosquitto (the shipped ACL's).
const REGISTRY_USER: &str = "benchlink-registry";
/// Topic prefix (the registry's default).
const PREFIX: &str = shared_protocol::mqtt::DEFAULT_TOPIC_PREFIX;

/// Open descriptors of a process (`/proc/PID/fd` entries).
fn open_fds(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// A simulated bench: its provider id, token and capabilities.
struct Bench {
    /// Provider id, also its MQTT client id and user name.
    id: String,
    /// Its `provider` bearer token (the MQTT password).
    token: String,
    /// Its capability ids.
    capabilities: Vec<String>,
}

/// A private Mosquitto on a free loopback port; killed on drop.
pub(super) struct Mosquitto {
    /// The running broker.
    child: Child,
    /// Its loopback port.
    port: u16,
    /// Its password file.
    passwd: PathBuf,
    /// The registry's password on it.
    registry_password: String,
}

impl Mosquitto {
    /// Start `bin` with the shipped ACL and only the registry's login;
    /// returns once it listens (at most 5 s).
    pub(super) fn start(bin: &str, dir: &Path) -> Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?
            .local_addr()?
            .port();
        let acl = dir.join("benchlink.acl");
        std::fs::write(&acl, SHIPPED_ACL)?;
        let registry_password = uuid::Uuid::new_v4().simple().to_string();
        let passwd = dir.join("mosquitto.passwd");
        write_passwords(&passwd, &registry_password, &[])?;
        let conf = dir.join("mosquitto.conf");
        // As root, Mosquitto would drop to the `mosquitto` user, which
        // may not read this directory.
        // SAFETY: geteuid has no preconditions.
        let root = unsafe { libc::geteuid() } == 0;
        std::fs::write(
            &conf,
            format!(
                "listener {port} 127.0.0.1\nallow_anonymous false\npassword_file {}\nacl_file {}\n\
                 persistence false\nset_tcp_nodelay true\nmax_connections -1\n\
                 connection_messages false\nlog_dest stderr\nlog_type error\nlog_type warning\n{}",
                passwd.display(),
                acl.display(),
                if root { "user root\n" } else { "" }
            ),
        )?;
        let log = std::fs::File::create(dir.join("mosquitto.log"))?;
        let child = Command::new(bin)
            .arg("-c")
            .arg(&conf)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("start {bin} (Debian: apt-get install mosquitto)"))?;
        let m = Self {
            child,
            port,
            passwd,
            registry_password,
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if std::time::Instant::now() > deadline {
                bail!(
                    "{bin} is not listening on 127.0.0.1:{port} after 5 s; see {}",
                    dir.join("mosquitto.log").display()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(m)
    }

    /// Write every bench's login and make Mosquitto read it (SIGHUP).
    fn add_benches(&self, benches: &[Bench]) -> Result<()> {
        let logins: Vec<(&str, &str)> = benches
            .iter()
            .map(|b| (b.id.as_str(), b.token.as_str()))
            .collect();
        self.set_logins(&logins)
    }

    /// Let the registry and these (user name, password) pairs log in, and
    /// no one else; Mosquitto reads the file on SIGHUP, so a connection
    /// right after may still be refused (wait ~0.5 s).
    pub(super) fn set_logins(&self, logins: &[(&str, &str)]) -> Result<()> {
        write_passwords(&self.passwd, &self.registry_password, logins)?;
        let pid = i32::try_from(self.child.id())?;
        // SAFETY: kill with a pid of our own child and a valid signal.
        if unsafe { libc::kill(pid, libc::SIGHUP) } != 0 {
            return Err(std::io::Error::last_os_error()).context("SIGHUP to mosquitto");
        }
        Ok(())
    }

    /// Mosquitto's pid, for `/proc`.
    pub(super) fn pid_str(&self) -> String {
        self.child.id().to_string()
    }

    /// The registry's `[mqtt]` table body for this Mosquitto.
    pub(super) fn registry_config(&self) -> String {
        format!(
            "mode = \"external\"\nhost = \"127.0.0.1\"\nport = {}\nusername = \"{REGISTRY_USER}\"\npassword = \"{}\"\n",
            self.port, self.registry_password
        )
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Write Mosquitto's password file with the registry's login and
/// `logins` (plain text, then hashed in place by `mosquitto_passwd -U`).
fn write_passwords(passwd: &Path, registry_password: &str, logins: &[(&str, &str)]) -> Result<()> {
    let mut f = std::io::BufWriter::new(std::fs::File::create(passwd)?);
    writeln!(f, "{REGISTRY_USER}:{registry_password}")?;
    for (user, password) in logins {
        writeln!(f, "{user}:{password}")?;
    }
    f.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    let ok = Command::new("mosquitto_passwd")
        .arg("-U")
        .arg(passwd)
        .status()
        .context("run mosquitto_passwd (Debian: apt-get install mosquitto)")?
        .success();
    if !ok {
        bail!("mosquitto_passwd -U {} failed", passwd.display());
    }
    Ok(())
}

/// What the benches' connections did, shared by their tasks.
#[derive(Default)]
struct FleetStats {
    /// Benches whose connection is up now.
    connected: AtomicU64,
    /// CONNACKs with `Success`, reconnects included.
    connacks: AtomicU64,
    /// CONNACKs refusing the login.
    refused: AtomicU64,
    /// Connection errors (each followed by a retry after 5 s).
    errors: AtomicU64,
    /// The first connection error, with its bench.
    first_error: Mutex<Option<String>>,
    /// Heartbeats handed to the benches' clients.
    heartbeats_sent: AtomicU64,
    /// Heartbeats not sent: the bench was not connected.
    heartbeats_skipped: AtomicU64,
}

/// A bench's live connection: its client and whether it is up.
struct Link {
    /// The bench's MQTT client.
    client: AsyncClient,
    /// True between a successful CONNACK and the next connection error.
    up: Arc<AtomicBool>,
    /// The heartbeat body (a [`HeartbeatRequest`]).
    heartbeat: Value,
    /// The provider id.
    id: String,
}

/// A `status` envelope of provider `id`, as an edge-agent sends it.
fn status_envelope(id: &str, status: OnlineStatus) -> Envelope {
    Envelope::new(
        MessageType::Status,
        uuid::Uuid::new_v4().to_string(),
        Utc::now(),
        &StatusBody {
            provider_id: id.to_string(),
            online_status: status,
            boot_id: Some("fleet-boot".into()),
        },
    )
    .unwrap_or_else(|_| unreachable!("a status body serializes"))
}

/// Start bench `b`'s connection at `slot`: an edge-agent's options (user
/// name = client id = provider id, token as password, clean session,
/// retained QoS 1 `offline` will), the `online` status on each CONNACK.
fn connect_bench(
    b: &Bench,
    host: &str,
    port: u16,
    slot: Instant,
    keep_alive: u64,
    stats: Arc<FleetStats>,
) -> (Link, tokio::task::JoinHandle<()>) {
    let status_topic = topic(PREFIX, &b.id, TopicKind::Status);
    let mut opts = MqttOptions::new(&b.id, host, port);
    opts.set_credentials(&b.id, &b.token)
        .set_keep_alive(Duration::from_secs(keep_alive))
        .set_clean_session(true)
        .set_inflight(8)
        .set_last_will(LastWill::new(
            status_topic.clone(),
            status_envelope(&b.id, OnlineStatus::Offline).to_bytes(),
            QoS::AtLeastOnce,
            true,
        ));
    let (client, mut eventloop) = AsyncClient::new(opts, 4);
    let mut net = eventloop.network_options();
    net.set_connection_timeout(10);
    net.set_tcp_nodelay(true);
    eventloop.set_network_options(net);
    let up = Arc::new(AtomicBool::new(false));
    let task = {
        let (client, up, id) = (client.clone(), up.clone(), b.id.clone());
        tokio::spawn(async move {
            tokio::time::sleep_until(slot).await;
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(ack))) => {
                        if ack.code == ConnectReturnCode::Success {
                            stats.connacks.fetch_add(1, Ordering::Relaxed);
                            if !up.swap(true, Ordering::Relaxed) {
                                stats.connected.fetch_add(1, Ordering::Relaxed);
                            }
                            let online = status_envelope(&id, OnlineStatus::Online);
                            let _ = client.try_publish(
                                status_topic.as_str(),
                                QoS::AtLeastOnce,
                                true,
                                online.to_bytes(),
                            );
                        } else {
                            stats.refused.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        if up.swap(false, Ordering::Relaxed) {
                            stats.connected.fetch_sub(1, Ordering::Relaxed);
                        }
                        stats.errors.fetch_add(1, Ordering::Relaxed);
                        {
                            let mut first =
                                stats.first_error.lock().unwrap_or_else(|p| p.into_inner());
                            if first.is_none() {
                                *first = Some(format!("{id}: {e}"));
                            }
                        }
                        tokio::time::sleep(Duration::from_secs(5)).await;
                    }
                }
            }
        })
    };
    let heartbeat = serde_json::to_value(HeartbeatRequest {
        provider_id: b.id.clone(),
        boot_id: Some("fleet-boot".into()),
        capabilities: b
            .capabilities
            .iter()
            .map(|c| CapabilityHealthReport {
                capability_id: c.clone(),
                health_status: HealthStatus::Healthy,
                message: None,
                metrics: serde_json::from_value(json!({ "temperature_c": 41.5 })).ok(),
            })
            .collect(),
        running_sessions: Vec::new(),
        faults: Vec::new(),
    })
    .unwrap_or_default();
    (
        Link {
            client,
            up,
            heartbeat,
            id: b.id.clone(),
        },
        task,
    )
}

/// Every bench's heartbeat each `period`, bench i at `start + period * i / n`,
/// from one task (QoS 0, as an edge-agent sends them).
fn heartbeats(
    links: Arc<Vec<Link>>,
    start: Instant,
    period: Duration,
    stats: Arc<FleetStats>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let n = links.len();
        let topics: Vec<String> = links
            .iter()
            .map(|l| topic(PREFIX, &l.id, TopicKind::Heartbeat))
            .collect();
        for round in 0u32.. {
            for (i, link) in links.iter().enumerate() {
                let due = start + period * round + period.mul_f64(i as f64 / n as f64);
                tokio::time::sleep_until(due).await;
                if !link.up.load(Ordering::Relaxed) {
                    stats.heartbeats_skipped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                let env = Envelope {
                    protocol_version: shared_protocol::PROTOCOL_VERSION.to_string(),
                    message_id: format!("{}-hb-{round}", link.id),
                    sent_at: Utc::now(),
                    message_type: MessageType::Heartbeat,
                    body: link.heartbeat.clone(),
                };
                match link.client.try_publish(
                    topics[i].as_str(),
                    QoS::AtMostOnce,
                    false,
                    env.to_bytes(),
                ) {
                    Ok(()) => stats.heartbeats_sent.fetch_add(1, Ordering::Relaxed),
                    Err(_) => stats.heartbeats_skipped.fetch_add(1, Ordering::Relaxed),
                };
            }
        }
    })
}

/// Mint a provider token per bench and `clients` audit-agent tokens, then
/// register the benches; returns the benches, the agents and the seconds
/// each phase took.
async fn register_fleet(
    registry: &RegistryProcess,
    n: usize,
    clients: usize,
    concurrency: usize,
) -> Result<(Vec<Bench>, Vec<(String, String)>, f64, f64)> {
    let http = http_client()?;
    let (base, admin) = (registry.base.as_str(), registry.admin_token.as_str());
    let t0 = Instant::now();
    let mut benches: Vec<Bench> = futures::stream::iter(0..n)
        .map(|i| {
            let http = http.clone();
            async move {
                let id = format!("fleet-{i:05}");
                let token = mint_token(&http, base, admin, "provider", &id).await?;
                // Every second bench has two capabilities.
                let capabilities = (0..1 + i % 2).map(|c| format!("{id}-cap-{c}")).collect();
                Ok::<_, anyhow::Error>(Bench {
                    id,
                    token,
                    capabilities,
                })
            }
        })
        .buffered(concurrency)
        .try_collect()
        .await?;
    let mut agents = Vec::with_capacity(clients);
    for i in 0..clients {
        let principal = format!("audit:fleet-client-{i:03}");
        let token = mint_token(&http, base, admin, "audit_agent", &principal).await?;
        agents.push((principal, token));
    }
    let minted = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    futures::stream::iter(benches.iter_mut())
        .map(|b| {
            let http = http.clone();
            async move {
                let caps: Vec<CapabilityRegistration> = b
                    .capabilities
                    .iter()
                    .map(|c| capability(c.clone(), CapabilityType::Relay))
                    .collect();
                register_provider(&http, base, &b.token, &b.id, caps).await
            }
        })
        .buffer_unordered(concurrency)
        .try_collect::<Vec<()>>()
        .await?;
    Ok((benches, agents, minted, t1.elapsed().as_secs_f64()))
}

/// Figures of one fleet run.
struct FleetRun {
    /// `embedded` or `mosquitto`.
    setup: &'static str,
    /// Simulated benches.
    n: usize,
    /// Seconds to mint every token.
    minted_s: f64,
    /// Seconds to register every bench over HTTP.
    registered_s: f64,
    /// Seconds from the first connection until every bench is connected
    /// (`None`: not within `--fleet-settle-seconds`).
    connected_s: Option<f64>,
    /// Seconds from the first connection until the registry has ingested
    /// as many `online` statuses as there are benches (`None`: not within
    /// `--fleet-settle-seconds`).
    online_s: Option<f64>,
    /// Seconds from the end of the HTTP registration to the last reading:
    /// a bench not kept online over MQTT is offline after
    /// `offline_after_missed` (3) heartbeat intervals.
    since_registration_s: f64,
    /// Benches connected at the end.
    connected_end: u64,
    /// Lowest `benchlink_providers_online` while the leases ran.
    online_min: u64,
    /// `benchlink_providers_online` at the end.
    online_end: u64,
    /// Failed connection attempts (each retried after 5 s).
    errors: u64,
    /// CONNACKs refusing the login.
    refused: u64,
    /// The first connection error, with its bench.
    first_error: Option<String>,
    /// Heartbeats published per second over the lease window.
    heartbeats_sent_s: f64,
    /// Heartbeats the registry counted per second over the lease window.
    heartbeats_ingested_s: f64,
    /// The lease cycles of the window.
    leases: RunResult,
    /// Length of the lease window (warm-up included), seconds.
    window_s: f64,
    /// Registry CPU over the window, cores (1.0 = one core busy).
    registry_cpu: f64,
    /// Registry `VmRSS` and `VmHWM` at the end, MB.
    registry_rss: (f64, f64),
    /// Registry open descriptors before the first bench connects.
    registry_fds_idle: usize,
    /// Registry open descriptors at the end.
    registry_fds: usize,
    /// Mosquitto's CPU over the window (cores), RSS (MB) and open
    /// descriptors at the end; `None` on the embedded broker.
    broker: Option<(f64, f64, usize)>,
    /// This process's CPU over the window, cores.
    bench_cpu: f64,
    /// This process's RSS at the end, MB.
    bench_rss: f64,
    /// This process's open descriptors at the end.
    bench_fds: usize,
}

/// `--fleet`: every setup and N of [`Args`], one fresh registry each.
pub async fn run(bin: &Path, dir: &Path, args: &Args) -> Result<()> {
    let limit = cloud_registry::fdlimit::raise_nofile_to_hard()
        .context("raise this process's RLIMIT_NOFILE")?;
    let setups: &[BrokerSetup] = match args.fleet_broker {
        BrokerSetup::Both => &[BrokerSetup::Embedded, BrokerSetup::External],
        BrokerSetup::Embedded => &[BrokerSetup::Embedded],
        BrokerSetup::External => &[BrokerSetup::External],
    };
    println!(
        "Benchlink fleet benchmark, {}",
        Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    println!(
        "machine:  {} (1-min load average {})",
        machine(),
        load_average()
    );
    println!(
        "benches:  1-2 relay capabilities each, rumqttc (one event-loop task each, keep-alive {} s, \
         retained QoS 1 offline will), {} connections/s, QoS 0 heartbeat every {} s (spread); \
         {} lease clients, {} s measured; RLIMIT_NOFILE {limit} (this process, the registry, Mosquitto)",
        args.fleet_keep_alive,
        args.connect_rate,
        args.fleet_heartbeat_seconds,
        args.fleet_clients,
        args.fleet_seconds
    );
    let mut runs = Vec::new();
    for &setup in setups {
        for &n in &args.fleet {
            let d = dir.join(format!("fleet-{setup:?}-{n}").to_lowercase());
            std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
            let r = fleet_run(bin, &d, args, setup, n).await?;
            print_run(&r);
            runs.push(r);
        }
    }
    println!();
    println!(
        "{:<9} {:>6} {:>7} {:>7} {:>13} {:>8} {:>6} {:>8} {:>7} {:>7} {:>7} {:>5} {:>6} {:>7} {:>7} {:>8} {:>13} {:>11}",
        "broker", "N", "tok s", "reg s", "online/min", "status s", "hb/s", "cycles/s", "p50 ms", "p99 ms",
        "max ms", "err", "reg %", "reg MB", "reg fd", "fd/bench", "mosq %/MB/fd", "bench %/MB"
    );
    for r in &runs {
        println!(
            "{:<9} {:>6} {:>7.1} {:>7.1} {:>13} {:>8} {:>6.0} {:>8.0} {:>7.2} {:>7.2} {:>7.1} {:>5} {:>6.0} {:>7.0} {:>7} {:>8.2} {:>13} {:>11}",
            r.setup,
            r.n,
            r.minted_s,
            r.registered_s,
            format!("{}/{}", r.online_end, r.online_min),
            r.online_s.map_or("-".into(), |s| format!("{s:.1}")),
            r.heartbeats_ingested_s,
            r.leases.rate(),
            r.leases.ms(50.0),
            r.leases.ms(99.0),
            r.leases.max_ms(),
            r.leases.errors,
            r.registry_cpu * 100.0,
            r.registry_rss.0,
            r.registry_fds,
            fds_per_bench(r),
            r.broker.map_or("-".into(), |(c, m, f)| format!("{:.0}/{m:.0}/{f}", c * 100.0)),
            format!("{:.0}/{:.0}", r.bench_cpu * 100.0, r.bench_rss),
        );
    }
    Ok(())
}

/// Registry descriptors per connected bench, beyond those it had idle.
fn fds_per_bench(r: &FleetRun) -> f64 {
    if r.connected_end == 0 {
        0.0
    } else {
        r.registry_fds.saturating_sub(r.registry_fds_idle) as f64 / r.connected_end as f64
    }
}

/// Print one run's figures.
fn print_run(r: &FleetRun) {
    let s = |v: Option<f64>| v.map_or("not within the settle time".into(), |s| format!("{s:.1} s"));
    println!();
    println!("== {} broker, {} benches", r.setup, r.n);
    println!(
        "  tokens minted {:.1} s, providers + capabilities registered {:.1} s ({:.0} benches/s)",
        r.minted_s,
        r.registered_s,
        r.n as f64 / r.registered_s.max(1e-3)
    );
    println!(
        "  all connected after {}, an online status from each ingested after {}; at the end \
         ({:.0} s after registering) {} connected, {} online (lowest while leasing {}); \
         {} connection errors, {} refused logins",
        s(r.connected_s),
        s(r.online_s),
        r.since_registration_s,
        r.connected_end,
        r.online_end,
        r.online_min,
        r.errors,
        r.refused
    );
    if let Some(e) = &r.first_error {
        println!("  first connection error: {e}");
    }
    println!(
        "  heartbeats over {:.0} s: {:.0}/s sent, {:.0}/s ingested by the registry",
        r.window_s, r.heartbeats_sent_s, r.heartbeats_ingested_s
    );
    println!(
        "  leases ({} clients): {} cycles, {:.0} cycles/s, p50 {:.2} ms, p99 {:.2} ms, max {:.1} ms, {} errors{}",
        r.leases.clients,
        r.leases.cycles,
        r.leases.rate(),
        r.leases.ms(50.0),
        r.leases.ms(99.0),
        r.leases.max_ms(),
        r.leases.errors,
        r.leases
            .first_error
            .as_ref()
            .map_or(String::new(), |e| format!(" (first: {e})"))
    );
    println!(
        "  registry: CPU {:.0} % of one core, RSS {:.0} MB (peak {:.0}), {} open fds ({} idle before the \
         benches: {:.2} per connected bench)",
        r.registry_cpu * 100.0,
        r.registry_rss.0,
        r.registry_rss.1,
        r.registry_fds,
        r.registry_fds_idle,
        fds_per_bench(r)
    );
    if let Some((cpu, rss, fds)) = r.broker {
        println!(
            "  mosquitto: CPU {:.0} % of one core, RSS {rss:.0} MB, {fds} open fds",
            cpu * 100.0
        );
    }
    println!(
        "  this process (benches + lease clients): CPU {:.0} % of one core, RSS {:.0} MB, {} open fds",
        r.bench_cpu * 100.0,
        r.bench_rss,
        r.bench_fds
    );
}

/// One fleet run: a fresh registry (and Mosquitto for `External`),
/// measured by [`fleet_measure`], then stopped.
async fn fleet_run(
    bin: &Path,
    dir: &Path,
    args: &Args,
    setup: BrokerSetup,
    n: usize,
) -> Result<FleetRun> {
    eprintln!("fleet: {setup:?} broker, {n} benches");
    let mosquitto = match setup {
        BrokerSetup::External => Some(Mosquitto::start(&args.mosquitto_bin, dir)?),
        _ => None,
    };
    let registry = match &mosquitto {
        Some(m) => RegistryProcess::start_with_mqtt(bin, dir, &m.registry_config(), "")?,
        None => RegistryProcess::start(bin, dir, "")?,
    };
    let outcome = fleet_measure(&registry, mosquitto.as_ref(), args, setup, n).await;
    let log = registry.log_path.clone();
    let stopped = registry.stop();
    if outcome.is_err() || stopped.is_err() {
        eprintln!("registry log kept: {}", log.display());
    }
    let r = outcome?;
    stopped?;
    Ok(r)
}

/// Register, connect and heartbeat `n` benches on `registry`, run the
/// leases while they stay online, and read the figures.
async fn fleet_measure(
    registry: &RegistryProcess,
    mosquitto: Option<&Mosquitto>,
    args: &Args,
    setup: BrokerSetup,
    n: usize,
) -> Result<FleetRun> {
    let pid = registry.pid_str();
    let http = http_client()?;
    let base = registry.base.as_str();
    let clients = args.fleet_clients.clamp(1, n.max(1));
    let (benches, agents, minted_s, registered_s) =
        register_fleet(registry, n, clients, args.fleet_concurrency.max(1)).await?;
    eprintln!("  registered in {minted_s:.1} + {registered_s:.1} s");
    let (host, port) = match mosquitto {
        Some(m) => {
            m.add_benches(&benches)?;
            tokio::time::sleep(Duration::from_millis(500)).await;
            ("127.0.0.1".to_string(), m.port)
        }
        None => (registry.mqtt.ip().to_string(), registry.mqtt.port()),
    };
    let registry_fds_idle = open_fds(&pid);
    let registered_at = Instant::now();
    let status_base = counters(&http, base).await?.status_in;

    let stats = Arc::new(FleetStats::default());
    let start = Instant::now();
    let mut links = Vec::with_capacity(n);
    let mut tasks = Vec::with_capacity(n);
    for (i, b) in benches.iter().enumerate() {
        let slot = start + Duration::from_secs_f64(i as f64 / args.connect_rate.max(1.0));
        let (link, task) =
            connect_bench(b, &host, port, slot, args.fleet_keep_alive, stats.clone());
        links.push(link);
        tasks.push(task);
    }
    let links = Arc::new(links);
    let period = Duration::from_secs_f64(args.fleet_heartbeat_seconds.max(0.1));
    let beats = heartbeats(
        links.clone(),
        start + Duration::from_secs(1),
        period,
        stats.clone(),
    );

    // Settle: every bench connected and online.
    let settle = start + Duration::from_secs(args.fleet_settle_seconds);
    let (mut connected_s, mut online_s) = (None, None);
    while Instant::now() < settle && (connected_s.is_none() || online_s.is_none()) {
        tokio::time::sleep(Duration::from_millis(250)).await;
        if connected_s.is_none() && stats.connected.load(Ordering::Relaxed) as usize >= n {
            connected_s = Some(start.elapsed().as_secs_f64());
        }
        if online_s.is_none() {
            if let Ok(c) = counters(&http, base).await {
                if c.status_in.saturating_sub(status_base) as usize >= n {
                    online_s = Some(start.elapsed().as_secs_f64());
                }
            }
        }
    }
    eprintln!(
        "  connected {} online {:?}",
        stats.connected.load(Ordering::Relaxed),
        online_s
    );

    // Leases on capabilities of `clients` benches spread over the fleet.
    let setup_leases = LeaseSetup {
        base: base.to_string(),
        client_bases: Vec::new(),
        own_capabilities: (0..clients)
            .map(|j| benches[j * n / clients].capabilities[0].clone())
            .collect(),
        agents,
        shared: None,
    };
    let mut lease_args = args.clone();
    lease_args.seconds = args.fleet_seconds;
    // Providers online every second while the leases run: a flap shows.
    let online_min = Arc::new(AtomicU64::new(u64::MAX));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (http, base, online_min, stop) = (
            http.clone(),
            base.to_string(),
            online_min.clone(),
            stop.clone(),
        );
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(c) = counters(&http, &base).await {
                    online_min.fetch_min(c.providers_online, Ordering::Relaxed);
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };
    let broker_pid = mosquitto.map(Mosquitto::pid_str);
    let c0 = counters(&http, base).await?;
    let (t0, hb0) = (
        Instant::now(),
        stats.heartbeats_sent.load(Ordering::Relaxed),
    );
    let (r0, m0) = (
        cpu_seconds(&pid).unwrap_or(0.0),
        broker_pid.as_deref().and_then(cpu_seconds).unwrap_or(0.0),
    );
    let b0 = cpu_seconds("self").unwrap_or(0.0);
    let leases = run_leases(
        &setup_leases,
        std::slice::from_ref(&pid),
        &lease_args,
        Scenario::Own,
        clients,
        None,
    )
    .await?;
    let window_s = t0.elapsed().as_secs_f64();
    let c1 = counters(&http, base).await?;
    let hb1 = stats.heartbeats_sent.load(Ordering::Relaxed);
    let registry_cpu = (cpu_seconds(&pid).unwrap_or(0.0) - r0) / window_s;
    let bench_cpu = (cpu_seconds("self").unwrap_or(0.0) - b0) / window_s;
    let broker = broker_pid.as_deref().map(|p| {
        (
            (cpu_seconds(p).unwrap_or(0.0) - m0) / window_s,
            p.parse().ok().and_then(rss_mb).map_or(0.0, |r| r.0),
            open_fds(p),
        )
    });
    stop.store(true, Ordering::Relaxed);
    let _ = watcher.await;
    let online_end = counters(&http, base).await?.providers_online;
    let since_registration_s = registered_at.elapsed().as_secs_f64();
    let registry_rss = rss_mb(registry.pid).context("registry RSS")?;
    let registry_fds = open_fds(&pid);
    let bench_rss = rss_mb(std::process::id()).map_or(0.0, |r| r.0);
    let bench_fds = open_fds("self");

    beats.abort();
    for t in &tasks {
        t.abort();
    }
    let first_error = stats
        .first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(FleetRun {
        setup: match setup {
            BrokerSetup::External => "mosquitto",
            _ => "embedded",
        },
        n,
        minted_s,
        registered_s,
        connected_s,
        online_s,
        since_registration_s,
        connected_end: stats.connected.load(Ordering::Relaxed),
        online_min: online_min.load(Ordering::Relaxed).min(online_end),
        online_end,
        errors: stats.errors.load(Ordering::Relaxed),
        refused: stats.refused.load(Ordering::Relaxed),
        first_error,
        heartbeats_sent_s: (hb1 - hb0) as f64 / window_s,
        heartbeats_ingested_s: c1.heartbeats_in.saturating_sub(c0.heartbeats_in) as f64 / window_s,
        leases,
        window_s,
        registry_cpu,
        registry_rss,
        registry_fds_idle,
        registry_fds,
        broker,
        bench_cpu,
        bench_rss,
        bench_fds,
    })
}
