//! Numato Lab-type USB relay module (CDC serial, 1 to 32 relays).
//!
//! Wire format: ASCII commands terminated by `\r`. The module echoes every
//! character as it arrives, then on `\r` sends `\n\r`, the reply (if any)
//! followed by `\n\r`, and the prompt `>`. Example session (bytes as sent
//! by the module shown after `<-`):
//!
//! ```text
//! -> relay on 0\r        <- relay on 0\n\r>
//! -> relay read 0\r      <- relay read 0\n\ron\n\r>
//! -> ver\r               <- ver\n\r00000008\n\r>
//! ```
//!
//! | command | reply |
//! |---|---|
//! | `relay on N` / `relay off N` | — |
//! | `relay read N` | `on` / `off` |
//! | `relay readall` | relay bitmap as hex, 2 digits per 8 relays (`05` = 0 and 2 on) |
//! | `relay writeall XX` | — (sets all relays from the hex bitmap) |
//! | `reset` | — (all relays off) |
//! | `ver` | firmware version, `00000008` |
//! | `id get` | module id, `00000000` |
//!
//! Relays are numbered from 0; from 10 on the module uses letters
//! (`A` = 10 … `V` = 31). Unknown commands, bad relay numbers and empty
//! lines get just the prompt. Backspace (`\x08`) deletes the last typed
//! character. A `\n` on its own is ignored.
//!
//! The module is USB-powered: when it vanishes every relay drops to off.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::lcus::RelaySwitch;
use super::{lock, DevSimError, Device, Simulator};

/// Reply to `ver`.
pub const NUMATO_VERSION: &str = "00000008";

/// Settings of a simulated Numato module.
#[derive(Debug, Clone)]
pub struct NumatoConfig {
    /// Number of relays: 1, 2, 4, 8, 16 or 32.
    pub channels: u8,
    /// Reply to `ver`.
    pub version: String,
}

impl Default for NumatoConfig {
    fn default() -> Self {
        NumatoConfig {
            channels: 8,
            version: NUMATO_VERSION.to_string(),
        }
    }
}

/// Snapshot of a simulated Numato module.
#[derive(Debug, Clone, PartialEq)]
pub struct NumatoState {
    /// Relay states, index 0 = relay 0.
    pub relays: Vec<bool>,
    /// Every switch command accepted, oldest first; `channel` is the
    /// 0-based Numato relay number.
    pub switches: Vec<RelaySwitch>,
    /// Every command line received (without `\r`), oldest first.
    pub commands: Vec<(Instant, String)>,
}

/// Shared view of a running Numato simulator.
#[derive(Debug, Clone)]
pub struct NumatoHandle {
    state: Arc<Mutex<NumatoState>>,
}

impl NumatoHandle {
    /// A copy of the current state.
    pub fn snapshot(&self) -> NumatoState {
        lock(&self.state).clone()
    }

    /// Whether relay `n` (0-based) is on; false when out of range.
    pub fn relay(&self, n: u8) -> bool {
        lock(&self.state)
            .relays
            .get(usize::from(n))
            .copied()
            .unwrap_or(false)
    }
}

/// A running Numato simulator.
pub type NumatoSim = Simulator<NumatoHandle>;

impl Simulator<NumatoHandle> {
    /// Starts a Numato module (all relays off) on a new pty.
    ///
    /// Errors: [`DevSimError::Config`] (`channels`) unless 1, 2, 4, 8, 16
    /// or 32; otherwise see [`Simulator::spawn`].
    pub fn start(
        config: NumatoConfig,
        link: Option<&std::path::Path>,
    ) -> Result<NumatoSim, DevSimError> {
        if ![1, 2, 4, 8, 16, 32].contains(&config.channels) {
            return Err(DevSimError::Config {
                field: "channels",
                reason: format!(
                    "Numato modules have 1..32 relays in powers of two, not {}",
                    config.channels
                ),
            });
        }
        let state = Arc::new(Mutex::new(NumatoState {
            relays: vec![false; usize::from(config.channels)],
            switches: Vec::new(),
            commands: Vec::new(),
        }));
        let device = Numato {
            config,
            state: state.clone(),
            line: String::new(),
            out: Vec::new(),
        };
        Simulator::spawn("numato", device, NumatoHandle { state }, link)
    }
}

struct Numato {
    config: NumatoConfig,
    state: Arc<Mutex<NumatoState>>,
    line: String,
    out: Vec<u8>,
}

impl Device for Numato {
    fn receive(&mut self, bytes: &[u8], now: Instant) {
        for &b in bytes {
            match b {
                b'\r' => {
                    let line = std::mem::take(&mut self.line);
                    self.out.extend_from_slice(b"\n\r");
                    if let Some(reply) = self.execute(line.trim(), now) {
                        self.out.extend_from_slice(reply.as_bytes());
                        self.out.extend_from_slice(b"\n\r");
                    }
                    self.out.push(b'>');
                }
                b'\n' => {}
                0x08 | 0x7f if self.line.pop().is_some() => {
                    self.out.extend_from_slice(b"\x08 \x08");
                }
                0x08 | 0x7f => {}
                _ if self.line.len() < 64 => {
                    self.line.push(char::from(b));
                    self.out.push(b);
                }
                _ => {}
            }
        }
    }

    fn poll(&mut self, _now: Instant, out: &mut Vec<u8>) -> Option<Instant> {
        out.append(&mut self.out);
        None
    }

    fn unplugged(&mut self, _now: Instant) {
        lock(&self.state).relays.iter_mut().for_each(|r| *r = false);
        self.line.clear();
    }
}

impl Numato {
    fn execute(&mut self, line: &str, now: Instant) -> Option<String> {
        let mut st = lock(&self.state);
        if !line.is_empty() {
            st.commands.push((now, line.to_string()));
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        let n = st.relays.len();
        match words.as_slice() {
            ["ver"] => Some(self.config.version.clone()),
            ["id", "get"] => Some("00000000".to_string()),
            ["reset"] => {
                for i in 0..n {
                    set_relay(&mut st, i, false, now);
                }
                None
            }
            ["relay", op @ ("on" | "off"), r] => {
                let i = relay_index(r, n)?;
                set_relay(&mut st, i, *op == "on", now);
                None
            }
            ["relay", "read", r] => {
                let i = relay_index(r, n)?;
                Some(if st.relays[i] { "on" } else { "off" }.to_string())
            }
            ["relay", "readall"] => {
                let bits = st
                    .relays
                    .iter()
                    .enumerate()
                    .fold(0u32, |acc, (i, on)| acc | (u32::from(*on) << i));
                let digits = (n.div_ceil(8) * 2).max(2);
                Some(format!("{bits:0digits$x}"))
            }
            ["relay", "writeall", hex] => {
                let bits = u32::from_str_radix(hex, 16).ok()?;
                for i in 0..n {
                    set_relay(&mut st, i, bits & (1 << i) != 0, now);
                }
                None
            }
            _ => None,
        }
    }
}

/// `0`..`9`, then `A`..`V` for 10..31 (case-insensitive), within `0..n`.
fn relay_index(word: &str, n: usize) -> Option<usize> {
    let mut chars = word.chars();
    let c = chars.next()?;
    if chars.next().is_some() {
        return None;
    }
    let i = c.to_digit(32)? as usize;
    (i < n).then_some(i)
}

fn set_relay(st: &mut NumatoState, i: usize, on: bool, now: Instant) {
    let Some(relay) = st.relays.get_mut(i) else {
        return;
    };
    let changed = *relay != on;
    *relay = on;
    st.switches.push(RelaySwitch {
        at: now,
        channel: u8::try_from(i).unwrap_or(u8::MAX),
        on,
        changed,
    });
}
