//! Rigol DP800-type (DP832) three-channel SCPI power supply.
//!
//! Wire format: one SCPI command per line, terminated by `\n` (`\r\n` is
//! accepted); several commands may share a line separated by `;` (each is
//! taken from the root). Headers are case-insensitive, in short (`VOLT`) or
//! long (`VOLTage`) form, the leading `:` optional. Replies end with `\n`
//! and come [`ScpiPsuConfig::processing_delay`] after the command.
//!
//! | command | reply |
//! |---|---|
//! | `*IDN?` | `RIGOL TECHNOLOGIES,DP832,DP8C000000001,00.01.16` |
//! | `*RST` / `*CLS` / `*OPC?` | — / — / `1` |
//! | `:INST CH2` (`:INST:SEL`) / `:INST?` | — / `CH2` |
//! | `:INST:NSEL 2` / `:INST:NSEL?` | — / `2` |
//! | `:VOLT 5` / `:VOLT?` | — / `5.000` (selected channel, V) |
//! | `:CURR 0.5` / `:CURR?` | — / `0.500` (selected channel, A) |
//! | `:APPL CH1,5,0.5` / `:APPL? CH1` | — / `CH1:30V/3A,5.000,0.500` |
//! | `:OUTP CH1,ON` (`:OUTP ON` = selected) / `:OUTP? CH1` | — / `ON` or `OFF` |
//! | `:MEAS:VOLT? CH1` (`:MEAS?`) / `:MEAS:CURR? CH1` | `5.0000` / `0.0500` |
//! | `:MEAS:POWE? CH1` / `:MEAS:ALL? CH1` | `0.2500` / `5.0000,0.0500,0.2500` |
//! | `:SYST:ERR?` | `0,"No error"` or the oldest queued error |
//!
//! Errors go to a queue of up to 20 entries read (oldest first) with
//! `:SYST:ERR?`: `-113,"Undefined header"`, `-109,"Missing parameter"`,
//! `-104,"Data type error"`, `-222,"Data out of range"`,
//! `-224,"Illegal parameter value"`, `-350,"Queue overflow"`.
//!
//! Measured values follow the same resistive-load model as
//! [`super::korad`]: constant voltage until VSET / R exceeds ISET, then
//! constant current.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{lock, DevSimError, Device, PowerSense, Simulator};

/// Reply to `*IDN?`.
pub const DP832_IDN: &str = "RIGOL TECHNOLOGIES,DP832,DP8C000000001,00.01.16";

/// Length of the SCPI error queue, as on the DP800.
const ERROR_QUEUE_LEN: usize = 20;

/// Rating of one output channel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ChannelRating {
    /// Highest settable voltage (V).
    pub max_voltage_v: f64,
    /// Highest settable current (A).
    pub max_current_a: f64,
}

/// Settings of a simulated SCPI PSU.
#[derive(Debug, Clone)]
pub struct ScpiPsuConfig {
    /// Reply to `*IDN?`.
    pub idn: String,
    /// One entry per channel (CH1 first); DP832: 30 V/3 A, 30 V/3 A, 5 V/3 A.
    pub channels: Vec<ChannelRating>,
    /// Resistive load per channel (Ω, `None` = open); missing entries = open.
    pub load_ohms: Vec<Option<f64>>,
    /// Delay from a complete command line to its reply (default 5 ms).
    pub processing_delay: Duration,
}

impl Default for ScpiPsuConfig {
    fn default() -> Self {
        let r = |v, a| ChannelRating {
            max_voltage_v: v,
            max_current_a: a,
        };
        ScpiPsuConfig {
            idn: DP832_IDN.to_string(),
            channels: vec![r(30.0, 3.0), r(30.0, 3.0), r(5.0, 3.0)],
            load_ohms: vec![Some(100.0), Some(100.0), Some(100.0)],
            processing_delay: Duration::from_millis(5),
        }
    }
}

/// One output channel's state.
#[derive(Debug, Clone, PartialEq)]
pub struct ScpiChannel {
    /// Rating of this channel.
    pub rating: ChannelRating,
    /// Voltage setpoint (V).
    pub vset_v: f64,
    /// Current limit (A).
    pub iset_a: f64,
    /// Output switched on.
    pub output_on: bool,
    /// Load (Ω), `None` = open circuit.
    pub load_ohms: Option<f64>,
}

impl ScpiChannel {
    /// Measured voltage (V) and current (A) at the terminals.
    pub fn measure(&self) -> (f64, f64) {
        if !self.output_on {
            return (0.0, 0.0);
        }
        match self.load_ohms {
            Some(r) if r > 0.0 && self.vset_v / r > self.iset_a => (self.iset_a * r, self.iset_a),
            Some(r) if r > 0.0 => (self.vset_v, self.vset_v / r),
            Some(_) => (0.0, self.iset_a),
            None => (self.vset_v, 0.0),
        }
    }
}

/// One command line segment as the PSU saw it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScpiCommand {
    /// The command as received, trimmed (`:VOLT 5`).
    pub text: String,
    /// When its line was complete.
    pub received_at: Instant,
    /// The reply sent, for queries.
    pub reply: Option<String>,
    /// The SCPI error code it raised, if any (e.g. -113).
    pub error: Option<i32>,
}

/// Snapshot of a simulated SCPI PSU.
#[derive(Debug, Clone, PartialEq)]
pub struct ScpiPsuState {
    /// CH1 first.
    pub channels: Vec<ScpiChannel>,
    /// Index of the channel `:INST` selected (0 = CH1).
    pub selected: usize,
    /// Unread errors, oldest first: (code, message).
    pub errors: VecDeque<(i32, String)>,
    /// Every command received, oldest first.
    pub history: Vec<ScpiCommand>,
}

/// Shared view of a running SCPI PSU simulator.
#[derive(Debug, Clone)]
pub struct ScpiPsuHandle {
    state: Arc<Mutex<ScpiPsuState>>,
}

impl ScpiPsuHandle {
    /// A copy of the current state.
    pub fn snapshot(&self) -> ScpiPsuState {
        lock(&self.state).clone()
    }

    /// Changes the load on channel `channel` (1-based; out of range is ignored).
    pub fn set_load_ohms(&self, channel: usize, load_ohms: Option<f64>) {
        if let Some(ch) = lock(&self.state).channels.get_mut(channel.wrapping_sub(1)) {
            ch.load_ohms = load_ohms;
        }
    }

    /// A [`PowerSense`] reading channel `channel`'s (1-based) output voltage.
    pub fn power_sense(&self, channel: usize) -> PowerSense {
        let state = self.state.clone();
        Arc::new(move || {
            lock(&state)
                .channels
                .get(channel.wrapping_sub(1))
                .map_or(0.0, |c| c.measure().0)
        })
    }
}

/// A running SCPI PSU simulator.
pub type ScpiPsuSim = Simulator<ScpiPsuHandle>;

impl Simulator<ScpiPsuHandle> {
    /// Starts a SCPI PSU (all outputs off, setpoints 0) on a new pty.
    ///
    /// Errors: [`DevSimError::Config`] (`channels`) when no channel is
    /// configured; otherwise see [`Simulator::spawn`].
    pub fn start(
        config: ScpiPsuConfig,
        link: Option<&std::path::Path>,
    ) -> Result<ScpiPsuSim, DevSimError> {
        if config.channels.is_empty() {
            return Err(DevSimError::Config {
                field: "channels",
                reason: "at least one channel is needed".into(),
            });
        }
        let channels = config
            .channels
            .iter()
            .enumerate()
            .map(|(i, &rating)| ScpiChannel {
                rating,
                vset_v: 0.0,
                iset_a: 0.0,
                output_on: false,
                load_ohms: config.load_ohms.get(i).copied().flatten(),
            })
            .collect();
        let state = Arc::new(Mutex::new(ScpiPsuState {
            channels,
            selected: 0,
            errors: VecDeque::new(),
            history: Vec::new(),
        }));
        let device = ScpiPsu {
            config,
            state: state.clone(),
            line: Vec::new(),
            replies: VecDeque::new(),
        };
        Simulator::spawn("scpi_psu", device, ScpiPsuHandle { state }, link)
    }
}

struct ScpiPsu {
    config: ScpiPsuConfig,
    state: Arc<Mutex<ScpiPsuState>>,
    line: Vec<u8>,
    replies: VecDeque<(Instant, String)>,
}

impl Device for ScpiPsu {
    fn receive(&mut self, bytes: &[u8], now: Instant) {
        for &b in bytes {
            if b == b'\n' {
                let line = String::from_utf8_lossy(&self.line).trim().to_string();
                self.line.clear();
                for cmd in line.split(';').map(str::trim).filter(|c| !c.is_empty()) {
                    self.execute(cmd, now);
                }
            } else if self.line.len() < 4096 {
                self.line.push(b);
            }
        }
    }

    fn poll(&mut self, now: Instant, out: &mut Vec<u8>) -> Option<Instant> {
        while self.replies.front().is_some_and(|(t, _)| *t <= now) {
            if let Some((_, r)) = self.replies.pop_front() {
                out.extend_from_slice(r.as_bytes());
                out.push(b'\n');
            }
        }
        self.replies.front().map(|(t, _)| *t)
    }
}

/// An SCPI error: code and standard message.
type ScpiError = (i32, &'static str);
const UNDEFINED_HEADER: ScpiError = (-113, "Undefined header");
const MISSING_PARAMETER: ScpiError = (-109, "Missing parameter");
const DATA_TYPE: ScpiError = (-104, "Data type error");
const OUT_OF_RANGE: ScpiError = (-222, "Data out of range");
const ILLEGAL_VALUE: ScpiError = (-224, "Illegal parameter value");

impl ScpiPsu {
    fn execute(&mut self, text: &str, now: Instant) {
        let mut st = lock(&self.state);
        let result = run_command(&self.config, &mut st, text);
        let (reply, error) = match result {
            Ok(reply) => (reply, None),
            Err((code, msg)) => {
                if st.errors.len() >= ERROR_QUEUE_LEN {
                    if let Some(last) = st.errors.back_mut() {
                        *last = (-350, "Queue overflow".to_string());
                    }
                } else {
                    st.errors.push_back((code, msg.to_string()));
                }
                (None, Some(code))
            }
        };
        st.history.push(ScpiCommand {
            text: text.to_string(),
            received_at: now,
            reply: reply.clone(),
            error,
        });
        if let Some(r) = reply {
            let after = self.replies.back().map_or(now, |(t, _)| (*t).max(now));
            self.replies
                .push_back((after + self.config.processing_delay, r));
        }
    }
}

/// Known header words: (short form, long form).
const MNEMONICS: &[(&str, &str)] = &[
    ("INST", "INSTRUMENT"),
    ("SEL", "SELECT"),
    ("NSEL", "NSELECT"),
    ("VOLT", "VOLTAGE"),
    ("CURR", "CURRENT"),
    ("LEV", "LEVEL"),
    ("IMM", "IMMEDIATE"),
    ("AMPL", "AMPLITUDE"),
    ("OUTP", "OUTPUT"),
    ("STAT", "STATE"),
    ("APPL", "APPLY"),
    ("MEAS", "MEASURE"),
    ("POWE", "POWER"),
    ("ALL", "ALL"),
    ("DC", "DC"),
    ("SYST", "SYSTEM"),
    ("ERR", "ERROR"),
    ("NEXT", "NEXT"),
    ("SOUR", "SOURCE"),
];

/// Nodes that may be left out (`[:LEVel][:IMMediate][:AMPLitude]`, …).
const OPTIONAL: &[&str] = &["SEL", "LEV", "IMM", "AMPL", "STAT", "DC", "NEXT"];

/// Parses and runs one command; `Ok(Some(reply))` for queries.
fn run_command(
    config: &ScpiPsuConfig,
    st: &mut ScpiPsuState,
    text: &str,
) -> Result<Option<String>, ScpiError> {
    let (header, params) = match text.split_once(char::is_whitespace) {
        Some((h, p)) => (h, p.trim()),
        None => (text, ""),
    };
    let header = header.to_ascii_uppercase();
    let query = header.ends_with('?');
    let params: Vec<&str> = if params.is_empty() {
        Vec::new()
    } else {
        params.split(',').map(str::trim).collect()
    };
    if header.starts_with('*') {
        return common_command(config, st, &header, &params);
    }
    let (path, channel) = canonical_path(&header, st)?;
    run_node(st, &path, query, channel, &params)
}

/// The canonical short-form path of `header` (optional nodes dropped)
/// and the channel it addresses (`SOURn`, else the selected one).
fn canonical_path(header: &str, st: &ScpiPsuState) -> Result<(String, usize), ScpiError> {
    let mut channel = st.selected;
    let mut path = Vec::new();
    for word in header
        .trim_start_matches(':')
        .trim_end_matches('?')
        .split(':')
    {
        let stem = word.trim_end_matches(|c: char| c.is_ascii_digit());
        let suffix = &word[stem.len()..];
        let short = MNEMONICS
            .iter()
            .find(|(s, l)| stem == *s || stem == *l)
            .map(|(s, _)| *s)
            .ok_or(UNDEFINED_HEADER)?;
        if short == "SOUR" {
            if !suffix.is_empty() {
                channel = parse_index(suffix, st.channels.len()).ok_or(UNDEFINED_HEADER)?;
            }
            continue;
        }
        if !suffix.is_empty() {
            return Err(UNDEFINED_HEADER);
        }
        if !OPTIONAL.contains(&short) {
            path.push(short);
        }
    }
    Ok((path.join(":"), channel))
}

/// Runs the command at canonical `path` (a query if `query`) on
/// `channel`; `Ok(Some(reply))` for queries.
fn run_node(
    st: &mut ScpiPsuState,
    path: &str,
    query: bool,
    channel: usize,
    params: &[&str],
) -> Result<Option<String>, ScpiError> {
    let n = st.channels.len();
    match (path, query) {
        ("INST", false) => {
            st.selected = parse_channel(one(params)?, n)?;
            Ok(None)
        }
        ("INST", true) => Ok(Some(format!("CH{}", st.selected + 1))),
        ("INST:NSEL", false) => {
            st.selected = parse_index(one(params)?, n).ok_or(ILLEGAL_VALUE)?;
            Ok(None)
        }
        ("INST:NSEL", true) => Ok(Some(format!("{}", st.selected + 1))),
        ("VOLT", false) => {
            let v = parse_number(one(params)?)?;
            set_voltage(&mut st.channels[channel], v)?;
            Ok(None)
        }
        ("VOLT", true) => Ok(Some(format!("{:.3}", st.channels[channel].vset_v))),
        ("CURR", false) => {
            let a = parse_number(one(params)?)?;
            set_current(&mut st.channels[channel], a)?;
            Ok(None)
        }
        ("CURR", true) => Ok(Some(format!("{:.3}", st.channels[channel].iset_a))),
        ("APPL", false) => {
            let ch = parse_channel(params.first().ok_or(MISSING_PARAMETER)?, n)?;
            let v = parse_number(params.get(1).ok_or(MISSING_PARAMETER)?)?;
            let a = params.get(2).map(|p| parse_number(p)).transpose()?;
            let c = &mut st.channels[ch];
            check_range(v, c.rating.max_voltage_v)?;
            if let Some(a) = a {
                check_range(a, c.rating.max_current_a)?;
                c.iset_a = round_to(a, 1000.0);
            }
            c.vset_v = round_to(v, 1000.0);
            Ok(None)
        }
        ("APPL", true) => {
            let ch = match params.first() {
                Some(p) => parse_channel(p, n)?,
                None => st.selected,
            };
            let c = &st.channels[ch];
            Ok(Some(format!(
                "CH{}:{}V/{}A,{:.3},{:.3}",
                ch + 1,
                c.rating.max_voltage_v,
                c.rating.max_current_a,
                c.vset_v,
                c.iset_a
            )))
        }
        ("OUTP", false) => {
            let (ch, state) = match params {
                [s] => (st.selected, *s),
                [c, s] => (parse_channel(c, n)?, *s),
                [] => return Err(MISSING_PARAMETER),
                _ => return Err(ILLEGAL_VALUE),
            };
            st.channels[ch].output_on = parse_on_off(state)?;
            Ok(None)
        }
        ("OUTP", true) => {
            let ch = match params.first() {
                Some(p) => parse_channel(p, n)?,
                None => st.selected,
            };
            Ok(Some(
                if st.channels[ch].output_on {
                    "ON"
                } else {
                    "OFF"
                }
                .to_string(),
            ))
        }
        ("MEAS" | "MEAS:VOLT" | "MEAS:CURR" | "MEAS:POWE" | "MEAS:ALL", true) => {
            let ch = match params.first() {
                Some(p) => parse_channel(p, n)?,
                None => st.selected,
            };
            let (v, a) = st.channels[ch].measure();
            Ok(Some(match path {
                "MEAS" | "MEAS:VOLT" => format!("{v:.4}"),
                "MEAS:CURR" => format!("{a:.4}"),
                "MEAS:POWE" => format!("{:.4}", v * a),
                _ => format!("{v:.4},{a:.4},{:.4}", v * a),
            }))
        }
        ("SYST:ERR", true) => Ok(Some(match st.errors.pop_front() {
            Some((code, msg)) => format!("{code},\"{msg}\""),
            None => "0,\"No error\"".to_string(),
        })),
        _ => Err(UNDEFINED_HEADER),
    }
}

fn common_command(
    config: &ScpiPsuConfig,
    st: &mut ScpiPsuState,
    header: &str,
    _params: &[&str],
) -> Result<Option<String>, ScpiError> {
    match header {
        "*IDN?" => Ok(Some(config.idn.clone())),
        "*OPC?" => Ok(Some("1".to_string())),
        "*OPC" => Ok(None),
        "*CLS" => {
            st.errors.clear();
            Ok(None)
        }
        "*RST" => {
            for c in &mut st.channels {
                c.vset_v = 0.0;
                c.iset_a = 0.0;
                c.output_on = false;
            }
            st.selected = 0;
            Ok(None)
        }
        _ => Err(UNDEFINED_HEADER),
    }
}

fn one<'a>(params: &[&'a str]) -> Result<&'a str, ScpiError> {
    params.first().copied().ok_or(MISSING_PARAMETER)
}

/// `CH2` → 1 (0-based).
fn parse_channel(p: &str, n: usize) -> Result<usize, ScpiError> {
    let up = p.to_ascii_uppercase();
    up.strip_prefix("CH")
        .and_then(|d| parse_index(d, n))
        .ok_or(ILLEGAL_VALUE)
}

/// `2` → 1 (0-based), within `1..=n`.
fn parse_index(d: &str, n: usize) -> Option<usize> {
    d.parse::<usize>()
        .ok()
        .filter(|i| (1..=n).contains(i))
        .map(|i| i - 1)
}

fn parse_number(p: &str) -> Result<f64, ScpiError> {
    p.parse::<f64>()
        .ok()
        .filter(|v| v.is_finite())
        .ok_or(DATA_TYPE)
}

fn parse_on_off(p: &str) -> Result<bool, ScpiError> {
    match p.to_ascii_uppercase().as_str() {
        "ON" | "1" => Ok(true),
        "OFF" | "0" => Ok(false),
        _ => Err(ILLEGAL_VALUE),
    }
}

fn check_range(v: f64, max: f64) -> Result<(), ScpiError> {
    if (0.0..=max).contains(&v) {
        Ok(())
    } else {
        Err(OUT_OF_RANGE)
    }
}

fn round_to(v: f64, per_unit: f64) -> f64 {
    (v * per_unit).round() / per_unit
}

fn set_voltage(c: &mut ScpiChannel, v: f64) -> Result<(), ScpiError> {
    check_range(v, c.rating.max_voltage_v)?;
    c.vset_v = round_to(v, 1000.0);
    Ok(())
}

fn set_current(c: &mut ScpiChannel, a: f64) -> Result<(), ScpiError> {
    check_range(a, c.rating.max_current_a)?;
    c.iset_a = round_to(a, 1000.0);
    Ok(())
}
