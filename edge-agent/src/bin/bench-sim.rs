//! `bench-sim`: runs simulated bench devices on pseudo-terminals so the edge
//! agent, its drivers and the demo work with no hardware attached.
//!
//! ```text
//! bench-sim --dir /tmp/bench --korad --lcus 4 --grbl --dut-console --link-dut-to-korad
//! korad /tmp/bench/korad -> /dev/pts/7
//! lcus /tmp/bench/lcus -> /dev/pts/8
//! grbl /tmp/bench/grbl -> /dev/pts/9
//! dut_console /tmp/bench/dut_console -> /dev/pts/10
//! ```
//!
//! With `--json` the device list is one line:
//! `{"devices":[{"name":"korad","path":"/tmp/bench/korad","pty":"/dev/pts/7"},…]}`.
//! The list is printed once every device is up; then the process runs until
//! SIGINT/SIGTERM (or `quit` on stdin) and removes its symlinks.
//!
//! Control lines on stdin (for tests driving a separate process):
//! `vanish <name|all>`, `reappear <name|all>` (pull/replug the USB cable;
//! answered with the device line, or `{"event":…}` with `--json`),
//! `dut-power on|off` (manual DUT power when not linked), `quit`.
//!
//! With `--journal FILE` every switch frame the LCUS relay board accepts is
//! appended to FILE as one JSON line, `{"device":"lcus","channel":1,
//! "on":true,"changed":true,"at_unix_ms":…}` (wall clock, within about
//! 10 ms), so a test in another process can tell when the hardware acted;
//! so is every command the Korad supply receives, `{"device":"korad",
//! "command":"VSET1:05.00","at_unix_ms":…}` (queries included).

use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Parser;
use edge_agent::devsim::dut_console::{
    DutConsoleConfig, DutConsoleHandle, DutConsoleSim, DutPower,
};
use edge_agent::devsim::grbl::{GrblConfig, GrblSim};
use edge_agent::devsim::korad::{KoradConfig, KoradHandle, KoradSim};
use edge_agent::devsim::lcus::{LcusConfig, LcusHandle, LcusSim};
use edge_agent::devsim::numato::{NumatoConfig, NumatoSim};
use edge_agent::devsim::scpi_psu::{ScpiPsuConfig, ScpiPsuSim};
use edge_agent::devsim::SimulatorControl;
use tokio::io::AsyncBufReadExt;
use tokio::signal::unix::{signal, SignalKind};

/// Simulated serial bench devices on pseudo-terminals.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// Directory for the stable symlinks (created if missing).
    #[arg(long, default_value = "/tmp/benchlink-sim")]
    dir: PathBuf,
    /// Name links like /dev/serial/by-id entries (usb-Korad_KA3005P-if00)
    /// instead of by device kind (korad).
    #[arg(long)]
    by_id: bool,
    /// Korad KA3005P power supply.
    #[arg(long)]
    korad: bool,
    /// Resistive load on the Korad output (Ω); 0 = nothing connected.
    #[arg(long, default_value_t = 100.0)]
    korad_load_ohms: f64,
    /// Rigol DP832-type SCPI power supply.
    #[arg(long)]
    scpi_psu: bool,
    /// LCUS relay board with this many relays (1, 2, 4, 8).
    #[arg(long, value_name = "RELAYS")]
    lcus: Option<u8>,
    /// Numato relay module with this many relays (1, 2, 4, 8, 16, 32).
    #[arg(long, value_name = "RELAYS")]
    numato: Option<u8>,
    /// GRBL 1.1 controller (thumb robot).
    #[arg(long)]
    grbl: bool,
    /// GRBL simulated time runs this many times faster than real time.
    #[arg(long, default_value_t = 1.0)]
    grbl_time_scale: f64,
    /// GRBL travel X,Y,Z in mm (soft limits from 0 to these).
    #[arg(long, value_delimiter = ',', num_args = 3, default_values_t = [100.0, 160.0, 20.0])]
    grbl_travel_mm: Vec<f64>,
    /// Start GRBL without homing lock ($22=0).
    #[arg(long)]
    grbl_no_homing: bool,
    /// Device-under-test serial console.
    #[arg(long)]
    dut_console: bool,
    /// Line the DUT prints before its login prompt.
    #[arg(long, default_value = "Benchlink DUT v0.9.2 ready")]
    dut_banner: String,
    /// Multiplier for the DUT boot-log delays (1.0 ≈ 0.8 s boot).
    #[arg(long, default_value_t = 1.0)]
    dut_pace: f64,
    /// DUT console baud rate (recorded only).
    #[arg(long, default_value_t = 115_200)]
    dut_baud: u32,
    /// Power the DUT from the Korad output (boots when it is on).
    #[arg(long, requires_all = ["korad", "dut_console"])]
    link_dut_to_korad: bool,
    /// Lowest Korad output voltage (V) the DUT runs at.
    #[arg(long, default_value_t = 3.0)]
    dut_threshold_v: f64,
    /// Print the device list (and control replies) as JSON.
    #[arg(long)]
    json: bool,
    /// Append every relay switch frame accepted and every Korad command
    /// received to this file (JSON lines).
    #[arg(long, value_name = "FILE")]
    journal: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut bench = start(&args)?;
    if bench.sims.is_empty() {
        bail!("no device selected; pass e.g. --korad, --lcus 4, --grbl or --dut-console");
    }
    if args.json {
        let devices: Vec<_> = bench.sims.iter().map(|s| device_json(s.as_ref())).collect();
        println!("{}", serde_json::json!({ "devices": devices }));
    } else {
        for s in &bench.sims {
            println!("{}", device_line(s.as_ref()));
        }
    }
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the signal runtime")?;
    rt.block_on(serve(&args, &mut bench))?;
    // Dropping each simulator joins its thread and removes its symlink.
    drop(bench);
    Ok(())
}

/// Link name for a device: by kind, or a /dev/serial/by-id-style name.
fn link_path(args: &Args, kind: &str, by_id: &str) -> PathBuf {
    args.dir.join(if args.by_id { by_id } else { kind })
}

/// The running simulators, and the DUT's manual power switch if it has one.
struct Bench {
    sims: Vec<Box<dyn SimulatorControl>>,
    dut_power: Option<DutConsoleHandle>,
}

fn start(args: &Args) -> anyhow::Result<Bench> {
    let mut sims: Vec<Box<dyn SimulatorControl>> = Vec::new();
    let mut dut_power = None;
    let mut korad_sense = None;
    if args.korad {
        let config = KoradConfig {
            load_ohms: (args.korad_load_ohms > 0.0).then_some(args.korad_load_ohms),
            ..KoradConfig::default()
        };
        let link = link_path(args, "korad", "usb-Korad_KA3005P-if00");
        let sim = KoradSim::start(config, Some(&link)).context("starting korad")?;
        korad_sense = Some(sim.handle().power_sense());
        if let Some(path) = &args.journal {
            journal_korad(sim.handle().clone(), path.clone())?;
        }
        sims.push(Box::new(sim));
    }
    if args.scpi_psu {
        let link = link_path(args, "scpi_psu", "usb-Rigol_DP832-if00");
        let sim = ScpiPsuSim::start(ScpiPsuConfig::default(), Some(&link))
            .context("starting scpi_psu")?;
        sims.push(Box::new(sim));
    }
    if let Some(channels) = args.lcus {
        let config = LcusConfig {
            channels,
            ..LcusConfig::default()
        };
        let link = link_path(args, "lcus", "usb-1a86_USB_Serial-if00-port0");
        let sim = LcusSim::start(config, Some(&link)).context("starting lcus")?;
        if let Some(path) = &args.journal {
            journal_switches(sim.handle().clone(), path.clone())?;
        }
        sims.push(Box::new(sim));
    }
    if let Some(channels) = args.numato {
        let config = NumatoConfig {
            channels,
            ..NumatoConfig::default()
        };
        let link = link_path(args, "numato", "usb-Numato_Lab_Relay_Module-if00");
        sims.push(Box::new(
            NumatoSim::start(config, Some(&link)).context("starting numato")?,
        ));
    }
    if args.grbl {
        let travel = match args.grbl_travel_mm.as_slice() {
            [x, y, z] => [*x, *y, *z],
            _ => bail!("--grbl-travel-mm needs three values X,Y,Z"),
        };
        let config = GrblConfig {
            travel_max_mm: travel,
            time_scale: args.grbl_time_scale,
            homing_enabled: !args.grbl_no_homing,
            ..GrblConfig::default()
        };
        let link = link_path(args, "grbl", "usb-Arduino_Uno_GRBL-if00");
        sims.push(Box::new(
            GrblSim::start(config, Some(&link)).context("starting grbl")?,
        ));
    }
    if args.dut_console {
        let power = match (&korad_sense, args.link_dut_to_korad) {
            (Some(sense), true) => DutPower::Sense {
                sense: sense.clone(),
                threshold_v: args.dut_threshold_v,
            },
            _ => DutPower::Manual,
        };
        let manual = matches!(power, DutPower::Manual);
        let config = DutConsoleConfig {
            banner: args.dut_banner.clone(),
            pace: args.dut_pace,
            baud: args.dut_baud,
            power,
            ..DutConsoleConfig::default()
        };
        let link = link_path(
            args,
            "dut_console",
            "usb-FTDI_FT232R_USB_UART_DUT-if00-port0",
        );
        let sim = DutConsoleSim::start(config, Some(&link)).context("starting dut_console")?;
        if manual {
            dut_power = Some(sim.handle().clone());
        }
        sims.push(Box::new(sim));
    }
    Ok(Bench { sims, dut_power })
}

/// Append each switch frame `lcus` accepts to `path` (see [`journal`]).
///
/// Errors: the file cannot be opened for appending.
fn journal_switches(lcus: LcusHandle, path: PathBuf) -> anyhow::Result<()> {
    journal(
        path,
        "journal",
        move || lcus.snapshot().switches,
        |sw| {
            (
                sw.at,
                serde_json::json!({
                    "device": "lcus",
                    "channel": sw.channel,
                    "on": sw.on,
                    "changed": sw.changed,
                }),
            )
        },
    )
}

/// Append each command the Korad supply `korad` receives to `path` (see
/// [`journal`]).
///
/// Errors: the file cannot be opened for appending.
fn journal_korad(korad: KoradHandle, path: PathBuf) -> anyhow::Result<()> {
    journal(
        path,
        "journal-korad",
        move || korad.snapshot().history,
        |cmd| {
            (
                cmd.received_at,
                serde_json::json!({"device": "korad", "command": cmd.text}),
            )
        },
    )
}

/// From a thread named `name` that looks every 5 ms, append each new entry
/// of `entries()` (a history that only grows) to `path` as one JSON line:
/// `line(entry)`'s object with `at_unix_ms`, the entry's instant turned
/// into wall time. Each line is one write to a file opened for appending,
/// so two journal threads never interleave within a line.
///
/// Errors: the file cannot be opened for appending.
fn journal<T: 'static>(
    path: PathBuf,
    name: &str,
    entries: impl Fn() -> Vec<T> + Send + 'static,
    line: impl Fn(&T) -> (std::time::Instant, serde_json::Value) + Send + 'static,
) -> anyhow::Result<()> {
    use std::io::Write;
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .with_context(|| format!("opening the journal {}", path.display()))?;
    std::thread::Builder::new()
        .name(name.into())
        .spawn(move || {
            let mut written = 0;
            loop {
                let all = entries();
                for e in all.iter().skip(written) {
                    let (when, mut v) = line(e);
                    let ago = std::time::Instant::now().saturating_duration_since(when);
                    let at = chrono::Utc::now()
                        - chrono::Duration::from_std(ago).unwrap_or(chrono::Duration::zero());
                    v["at_unix_ms"] = serde_json::json!(at.timestamp_millis());
                    if file.write_all(format!("{v}\n").as_bytes()).is_err() {
                        return;
                    }
                }
                written = all.len();
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        })
        .with_context(|| format!("starting the {name} thread"))?;
    Ok(())
}

fn device_line(s: &dyn SimulatorControl) -> String {
    format!(
        "{} {} -> {}",
        s.name(),
        s.path().display(),
        s.pty_path().display()
    )
}

fn device_json(s: &dyn SimulatorControl) -> serde_json::Value {
    serde_json::json!({
        "name": s.name(),
        "path": s.path(),
        "pty": s.pty_path(),
        "present": s.is_present(),
    })
}

/// Waits for SIGINT/SIGTERM or `quit`, applying stdin control lines.
async fn serve(args: &Args, bench: &mut Bench) -> anyhow::Result<()> {
    let mut sigint = signal(SignalKind::interrupt()).context("installing SIGINT handler")?;
    let mut sigterm = signal(SignalKind::terminate()).context("installing SIGTERM handler")?;
    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut stdin_open = true;
    loop {
        tokio::select! {
            _ = sigint.recv() => return Ok(()),
            _ = sigterm.recv() => return Ok(()),
            line = stdin.next_line(), if stdin_open => match line {
                Ok(Some(line)) => {
                    if line.trim() == "quit" {
                        return Ok(());
                    }
                    control(args, bench, line.trim());
                }
                // Stdin closed or unreadable (e.g. /dev/null): signals only.
                Ok(None) | Err(_) => stdin_open = false,
            },
        }
    }
}

fn control(args: &Args, bench: &mut Bench, line: &str) {
    let words: Vec<&str> = line.split_whitespace().collect();
    let report = |s: &dyn SimulatorControl, event: &str| {
        if args.json {
            let mut v = device_json(s);
            v["event"] = event.into();
            println!("{v}");
        } else {
            println!("{event} {}", device_line(s));
        }
    };
    let fail = |msg: String| {
        if args.json {
            println!("{}", serde_json::json!({ "error": msg }));
        } else {
            println!("error {msg}");
        }
    };
    match words.as_slice() {
        [op @ ("vanish" | "reappear"), target] => {
            let mut found = false;
            for s in bench
                .sims
                .iter_mut()
                .filter(|s| *target == "all" || s.name() == *target)
            {
                found = true;
                let result = if *op == "vanish" {
                    s.vanish()
                } else {
                    s.reappear().map(|_| ())
                };
                match result {
                    Ok(()) => report(
                        s.as_ref(),
                        if *op == "vanish" {
                            "vanished"
                        } else {
                            "reappeared"
                        },
                    ),
                    Err(e) => fail(format!("{} {}: {e}", op, s.name())),
                }
            }
            if !found {
                fail(format!("no device named {target}"));
            }
        }
        ["dut-power", state @ ("on" | "off")] => {
            if let Some(dut) = &bench.dut_power {
                dut.set_power(*state == "on");
                if args.json {
                    println!(
                        "{}",
                        serde_json::json!({ "event": "dut_power", "on": *state == "on" })
                    );
                } else {
                    println!("dut-power {state}");
                }
            } else {
                fail("no manually powered dut_console running".to_string());
            }
        }
        [] => {}
        _ => fail(format!("unknown command: {line}")),
    }
}
