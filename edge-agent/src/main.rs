//! `edge-agent`: the Benchlink bench daemon and its tools.
//!
//! ```text
//! edge-agent run          [--config /etc/benchlink-edge/edge-agent.toml]
//! edge-agent check-config [--config FILE]     exit 0 = usable, 2 = not
//! edge-agent devices      [--json]            cameras, audio, serial ports
//! ```
//!
//! `run` prints one JSON line on stdout once the daemon is up:
//! `{"event":"ready","provider_id":…,"boot_id":…,"capabilities":[…],"outbox_dir":…}`.
//!
//! Logs go to stderr through `tracing` (`RUST_LOG` sets the filter, default
//! `info`); under systemd (`$JOURNAL_STREAM` set) without timestamps or
//! colours, since journald adds its own.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use edge_agent::config::{EdgeConfig, DEFAULT_CONFIG_PATH};
use edge_agent::daemon::Daemon;
use edge_agent::devices::{self, DeviceReport};

/// Benchlink edge agent: exposes a test bench's hardware to the registry.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the daemon (what the systemd unit starts).
    Run {
        /// The bench TOML.
        #[arg(long, short, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// Check a bench TOML, including every driver's settings (no device is
    /// opened). Prints `file:line: key: problem` for each problem; exit
    /// status 0 when usable, 2 when not.
    CheckConfig {
        #[arg(long, short, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
    /// List the cameras, audio devices and serial ports this computer sees,
    /// with the names to write into the bench TOML.
    Devices {
        /// One JSON document instead of a table.
        #[arg(long)]
        json: bool,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::CheckConfig { config } => check_config(&config),
        Command::Devices { json } => print_devices(json),
        Command::Run { config } => run(&config),
    }
}

fn init_logging() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    use std::io::IsTerminal;
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.without_time().init();
    } else {
        builder.init();
    }
}

fn check_config(path: &std::path::Path) -> ExitCode {
    let cfg = match EdgeConfig::load(path) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    if let Err(e) = cfg.build_drivers() {
        eprintln!("{e}");
        return ExitCode::from(2);
    }
    println!(
        "{}: OK: provider `{}` (node `{}`), broker {}:{}, registry {}, {} capabilities:",
        path.display(),
        cfg.provider.provider_id,
        cfg.provider.node_id,
        cfg.registry.mqtt_host,
        cfg.registry.mqtt_port,
        cfg.registry.base_url,
        cfg.capabilities.len()
    );
    for c in &cfg.capabilities {
        println!(
            "  {:<24} {:<26} backend {}",
            c.id, c.capability_type, c.driver.backend
        );
    }
    println!(
        "  outbox {} (db {}), budget {} MiB, durability {:?}",
        cfg.outbox.dir.display(),
        cfg.outbox.db.display(),
        cfg.outbox.disk_budget_bytes / (1024 * 1024),
        cfg.outbox.durability
    );
    ExitCode::SUCCESS
}

fn print_devices(json: bool) -> ExitCode {
    let report = devices::discover();
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("cannot encode the device report: {e}");
                return ExitCode::FAILURE;
            }
        }
    } else {
        print_device_table(&report);
    }
    ExitCode::SUCCESS
}

fn print_device_table(r: &DeviceReport) {
    println!("CAMERAS");
    if r.cameras.is_empty() {
        println!("  (none)");
    }
    for c in &r.cameras {
        let id = c.by_id.first().map(String::as_str).unwrap_or(&c.path);
        println!("  {:<3} {:<40} {}", c.index, c.name, id);
        for m in &c.formats {
            println!(
                "        {} {}x{} @ {} fps",
                m.format, m.width, m.height, m.fps
            );
        }
        if let Some(e) = &c.formats_error {
            println!("        formats unavailable: {e}");
        }
    }
    println!("AUDIO ({})", r.audio_host);
    if r.audio_inputs.is_empty() && r.audio_outputs.is_empty() {
        println!("  (none)");
    }
    for (dir, list) in [("in ", &r.audio_inputs), ("out", &r.audio_outputs)] {
        for d in list {
            let cfg = d
                .default_config
                .as_ref()
                .map(|c| format!("{} ch {} Hz {}", c.channels, c.sample_rate, c.sample_format))
                .unwrap_or_default();
            println!(
                "  {dir} {}{:<40} {:<30} {cfg}",
                if d.is_default { "*" } else { " " },
                d.id,
                d.name
            );
        }
    }
    println!("SERIAL PORTS");
    if r.serial_ports.is_empty() {
        println!("  (none)");
    }
    for p in &r.serial_ports {
        let usb = p
            .usb
            .as_ref()
            .map(|u| format!("{}:{} {}", u.vid, u.pid, u.product.as_deref().unwrap_or("")))
            .unwrap_or_default();
        println!("  {:<16} {:<8} {usb}", p.port_name, p.port_type);
        for link in &p.by_id {
            println!("        {link}");
        }
    }
    for e in &r.errors {
        println!("! {e}");
    }
}

fn run(path: &std::path::Path) -> ExitCode {
    let cfg = match EdgeConfig::load(path) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(16)
        .thread_name("edge-agent")
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        // Handlers first: a SIGTERM during start-up must not kill the
        // process with the default action.
        let shutdown = match ShutdownSignal::install() {
            Ok(s) => s,
            Err(e) => {
                eprintln!("cannot install signal handlers: {e}");
                return ExitCode::FAILURE;
            }
        };
        let daemon = match Daemon::start(cfg).await {
            Ok(d) => d,
            Err(e) => {
                tracing::error!("cannot start: {e}");
                eprintln!("{e}");
                return ExitCode::from(2);
            }
        };
        // One JSON line on stdout for scripts and test harnesses.
        println!(
            "{}",
            serde_json::json!({
                "event": "ready",
                "provider_id": daemon.provider_id(),
                "boot_id": daemon.boot_id(),
                "capabilities": daemon.capability_ids(),
                "outbox_dir": daemon.outbox().dir(),
            })
        );
        daemon.run_until(shutdown.recv()).await;
        ExitCode::SUCCESS
    })
}

/// SIGTERM and SIGINT, listened to from process start.
struct ShutdownSignal {
    term: tokio::signal::unix::Signal,
    int: tokio::signal::unix::Signal,
}

impl ShutdownSignal {
    fn install() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(Self {
            term: signal(SignalKind::terminate())?,
            int: signal(SignalKind::interrupt())?,
        })
    }

    /// Resolves on the first SIGTERM or SIGINT.
    async fn recv(mut self) {
        tokio::select! {
            _ = self.term.recv() => tracing::info!("SIGTERM"),
            _ = self.int.recv() => tracing::info!("SIGINT"),
        }
    }
}
