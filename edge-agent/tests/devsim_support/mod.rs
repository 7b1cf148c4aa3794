//! Helpers shared by the device-simulator tests: open a port the way a
//! driver does and read from it with deadlines.
#![allow(dead_code)]

use std::io::ErrorKind;
use std::path::Path;
use std::time::{Duration, Instant};

use serialport::SerialPort;

/// Opens `path` exactly as a serial driver would (9600 8N1, 5 ms read timeout).
pub fn open(path: &Path) -> Box<dyn SerialPort> {
    serialport::new(path.to_string_lossy(), 9600)
        .timeout(Duration::from_millis(5))
        .open()
        .unwrap_or_else(|e| panic!("open {}: {e}", path.display()))
}

/// Writes all of `bytes`.
pub fn send(port: &mut dyn SerialPort, bytes: &[u8]) {
    port.write_all(bytes).expect("write to port");
}

/// Reads whatever arrives within `window`.
pub fn read_for(port: &mut dyn SerialPort, window: Duration) -> Vec<u8> {
    let end = Instant::now() + window;
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    while Instant::now() < end {
        match port.read(&mut buf) {
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::TimedOut => {}
            Err(e) => panic!("read from port: {e}"),
        }
    }
    out
}

/// Reads until the text received so far contains `needle`; panics with
/// what did arrive after `timeout`.
pub fn read_until(port: &mut dyn SerialPort, needle: &str, timeout: Duration) -> String {
    let end = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    loop {
        let text = String::from_utf8_lossy(&out).into_owned();
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < end,
            "no {needle:?} within {timeout:?}; got {text:?}"
        );
        match port.read(&mut buf) {
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::TimedOut => {}
            Err(e) => panic!("read from port: {e}"),
        }
    }
}

/// Sends `cmd` and returns the reply: the bytes that arrive from the first
/// one (awaited up to `timeout`) until 15 ms pass without more. Empty if
/// nothing came within `timeout`.
pub fn query(port: &mut dyn SerialPort, cmd: &str, timeout: Duration) -> String {
    send(port, cmd.as_bytes());
    String::from_utf8_lossy(&read_reply(port, timeout)).into_owned()
}

/// Reads one burst: waits up to `timeout` for a first byte, then reads
/// until 15 ms of silence.
pub fn read_reply(port: &mut dyn SerialPort, timeout: Duration) -> Vec<u8> {
    const QUIET: Duration = Duration::from_millis(15);
    let end = Instant::now() + timeout;
    let mut out = Vec::new();
    let mut buf = [0u8; 256];
    let mut last = None;
    loop {
        let now = Instant::now();
        match last {
            None if now >= end => return out,
            Some(t) if now - t >= QUIET => return out,
            _ => {}
        }
        match port.read(&mut buf) {
            Ok(n) => {
                out.extend_from_slice(&buf[..n]);
                last = Some(Instant::now());
            }
            Err(e) if e.kind() == ErrorKind::TimedOut => {}
            Err(e) => panic!("read from port: {e}"),
        }
    }
}

#[allow(unused_imports)]
pub use benchlink_testkit::wait_until;
