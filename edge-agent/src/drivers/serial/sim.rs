//! `sim` backend: an in-process serial console of a simulated device under
//! test (an embedded Linux board), no pty needed.
//!
//! The board boots when it gets power and prints a boot log line by line
//! (U-Boot, kernel, init, the configured `banner`, then `<hostname> login: `)
//! over `boot_ms` milliseconds. Power comes from a named [`PowerRail`]
//! (`power_rail = "dut-main"`) that a simulated PSU or relay of the same
//! bench drives, so "PSU `power_on`, then `expect_pattern` the banner"
//! works with every capability simulated. Without a rail the board boots
//! when the port is first opened. Losing power silences it at once;
//! regaining power boots it again.
//!
//! At the login prompt any user name logs in; the shell answers `echo`,
//! `uname [-a]`, `hostname`, `reboot` and prints `-sh: <cmd>: not found`
//! otherwise. Typed characters are echoed; input while booting is lost.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{check_log_limit, SerialConsole, DEFAULT_LOG_LIMIT_BYTES};
use crate::drivers::transport::{bad_setting, Capture, LinkState, SerialLine};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// How often the console looks at its power rail (ms) while it has one.
const RAIL_POLL: Duration = Duration::from_millis(20);

/// A named simulated supply line inside this process: simulated PSUs and
/// relays set its voltage, simulated devices read it.
#[derive(Debug, Default)]
pub struct PowerRail {
    volts: Mutex<f64>,
}

impl PowerRail {
    /// Voltage on the rail now (V).
    pub fn volts(&self) -> f64 {
        *self.volts.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the rail's voltage (V).
    pub fn set_volts(&self, v: f64) {
        *self.volts.lock().unwrap_or_else(|e| e.into_inner()) = v;
    }
}

/// The process-wide rail called `name` (created at 0 V on first use).
pub fn power_rail(name: &str) -> Arc<PowerRail> {
    static RAILS: OnceLock<Mutex<HashMap<String, Arc<PowerRail>>>> = OnceLock::new();
    let rails = RAILS.get_or_init(|| Mutex::new(HashMap::new()));
    rails
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .entry(name.to_string())
        .or_default()
        .clone()
}

/// Bench TOML settings of `backend = "sim"` for a serial port.
///
/// ```toml
/// port_name = "sim://dut-console"   # shown in metadata
/// baud_rate = 115200
/// banner = "Benchlink DUT v0.9.2 ready"
/// hostname = "benchlink-dut"
/// boot_ms = 800                     # 0..=60000, boot log duration
/// power_rail = "dut-main"           # optional; boots on open without it
/// power_threshold_v = 3.0           # rail voltage the board runs at
/// log_limit_bytes = 1048576
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SimConsoleSettings {
    pub port_name: String,
    pub baud_rate: u32,
    pub banner: String,
    pub hostname: String,
    pub boot_ms: u64,
    pub power_rail: Option<String>,
    pub power_threshold_v: f64,
    pub log_limit_bytes: usize,
}

impl Default for SimConsoleSettings {
    /// The documented defaults.
    fn default() -> Self {
        Self {
            port_name: "sim://dut-console".into(),
            baud_rate: 115_200,
            banner: "Benchlink DUT v0.9.2 ready".into(),
            hostname: "benchlink-dut".into(),
            boot_ms: 800,
            power_rail: None,
            power_threshold_v: 3.0,
            log_limit_bytes: DEFAULT_LOG_LIMIT_BYTES,
        }
    }
}

impl Defaults for SimConsoleSettings {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Off,
    Booting,
    Login,
    Shell,
}

struct Board {
    phase: Phase,
    /// Boot lines still to print with their due time; `None` = the login prompt.
    script: Vec<(Instant, Option<String>)>,
    line: String,
    last_cr: bool,
}

struct Shared {
    board: Mutex<Board>,
    wake: Condvar,
    stop: AtomicBool,
    opened: AtomicBool,
    capture: Arc<Capture>,
    settings: SimConsoleSettings,
    rail: Option<Arc<PowerRail>>,
}

impl Shared {
    fn board(&self) -> MutexGuard<'_, Board> {
        self.board.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn powered(&self) -> bool {
        match &self.rail {
            Some(r) => r.volts() >= self.settings.power_threshold_v,
            None => self.opened.load(Ordering::SeqCst),
        }
    }
}

/// The simulated console; its board runs on one thread.
pub struct SimConsole {
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

impl SimConsole {
    /// Parses and checks the settings and starts the (unpowered) board.
    pub fn from_spec(spec: &DriverSpec) -> Result<Self, DriverConfigError> {
        let s: SimConsoleSettings = spec.parse()?;
        check_log_limit(spec, s.log_limit_bytes)?;
        if s.boot_ms > 60_000 {
            return Err(bad_setting(
                spec,
                "boot_ms",
                format!("{} is outside 0..=60000", s.boot_ms),
            ));
        }
        if !(s.power_threshold_v.is_finite() && s.power_threshold_v > 0.0) {
            return Err(bad_setting(
                spec,
                "power_threshold_v",
                "must be a positive number of volts",
            ));
        }
        if s.power_rail.as_deref().is_some_and(|r| r.trim().is_empty()) {
            return Err(bad_setting(spec, "power_rail", "must not be empty"));
        }
        let capture = Capture::new(s.log_limit_bytes);
        let shared = Arc::new(Shared {
            board: Mutex::new(Board {
                phase: Phase::Off,
                script: Vec::new(),
                line: String::new(),
                last_cr: false,
            }),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            opened: AtomicBool::new(false),
            capture,
            rail: s.power_rail.as_deref().map(power_rail),
            settings: s,
        });
        let runner = shared.clone();
        let thread = std::thread::Builder::new()
            .name("sim-console".into())
            .spawn(move || run_board(&runner))
            .map_err(|e| bad_setting(spec, "backend", format!("cannot start simulator: {e}")))?;
        Ok(Self {
            shared,
            thread: Some(thread),
        })
    }
}

impl Drop for SimConsole {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        {
            let _board = self.shared.board();
            self.shared.wake.notify_all();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl SerialConsole for SimConsole {
    fn port_name(&self) -> String {
        self.shared.settings.port_name.clone()
    }

    fn line(&self) -> SerialLine {
        SerialLine::new(
            self.shared.settings.port_name.clone(),
            self.shared.settings.baud_rate,
        )
    }

    fn open(&mut self) -> Result<(), DriverError> {
        if !self.shared.opened.swap(true, Ordering::SeqCst) {
            self.shared.capture.set_state(LinkState::Open);
            // Taking the lock orders this with the board thread's check.
            let _board = self.shared.board();
            self.shared.wake.notify_all();
        }
        Ok(())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), DriverError> {
        let mut out = Vec::new();
        {
            let mut board = self.shared.board();
            type_bytes(&mut board, &self.shared.settings, bytes, &mut out);
        }
        self.shared.capture.push(&out);
        // `reboot` scheduled a boot log: let the board thread see it.
        self.shared.wake.notify_all();
        Ok(())
    }

    fn capture(&self) -> Arc<Capture> {
        self.shared.capture.clone()
    }

    fn health(&mut self) -> DriverHealth {
        let _ = self.open();
        DriverHealth::healthy()
    }
}

/// The boot log: (ms after power-on at an 800 ms boot, text).
fn boot_lines(s: &SimConsoleSettings) -> Vec<(u64, String)> {
    let mut lines: Vec<(u64, String)> = [
        (120, "U-Boot SPL 2022.04 (Oct 14 2026 - 09:12:40 +0000)"),
        (130, "DRAM: 512 MiB"),
        (
            200,
            "U-Boot 2022.04 (Oct 14 2026 - 09:12:40 +0000) Benchlink",
        ),
        (220, "Model: Benchlink DUT rev B"),
        (260, "Hit any key to stop autoboot:  0"),
        (390, "Starting kernel ..."),
        (450, "[    0.000000] Booting Linux on physical CPU 0x0"),
        (470, "[    0.000000] Machine model: Benchlink DUT rev B"),
        (
            560,
            "[    1.203317] EXT4-fs (mmcblk0p2): mounted filesystem",
        ),
        (600, "[    1.410245] Run /sbin/init as init process"),
        (680, "Starting syslogd: OK"),
        (740, "Starting network: OK"),
    ]
    .into_iter()
    .map(|(t, l)| (t, l.to_string()))
    .collect();
    lines.push((790, s.banner.clone()));
    lines
}

fn start_boot(board: &mut Board, s: &SimConsoleSettings, now: Instant) {
    let scale = s.boot_ms as f64 / 800.0;
    let at = |ms: u64| now + Duration::from_secs_f64(ms as f64 * scale / 1000.0);
    board.script = boot_lines(s)
        .into_iter()
        .map(|(ms, text)| (at(ms), Some(text)))
        .collect();
    board.script.push((at(800), None));
    board.phase = Phase::Booting;
    board.line.clear();
}

fn prompt(board: &Board, s: &SimConsoleSettings, out: &mut Vec<u8>) {
    let p = match board.phase {
        Phase::Login => format!("{} login: ", s.hostname),
        _ => format!("root@{}:~# ", s.hostname),
    };
    out.extend_from_slice(p.as_bytes());
}

/// Applies typed bytes at the login prompt or shell.
fn type_bytes(board: &mut Board, s: &SimConsoleSettings, bytes: &[u8], out: &mut Vec<u8>) {
    for &b in bytes {
        if !matches!(board.phase, Phase::Login | Phase::Shell) {
            return; // unpowered or booting: keystrokes are lost
        }
        let was_cr = std::mem::replace(&mut board.last_cr, b == b'\r');
        match b {
            b'\n' if was_cr => {}
            b'\r' | b'\n' => {
                out.extend_from_slice(b"\r\n");
                let line = std::mem::take(&mut board.line);
                enter(board, s, line.trim(), out);
            }
            0x08 | 0x7f if board.line.pop().is_some() => {
                out.extend_from_slice(b"\x08 \x08");
            }
            0x20..=0x7e if board.line.len() < 256 => {
                board.line.push(char::from(b));
                out.push(b);
            }
            _ => {}
        }
    }
}

fn enter(board: &mut Board, s: &SimConsoleSettings, line: &str, out: &mut Vec<u8>) {
    if board.phase == Phase::Login {
        if !line.is_empty() {
            board.phase = Phase::Shell;
        }
        prompt(board, s, out);
        return;
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let reply = match words.as_slice() {
        [] => None,
        ["echo", rest @ ..] => Some(rest.join(" ")),
        ["uname"] => Some("Linux".to_string()),
        ["uname", "-a"] => Some(format!(
            "Linux {} 5.15.92-benchlink #1 SMP PREEMPT armv7l GNU/Linux",
            s.hostname
        )),
        ["hostname"] => Some(s.hostname.clone()),
        ["reboot"] => {
            out.extend_from_slice(b"reboot: Restarting system\r\n");
            start_boot(board, s, Instant::now());
            return;
        }
        [cmd, ..] => Some(format!("-sh: {cmd}: not found")),
    };
    if let Some(r) = reply {
        out.extend_from_slice(r.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    prompt(board, s, out);
}

/// The board's clock: boots on power, prints due lines, goes quiet on
/// power loss.
fn run_board(shared: &Shared) {
    let s = &shared.settings;
    let mut board = shared.board();
    while !shared.stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let powered = shared.powered();
        match (board.phase, powered) {
            (Phase::Off, true) => start_boot(&mut board, s, now),
            (Phase::Off, false) => {}
            (_, false) => {
                board.phase = Phase::Off;
                board.script.clear();
                board.line.clear();
            }
            _ => {}
        }
        let mut out = Vec::new();
        while board.script.first().is_some_and(|(t, _)| *t <= now) {
            let (_, text) = board.script.remove(0);
            match text {
                Some(text) => {
                    out.extend_from_slice(text.as_bytes());
                    out.extend_from_slice(b"\r\n");
                }
                None => {
                    board.phase = Phase::Login;
                    prompt(&board, s, &mut out);
                }
            }
        }
        if !out.is_empty() {
            shared.capture.push(&out);
        }
        let next_line = board.script.first().map(|(t, _)| *t);
        let mut nap = next_line.map_or(Duration::from_secs(3600), |t| {
            t.saturating_duration_since(Instant::now())
        });
        if shared.rail.is_some() {
            nap = nap.min(RAIL_POLL);
        }
        board = shared
            .wake
            .wait_timeout(board, nap)
            .unwrap_or_else(|e| e.into_inner())
            .0;
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<SimConsoleSettings>(
            serde_json::json!({}),
            "SimConsoleSettings { port_name: \"sim://dut-console\", baud_rate: 115200, banner: \"Benchlink DUT v0.9.2 ready\", hostname: \"benchlink-dut\", boot_ms: 800, power_rail: None, power_threshold_v: 3.0, log_limit_bytes: 1048576 }",
        );
    }
}
