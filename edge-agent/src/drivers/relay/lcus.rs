//! `lcus` backend: LCUS-type USB relay boards (CH340 USB-serial, 1, 2, 4
//! or 8 relays).
//!
//! A switch is one 4-byte frame `A0 <channel> <op> <checksum>` (op 01 = on,
//! 00 = off, checksum = sum of the first three bytes, mod 256); the board
//! never answers it. Boards with two or more relays answer the status byte
//! `FF` with one line per relay (`CH1:OFF\r\nCH2:ON\r\n`), which is how a
//! switch is confirmed (`read_back`, on by default for those boards).

use std::time::{Duration, Instant};

use serde::Deserialize;

use super::{check_settle, Channels, RelayBoard, OPEN_WAIT};
use crate::drivers::transport::{
    bad_setting, printable, sleep_until, Endpoint, Link, SerialLine, Transcript, WaitError,
};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// Bench TOML settings of `backend = "lcus"`.
///
/// ```toml
/// port = "/dev/serial/by-id/usb-1a86_USB_Serial-if00-port0"
/// baud_rate = 9600     # default
/// channels = 4         # 1, 2, 4 or 8
/// channel = 1          # default channel for actions
/// settle_ms = 20       # 0..=1000, contact settling after a switch
/// read_back = true     # FF status query; default: true when channels >= 2
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LcusSettings {
    pub port: String,
    pub baud_rate: u32,
    pub channels: u8,
    pub channel: u8,
    pub settle_ms: u64,
    pub read_back: Option<bool>,
}

impl Default for LcusSettings {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            port: String::new(),
            baud_rate: 9600,
            channels: 0,
            channel: 1,
            settle_ms: 20,
            read_back: None,
        }
    }
}

impl Defaults for LcusSettings {
    const REQUIRED: &'static [&'static str] = &["port", "channels"];
}

/// How long the status reply may take.
const STATUS_TIMEOUT: Duration = Duration::from_millis(500);

/// The 4-byte frame switching `channel` (1-based) on or off.
pub fn frame(channel: u8, on: bool) -> [u8; 4] {
    let op = u8::from(on);
    [
        0xA0,
        channel,
        op,
        0xA0u8.wrapping_add(channel).wrapping_add(op),
    ]
}

/// An LCUS board on a serial [`Link`].
#[derive(Debug)]
pub struct Lcus {
    link: Link,
    port: String,
    channels: u8,
    settle: Duration,
    read_back: bool,
    transcript: Transcript,
    /// Connection generation whose status query succeeded.
    checked: u64,
}

impl Lcus {
    /// Parses and checks the settings; does not open the port.
    pub fn from_spec(spec: &DriverSpec) -> Result<(Self, Channels), DriverConfigError> {
        let s: LcusSettings = spec.parse()?;
        let line = SerialLine::new(s.port.clone(), s.baud_rate);
        line.check(spec)?;
        let channels = Channels::checked(spec, s.channels, s.channel, &[1, 2, 4, 8])?;
        let read_back = s.read_back.unwrap_or(s.channels >= 2);
        if read_back && s.channels < 2 {
            return Err(bad_setting(
                spec,
                "read_back",
                "single-relay LCUS boards do not answer the status query",
            ));
        }
        Ok((
            Lcus {
                link: Link::new(Endpoint::Serial(line), 16 * 1024),
                port: s.port,
                channels: s.channels,
                settle: check_settle(spec, s.settle_ms)?,
                read_back,
                transcript: Transcript::new(),
                checked: 0,
            },
            channels,
        ))
    }

    /// Sends `FF` and parses one `CHn:ON|OFF` line per relay.
    fn status(&mut self) -> Result<Vec<bool>, DriverError> {
        self.link.ensure_open(OPEN_WAIT)?;
        let capture = self.link.capture().clone();
        let from = capture.end();
        self.link.write(&[0xFF])?;
        self.transcript.tx([0xFF]);
        let n = usize::from(self.channels);
        let reply = capture.wait_for(from, Instant::now() + STATUS_TIMEOUT, None, |_, d| {
            let text = String::from_utf8_lossy(d);
            // Only complete lines: `CH4:O` may still become `CH4:ON`.
            let complete = &text[..text.rfind('\n')?];
            let mut states = vec![None; n];
            for line in complete.split('\n') {
                let Some((ch, st)) = line.trim().split_once(':') else {
                    continue;
                };
                let index = ch.strip_prefix("CH").and_then(|c| c.parse::<usize>().ok());
                if let Some(slot) = index.and_then(|i| states.get_mut(i.wrapping_sub(1))) {
                    *slot = Some(st.eq_ignore_ascii_case("ON"));
                }
            }
            let states: Option<Vec<bool>> = states.into_iter().collect();
            states.map(|s| (s, d.to_vec()))
        });
        match reply {
            Ok((states, raw)) => {
                self.transcript.rx(&raw);
                Ok(states)
            }
            Err(WaitError::Timeout) => {
                let (_, got) = capture.bytes_from(from);
                Err(DriverError::Device(format!(
                    "LCUS board on {} did not answer the FF status query (got \"{}\")",
                    self.port,
                    printable(&got)
                )))
            }
            Err(WaitError::Lost(why)) => Err(DriverError::Unavailable(why)),
            Err(WaitError::Cancelled) => Err(DriverError::Cancelled("status query".into())),
        }
    }
}

impl RelayBoard for Lcus {
    fn port_name(&self) -> String {
        self.port.clone()
    }

    fn set(&mut self, channel: u8, on: bool) -> Result<(), DriverError> {
        self.link.ensure_open(OPEN_WAIT)?;
        let f = frame(channel, on);
        self.link.write(&f)?;
        self.transcript.tx(f);
        sleep_until(Instant::now() + self.settle);
        Ok(())
    }

    fn get(&mut self, channel: u8) -> Result<Option<bool>, DriverError> {
        if !self.read_back {
            return Ok(None);
        }
        let states = self.status()?;
        Ok(states.get(usize::from(channel).wrapping_sub(1)).copied())
    }

    fn health(&mut self) -> DriverHealth {
        let h = self.link.health();
        if h != DriverHealth::healthy() || !self.read_back {
            return h;
        }
        let generation = self.link.capture().generation();
        if self.checked != generation {
            if let Err(e) = self.status() {
                let why = e.to_string();
                self.link.identity_failed(&why);
                return DriverHealth::unhealthy(why);
            }
            self.link.identity_confirmed();
            self.checked = generation;
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
        crate::drivers::defaults_pin::check::<LcusSettings>(
            serde_json::json!({"port": "/dev/ttyUSB0", "channels": 2}),
            "LcusSettings { port: \"/dev/ttyUSB0\", baud_rate: 9600, channels: 2, channel: 1, settle_ms: 20, read_back: None }",
        );
    }
}
