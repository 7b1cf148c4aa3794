//! Korad KA3005P-family bench PSU (also sold as Tenma 72-2540, RND 320-KA3005P).
//!
//! Wire format, 9600 8N1 (the pty ignores the baud rate):
//! - Commands are plain ASCII with **no terminator**; the unit splits them by
//!   syntax and by silence. The simulator also accepts `\n` or `\r\n` after
//!   a command. Upper case as shown; lower case is accepted.
//! - Replies have **no terminator** either; read with a timeout or by length.
//! - The real unit needs about 50 ms per command. The simulator executes
//!   each command [`KoradConfig::processing_delay`] after it was received
//!   (queued behind the previous one), so a reply arrives that late.
//!
//! | command | reply | meaning |
//! |---|---|---|
//! | `*IDN?` | `KORADKA3005PV2.0` | identity |
//! | `VSET1:12.00` | — | set voltage (V), 0..=30, 10 mV steps |
//! | `VSET1?` | `12.00` | voltage setpoint, always `dd.dd` (`05.00`) |
//! | `ISET1:1.500` | — | set current limit (A), 0..=5, 1 mA steps |
//! | `ISET1?` | `1.500` | current limit, always `d.ddd` |
//! | `VOUT1?` | `12.00` | measured output voltage |
//! | `IOUT1?` | `0.120` | measured output current |
//! | `OUT1` / `OUT0` | — | output on / off |
//! | `STATUS?` | one byte | bit 0: 1 = CV, 0 = CC; bit 4: beep on; bit 5: panel unlocked; bit 6: output on |
//!
//! Out-of-range setpoints and unknown commands are ignored without a reply,
//! like the real unit; the command history records them as ignored.
//!
//! Output model: off → VOUT = IOUT = 0. On, with a resistive load of
//! `load_ohms` (none = open circuit): if VSET / R ≤ ISET the unit is in
//! constant voltage (VOUT = VSET, IOUT = VSET / R); otherwise constant
//! current (IOUT = ISET, VOUT = ISET · R).
//!
//! The PSU is mains-powered: pulling its USB cable
//! ([`super::Simulator::vanish`]) leaves the output as it was.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{lock, DevSimError, Device, PowerSense, Simulator};

/// Reply to `*IDN?` of a KA3005P with firmware 2.0.
pub const KORAD_IDN: &str = "KORADKA3005PV2.0";

/// Settings of a simulated Korad PSU.
#[derive(Debug, Clone)]
pub struct KoradConfig {
    /// Reply to `*IDN?`.
    pub idn: String,
    /// Highest accepted `VSET1` (V); 30 for the KA3005P.
    pub max_voltage_v: f64,
    /// Highest accepted `ISET1` (A); 5 for the KA3005P.
    pub max_current_a: f64,
    /// Time the unit takes per command; replies come this late (default 50 ms).
    pub processing_delay: Duration,
    /// When true, a command that arrives while the previous one is still
    /// being processed is dropped (recorded as [`KoradOutcome::DroppedBusy`]),
    /// which is what a real unit does to drivers that do not pace commands.
    pub drop_when_busy: bool,
    /// Silence after which an unterminated command such as `VSET1:5` is
    /// taken as complete (default 20 ms).
    pub idle_gap: Duration,
    /// Resistive load on the output (Ω); `None` = nothing connected.
    pub load_ohms: Option<f64>,
    /// Voltage setpoint at power-up (V); the real unit recalls its last one.
    pub initial_vset_v: f64,
    /// Current limit at power-up (A).
    pub initial_iset_a: f64,
}

impl Default for KoradConfig {
    fn default() -> Self {
        KoradConfig {
            idn: KORAD_IDN.to_string(),
            max_voltage_v: 30.0,
            max_current_a: 5.0,
            processing_delay: Duration::from_millis(50),
            drop_when_busy: false,
            idle_gap: Duration::from_millis(20),
            load_ohms: Some(100.0),
            initial_vset_v: 0.0,
            initial_iset_a: 1.0,
        }
    }
}

/// What became of one received command.
#[derive(Debug, Clone, PartialEq)]
pub enum KoradOutcome {
    /// Received, not yet executed (the processing delay has not passed).
    Pending,
    /// A setting changed (setpoint, output).
    Applied,
    /// A query; the reply text that was sent.
    Answered(String),
    /// Unknown command or out-of-range value; no reply, nothing changed.
    Ignored,
    /// Arrived while the unit was busy and [`KoradConfig::drop_when_busy`].
    DroppedBusy,
}

/// One command as the PSU saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct KoradCommand {
    /// The command text, upper-cased, without line terminator (`VSET1:12.00`).
    pub text: String,
    /// When the command was complete on the wire.
    pub received_at: Instant,
    /// When it was executed (None while pending or if dropped).
    pub executed_at: Option<Instant>,
    /// What happened.
    pub outcome: KoradOutcome,
}

/// Regulation mode the output is in (`STATUS?` bit 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegulationMode {
    /// Constant voltage: VOUT = VSET.
    ConstantVoltage,
    /// Constant current: the load would draw more than ISET.
    ConstantCurrent,
}

/// Snapshot of a simulated Korad PSU.
#[derive(Debug, Clone, PartialEq)]
pub struct KoradState {
    /// Output switched on (`OUT1`).
    pub output_on: bool,
    /// Voltage setpoint (V).
    pub vset_v: f64,
    /// Current limit (A).
    pub iset_a: f64,
    /// Load on the output (Ω), `None` = open circuit.
    pub load_ohms: Option<f64>,
    /// Every command received, oldest first.
    pub history: Vec<KoradCommand>,
}

impl KoradState {
    /// Measured output voltage (V) and current (A) and the regulation mode,
    /// from the load model in the module doc.
    pub fn output(&self) -> (f64, f64, RegulationMode) {
        if !self.output_on {
            return (0.0, 0.0, RegulationMode::ConstantVoltage);
        }
        match self.load_ohms {
            Some(r) if r > 0.0 && self.vset_v / r > self.iset_a => (
                self.iset_a * r,
                self.iset_a,
                RegulationMode::ConstantCurrent,
            ),
            Some(r) if r > 0.0 => (
                self.vset_v,
                self.vset_v / r,
                RegulationMode::ConstantVoltage,
            ),
            // A dead short always current-limits.
            Some(_) => (0.0, self.iset_a, RegulationMode::ConstantCurrent),
            None => (self.vset_v, 0.0, RegulationMode::ConstantVoltage),
        }
    }

    /// The `STATUS?` byte.
    pub fn status_byte(&self) -> u8 {
        let (_, _, mode) = self.output();
        let mut b = 0b0011_0000; // beep on, panel unlocked
        if mode == RegulationMode::ConstantVoltage {
            b |= 0b0000_0001;
        }
        if self.output_on {
            b |= 0b0100_0000;
        }
        b
    }
}

/// Shared view of a running Korad simulator.
#[derive(Debug, Clone)]
pub struct KoradHandle {
    state: Arc<Mutex<KoradState>>,
}

impl KoradHandle {
    /// A copy of the current state.
    pub fn snapshot(&self) -> KoradState {
        lock(&self.state).clone()
    }

    /// Changes the load on the output (Ω; `None` = disconnect it).
    pub fn set_load_ohms(&self, load_ohms: Option<f64>) {
        lock(&self.state).load_ohms = load_ohms;
    }

    /// Voltage (V) at the output terminals right now.
    pub fn output_voltage_v(&self) -> f64 {
        lock(&self.state).output().0
    }

    /// A [`PowerSense`] reading this PSU's output voltage, to power a
    /// simulated DUT from it.
    pub fn power_sense(&self) -> PowerSense {
        let state = self.state.clone();
        Arc::new(move || lock(&state).output().0)
    }
}

/// A running Korad simulator.
pub type KoradSim = Simulator<KoradHandle>;

impl Simulator<KoradHandle> {
    /// Starts a Korad PSU (output off, initial setpoints from the config) on a new pty,
    /// with an optional stable symlink. Errors: see [`Simulator::spawn`].
    pub fn start(
        config: KoradConfig,
        link: Option<&std::path::Path>,
    ) -> Result<KoradSim, DevSimError> {
        let state = Arc::new(Mutex::new(KoradState {
            output_on: false,
            vset_v: config.initial_vset_v,
            iset_a: config.initial_iset_a,
            load_ohms: config.load_ohms,
            history: Vec::new(),
        }));
        let device = Korad {
            config,
            state: state.clone(),
            rx: String::new(),
            last_rx: None,
            queue: Vec::new(),
            busy_until: None,
        };
        Simulator::spawn("korad", device, KoradHandle { state }, link)
    }
}

struct Queued {
    execute_at: Instant,
    history_index: usize,
    text: String,
}

struct Korad {
    config: KoradConfig,
    state: Arc<Mutex<KoradState>>,
    rx: String,
    last_rx: Option<Instant>,
    queue: Vec<Queued>,
    busy_until: Option<Instant>,
}

impl Device for Korad {
    fn receive(&mut self, bytes: &[u8], now: Instant) {
        // Non-ASCII bytes cannot be part of any command; keep them so the
        // token they land in is ignored as a whole.
        self.rx.extend(bytes.iter().map(|&b| char::from(b)));
        self.last_rx = Some(now);
        self.split_commands(now, false);
    }

    fn poll(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<Instant> {
        if let Some(last) = self.last_rx {
            if !self.rx.is_empty() && now.duration_since(last) >= self.config.idle_gap {
                self.split_commands(now, true);
            }
        }
        while self.queue.first().is_some_and(|q| q.execute_at <= now) {
            let q = self.queue.remove(0);
            self.execute(q, out);
        }
        let gap_end = self
            .last_rx
            .filter(|_| !self.rx.is_empty())
            .map(|t| t + self.config.idle_gap);
        let next = self.queue.first().map(|q| q.execute_at);
        match (gap_end, next) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

impl Korad {
    /// Takes every complete command off the receive buffer; with `idle`,
    /// whatever is left is complete too (the host went quiet).
    fn split_commands(&mut self, now: Instant, idle: bool) {
        while let Some((cmd, used)) = next_command(&self.rx, idle) {
            self.rx.drain(..used);
            if !cmd.is_empty() {
                self.enqueue(cmd, now);
            }
        }
    }

    fn enqueue(&mut self, text: String, now: Instant) {
        let busy = self.busy_until.is_some_and(|t| t > now);
        let mut st = lock(&self.state);
        let history_index = st.history.len();
        if busy && self.config.drop_when_busy {
            st.history.push(KoradCommand {
                text,
                received_at: now,
                executed_at: None,
                outcome: KoradOutcome::DroppedBusy,
            });
            return;
        }
        st.history.push(KoradCommand {
            text: text.clone(),
            received_at: now,
            executed_at: None,
            outcome: KoradOutcome::Pending,
        });
        let start = self.busy_until.filter(|t| *t > now).unwrap_or(now);
        let execute_at = start + self.config.processing_delay;
        self.busy_until = Some(execute_at);
        self.queue.push(Queued {
            execute_at,
            history_index,
            text,
        });
    }

    fn execute(&mut self, q: Queued, out: &mut Vec<u8>) {
        let mut st = lock(&self.state);
        let outcome = apply(&self.config, &mut st, &q.text);
        if let KoradOutcome::Answered(reply) = &outcome {
            if q.text == "STATUS?" {
                out.push(st.status_byte());
            } else {
                out.extend_from_slice(reply.as_bytes());
            }
        }
        if let Some(h) = st.history.get_mut(q.history_index) {
            // The model's time, not the (up to a poll interval later) poll time.
            h.executed_at = Some(q.execute_at);
            h.outcome = outcome;
        }
    }
}

/// Finds the first complete command in `buf`. Returns the command (upper
/// case, may be empty for pure separators) and how many chars it used.
fn next_command(buf: &str, idle: bool) -> Option<(String, usize)> {
    let lead = buf.len() - buf.trim_start_matches(['\r', '\n', ' ']).len();
    let rest = &buf[lead..];
    if rest.is_empty() {
        return (lead > 0).then(|| (String::new(), lead));
    }
    let sep = rest.find(['\r', '\n']);
    let segment = &rest[..sep.unwrap_or(rest.len())];
    let terminated = sep.is_some() || idle;
    let upper = segment.to_ascii_uppercase();
    let end = if let Some(colon) = setter_colon(&upper) {
        // VSET1:12.00 — the number runs while digits and dots do.
        let digits = upper[colon + 1..]
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .map(|i| colon + 1 + i);
        match digits {
            Some(i) => i,
            None if terminated => upper.len(),
            None => return None,
        }
    } else if let Some(n) = switch_len(&upper) {
        n
    } else if let Some(q) = upper.find('?') {
        q + 1
    } else if terminated {
        upper.len()
    } else {
        return None;
    };
    Some((upper[..end].to_string(), lead + end))
}

/// `VSET1:`-style prefix: letters, one digit, colon. Returns the colon index.
fn setter_colon(s: &str) -> Option<usize> {
    let colon = s.find(':')?;
    let head = &s[..colon];
    let (idx, ch) = head.char_indices().last()?;
    let name = &head[..idx];
    (!name.is_empty() && name.chars().all(|c| c.is_ascii_alphabetic()) && ch.is_ascii_digit())
        .then_some(colon)
}

/// `OUT1`, `BEEP0`, `OCP1`, `OVP0`, `LOCK1`: a word and a 0/1 digit.
fn switch_len(s: &str) -> Option<usize> {
    ["OUT", "BEEP", "OCP", "OVP", "LOCK"].iter().find_map(|w| {
        let tail = s.strip_prefix(w)?;
        tail.starts_with(['0', '1']).then_some(w.len() + 1)
    })
}

fn apply(config: &KoradConfig, st: &mut KoradState, cmd: &str) -> KoradOutcome {
    let answer = |s: String| KoradOutcome::Answered(s);
    match cmd {
        "*IDN?" => answer(config.idn.clone()),
        "VSET1?" => answer(format!("{:05.2}", st.vset_v)),
        "ISET1?" => answer(format!("{:.3}", st.iset_a)),
        "VOUT1?" => answer(format!("{:05.2}", st.output().0)),
        "IOUT1?" => answer(format!("{:.3}", st.output().1)),
        "STATUS?" => answer(format!("{:#04x}", st.status_byte())),
        "OUT1" => {
            st.output_on = true;
            KoradOutcome::Applied
        }
        "OUT0" => {
            st.output_on = false;
            KoradOutcome::Applied
        }
        _ => {
            if let Some(v) = cmd
                .strip_prefix("VSET1:")
                .and_then(|v| v.parse::<f64>().ok())
            {
                if (0.0..=config.max_voltage_v).contains(&v) {
                    st.vset_v = (v * 100.0).round() / 100.0;
                    return KoradOutcome::Applied;
                }
            }
            if let Some(i) = cmd
                .strip_prefix("ISET1:")
                .and_then(|v| v.parse::<f64>().ok())
            {
                if (0.0..=config.max_current_a).contains(&i) {
                    st.iset_a = (i * 1000.0).round() / 1000.0;
                    return KoradOutcome::Applied;
                }
            }
            KoradOutcome::Ignored
        }
    }
}

#[cfg(test)]
mod tests {
    use super::next_command;

    fn split_all(s: &str, idle: bool) -> Vec<String> {
        let mut buf = s.to_string();
        let mut out = Vec::new();
        while let Some((cmd, used)) = next_command(&buf, idle) {
            buf.drain(..used);
            if !cmd.is_empty() {
                out.push(cmd);
            }
        }
        out
    }

    #[test]
    fn back_to_back_commands_without_terminators_are_split_by_syntax() {
        assert_eq!(
            split_all("VSET1:12.00VSET1?OUT1ISET1:1.5", false),
            ["VSET1:12.00", "VSET1?", "OUT1"]
        );
        assert_eq!(
            split_all("OUT1VOUT1?OUT0", false),
            ["OUT1", "VOUT1?", "OUT0"]
        );
        assert_eq!(
            split_all("VSET1:12.00VSET1?OUT1ISET1:1.5", true),
            ["VSET1:12.00", "VSET1?", "OUT1", "ISET1:1.5"]
        );
    }

    #[test]
    fn line_terminated_commands_are_accepted() {
        assert_eq!(
            split_all("vset1:5\r\nOUT1\nBOGUS\n", false),
            ["VSET1:5", "OUT1", "BOGUS"]
        );
    }
}
