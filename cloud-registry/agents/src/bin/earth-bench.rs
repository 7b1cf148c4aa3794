//! Earth command benchmark: how long the shipped Earth data takes to load,
//! and the latency of the deterministic Earth command path (no model), in
//! process through `AgentService::earth_command` and over HTTP through the
//! agent routes. Every command is a full run: entity queries, validation and
//! the SQLite writes of the run, its steps and evidence.
//!
//! Then the map layers (`/api/v1/visualization/geo/{layer}`): building and
//! serializing each collection, and the satellites layer over HTTP, both
//! freshly built (a new `at` every call) and for "now" fetched repeatedly.
//!
//! ```text
//! cargo run --release -p registry-agents --bin earth-bench -- --iterations 200
//! ```
//!
//! Targets: command p50 under 5 ms in process; satellites layer for "now"
//! under 50 ms per fetch over HTTP.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use axum::{Extension, Router};
use clap::Parser;
use registry_agents::config::AgentsConfig;
use registry_agents::earth::entities::{EarthDataConfig, EntityCatalog, Layer, SHIPPED_DATA_DIR};
use registry_agents::earth::resolver;
use registry_agents::{self as agents, AgentService};
use registry_core::auth::{self, Authenticator, Principal};
use registry_core::db::Db;
use shared_protocol::api::Role;
use shared_protocol::earth::{EarthClientContext, EarthCommandRequest, EarthCommandSource};

/// The command mix: every domain with data, both languages, the large
/// (500-id) highlights, focus, filter, clear and a clarification.
const COMMANDS: [&str; 12] = [
    "高亮所有北斗卫星",
    "中国大陆的算力中心",
    "highlight all GPS satellites",
    "显示日本的超算",
    "高亮所有星链卫星",
    "聚焦国际空间站",
    "筛选中国大陆的海缆",
    "显示BGP劫持事件",
    "find GPU clusters in the United States",
    "高亮地球同步轨道卫星",
    "清除高亮",
    "今天天气怎么样",
];

#[derive(Parser, Debug)]
#[command(about = "Benchmark Earth data loading and the deterministic Earth command")]
struct Args {
    /// Commands per path (cycled through the mix).
    #[arg(long, default_value_t = 240)]
    iterations: usize,
    /// Directory laid out like cloud-registry/data/earth.
    #[arg(long, default_value = SHIPPED_DATA_DIR)]
    data_dir: PathBuf,
    /// Skip the HTTP path.
    #[arg(long)]
    no_http: bool,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn report(label: &str, mut samples: Vec<Duration>) {
    samples.sort();
    let mean = samples.iter().sum::<Duration>() / samples.len().max(1) as u32;
    println!(
        "{label:<28} n={:<5} p50={:>7.3} ms  p90={:>7.3} ms  p99={:>7.3} ms  max={:>7.3} ms  mean={:>7.3} ms",
        samples.len(),
        ms(percentile(&samples, 0.50)),
        ms(percentile(&samples, 0.90)),
        ms(percentile(&samples, 0.99)),
        ms(*samples.last().unwrap_or(&Duration::ZERO)),
        ms(mean),
    );
}

fn request(text: &str) -> EarthCommandRequest {
    EarthCommandRequest {
        input_text: text.to_string(),
        source: EarthCommandSource::Text,
        transcription_id: None,
        client_context: EarthClientContext::default(),
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();

    let cfg = EarthDataConfig::shipped(&args.data_dir);
    let started = Instant::now();
    let catalog = tokio::task::spawn_blocking(move || EntityCatalog::load(&cfg))
        .await?
        .context("loading the shipped Earth data")?;
    let load = started.elapsed();
    let stats = catalog.stats();
    println!(
        "Earth data load: {:.1} ms (catalog's own figure {} ms)",
        ms(load),
        stats.load_ms
    );
    for (domain, n) in &stats.counts {
        println!("  {:<16} {n:>6} entities", domain.as_str());
    }
    let catalog = Arc::new(catalog);

    let dir = std::env::temp_dir().join(format!("earth-bench-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir)?;
    let db = Db::open(&dir.join("bench.sqlite3"), |c| {
        auth::migrate(c)?;
        agents::migrate(c)
    })?;
    let svc = Arc::new(
        AgentService::new(db.clone(), Arc::clone(&catalog), AgentsConfig::default()).await?,
    );
    let principal = Principal {
        name: "bench".into(),
        role: Role::Operator,
    };

    // The entity-service share: the resolver's queries alone, no run.
    let mut query_only: Vec<Duration> = Vec::with_capacity(args.iterations);
    for i in 0..args.iterations {
        let interp = resolver::interpret(COMMANDS[i % COMMANDS.len()]);
        let t = Instant::now();
        for q in resolver::queries(&interp, 500) {
            std::hint::black_box(catalog.find(&q));
        }
        query_only.push(t.elapsed());
    }

    // Warm-up: first touches of SQLite pages and allocator.
    for text in COMMANDS {
        svc.earth_command(&principal, request(text), None).await?;
    }

    println!(
        "\nDeterministic Earth command, {} commands per path:",
        args.iterations
    );
    let mut all = Vec::with_capacity(args.iterations);
    let mut per_command: Vec<Vec<Duration>> = vec![Vec::new(); COMMANDS.len()];
    for i in 0..args.iterations {
        let k = i % COMMANDS.len();
        let t = Instant::now();
        let resp = svc
            .earth_command(&principal, request(COMMANDS[k]), None)
            .await?;
        let d = t.elapsed();
        anyhow::ensure!(resp.run_id.starts_with("agent_"), "no run id");
        all.push(d);
        per_command[k].push(d);
    }
    report("entity queries only", query_only);
    let layer_runs = (args.iterations / 8).max(5);
    println!("\nMap layers, built and serialized (no cache), {layer_runs} each:");
    for layer in Layer::ALL {
        let mut samples = Vec::with_capacity(layer_runs);
        let mut size = 0usize;
        for i in 0..layer_runs {
            let at = chrono::Utc::now() + chrono::Duration::seconds(i as i64);
            let t = Instant::now();
            let body = serde_json::to_vec(&catalog.layer_collection(layer, at))?;
            samples.push(t.elapsed());
            size = body.len();
        }
        report(
            &format!("  {} ({} KiB)", layer.as_str(), size / 1024),
            samples,
        );
    }

    report("in-process (all)", all.clone());
    for (k, samples) in per_command.into_iter().enumerate() {
        if !samples.is_empty() {
            report(&format!("  {}", COMMANDS[k]), samples);
        }
    }

    if !args.no_http {
        let authenticator = Authenticator::load(db.clone()).await?;
        let token = authenticator
            .create_token(Role::Operator, "bench-http")
            .await?;
        let app = Router::new()
            .nest(
                "/api/v1/agents",
                axum::Router::from(agents::router(Arc::clone(&svc))),
            )
            .nest(
                "/api/v1/visualization/geo",
                axum::Router::from(agents::geo_router(Arc::clone(&svc))),
            )
            .layer(Extension(authenticator));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let http = reqwest::Client::new();
        let url = format!("http://{addr}/api/v1/agents/earth/command");
        let mut samples = Vec::with_capacity(args.iterations);
        for i in 0..args.iterations + COMMANDS.len() {
            let body =
                serde_json::json!({"input_text": COMMANDS[i % COMMANDS.len()], "source": "text"});
            let t = Instant::now();
            let resp = http
                .post(&url)
                .bearer_auth(&token)
                .json(&body)
                .send()
                .await?;
            let status = resp.status();
            let bytes = resp.bytes().await?;
            let d = t.elapsed();
            anyhow::ensure!(status.is_success(), "HTTP {status}");
            if i >= COMMANDS.len() {
                samples.push(d);
            }
            std::hint::black_box(bytes);
        }
        report("over HTTP (all)", samples);

        let geo = format!("http://{addr}/api/v1/visualization/geo/satellites");
        let fetch = |url: String| {
            let (http, token) = (http.clone(), token.clone());
            async move {
                let t = Instant::now();
                let resp = http.get(&url).bearer_auth(&token).send().await?;
                let status = resp.status();
                let bytes = resp.bytes().await?;
                let d = t.elapsed();
                anyhow::ensure!(status.is_success(), "HTTP {status} for {url}");
                Ok::<_, anyhow::Error>((d, bytes.len()))
            }
        };
        let start = chrono::Utc::now();
        let mut fresh = Vec::with_capacity(layer_runs);
        let mut size = 0;
        for i in 0..layer_runs {
            let at = (start + chrono::Duration::seconds(i as i64 + 1))
                .to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
            let (d, n) = fetch(format!("{geo}?at={at}")).await?;
            fresh.push(d);
            size = n;
        }
        println!("\nSatellites layer over HTTP ({} KiB a body):", size / 1024);
        report("  new `at` every call", fresh);
        let mut now = Vec::with_capacity(args.iterations);
        for _ in 0..args.iterations {
            now.push(fetch(geo.clone()).await?.0);
        }
        let mut sorted = now.clone();
        sorted.sort();
        let p50_now = percentile(&sorted, 0.5);
        report("  now, back to back", now);
        println!(
            "target satellites-now < 50 ms per fetch: {} ({:.3} ms p50)",
            if percentile(&sorted, 0.9) < Duration::from_millis(50) {
                "met"
            } else {
                "NOT met"
            },
            ms(p50_now)
        );
    }

    let p50 = {
        let mut s = all;
        s.sort();
        percentile(&s, 0.5)
    };
    println!(
        "\ntarget p50 < 5 ms in process: {} ({:.3} ms)",
        if p50 < Duration::from_millis(5) {
            "met"
        } else {
            "NOT met"
        },
        ms(p50)
    );
    drop(svc);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}
