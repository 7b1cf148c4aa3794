//! The event log's hash chain (docs/audit-trail.md): CPU per appended
//! event with the chain (`events::append`) next to its reference, the
//! same row inserted without `prev_hash`/`hash` (what append did before
//! the chain), in one run on real SQLite files (WAL, `synchronous=NORMAL`,
//! batches of `--batch` events per transaction, as group commit does);
//! then `chain::verify` speed over `--verify-events` events.
//!
//! ```text
//! cargo run --release -p cloud-registry --bin audit-chain-bench -- --events 200000 --verify-events 1000000 \
//!     --cycle-cpu-us 653.7   # registry-bench's registry CPU per lease cycle
//! ```

use std::path::Path;
use std::time::{Duration, Instant};

use clap::Parser;
use cloud_registry::events::{self, chain, NewEvent};
use cloud_registry::sql::{params, Connection};
use serde_json::json;
use shared_protocol::event::EventType;

#[derive(Debug, Parser)]
#[command(about = "Event append cost with and without the hash chain; verify speed")]
struct Args {
    /// Events appended per variant.
    #[arg(long, default_value_t = 100_000)]
    events: u64,
    /// Events per transaction.
    #[arg(long, default_value_t = 16)]
    batch: u64,
    /// Events in the log that is verified.
    #[arg(long, default_value_t = 1_000_000)]
    verify_events: u64,
    /// Events one lease cycle appends: `lease_requested`, `lease_granted`,
    /// `lease_release_requested`, `lease_released`.
    #[arg(long, default_value_t = 4)]
    events_per_cycle: u64,
    /// Registry CPU per lease cycle, µs, as `registry-bench` measures it
    /// (its "registry CPU per cycle"); with it, the chain's share of a
    /// cycle is printed too.
    #[arg(long)]
    cycle_cpu_us: Option<f64>,
}

/// CPU time of this process (user + system).
fn cpu() -> Duration {
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage fills the struct it is given.
    unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, (t.tv_usec as u32) * 1000);
    tv(u.ru_utime) + tv(u.ru_stime)
}

fn open(path: &Path) -> Connection {
    let conn = Connection::open(path).expect("open");
    conn.execute_batch("PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;")
        .expect("pragmas");
    events::migrate(&conn).expect("migrate");
    conn
}

/// A lease-granted event like the engine's (about 600 bytes of data).
fn event(i: u64) -> NewEvent {
    NewEvent::new(
        EventType::LeaseGranted,
        "audit:bench",
        json!({"lease": {"lease_id": format!("lease_{i:032x}"), "capability_id": "cam-front-01",
            "holder_type": "audit_agent", "holder_ref": "audit:bench", "project_id": "bench",
            "purpose": "append cost", "priority": 50, "status": "granted",
            "requested_at": "2026-12-02T10:00:00Z", "granted_at": "2026-12-02T10:00:00Z",
            "expires_at": "2026-12-02T10:05:00Z", "evidence_required": true, "mode": "exclusive",
            "principal": "audit:bench", "generation": i}}),
    )
    .capability("cam-front-01")
    .lease(format!("lease_{i:032x}"))
}

/// The pre-chain insert: the same columns, no hash.
fn append_unchained(conn: &Connection, ev: NewEvent) {
    let data = ev.data.to_string();
    conn.prepare_cached(
        "INSERT INTO events (event_type, occurred_at, actor, provider_id, capability_id,
             lease_id, session_id, artifact_id, audit_request_id, data)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
    )
    .expect("prepare")
    .execute(params![
        ev.event_type.expect("type").as_str(),
        chrono::Utc::now().to_rfc3339(),
        ev.actor,
        ev.provider_id,
        ev.capability_id,
        ev.lease_id,
        ev.session_id,
        ev.artifact_id,
        ev.audit_request_id,
        data,
    ])
    .expect("insert");
}

fn run(path: &Path, n: u64, batch: u64, chained: bool) -> (Duration, Duration) {
    let mut conn = open(path);
    let (c0, t0) = (cpu(), Instant::now());
    let mut i = 0;
    while i < n {
        let tx = conn.transaction().expect("tx");
        for _ in 0..batch.min(n - i) {
            if chained {
                events::append(&tx, event(i)).expect("append");
            } else {
                append_unchained(&tx, event(i));
            }
            i += 1;
        }
        tx.commit().expect("commit");
    }
    (cpu() - c0, t0.elapsed())
}

/// A directory removed at the end.
struct Scratch(std::path::PathBuf);

impl Scratch {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn main() {
    let args = Args::parse();
    let dir =
        Scratch(std::env::temp_dir().join(format!("audit-chain-bench-{}", std::process::id())));
    std::fs::create_dir_all(dir.path()).expect("temp dir");
    let per = |d: Duration, n: u64| d.as_secs_f64() * 1e6 / n as f64;
    // Warm-up of both paths, then the two measured runs.
    run(&dir.path().join("warm.sqlite3"), 2_000, args.batch, true);
    let (ref_cpu, ref_wall) = run(
        &dir.path().join("plain.sqlite3"),
        args.events,
        args.batch,
        false,
    );
    let (ch_cpu, ch_wall) = run(
        &dir.path().join("chained.sqlite3"),
        args.events,
        args.batch,
        true,
    );
    println!(
        "append, {} events in batches of {}:",
        args.events, args.batch
    );
    println!(
        "  reference (no chain): {:.2} µs CPU/event, {:.0} events/s",
        per(ref_cpu, args.events),
        args.events as f64 / ref_wall.as_secs_f64()
    );
    println!(
        "  hash chain:           {:.2} µs CPU/event, {:.0} events/s",
        per(ch_cpu, args.events),
        args.events as f64 / ch_wall.as_secs_f64()
    );
    let delta_us = per(ch_cpu, args.events) - per(ref_cpu, args.events);
    println!(
        "  chain cost: {:+.1} % CPU per event, {:+.2} µs/event; {:+.2} µs per lease cycle ({} events)",
        (ch_cpu.as_secs_f64() / ref_cpu.as_secs_f64() - 1.0) * 100.0,
        delta_us,
        delta_us * args.events_per_cycle as f64,
        args.events_per_cycle
    );
    if let Some(cycle) = args.cycle_cpu_us {
        println!(
            "  of a lease cycle's {cycle:.1} µs registry CPU: {:+.2} % (target under +10 %)",
            delta_us * args.events_per_cycle as f64 / cycle * 100.0
        );
    }

    let path = dir.path().join("verify.sqlite3");
    run(&path, args.verify_events, 1000, true);
    let conn = open(&path);
    let (c0, t0) = (cpu(), Instant::now());
    let v = chain::verify(&conn, 0, None, &[]).expect("a sound chain");
    let (vc, vw) = (cpu() - c0, t0.elapsed());
    println!(
        "verify, {} events: {:.2} s, {:.0} events/s ({:.2} µs CPU/event)",
        v.last,
        vw.as_secs_f64(),
        v.last as f64 / vw.as_secs_f64(),
        per(vc, v.last)
    );
}
