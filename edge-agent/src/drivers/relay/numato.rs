//! `numato` backend: Numato Lab-type USB relay modules (CDC serial, 1 to 32
//! relays).
//!
//! ASCII commands end with `\r`; the module echoes what it receives and
//! ends every answer with the `>` prompt (`relay on 0\r` →
//! `relay on 0\n\r>`; `relay read 0\r` → `relay read 0\n\ron\n\r>`).
//! Relays are numbered from 0 on the wire, then `A`..`V` for 10..31; this
//! driver's channel N is the module's relay N-1. Each switch is confirmed
//! with `relay read`.

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{check_settle, Channels, RelayBoard, OPEN_WAIT};
use crate::drivers::transport::{
    printable, sleep_until, Endpoint, Link, SerialLine, Transcript, WaitError,
};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// Bench TOML settings of `backend = "numato"`.
///
/// ```toml
/// port = "/dev/serial/by-id/usb-Numato_Systems_Pvt._Ltd._Numato_Lab_8_Channel_USB_Relay_Module-if00"
/// baud_rate = 19200    # CDC devices ignore it
/// channels = 8         # 1, 2, 4, 8, 16 or 32
/// channel = 1          # default channel for actions (module relay 0)
/// settle_ms = 20       # 0..=1000
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NumatoSettings {
    pub port: String,
    pub baud_rate: u32,
    pub channels: u8,
    pub channel: u8,
    pub settle_ms: u64,
}

impl Default for NumatoSettings {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            port: String::new(),
            baud_rate: 19_200,
            channels: 0,
            channel: 1,
            settle_ms: 20,
        }
    }
}

impl Defaults for NumatoSettings {
    const REQUIRED: &'static [&'static str] = &["port", "channels"];
}

/// How long a command may take to be answered with the prompt.
const REPLY_TIMEOUT: Duration = Duration::from_millis(500);

/// The module's name for channel `channel` (1-based): `0`..`9`, `A`..`V`.
pub fn relay_name(channel: u8) -> char {
    let i = u32::from(channel.saturating_sub(1));
    char::from_digit(i, 32).map_or('?', |c| c.to_ascii_uppercase())
}

/// A Numato module on a serial [`Link`].
#[derive(Debug)]
pub struct Numato {
    link: Link,
    port: String,
    settle: Duration,
    transcript: Transcript,
    /// Connection generation that got a fresh prompt.
    initialized: u64,
    /// Connection generation whose `ver` query succeeded.
    checked: u64,
}

impl Numato {
    /// Parses and checks the settings; does not open the port.
    pub fn from_spec(spec: &DriverSpec) -> Result<(Self, Channels), DriverConfigError> {
        let s: NumatoSettings = spec.parse()?;
        let line = SerialLine::new(s.port.clone(), s.baud_rate);
        line.check(spec)?;
        let channels = Channels::checked(spec, s.channels, s.channel, &[1, 2, 4, 8, 16, 32])?;
        Ok((
            Numato {
                link: Link::new(Endpoint::Serial(line), 16 * 1024),
                port: s.port,
                settle: check_settle(spec, s.settle_ms)?,
                transcript: Transcript::new(),
                initialized: 0,
                checked: 0,
            },
            channels,
        ))
    }

    /// Sends `bytes` and returns what came back up to the `>` prompt.
    fn exchange(&mut self, bytes: &[u8]) -> Result<String, DriverError> {
        let capture = self.link.capture().clone();
        let from = capture.end();
        self.link.write(bytes)?;
        self.transcript.tx(bytes);
        let reply = capture.wait_for(from, Instant::now() + REPLY_TIMEOUT, None, |_, d| {
            d.iter().position(|&b| b == b'>').map(|i| d[..=i].to_vec())
        });
        match reply {
            Ok(raw) => {
                self.transcript.rx(&raw);
                Ok(String::from_utf8_lossy(&raw).into_owned())
            }
            Err(WaitError::Timeout) => {
                let (_, got) = capture.bytes_from(from);
                Err(DriverError::Device(format!(
                    "Numato module on {} did not prompt after `{}` (got \"{}\")",
                    self.port,
                    printable(bytes),
                    printable(&got)
                )))
            }
            Err(WaitError::Lost(why)) => Err(DriverError::Unavailable(why)),
            Err(WaitError::Cancelled) => Err(DriverError::Cancelled("relay command".into())),
        }
    }

    /// Runs one command line; returns its answer (the lines between the
    /// echo and the prompt), empty for commands without one.
    fn command(&mut self, cmd: &str) -> Result<String, DriverError> {
        let generation = self.link.ensure_open(OPEN_WAIT)?;
        if generation != self.initialized {
            // A bare CR discards anything half-typed and yields a prompt.
            self.exchange(b"\r")?;
            self.initialized = generation;
        }
        let raw = self.exchange(format!("{cmd}\r").as_bytes())?;
        let body = raw.trim_end_matches('>');
        let lines: Vec<&str> = body
            .split(['\r', '\n'])
            .map(str::trim)
            .filter(|l| !l.is_empty())
            .collect();
        // The first line is the echo of the command.
        Ok(lines.get(1..).map(|l| l.join("\n")).unwrap_or_default())
    }
}

impl RelayBoard for Numato {
    fn port_name(&self) -> String {
        self.port.clone()
    }

    fn set(&mut self, channel: u8, on: bool) -> Result<(), DriverError> {
        let op = if on { "on" } else { "off" };
        self.command(&format!("relay {op} {}", relay_name(channel)))?;
        sleep_until(Instant::now() + self.settle);
        Ok(())
    }

    fn get(&mut self, channel: u8) -> Result<Option<bool>, DriverError> {
        let answer = self.command(&format!("relay read {}", relay_name(channel)))?;
        match answer.as_str() {
            "on" => Ok(Some(true)),
            "off" => Ok(Some(false)),
            other => Err(DriverError::Device(format!(
                "Numato module on {} answered `relay read {}` with \"{}\"",
                self.port,
                relay_name(channel),
                printable(other.as_bytes())
            ))),
        }
    }

    fn health(&mut self) -> DriverHealth {
        let h = self.link.health();
        if h != DriverHealth::healthy() {
            return h;
        }
        let generation = self.link.capture().generation();
        if self.checked != generation {
            let why = match self.command("ver") {
                Ok(v) if !v.is_empty() => {
                    self.checked = generation;
                    self.link.identity_confirmed();
                    return DriverHealth::healthy();
                }
                Ok(_) => format!("{}: the module gave no version for `ver`", self.port),
                Err(e) => e.to_string(),
            };
            self.link.identity_failed(&why);
            return DriverHealth::unhealthy(why);
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
        crate::drivers::defaults_pin::check::<NumatoSettings>(
            serde_json::json!({"port": "/dev/ttyACM0", "channels": 2}),
            "NumatoSettings { port: \"/dev/ttyACM0\", baud_rate: 19200, channels: 2, channel: 1, settle_ms: 20 }",
        );
    }
}
