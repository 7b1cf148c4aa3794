//! `scpi` backend: Rigol DP800-type SCPI supplies, over a serial port or a
//! raw TCP socket (LAN instruments listen on port 5555).
//!
//! One command per `\n`-terminated line. A setting selects the channel
//! (`:INST CH1`) and sets it (`:VOLT 5.000`, `:CURR 0.500`,
//! `:OUTP CH1,ON`); after every setting the error queue is read
//! (`:SYST:ERR?` until `0,"No error"`) and any entry fails the action with
//! the instrument's own code and message. Readings: `:MEAS:VOLT? CH1`,
//! `:MEAS:CURR? CH1`, `:OUTP? CH1`. On every (re)connection the error queue
//! is cleared with `*CLS`, so a later error is about our command.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{check_settle, Limits, Measurement, PowerSupply, OPEN_WAIT};
use crate::drivers::transport::{
    bad_setting, printable, Endpoint, Link, SerialLine, Transcript, WaitError,
};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// Bench TOML settings of `backend = "scpi"`: exactly one of `port` and
/// `tcp_address`.
///
/// ```toml
/// tcp_address = "192.168.10.42:5555"   # or: port = "/dev/serial/by-id/..."
/// baud_rate = 9600                     # serial only
/// channel = 1                          # 1..=8, the output this capability drives
/// max_voltage_v = 5.5                  # required safety limit (V)
/// max_current_a = 1.0                  # required safety limit (A)
/// reply_timeout_ms = 1000              # 50..=10000
/// settle_ms = 100                      # 0..=10000
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ScpiSettings {
    pub port: Option<String>,
    pub tcp_address: Option<String>,
    pub baud_rate: u32,
    pub channel: u8,
    pub max_voltage_v: f64,
    pub max_current_a: f64,
    pub reply_timeout_ms: u64,
    pub settle_ms: u64,
}

impl Default for ScpiSettings {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            port: None,
            tcp_address: None,
            baud_rate: 9600,
            channel: 1,
            max_voltage_v: 0.0,
            max_current_a: 0.0,
            reply_timeout_ms: 1000,
            settle_ms: 100,
        }
    }
}

impl Defaults for ScpiSettings {
    const REQUIRED: &'static [&'static str] = &["max_voltage_v", "max_current_a"];
}

/// Most error-queue entries read after one setting (the DP800 keeps 20).
const ERROR_QUEUE_MAX: usize = 20;

/// An SCPI supply output on a [`Link`].
#[derive(Debug)]
pub struct Scpi {
    link: Link,
    name: String,
    channel: u8,
    reply_timeout: Duration,
    transcript: Transcript,
    /// Connection generation that was initialised (`*CLS`).
    initialized: u64,
    /// Connection generation whose identity query succeeded.
    identified: u64,
}

impl Scpi {
    /// Parses and checks the settings; returns the backend, its limits and
    /// the settle time. Does not connect.
    pub fn from_spec(spec: &DriverSpec) -> Result<(Self, Limits, Duration), DriverConfigError> {
        let s: ScpiSettings = spec.parse()?;
        let endpoint = match (&s.port, &s.tcp_address) {
            (Some(port), None) => {
                let line = SerialLine::new(port.clone(), s.baud_rate);
                line.check(spec)?;
                Endpoint::Serial(line)
            }
            (None, Some(addr)) => {
                if !addr.contains(':') {
                    return Err(bad_setting(
                        spec,
                        "tcp_address",
                        format!("`{addr}` is not host:port (e.g. 192.168.10.42:5555)"),
                    ));
                }
                Endpoint::Tcp {
                    address: addr.clone(),
                }
            }
            (Some(_), Some(_)) => {
                return Err(bad_setting(
                    spec,
                    "port",
                    "give either `port` or `tcp_address`, not both",
                ))
            }
            (None, None) => {
                return Err(bad_setting(
                    spec,
                    "port",
                    "missing: give `port` (serial) or `tcp_address`",
                ))
            }
        };
        if !(1..=8).contains(&s.channel) {
            return Err(bad_setting(
                spec,
                "channel",
                format!("{} is outside 1..=8", s.channel),
            ));
        }
        if !(50..=10_000).contains(&s.reply_timeout_ms) {
            return Err(bad_setting(
                spec,
                "reply_timeout_ms",
                format!("{} is outside 50..=10000", s.reply_timeout_ms),
            ));
        }
        let limits = Limits::checked(spec, s.max_voltage_v, s.max_current_a)?;
        let settle = check_settle(spec, s.settle_ms)?;
        Ok((
            Scpi {
                name: endpoint.name(),
                link: Link::new(endpoint, 64 * 1024),
                channel: s.channel,
                reply_timeout: Duration::from_millis(s.reply_timeout_ms),
                transcript: Transcript::new(),
                initialized: 0,
                identified: 0,
            },
            limits,
            settle,
        ))
    }

    /// Opens the link and clears the error queue once per connection.
    fn ready(&mut self) -> Result<(), DriverError> {
        let generation = self.link.ensure_open(OPEN_WAIT)?;
        if generation != self.initialized {
            self.write_line("*CLS")?;
            self.initialized = generation;
        }
        Ok(())
    }

    fn write_line(&mut self, cmd: &str) -> Result<(), DriverError> {
        let mut line = Vec::with_capacity(cmd.len() + 1);
        line.extend_from_slice(cmd.as_bytes());
        line.push(b'\n');
        self.link.write(&line)?;
        self.transcript.tx(cmd);
        Ok(())
    }

    fn command(&mut self, cmd: &str) -> Result<(), DriverError> {
        self.ready()?;
        self.write_line(cmd)
    }

    /// Sends a query; returns its reply line without the terminator.
    fn query(&mut self, cmd: &str) -> Result<String, DriverError> {
        self.ready()?;
        let capture = self.link.capture().clone();
        let from = capture.end();
        self.write_line(cmd)?;
        let deadline = Instant::now() + self.reply_timeout;
        let line = capture.wait_for(from, deadline, None, |_, d| {
            d.iter().position(|&b| b == b'\n').map(|i| d[..i].to_vec())
        });
        match line {
            Ok(bytes) => {
                self.transcript.rx(&bytes);
                Ok(String::from_utf8_lossy(&bytes).trim().to_string())
            }
            Err(WaitError::Timeout) => {
                self.transcript.note(format!("no reply to {cmd}"));
                Err(DriverError::Device(format!(
                    "{} did not answer `{cmd}` within {} ms",
                    self.name,
                    self.reply_timeout.as_millis()
                )))
            }
            Err(WaitError::Lost(why)) => Err(DriverError::Unavailable(why)),
            Err(WaitError::Cancelled) => Err(DriverError::Cancelled(cmd.into())),
        }
    }

    fn query_number(&mut self, cmd: &str) -> Result<f64, DriverError> {
        let reply = self.query(cmd)?;
        reply.parse::<f64>().map_err(|_| {
            DriverError::Device(format!(
                "{} answered `{cmd}` with \"{}\", not a number",
                self.name,
                printable(reply.as_bytes())
            ))
        })
    }

    /// Reads the error queue until it is empty; fails with every entry
    /// found, naming the command that caused them.
    fn check_errors(&mut self, after: &str) -> Result<(), DriverError> {
        let mut errors = Vec::new();
        for _ in 0..ERROR_QUEUE_MAX {
            let reply = self.query(":SYST:ERR?")?;
            let code = reply
                .split(',')
                .next()
                .and_then(|c| c.trim().parse::<i32>().ok())
                .ok_or_else(|| {
                    DriverError::Device(format!(
                        "{} answered `:SYST:ERR?` with \"{}\"",
                        self.name,
                        printable(reply.as_bytes())
                    ))
                })?;
            if code == 0 {
                break;
            }
            errors.push(reply);
        }
        if errors.is_empty() {
            Ok(())
        } else {
            Err(DriverError::Device(format!(
                "{} reported SCPI error {} after `{after}`",
                self.name,
                errors.join("; ")
            )))
        }
    }

    /// Selects this capability's channel and sends `setting`, then checks
    /// the error queue.
    fn set(&mut self, setting: &str) -> Result<(), DriverError> {
        let select = format!(":INST CH{}", self.channel);
        self.command(&select)?;
        self.command(setting)?;
        self.check_errors(setting)
    }
}

impl PowerSupply for Scpi {
    fn port_name(&self) -> String {
        self.name.clone()
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("channel".into(), json!(self.channel));
        m
    }

    fn identify(&mut self) -> Result<String, DriverError> {
        let idn = self.query("*IDN?")?;
        if idn.is_empty() {
            return Err(DriverError::Device(format!(
                "{} sent an empty *IDN? reply",
                self.name
            )));
        }
        Ok(idn)
    }

    fn set_voltage(&mut self, volts: f64) -> Result<(), DriverError> {
        self.set(&format!(":VOLT {volts:.3}"))
    }

    fn set_current_limit(&mut self, amps: f64) -> Result<(), DriverError> {
        self.set(&format!(":CURR {amps:.3}"))
    }

    fn set_output(&mut self, on: bool) -> Result<(), DriverError> {
        let state = if on { "ON" } else { "OFF" };
        let cmd = format!(":OUTP CH{},{state}", self.channel);
        self.command(&cmd)?;
        self.check_errors(&cmd)?;
        let now = self.query(&format!(":OUTP? CH{}", self.channel))?;
        if now.eq_ignore_ascii_case(state) {
            Ok(())
        } else {
            Err(DriverError::Device(format!(
                "{} did not switch CH{} {state}: `:OUTP?` reads \"{now}\"",
                self.name, self.channel
            )))
        }
    }

    fn measure(&mut self) -> Result<Measurement, DriverError> {
        let ch = self.channel;
        let voltage_v = self.query_number(&format!(":MEAS:VOLT? CH{ch}"))?;
        let current_a = self.query_number(&format!(":MEAS:CURR? CH{ch}"))?;
        let output = self.query(&format!(":OUTP? CH{ch}"))?;
        Ok(Measurement {
            voltage_v,
            current_a,
            output_on: Some(output.eq_ignore_ascii_case("ON")),
            mode: None,
        })
    }

    fn health(&mut self) -> DriverHealth {
        let h = self.link.health();
        if h != DriverHealth::healthy() {
            return h;
        }
        let generation = self.link.capture().generation();
        if self.identified != generation {
            if let Err(e) = self.identify() {
                let why = format!(
                    "{}: connected but the supply does not answer *IDN? ({e})",
                    self.name
                );
                self.link.identity_failed(&why);
                return DriverHealth::unhealthy(why);
            }
            self.link.identity_confirmed();
            self.identified = generation;
        }
        DriverHealth::healthy()
    }

    fn transcript(&mut self) -> &mut Transcript {
        &mut self.transcript
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<ScpiSettings>(
            serde_json::json!({"max_voltage_v": 12.0, "max_current_a": 2.0}),
            "ScpiSettings { port: None, tcp_address: None, baud_rate: 9600, channel: 1, max_voltage_v: 12.0, max_current_a: 2.0, reply_timeout_ms: 1000, settle_ms: 100 }",
        );
    }
}
