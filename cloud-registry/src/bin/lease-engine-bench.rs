//! In-process micro-benchmark of the lease engine: acquire + release cycles
//! per second and cycle latency (p50 / p99) with 1, 20 and 200 concurrent
//! tasks, through the engine's public API on a real SQLite file (WAL,
//! `synchronous=NORMAL`, group commit). No HTTP: this is the ceiling the
//! HTTP API builds on.
//!
//! Two scenarios per concurrency level:
//! - `own`: each task leases its own exclusive capability (no contention;
//!   measures transitions and commits);
//! - `one`: every task leases the same exclusive capability (contention; a
//!   release hands the capability to the next waiter, which waits with
//!   `wait_granted`).
//!
//! A cycle is `request` (+ `wait_granted` when queued) + `release`; each
//! commits four events and the lease row. Also printed: transactions per
//! second, operations per transaction (the group-commit effect) and the
//! share of wall time the SQLite writer thread spent committing.
//!
//! ```text
//! cargo run --release -p cloud-registry --bin lease-engine-bench -- --seconds 3 --tasks 1,20,200
//! ```

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Parser;
use cloud_registry::auth::Principal;
use cloud_registry::db::Db;
use cloud_registry::events::{self, EventBus};
use cloud_registry::leases::{self, CapabilityInfo, LeaseConfig, LeaseEngine};
use shared_protocol::api::Role;
use shared_protocol::capability::{CapabilityType, LeaseMode};
use shared_protocol::lease::{HolderType, LeaseRequest, LeaseStatus};

#[derive(Debug, Parser)]
#[command(about = "Lease engine acquire+release throughput and latency, in process")]
struct Args {
    /// Seconds each run lasts.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Concurrency levels (tasks), comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 20, 200])]
    tasks: Vec<usize>,
    /// Directory for the database files (default: a fresh directory under
    /// the system temp dir, removed at the end).
    #[arg(long)]
    dir: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Scenario {
    Own,
    One,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Scenario::Own => "own",
            Scenario::One => "one",
        }
    }
}

fn capability(id: String) -> CapabilityInfo {
    CapabilityInfo {
        capability_id: id,
        provider_id: "bench-provider".to_string(),
        node_id: "bench-node".to_string(),
        capability_type: CapabilityType::Camera,
        tags: Vec::new(),
        lease_mode: LeaseMode::Exclusive,
        preemptible: true,
        safety_locked: false,
        default_priority: 50,
        online: true,
        non_interruptible: false,
        maintenance: None,
        unhealthy: false,
        on_release: Vec::new(),
        check_failed: None,
    }
}

fn request(holder: &str, capability_id: &str) -> LeaseRequest {
    LeaseRequest {
        capability_id: Some(capability_id.to_string()),
        capability_selector: None,
        holder_type: HolderType::WorkerThread,
        holder_ref: holder.to_string(),
        project_id: "bench".to_string(),
        purpose: "lease engine benchmark".to_string(),
        priority: 50,
        requested_duration_seconds: 60,
        evidence_required: false,
        preempt_if_needed: false,
        preempt_reason: None,
        mode: None,
        queue_timeout_seconds: None,
    }
}

struct Outcome {
    cycles: usize,
    elapsed: Duration,
    latencies_us: Vec<u64>,
    stats: leases::CommitStats,
}

async fn run(
    dir: &std::path::Path,
    scenario: Scenario,
    tasks: usize,
    length: Duration,
) -> anyhow::Result<Outcome> {
    let path = dir.join(format!("bench-{}-{tasks}.sqlite", scenario.name()));
    let db = {
        let path = path.clone();
        tokio::task::spawn_blocking(move || {
            Db::open(&path, |c| {
                events::migrate(c)?;
                leases::migrate(c)
            })
        })
        .await??
    };
    let bus = EventBus::new(db.clone());
    let engine = LeaseEngine::start(db, bus, LeaseConfig::default())
        .await
        .context("start the lease engine")?;
    let caps = match scenario {
        Scenario::Own => tasks,
        Scenario::One => 1,
    };
    for i in 0..caps {
        engine
            .upsert_capability(capability(format!("cap-{i}")))
            .await;
    }

    let setup_stats = engine.commit_stats();
    let started = Instant::now();
    let deadline = started + length;
    let mut handles = Vec::with_capacity(tasks);
    for t in 0..tasks {
        let engine: Arc<LeaseEngine> = engine.clone();
        let cap = match scenario {
            Scenario::Own => format!("cap-{t}"),
            Scenario::One => "cap-0".to_string(),
        };
        handles.push(tokio::spawn(async move {
            let me = Principal {
                name: format!("bench-{t}"),
                role: Role::Operator,
            };
            let mut latencies = Vec::new();
            while Instant::now() < deadline {
                let t0 = Instant::now();
                let lease = engine.request(&me, request(&me.name, &cap)).await?;
                let lease = if lease.status == LeaseStatus::Requested {
                    engine
                        .wait_granted(&lease.lease_id, Duration::from_secs(60))
                        .await?
                } else {
                    lease
                };
                anyhow::ensure!(
                    lease.status == LeaseStatus::Granted,
                    "lease {} ended {} instead of granted",
                    lease.lease_id,
                    lease.status
                );
                engine.release(&me, &lease.lease_id, None).await?;
                latencies.push(u64::try_from(t0.elapsed().as_micros()).unwrap_or(u64::MAX));
            }
            anyhow::Ok(latencies)
        }));
    }
    let mut latencies_us = Vec::new();
    for h in handles {
        latencies_us.extend(h.await??);
    }
    let elapsed = started.elapsed();
    let before = setup_stats;
    let after = engine.commit_stats();
    let stats = leases::CommitStats {
        commits: after.commits - before.commits,
        operations: after.operations - before.operations,
        rows: after.rows - before.rows,
        events: after.events - before.events,
        writer_busy_us: after.writer_busy_us - before.writer_busy_us,
    };
    engine.shutdown().await;
    latencies_us.sort_unstable();
    Ok(Outcome {
        cycles: latencies_us.len(),
        elapsed,
        latencies_us,
        stats,
    })
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64 / 1000.0
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let (dir, remove) = match &args.dir {
        Some(d) => (d.clone(), false),
        None => (
            std::env::temp_dir().join(format!("lease-engine-bench-{}", std::process::id())),
            true,
        ),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
    let length = Duration::from_secs_f64(args.seconds);
    println!(
        "scenario tasks    cycles  cycles/s   p50_ms   p99_ms  commits/s  ops/commit  writer_busy"
    );
    for scenario in [Scenario::Own, Scenario::One] {
        for &tasks in &args.tasks {
            let o = run(&dir, scenario, tasks.max(1), length).await?;
            let secs = o.elapsed.as_secs_f64();
            println!(
                "{:<8} {:>5} {:>9} {:>9.0} {:>8.2} {:>8.2} {:>10.0} {:>11.1} {:>10.0}%",
                scenario.name(),
                tasks,
                o.cycles,
                o.cycles as f64 / secs,
                percentile(&o.latencies_us, 50.0),
                percentile(&o.latencies_us, 99.0),
                o.stats.commits as f64 / secs,
                o.stats.operations as f64 / o.stats.commits.max(1) as f64,
                o.stats.writer_busy_us as f64 / 1e4 / secs,
            );
        }
    }
    if remove {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
