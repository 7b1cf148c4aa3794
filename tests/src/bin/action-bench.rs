//! `action-bench`: how long an action takes end to end, next to what the
//! MQTT broker alone costs, in the same run on the same broker.
//!
//! ```text
//! cargo build --release --workspace --bins
//! cargo run --release -p benchlink-e2e --bin action-bench [-- --requests 500]
//! target/release/action-bench --baseline-bins DIR [--rounds 2]
//! ```
//!
//! - *action round trip*: `POST /api/v1/capability-leases/{id}/actions`
//!   (`set_volume` on a simulated speaker, `wait_ms` set) → registry →
//!   `action_invoke` over MQTT → edge runner → simulated driver →
//!   `session_update` over MQTT → registry → HTTP answer with the completed
//!   session. Each concurrent caller holds its own lease on its own speaker
//!   (one runner thread each), so callers do not queue behind each other at
//!   the bench.
//! - *bare MQTT round trip*: a QoS 1 publish to a topic that a second
//!   client echoes back (QoS 1) to the first: the two MQTT hops an action
//!   also makes, with nothing else.
//!
//! Both at 1 and at 20 concurrent callers; p50 and p99 in milliseconds. The
//! target is an action p50 within 5× the bare MQTT p50.
//!
//! A second table gives the CPU time (user + system, from `/proc`) each
//! process spent per request at each level, and the requests per second
//! the machine's cores could serve at that cost (on the embedded broker
//! the registry's figure includes the broker's). With many callers in
//! flight a round trip is bound by that ceiling: p50 ≥ callers / ceiling.
//!
//! `--baseline-bins DIR` compares two builds in one run: the whole
//! measurement (a fresh lab each time) with the `cloud-registry` and
//! `edge-agent` in DIR, then with the current ones, alternated for
//! `--rounds` (default 2). It ends with both side by side: action p50/p99
//! per level over all rounds' samples and the registry's and edge's CPU
//! per action, each with current / baseline and that ratio's range over
//! the rounds, against a target of no more than 5 % slower.
//! `scripts/bench-fencing.sh` builds a baseline and runs this.
//!
//! Each measurement also times *lease cycles*: `POST
//! /capability-leases/request` then `/release` on a speaker of the
//! caller's own (no action), with the CPU each process spent per cycle.
//!
//! `--tls` runs the lab over HTTPS and MQTT over TLS (a throwaway CA,
//! [`benchlink_e2e::pki`]); the bare MQTT clients then use TLS too.
//! `--service-compare DIR` runs three setups in turn for `--rounds`: the
//! build in DIR (before metrics) plain, the current build plain, the
//! current build over TLS, and prints the registry's CPU per lease cycle
//! and per action of each against the first, with a target of at most
//! 10 % more (docs/benchmarks.md "Metrics and TLS").

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use benchlink_e2e::bench::{bench_speaker, Broker, Lab, LabOptions, Mosquitto, HW_AGENT};
use benchlink_e2e::client::Agent;
use clap::Parser;
use rumqttc::{AsyncClient, Event, MqttOptions, Packet, QoS};
use serde_json::json;
use tokio::sync::oneshot;

/// Action round trip versus bare MQTT round trip.
#[derive(Debug, Parser)]
struct Args {
    /// Measured requests per concurrency level (after a warm-up).
    #[arg(long, default_value_t = 400)]
    requests: usize,
    /// Concurrency levels.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 20])]
    concurrency: Vec<usize>,
    /// Use this MQTT broker (HOST:PORT) instead of the embedded one.
    #[arg(long)]
    external_broker: Option<String>,
    /// The edge outbox's durability: `fsync` (default) or `os`.
    #[arg(long, default_value = "fsync")]
    durability: String,
    /// Start a private Mosquitto with `set_tcp_nodelay true` and use it.
    #[arg(long, conflicts_with = "external_broker")]
    private_mosquitto: bool,
    /// Compare against the `cloud-registry` and `edge-agent` in DIR (an
    /// older release build): the whole measurement runs with them and
    /// with the current binaries in turn, `--rounds` times each.
    #[arg(long, value_name = "DIR")]
    baseline_bins: Option<PathBuf>,
    /// With `--baseline-bins`: measurements of each build, alternated
    /// (baseline, current, baseline, current, ...) to spread drift.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u64).range(1..))]
    rounds: u64,
    /// HTTPS and MQTT over TLS for the whole lab (a CA made for the run).
    #[arg(long)]
    tls: bool,
    /// Compare three setups, `--rounds` times each, alternated: the
    /// binaries in DIR over plain HTTP and MQTT, the current ones plain,
    /// and the current ones with `--tls`.
    #[arg(long, value_name = "DIR", conflicts_with_all = ["baseline_bins", "tls"])]
    service_compare: Option<PathBuf>,
}

/// The most a current figure may exceed the baseline's: 5 %.
const TARGET_RATIO: f64 = 1.05;

/// `--service-compare`: the most metrics, then metrics and TLS, may add to
/// the registry's CPU per lease cycle and per action: 10 %.
const SERVICE_TARGET_RATIO: f64 = 1.10;

/// One concurrency level of one measurement: the round trips (each
/// sample one request) and the CPU milliseconds per request of each
/// counted process (`None` where a reading was missing).
struct Level {
    callers: usize,
    bare: Vec<Duration>,
    action: Vec<Duration>,
    action_cpu: Vec<Option<f64>>,
    /// Lease cycles (request + release) and their CPU ms per cycle.
    cycle: Vec<Duration>,
    cycle_cpu: Vec<Option<f64>>,
}

/// One whole measurement: its levels in `--concurrency` order and the
/// names of the counted processes (the order of each `action_cpu`).
struct Run {
    counted: Vec<&'static str>,
    levels: Vec<Level>,
}

/// p50 and p99 of `samples`, milliseconds.
fn percentiles(samples: &mut [Duration]) -> (f64, f64) {
    samples.sort();
    let at = |q: f64| {
        let i = ((samples.len() as f64 - 1.0) * q).round() as usize;
        samples[i.min(samples.len() - 1)].as_secs_f64() * 1000.0
    };
    (at(0.50), at(0.99))
}

/// [`percentiles`] of a copy of `samples` (milliseconds).
fn percentiles_of<'a>(samples: impl IntoIterator<Item = &'a Vec<Duration>>) -> (f64, f64) {
    let mut all: Vec<Duration> = samples.into_iter().flatten().copied().collect();
    if all.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    percentiles(&mut all)
}

type Waiters = Arc<Mutex<HashMap<u64, oneshot::Sender<Instant>>>>;

/// CPU time (user + system) process `pid` has used so far, from
/// `/proc/<pid>/stat`; `None` when it cannot be read (no such process,
/// not Linux).
fn cpu_time(pid: u32) -> Option<Duration> {
    if pid == 0 {
        return None;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // After the command name (in parentheses, may hold spaces) come the
    // fields from `state` (3rd) on: utime is the 14th, stime the 15th.
    let fields: Vec<&str> = stat
        .get(stat.rfind(')')? + 1..)?
        .split_whitespace()
        .collect();
    let ticks = fields.get(11)?.parse::<u64>().ok()? + fields.get(12)?.parse::<u64>().ok()?;
    // SAFETY: sysconf only reads a configuration value.
    let hz = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) })
        .ok()
        .filter(|h| *h > 0)?;
    Some(Duration::from_nanos(ticks * 1_000_000_000 / hz))
}

/// The processes whose CPU time is counted: name and pid.
type Counted = Vec<(&'static str, u32)>;

/// CPU time of each counted process now.
fn cpu_times(procs: &Counted) -> Vec<Option<Duration>> {
    procs.iter().map(|(_, pid)| cpu_time(*pid)).collect()
}

/// CPU milliseconds per request of each counted process between `before`
/// and `after` (`None` where a reading is missing).
fn cpu_ms(
    before: &[Option<Duration>],
    after: &[Option<Duration>],
    requests: usize,
) -> Vec<Option<f64>> {
    before
        .iter()
        .zip(after)
        .map(|(b, a)| {
            let (b, a) = (b.as_ref()?, a.as_ref()?);
            Some(a.saturating_sub(*b).as_secs_f64() * 1000.0 / requests.max(1) as f64)
        })
        .collect()
}

/// One row of the CPU table: CPU milliseconds per request of each process
/// (from [`cpu_ms`]), their total, and the requests per second `cores`
/// could serve at that total.
fn cpu_row(per_process: &[Option<f64>], cores: usize) -> Vec<String> {
    let mut total = 0.0;
    let mut cells = Vec::new();
    for ms in per_process {
        match ms {
            Some(ms) => {
                total += ms;
                cells.push(format!("{ms:.3}"));
            }
            None => cells.push("-".into()),
        }
    }
    cells.push(format!("{total:.3}"));
    cells.push(if total > 0.0 {
        format!("{:.0}", cores as f64 * 1000.0 / total)
    } else {
        "-".into()
    });
    cells
}

/// For each level (callers, bare MQTT p50 in ms, action CPU ms per
/// request of each counted process): the CPU one action may cost in all
/// processes for the target to be reachable once the round trip is bound
/// by CPU, beside what it costs. With `c` callers in a closed loop p50 is
/// about `c` / rate, and the rate is at most `cores` / CPU per action, so
/// p50 ≤ 5 × bare p50 needs CPU per action ≤ `cores` × 5 × bare p50 / `c`.
fn print_budgets(levels: &[(usize, f64, Vec<Option<f64>>)], counted: &Counted, cores: usize) {
    println!("
CPU an action may cost for the target once bound by CPU ({cores} cores; a closed loop of c callers has p50 ~ c / rate):");
    for (c, bare_p50, per_process) in levels {
        let budget = cores as f64 * 5.0 * bare_p50 / *c as f64;
        let total: f64 = per_process.iter().flatten().sum();
        let outside: f64 = counted
            .iter()
            .zip(per_process)
            .filter(|((name, _), _)| *name != "registry")
            .filter_map(|(_, ms)| *ms)
            .sum();
        println!(
            "{c:>11} callers: at most {budget:.3} ms per action; it costs {total:.3} ms, of which {outside:.3} ms outside the registry{}",
            if outside >= budget { " (the whole budget before the registry does anything)" } else { "" }
        );
    }
}

/// Two clients on the broker: `ping` publishes, `echo` sends each message
/// back on another topic.
struct BareMqtt {
    ping: AsyncClient,
    waiters: Waiters,
    topic: String,
}

/// An MQTT client connected to `127.0.0.1:port` (over TLS trusting the
/// PEM CA `ca` when given), after its CONNACK.
async fn connect(
    port: u16,
    client_id: &str,
    user: &str,
    password: &str,
    ca: Option<&[u8]>,
) -> Result<(AsyncClient, rumqttc::EventLoop)> {
    let mut opts = MqttOptions::new(client_id, "127.0.0.1", port);
    opts.set_credentials(user, password)
        .set_keep_alive(Duration::from_secs(10));
    if let Some(ca) = ca {
        opts.set_transport(rumqttc::Transport::tls_with_config(
            rumqttc::TlsConfiguration::Simple {
                ca: ca.to_vec(),
                alpn: None,
                client_auth: None,
            },
        ));
    }
    let (client, mut el) = AsyncClient::new(opts, 1024);
    // Small control messages: no Nagle delay on the client's side.
    let mut net = rumqttc::NetworkOptions::new();
    net.set_tcp_nodelay(true);
    el.set_network_options(net);
    loop {
        match tokio::time::timeout(Duration::from_secs(5), el.poll()).await {
            Ok(Ok(Event::Incoming(Packet::ConnAck(_)))) => return Ok((client, el)),
            Ok(Ok(_)) => {}
            Ok(Err(e)) => bail!("MQTT connect as {client_id}: {e}"),
            Err(_) => bail!("MQTT connect as {client_id}: no CONNACK in 5 s"),
        }
    }
}

impl BareMqtt {
    async fn start(
        port: u16,
        prefix: &str,
        user: &str,
        password: &str,
        ca: Option<&[u8]>,
    ) -> Result<Self> {
        let ping_topic = format!("{prefix}/bench/ping");
        let pong_topic = format!("{prefix}/bench/pong");
        let (echo, mut echo_el) = connect(port, "bench-echo", user, password, ca).await?;
        let (ping, mut ping_el) = connect(port, "bench-ping", user, password, ca).await?;
        echo.subscribe(&ping_topic, QoS::AtLeastOnce).await?;
        ping.subscribe(&pong_topic, QoS::AtLeastOnce).await?;
        let echo2 = echo.clone();
        let pong = pong_topic.clone();
        tokio::spawn(async move {
            while let Ok(ev) = echo_el.poll().await {
                if let Event::Incoming(Packet::Publish(p)) = ev {
                    let _ = echo2
                        .publish(pong.clone(), QoS::AtLeastOnce, false, p.payload.to_vec())
                        .await;
                }
            }
        });
        let waiters: Waiters = Arc::default();
        let w = waiters.clone();
        tokio::spawn(async move {
            while let Ok(ev) = ping_el.poll().await {
                if let Event::Incoming(Packet::Publish(p)) = ev {
                    let got = Instant::now();
                    let id = p
                        .payload
                        .get(..8)
                        .and_then(|b| b.try_into().ok())
                        .map(u64::from_be_bytes);
                    if let Some(tx) = id.and_then(|id| w.lock().ok()?.remove(&id)) {
                        let _ = tx.send(got);
                    }
                }
            }
        });
        // Let both SUBACKs land.
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(Self {
            ping,
            waiters,
            topic: ping_topic,
        })
    }

    /// One round trip with message number `id` (a 256-byte payload, about
    /// the size of an action command).
    async fn round_trip(&self, id: u64) -> Result<Duration> {
        let (tx, rx) = oneshot::channel();
        self.waiters
            .lock()
            .map_err(|_| anyhow::anyhow!("poisoned"))?
            .insert(id, tx);
        let mut payload = id.to_be_bytes().to_vec();
        payload.resize(256, b'x');
        let start = Instant::now();
        self.ping
            .publish(&self.topic, QoS::AtLeastOnce, false, payload)
            .await?;
        let got = tokio::time::timeout(Duration::from_secs(10), rx)
            .await
            .context("echo within 10 s")??;
        Ok(got - start)
    }
}

async fn run_level<F, Fut>(callers: usize, requests: usize, call: F) -> Result<Vec<Duration>>
where
    F: Fn(usize, u64) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Duration>> + Send,
{
    let call = Arc::new(call);
    let per = requests.div_ceil(callers);
    let mut tasks = Vec::new();
    for c in 0..callers {
        let call = call.clone();
        tasks.push(tokio::spawn(async move {
            let mut out = Vec::with_capacity(per);
            for i in 0..per {
                out.push(call(c, (c * per + i) as u64).await?);
            }
            Ok::<_, anyhow::Error>(out)
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await??);
    }
    Ok(all)
}

/// One whole measurement with the registry and edge from `bin_dir` (the
/// workspace's when `None`), over TLS when `tls`: a fresh lab, a warm-up,
/// then each level, bare MQTT, actions, then lease cycles. Prints its
/// tables as it goes.
async fn measure(args: &Args, bin_dir: Option<&Path>, tls: bool) -> Result<Run> {
    let max_callers = args.concurrency.iter().copied().max().unwrap_or(1);
    let pki = if tls {
        Some(benchlink_e2e::pki::Pki::new("action-bench")?)
    } else {
        None
    };
    let ca_pem = match &pki {
        Some(p) => Some(std::fs::read(p.path("ca.pem"))?),
        None => None,
    };
    let broker_dir = tempfile::tempdir()?;
    let mut private = None;
    if args.private_mosquitto {
        private = Some(Mosquitto::start_with(
            broker_dir.path(),
            "set_tcp_nodelay true",
        )?);
    }
    let broker = match &args.external_broker {
        None if private.is_some() => Broker::External {
            host: "127.0.0.1".into(),
            port: private.as_ref().map(|m| m.port).unwrap_or(1883),
        },
        None => Broker::Embedded,
        Some(hp) => {
            let (h, p) = hp.rsplit_once(':').context("HOST:PORT")?;
            Broker::External {
                host: h.into(),
                port: p.parse()?,
            }
        }
    };
    let prefix = format!("benchlink-bench-{}/v1", benchlink_e2e::bench::uuid_like());
    println!(
        "starting a lab with {} extra simulated speakers ({} broker, outbox durability {}, {}) ...",
        max_callers * 2,
        match (&args.external_broker, args.private_mosquitto) {
            (Some(_), _) => "external",
            (None, true) => "private Mosquitto (TCP_NODELAY)",
            (None, false) => "embedded",
        },
        args.durability,
        if tls {
            "HTTPS and MQTT over TLS"
        } else {
            "plain HTTP and MQTT"
        }
    );
    let lab = Lab::start(LabOptions {
        broker,
        topic_prefix: prefix.clone(),
        // The first half for the actions, the second for lease cycles.
        extra_speakers: max_callers * 2,
        outbox_durability: Some(args.durability.clone()),
        bin_dir: bin_dir.map(Path::to_path_buf),
        tls: pki.as_ref().map(|p| p.lab_tls()),
        ..Default::default()
    })
    .await?;
    let ca_file = pki.as_ref().map(|p| p.path("ca.pem"));
    let agent = Agent::with_ca_file(&lab.base_url, HW_AGENT, &lab.hw_token, ca_file.as_deref())
        .map_err(anyhow::Error::msg)?;
    let mut leases = Vec::new();
    for i in 1..=max_callers {
        let (s, l) = agent
            .lease(
                &bench_speaker(i),
                60,
                "action round-trip benchmark",
                None,
                5,
            )
            .await?;
        if !s.is_success() {
            bail!("lease of {}: {s}: {l}", bench_speaker(i));
        }
        leases.push(l["lease_id"].as_str().unwrap_or_default().to_string());
    }
    let leases = Arc::new(leases);
    let mqtt = Arc::new(
        BareMqtt::start(
            lab.mqtt_port,
            &prefix,
            "bootstrap-admin",
            &lab.admin_token,
            ca_pem.as_deref(),
        )
        .await?,
    );

    let action = {
        let agent = agent.clone();
        let leases = leases.clone();
        move |caller: usize, _i: u64| {
            let agent = agent.clone();
            let lease = leases[caller].clone();
            async move {
                let start = Instant::now();
                let (s, v) = agent
                    .act(&lease, "set_volume", json!({"volume": 0.5}), 10_000)
                    .await?;
                let took = start.elapsed();
                if !s.is_success() || v["status"] != "completed" {
                    bail!("set_volume: {s}: {v}");
                }
                Ok(took)
            }
        }
    };
    let cycle = {
        let agent = agent.clone();
        move |caller: usize, _i: u64| {
            let agent = agent.clone();
            let speaker = bench_speaker(max_callers + caller + 1);
            async move {
                let start = Instant::now();
                let lease = agent.lease_ok(&speaker, "lease cycle benchmark").await?;
                let (s, v) = agent.release(&lease).await?;
                let took = start.elapsed();
                if !s.is_success() {
                    bail!("release of {lease}: {s}: {v}");
                }
                Ok(took)
            }
        }
    };
    let bare = {
        let mqtt = mqtt.clone();
        move |_caller: usize, i: u64| {
            let mqtt = mqtt.clone();
            async move { mqtt.round_trip(i).await }
        }
    };

    // Warm-up: connections, prepared statements, page cache.
    run_level(max_callers, max_callers * 5, action.clone()).await?;
    run_level(max_callers, max_callers * 5, bare.clone()).await?;
    run_level(max_callers, max_callers * 5, cycle.clone()).await?;

    println!(
        "\n{:>11} {:>9} | {:>17} {:>9} | {:>17} {:>9} | {:>13} | {:>15} {:>9}",
        "concurrency",
        "requests",
        "bare MQTT p50 ms",
        "p99 ms",
        "action p50 ms",
        "p99 ms",
        "p50 ratio",
        "lease cycle p50",
        "p99 ms"
    );
    let mut counted: Counted = vec![
        (
            "registry",
            lab.registry.as_ref().map(|p| p.pid()).unwrap_or(0),
        ),
        ("edge", lab.edge.as_ref().map(|p| p.pid()).unwrap_or(0)),
    ];
    if let Some(m) = &private {
        counted.push(("broker", m.pid()));
    }
    counted.push(("bench", std::process::id()));
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut cpu_rows = Vec::new();
    let mut budgets = Vec::new();
    let mut levels = Vec::new();
    let mut id_base = 1_000_000u64;
    for &c in &args.concurrency {
        let offset = id_base;
        id_base += 1_000_000;
        let bare_c = bare.clone();
        let t0 = cpu_times(&counted);
        let mut b = run_level(c, args.requests, move |k, i| bare_c(k, offset + i)).await?;
        let t1 = cpu_times(&counted);
        let mut a = run_level(c, args.requests, action.clone()).await?;
        let t2 = cpu_times(&counted);
        let cycles = run_level(c, args.requests, cycle.clone()).await?;
        let t3 = cpu_times(&counted);
        let action_ms = cpu_ms(&t1, &t2, a.len());
        let cycle_ms = cpu_ms(&t2, &t3, cycles.len());
        cpu_rows.push((c, "bare MQTT", cpu_row(&cpu_ms(&t0, &t1, b.len()), cores)));
        cpu_rows.push((c, "action", cpu_row(&action_ms, cores)));
        cpu_rows.push((c, "lease cycle", cpu_row(&cycle_ms, cores)));
        let (b50, b99) = percentiles(&mut b);
        let (a50, a99) = percentiles(&mut a);
        let (l50, l99) = percentiles_of([&cycles]);
        budgets.push((c, b50, action_ms.clone()));
        println!(
            "{:>11} {:>9} | {:>17.3} {:>9.3} | {:>17.3} {:>9.3} | {:>12.1}x | {:>15.3} {:>9.3}",
            c,
            a.len(),
            b50,
            b99,
            a50,
            a99,
            a50 / b50,
            l50,
            l99
        );
        levels.push(Level {
            callers: c,
            bare: b,
            action: a,
            action_cpu: action_ms,
            cycle: cycles,
            cycle_cpu: cycle_ms,
        });
    }
    println!("\ntarget: action p50 within 5x the bare MQTT p50");
    println!("\nCPU ms per request (user + system, {cores} cores):");
    let mut header = format!("{:>11} {:>11}", "concurrency", "what");
    for (name, _) in &counted {
        header.push_str(&format!(" {name:>9}"));
    }
    header.push_str(&format!(" {:>9} {:>15}", "total", "ceiling req/s"));
    println!("{header}");
    for (c, what, cells) in cpu_rows {
        let mut line = format!("{c:>11} {what:>11}");
        let n = cells.len();
        for (i, cell) in cells.into_iter().enumerate() {
            if i + 1 == n {
                line.push_str(&format!(" {cell:>15}"));
            } else {
                line.push_str(&format!(" {cell:>9}"));
            }
        }
        println!("{line}");
    }
    print_budgets(&budgets, &counted, cores);
    drop(lab);
    drop(private);
    Ok(Run {
        counted: counted.iter().map(|(name, _)| *name).collect(),
        levels,
    })
}

/// The whole benchmark: one measurement, or with `--baseline-bins` the
/// alternated measurements of both builds and their comparison.
async fn bench(args: Args) -> Result<()> {
    if let Some(dir) = args.service_compare.clone() {
        return service_compare(&args, &dir).await;
    }
    let Some(baseline) = args.baseline_bins.clone() else {
        measure(&args, None, args.tls).await?;
        return Ok(());
    };
    let baseline = std::fs::canonicalize(&baseline)
        .with_context(|| format!("--baseline-bins {}", baseline.display()))?;
    let mut runs: [Vec<Run>; 2] = [Vec::new(), Vec::new()];
    let total = args.rounds * 2;
    for round in 0..args.rounds {
        for (which, dir) in [(0, Some(baseline.as_path())), (1, None)] {
            let n = round * 2 + which as u64 + 1;
            println!(
                "\n=== measurement {n}/{total}: {} ===",
                match dir {
                    Some(d) => format!("baseline ({})", d.display()),
                    None => "current (workspace)".to_string(),
                }
            );
            runs[which].push(measure(&args, dir, args.tls).await?);
        }
    }
    print_comparison(&args, &baseline, &runs[0], &runs[1]);
    Ok(())
}

/// `--service-compare DIR`: the three setups in turn, `--rounds` times,
/// then [`print_service_comparison`].
async fn service_compare(args: &Args, dir: &Path) -> Result<()> {
    let dir = std::fs::canonicalize(dir)
        .with_context(|| format!("--service-compare {}", dir.display()))?;
    let setups: [(&str, Option<&Path>, bool); 3] = [
        ("baseline plain", Some(dir.as_path()), false),
        ("current plain", None, false),
        ("current TLS", None, true),
    ];
    let mut runs: [Vec<Run>; 3] = [Vec::new(), Vec::new(), Vec::new()];
    let total = args.rounds * 3;
    for round in 0..args.rounds {
        for (which, (name, bins, tls)) in setups.iter().enumerate() {
            let n = round * 3 + which as u64 + 1;
            println!("\n=== measurement {n}/{total}: {name} ===");
            runs[which].push(measure(args, *bins, *tls).await?);
        }
    }
    print_service_comparison(args, &dir, &setups.map(|s| s.0), &runs);
    Ok(())
}

/// Mean CPU ms per lease cycle of process `name` at level index `li` over
/// `runs` (weighted by cycle count); `None` when a reading is missing.
fn pooled_cycle_cpu(runs: &[Run], li: usize, name: &str) -> Option<f64> {
    let mut ms = 0.0;
    let mut n = 0usize;
    for run in runs {
        let pi = run.counted.iter().position(|c| *c == name)?;
        let level = run.levels.get(li)?;
        ms += level.cycle_cpu.get(pi).copied().flatten()? * level.cycle.len() as f64;
        n += level.cycle.len();
    }
    (n > 0).then(|| ms / n as f64)
}

/// The table of `--service-compare`: per level, the registry's CPU per
/// lease cycle and per action of each setup (pooled over the rounds),
/// each against the first setup's with the ratio's range over the
/// rounds; the p50 round trips beside them; then the verdicts against
/// [`SERVICE_TARGET_RATIO`].
fn print_service_comparison(args: &Args, dir: &Path, names: &[&str; 3], runs: &[Vec<Run>; 3]) {
    println!(
        "\n=== comparison: {} ({}) / {} / {}; rounds: {}, alternated; {} requests per level per measurement ===",
        names[0],
        dir.display(),
        names[1],
        names[2],
        args.rounds,
        args.requests
    );
    println!(
        "registry CPU, ms per request (user + system, its embedded broker included); ratio = setup / {}, its range over the rounds in brackets",
        names[0]
    );
    let mut verdicts = Vec::new();
    let Some(first) = runs[0].first() else {
        return;
    };
    for (li, level) in first.levels.iter().enumerate() {
        for (what, cpu) in [
            (
                "lease cycle",
                pooled_cycle_cpu as fn(&[Run], usize, &str) -> Option<f64>,
            ),
            ("action", pooled_cpu),
        ] {
            let base = cpu(&runs[0], li, "registry");
            let mut line = format!("{:>3} callers {what:<11} |", level.callers);
            for (k, setup) in runs.iter().enumerate() {
                let Some(c) = cpu(setup, li, "registry") else {
                    line.push_str(&format!(" {}: -", names[k]));
                    continue;
                };
                line.push_str(&format!(" {}: {c:.3}", names[k]));
                if let (true, Some(b)) = (k > 0, base) {
                    let rounds: Vec<f64> = runs[0]
                        .iter()
                        .zip(setup)
                        .filter_map(|(b, c)| {
                            Some(
                                cpu(std::slice::from_ref(c), li, "registry")?
                                    / cpu(std::slice::from_ref(b), li, "registry")?,
                            )
                        })
                        .collect();
                    line.push_str(&format!(" ({:.3} [{}])", c / b, ratio_range(&rounds)));
                    verdicts.push((level.callers, what, names[k], b, c));
                }
                line.push_str(" |");
            }
            println!("{line}");
        }
    }
    println!("\nround trips, p50 / p99 ms over all rounds' samples:");
    for (li, level) in first.levels.iter().enumerate() {
        let mut line = format!("{:>3} callers |", level.callers);
        for (k, setup) in runs.iter().enumerate() {
            let (c50, c99) =
                percentiles_of(setup.iter().filter_map(|r| Some(&r.levels.get(li)?.cycle)));
            let (a50, a99) =
                percentiles_of(setup.iter().filter_map(|r| Some(&r.levels.get(li)?.action)));
            line.push_str(&format!(
                " {}: cycle {c50:.3}/{c99:.3}, action {a50:.3}/{a99:.3} |",
                names[k]
            ));
        }
        println!("{line}");
    }
    println!(
        "\ntarget: registry CPU per lease cycle and per action at most {:.0} % above {} (ratio <= {SERVICE_TARGET_RATIO:.2}):",
        (SERVICE_TARGET_RATIO - 1.0) * 100.0,
        names[0]
    );
    for (callers, what, setup, b, c) in verdicts {
        println!(
            "{callers:>3} callers, {what:<11}, {setup:<13}: {} {}",
            change(b, c),
            if c / b <= SERVICE_TARGET_RATIO {
                "within"
            } else {
                "OVER"
            }
        );
    }
}

/// `current / baseline` as a signed percentage change: `+3.1 %`.
fn change(baseline: f64, current: f64) -> String {
    format!("{:+.1} %", (current / baseline - 1.0) * 100.0)
}

/// The lowest and highest of `ratios`, formatted `0.97–1.04`.
fn ratio_range(ratios: &[f64]) -> String {
    let lo = ratios.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = ratios.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!("{lo:.2}–{hi:.2}")
}

/// Mean CPU ms per action of process `name` at level index `li` over
/// `runs` (each run weighted by its action count); `None` when a reading
/// is missing in any run.
fn pooled_cpu(runs: &[Run], li: usize, name: &str) -> Option<f64> {
    let mut ms = 0.0;
    let mut n = 0usize;
    for run in runs {
        let pi = run.counted.iter().position(|c| *c == name)?;
        let level = run.levels.get(li)?;
        ms += level.action_cpu.get(pi).copied().flatten()? * level.action.len() as f64;
        n += level.action.len();
    }
    (n > 0).then(|| ms / n as f64)
}

/// The side-by-side table of both builds: action p50/p99 over the pooled
/// samples of all rounds, the registry's and the edge's CPU per action,
/// each with current / baseline and that ratio's range over the rounds
/// (round i's current against round i's baseline), and the verdict.
fn print_comparison(args: &Args, baseline_dir: &Path, baseline: &[Run], current: &[Run]) {
    println!(
        "\n=== comparison: baseline {} against current; rounds: {}, alternated; {} requests per level per measurement ===",
        baseline_dir.display(),
        args.rounds,
        args.requests
    );
    println!(
        "\naction round trip, ms (p50/p99 over all rounds' samples; ratio = current / baseline, then its range over the rounds):"
    );
    println!(
        "{:>7} | {:>9} {:>9} | {:>9} {:>9} | {:>9} {:>11} | {:>9} {:>11}",
        "callers",
        "base p50",
        "cur p50",
        "base p99",
        "cur p99",
        "p50 ratio",
        "per round",
        "p99 ratio",
        "per round"
    );
    let mut verdicts = Vec::new();
    let mut controls = Vec::new();
    for (li, level) in baseline[0].levels.iter().enumerate() {
        let pooled = |runs: &[Run], bare: bool| {
            percentiles_of(runs.iter().filter_map(|r| r.levels.get(li)).map(|l| {
                if bare {
                    &l.bare
                } else {
                    &l.action
                }
            }))
        };
        let (b50, b99) = pooled(baseline, false);
        let (c50, c99) = pooled(current, false);
        let per_round = |q: usize| -> Vec<f64> {
            baseline
                .iter()
                .zip(current)
                .filter_map(|(b, c)| {
                    let (b, c) = (b.levels.get(li)?, c.levels.get(li)?);
                    let (b, c) = (percentiles_of([&b.action]), percentiles_of([&c.action]));
                    Some(if q == 50 { c.0 / b.0 } else { c.1 / b.1 })
                })
                .collect()
        };
        println!(
            "{:>7} | {:>9.3} {:>9.3} | {:>9.3} {:>9.3} | {:>9.3} {:>11} | {:>9.3} {:>11}",
            level.callers,
            b50,
            c50,
            b99,
            c99,
            c50 / b50,
            ratio_range(&per_round(50)),
            c99 / b99,
            ratio_range(&per_round(99)),
        );
        verdicts.push((level.callers, "action p50", b50, c50));
        verdicts.push((level.callers, "action p99", b99, c99));
        controls.push((level.callers, pooled(baseline, true), pooled(current, true)));
    }
    println!(
        "\ncontrol, bare MQTT round trip on the same broker (no registry or edge code in its path but the embedded broker), ms: baseline / current"
    );
    for (callers, (b50, b99), (c50, c99)) in controls {
        println!(
            "{callers:>7} | p50 {b50:.3} / {c50:.3} ({}) | p99 {b99:.3} / {c99:.3} ({})",
            change(b50, c50),
            change(b99, c99)
        );
    }
    println!("\nCPU ms per action (user + system; the registry's includes its embedded broker):");
    println!(
        "{:>7} | {:>9} {:>9} {:>7} {:>11} | {:>9} {:>9} {:>7} {:>11}",
        "callers",
        "reg base",
        "reg cur",
        "ratio",
        "per round",
        "edge base",
        "edge cur",
        "ratio",
        "per round"
    );
    for (li, level) in baseline[0].levels.iter().enumerate() {
        let mut line = format!("{:>7} |", level.callers);
        for (k, name) in ["registry", "edge"].into_iter().enumerate() {
            let (b, c) = (
                pooled_cpu(baseline, li, name),
                pooled_cpu(current, li, name),
            );
            let rounds: Vec<f64> = baseline
                .iter()
                .zip(current)
                .filter_map(|(b, c)| {
                    let (b, c) = (std::slice::from_ref(b), std::slice::from_ref(c));
                    Some(pooled_cpu(c, li, name)? / pooled_cpu(b, li, name)?)
                })
                .collect();
            match (b, c) {
                (Some(b), Some(c)) => {
                    line.push_str(&format!(
                        " {b:>9.3} {c:>9.3} {:>7.3} {:>11}",
                        c / b,
                        ratio_range(&rounds)
                    ));
                    verdicts.push((
                        level.callers,
                        if k == 0 { "registry CPU" } else { "edge CPU" },
                        b,
                        c,
                    ));
                }
                _ => line.push_str(&format!(" {:>9} {:>9} {:>7} {:>11}", "-", "-", "-", "-")),
            }
            if k == 0 {
                line.push_str(" |");
            }
        }
        println!("{line}");
    }
    println!(
        "\ntarget: current no more than {:.0} % slower than baseline (ratio <= {TARGET_RATIO:.2}):",
        (TARGET_RATIO - 1.0) * 100.0
    );
    verdicts.sort_by_key(|v| v.0);
    for (callers, what, b, c) in verdicts {
        println!(
            "{callers:>7} callers, {what:<12}: {} {}",
            change(b, c),
            if c / b <= TARGET_RATIO {
                "within"
            } else {
                "OVER"
            }
        );
    }
}

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("action-bench: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    let result = rt.block_on(async {
        tokio::select! {
            r = bench(args) => r,
            _ = tokio::signal::ctrl_c() => Err(anyhow::anyhow!("interrupted")),
        }
    });
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("action-bench: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
