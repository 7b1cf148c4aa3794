//! `outbox-bench`: how fast evidence gets into the outbox, and how much
//! memory an idle daemon takes.
//!
//! ```text
//! cargo build --release -p edge-agent --bins
//! target/release/outbox-bench [--dir /var/tmp] [--skip-rss]
//! ```
//!
//! 1. Ingest 100 MiB twice, as 100 × 1 MiB and as 1,600 × 64 KiB artifacts,
//!    through `Outbox::ingest` (write to a temp file while hashing, rename,
//!    SQLite row), once per durability mode (`fsync`, `os`) and once
//!    through `Outbox::ingest_batch` (100 artifacts per call, `fsync`);
//!    then time the system's `sha256sum` over the same files in the same
//!    run. Figures are MB/s (10^6 bytes per second).
//! 2. Start `edge-agent run` (next to this binary) with
//!    `config/edge-agent.sim.toml` (all 8 capabilities simulated; its own
//!    provider id, topic prefix and state directory) against the broker,
//!    let it idle, and read its `VmRSS` from `/proc/PID/status`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Parser;
use edge_agent::config::{Durability, OutboxConfig};
use edge_agent::drivers::NewArtifact;
use edge_agent::outbox::Outbox;
use serde_json::Map;
use shared_protocol::artifact::ArtifactType;

#[derive(Debug, Parser)]
#[command(about = "Outbox ingest throughput and idle daemon RSS")]
struct Args {
    /// Where to write the benchmark outboxes (a directory on the disk the
    /// bench's state directory lives on).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Skip the idle-RSS measurement.
    #[arg(long)]
    skip_rss: bool,
    /// The simulated bench configuration for the RSS measurement.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/../config/edge-agent.sim.toml"))]
    sim_config: PathBuf,
    /// Which ingest paths to time: any of `fsync`, `batch`, `os`.
    #[arg(long, value_delimiter = ',', default_value = "fsync,batch,os")]
    paths: Vec<String>,
    /// How long the daemon idles before its RSS is read, seconds.
    #[arg(long, default_value_t = 10)]
    idle_seconds: u64,
}

const MIB: usize = 1024 * 1024;

fn main() -> Result<()> {
    let args = Args::parse();
    if cfg!(debug_assertions) {
        eprintln!("warning: a debug build; run `cargo build --release -p edge-agent --bins` for real figures");
    }
    std::fs::create_dir_all(&args.dir)?;
    let work = WorkDir::create(&args.dir)?;

    println!("outbox ingest, 100 MiB per row (MB/s = 10^6 bytes/s)");
    println!(
        "{:<22} {:<26} {:>9} {:>10} {:>12} {:>8}",
        "artifacts", "path", "seconds", "MB/s", "sha256sum", "ratio"
    );
    for (count, size) in [(100usize, MIB), (1600usize, 64 * 1024)] {
        let payloads: Vec<Vec<u8>> = (0..count).map(|i| bytes(size, i as u64 + 1)).collect();
        let total = (count * size) as f64;
        let label = format!("{count} x {} KiB", size / 1024);
        for (key, mode, durability, batch) in [
            ("fsync", "ingest, fsync", Durability::Fsync, false),
            ("batch", "ingest_batch(100), fsync", Durability::Fsync, true),
            ("os", "ingest, os", Durability::Os, false),
        ] {
            if !args.paths.iter().any(|p| p == key) {
                continue;
            }
            let dir = work.path().join(format!(
                "{count}-{size}-{}",
                mode.replace([' ', ',', '(', ')'], "")
            ));
            let (secs, files) = run_ingest(&dir, &payloads, durability, batch)?;
            let sum_secs = time_sha256sum(&files)?;
            let ours = total / secs / 1e6;
            let theirs = total / sum_secs / 1e6;
            println!(
                "{label:<22} {mode:<26} {secs:>9.3} {ours:>10.1} {theirs:>12.1} {:>8.2}",
                ours / theirs
            );
            std::fs::remove_dir_all(&dir).ok();
        }
    }
    let in_process = time_sha2(&bytes(100 * MIB, 7));
    println!("sha2 crate in process (same 100 MiB, one buffer): {in_process:.1} MB/s");
    println!("target: ingest >= 0.5 x sha256sum");

    if !args.skip_rss {
        println!();
        match idle_rss(&args.sim_config, work.path(), Duration::from_secs(args.idle_seconds)) {
            Ok(r) => println!(
                "edge-agent idle with 8 simulated capabilities ({}): VmRSS {:.1} MiB, VmHWM {:.1} MiB, {} threads (target: VmRSS < 15 MiB)",
                if r.connected { "connected to the broker" } else { "broker unreachable" },
                r.rss_kib as f64 / 1024.0,
                r.hwm_kib as f64 / 1024.0,
                r.threads
            ),
            Err(e) => println!("idle RSS not measured: {e:#}"),
        }
    }
    Ok(())
}

/// A scratch directory removed on drop.
struct WorkDir(PathBuf);

impl WorkDir {
    fn create(parent: &Path) -> Result<Self> {
        let dir = parent.join(format!("outbox-bench-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        Ok(Self(dir))
    }
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Deterministic, incompressible bytes (xorshift64*), distinct per seed.
fn bytes(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        out.extend_from_slice(&x.wrapping_mul(0x2545_F491_4F6C_DD1D).to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Ingest every payload into a fresh outbox; returns the elapsed seconds
/// and the artifact files.
fn run_ingest(
    dir: &Path,
    payloads: &[Vec<u8>],
    durability: Durability,
    batch: bool,
) -> Result<(f64, Vec<PathBuf>)> {
    let cfg = OutboxConfig {
        dir: dir.join("outbox"),
        db: dir.join("outbox.sqlite3"),
        disk_budget_bytes: 1 << 40,
        durability,
    };
    let (outbox, _) = Outbox::open(&cfg, "provider-bench")?;
    // The copies are made before the clock starts: ingest takes ownership.
    let artifacts: Vec<NewArtifact> = payloads
        .iter()
        .map(|b| NewArtifact {
            artifact_type: ArtifactType::Image,
            content_type: "application/octet-stream".into(),
            bytes: b.clone(),
            duration_ms: None,
            metadata: Map::new(),
        })
        .collect();
    let start = Instant::now();
    let mut ids = Vec::with_capacity(artifacts.len());
    if batch {
        let mut it = artifacts.into_iter().peekable();
        while it.peek().is_some() {
            let chunk: Vec<NewArtifact> = it.by_ref().take(100).collect();
            ids.extend(
                outbox
                    .ingest_batch("sess-bench", chunk)?
                    .into_iter()
                    .map(|a| a.artifact_id),
            );
        }
    } else {
        for a in artifacts {
            ids.push(outbox.ingest("sess-bench", a)?.artifact_id);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok((secs, ids.iter().map(|id| outbox.file_path(id)).collect()))
}

/// Wall time of `sha256sum` over `files` (one process, all files).
fn time_sha256sum(files: &[PathBuf]) -> Result<f64> {
    let start = Instant::now();
    let out = Command::new("sha256sum")
        .args(files)
        .stdout(Stdio::piped())
        .output()
        .context("running sha256sum")?;
    let secs = start.elapsed().as_secs_f64();
    if !out.status.success() {
        bail!("sha256sum failed");
    }
    Ok(secs)
}

fn time_sha2(data: &[u8]) -> f64 {
    use sha2::{Digest, Sha256};
    let start = Instant::now();
    let digest = Sha256::digest(data);
    let secs = start.elapsed().as_secs_f64();
    std::hint::black_box(digest);
    data.len() as f64 / secs / 1e6
}

struct Rss {
    rss_kib: u64,
    hwm_kib: u64,
    threads: u64,
    connected: bool,
}

/// Start the daemon on the simulated bench (own provider id, prefix and
/// state dir), idle, read /proc/PID/status, stop it.
fn idle_rss(sim_config: &Path, work: &Path, idle: Duration) -> Result<Rss> {
    let exe = std::env::current_exe()?
        .parent()
        .context("binary directory")?
        .join("edge-agent");
    if !exe.exists() {
        bail!(
            "{} is missing: cargo build --release -p edge-agent --bins",
            exe.display()
        );
    }
    let text = std::fs::read_to_string(sim_config)
        .with_context(|| format!("reading {}", sim_config.display()))?;
    let tag = uuid::Uuid::new_v4().simple().to_string();
    let text = text
        .replace(
            "state_dir = \"var/edge-sim\"",
            &format!("state_dir = \"{}\"", work.join("rss-state").display()),
        )
        .replace("provider-sim-01", &format!("provider-rss-{}", &tag[..8]))
        .replace("\"benchlink/v1\"", &format!("\"benchlink-bench/{tag}\""))
        // Measured against the local Mosquitto, not a registry's broker.
        .replace("mqtt_port = 18830", "mqtt_port = 1883");
    let config = work.join("edge-agent.sim.toml");
    std::fs::write(&config, text)?;
    let mut child = Command::new(&exe)
        .args(["run", "--config"])
        .arg(&config)
        .env("RUST_LOG", "warn")
        .env("BENCHLINK_TOKEN", "outbox-bench")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("starting edge-agent")?;
    let stdout = child.stdout.take().context("stdout")?;
    let mut line = String::new();
    BufReader::new(stdout).read_line(&mut line)?;
    if !line.contains("\"ready\"") {
        let _ = child.kill();
        bail!("edge-agent did not become ready: {line}");
    }
    std::thread::sleep(idle);
    let status = std::fs::read_to_string(format!("/proc/{}/status", child.id()))?;
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or(0)
    };
    let rss = Rss {
        rss_kib: field("VmRSS:"),
        hwm_kib: field("VmHWM:"),
        threads: field("Threads:"),
        connected: std::net::TcpStream::connect_timeout(
            &"127.0.0.1:1883".parse()?,
            Duration::from_millis(300),
        )
        .is_ok(),
    };
    // SAFETY: plain syscall on our own child's pid.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let _ = child.wait();
    Ok(rss)
}
