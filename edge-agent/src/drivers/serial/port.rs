//! `serialport` backend: a real serial port (USB-UART adapter, on-board
//! UART, or a pseudo-terminal), opened with exclusive access and read
//! continuously by a [`Link`].

use std::sync::Arc;

use serde::Deserialize;

use super::{check_log_limit, SerialConsole, DEFAULT_LOG_LIMIT_BYTES, OPEN_WAIT};
use crate::drivers::transport::{Capture, Endpoint, FlowControl, Link, Parity, SerialLine};
use crate::drivers::{Defaults, DriverConfigError, DriverError, DriverHealth, DriverSpec};

/// Bench TOML settings of `backend = "serialport"`.
///
/// ```toml
/// port = "/dev/serial/by-id/usb-FTDI_FT232R_USB_UART_A50285BI-if00-port0"
/// baud_rate = 115200      # default
/// data_bits = 8           # 5..=8, default 8
/// parity = "none"         # none | odd | even
/// stop_bits = 1           # 1 | 2
/// flow_control = "none"   # none | software | hardware
/// log_limit_bytes = 1048576
/// ```
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PortSettings {
    /// Device path; prefer `/dev/serial/by-id/...`.
    pub port: String,
    pub baud_rate: u32,
    pub data_bits: u8,
    pub parity: Parity,
    pub stop_bits: u8,
    pub flow_control: FlowControl,
    /// Rolling capture log size, 4096..=67108864 bytes (default 1 MiB).
    pub log_limit_bytes: usize,
}

impl Default for PortSettings {
    /// The documented defaults; the keys of [`Defaults::REQUIRED`] have none
    /// (their values here are placeholders, never used).
    fn default() -> Self {
        Self {
            port: String::new(),
            baud_rate: 115_200,
            data_bits: 8,
            parity: Parity::None,
            stop_bits: 1,
            flow_control: FlowControl::None,
            log_limit_bytes: DEFAULT_LOG_LIMIT_BYTES,
        }
    }
}

impl Defaults for PortSettings {
    const REQUIRED: &'static [&'static str] = &["port"];
}

/// A real serial port behind a [`Link`].
#[derive(Debug)]
pub struct PortConsole {
    line: SerialLine,
    link: Link,
}

impl PortConsole {
    /// Parses and checks the settings; does not open the port.
    pub fn from_spec(spec: &DriverSpec) -> Result<Self, DriverConfigError> {
        let s: PortSettings = spec.parse()?;
        let line = SerialLine {
            port: s.port,
            baud_rate: s.baud_rate,
            data_bits: s.data_bits,
            parity: s.parity,
            stop_bits: s.stop_bits,
            flow_control: s.flow_control,
        };
        line.check(spec)?;
        check_log_limit(spec, s.log_limit_bytes)?;
        Ok(Self {
            link: Link::new(Endpoint::Serial(line.clone()), s.log_limit_bytes),
            line,
        })
    }
}

impl SerialConsole for PortConsole {
    fn port_name(&self) -> String {
        self.line.port.clone()
    }

    fn line(&self) -> SerialLine {
        self.line.clone()
    }

    fn open(&mut self) -> Result<(), DriverError> {
        self.link.ensure_open(OPEN_WAIT).map(|_| ())
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), DriverError> {
        self.link.write(bytes)
    }

    fn capture(&self) -> Arc<Capture> {
        self.link.capture().clone()
    }

    fn health(&mut self) -> DriverHealth {
        self.link.health()
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// What a table with only its required keys means; the expected text
    /// was taken from the code before the defaults moved into `Default`.
    #[test]
    fn a_minimal_table_takes_the_documented_defaults() {
        crate::drivers::defaults_pin::check::<PortSettings>(
            serde_json::json!({"port": "/dev/ttyUSB0"}),
            "PortSettings { port: \"/dev/ttyUSB0\", baud_rate: 115200, data_bits: 8, parity: None, stop_bits: 1, flow_control: None, log_limit_bytes: 1048576 }",
        );
    }
}
