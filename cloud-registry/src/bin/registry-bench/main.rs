//! `registry-bench`: the registry measured the way a lab uses it, as a
//! separate process over HTTP and MQTT, on the machine it runs on.
//!
//! ```text
//! cargo build --release -p cloud-registry --bins
//! target/release/registry-bench [--seconds 5] [--warmup 1] [--clients 1,20,200]
//! ```
//!
//! It starts the real `cloud-registry serve` (the binary next to this one,
//! or `--registry-bin`) with a generated configuration in a fresh directory:
//! HTTP and the embedded MQTT broker on free ports, a SQLite file, a
//! bootstrap admin token file. With that admin token it mints a `provider`
//! token per simulated provider and an `audit_agent` token per simulated
//! client (`POST /api/v1/auth/tokens`), registers the providers and their
//! capabilities over HTTP with the provider tokens, and measures:
//!
//! 1. **Leases over HTTP.** A cycle is `POST /api/v1/capability-leases/request`
//!    (`?wait_seconds=60`, so a queued request answers once granted) for an
//!    exclusive capability, then `POST /api/v1/capability-leases/{id}/release`.
//!    Cycles per second and the latency of each cycle (p50 / p99 / max) with
//!    1, 20 and 200 concurrent clients, in two scenarios: `own` (one
//!    capability per client: no queueing) and `one` (every client wants the
//!    same capability: each release hands it to the next waiter). Clients
//!    are closed-loop (the next cycle starts when the last one ends), so
//!    their mean latency is clients / throughput. `paced` runs then offer
//!    fixed total rates (default 500, 1,000 and 2,000 cycles/s from 200
//!    clients, `own` capabilities): each client starts a cycle every
//!    clients / rate seconds. Their latency is measured from each cycle's
//!    scheduled start, so a server that falls behind is not hidden by
//!    clients that wait for it (coordinated omission). Every run:
//!    `--warmup` seconds not counted, then `--seconds` measured; a run also
//!    ends after `--max-cycles`.
//!    The HTTP client is reqwest with keep-alive and `TCP_NODELAY`: one
//!    `reqwest::Client` (its own connection pool) per simulated client,
//!    or one shared by all with `--shared-client`.
//! 2. **Heartbeats over MQTT.** `--providers` rumqttc clients (user name =
//!    client id = provider id, password = provider token) publish heartbeat
//!    envelopes (QoS 0, each reporting `--capabilities-per-provider`
//!    capabilities) as fast as the registry ingests them: at most
//!    `--heartbeat-window` published but not yet ingested, so the broker's
//!    buffer stays bounded. Ingestion is read from the registry's own
//!    `benchlink_mqtt_messages_in_total{kind="heartbeat"}` counter on
//!    `/metrics` (counted when the single ingest task takes a message, which
//!    it then stores before taking the next), before and after the window.
//! 3. **Idle RSS** of the registry (`VmRSS` in `/proc/PID/status`) after
//!    start, after the lease runs and after the heartbeat run, each after
//!    `--idle-seconds` of idling; and its idle CPU after start.
//!
//! For each run it also reads the CPU time the registry process and this
//! process used (`/proc/PID/stat`), the bytes the registry wrote
//! (`/proc/PID/io`), and the events it appended (`benchlink_events_total`):
//! per cycle, they show where the machine's two cores go. The client shares the machine with the
//! registry; its CPU is reported so the figures can be read fairly.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use bytes::Bytes;
use chrono::Utc;
use clap::Parser;
use reqwest::header::CONTENT_TYPE;
use reqwest::StatusCode;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde::Deserialize;
use serde_json::{json, Value};
use shared_protocol::capability::{
    CapabilityBatchRegisterRequest, CapabilityRegistration, CapabilityType, HealthStatus, LeaseMode,
};
use shared_protocol::lease::{HolderType, LeaseRequest, LeaseStatus};
use shared_protocol::mqtt::{topic, Envelope, MessageType, TopicKind};
use shared_protocol::provider::{
    CapabilityHealthReport, HeartbeatRequest, ProviderRegisterRequest,
};
use shared_protocol::PROTOCOL_VERSION;
use tokio::time::Instant;

mod fleet;
mod stores;

#[derive(Debug, Clone, Parser)]
#[command(
    about = "Registry leases over HTTP, heartbeats over MQTT and idle RSS, as a separate process"
)]
struct Args {
    /// The registry binary (default: `cloud-registry` next to this executable).
    #[arg(long)]
    registry_bin: Option<PathBuf>,
    /// Store the registry's state in PostgreSQL at this URL
    /// (`postgres://postgres@127.0.0.1:5432/test`), each registry started
    /// in a new schema dropped afterwards, instead of a SQLite file.
    #[arg(long)]
    store_url: Option<String>,
    /// Measured seconds per run.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Seconds before each measurement that are not counted (connections
    /// opened, queues filled).
    #[arg(long, default_value_t = 1.0)]
    warmup: f64,
    /// Concurrent HTTP clients of the closed-loop runs, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 20, 200])]
    clients: Vec<usize>,
    /// Total cycles per second offered in the paced runs, one run per
    /// rate, comma-separated (empty: no paced run).
    #[arg(long, value_delimiter = ',', default_values_t = [500.0, 1000.0, 2000.0])]
    paced_rates: Vec<f64>,
    /// Clients of the paced runs.
    #[arg(long, default_value_t = 200)]
    paced_clients: usize,
    /// Most cycles recorded per run (bounds memory; the run ends early).
    #[arg(long, default_value_t = 1_000_000)]
    max_cycles: usize,
    /// One reqwest Client (one connection pool) shared by every simulated
    /// client, instead of one Client per simulated client.
    #[arg(long)]
    shared_client: bool,
    /// Simulated providers publishing heartbeats over MQTT (0 skips).
    #[arg(long, default_value_t = 20)]
    providers: usize,
    /// Capabilities each provider registers and reports per heartbeat.
    #[arg(long, default_value_t = 4)]
    capabilities_per_provider: usize,
    /// Most heartbeats published but not yet ingested.
    #[arg(long, default_value_t = 5000)]
    heartbeat_window: u64,
    /// Seconds the registry idles before each RSS reading.
    #[arg(long, default_value_t = 3)]
    idle_seconds: u64,
    /// Instead of the full run: lease cycles with the lab policy
    /// configured ([`POLICY_ON`]: principal policy, action budgets, the
    /// rate limit, queue aging) against none, on two fresh registries, alternating
    /// off/on `--policy-rounds` times, `own` capabilities at each
    /// `--clients` count; prints registry CPU per cycle side by side.
    #[arg(long)]
    policy_compare: bool,
    /// Rounds of the policy comparison (each runs off, then on).
    #[arg(long, default_value_t = 3)]
    policy_rounds: usize,
    /// Instead of the full run: this many simulated benches (MQTT
    /// connections with heartbeats) per run, comma-separated (fleet.rs,
    /// docs/benchmarks.md "Ten thousand benches").
    /// `--fleet` alone: 10,000.
    #[arg(long, value_delimiter = ',', num_args = 0.., default_missing_value = "10000")]
    fleet: Vec<usize>,
    /// Instead of the full run: the `own` lease runs (`--clients`,
    /// `--paced-rates`) and the heartbeat ingest on SQLite, on PostgreSQL
    /// (`--store-url`, default the local server's `test` database) with
    /// one registry, and with two `[cluster]` replicas on one schema; then
    /// `--failovers` SIGKILLs of the leader (stores.rs).
    #[arg(long)]
    stores: bool,
    /// SIGKILLs of the leader in `--stores` (0 skips the takeover rounds).
    #[arg(long, default_value_t = 10)]
    failovers: usize,
    /// Clients leasing and releasing through both replicas while the
    /// leader is killed.
    #[arg(long, default_value_t = 20)]
    failover_clients: usize,
    /// The replicas' `[cluster] takeover_poll_ms` (the shipped default: 500).
    #[arg(long, default_value_t = 500)]
    takeover_poll_ms: u64,
    /// The broker of the fleet runs.
    #[arg(long, value_enum, default_value = "both")]
    fleet_broker: fleet::BrokerSetup,
    /// Closed-loop lease clients of a fleet run.
    #[arg(long, default_value_t = 20)]
    fleet_clients: usize,
    /// Measured seconds of a fleet run's leases (after `--warmup`).
    #[arg(long, default_value_t = 30.0)]
    fleet_seconds: f64,
    /// Heartbeat interval of each simulated bench, seconds (the
    /// registry's `[heartbeat] interval_seconds`).
    #[arg(long, default_value_t = 10.0)]
    fleet_heartbeat_seconds: f64,
    /// MQTT keep-alive of each simulated bench, seconds (edge-agent's
    /// default `mqtt_keep_alive_seconds`).
    #[arg(long, default_value_t = 15)]
    fleet_keep_alive: u64,
    /// New MQTT connections per second while the fleet connects.
    #[arg(long, default_value_t = 1000.0)]
    connect_rate: f64,
    /// Most seconds from the first connection until every bench is
    /// online; the leases run anyway after it.
    #[arg(long, default_value_t = 60)]
    fleet_settle_seconds: u64,
    /// HTTP requests in flight while the fleet registers.
    #[arg(long, default_value_t = 32)]
    fleet_concurrency: usize,
    /// The Mosquitto binary of the external setup.
    #[arg(long, default_value = "mosquitto")]
    mosquitto_bin: String,
    /// Keep the registry's directory (config, SQLite file, log) here
    /// instead of a temporary one that is removed at the end.
    #[arg(long)]
    dir: Option<PathBuf>,
}

/// The provider whose capabilities the lease runs use.
const LEASE_PROVIDER: &str = "bench-lease-provider";
/// The capability every client of the `one` scenario wants.
const CONTENDED: &str = "bench-cap-contended";

/// The lab policy of `--policy-compare`'s "on" registry: every limit set,
/// none reached by the benchmark's cycles (priority 50, 60 s, one lease per
/// client, relays tagged `bench`), so each request pays for every check.
const POLICY_ON: &str = r#"
[policy.roles.audit_agent]
max_priority = 60
max_concurrent_leases = 4
max_lease_seconds = 600
allowed_capability_types = ["relay", "camera"]
allowed_tags = ["bench", "lab"]
allowed_preempt_reasons = ["hardware_audit_deadline"]

[policy.principals."audit:bench-client-0000"]
max_priority = 70

[policy.budgets]
window_seconds = 60
[policy.budgets.relay]
per_lease = 30
per_principal = 60

[policy.rate_limit]
requests_per_minute = 6000000
burst = 1000000

[policy.queue_aging]
priority_per_minute = 1.0
max_boost = 10
"#;

/// Reference figures: the labgrid 26 coordinator measured on this machine.
const LABGRID: &str = "labgrid 26 coordinator (same machine): 1 client ~100 cycles/s, p50 10 ms; \
                       20 clients ~21 cycles/s total, p50 900 ms; RSS 54 MB";

// ---------------------------------------------------------------- machine

/// `nproc`, the CPU model name, the kernel and the memory, for the header.
fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "model name").then(|| v.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let mem_gb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            let line = m.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kb / 1024.0 / 1024.0)
        })
        .unwrap_or(0.0);
    format!(
        "{model}, nproc {cores}, Linux {}, {mem_gb:.0} GB RAM",
        kernel.trim()
    )
}

/// CPU seconds (user + system, all threads) a process has used so far.
/// `/proc/PID/stat` counts in USER_HZ, which Linux fixes at 100.
fn cpu_seconds(pid: &str) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: fields are counted after its `)`.
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    Some((utime + stime) / 100.0)
}

/// CPU seconds used so far by every process named `postgres` on this
/// machine (the server and its backends; a backend that has exited is no
/// longer counted, the registry's sessions live as long as it does).
fn postgres_cpu_seconds() -> f64 {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return 0.0;
    };
    dir.filter_map(Result::ok)
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|pid| pid.bytes().all(|b| b.is_ascii_digit()))
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/comm"))
                .is_ok_and(|c| c.trim() == "postgres")
        })
        .filter_map(|pid| cpu_seconds(&pid))
        .sum()
}

/// `VmRSS` and `VmHWM` (peak) of a process, MB (10^6 bytes).
fn rss_mb(pid: u32) -> Option<(f64, f64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb = |key: &str| -> Option<f64> {
        let line = status.lines().find(|l| l.starts_with(key))?;
        line.split_whitespace().nth(1)?.parse().ok()
    };
    Some((kb("VmRSS:")? * 1.024e-3, kb("VmHWM:")? * 1.024e-3))
}

// ---------------------------------------------------------------- registry

/// The registry as a child process. Dropping it kills the process; call
/// [`RegistryProcess::stop`] for a clean stop.
struct RegistryProcess {
    child: Child,
    pid: u32,
    base: String,
    mqtt: std::net::SocketAddr,
    admin_token: String,
    db_path: PathBuf,
    log_path: PathBuf,
    /// PostgreSQL: the URL and the schema.
    pg_schema: Option<(String, String)>,
    /// Drop `pg_schema` when this process is dropped (a schema of its own).
    drop_schema: bool,
    /// Its first line was the ready line: it leads (or runs alone).
    leading: bool,
    /// Lines the registry printed on stdout after the first, with the time
    /// each arrived.
    lines: Mutex<std::sync::mpsc::Receiver<(std::time::Instant, String)>>,
}

/// Where a started registry keeps its state.
enum StoreChoice {
    /// PostgreSQL in a new schema when `--store-url` is given (dropped
    /// with the process), else SQLite in the directory.
    FromArgs,
    /// A SQLite file in the directory.
    Sqlite,
    /// This PostgreSQL schema, kept when the process is dropped.
    Postgres { url: String, schema: String },
}

/// A `[cluster]` replica's settings.
#[derive(Clone)]
struct ReplicaSpec {
    /// `replica_id`.
    id: String,
    /// Its HTTP port on 127.0.0.1 (fixed, so a restart keeps its URL).
    http_port: u16,
    /// `takeover_poll_ms`.
    takeover_poll_ms: u64,
}

/// How [`RegistryProcess::launch`] configures a registry.
struct Launch<'a> {
    /// The `[mqtt]` table's body (TOML lines).
    mqtt_config: &'a str,
    /// More TOML after the generated tables.
    extra_config: &'a str,
    store: StoreChoice,
    /// Set: a `[cluster]` replica.
    replica: Option<ReplicaSpec>,
    /// The bootstrap admin token file (default `admin.token` in the
    /// directory); replicas of one store share one.
    token_file: Option<PathBuf>,
    /// The log's file name in the directory.
    log_name: &'a str,
}

/// A fresh PostgreSQL schema name for this process.
fn new_schema_name() -> String {
    static STARTED: AtomicUsize = AtomicUsize::new(0);
    let n = STARTED.fetch_add(1, Ordering::Relaxed);
    format!("bench_{}_{n}", std::process::id())
}

/// `--store-url`, once parsed.
static STORE_URL: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();

/// The first line a registry prints: `{"event":"ready","http","mqtt",..}`
/// or, for a replica that stands by, `{"event":"standby","http","leader"}`.
#[derive(Deserialize)]
struct FirstLine {
    event: String,
    http: String,
    mqtt: Option<String>,
}

impl RegistryProcess {
    /// Write the configuration into `dir`, start `bin serve` with the
    /// embedded broker, wait for the ready line (at most 120 s: the Earth
    /// entity data loads first).
    fn start(bin: &Path, dir: &Path, extra_config: &str) -> Result<Self> {
        Self::start_with_mqtt(
            bin,
            dir,
            "mode = \"embedded\"\nlisten = \"127.0.0.1:0\"\n",
            extra_config,
        )
    }

    /// [`RegistryProcess::start`] with `mqtt_config` as the body of the
    /// `[mqtt]` table (TOML lines).
    fn start_with_mqtt(
        bin: &Path,
        dir: &Path,
        mqtt_config: &str,
        extra_config: &str,
    ) -> Result<Self> {
        Self::launch(
            bin,
            dir,
            &Launch {
                mqtt_config,
                extra_config,
                store: StoreChoice::FromArgs,
                replica: None,
                token_file: None,
                log_name: "registry.log",
            },
        )
    }

    /// Write the configuration into `dir` and start `bin serve` as
    /// `launch` says; returns once it printed its first line (the ready
    /// line, or a replica's standby line), at most 120 s.
    fn launch(bin: &Path, dir: &Path, launch: &Launch<'_>) -> Result<Self> {
        let db_path = dir.join("registry.sqlite3");
        let (schema, drop_schema) = match &launch.store {
            StoreChoice::FromArgs => (
                STORE_URL
                    .get()
                    .and_then(|u| u.as_ref())
                    .map(|url| (url.clone(), new_schema_name())),
                true,
            ),
            StoreChoice::Sqlite => (None, false),
            StoreChoice::Postgres { url, schema } => (Some((url.clone(), schema.clone())), false),
        };
        let token_path = launch
            .token_file
            .clone()
            .unwrap_or_else(|| dir.join("admin.token"));
        let log_path = dir.join(launch.log_name);
        // `toml::Value`'s Display quotes and escapes a string as TOML.
        let quoted = |p: &Path| toml::Value::from(p.display().to_string()).to_string();
        let store_extra = match &schema {
            Some((url, schema)) => format!(
                "backend = \"postgres\"\nurl = {}\nschema = \"{schema}\"\n",
                toml::Value::from(url.clone())
            ),
            None => String::new(),
        };
        let (listen, cluster) = match &launch.replica {
            Some(r) => (
                format!("127.0.0.1:{}", r.http_port),
                format!(
                    "[cluster]\nenabled = true\nreplica_id = \"{}\"\ntakeover_poll_ms = {}\n\n",
                    r.id, r.takeover_poll_ms
                ),
            ),
            None => ("127.0.0.1:0".to_string(), String::new()),
        };
        let config = format!(
            "[http]\nlisten = \"{listen}\"\n\n\
             [store]\npath = {}\n{store_extra}\n\
             [auth]\nbootstrap_admin_token_file = {}\n\n\
             [mqtt]\n{}\n\
             [sessions]\nartifact_dir = {}\n\n{cluster}{}",
            quoted(&db_path),
            quoted(&token_path),
            launch.mqtt_config,
            quoted(&dir.join("artifacts")),
            launch.extra_config,
        );
        let config_path = dir.join("cloud-registry.toml");
        std::fs::write(&config_path, config)
            .with_context(|| format!("write {}", config_path.display()))?;
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("create {}", log_path.display()))?;
        let mut child = Command::new(bin)
            .arg("serve")
            .arg("--config")
            .arg(&config_path)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .spawn()
            .with_context(|| format!("start {bin}", bin = bin.display()))?;
        let pid = child.id();
        let stdout = child.stdout.take().context("registry stdout")?;
        let (tx, rx) = std::sync::mpsc::channel();
        // Stdout carries the ready line (a standby's line first, for a
        // replica); each is passed on with the time it arrived.
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(|l| l.ok()) {
                if tx.send((std::time::Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        let mut process = Self {
            pg_schema: schema,
            drop_schema,
            child,
            pid,
            base: String::new(),
            mqtt: std::net::SocketAddr::from(([127, 0, 0, 1], 0)),
            admin_token: String::new(),
            db_path,
            log_path,
            leading: false,
            lines: Mutex::new(rx),
        };
        let line = process
            .next_line(Duration::from_secs(120))
            .ok_or_else(|| {
                anyhow!(
                    "no ready line from the registry within 120 s; see {}",
                    process.log_path.display()
                )
            })?
            .1;
        let first: FirstLine =
            serde_json::from_str(&line).with_context(|| format!("registry ready line `{line}`"))?;
        process.base = format!("http://{}", first.http);
        process.leading = first.event == "ready";
        if let Some(mqtt) = &first.mqtt {
            process.mqtt = mqtt
                .parse()
                .with_context(|| format!("MQTT address `{mqtt}`"))?;
        }
        process.admin_token = std::fs::read_to_string(&token_path)
            .with_context(|| format!("read {}", token_path.display()))?
            .trim()
            .to_string();
        Ok(process)
    }

    /// The next line the registry printed on stdout and when it arrived,
    /// waiting at most `wait`.
    fn next_line(&self, wait: Duration) -> Option<(std::time::Instant, String)> {
        let rx = self.lines.lock().unwrap_or_else(|p| p.into_inner());
        rx.recv_timeout(wait).ok()
    }

    /// SIGKILL (nothing of the registry gets to run), and reap it.
    fn kill(&mut self) -> Result<()> {
        self.child.kill().context("SIGKILL the registry")?;
        self.child.wait().context("reap the registry")?;
        Ok(())
    }

    fn pid_str(&self) -> String {
        self.pid.to_string()
    }

    /// SIGTERM, then wait up to 15 s for a clean exit (SIGKILL after).
    fn stop(mut self) -> Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid_str()])
            .status();
        let deadline = std::time::Instant::now() + Duration::from_secs(15);
        while std::time::Instant::now() < deadline {
            if self.child.try_wait()?.is_some() {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("the registry did not stop within 15 s of SIGTERM")
    }
}

impl Drop for RegistryProcess {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        if let (true, Some((url, schema))) = (self.drop_schema, &self.pg_schema) {
            drop_schema(url, schema);
        }
    }
}

/// `DROP SCHEMA … CASCADE` on its own thread: the synchronous client
/// must not run on a tokio worker, where the drops happen.
fn drop_schema(url: &str, schema: &str) {
    let (url, sql) = (
        url.to_string(),
        format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"),
    );
    let dropped = std::thread::spawn(move || {
        postgres::Client::connect(&url, postgres::NoTls).and_then(|mut c| c.batch_execute(&sql))
    })
    .join();
    if let Ok(Err(e)) = dropped {
        eprintln!("could not drop the benchmark's schema: {e}");
    }
}

/// `journal_mode` as stored in the database file (WAL is persistent, so a
/// separate read-only connection sees it). `synchronous` is per connection
/// and cannot be read from outside; the registry sets `NORMAL` (db.rs).
fn journal_mode(db: &Path) -> Result<String> {
    let conn = rusqlite::Connection::open_with_flags(
        db,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )?;
    Ok(conn.query_row("PRAGMA journal_mode", [], |r| r.get(0))?)
}

// ---------------------------------------------------------------- HTTP setup

fn http_client() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .timeout(Duration::from_secs(120))
        .build()?)
}

/// POST JSON with a bearer token; the answer's JSON on a 2xx, an error
/// naming the path and the registry's error body otherwise.
async fn post_json(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    path: &str,
    body: &impl serde::Serialize,
) -> Result<Value> {
    let resp = http
        .post(format!("{base}{path}"))
        .bearer_auth(token)
        .json(body)
        .send()
        .await
        .with_context(|| format!("POST {path}"))?;
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    if !status.is_success() {
        bail!("POST {path}: {status}: {text}");
    }
    serde_json::from_str(&text).with_context(|| format!("POST {path}: answer `{text}`"))
}

/// Mint a token with the admin token.
async fn mint_token(
    http: &reqwest::Client,
    base: &str,
    admin: &str,
    role: &str,
    name: &str,
) -> Result<String> {
    let v = post_json(
        http,
        base,
        admin,
        "/api/v1/auth/tokens",
        &json!({ "role": role, "name": name }),
    )
    .await?;
    v.get("token")
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| anyhow!("token answer without `token`: {v}"))
}

fn capability(capability_id: String, capability_type: CapabilityType) -> CapabilityRegistration {
    CapabilityRegistration {
        display_name: format!("bench {capability_id}"),
        capability_id,
        capability_type,
        lease_mode: LeaseMode::Exclusive,
        preemptible: true,
        supported_actions: Vec::new(),
        evidence_modes: Vec::new(),
        metadata_json: None,
        constraints_json: None,
        default_priority: None,
        safety_locked: false,
        tags: vec!["bench".into()],
        location_label: None,
        node_id: None,
    }
}

/// Register `provider_id` and its capabilities over HTTP with its own token.
async fn register_provider(
    http: &reqwest::Client,
    base: &str,
    token: &str,
    provider_id: &str,
    capabilities: Vec<CapabilityRegistration>,
) -> Result<()> {
    let provider = ProviderRegisterRequest {
        provider_id: provider_id.to_string(),
        node_id: format!("{provider_id}-node"),
        hostname: "bench-host".into(),
        platform: "linux".into(),
        gateway_version: env!("CARGO_PKG_VERSION").into(),
        network_zone: "lan".into(),
        labels: Vec::new(),
        owner_type: None,
        owner_display_name: None,
        auth_mode: None,
        boot_id: Some("bench-boot".into()),
    };
    post_json(
        http,
        base,
        token,
        "/api/v1/capability-providers/register",
        &provider,
    )
    .await?;
    post_json(
        http,
        base,
        token,
        "/api/v1/capabilities/register",
        &CapabilityBatchRegisterRequest {
            provider_id: provider_id.to_string(),
            capabilities,
        },
    )
    .await?;
    Ok(())
}

/// The registry's counters on `/metrics` this bench reads.
#[derive(Debug, Clone, Copy, Default)]
struct Counters {
    events: u64,
    /// `benchlink_providers_online` (a gauge).
    providers_online: u64,
    heartbeats_in: u64,
    /// `benchlink_mqtt_messages_in_total{kind="status"}`.
    status_in: u64,
    rejected: u64,
    duplicates: u64,
}

async fn counters(http: &reqwest::Client, base: &str) -> Result<Counters> {
    let text = http
        .get(format!("{base}/metrics"))
        .send()
        .await?
        .error_for_status()?
        .text()
        .await?;
    let mut c = Counters::default();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.parse::<u64>() else {
            continue;
        };
        match name {
            "benchlink_events_total" => c.events = value,
            "benchlink_providers_online" => c.providers_online = value,
            "benchlink_mqtt_messages_in_total{kind=\"heartbeat\"}" => c.heartbeats_in = value,
            "benchlink_mqtt_messages_in_total{kind=\"status\"}" => c.status_in = value,
            "benchlink_mqtt_messages_rejected_total" => c.rejected = value,
            "benchlink_mqtt_duplicates_total" => c.duplicates = value,
            _ => {}
        }
    }
    Ok(c)
}

// ---------------------------------------------------------------- leases

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    /// One capability per client.
    Own,
    /// Every client wants the same capability.
    One,
}

/// One simulated audit agent.
struct LeaseClient {
    http: reqwest::Client,
    token: String,
    request_url: String,
    /// The serialized [`LeaseRequest`].
    body: Bytes,
}

#[derive(Deserialize)]
struct LeaseAnswer {
    lease_id: String,
    status: LeaseStatus,
}

impl LeaseClient {
    fn new(
        http: reqwest::Client,
        base: &str,
        token: String,
        principal: &str,
        capability_id: &str,
    ) -> Result<Self> {
        let req = LeaseRequest {
            capability_id: Some(capability_id.to_string()),
            capability_selector: None,
            holder_type: HolderType::AuditAgent,
            holder_ref: principal.to_string(),
            project_id: "bench".into(),
            purpose: "registry benchmark".into(),
            priority: 50,
            requested_duration_seconds: 60,
            evidence_required: false,
            preempt_if_needed: false,
            preempt_reason: None,
            mode: None,
            queue_timeout_seconds: None,
        };
        Ok(Self {
            http,
            token,
            request_url: format!("{base}/api/v1/capability-leases/request?wait_seconds=60"),
            body: Bytes::from(serde_json::to_vec(&req)?),
        })
    }

    /// Acquire (waiting in the queue if needed) and release; returns how
    /// long each took (answers included).
    async fn cycle(&self, base: &str) -> Result<(Duration, Duration)> {
        let t0 = Instant::now();
        let resp = self
            .http
            .post(&self.request_url)
            .bearer_auth(&self.token)
            .header(CONTENT_TYPE, "application/json")
            .body(self.body.clone())
            .send()
            .await
            .context("lease request")?;
        let status = resp.status();
        let bytes = resp.bytes().await.context("lease request answer")?;
        if status != StatusCode::CREATED && status != StatusCode::ACCEPTED {
            bail!(
                "lease request: {status}: {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        let lease: LeaseAnswer = serde_json::from_slice(&bytes).context("lease answer")?;
        let acquired = t0.elapsed();
        let t1 = Instant::now();
        let resp = self
            .http
            .post(format!(
                "{base}/api/v1/capability-leases/{}/release",
                lease.lease_id
            ))
            .bearer_auth(&self.token)
            .send()
            .await
            .context("lease release")?;
        let released = resp.status();
        let bytes = resp.bytes().await.context("lease release answer")?;
        if !released.is_success() {
            bail!(
                "release of {}: {released}: {}",
                lease.lease_id,
                String::from_utf8_lossy(&bytes)
            );
        }
        if lease.status != LeaseStatus::Granted {
            bail!(
                "lease {} was still {} after 60 s in the queue (withdrawn)",
                lease.lease_id,
                lease.status
            );
        }
        Ok((acquired, t1.elapsed()))
    }
}

/// Everything the lease runs share: the simulated clients' tokens and the
/// HTTP clients.
struct LeaseSetup {
    /// The registry the runs read `/metrics` from.
    base: String,
    /// The URL each simulated client sends its requests to: client `i`
    /// uses entry `i % len` (replicas); empty: `base`.
    client_bases: Vec<String>,
    /// (principal, token) per simulated client.
    agents: Vec<(String, String)>,
    /// The `own` scenario's capability of each simulated client.
    own_capabilities: Vec<String>,
    shared: Option<reqwest::Client>,
}

impl LeaseSetup {
    /// The URL simulated client `i` sends its requests to.
    fn client_base(&self, i: usize) -> &str {
        if self.client_bases.is_empty() {
            &self.base
        } else {
            &self.client_bases[i % self.client_bases.len()]
        }
    }

    fn http(&self) -> Result<reqwest::Client> {
        match &self.shared {
            Some(c) => Ok(c.clone()),
            None => http_client(),
        }
    }
}

/// Figures of one run.
struct RunResult {
    label: String,
    /// Paced runs: the total rate offered, cycles/s.
    offered: Option<f64>,
    clients: usize,
    cycles: usize,
    seconds: f64,
    /// Whole cycles, sorted, microseconds.
    latencies_us: Vec<u64>,
    /// The acquire part of each cycle, sorted, microseconds.
    acquire_us: Vec<u64>,
    /// The release part of each cycle, sorted, microseconds.
    release_us: Vec<u64>,
    /// Acquire + release from the cycle's actual start (for paced runs,
    /// without the time the client was behind its schedule), sorted, us.
    service_us: Vec<u64>,
    errors: usize,
    first_error: Option<String>,
    registry_cpu_s: f64,
    /// CPU of the PostgreSQL server's processes on this machine (0 on SQLite).
    postgres_cpu_s: f64,
    bench_cpu_s: f64,
    events: u64,
    /// Bytes the registry wrote (files and sockets, `wchar`).
    registry_written: u64,
    /// 1-minute load average at the end of the run.
    load: String,
}

impl RunResult {
    fn rate(&self) -> f64 {
        self.cycles as f64 / self.seconds
    }

    fn ms(&self, p: f64) -> f64 {
        percentile(&self.latencies_us, p)
    }

    fn max_ms(&self) -> f64 {
        self.latencies_us.last().copied().unwrap_or(0) as f64 / 1000.0
    }

    fn per_cycle(&self, total: f64) -> f64 {
        if self.cycles == 0 {
            0.0
        } else {
            total / self.cycles as f64
        }
    }
}

fn us(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// Bytes a process has written so far (`wchar` in `/proc/PID/io`: files
/// and sockets, whether or not they reached the disk yet).
fn written_bytes(pid: &str) -> Option<u64> {
    let io = std::fs::read_to_string(format!("/proc/{pid}/io")).ok()?;
    io.lines()
        .find_map(|l| l.strip_prefix("wchar:"))?
        .trim()
        .parse()
        .ok()
}

/// The system's 1-minute load average (other work on the machine skews
/// every figure).
fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_string))
        .unwrap_or_else(|| "?".into())
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64 / 1000.0
}

/// Timing of one run.
#[derive(Clone, Copy)]
struct Window {
    /// Counting starts.
    from: Instant,
    /// Counting ends; no cycle starts after it.
    to: Instant,
    /// Paced runs: each client's cycle period and its first start.
    pace: Option<(Duration, Instant)>,
}

/// One lease run of `clients` simulated clients; the CPU and bytes written
/// are summed over `registry_pids` (every replica).
async fn run_leases(
    setup: &LeaseSetup,
    registry_pids: &[String],
    args: &Args,
    scenario: Scenario,
    clients: usize,
    paced_rate: Option<f64>,
) -> Result<RunResult> {
    let clients = clients.clamp(1, setup.agents.len());
    let mut lease_clients = Vec::with_capacity(clients);
    for (i, (principal, token)) in setup.agents.iter().take(clients).enumerate() {
        let cap = match scenario {
            Scenario::Own => setup.own_capabilities[i].clone(),
            Scenario::One => CONTENDED.to_string(),
        };
        lease_clients.push(Arc::new(LeaseClient::new(
            setup.http()?,
            setup.client_base(i),
            token.clone(),
            principal,
            &cap,
        )?));
    }
    let label = match (scenario, paced_rate) {
        (Scenario::Own, None) => "own capability".to_string(),
        (Scenario::One, None) => "one capability (contended)".to_string(),
        (_, Some(rate)) => format!("own, paced {rate:.0}/s total"),
    };
    let start = Instant::now();
    let from = start + Duration::from_secs_f64(args.warmup);
    let to = from + Duration::from_secs_f64(args.seconds);
    let window = Window {
        from,
        to,
        pace: paced_rate.map(|rate| (Duration::from_secs_f64(clients as f64 / rate), start)),
    };
    let recorded = Arc::new(AtomicUsize::new(0));
    // When `--max-cycles` ended the run before `to`.
    let cut_short: Arc<Mutex<Option<Instant>>> = Arc::default();
    let first_error: Arc<Mutex<Option<String>>> = Arc::default();

    // Counters and CPU at both ends of the window.
    let sampler = {
        let base = setup.base.clone();
        let pids = registry_pids.to_vec();
        let http = http_client()?;
        tokio::spawn(async move {
            let sample = |http: reqwest::Client, base: String, pids: Vec<String>| async move {
                let c = counters(&http, &base).await.unwrap_or_default();
                (
                    c.events,
                    pids.iter()
                        .map(|p| cpu_seconds(p).unwrap_or(0.0))
                        .sum::<f64>(),
                    cpu_seconds("self").unwrap_or(0.0),
                    pids.iter()
                        .map(|p| written_bytes(p).unwrap_or(0))
                        .sum::<u64>(),
                    postgres_cpu_seconds(),
                )
            };
            tokio::time::sleep_until(window.from).await;
            let a = sample(http.clone(), base.clone(), pids.clone()).await;
            tokio::time::sleep_until(window.to).await;
            let b = sample(http, base, pids).await;
            (
                b.0.saturating_sub(a.0),
                b.1 - a.1,
                b.2 - a.2,
                b.3.saturating_sub(a.3),
                b.4 - a.4,
            )
        })
    };

    let mut tasks = Vec::with_capacity(clients);
    for (i, client) in lease_clients.into_iter().enumerate() {
        let base = setup.client_base(i).to_string();
        let recorded = recorded.clone();
        let cut_short = cut_short.clone();
        let first_error = first_error.clone();
        let max = args.max_cycles;
        tasks.push(tokio::spawn(async move {
            let mut latencies = Vec::new();
            let mut acquires = Vec::new();
            let mut releases = Vec::new();
            let mut services = Vec::new();
            let mut errors = 0usize;
            // Paced clients start evenly spread over one period.
            let offset = window
                .pace
                .map(|(period, first)| first + period.mul_f64(i as f64 / clients as f64));
            let mut k = 0u32;
            loop {
                let scheduled = match (window.pace, offset) {
                    (Some((period, _)), Some(first)) => {
                        let at = first + period * k;
                        k += 1;
                        if at >= window.to {
                            break;
                        }
                        tokio::time::sleep_until(at).await;
                        at
                    }
                    _ => {
                        let now = Instant::now();
                        if now >= window.to {
                            break;
                        }
                        now
                    }
                };
                let result = client.cycle(&base).await;
                let end = Instant::now();
                if end < window.from || end > window.to {
                    continue;
                }
                match result {
                    Ok((acquired, released)) => {
                        latencies.push(us(end - scheduled));
                        acquires.push(us(acquired));
                        releases.push(us(released));
                        services.push(us(acquired + released));
                        if recorded.fetch_add(1, Ordering::Relaxed) + 1 >= max {
                            let mut cut = cut_short.lock().unwrap_or_else(|p| p.into_inner());
                            cut.get_or_insert(end);
                            break;
                        }
                    }
                    Err(e) => {
                        errors += 1;
                        let mut first = first_error.lock().unwrap_or_else(|p| p.into_inner());
                        if first.is_none() {
                            *first = Some(format!("{e:#}"));
                        }
                    }
                }
            }
            (latencies, acquires, releases, services, errors)
        }));
    }
    let (mut latencies_us, mut acquire_us, mut release_us, mut service_us) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let mut errors = 0;
    for t in tasks {
        let (l, a, r, v, e) = t.await?;
        latencies_us.extend(l);
        acquire_us.extend(a);
        release_us.extend(r);
        service_us.extend(v);
        errors += e;
    }
    let (events, registry_cpu_s, bench_cpu_s, registry_written, postgres_cpu_s) = sampler.await?;
    let measured_to = cut_short
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .unwrap_or(window.to);
    latencies_us.sort_unstable();
    acquire_us.sort_unstable();
    release_us.sort_unstable();
    service_us.sort_unstable();
    let first_error = first_error
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(RunResult {
        label,
        offered: paced_rate,
        clients,
        cycles: latencies_us.len(),
        seconds: (measured_to - window.from).as_secs_f64().max(1e-3),
        latencies_us,
        acquire_us,
        release_us,
        service_us,
        errors,
        first_error,
        registry_cpu_s,
        postgres_cpu_s,
        bench_cpu_s,
        events,
        registry_written,
        load: load_average(),
    })
}

/// Keep the lease provider online while the lease runs last (the registry
/// marks a provider offline after three missed heartbeat intervals).
///
/// Each heartbeat goes to the first of `bases` that takes it (replicas:
/// one may be down).
fn keep_lease_provider_online(
    http: reqwest::Client,
    bases: Vec<String>,
    token: String,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let hb = HeartbeatRequest {
            provider_id: LEASE_PROVIDER.into(),
            boot_id: Some("bench-boot".into()),
            capabilities: Vec::new(),
            running_sessions: Vec::new(),
            faults: Vec::new(),
        };
        loop {
            let mut failed = None;
            for base in &bases {
                match post_json(&http, base, &token, "/api/v1/capabilities/heartbeat", &hb).await {
                    Ok(_) => {
                        failed = None;
                        break;
                    }
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                eprintln!("lease provider heartbeat failed: {e:#}");
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
        }
    })
}

// ---------------------------------------------------------------- heartbeats

struct HeartbeatResult {
    providers: usize,
    capabilities: usize,
    seconds: f64,
    published: u64,
    ingested: u64,
    rejected: u64,
    duplicates: u64,
    /// Published over the whole run and ingested after the drain.
    published_total: u64,
    ingested_total: u64,
    registry_cpu_s: f64,
    bench_cpu_s: f64,
    /// Bytes the registry wrote in the window (`wchar`).
    registry_written: u64,
}

/// One connected simulated provider.
struct MqttProvider {
    id: String,
    client: AsyncClient,
    body: Value,
}

/// `--providers` simulated providers publish heartbeats to `registry`'s
/// broker (or `mosquitto`, whose logins are set to theirs) as fast as it
/// ingests them; see the module doc, point 2.
async fn run_heartbeats(
    registry: &RegistryProcess,
    http: &reqwest::Client,
    args: &Args,
    mosquitto: Option<&fleet::Mosquitto>,
) -> Result<HeartbeatResult> {
    let base = registry.base.as_str();
    let mut providers = Vec::with_capacity(args.providers);
    let mut loops = Vec::new();
    let mut logins = Vec::with_capacity(args.providers);
    for p in 0..args.providers {
        let id = format!("bench-hb-provider-{p:03}");
        let token = mint_token(http, base, &registry.admin_token, "provider", &id).await?;
        let caps: Vec<CapabilityRegistration> = (0..args.capabilities_per_provider)
            .map(|c| capability(format!("{id}-cap-{c}"), CapabilityType::SerialPort))
            .collect();
        register_provider(http, base, &token, &id, caps).await?;
        logins.push((id, token));
    }
    if let Some(m) = mosquitto {
        let pairs: Vec<(&str, &str)> = logins
            .iter()
            .map(|(id, token)| (id.as_str(), token.as_str()))
            .collect();
        m.set_logins(&pairs)?;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (id, token) in logins {
        let mut opts = MqttOptions::new(&id, registry.mqtt.ip().to_string(), registry.mqtt.port());
        opts.set_credentials(&id, &token)
            .set_keep_alive(Duration::from_secs(30))
            .set_clean_session(true);
        let (client, mut eventloop) = AsyncClient::new(opts, 64);
        let (connected_tx, connected_rx) = tokio::sync::oneshot::channel();
        loops.push(tokio::spawn(async move {
            let mut connected_tx = Some(connected_tx);
            loop {
                match eventloop.poll().await {
                    Ok(Event::Incoming(Packet::ConnAck(_))) => {
                        if let Some(tx) = connected_tx.take() {
                            let _ = tx.send(());
                        }
                    }
                    Ok(Event::Outgoing(rumqttc::Outgoing::Disconnect)) => break,
                    Ok(_) => {}
                    Err(e) => {
                        eprintln!("MQTT provider connection: {e}");
                        break;
                    }
                }
            }
        }));
        tokio::time::timeout(Duration::from_secs(10), connected_rx)
            .await
            .map_err(|_| anyhow!("provider {id} did not connect to the broker within 10 s"))?
            .map_err(|_| anyhow!("provider {id}: MQTT connection failed"))?;
        let hb = HeartbeatRequest {
            provider_id: id.clone(),
            boot_id: Some("bench-boot".into()),
            capabilities: (0..args.capabilities_per_provider)
                .map(|c| CapabilityHealthReport {
                    capability_id: format!("{id}-cap-{c}"),
                    health_status: HealthStatus::Healthy,
                    message: None,
                    metrics: serde_json::from_value(json!({ "temperature_c": 41.5 })).ok(),
                })
                .collect(),
            running_sessions: Vec::new(),
            faults: Vec::new(),
        };
        providers.push(MqttProvider {
            id,
            client,
            body: serde_json::to_value(&hb)?,
        });
    }

    let baseline = counters(http, base).await?;
    let published = Arc::new(AtomicU64::new(0));
    let ingested = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));

    // Ingestion as the registry counts it, every 50 ms (flow control;
    // `/metrics` also counts leases by status with a table scan, so not more often).
    let monitor = {
        let (http, base) = (http.clone(), base.to_string());
        let (ingested, stop) = (ingested.clone(), stop.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(c) = counters(&http, &base).await {
                    ingested.store(
                        c.heartbeats_in.saturating_sub(baseline.heartbeats_in),
                        Ordering::Relaxed,
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let mut publishers = Vec::new();
    for p in &providers {
        let (client, body) = (p.client.clone(), p.body.clone());
        let topic = topic(
            shared_protocol::mqtt::DEFAULT_TOPIC_PREFIX,
            &p.id,
            TopicKind::Heartbeat,
        );
        let id = p.id.clone();
        let (published, ingested, stop) = (published.clone(), ingested.clone(), stop.clone());
        let window = args.heartbeat_window;
        publishers.push(tokio::spawn(async move {
            let mut seq = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let ahead = published
                    .load(Ordering::Relaxed)
                    .saturating_sub(ingested.load(Ordering::Relaxed));
                if ahead >= window {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                seq += 1;
                let env = Envelope {
                    protocol_version: PROTOCOL_VERSION.to_string(),
                    message_id: format!("{id}-{seq}"),
                    sent_at: Utc::now(),
                    message_type: MessageType::Heartbeat,
                    body: body.clone(),
                };
                if client
                    .publish(topic.as_str(), QoS::AtMostOnce, false, env.to_bytes())
                    .await
                    .is_err()
                {
                    break;
                }
                published.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }

    let pid = registry.pid_str();
    tokio::time::sleep(Duration::from_secs_f64(args.warmup)).await;
    let (c0, p0, r0, b0, w0) = (
        counters(http, base).await?,
        published.load(Ordering::Relaxed),
        cpu_seconds(&pid).unwrap_or(0.0),
        cpu_seconds("self").unwrap_or(0.0),
        written_bytes(&pid).unwrap_or(0),
    );
    tokio::time::sleep(Duration::from_secs_f64(args.seconds)).await;
    let (c1, p1, r1, b1, w1) = (
        counters(http, base).await?,
        published.load(Ordering::Relaxed),
        cpu_seconds(&pid).unwrap_or(0.0),
        cpu_seconds("self").unwrap_or(0.0),
        written_bytes(&pid).unwrap_or(0),
    );
    stop.store(true, Ordering::Relaxed);
    for t in publishers {
        let _ = t.await;
    }
    let _ = monitor.await;
    // Drain: what was published and is still queued gets ingested.
    let published_total = published.load(Ordering::Relaxed);
    let drain_until = Instant::now() + Duration::from_secs(10);
    let mut last = counters(http, base).await?;
    while last.heartbeats_in - baseline.heartbeats_in < published_total
        && Instant::now() < drain_until
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        last = counters(http, base).await?;
    }
    for p in &providers {
        let _ = p.client.disconnect().await;
    }
    for l in loops {
        let _ = tokio::time::timeout(Duration::from_secs(2), l).await;
    }
    Ok(HeartbeatResult {
        providers: args.providers,
        capabilities: args.capabilities_per_provider,
        seconds: args.seconds,
        published: p1 - p0,
        ingested: c1.heartbeats_in - c0.heartbeats_in,
        rejected: c1.rejected - c0.rejected,
        duplicates: c1.duplicates - c0.duplicates,
        published_total,
        ingested_total: last.heartbeats_in - baseline.heartbeats_in,
        registry_cpu_s: r1 - r0,
        bench_cpu_s: b1 - b0,
        registry_written: w1.saturating_sub(w0),
    })
}

/// Print a heartbeat run's figures (header line and table).
fn print_heartbeats(h: &HeartbeatResult, args: &Args) {
    println!(
        "Heartbeats over MQTT (QoS 0, {} capabilities each, at most {} in flight): {} s warm-up, {} s measured",
        h.capabilities, args.heartbeat_window, args.warmup, h.seconds
    );
    println!(
        "{:>9} {:>10} {:>9} {:>11} {:>9} {:>10} {:>13} {:>13} {:>11} {:>6}",
        "providers",
        "published",
        "ingested",
        "ingested/s",
        "rejected",
        "duplicates",
        "reg CPU/msg",
        "cli CPU/msg",
        "reg wr/msg",
        "load"
    );
    let per = |cpu: f64| {
        if h.ingested == 0 {
            0.0
        } else {
            cpu / h.ingested as f64 * 1e6
        }
    };
    println!(
        "{:>9} {:>10} {:>9} {:>11.0} {:>9} {:>10} {:>10.0} us {:>10.0} us {:>8.1} KB {:>6}",
        h.providers,
        h.published,
        h.ingested,
        h.ingested as f64 / h.seconds,
        h.rejected,
        h.duplicates,
        per(h.registry_cpu_s),
        per(h.bench_cpu_s),
        per(h.registry_written as f64) / 1e6 / 1024.0,
        load_average(),
    );
    println!(
        "  whole run: {} published, {} ingested after the drain ({} lost)",
        h.published_total,
        h.ingested_total,
        h.published_total.saturating_sub(h.ingested_total)
    );
}

// ---------------------------------------------------------------- main

fn registry_binary(args: &Args) -> Result<PathBuf> {
    if let Some(p) = &args.registry_bin {
        return Ok(p.clone());
    }
    let me = std::env::current_exe().context("this executable's path")?;
    let bin = me
        .parent()
        .map(|d| d.join("cloud-registry"))
        .context("this executable's directory")?;
    if !bin.is_file() {
        bail!(
            "{} not found; build it with `cargo build --release -p cloud-registry --bins` or pass --registry-bin",
            bin.display()
        );
    }
    Ok(bin)
}

fn print_lease_table(results: &[RunResult]) {
    println!(
        "{:<28} {:>7} {:>8} {:>9} {:>7} {:>7} {:>7} {:>6}",
        "scenario", "clients", "cycles", "cycles/s", "p50 ms", "p99 ms", "max ms", "errors"
    );
    for r in results {
        println!(
            "{:<28} {:>7} {:>8} {:>9.0} {:>7.2} {:>7.2} {:>7.1} {:>6}",
            r.label,
            r.clients,
            r.cycles,
            r.rate(),
            r.ms(50.0),
            r.ms(99.0),
            r.max_ms(),
            r.errors,
        );
        if let Some(e) = &r.first_error {
            println!("    first error: {e}");
        }
    }
    println!();
    println!(
        "Where a cycle's time goes: acquire and release medians, p99 of acquire + release from the \
         cycle's actual start (svc), and per cycle: CPU (/proc/PID/stat), events appended, bytes \
         written (/proc/PID/io wchar: WAL, checkpoints, sockets):"
    );
    println!(
        "{:<28} {:>7} {:>10} {:>10} {:>10} {:>11} {:>11} {:>7} {:>10} {:>6}",
        "scenario",
        "clients",
        "acq p50 ms",
        "rel p50 ms",
        "svc p99 ms",
        "reg CPU us",
        "cli CPU us",
        "events",
        "reg wr KB",
        "load"
    );
    for r in results {
        println!(
            "{:<28} {:>7} {:>10.2} {:>10.2} {:>10.2} {:>11.0} {:>11.0} {:>7.1} {:>10.1} {:>6}",
            r.label,
            r.clients,
            percentile(&r.acquire_us, 50.0),
            percentile(&r.release_us, 50.0),
            percentile(&r.service_us, 99.0),
            r.per_cycle(r.registry_cpu_s) * 1e6,
            r.per_cycle(r.bench_cpu_s) * 1e6,
            r.per_cycle(r.events as f64),
            r.per_cycle(r.registry_written as f64) / 1024.0,
            r.load,
        );
    }
}

/// The targets: at least 2,000 cycles/s with 200 clients, and p99 under
/// 10 ms. A closed loop of N clients has mean latency N / throughput, so
/// the latency target is judged on the paced runs (a fixed offered rate).
fn print_targets(results: &[RunResult]) {
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    for r in results.iter().filter(|r| r.clients >= 200) {
        match r.offered {
            None if r.label.starts_with("own") => println!(
                "  target >= 2,000 cycles/s with {} clients (closed loop): {:.0} cycles/s, {}",
                r.clients,
                r.rate(),
                verdict(r.rate() >= 2000.0)
            ),
            None => {}
            Some(offered) => {
                let kept_up = r.rate() >= 0.99 * offered;
                println!(
                    "  {} from {} clients: {:.0} cycles/s ({}), p99 {:.2} ms: p99 < 10 ms {}{}",
                    r.label,
                    r.clients,
                    r.rate(),
                    if kept_up { "kept up" } else { "fell behind" },
                    r.ms(99.0),
                    verdict(r.ms(99.0) < 10.0),
                    if offered >= 2000.0 {
                        format!(
                            ", >= 2,000 cycles/s {}",
                            verdict(kept_up && r.rate() >= 1980.0)
                        )
                    } else {
                        String::new()
                    }
                );
            }
        }
    }
    println!(
        "  (a closed loop of N clients has mean latency N / throughput: 200 clients with p99 < 10 ms \
         would need > 20,000 cycles/s, so the latency target is judged on the paced runs)"
    );
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let _ = STORE_URL.set(args.store_url.clone());
    if cfg!(debug_assertions) {
        eprintln!("warning: a debug build; run `cargo build --release -p cloud-registry --bins` for real figures");
    }
    let bin = registry_binary(&args)?;
    let (dir, remove) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("registry-bench-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    if !args.fleet.is_empty() {
        let outcome = fleet::run(&bin, &dir, &args).await;
        if outcome.is_ok() && remove {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return outcome;
    }
    if args.stores {
        let outcome = stores::run(&bin, &dir, &args).await;
        if outcome.is_ok() && remove {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return outcome;
    }
    if args.policy_compare {
        let outcome = policy_compare(&bin, &dir, &args).await;
        if outcome.is_ok() && remove {
            let _ = std::fs::remove_dir_all(&dir);
        }
        return outcome;
    }
    let registry = RegistryProcess::start(&bin, &dir, "")?;
    let outcome = bench(&registry, &args).await;
    let log = registry.log_path.clone();
    let stopped = registry.stop();
    if outcome.is_err() || stopped.is_err() {
        eprintln!("registry log kept: {}", log.display());
    } else if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    outcome?;
    stopped
}

/// Register the lease provider (one relay per client, plus the contended
/// one), keep it online, and mint an `audit_agent` token per client.
/// With `replicas` (every replica's URL), the clients take turns among
/// them.
async fn lease_lab(
    registry: &RegistryProcess,
    http: &reqwest::Client,
    max_clients: usize,
    args: &Args,
    replicas: &[String],
) -> Result<(LeaseSetup, tokio::task::JoinHandle<()>)> {
    let http = http.clone();
    let base = registry.base.clone();
    // Lease provider: one capability per client, plus the contended one.
    let provider_token = mint_token(
        &http,
        &base,
        &registry.admin_token,
        "provider",
        LEASE_PROVIDER,
    )
    .await?;
    let mut caps: Vec<CapabilityRegistration> = (0..max_clients)
        .map(|i| capability(format!("bench-cap-{i:04}"), CapabilityType::Relay))
        .collect();
    caps.push(capability(CONTENDED.into(), CapabilityType::Relay));
    register_provider(&http, &base, &provider_token, LEASE_PROVIDER, caps).await?;
    let bases = if replicas.is_empty() {
        vec![base.clone()]
    } else {
        replicas.to_vec()
    };
    let keepalive = keep_lease_provider_online(http.clone(), bases.clone(), provider_token);
    let mut agents = Vec::with_capacity(max_clients);
    for i in 0..max_clients {
        let principal = format!("audit:bench-client-{i:04}");
        let token = mint_token(
            &http,
            &base,
            &registry.admin_token,
            "audit_agent",
            &principal,
        )
        .await?;
        agents.push((principal, token));
    }
    let setup = LeaseSetup {
        base: base.clone(),
        client_bases: if bases.len() > 1 { bases } else { Vec::new() },
        agents,
        own_capabilities: (0..max_clients)
            .map(|i| format!("bench-cap-{i:04}"))
            .collect(),
        shared: if args.shared_client {
            Some(http_client()?)
        } else {
            None
        },
    };
    Ok((setup, keepalive))
}

/// The closed-loop runs of each of `scenarios` at every `--clients`
/// count, then the paced `own` runs at every `--paced-rates` rate.
async fn lease_runs(
    setup: &LeaseSetup,
    pids: &[String],
    args: &Args,
    scenarios: &[Scenario],
) -> Result<Vec<RunResult>> {
    let mut results = Vec::new();
    let runs = scenarios
        .iter()
        .flat_map(|&s| args.clients.iter().map(move |&c| (s, c, None)))
        .chain(
            args.paced_rates
                .iter()
                .filter(|r| **r > 0.0)
                .map(|&rate| (Scenario::Own, args.paced_clients, Some(rate))),
        )
        .collect::<Vec<_>>();
    for (scenario, clients, rate) in runs {
        let r = run_leases(setup, pids, args, scenario, clients, rate).await?;
        eprintln!(
            "  done: {} x{}: {:.0} cycles/s",
            r.label,
            r.clients,
            r.rate()
        );
        results.push(r);
    }
    Ok(results)
}

/// `--policy-compare`: see [`Args::policy_compare`].
async fn policy_compare(bin: &Path, dir: &Path, args: &Args) -> Result<()> {
    let max_clients = args.clients.iter().copied().max().unwrap_or(1).max(1);
    let http = http_client()?;
    let mut labs = Vec::new();
    for (mode, extra) in [("off", ""), ("on", POLICY_ON)] {
        let d = dir.join(format!("policy-{mode}"));
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
        let registry = RegistryProcess::start(bin, &d, extra)?;
        let (setup, keepalive) = lease_lab(&registry, &http, max_clients, args, &[]).await?;
        labs.push((mode, registry, setup, keepalive));
    }
    println!(
        "Lab policy on versus off: request (?wait_seconds=60) + release per cycle, `own` capabilities, \
         {} s warm-up, {} s measured per run, {} rounds of off then on",
        args.warmup, args.seconds, args.policy_rounds
    );
    println!("machine:  {}", machine());
    println!(
        "{:<6} {:>7} {:>9} {:>9} {:>7} {:>7} {:>15} {:>6}",
        "policy", "clients", "cycles", "cycles/s", "p50 ms", "p99 ms", "reg CPU/cycle", "errors"
    );
    for &clients in &args.clients {
        // (cycles, registry CPU seconds) per mode, over every round.
        let mut totals = [(0usize, 0.0f64), (0, 0.0)];
        for _ in 0..args.policy_rounds.max(1) {
            for (i, (mode, registry, setup, _)) in labs.iter().enumerate() {
                let r = run_leases(
                    setup,
                    &[registry.pid_str()],
                    args,
                    Scenario::Own,
                    clients,
                    None,
                )
                .await?;
                println!(
                    "{:<6} {:>7} {:>9} {:>9.0} {:>7.2} {:>7.2} {:>12.1} us {:>6}",
                    mode,
                    clients,
                    r.cycles,
                    r.rate(),
                    r.ms(50.0),
                    r.ms(99.0),
                    r.per_cycle(r.registry_cpu_s) * 1e6,
                    r.errors
                );
                if let Some(e) = &r.first_error {
                    println!("       first error: {e}");
                }
                totals[i].0 += r.cycles;
                totals[i].1 += r.registry_cpu_s;
            }
        }
        let per = |(cycles, cpu): (usize, f64)| {
            if cycles == 0 {
                0.0
            } else {
                cpu / cycles as f64 * 1e6
            }
        };
        let (off, on) = (per(totals[0]), per(totals[1]));
        println!(
            "{clients} clients, all rounds: registry CPU per cycle {off:.1} us off, {on:.1} us on: \
             {:+.1} % (target: under +5 %)",
            if off > 0.0 { (on / off - 1.0) * 100.0 } else { 0.0 }
        );
    }
    for (_, registry, _, keepalive) in labs {
        keepalive.abort();
        registry.stop()?;
    }
    Ok(())
}

async fn bench(registry: &RegistryProcess, args: &Args) -> Result<()> {
    let started = Utc::now();
    let pid = registry.pid;
    let idle_cpu_from = cpu_seconds(&registry.pid_str()).unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let idle_cpu = (cpu_seconds(&registry.pid_str()).unwrap_or(0.0) - idle_cpu_from)
        / args.idle_seconds.max(1) as f64;
    let rss_start = rss_mb(pid).context("registry RSS")?;

    let http = http_client()?;
    let max_clients = args
        .clients
        .iter()
        .copied()
        .chain([if args.paced_rates.is_empty() {
            1
        } else {
            args.paced_clients
        }])
        .max()
        .unwrap_or(1)
        .max(1);

    let (setup, keepalive) = lease_lab(registry, &http, max_clients, args, &[]).await?;

    println!(
        "Benchlink registry benchmark, {}",
        started.format("%Y-%m-%d %H:%M UTC")
    );
    println!(
        "machine:  {} (1-min load average at start: {})",
        machine(),
        load_average()
    );
    println!(
        "registry: {} serve (pid {pid}), HTTP {}, embedded MQTT broker {}",
        registry_binary(args)?.display(),
        registry.base,
        registry.mqtt
    );
    match &registry.pg_schema {
        Some((url, schema)) => println!(
            "store:    PostgreSQL {} schema {schema} (synchronous_commit as the server has it)",
            cloud_registry::db::redact_url(url)
        ),
        None => println!(
            "store:    SQLite journal_mode={} (read from the file), synchronous=NORMAL: an answered \
             operation survives SIGKILL of the registry; a power loss may lose the last commits",
            journal_mode(&registry.db_path).unwrap_or_else(|e| format!("? ({e})"))
        ),
    }
    println!(
        "client:   this process, tokio {} workers + reqwest (HTTP/1.1 keep-alive, TCP_NODELAY), {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        if args.shared_client {
            "one Client (one connection pool) shared by all simulated clients"
        } else {
            "one Client (own connection) per simulated client"
        }
    );
    println!();
    println!(
        "Leases over HTTP: request (?wait_seconds=60) + release per cycle; {} s warm-up, {} s measured per run",
        args.warmup, args.seconds
    );

    let results = lease_runs(
        &setup,
        &[registry.pid_str()],
        args,
        &[Scenario::Own, Scenario::One],
    )
    .await?;
    keepalive.abort();
    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let rss_leases = rss_mb(pid).context("registry RSS")?;
    print_lease_table(&results);
    println!("  reference: {LABGRID}");
    print_targets(&results);

    if args.providers > 0 {
        println!();
        let h = run_heartbeats(registry, &http, args, None).await?;
        print_heartbeats(&h, args);
    }

    tokio::time::sleep(Duration::from_secs(args.idle_seconds)).await;
    let rss_after = rss_mb(pid).context("registry RSS")?;
    println!();
    println!(
        "Registry RSS (VmRSS, idle {} s before each reading): {:.1} MB after start, {:.1} MB after \
         the lease runs, {:.1} MB after the heartbeat run; peak (VmHWM) {:.1} MB. \
         labgrid 26 coordinator: 54 MB",
        args.idle_seconds, rss_start.0, rss_leases.0, rss_after.0, rss_after.1
    );
    println!(
        "Registry idle CPU after start: {:.1} % of one core (sweepers, watchdogs, MQTT keep-alive)",
        idle_cpu * 100.0
    );
    Ok(())
}
