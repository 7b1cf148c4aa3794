//! `korad` backend: Korad KA3005P-family supplies over USB serial.
//!
//! Commands are unterminated ASCII (`VSET1:12.00`, `ISET1:1.500`,
//! `OUT1`/`OUT0`, `VOUT1?`, `IOUT1?`, `STATUS?`, `*IDN?`); replies have no
//! terminator either, so they are read by length or until the line goes
//! quiet. The unit needs about 50 ms per command and drops commands that
//! arrive while it is busy, so commands are paced `command_gap_ms` apart,
//! and every setting is read back (`VSET1?`, `ISET1?`, `STATUS?` bit 6) and
//! re-sent once if the unit did not take it.

use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{json, Map, Value};

use super::{check_settle, Limits, Measurement, PowerSupply, Regulation, OPEN_WAIT};
use crate::drivers::transport::{
    bad_setting, printable, sleep_until, Endpoint, Link, SerialLine, Transcript, WaitError,
};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// Bench TOML settings of `backend = "korad"`.
///
/// ```toml
/// port = "/dev/serial/by-id/usb-Nuvoton_USB_Virtual_COM_A02014090305-if00"
/// baud_rate = 9600          # default
/// max_voltage_v = 12.0      # required safety limit (V)
/// max_current_a = 2.0       # required safety limit (A)
/// command_gap_ms = 100      # 50..=1000, pause after each setting
/// reply_timeout_ms = 500    # 50..=5000
/// settle_ms = 100           # 0..=10000, wait after switching before measuring
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KoradSettings {
    pub port: String,
    pub baud_rate: u32,
    pub max_voltage_v: f64,
    pub max_current_a: f64,
    pub command_gap_ms: u64,
    pub reply_timeout_ms: u64,
    pub settle_ms: u64,
}

impl Default for KoradSettings {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            port: String::new(),
            baud_rate: 9600,
            max_voltage_v: 0.0,
            max_current_a: 0.0,
            command_gap_ms: 100,
            reply_timeout_ms: 500,
            settle_ms: 100,
        }
    }
}

impl Defaults for KoradSettings {
    const REQUIRED: &'static [&'static str] = &["port", "max_voltage_v", "max_current_a"];
}

/// Silence that ends a reply of unknown length (`*IDN?`).
const QUIET: Duration = Duration::from_millis(50);
/// Pause after a reply before the next command.
const AFTER_REPLY: Duration = Duration::from_millis(10);

/// A Korad supply on a serial [`Link`].
#[derive(Debug)]
pub struct Korad {
    link: Link,
    port: String,
    gap: Duration,
    reply_timeout: Duration,
    /// Earliest time the next command may be sent.
    not_before: Instant,
    transcript: Transcript,
    /// Connection generation whose identity query succeeded.
    identified: u64,
}

impl Korad {
    /// Parses and checks the settings; returns the backend, its limits and
    /// the settle time. Does not open the port.
    pub fn from_spec(spec: &DriverSpec) -> Result<(Self, Limits, Duration), DriverConfigError> {
        let s: KoradSettings = spec.parse()?;
        let line = SerialLine::new(s.port.clone(), s.baud_rate);
        line.check(spec)?;
        let limits = Limits::checked(spec, s.max_voltage_v, s.max_current_a)?;
        if !(50..=1000).contains(&s.command_gap_ms) {
            return Err(bad_setting(
                spec,
                "command_gap_ms",
                format!("{} is outside 50..=1000", s.command_gap_ms),
            ));
        }
        if !(50..=5000).contains(&s.reply_timeout_ms) {
            return Err(bad_setting(
                spec,
                "reply_timeout_ms",
                format!("{} is outside 50..=5000", s.reply_timeout_ms),
            ));
        }
        let settle = check_settle(spec, s.settle_ms)?;
        Ok((
            Korad {
                link: Link::new(Endpoint::Serial(line), 64 * 1024),
                port: s.port,
                gap: Duration::from_millis(s.command_gap_ms),
                reply_timeout: Duration::from_millis(s.reply_timeout_ms),
                not_before: Instant::now(),
                transcript: Transcript::new(),
                identified: 0,
            },
            limits,
            settle,
        ))
    }

    fn send(&mut self, cmd: &str) -> Result<(), DriverError> {
        self.link.ensure_open(OPEN_WAIT)?;
        sleep_until(self.not_before);
        self.link.write(cmd.as_bytes())?;
        self.transcript.tx(cmd);
        self.not_before = Instant::now() + self.gap;
        Ok(())
    }

    /// Sends a query and reads its reply: `len` bytes, or (for `None`)
    /// until the line goes quiet.
    fn query(&mut self, cmd: &str, len: Option<usize>) -> Result<Vec<u8>, DriverError> {
        self.link.ensure_open(OPEN_WAIT)?;
        sleep_until(self.not_before);
        let capture = self.link.capture().clone();
        let from = capture.end();
        self.link.write(cmd.as_bytes())?;
        self.transcript.tx(cmd);
        let sent = Instant::now();
        let reply = capture.read_burst(from, sent + self.reply_timeout, QUIET, len);
        self.not_before = Instant::now() + AFTER_REPLY;
        match reply {
            Ok(bytes) => {
                self.transcript.rx(&bytes);
                Ok(bytes)
            }
            Err(WaitError::Timeout) => {
                self.transcript.note(format!("no reply to {cmd}"));
                // A busy unit may still be working on it.
                self.not_before = Instant::now() + self.gap;
                Err(DriverError::Device(format!(
                    "Korad on {} did not answer `{cmd}` within {} ms",
                    self.port,
                    self.reply_timeout.as_millis()
                )))
            }
            Err(WaitError::Lost(why)) => Err(DriverError::Unavailable(why)),
            Err(WaitError::Cancelled) => Err(DriverError::Cancelled(cmd.into())),
        }
    }

    fn query_number(&mut self, cmd: &str) -> Result<f64, DriverError> {
        // Setpoints and readings are always 5 characters (`12.00`, `1.500`).
        let reply = self.query(cmd, Some(5))?;
        let text = String::from_utf8_lossy(&reply);
        text.trim().parse::<f64>().map_err(|_| {
            DriverError::Device(format!(
                "Korad on {} answered `{cmd}` with \"{}\", not a number",
                self.port,
                printable(&reply)
            ))
        })
    }

    fn status(&mut self) -> Result<u8, DriverError> {
        let reply = self.query("STATUS?", Some(1))?;
        reply.first().copied().ok_or_else(|| {
            DriverError::Device(format!(
                "Korad on {} sent an empty STATUS? reply",
                self.port
            ))
        })
    }

    /// Sends a setting and reads it back with `query`; re-sends once.
    fn set_verified(
        &mut self,
        cmd: &str,
        query: &str,
        want: f64,
        tol: f64,
    ) -> Result<(), DriverError> {
        let mut got = f64::NAN;
        for attempt in 0..2 {
            if attempt > 0 {
                self.transcript
                    .note(format!("read back {got}, re-sending {cmd}"));
            }
            self.send(cmd)?;
            got = self.query_number(query)?;
            if (got - want).abs() <= tol {
                return Ok(());
            }
        }
        Err(DriverError::Device(format!(
            "Korad on {} did not take `{cmd}`: `{query}` reads {got}",
            self.port
        )))
    }
}

impl PowerSupply for Korad {
    fn port_name(&self) -> String {
        self.port.clone()
    }

    fn metadata(&self) -> Map<String, Value> {
        let mut m = Map::new();
        m.insert("channel".into(), json!(1));
        m
    }

    fn identify(&mut self) -> Result<String, DriverError> {
        let reply = self.query("*IDN?", None)?;
        let idn = String::from_utf8_lossy(&reply).trim().to_string();
        if idn.is_empty() {
            return Err(DriverError::Device(format!(
                "Korad on {} sent an empty *IDN? reply",
                self.port
            )));
        }
        Ok(idn)
    }

    fn set_voltage(&mut self, volts: f64) -> Result<(), DriverError> {
        // 10 mV resolution.
        let v = (volts * 100.0).round() / 100.0;
        self.set_verified(&format!("VSET1:{v:.2}"), "VSET1?", v, 0.006)
    }

    fn set_current_limit(&mut self, amps: f64) -> Result<(), DriverError> {
        // 1 mA resolution.
        let a = (amps * 1000.0).round() / 1000.0;
        self.set_verified(&format!("ISET1:{a:.3}"), "ISET1?", a, 0.0006)
    }

    fn set_output(&mut self, on: bool) -> Result<(), DriverError> {
        let cmd = if on { "OUT1" } else { "OUT0" };
        for attempt in 0..2 {
            if attempt > 0 {
                self.transcript.note(format!(
                    "STATUS? shows the output unchanged, re-sending {cmd}"
                ));
            }
            self.send(cmd)?;
            // STATUS? bit 6: output on.
            if (self.status()? & 0x40 != 0) == on {
                return Ok(());
            }
        }
        Err(DriverError::Device(format!(
            "Korad on {} did not switch its output {}",
            self.port,
            if on { "on" } else { "off" }
        )))
    }

    fn measure(&mut self) -> Result<Measurement, DriverError> {
        let voltage_v = self.query_number("VOUT1?")?;
        let current_a = self.query_number("IOUT1?")?;
        let status = self.status()?;
        Ok(Measurement {
            voltage_v,
            current_a,
            output_on: Some(status & 0x40 != 0),
            // STATUS? bit 0: 1 = constant voltage, 0 = constant current.
            mode: Some(if status & 0x01 != 0 {
                Regulation::ConstantVoltage
            } else {
                Regulation::ConstantCurrent
            }),
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
                    "{}: port open but the supply does not answer *IDN? ({e})",
                    self.port
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
        crate::drivers::defaults_pin::check::<KoradSettings>(
            serde_json::json!({"port": "/dev/ttyUSB0", "max_voltage_v": 12.0, "max_current_a": 2.0}),
            "KoradSettings { port: \"/dev/ttyUSB0\", baud_rate: 9600, max_voltage_v: 12.0, max_current_a: 2.0, command_gap_ms: 100, reply_timeout_ms: 500, settle_ms: 100 }",
        );
    }
}
