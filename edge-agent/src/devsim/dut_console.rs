//! Serial console of a device under test (an embedded Linux board) behind a
//! USB-UART adapter.
//!
//! Wire format: plain text, lines end with `\r\n`, 115200 8N1 by default
//! (the baud rate is only recorded; a pty has none).
//!
//! When the board gets power it prints a boot log line by line with
//! realistic pacing (about 0.8 s in all at `pace = 1.0`): U-Boot SPL and
//! U-Boot lines, `Starting kernel ...`, kernel lines with `[    0.000000]`
//! timestamps, init lines, then the configured banner (e.g.
//! `Benchlink DUT v0.9.2 ready`) and `<hostname> login: ` (no newline).
//! Input typed before the login prompt is discarded.
//!
//! At the login prompt any user name logs in (no password) and the shell
//! prompt `root@<hostname>:~# ` follows. Typed characters are echoed, Enter
//! (`\r`, `\n` or `\r\n`) echoes `\r\n`; backspace erases. Shell commands:
//! `uname [-a|-r|-n]`, `cat /etc/version`, `hostname`, `echo …`, `reboot`
//! (prints `reboot: Restarting system` and boots again), `exit`/`logout`
//! (back to the login prompt); anything else prints
//! `-sh: <cmd>: not found`.
//!
//! Power comes from [`DutPower`]: a manual switch on the handle, or a
//! [`PowerSense`] (e.g. a simulated Korad PSU's output) compared against a
//! threshold. Losing power silences the console at once (a line in flight
//! is cut); regaining it boots again. The console adapter vanishing
//! ([`super::Simulator::vanish`]) does not affect the board.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{lock, DevSimError, Device, PowerSense, Simulator};

/// Where the simulated board gets its power.
#[derive(Clone)]
pub enum DutPower {
    /// Switched with [`DutConsoleHandle::set_power`]; starts off.
    Manual,
    /// On while `sense()` reads at least `threshold_v` volts.
    Sense {
        /// Supply voltage reading (V), e.g. [`super::korad::KoradHandle::power_sense`].
        sense: PowerSense,
        /// Lowest voltage (V) the board runs at.
        threshold_v: f64,
    },
}

impl std::fmt::Debug for DutPower {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DutPower::Manual => f.write_str("Manual"),
            DutPower::Sense { threshold_v, .. } => {
                write!(f, "Sense {{ threshold_v: {threshold_v} }}")
            }
        }
    }
}

/// Settings of a simulated DUT console.
#[derive(Debug, Clone)]
pub struct DutConsoleConfig {
    /// Line printed after init, before the login prompt.
    pub banner: String,
    /// Host name in the login and shell prompts and `uname -n`.
    pub hostname: String,
    /// Contents of `/etc/version`.
    pub version: String,
    /// Kernel release for `uname -r` and the boot log.
    pub kernel_release: String,
    /// Console baud rate; recorded only.
    pub baud: u32,
    /// Multiplies every boot-log delay (1.0 ≈ 0.8 s boot; 0.1 ≈ 80 ms). Must be ≥ 0.
    pub pace: f64,
    /// Power source.
    pub power: DutPower,
}

impl Default for DutConsoleConfig {
    fn default() -> Self {
        DutConsoleConfig {
            banner: "Benchlink DUT v0.9.2 ready".to_string(),
            hostname: "benchlink-dut".to_string(),
            version: "0.9.2".to_string(),
            kernel_release: "5.15.92-benchlink".to_string(),
            baud: 115_200,
            pace: 1.0,
            power: DutPower::Manual,
        }
    }
}

/// What the board is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DutPhase {
    /// No power; the console is silent.
    Off,
    /// Printing the boot log.
    Booting,
    /// `login:` prompt shown.
    Login,
    /// Logged in at the shell prompt.
    Shell,
}

/// Snapshot of a simulated DUT console.
#[derive(Debug, Clone, PartialEq)]
pub struct DutConsoleState {
    /// Current phase.
    pub phase: DutPhase,
    /// Configured console baud rate.
    pub baud: u32,
    /// Boots started (power-ons and reboots).
    pub boots: u32,
    /// When the current boot started (power applied or reboot).
    pub boot_started_at: Option<Instant>,
    /// When the current boot reached the login prompt.
    pub ready_at: Option<Instant>,
    /// Every line the board printed, oldest first (printed whether or not
    /// anybody had the port open).
    pub printed: Vec<(Instant, String)>,
    /// Every shell command line entered, oldest first.
    pub commands: Vec<(Instant, String)>,
}

/// Shared view and power switch of a running DUT console simulator.
#[derive(Debug, Clone)]
pub struct DutConsoleHandle {
    state: Arc<Mutex<DutConsoleState>>,
    manual_power: Arc<AtomicBool>,
}

impl DutConsoleHandle {
    /// A copy of the current state.
    pub fn snapshot(&self) -> DutConsoleState {
        lock(&self.state).clone()
    }

    /// Switches power with [`DutPower::Manual`]; no effect with a sensed supply.
    pub fn set_power(&self, on: bool) {
        self.manual_power.store(on, Ordering::Relaxed);
    }
}

/// A running DUT console simulator.
pub type DutConsoleSim = Simulator<DutConsoleHandle>;

impl Simulator<DutConsoleHandle> {
    /// Starts a DUT console (unpowered until its [`DutPower`] says so).
    ///
    /// Errors: [`DevSimError::Config`] (`pace`) for a negative or
    /// non-finite pace; otherwise see [`Simulator::spawn`].
    pub fn start(
        config: DutConsoleConfig,
        link: Option<&std::path::Path>,
    ) -> Result<DutConsoleSim, DevSimError> {
        if !(config.pace >= 0.0 && config.pace.is_finite()) {
            return Err(DevSimError::Config {
                field: "pace",
                reason: format!("must be a non-negative number, not {}", config.pace),
            });
        }
        let state = Arc::new(Mutex::new(DutConsoleState {
            phase: DutPhase::Off,
            baud: config.baud,
            boots: 0,
            boot_started_at: None,
            ready_at: None,
            printed: Vec::new(),
            commands: Vec::new(),
        }));
        let manual_power = Arc::new(AtomicBool::new(false));
        let handle = DutConsoleHandle {
            state: state.clone(),
            manual_power: manual_power.clone(),
        };
        let device = DutConsole {
            config,
            state,
            manual_power,
            phase: DutPhase::Off,
            script: VecDeque::new(),
            line: String::new(),
            last_cr: false,
            out: Vec::new(),
        };
        Simulator::spawn("dut_console", device, handle, link)
    }
}

/// Boot log: (delay before the line in ms at pace 1.0, text).
fn boot_log(c: &DutConsoleConfig) -> Vec<(u64, String)> {
    let k = &c.kernel_release;
    let lines: Vec<(u64, &str)> = vec![
        (120, ""),
        (5, "U-Boot SPL 2022.04 (Oct 14 2026 - 09:12:40 +0000)"),
        (5, "DRAM: 512 MiB"),
        (10, "Trying to boot from MMC1"),
        (60, ""),
        (5, "U-Boot 2022.04 (Oct 14 2026 - 09:12:40 +0000) Benchlink"),
        (5, ""),
        (5, "CPU:   Allwinner H3 (SUN8I 1680)"),
        (5, "Model: Benchlink DUT rev B"),
        (5, "DRAM:  512 MiB"),
        (20, "MMC:   mmc@1c0f000: 0"),
        (10, "Loading Environment from FAT... OK"),
        (5, "In:    serial"),
        (2, "Out:   serial"),
        (2, "Err:   serial"),
        (10, "Net:   No ethernet found."),
        (5, "Hit any key to stop autoboot:  0"),
        (40, "switch to partitions #0, OK"),
        (5, "mmc0 is current device"),
        (10, "Scanning mmc 0:1..."),
        (10, "Found U-Boot script /boot.scr"),
        (5, "2856 bytes read in 2 ms (1.4 MiB/s)"),
        (5, "## Executing script at 43100000"),
        (60, "7012272 bytes read in 345 ms (19.4 MiB/s)"),
        (10, "Starting kernel ..."),
        (5, ""),
        (60, "[    0.000000] Booting Linux on physical CPU 0x0"),
    ];
    let mut out: Vec<(u64, String)> = lines.into_iter().map(|(d, s)| (d, s.to_string())).collect();
    let kernel = [
        (2, format!("[    0.000000] Linux version {k} (builder@benchlink) (arm-linux-gnueabihf-gcc 12.2.0) #1 SMP PREEMPT")),
        (2, "[    0.000000] CPU: ARMv7 Processor [410fc075] revision 5 (ARMv7), cr=10c5387d".to_string()),
        (2, "[    0.000000] Machine model: Benchlink DUT rev B".to_string()),
        (3, "[    0.000000] Memory: 496532K/524288K available".to_string()),
        (8, "[    0.012384] Console: colour dummy device 80x30".to_string()),
        (20, "[    0.104211] mmc0: new high speed SDHC card at address aaaa".to_string()),
        (40, "[    1.203317] EXT4-fs (mmcblk0p2): mounted filesystem with ordered data mode".to_string()),
        (20, "[    1.410245] Run /sbin/init as init process".to_string()),
        (60, "Starting syslogd: OK".to_string()),
        (30, "Starting network: OK".to_string()),
        (20, String::new()),
        (5, c.banner.clone()),
        (2, String::new()),
    ];
    out.extend(kernel);
    out
}

struct DutConsole {
    config: DutConsoleConfig,
    state: Arc<Mutex<DutConsoleState>>,
    manual_power: Arc<AtomicBool>,
    phase: DutPhase,
    /// Boot lines still to print, with their due time; `None` text = the
    /// login prompt.
    script: VecDeque<(Instant, Option<String>)>,
    line: String,
    last_cr: bool,
    out: Vec<u8>,
}

impl DutConsole {
    fn powered(&self) -> bool {
        match &self.config.power {
            DutPower::Manual => self.manual_power.load(Ordering::Relaxed),
            DutPower::Sense { sense, threshold_v } => sense() >= *threshold_v,
        }
    }

    fn boot(&mut self, now: Instant) {
        self.script.clear();
        self.line.clear();
        let mut at = now;
        for (delay_ms, text) in boot_log(&self.config) {
            at += Duration::from_secs_f64(delay_ms as f64 / 1000.0 * self.config.pace);
            self.script.push_back((at, Some(text)));
        }
        self.script.push_back((at, None));
        self.phase = DutPhase::Booting;
        let mut st = lock(&self.state);
        st.phase = DutPhase::Booting;
        st.boots += 1;
        st.boot_started_at = Some(now);
        st.ready_at = None;
    }

    fn power_lost(&mut self) {
        self.script.clear();
        self.line.clear();
        self.out.clear();
        self.phase = DutPhase::Off;
        let mut st = lock(&self.state);
        st.phase = DutPhase::Off;
        st.ready_at = None;
    }

    fn set_phase(&mut self, phase: DutPhase) {
        self.phase = phase;
        lock(&self.state).phase = phase;
    }

    fn prompt(&mut self) {
        let p = match self.phase {
            DutPhase::Login => format!("{} login: ", self.config.hostname),
            _ => format!("root@{}:~# ", self.config.hostname),
        };
        self.out.extend_from_slice(p.as_bytes());
    }

    fn println(&mut self, s: &str) {
        self.out.extend_from_slice(s.as_bytes());
        self.out.extend_from_slice(b"\r\n");
    }

    fn enter(&mut self, now: Instant) {
        let line = std::mem::take(&mut self.line);
        let line = line.trim();
        self.out.extend_from_slice(b"\r\n");
        if self.phase == DutPhase::Login {
            if !line.is_empty() {
                self.set_phase(DutPhase::Shell);
            }
            self.prompt();
            return;
        }
        if !line.is_empty() {
            lock(&self.state).commands.push((now, line.to_string()));
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let c = &self.config;
        let reply: Option<String> = match words.as_slice() {
            [] => None,
            ["uname"] => Some("Linux".into()),
            ["uname", "-a"] => Some(format!(
                "Linux {} {} #1 SMP PREEMPT Tue Oct 14 09:20:11 UTC 2026 armv7l GNU/Linux",
                c.hostname, c.kernel_release
            )),
            ["uname", "-r"] => Some(c.kernel_release.clone()),
            ["uname", "-n"] | ["hostname"] => Some(c.hostname.clone()),
            ["cat", "/etc/version"] => Some(c.version.clone()),
            ["cat", f] => Some(format!("cat: can't open '{f}': No such file or directory")),
            ["echo", rest @ ..] => Some(rest.join(" ")),
            ["exit"] | ["logout"] => {
                self.set_phase(DutPhase::Login);
                self.out.extend_from_slice(b"\r\n");
                self.prompt();
                return;
            }
            ["reboot"] => {
                self.println("reboot: Restarting system");
                self.boot(now);
                return;
            }
            [cmd, ..] => Some(format!("-sh: {cmd}: not found")),
        };
        if let Some(r) = reply {
            self.println(&r);
        }
        self.prompt();
    }
}

impl Device for DutConsole {
    fn receive(&mut self, bytes: &[u8], now: Instant) {
        if !matches!(self.phase, DutPhase::Login | DutPhase::Shell) {
            return; // unpowered or still booting: keystrokes are lost
        }
        for &b in bytes {
            let was_cr = std::mem::replace(&mut self.last_cr, b == b'\r');
            match b {
                b'\n' if was_cr => {}
                b'\r' | b'\n' => self.enter(now),
                0x08 | 0x7f if self.line.pop().is_some() => {
                    self.out.extend_from_slice(b"\x08 \x08");
                }
                0x08 | 0x7f => {}
                0x20..=0x7e if self.line.len() < 256 => {
                    self.line.push(char::from(b));
                    self.out.push(b);
                }
                _ => {}
            }
            if self.phase == DutPhase::Booting {
                return; // `reboot` was typed
            }
        }
    }

    fn poll(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<Instant> {
        let powered = self.powered();
        match (self.phase, powered) {
            (DutPhase::Off, true) => self.boot(now),
            (DutPhase::Off, false) => return None,
            (_, false) => {
                self.power_lost();
                return None;
            }
            _ => {}
        }
        while self.script.front().is_some_and(|(t, _)| *t <= now) {
            let Some((at, text)) = self.script.pop_front() else {
                break;
            };
            match text {
                Some(text) => {
                    self.println(&text);
                    lock(&self.state).printed.push((at, text));
                }
                None => {
                    self.set_phase(DutPhase::Login);
                    lock(&self.state).ready_at = Some(at);
                    self.prompt();
                }
            }
        }
        out.append(&mut self.out);
        self.script.front().map(|(t, _)| *t)
    }
}
