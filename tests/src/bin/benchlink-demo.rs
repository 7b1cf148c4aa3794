//! `benchlink-demo`: the main job on the embedded defaults (run by
//! `./scripts/demo.sh`).
//!
//! In a temporary directory it starts `bench-sim` (Korad PSU, LCUS relay,
//! GRBL thumb robot, DUT console powered from the Korad output, all on real
//! pseudo-terminals), `cloud-registry serve` with its embedded MQTT broker
//! on a free port and SQLite, and `edge-agent run` with a generated bench
//! TOML (simulated camera, microphone, speaker and screen capture; the real
//! korad / lcus / grbl / serialport drivers on the simulator's ptys). Then
//! a scripted audit agent, through the public HTTP API only, leases, acts,
//! collects evidence and is preempted by a second agent; an Earth command
//! is sent; every session, artifact (sha256, download URL, verified bytes)
//! and the lease timeline are printed.
//!
//! Exit status 0 when every step worked and every downloaded artifact
//! hashes to the sha256 the edge computed; 1 otherwise; 130 on Ctrl-C.
//! Every child process is killed on every exit path (also on a panic, and
//! by the kernel if this process is killed); the directory is removed
//! unless `--keep`.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use benchlink_e2e::bench::{caps, Broker, Lab, LabOptions, CHIEF_AGENT, HW_AGENT, PROVIDER_ID};
use benchlink_e2e::client::{follow_events, Agent};
use benchlink_e2e::scenario::{print_report, run_main_job, EarthOutcome};
use clap::Parser;

/// The Benchlink main job, end to end, on one simulated bench.
#[derive(Debug, Parser)]
struct Args {
    /// Keep the lab directory (configs, databases, logs) afterwards.
    #[arg(long)]
    keep: bool,
    /// Use the MQTT broker at this host:port (e.g. a Mosquitto) instead of
    /// the registry's embedded one.
    #[arg(long, value_name = "HOST:PORT")]
    external_broker: Option<String>,
    /// Grace period of the preempted robot lease, seconds.
    #[arg(long, default_value_t = 3)]
    grace_seconds: u32,
    /// After the job, keep the lab running this many seconds to look at
    /// it in the web console (Ctrl-C ends it sooner); then stop every
    /// process as usual.
    #[arg(long, default_value_t = 0, value_name = "SECONDS")]
    console_seconds: u64,
}

fn say(line: String) {
    println!("{line}");
}

fn live_event(e: &serde_json::Value) {
    let t = e["event_type"].as_str().unwrap_or("");
    let interesting = t.starts_with("lease_") || t == "session_failed";
    if !interesting {
        return;
    }
    let d = &e["data"];
    let who = d["principal"].as_str().unwrap_or("");
    let extra = match t {
        "lease_preempt_requested" => {
            format!(" grace_until={}", d["grace_until"].as_str().unwrap_or("?"))
        }
        "session_failed" => format!(" {}", d["error_message"].as_str().unwrap_or("")),
        _ => String::new(),
    };
    println!(
        "      ~ event #{} {t} {} {} {who}{extra}",
        e["event_id"],
        e["lease_id"]
            .as_str()
            .or(e["session_id"].as_str())
            .unwrap_or(""),
        e["capability_id"].as_str().unwrap_or("")
    );
}

async fn demo(args: &Args) -> Result<()> {
    let started = Instant::now();
    let broker = match &args.external_broker {
        None => Broker::Embedded,
        Some(hp) => {
            let (host, port) = hp
                .rsplit_once(':')
                .ok_or_else(|| anyhow::anyhow!("--external-broker wants HOST:PORT"))?;
            Broker::External {
                host: host.to_string(),
                port: port.parse()?,
            }
        }
    };
    let topic_prefix = match broker {
        Broker::Embedded => shared_protocol::mqtt::DEFAULT_TOPIC_PREFIX.to_string(),
        Broker::External { .. } => {
            format!("benchlink-demo-{}/v1", benchlink_e2e::bench::uuid_like())
        }
    };
    say("Starting the lab: bench-sim, cloud-registry, edge-agent ...".into());
    let lab = Lab::start(LabOptions {
        broker,
        topic_prefix,
        grace_period_seconds: args.grace_seconds,
        keep: args.keep,
        ..Default::default()
    })
    .await?;
    say(format!(
        "  registry {} (MQTT {} on port {}), lab dir {}",
        lab.base_url,
        if args.external_broker.is_some() {
            "external broker"
        } else {
            "embedded broker"
        },
        lab.mqtt_port,
        lab.root.display()
    ));
    say(format!(
        "  console {}/console/ (sign in with the admin token in {}; {})",
        lab.base_url,
        lab.root.join("registry/admin.token").display(),
        if args.console_seconds > 0 {
            format!("up {} s after the job", args.console_seconds)
        } else {
            "the lab stops with the demo: --console-seconds N keeps it up".to_string()
        }
    ));
    say(format!(
        "  simulated devices: {}",
        lab.devices
            .iter()
            .map(|(n, p)| format!("{n}={p}"))
            .collect::<Vec<_>>()
            .join(", ")
    ));
    say(format!(
        "  provider {PROVIDER_ID} online with 8 capabilities: {}",
        caps::ALL.join(", ")
    ));
    say(format!(
        "  up after {:.1} s\n",
        started.elapsed().as_secs_f64()
    ));

    let hw = Agent::new(&lab.base_url, HW_AGENT, &lab.hw_token);
    let chief = Agent::new(&lab.base_url, CHIEF_AGENT, &lab.chief_token);
    let admin = Agent::new(&lab.base_url, "bootstrap-admin", &lab.admin_token);
    let (events, follower) = follow_events(&admin, live_event);
    let result = run_main_job(&hw, &chief, &admin, &events, &say).await;
    follower.abort();
    let report = result?;
    print_report(&report, &say);

    let bad: Vec<_> = report.artifacts.iter().filter(|a| !a.intact()).collect();
    if !bad.is_empty() {
        bail!("{} artifact(s) did not verify", bad.len());
    }
    if report.refused_after_preemption.0 != 409 {
        bail!(
            "the preempted holder's action was not refused: {:?}",
            report.refused_after_preemption
        );
    }
    if report.artifacts.is_empty() {
        bail!("the job produced no artifact");
    }
    let earth = match &report.earth {
        EarthOutcome::Answered(s, _) => format!("Earth command answered {s}"),
        EarthOutcome::Unavailable(_) => "Earth endpoint unavailable".to_string(),
    };
    say(format!(
        "\nDone in {:.1} s: {} sessions, {} artifacts verified against the edge's sha256, preempted holder refused, {earth}.",
        started.elapsed().as_secs_f64(),
        report.sessions.len(),
        report.artifacts.len()
    ));
    if args.console_seconds > 0 {
        say(format!(
            "\nThe lab stays up {} s for the console: {}/console/ (admin token in {}).",
            args.console_seconds,
            lab.base_url,
            lab.root.join("registry/admin.token").display()
        ));
        tokio::time::sleep(Duration::from_secs(args.console_seconds)).await;
    }
    drop(lab);
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("benchlink-demo: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let code = rt.block_on(async {
        let mut term =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(s) => s,
                Err(e) => {
                    eprintln!("benchlink-demo: cannot install a SIGTERM handler: {e}");
                    return ExitCode::FAILURE;
                }
            };
        tokio::select! {
            r = demo(&args) => match r {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("benchlink-demo: {e:#}");
                    ExitCode::FAILURE
                }
            },
            _ = tokio::signal::ctrl_c() => {
                eprintln!("benchlink-demo: interrupted; stopping every process");
                ExitCode::from(130)
            }
            _ = term.recv() => {
                eprintln!("benchlink-demo: terminated; stopping every process");
                ExitCode::from(143)
            }
        }
    });
    // Dropping the select's losing branch dropped the lab (its Drop kills
    // every child); give the runtime's tasks a moment to end.
    rt.shutdown_timeout(Duration::from_secs(2));
    code
}
