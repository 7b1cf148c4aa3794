//! `edge-agent`: the Benchlink bench daemon and its tools.
//!
//! ```text
//! edge-agent run          [--config /etc/benchlink-edge/edge-agent.toml]
//! edge-agent check-config [--config FILE]     exit 0 = usable, 2 = not
//! edge-agent devices      [--json]            cameras, audio, serial ports
//! edge-agent status       [--config FILE] [--json]   the running daemon
//! edge-agent probe CAPABILITY [--config FILE]        one reading, no lease
//! ```
//!
//! `run` prints one JSON line on stdout once the daemon is up:
//! `{"event":"ready","provider_id":…,"boot_id":…,"capabilities":[…],"outbox_dir":…}`.
//!
//! Logs go to stderr through `tracing` (`RUST_LOG` sets the filter, default
//! `info`); under systemd (`$JOURNAL_STREAM` set) without timestamps, since
//! journald adds its own. Colours only when stderr is a terminal and
//! `NO_COLOR` is unset or empty.
//!
//! Output into a closed pipe (`edge-agent devices | head -1`) ends the
//! command quietly with its usual exit status.

use std::fmt::Write as _;
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
    /// What the running daemon of this bench sees: broker link, registry,
    /// outbox backlog, each capability's health and last problem. Exit
    /// status 0 when all is well, 1 when something is wrong, 3 when the
    /// daemon is not running.
    Status {
        #[arg(long, short, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
        /// The status document as JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Open one capability's device and take one reading (a frame, a
    /// second of audio, a measurement, a screenshot; health only for
    /// speakers, relays and robots), with no lease and no registry. Stop
    /// the daemon first for devices it holds exclusively (serial ports).
    /// Exit status 0 when the device answered, 1 when not.
    Probe {
        /// The capability id from the bench TOML.
        capability: String,
        #[arg(long, short, default_value = DEFAULT_CONFIG_PATH)]
        config: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    init_logging();
    match cli.command {
        Command::CheckConfig { config } => check_config(&config),
        Command::Devices { json } => print_devices(json),
        Command::Status { config, json } => status(&config, json),
        Command::Probe { capability, config } => probe(&config, &capability),
        Command::Run { config } => run(&config),
    }
}

/// Colours in log lines: only on a terminal, and never with `NO_COLOR` set
/// to a non-empty value (<https://no-color.org>).
fn log_ansi(stream_is_terminal: bool, no_color: Option<std::ffi::OsString>) -> bool {
    stream_is_terminal && no_color.is_none_or(|v| v.is_empty())
}

fn init_logging() {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let ansi = log_ansi(
        std::io::stderr().is_terminal(),
        std::env::var_os("NO_COLOR"),
    );
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(ansi)
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
    let mut out = String::new();
    let _ = writeln!(
        out,
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
        let _ = writeln!(
            out,
            "  {:<24} {:<26} backend {}",
            c.id, c.capability_type, c.driver.backend
        );
    }
    let _ = writeln!(
        out,
        "  outbox {} (db {}), budget {} MiB, durability {:?}",
        cfg.outbox.dir.display(),
        cfg.outbox.db.display(),
        cfg.outbox.disk_budget_bytes / (1024 * 1024),
        cfg.outbox.durability
    );
    let _ = writeln!(
        out,
        "  metrics {}",
        match cfg.metrics.listen {
            Some(addr) => format!("http://{addr}/metrics"),
            None => "off".to_string(),
        }
    );
    emit(&out, ExitCode::SUCCESS)
}

/// Write `text` to `w` and flush. A reader that went away (`| head -1`) is
/// not an error: the rest of the output is simply not wanted.
fn write_quietly(w: &mut impl std::io::Write, text: &str) -> std::io::Result<()> {
    match w.write_all(text.as_bytes()).and_then(|()| w.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => other,
    }
}

/// Print `text` on stdout and exit with `status`; exit 1 when stdout fails
/// for another reason than a closed pipe (e.g. a full disk).
fn emit(text: &str, status: ExitCode) -> ExitCode {
    match write_quietly(&mut std::io::stdout().lock(), text) {
        Ok(()) => status,
        Err(e) => {
            eprintln!("edge-agent: cannot write to stdout: {e}");
            ExitCode::FAILURE
        }
    }
}

fn print_devices(json: bool) -> ExitCode {
    // The audio libraries print their probing on stderr; what matters of
    // it is in the report's errors.
    let report = devices::with_stderr_silenced(devices::discover);
    if json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => emit(&format!("{s}\n"), ExitCode::SUCCESS),
            Err(e) => {
                eprintln!("cannot encode the device report: {e}");
                ExitCode::FAILURE
            }
        }
    } else {
        emit(&device_table(&report), ExitCode::SUCCESS)
    }
}

/// The human-readable device report of `edge-agent devices`.
fn device_table(r: &DeviceReport) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "CAMERAS");
    if r.cameras.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for c in &r.cameras {
        let id = c.by_id.first().map(String::as_str).unwrap_or(&c.path);
        let _ = writeln!(out, "  {:<3} {:<40} {}", c.index, c.name, id);
        for m in &c.formats {
            let _ = writeln!(
                out,
                "        {} {}x{} @ {} fps",
                m.format, m.width, m.height, m.fps
            );
        }
        if let Some(e) = &c.formats_error {
            let _ = writeln!(out, "        formats unavailable: {e}");
        }
    }
    let _ = writeln!(out, "AUDIO ({})", r.audio_host);
    if r.audio_inputs.is_empty() && r.audio_outputs.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for (dir, list) in [("in ", &r.audio_inputs), ("out", &r.audio_outputs)] {
        for d in list {
            let cfg = d
                .default_config
                .as_ref()
                .map(|c| format!("{} ch {} Hz {}", c.channels, c.sample_rate, c.sample_format))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "  {dir} {}{:<40} {:<30} {cfg}",
                if d.is_default { "*" } else { " " },
                d.id,
                d.name
            );
        }
    }
    let _ = writeln!(out, "SERIAL PORTS");
    if r.serial_ports.is_empty() {
        let _ = writeln!(out, "  (none)");
    }
    for p in &r.serial_ports {
        let usb = p
            .usb
            .as_ref()
            .map(|u| format!("{}:{} {}", u.vid, u.pid, u.product.as_deref().unwrap_or("")))
            .unwrap_or_default();
        let _ = writeln!(out, "  {:<16} {:<8} {usb}", p.port_name, p.port_type);
        for link in &p.by_id {
            let _ = writeln!(out, "        {link}");
        }
    }
    for e in &r.errors {
        let _ = writeln!(out, "! {e}");
    }
    out
}

/// Loads the bench TOML for a local tool (`status`, `probe`) that never
/// talks to the registry: a missing provider token is no obstacle.
fn load_for_local_tool(path: &std::path::Path) -> Result<EdgeConfig, String> {
    if std::env::var_os("BENCHLINK_TOKEN").is_none() {
        // Single-threaded here: nothing else reads the environment yet.
        std::env::set_var("BENCHLINK_TOKEN", "not-needed-by-local-tools");
    }
    EdgeConfig::load(path).map_err(|e| e.to_string())
}

fn status(path: &std::path::Path, json: bool) -> ExitCode {
    let cfg = match load_for_local_tool(path) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let file = edge_agent::status::status_path(&cfg.state_dir);
    let s = match edge_agent::status::DaemonStatus::read(&file) {
        Ok(s) => s,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            eprintln!(
                "no status at {}: the daemon has not run with this config (state_dir {})",
                file.display(),
                cfg.state_dir.display()
            );
            return ExitCode::from(3);
        }
        Err(e) => {
            eprintln!("cannot read {}: {e}", file.display());
            return ExitCode::from(3);
        }
    };
    let now = chrono::Utc::now();
    let problems = s.problems(now);
    let code = if !s.is_live(now) {
        ExitCode::from(3)
    } else if problems.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    };
    if json {
        let mut v = serde_json::to_value(&s).unwrap_or_default();
        v["running"] = serde_json::Value::Bool(s.is_live(now));
        v["problems"] = serde_json::json!(problems);
        return emit(&format!("{v}\n"), code);
    }
    let mut out = s.render(now);
    for p in &problems {
        let _ = writeln!(out, "! {p}");
    }
    emit(&out, code)
}

/// The read-only action `probe` runs for a capability type, if any.
fn probe_action(
    t: shared_protocol::capability::CapabilityType,
) -> Option<(
    shared_protocol::capability::CapabilityAction,
    serde_json::Value,
)> {
    use shared_protocol::capability::{CapabilityAction as A, CapabilityType as T};
    match t {
        T::Camera => Some((A::Snapshot, serde_json::json!({}))),
        T::Microphone => Some((A::RecordAudio, serde_json::json!({"duration_ms": 1000}))),
        T::SerialPort => Some((A::Read, serde_json::json!({"timeout_ms": 1000}))),
        T::ProgrammablePowerSupply => Some((A::MeasureOutput, serde_json::json!({}))),
        T::ScreenCapture => Some((A::Screenshot, serde_json::json!({}))),
        _ => None,
    }
}

fn probe(path: &std::path::Path, capability: &str) -> ExitCode {
    use edge_agent::drivers::{ActionRequest, CancelToken};
    use sha2::Digest as _;
    let cfg = match load_for_local_tool(path) {
        Ok(cfg) => cfg,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let Some(index) = cfg.capabilities.iter().position(|c| c.id == capability) else {
        let ids: Vec<&str> = cfg.capabilities.iter().map(|c| c.id.as_str()).collect();
        eprintln!(
            "no capability `{capability}` in {}; it has: {}",
            path.display(),
            ids.join(", ")
        );
        return ExitCode::from(2);
    };
    let mut drivers = match cfg.build_drivers() {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let mut driver = drivers.swap_remove(index);
    drop(drivers);
    let t = cfg.capabilities[index].capability_type;
    let mut out = String::new();
    let health = driver.health();
    let _ = writeln!(
        out,
        "{capability} ({t}, backend {}): health {}{}",
        cfg.capabilities[index].driver.backend,
        health.status,
        health
            .message
            .as_deref()
            .map(|m| format!(": {m}"))
            .unwrap_or_default()
    );
    let mut ok = health.status == shared_protocol::capability::HealthStatus::Healthy;
    if let Some((action, params)) = probe_action(t) {
        let req = ActionRequest {
            session_id: format!("probe-{}", std::process::id()),
            action,
            params: params.as_object().cloned().unwrap_or_default(),
            deadline: std::time::Instant::now() + std::time::Duration::from_secs(15),
            cancel: CancelToken::new(),
        };
        let started = std::time::Instant::now();
        match driver.execute(&req) {
            Ok(outcome) => {
                let _ = writeln!(
                    out,
                    "  {action} in {} ms: {}",
                    started.elapsed().as_millis(),
                    serde_json::Value::Object(outcome.result_summary)
                );
                for a in &outcome.artifacts {
                    let _ = writeln!(
                        out,
                        "  artifact {} {} {} bytes sha256 {}",
                        a.artifact_type,
                        a.content_type,
                        a.bytes.len(),
                        hex::encode(sha2::Sha256::digest(&a.bytes))
                    );
                }
            }
            Err(e) => {
                ok = false;
                let _ = writeln!(out, "  {action} failed: {e}");
            }
        }
    }
    emit(
        &out,
        if ok {
            ExitCode::SUCCESS
        } else {
            ExitCode::FAILURE
        },
    )
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
        // One JSON line on stdout for scripts and test harnesses; nobody
        // reading it is no reason to stop.
        let ready = serde_json::json!({
            "event": "ready",
            "provider_id": daemon.provider_id(),
            "boot_id": daemon.boot_id(),
            "capabilities": daemon.capability_ids(),
            "outbox_dir": daemon.outbox().dir(),
        });
        if let Err(e) = write_quietly(&mut std::io::stdout().lock(), &format!("{ready}\n")) {
            tracing::warn!(error = %e, "cannot write the ready line to stdout");
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_into_a_closed_pipe_is_not_an_error() {
        let (reader, mut writer) = std::io::pipe().unwrap();
        drop(reader);
        // Rust ignores SIGPIPE, so the write fails with EPIPE, as it does
        // for `edge-agent devices | head -1`.
        write_quietly(&mut writer, "CAMERAS\n  (none)\n").expect("quiet on a closed pipe");
    }

    #[test]
    fn other_output_errors_are_reported() {
        let mut full = std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap();
        let err = write_quietly(&mut full, "x\n").unwrap_err();
        assert_ne!(err.kind(), std::io::ErrorKind::BrokenPipe);
    }

    #[test]
    fn logs_are_coloured_only_on_a_terminal_without_no_color() {
        assert!(log_ansi(true, None));
        assert!(log_ansi(true, Some("".into())));
        assert!(!log_ansi(true, Some("1".into())));
        assert!(!log_ansi(false, None));
    }
}
