//! `--stores`: the same lease runs and heartbeat ingest on three setups,
//! then takeover after SIGKILL of the leader (docs/scale.md "Measured",
//! docs/benchmarks.md).
//!
//! 1. **SQLite**: one registry, its store a file.
//! 2. **PostgreSQL, one registry**: the store a new schema at `--store-url`.
//! 3. **PostgreSQL, two replicas**: two `[cluster]` registries on one new
//!    schema; the first leads, the second stands by and forwards. Client `i`
//!    talks to replica `i % 2`, so half of every run is forwarded.
//!
//! Each setup has a private Mosquitto (the shipped ACL; replicas need an
//! external broker, and the other two get one too so only the store and
//! the replica count differ). Each runs the closed-loop `own` runs at
//! `--clients` and the paced runs at `--paced-rates` (see main.rs, point 1),
//! then `--providers` heartbeat publishers (point 2).
//!
//! **Takeover** (`--failovers` times, on the two replicas): while
//! `--failover-clients` clients lease and release through both replicas,
//! SIGKILL the leader, and time (a) the standby's ready line and (b) the
//! first lease granted through it, both from the kill; then restart the
//! killed replica, which stands by for the next round. Clients retry
//! connection errors and 503 `leader_unavailable`; any other error is
//! counted as wrong.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{anyhow, bail, Context, Result};
use reqwest::StatusCode;
use serde_json::Value;
use shared_protocol::lease::{HolderType, LeaseRequest};
use tokio::time::Instant;

use super::fleet::Mosquitto;
use super::{
    http_client, lease_lab, lease_runs, load_average, machine, percentile, print_heartbeats,
    run_heartbeats, Args, Launch, RegistryProcess, ReplicaSpec, RunResult, Scenario, StoreChoice,
};

/// The default `--store-url`.
const LOCAL_POSTGRES: &str = "postgres://postgres@127.0.0.1:5432/test";

/// A PostgreSQL schema made for one setup; dropped with this guard, after
/// every registry on it stopped.
struct Schema {
    url: String,
    name: String,
}

impl Schema {
    fn new(url: &str) -> Self {
        Self {
            url: url.to_string(),
            name: super::new_schema_name(),
        }
    }

    fn store(&self) -> StoreChoice {
        StoreChoice::Postgres {
            url: self.url.clone(),
            schema: self.name.clone(),
        }
    }
}

impl Drop for Schema {
    fn drop(&mut self) {
        super::drop_schema(&self.url, &self.name);
    }
}

/// A free loopback TCP port (bound, then let go).
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// One setup's registries, leader first.
struct Setup {
    label: &'static str,
    registries: Vec<RegistryProcess>,
    /// Each registry's directory and `[cluster]` settings (replicas).
    replicas: Vec<(std::path::PathBuf, ReplicaSpec)>,
    mosquitto: Mosquitto,
    schema: Option<Schema>,
}

impl Setup {
    fn pids(&self) -> Vec<String> {
        self.registries
            .iter()
            .map(RegistryProcess::pid_str)
            .collect()
    }

    fn stop(self) -> Result<()> {
        let Setup {
            registries,
            mosquitto,
            schema,
            ..
        } = self;
        // Standbys first: a leader stopping first would hand over.
        for r in registries.into_iter().rev() {
            r.stop()?;
        }
        drop(mosquitto);
        drop(schema);
        Ok(())
    }
}

/// Start a replica in `dir` on `store`, with the setup's admin token file
/// and event-log signing key (`token_file`'s directory) shared.
fn start_replica(
    bin: &Path,
    dir: &Path,
    mosquitto: &Mosquitto,
    store: StoreChoice,
    replica: &ReplicaSpec,
    token_file: &Path,
    log_name: &str,
) -> Result<RegistryProcess> {
    let key = token_file.with_file_name("signing-key");
    let shared_key = format!(
        "[audit_log]\nsigning_key_file = {}\n",
        toml::Value::from(key.display().to_string())
    );
    RegistryProcess::launch(
        bin,
        dir,
        &Launch {
            mqtt_config: &mosquitto.registry_config(),
            extra_config: &shared_key,
            store,
            replica: Some(replica.clone()),
            token_file: Some(token_file.to_path_buf()),
            log_name,
        },
    )
}

/// Start setup `which` (0 SQLite, 1 PostgreSQL, 2 two replicas) in `dir`.
fn start_setup(bin: &Path, dir: &Path, url: &str, which: usize, args: &Args) -> Result<Setup> {
    std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
    let mosquitto = Mosquitto::start(&args.mosquitto_bin, dir)?;
    let single = |store: StoreChoice| {
        RegistryProcess::launch(
            bin,
            dir,
            &Launch {
                mqtt_config: &mosquitto.registry_config(),
                extra_config: "",
                store,
                replica: None,
                token_file: None,
                log_name: "registry.log",
            },
        )
    };
    match which {
        0 => Ok(Setup {
            label: "SQLite",
            registries: vec![single(StoreChoice::Sqlite)?],
            replicas: Vec::new(),
            mosquitto,
            schema: None,
        }),
        1 => {
            let schema = Schema::new(url);
            let registry = single(schema.store())?;
            Ok(Setup {
                label: "PostgreSQL, 1 registry",
                registries: vec![registry],
                replicas: Vec::new(),
                mosquitto,
                schema: Some(schema),
            })
        }
        _ => {
            let schema = Schema::new(url);
            let token_file = dir.join("admin.token");
            let mut registries = Vec::new();
            let mut replicas = Vec::new();
            for id in ["a", "b"] {
                let d = dir.join(format!("replica-{id}"));
                std::fs::create_dir_all(&d)?;
                let spec = ReplicaSpec {
                    id: id.to_string(),
                    http_port: free_port()?,
                    takeover_poll_ms: args.takeover_poll_ms,
                };
                let r = start_replica(
                    bin,
                    &d,
                    &mosquitto,
                    schema.store(),
                    &spec,
                    &token_file,
                    "registry.log",
                )?;
                if r.leading != (id == "a") {
                    bail!(
                        "replica {id} {}; see {}",
                        if r.leading {
                            "leads, though a leads"
                        } else {
                            "stands by, though none leads"
                        },
                        r.log_path.display()
                    );
                }
                registries.push(r);
                replicas.push((d, spec));
            }
            Ok(Setup {
                label: "PostgreSQL, 2 replicas",
                registries,
                replicas,
                mosquitto,
                schema: Some(schema),
            })
        }
    }
}

/// `--stores`: see the module doc.
pub async fn run(bin: &Path, dir: &Path, args: &Args) -> Result<()> {
    let url = args
        .store_url
        .as_deref()
        .unwrap_or(LOCAL_POSTGRES)
        .to_string();
    let max_clients = args
        .clients
        .iter()
        .copied()
        .chain([args.paced_clients, args.failover_clients + 1])
        .max()
        .unwrap_or(1)
        .max(2);
    println!(
        "Benchlink registry on SQLite, PostgreSQL and two PostgreSQL replicas, {}",
        chrono::Utc::now().format("%Y-%m-%d %H:%M UTC")
    );
    println!(
        "machine:  {} (1-min load average at start: {})",
        machine(),
        load_average()
    );
    println!(
        "store:    PostgreSQL {} (a new schema per setup, synchronous_commit as the server has it); \
         SQLite WAL, synchronous=NORMAL",
        cloud_registry::db::redact_url(&url)
    );
    println!(
        "broker:   a private Mosquitto per setup; lease cycles: request (?wait_seconds=60) + release, \
         `own` capabilities, {} s warm-up, {} s measured per run",
        args.warmup, args.seconds
    );
    println!();

    let http = http_client()?;
    let mut leases: Vec<(&'static str, RunResult)> = Vec::new();
    let mut heartbeats = Vec::new();
    let mut takeovers = None;
    for which in 0..3 {
        let d = dir.join(format!("setup-{which}"));
        let mut setup = start_setup(bin, &d, &url, which, args)?;
        eprintln!("stores: {}", setup.label);
        let bases: Vec<String> = setup.registries.iter().map(|r| r.base.clone()).collect();
        let outcome = async {
            let (lease_setup, keepalive) =
                lease_lab(&setup.registries[0], &http, max_clients, args, &bases).await?;
            let pids = setup.pids();
            for r in lease_runs(&lease_setup, &pids, args, &[Scenario::Own]).await? {
                leases.push((setup.label, r));
            }
            if args.providers > 0 {
                let h = run_heartbeats(&setup.registries[0], &http, args, Some(&setup.mosquitto))
                    .await?;
                heartbeats.push((setup.label, h));
            }
            if which == 2 && args.failovers > 0 {
                takeovers = Some(failovers(bin, &mut setup, &lease_setup, args).await?);
            }
            keepalive.abort();
            anyhow::Ok(())
        }
        .await;
        if let Err(e) = outcome {
            for r in &setup.registries {
                eprintln!("registry log kept: {}", r.log_path.display());
            }
            return Err(e);
        }
        setup.stop()?;
    }

    println!(
        "{:<24} {:<23} {:>7} {:>8} {:>9} {:>7} {:>8} {:>8} {:>10} {:>9} {:>10} {:>6}",
        "setup",
        "run",
        "clients",
        "cycles",
        "cycles/s",
        "p50 ms",
        "p99 ms",
        "max ms",
        "reg CPU us",
        "pg CPU us",
        "cli CPU us",
        "errors"
    );
    for (label, r) in &leases {
        println!(
            "{:<24} {:<23} {:>7} {:>8} {:>9.0} {:>7.2} {:>8.2} {:>8.1} {:>10.0} {:>9.0} {:>10.0} {:>6}",
            label,
            r.label,
            r.clients,
            r.cycles,
            r.rate(),
            r.ms(50.0),
            r.ms(99.0),
            r.max_ms(),
            r.per_cycle(r.registry_cpu_s) * 1e6,
            r.per_cycle(r.postgres_cpu_s) * 1e6,
            r.per_cycle(r.bench_cpu_s) * 1e6,
            r.errors
        );
        if let Some(e) = &r.first_error {
            println!("    first error: {e}");
        }
    }
    println!(
        "  (CPU per cycle, us: reg = every registry process, the standby's forwarding included; \
         pg = the PostgreSQL server's processes; cli = this process. The machine's cores give \
         {} us per second)",
        std::thread::available_parallelism().map_or(0, |n| n.get()) * 1_000_000
    );
    for (label, h) in &heartbeats {
        println!();
        println!("{label}:");
        print_heartbeats(h, args);
    }
    if let Some(t) = &takeovers {
        println!();
        print_takeovers(t, args);
    }
    println!();
    println!("Targets:");
    let verdict = |ok: bool| if ok { "met" } else { "MISSED" };
    for (label, r) in leases
        .iter()
        .filter(|(l, r)| l.starts_with("PostgreSQL") && r.clients >= 200)
    {
        match r.offered {
            None => println!(
                "  {label}: >= 1,000 cycles/s with {} clients (closed loop): {:.0} cycles/s, {}",
                r.clients,
                r.rate(),
                verdict(r.rate() >= 1000.0)
            ),
            Some(offered) => {
                let kept_up = r.rate() >= 0.99 * offered;
                println!(
                    "  {label}: {} from {} clients: {:.0} cycles/s ({}), p99 {:.2} ms: p99 < 50 ms {}",
                    r.label,
                    r.clients,
                    r.rate(),
                    if kept_up { "kept up" } else { "fell behind" },
                    r.ms(99.0),
                    verdict(kept_up && r.ms(99.0) < 50.0),
                );
            }
        }
    }
    if let Some(t) = &takeovers {
        let p99 = percentile(&t.grant_us(), 99.0);
        println!(
            "  takeover p99 < 5 s (first grant after SIGKILL, {} failovers): {:.0} ms, {}",
            t.rounds.len(),
            p99,
            verdict(!t.rounds.is_empty() && p99 < 5000.0)
        );
    }
    println!(
        "  (a closed loop of N clients has mean latency N / throughput, so p99 is judged on the \
         paced runs)"
    );
    Ok(())
}

/// One failover: who was killed, who took over, and how long it took.
struct Round {
    killed: String,
    leader: String,
    epoch: i64,
    /// SIGKILL to the standby's ready line.
    ready: Duration,
    /// SIGKILL to the first lease granted through the standby.
    grant: Duration,
}

/// Every failover and what the clients saw meanwhile.
struct Takeovers {
    rounds: Vec<Round>,
    clients: usize,
    cycles: u64,
    retried: u64,
    wrong: u64,
    first_wrong: Option<String>,
    seconds: f64,
}

impl Takeovers {
    fn grant_us(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.rounds.iter().map(|r| super::us(r.grant)).collect();
        v.sort_unstable();
        v
    }

    fn ready_us(&self) -> Vec<u64> {
        let mut v: Vec<u64> = self.rounds.iter().map(|r| super::us(r.ready)).collect();
        v.sort_unstable();
        v
    }
}

fn print_takeovers(t: &Takeovers, args: &Args) {
    println!(
        "Takeover: SIGKILL of the leader {} times while {} clients lease and release through both \
         replicas (takeover_poll_ms = {})",
        t.rounds.len(),
        t.clients,
        args.takeover_poll_ms
    );
    println!(
        "{:>3} {:>7} {:>10} {:>6} {:>9} {:>15}",
        "#", "killed", "new leader", "epoch", "ready ms", "first grant ms"
    );
    for (i, r) in t.rounds.iter().enumerate() {
        println!(
            "{:>3} {:>7} {:>10} {:>6} {:>9.0} {:>15.0}",
            i + 1,
            r.killed,
            r.leader,
            r.epoch,
            r.ready.as_secs_f64() * 1e3,
            r.grant.as_secs_f64() * 1e3
        );
    }
    let (ready, grant) = (t.ready_us(), t.grant_us());
    println!(
        "  ready line after SIGKILL: p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; first grant: p50 {:.0} \
         ms, p99 {:.0} ms, max {:.0} ms (p99 of {} is the largest but one or the largest)",
        percentile(&ready, 50.0),
        percentile(&ready, 99.0),
        percentile(&ready, 100.0),
        percentile(&grant, 50.0),
        percentile(&grant, 99.0),
        percentile(&grant, 100.0),
        t.rounds.len()
    );
    println!(
        "  clients over {:.0} s: {} cycles, {} calls retried (connection refused or 503 \
         leader_unavailable), {} wrong answers{}",
        t.seconds,
        t.cycles,
        t.retried,
        t.wrong,
        t.first_wrong
            .as_ref()
            .map(|e| format!(" (first: {e})"))
            .unwrap_or_default()
    );
}

/// What one call's failure means to a client that retries.
enum Failure {
    /// Connection refused or cut, or 503: try again.
    Retry,
    /// Anything else: a wrong answer.
    Wrong(String),
}

/// What the failover clients count.
#[derive(Default)]
struct Tally {
    cycles: AtomicU64,
    retried: AtomicU64,
    wrong: AtomicU64,
    first_wrong: Mutex<Option<String>>,
}

impl Tally {
    fn wrong(&self, e: String) {
        self.wrong.fetch_add(1, Ordering::Relaxed);
        let mut first = self.first_wrong.lock().unwrap_or_else(|p| p.into_inner());
        first.get_or_insert(e);
    }
}

/// A client of the failover rounds: short leases (10 s), so a grant whose
/// answer died with the leader ends by itself.
struct FailoverClient {
    http: reqwest::Client,
    base: String,
    token: String,
    body: bytes::Bytes,
}

impl FailoverClient {
    fn new(base: &str, token: &str, principal: &str, capability_id: &str) -> Result<Self> {
        let req = LeaseRequest {
            capability_id: Some(capability_id.to_string()),
            capability_selector: None,
            holder_type: HolderType::AuditAgent,
            holder_ref: principal.to_string(),
            project_id: "bench".into(),
            purpose: "registry takeover benchmark".into(),
            priority: 50,
            requested_duration_seconds: 10,
            evidence_required: false,
            preempt_if_needed: false,
            preempt_reason: None,
            mode: None,
            queue_timeout_seconds: None,
        };
        Ok(Self {
            http: reqwest::Client::builder()
                .tcp_nodelay(true)
                .timeout(Duration::from_secs(30))
                .connect_timeout(Duration::from_secs(2))
                .build()?,
            base: base.to_string(),
            token: token.to_string(),
            body: bytes::Bytes::from(serde_json::to_vec(&req)?),
        })
    }

    async fn post(&self, path: &str, body: Option<bytes::Bytes>) -> Result<Value, Failure> {
        let mut req = self
            .http
            .post(format!("{}{path}", self.base))
            .bearer_auth(&self.token);
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(b);
        }
        let resp = req.send().await.map_err(|_| Failure::Retry)?;
        let status = resp.status();
        let text = resp.text().await.map_err(|_| Failure::Retry)?;
        if status == StatusCode::SERVICE_UNAVAILABLE {
            return Err(Failure::Retry);
        }
        if !status.is_success() {
            return Err(Failure::Wrong(format!("POST {path}: {status}: {text}")));
        }
        serde_json::from_str(&text).map_err(|e| Failure::Wrong(format!("POST {path}: {e}: {text}")))
    }

    /// Request until granted (`Ok(lease_id)`), each failure told to `tally`.
    async fn acquire(&self, tally: &Tally, stop: &AtomicBool) -> Option<String> {
        while !stop.load(Ordering::Relaxed) {
            match self
                .post(
                    "/api/v1/capability-leases/request?wait_seconds=30",
                    Some(self.body.clone()),
                )
                .await
            {
                Ok(v) if v["status"] == "granted" => {
                    return v["lease_id"].as_str().map(str::to_string)
                }
                Ok(v) => tally.wrong(format!("not granted within 30 s: {v}")),
                Err(Failure::Retry) => {
                    tally.retried.fetch_add(1, Ordering::Relaxed);
                }
                Err(Failure::Wrong(e)) => tally.wrong(e),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        None
    }

    /// Release until acknowledged (at most 30 s).
    async fn release(&self, lease_id: &str, tally: &Tally) {
        let until = Instant::now() + Duration::from_secs(30);
        while Instant::now() < until {
            match self
                .post(
                    &format!("/api/v1/capability-leases/{lease_id}/release"),
                    None,
                )
                .await
            {
                Ok(_) => return,
                Err(Failure::Retry) => {
                    tally.retried.fetch_add(1, Ordering::Relaxed);
                }
                Err(Failure::Wrong(e)) => {
                    tally.wrong(e);
                    return;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        tally.wrong(format!(
            "release of {lease_id} not acknowledged within 30 s"
        ));
    }
}

/// The failover rounds on a two-replica `setup` (leader first).
async fn failovers(
    bin: &Path,
    setup: &mut Setup,
    lease_setup: &super::LeaseSetup,
    args: &Args,
) -> Result<Takeovers> {
    let bases: Vec<String> = setup.registries.iter().map(|r| r.base.clone()).collect();
    let tally = Arc::new(Tally::default());
    let stop = Arc::new(AtomicBool::new(false));
    let clients = args.failover_clients.min(lease_setup.agents.len() - 1);
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (principal, token) = &lease_setup.agents[i];
        let client = FailoverClient::new(
            &bases[i % 2],
            token,
            principal,
            &lease_setup.own_capabilities[i],
        )?;
        let (tally, stop) = (tally.clone(), stop.clone());
        tasks.push(tokio::spawn(async move {
            while let Some(id) = client.acquire(&tally, &stop).await {
                client.release(&id, &tally).await;
                tally.cycles.fetch_add(1, Ordering::Relaxed);
            }
        }));
    }
    // The probe: its own principal and capability, on the standby.
    let probe_index = lease_setup.agents.len() - 1;
    let (probe_principal, probe_token) = &lease_setup.agents[probe_index];
    let probe_capability = &lease_setup.own_capabilities[probe_index];

    let started = Instant::now();
    let token_file = setup.replicas[0].0.parent().map(|d| d.join("admin.token"));
    let token_file = token_file.context("setup directory")?;
    let schema = setup.schema.as_ref().context("replicas have a schema")?;
    let store = || schema.store();
    let mut rounds = Vec::new();
    // registries[leader] leads; the other stands by.
    let mut leader = 0usize;
    for round in 0..args.failovers {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let standby = 1 - leader;
        let probe = FailoverClient::new(
            &setup.registries[standby].base,
            probe_token,
            probe_principal,
            probe_capability,
        )?;
        let killed_at = std::time::Instant::now();
        let t0 = Instant::now();
        setup.registries[leader].kill()?;
        // First grant through the standby after the kill.
        let probe_tally = Tally::default();
        let never = AtomicBool::new(false);
        let granted = tokio::time::timeout(Duration::from_secs(60), async {
            loop {
                let id = probe.acquire(&probe_tally, &never).await;
                if let Some(id) = id {
                    let at = t0.elapsed();
                    probe.release(&id, &probe_tally).await;
                    return at;
                }
            }
        })
        .await
        .map_err(|_| {
            anyhow!(
                "failover {}: no grant through the standby within 60 s",
                round + 1
            )
        })?;
        if let Some(e) = probe_tally
            .first_wrong
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
        {
            tally.wrong(format!("probe: {e}"));
        }
        // The standby's ready line (it arrived before or after the grant).
        let survivor = &setup.registries[standby];
        let ready_line = loop {
            let (at, line) = survivor
                .next_line(Duration::from_secs(30))
                .ok_or_else(|| anyhow!("failover {}: no ready line from the standby", round + 1))?;
            if line.contains("\"event\":\"ready\"") {
                break (at, line);
            }
        };
        let ready: Value = serde_json::from_str(&ready_line.1)?;
        let (killed_dir, killed_spec) = setup.replicas[leader].clone();
        rounds.push(Round {
            killed: killed_spec.id.clone(),
            leader: ready["replica"].as_str().unwrap_or("?").to_string(),
            epoch: ready["epoch"].as_i64().unwrap_or(0),
            ready: ready_line.0.saturating_duration_since(killed_at),
            grant: granted,
        });
        eprintln!(
            "  failover {}: {} killed, {} ready after {} ms, first grant after {} ms",
            round + 1,
            killed_spec.id,
            rounds[round].leader,
            rounds[round].ready.as_millis(),
            granted.as_millis()
        );
        // The killed replica comes back and stands by.
        let again = start_replica(
            bin,
            &killed_dir,
            &setup.mosquitto,
            store(),
            &killed_spec,
            &token_file,
            &format!("registry-{}.log", round + 1),
        )?;
        if again.leading {
            bail!(
                "failover {}: the restarted replica {} leads, though {} does",
                round + 1,
                killed_spec.id,
                rounds[round].leader
            );
        }
        setup.registries[leader] = again;
        leader = standby;
    }
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(40), t).await;
    }
    // The leader stays first, so `Setup::stop` stops the standby first.
    if leader == 1 {
        setup.registries.swap(0, 1);
        setup.replicas.swap(0, 1);
    }
    let first_wrong = tally
        .first_wrong
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .clone();
    Ok(Takeovers {
        rounds,
        clients,
        cycles: tally.cycles.load(Ordering::Relaxed),
        retried: tally.retried.load(Ordering::Relaxed),
        wrong: tally.wrong.load(Ordering::Relaxed),
        first_wrong,
        seconds: started.elapsed().as_secs_f64(),
    })
}
