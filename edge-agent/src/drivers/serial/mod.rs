//! Serial port driver (docs/actions.md, "serial_port"): `open`, `read`, `write`,
//! `expect_pattern`, `capture_log`.
//!
//! Backends: `serialport` ([`port`]: a real port, opened with exclusive
//! access) and `sim` ([`sim`]: an in-process device-under-test console that
//! boots when opened or when its simulated power rail comes up).
//!
//! # Nothing the device prints is missed
//!
//! The port is read all the time by the link's own thread into a rolling
//! capture log (see [`super::transport`]), from the first `open` (or the
//! first health check) until the driver is dropped. The driver keeps a
//! *read cursor*: the offset up to which output has been consumed. `read`
//! and `expect_pattern` (with the default `since = "unread"`) start at the
//! cursor and advance it past what they return or matched, so output that
//! arrived *before* the call is seen. The typical sequence
//!
//! 1. `open` (moves the cursor to the end of the log: older output is
//!    ignored from here on),
//! 2. power the device under test on (PSU or relay capability),
//! 3. `expect_pattern` with the boot banner,
//!
//! therefore finds the banner even when the device printed it before step 3
//! began. `since = "now"` looks only at output arriving after the call;
//! `since = "all"` searches everything still in the log. `capture_log`
//! records without consuming (the cursor stays).
//!
//! The log keeps the newest `log_limit_bytes` (default 1 MiB); a result
//! reports `bytes_dropped` when a reader fell behind that.

pub mod port;
pub mod sim;

use std::sync::Arc;
use std::time::{Duration, Instant};

use regex::bytes::{Regex, RegexBuilder};
use serde::Deserialize;
use serde_json::{json, Map, Value};
use shared_protocol::artifact::ArtifactType;
use shared_protocol::capability::{CapabilityAction, CapabilityType};

use super::transport::{printable, Capture, LinkState, SerialLine, WaitError};
use super::{
    parse_params, parse_params_with_defaults, unsupported, ActionOutcome, ActionRequest, Defaults,
    Driver, DriverConfigError, DriverError, DriverHealth, DriverSpec, NewArtifact,
};

/// Default rolling log size, bytes (1 MiB).
pub const DEFAULT_LOG_LIMIT_BYTES: usize = 1 << 20;

/// Allowed `log_limit_bytes`: 4 KiB ..= 64 MiB.
pub const LOG_LIMIT_RANGE: std::ops::RangeInclusive<usize> = 4096..=(64 << 20);

/// Longest an action waits for the port to (re)open before failing.
const OPEN_WAIT: Duration = Duration::from_secs(2);

/// Bytes of log returned around an `expect_pattern` timeout.
const TAIL_ON_TIMEOUT: usize = 512;

/// A serial console backend: something that can be opened, written to, and
/// whose output lands in a [`Capture`].
pub trait SerialConsole: Send {
    /// The port as users know it, e.g. `/dev/serial/by-id/usb-FTDI_...-if00`.
    fn port_name(&self) -> String;
    /// The line settings (for registration metadata).
    fn line(&self) -> SerialLine;
    /// Opens the port if it is not open; waits up to a couple of seconds.
    /// Errors: [`DriverError::Unavailable`] (absent, in use, lost).
    fn open(&mut self) -> Result<(), DriverError>;
    /// Sends bytes. Errors: [`DriverError::Unavailable`].
    fn write(&mut self, bytes: &[u8]) -> Result<(), DriverError>;
    /// Everything the device sent since the driver was built.
    fn capture(&self) -> Arc<Capture>;
    /// Healthy while the port is open (opens it on first use).
    fn health(&mut self) -> DriverHealth;
}

/// Build a serial port driver from its bench TOML section: `backend =
/// "serialport"` (see [`port::PortSettings`]) or `"sim"` (see
/// [`sim::SimConsoleSettings`]).
pub fn build(spec: &DriverSpec) -> Result<Box<dyn Driver>, DriverConfigError> {
    let console: Box<dyn SerialConsole> = match spec.backend.as_str() {
        "serialport" => Box::new(port::PortConsole::from_spec(spec)?),
        "sim" => Box::new(sim::SimConsole::from_spec(spec)?),
        _ => return Err(spec.unknown_backend(&["serialport", "sim"])),
    };
    Ok(Box::new(SerialDriver::new(spec, console)))
}

/// Checks a `log_limit_bytes` setting.
pub(crate) fn check_log_limit(spec: &DriverSpec, limit: usize) -> Result<(), DriverConfigError> {
    if LOG_LIMIT_RANGE.contains(&limit) {
        Ok(())
    } else {
        Err(super::transport::bad_setting(
            spec,
            "log_limit_bytes",
            format!(
                "{limit} is outside {}..={}",
                LOG_LIMIT_RANGE.start(),
                LOG_LIMIT_RANGE.end()
            ),
        ))
    }
}

/// The serial_port capability over any [`SerialConsole`].
pub struct SerialDriver {
    capability_id: String,
    backend: String,
    console: Box<dyn SerialConsole>,
    /// Offset up to which output has been consumed by `read` /
    /// `expect_pattern` (or skipped by `open`).
    cursor: u64,
}

/// Where `expect_pattern` and `capture_log` start looking.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Since {
    /// From the read cursor: output not yet consumed, including what
    /// arrived before the call.
    Unread,
    /// Only output that arrives after the call.
    Now,
    /// Everything still in the rolling log.
    All,
}

/// `write` line ending appended to `text` or `hex`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LineEnding {
    #[default]
    None,
    Lf,
    Cr,
    Crlf,
}

impl LineEnding {
    fn bytes(self) -> &'static [u8] {
        match self {
            LineEnding::None => b"",
            LineEnding::Lf => b"\n",
            LineEnding::Cr => b"\r",
            LineEnding::Crlf => b"\r\n",
        }
    }
}

/// `open` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OpenParams {
    /// Keep output received before `open` readable (default false: skip it).
    #[serde(default)]
    keep_unread: bool,
}

/// `read` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ReadParams {
    /// 1..=1048576, default 4096.
    max_bytes: usize,
    /// 0..=600000, default 1000: longest wait for the first byte.
    timeout_ms: u64,
    /// 0..=60000, default 100: return after this much silence once some
    /// bytes arrived (0 = return as soon as anything is there).
    idle_ms: u64,
}

impl Default for ReadParams {
    /// The documented defaults.
    fn default() -> Self {
        Self {
            max_bytes: 4096,
            timeout_ms: 1000,
            idle_ms: 100,
        }
    }
}

impl Defaults for ReadParams {}

/// `write` parameters: exactly one of `text` and `hex`.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WriteParams {
    text: Option<String>,
    /// Hex digits, spaces and `:` allowed between bytes (`"A0 01 01 A2"`).
    hex: Option<String>,
    #[serde(default)]
    line_ending: LineEnding,
}

/// Most bytes one `write` may send.
const WRITE_MAX_BYTES: usize = 65_536;

/// `expect_pattern` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct ExpectParams {
    /// A regular expression (Rust `regex` syntax) over the raw bytes.
    pattern: String,
    /// 1..=600000, default 10000.
    timeout_ms: u64,
    since: Since,
    /// 0..=8192, default 256: log bytes returned on each side of the match.
    context_bytes: usize,
}

impl Default for ExpectParams {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            pattern: String::new(),
            timeout_ms: 10_000,
            since: Since::Unread,
            context_bytes: 256,
        }
    }
}

impl Defaults for ExpectParams {
    const REQUIRED: &'static [&'static str] = &["pattern"];
}

/// `capture_log` parameters.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct CaptureParams {
    /// 1..=600000.
    duration_ms: u64,
    since: Since,
}

impl Default for CaptureParams {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            duration_ms: 0,
            since: Since::Now,
        }
    }
}

impl Defaults for CaptureParams {
    const REQUIRED: &'static [&'static str] = &["duration_ms"];
}

fn out_of_range(field: &str, value: impl std::fmt::Display, range: &str) -> DriverError {
    DriverError::InvalidParams {
        field: field.into(),
        message: format!("{value} is outside {range}"),
    }
}

/// The instant a wait of `timeout_ms` ends: the timeout, or the action
/// deadline if that comes first (then `true`).
fn wait_limit(req: &ActionRequest, timeout_ms: u64) -> (Instant, bool) {
    let own = Instant::now() + Duration::from_millis(timeout_ms);
    if req.deadline < own {
        (req.deadline, true)
    } else {
        (own, false)
    }
}

/// Bytes as text with a flag saying whether they were binary (not UTF-8,
/// or control bytes other than tab, CR, LF, backspace, ESC).
fn text_of(bytes: &[u8]) -> (String, bool) {
    let binary = std::str::from_utf8(bytes).is_err()
        || bytes
            .iter()
            .any(|&b| b < 0x20 && !matches!(b, b'\t' | b'\r' | b'\n' | 0x08 | 0x1b));
    (String::from_utf8_lossy(bytes).into_owned(), binary)
}

impl SerialDriver {
    /// A driver over `console` (nothing is opened yet).
    pub fn new(spec: &DriverSpec, console: Box<dyn SerialConsole>) -> Self {
        Self {
            capability_id: spec.capability_id.clone(),
            backend: spec.backend.clone(),
            console,
            cursor: 0,
        }
    }

    fn open(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        let p: OpenParams = parse_params(&req.params)?;
        self.console.open()?;
        let capture = self.console.capture();
        let end = capture.end();
        if !p.keep_unread {
            self.cursor = end;
        }
        let line = self.console.line();
        Ok(summary(json!({
            "port_name": self.console.port_name(),
            "baud_rate": line.baud_rate,
            "log_offset": self.cursor,
            "unread_bytes": end.saturating_sub(self.cursor.max(capture.start())),
        })))
    }

    fn read(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        let p: ReadParams = parse_params_with_defaults(&req.params)?;
        if !(1..=1_048_576).contains(&p.max_bytes) {
            return Err(out_of_range("max_bytes", p.max_bytes, "1..=1048576"));
        }
        if p.timeout_ms > 600_000 {
            return Err(out_of_range("timeout_ms", p.timeout_ms, "0..=600000"));
        }
        if p.idle_ms > 60_000 {
            return Err(out_of_range("idle_ms", p.idle_ms, "0..=60000"));
        }
        self.console.open()?;
        let capture = self.console.capture();
        let (until, _) = wait_limit(req, p.timeout_ms);
        let idle = Duration::from_millis(p.idle_ms);
        let mut seen = 0usize;
        let mut last_arrival: Option<Instant> = None;
        loop {
            let available = capture
                .end()
                .saturating_sub(self.cursor.max(capture.start()));
            let available = usize::try_from(available).unwrap_or(usize::MAX);
            if available >= p.max_bytes {
                break;
            }
            let now = Instant::now();
            if available > seen {
                seen = available;
                last_arrival = Some(now);
            }
            let stop_at = match last_arrival {
                Some(_) if idle.is_zero() => break,
                Some(t) => (t + idle).min(until),
                None => until,
            };
            if now >= stop_at {
                break;
            }
            match capture.wait_for(self.cursor, stop_at, Some(&req.cancel), |_, d| {
                (d.len() > seen).then_some(())
            }) {
                Ok(()) | Err(WaitError::Timeout) => {}
                Err(WaitError::Cancelled) => {
                    return Err(DriverError::Cancelled("read cancelled".into()))
                }
                Err(WaitError::Lost(why)) if seen == 0 => {
                    return Err(DriverError::Unavailable(why))
                }
                Err(WaitError::Lost(_)) => break,
            }
        }
        let (from, mut bytes) = capture.bytes_from(self.cursor);
        bytes.truncate(p.max_bytes);
        let dropped = from.saturating_sub(self.cursor);
        self.cursor = from + bytes.len() as u64;
        let (text, binary) = text_of(&bytes);
        Ok(summary(json!({
            "bytes_read": bytes.len(),
            "text": text,
            "hex": hex::encode_upper(&bytes),
            "binary": binary,
            "timed_out": bytes.is_empty(),
            "bytes_dropped": dropped,
            "log_offset": self.cursor,
        })))
    }

    fn write(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        let p: WriteParams = parse_params(&req.params)?;
        let mut bytes = match (&p.text, &p.hex) {
            (Some(t), None) => t.as_bytes().to_vec(),
            (None, Some(h)) => {
                let digits: String = h
                    .chars()
                    .filter(|c| !c.is_whitespace() && *c != ':')
                    .collect();
                hex::decode(&digits).map_err(|e| DriverError::InvalidParams {
                    field: "hex".into(),
                    message: format!("not hex bytes: {e}"),
                })?
            }
            (Some(_), Some(_)) => {
                return Err(DriverError::InvalidParams {
                    field: "text".into(),
                    message: "give either `text` or `hex`, not both".into(),
                })
            }
            (None, None) => {
                return Err(DriverError::InvalidParams {
                    field: "text".into(),
                    message: "missing field `text` (or `hex`)".into(),
                })
            }
        };
        bytes.extend_from_slice(p.line_ending.bytes());
        if bytes.is_empty() {
            return Err(DriverError::InvalidParams {
                field: if p.text.is_some() { "text" } else { "hex" }.into(),
                message: "nothing to write".into(),
            });
        }
        if bytes.len() > WRITE_MAX_BYTES {
            return Err(out_of_range(
                if p.text.is_some() { "text" } else { "hex" },
                format!("{} bytes", bytes.len()),
                "1..=65536 bytes",
            ));
        }
        if req.cancel.is_cancelled() {
            return Err(DriverError::Cancelled(
                "write cancelled before sending".into(),
            ));
        }
        self.console.open()?;
        self.console.write(&bytes)?;
        Ok(summary(json!({ "bytes_written": bytes.len() })))
    }

    fn expect_pattern(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        let p: ExpectParams = parse_params_with_defaults(&req.params)?;
        if p.pattern.is_empty() {
            return Err(DriverError::InvalidParams {
                field: "pattern".into(),
                message: "must not be empty".into(),
            });
        }
        let re: Regex = RegexBuilder::new(&p.pattern)
            .size_limit(1 << 20)
            .build()
            .map_err(|e| DriverError::InvalidParams {
                field: "pattern".into(),
                message: format!("not a valid regular expression: {e}"),
            })?;
        if !(1..=600_000).contains(&p.timeout_ms) {
            return Err(out_of_range("timeout_ms", p.timeout_ms, "1..=600000"));
        }
        if p.context_bytes > 8192 {
            return Err(out_of_range("context_bytes", p.context_bytes, "0..=8192"));
        }
        self.console.open()?;
        let capture = self.console.capture();
        let from = match p.since {
            Since::Unread => self.cursor,
            Since::Now => capture.end(),
            Since::All => capture.start(),
        };
        let started = Instant::now();
        let (until, deadline_bound) = wait_limit(req, p.timeout_ms);
        let found = capture.wait_for(from, until, Some(&req.cancel), |at, data| {
            let caps = re.captures(data)?;
            let whole = caps.get(0)?;
            let groups: Vec<Value> = caps
                .iter()
                .skip(1)
                .map(|g| match g {
                    Some(m) => Value::String(String::from_utf8_lossy(m.as_bytes()).into_owned()),
                    None => Value::Null,
                })
                .collect();
            let named: Map<String, Value> = re
                .capture_names()
                .flatten()
                .map(|name| {
                    let v = caps.name(name).map_or(Value::Null, |m| {
                        Value::String(String::from_utf8_lossy(m.as_bytes()).into_owned())
                    });
                    (name.to_string(), v)
                })
                .collect();
            Some((
                at + whole.start() as u64,
                at + whole.end() as u64,
                String::from_utf8_lossy(whole.as_bytes()).into_owned(),
                groups,
                named,
            ))
        });
        let elapsed_ms = started.elapsed().as_millis() as u64;
        match found {
            Ok((start, end, text, groups, named)) => {
                self.cursor = self.cursor.max(end);
                let ctx = p.context_bytes as u64;
                let (_, excerpt) = capture.range(start.saturating_sub(ctx), end + ctx);
                Ok(summary(json!({
                    "matched": true,
                    "match": text,
                    "captures": groups,
                    "named": named,
                    "match_offset": start,
                    "elapsed_ms": elapsed_ms,
                    "log_excerpt": String::from_utf8_lossy(&excerpt),
                    "log_offset": self.cursor,
                })))
            }
            Err(WaitError::Cancelled) => Err(DriverError::Cancelled(format!(
                "expect_pattern `{}` cancelled after {elapsed_ms} ms",
                p.pattern
            ))),
            Err(WaitError::Timeout) if deadline_bound => Err(DriverError::Timeout(elapsed_ms)),
            Err(WaitError::Timeout) => Err(DriverError::Device(format!(
                "pattern `{}` not seen within {} ms; last output: \"{}\"",
                p.pattern,
                p.timeout_ms,
                printable(&tail_since(&capture, from, TAIL_ON_TIMEOUT))
            ))),
            Err(WaitError::Lost(why)) => Err(DriverError::Unavailable(format!(
                "{why} while waiting for `{}`; last output: \"{}\"",
                p.pattern,
                printable(&tail_since(&capture, from, TAIL_ON_TIMEOUT))
            ))),
        }
    }

    fn capture_log(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        let p: CaptureParams = parse_params_with_defaults(&req.params)?;
        if !(1..=600_000).contains(&p.duration_ms) {
            return Err(out_of_range("duration_ms", p.duration_ms, "1..=600000"));
        }
        let left = req.deadline.saturating_duration_since(Instant::now());
        if Duration::from_millis(p.duration_ms) > left {
            return Err(DriverError::InvalidParams {
                field: "duration_ms".into(),
                message: format!(
                    "{} ms is longer than the {} ms left before the action deadline",
                    p.duration_ms,
                    left.as_millis()
                ),
            });
        }
        self.console.open()?;
        let capture = self.console.capture();
        let from = match p.since {
            Since::Unread => self.cursor,
            Since::Now => capture.end(),
            Since::All => capture.start(),
        };
        let started = Instant::now();
        let until = started + Duration::from_millis(p.duration_ms);
        let mut link_lost = false;
        let mut cancelled = false;
        // A capture keeps running through an unplug: the log then shows the
        // gap, and whatever arrived is still evidence. A cancelled one
        // keeps what it captured until then.
        loop {
            if capture.state() != LinkState::Open {
                link_lost = true;
            }
            if req.cancel.is_cancelled() {
                cancelled = true;
                break;
            }
            let now = Instant::now();
            if now >= until {
                break;
            }
            std::thread::sleep((until - now).min(Duration::from_millis(50)));
        }
        let end = capture.end();
        let (begin, bytes) = capture.range(from, end);
        let dropped = begin.saturating_sub(from);
        let duration_ms = started.elapsed().as_millis() as u64;
        let lines = bytes.iter().filter(|&&b| b == b'\n').count();
        let line = self.console.line();
        let mut metadata = Map::new();
        metadata.insert("port_name".into(), json!(self.console.port_name()));
        metadata.insert("baud_rate".into(), json!(line.baud_rate));
        metadata.insert("start_offset".into(), json!(begin));
        metadata.insert("end_offset".into(), json!(end));
        metadata.insert("bytes_dropped".into(), json!(dropped));
        metadata.insert("link_lost".into(), json!(link_lost));
        let mut outcome = summary(json!({
            "bytes_captured": bytes.len(),
            "lines": lines,
            "duration_ms": duration_ms,
            "bytes_dropped": dropped,
            "link_lost": link_lost,
            "partial": cancelled,
        }));
        outcome.artifacts.push(NewArtifact {
            artifact_type: ArtifactType::SerialLog,
            content_type: "text/plain".into(),
            bytes,
            duration_ms: Some(duration_ms),
            metadata,
        });
        if cancelled {
            return Err(DriverError::CancelledPartway {
                why: format!(
                    "capture_log cancelled after {duration_ms} of {} ms; the log captured until then is kept",
                    p.duration_ms
                ),
                partial: Box::new(outcome),
            });
        }
        Ok(outcome)
    }
}

/// Up to `n` newest bytes of the log at or after `from`.
fn tail_since(capture: &Capture, from: u64, n: usize) -> Vec<u8> {
    let end = capture.end();
    capture.bytes_from(from.max(end.saturating_sub(n as u64))).1
}

/// An outcome with `v` (a JSON object) as its result summary.
fn summary(v: Value) -> ActionOutcome {
    ActionOutcome {
        result_summary: match v {
            Value::Object(m) => m,
            _ => Map::new(),
        },
        artifacts: Vec::new(),
    }
}

impl Driver for SerialDriver {
    fn capability_type(&self) -> CapabilityType {
        CapabilityType::SerialPort
    }

    fn metadata(&self) -> Map<String, Value> {
        let line = self.console.line();
        match json!({
            "port_name": self.console.port_name(),
            "baud_rates": [line.baud_rate],
            "parity_modes": [line.parity.as_str()],
            "supports_binary": true,
            "data_bits": line.data_bits,
            "stop_bits": line.stop_bits,
            "flow_control": line.flow_control.as_str(),
            "backend": self.backend,
        }) {
            Value::Object(m) => m,
            _ => Map::new(),
        }
    }

    fn health(&mut self) -> DriverHealth {
        self.console.health()
    }

    fn execute(&mut self, req: &ActionRequest) -> Result<ActionOutcome, DriverError> {
        tracing::debug!(capability_id = %self.capability_id, action = %req.action, "serial action");
        match req.action {
            CapabilityAction::Open => self.open(req),
            CapabilityAction::Read => self.read(req),
            CapabilityAction::Write => self.write(req),
            CapabilityAction::ExpectPattern => self.expect_pattern(req),
            CapabilityAction::CaptureLog => self.capture_log(req),
            other => Err(unsupported(
                CapabilityType::SerialPort,
                other,
                "not a serial port action",
            )),
        }
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<ReadParams>(
            serde_json::json!({}),
            "ReadParams { max_bytes: 4096, timeout_ms: 1000, idle_ms: 100 }",
        );
        crate::drivers::defaults_pin::check::<ExpectParams>(
            serde_json::json!({"pattern": "login:"}),
            "ExpectParams { pattern: \"login:\", timeout_ms: 10000, since: Unread, context_bytes: 256 }",
        );
        crate::drivers::defaults_pin::check::<CaptureParams>(
            serde_json::json!({"duration_ms": 100}),
            "CaptureParams { duration_ms: 100, since: Now }",
        );
    }
}
